package web_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hangar-dev/hangar/platform/auth"
	"github.com/hangar-dev/hangar/web"
)

const token = "the-api-token"

func newHandler(t *testing.T) *web.Handler {
	t.Helper()
	// Never dialed by these tests (terminals are tested end to end).
	conn, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	h, err := web.New(web.Options{Token: token, Conn: conn})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestSignIn: the right token sets an HttpOnly, SameSite=Strict cookie
// holding it; a wrong one, another origin or no body sets nothing.
func TestSignIn(t *testing.T) {
	h := newHandler(t)
	post := func(body string, headers map[string]string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "http://hangar.test/ui/signin", strings.NewReader(body))
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	rec := post(`{"token":"`+token+`"}`, map[string]string{"Origin": "http://hangar.test"})
	cookies := rec.Result().Cookies()
	if rec.Code != http.StatusNoContent || len(cookies) != 1 {
		t.Fatalf("sign-in: %d %v", rec.Code, cookies)
	}
	c := cookies[0]
	if c.Name != auth.CookieName || c.Value != token || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" {
		t.Errorf("cookie: %+v", c)
	}
	for name, tc := range map[string]struct {
		body    string
		headers map[string]string
		want    int
	}{
		"wrong token":  {`{"token":"nope"}`, nil, http.StatusUnauthorized},
		"no token":     {`{}`, nil, http.StatusBadRequest},
		"not JSON":     {`token=` + token, nil, http.StatusBadRequest},
		"other origin": {`{"token":"` + token + `"}`, map[string]string{"Origin": "http://evil.test"}, http.StatusForbidden},
		"cross-site":   {`{"token":"` + token + `"}`, map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		"other scheme": {`{"token":"` + token + `"}`, map[string]string{"Origin": "null"}, http.StatusForbidden},
	} {
		rec := post(tc.body, tc.headers)
		if rec.Code != tc.want || len(rec.Result().Cookies()) != 0 {
			t.Errorf("%s: %d %v, want %d and no cookie", name, rec.Code, rec.Result().Cookies(), tc.want)
		}
	}
}

// TestPageAndAssets: the page and its assets are served with a strict
// content security policy; the terminal refuses a caller without the token.
func TestPageAndAssets(t *testing.T) {
	h := newHandler(t)
	rec := httptest.NewRecorder()
	h.Index().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "/ui/assets/app.js") || !strings.Contains(rec.Header().Get("Content-Security-Policy"), "script-src 'self'") {
		t.Errorf("index: %d %v\n%s", rec.Code, rec.Header(), rec.Body)
	}
	for _, p := range []string{"app.js", "app.css", "vendor/xterm/xterm.js", "vendor/xterm/xterm.css", "vendor/xterm/addon-fit.js"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/assets/"+p, nil))
		if rec.Code != 200 || rec.Body.Len() == 0 || rec.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: %d", p, rec.Code)
		}
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/terminal?session=x", nil))
	if rec.Code != http.StatusUnauthorized {
		t.Errorf("terminal without a token: %d", rec.Code)
	}
	req := httptest.NewRequest(http.MethodGet, "http://hangar.test/ui/terminal?session=x", nil)
	req.AddCookie(&http.Cookie{Name: auth.CookieName, Value: token})
	req.Header.Set("Origin", "http://evil.test")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized {
		t.Errorf("terminal with the cookie from another origin: %d", rec.Code)
	}
	if got := web.SignInURL("http://127.0.0.1:7400/", "a b"); got != "http://127.0.0.1:7400/#token=a%20b" {
		t.Errorf("SignInURL: %s", got)
	}
}
