package apiserver_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"

	"github.com/hangar-dev/hangar/platform/apiserver"
	"github.com/hangar-dev/hangar/platform/auth"
)

// TestSignInCookie: a REST call may carry the token in the dashboard's
// sign-in cookie instead of the bearer header, but only from the server's
// own origin, and a state-changing one only with the CSRF header; GET / is
// the Index handler, without a token.
func TestSignInCookie(t *testing.T) {
	r := start(t, apiserver.Options{
		Gateways: []func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error{registerHealthGateway},
		Index: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "the page")
		}),
	})
	c := httpClient(t)
	base := "http://" + r.addr
	call := func(method, path, cookie string, headers map[string]string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: auth.CookieName, Value: cookie})
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	same := "http://" + r.addr
	for _, tc := range []struct {
		name, method, cookie string
		headers              map[string]string
		want                 int
	}{
		{"cookie", "GET", token, nil, 200},
		{"cookie from the same origin", "GET", token, map[string]string{"Origin": same, "Sec-Fetch-Site": "same-origin"}, 200},
		{"wrong cookie", "GET", "nope", nil, 401},
		{"no cookie", "GET", "", nil, 401},
		{"cookie from another origin", "GET", token, map[string]string{"Origin": "http://evil.example"}, 401},
		{"cookie cross-site", "GET", token, map[string]string{"Sec-Fetch-Site": "cross-site"}, 401},
		{"cookie, POST without the CSRF header", "POST", token, map[string]string{"Origin": same}, 401},
		{"cookie, POST with the CSRF header", "POST", token, map[string]string{"Origin": same, auth.CSRFHeader: "1"}, 405},
		{"cookie, POST with the CSRF header from another origin", "POST", token, map[string]string{"Origin": "http://evil.example", auth.CSRFHeader: "1"}, 401},
	} {
		if got, body := call(tc.method, "/v1/health", tc.cookie, tc.headers); got != tc.want && !(tc.want == 405 && got != 401) {
			t.Errorf("%s: %s /v1/health answered %d (%s), want %d", tc.name, tc.method, got, body, tc.want)
		}
	}
	if got, body := call("GET", "/", "", nil); got != 200 || body != "the page" {
		t.Errorf("GET / without a token: %d %q, want the index page", got, body)
	}
	if got, _ := call("GET", "/elsewhere", "", nil); got != 401 {
		t.Errorf("GET /elsewhere without a token: %d, want 401", got)
	}
}
