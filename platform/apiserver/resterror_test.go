package apiserver_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"

	"github.com/hangar-dev/hangar/platform/apiserver"
)

// REST answers: errors as {code, reason, message} with the HTTP status; a
// refused token with an RFC 6750 challenge; no gRPC metadata as headers.
func TestRESTErrorsAndHeaders(t *testing.T) {
	r := start(t, apiserver.Options{
		Name:     "test-svc",
		Gateways: []func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error{registerHealthGateway},
	})
	base := "http://" + r.addr
	c := httpClient(t)

	code, body, h := get(t, c, base+"/v1/health", token)
	if code != 200 {
		t.Fatalf("GET /v1/health = %d %s", code, body)
	}
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "grpc-") {
			t.Errorf("REST response carries %s: %v", k, h.Values(k))
		}
	}

	code, body, _ = get(t, c, base+"/v1/health?service=nope", token)
	var e apiserver.RESTError
	if err := json.Unmarshal([]byte(body), &e); err != nil || code != 404 || e.Code != "NOT_FOUND" || e.Message == "" {
		t.Errorf("GET unknown service = %d %s (%v), want 404 with code NOT_FOUND", code, body, err)
	}

	for _, tc := range []struct{ token, challenge string }{
		{"", `Bearer realm="hangar"`},
		{"wrong", `Bearer realm="hangar", error="invalid_token", error_description="missing or invalid bearer token"`},
	} {
		code, body, h := get(t, c, base+"/v1/health", tc.token)
		if code != 401 || h.Get("WWW-Authenticate") != tc.challenge || !strings.Contains(body, `"reason":"UNAUTHENTICATED"`) {
			t.Errorf("token %q: %d %s, WWW-Authenticate %q; want 401 with %q", tc.token, code, body, h.Get("WWW-Authenticate"), tc.challenge)
		}
	}
}
