package auth_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/hangar-dev/hangar/platform/auth"
)

const token = "t0ken-with-some-length"

func TestValid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, token, header string
		want                bool
	}{
		{"right", token, "Bearer " + token, true},
		{"scheme is case-insensitive", token, "bearer " + token, true},
		{"wrong token", token, "Bearer nope", false},
		{"prefix of token", token, "Bearer " + token[:5], false},
		{"missing", token, "", false},
		{"no scheme", token, token, false},
		{"basic scheme", token, "Basic " + token, false},
		{"empty configured token rejects all", "", "Bearer ", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := auth.Valid(tt.token, tt.header); got != tt.want {
				t.Errorf("Valid(%q, %q) = %v, want %v", tt.token, tt.header, got, tt.want)
			}
		})
	}
}

func TestHTTPMiddleware(t *testing.T) {
	t.Parallel()
	h := auth.HTTPMiddleware(token, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok"))
	}))
	tests := []struct {
		name     string
		header   string
		wantCode int
		wantBody string
	}{
		{"right token", "Bearer " + token, http.StatusOK, "ok"},
		{"no token", "", http.StatusUnauthorized, `{"code":"UNAUTHENTICATED","reason":"UNAUTHENTICATED","message":"missing or invalid bearer token"}` + "\n"},
		{"wrong token", "Bearer x", http.StatusUnauthorized, `{"code":"UNAUTHENTICATED","reason":"UNAUTHENTICATED","message":"missing or invalid bearer token"}` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequest(http.MethodGet, "/x", nil)
			if tt.header != "" {
				req.Header.Set("Authorization", tt.header)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.wantCode || rec.Body.String() != tt.wantBody {
				t.Errorf("got %d %q, want %d %q", rec.Code, rec.Body.String(), tt.wantCode, tt.wantBody)
			}
			if tt.wantCode == http.StatusUnauthorized && rec.Header().Get("Content-Type") != "application/json" {
				t.Errorf("Content-Type = %q", rec.Header().Get("Content-Type"))
			}
		})
	}
}

// TestInterceptors runs a real gRPC server over loopback TCP and calls it with
// and without TokenCredentials.
func TestInterceptors(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	exempt := func(m string) bool { return m == "/grpc.health.v1.Health/List" }
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(auth.UnaryServerInterceptor(token, exempt)),
		grpc.StreamInterceptor(auth.StreamServerInterceptor(token, exempt)),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})

	dial := func(t *testing.T, opts ...grpc.DialOption) healthpb.HealthClient {
		t.Helper()
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
		conn, err := grpc.NewClient(lis.Addr().String(), opts...)
		if err != nil {
			t.Fatalf("NewClient: %v", err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return healthpb.NewHealthClient(conn)
	}
	tests := []struct {
		name     string
		opts     []grpc.DialOption
		wantCode codes.Code
	}{
		{"right token", []grpc.DialOption{grpc.WithPerRPCCredentials(auth.TokenCredentials{Token: token})}, codes.OK},
		{"wrong token", []grpc.DialOption{grpc.WithPerRPCCredentials(auth.TokenCredentials{Token: "wrong"})}, codes.Unauthenticated},
		{"no token", nil, codes.Unauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client := dial(t, tt.opts...)
			ctx := t.Context()

			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			assertCode(t, "Check", err, tt.wantCode)

			stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
			_, err = stream.Recv()
			assertCode(t, "Watch", err, tt.wantCode)

			// Exempt: works without a token.
			_, err = client.List(ctx, &healthpb.HealthListRequest{})
			assertCode(t, "List", err, codes.OK)
		})
	}
}

func assertCode(t *testing.T, call string, err error, want codes.Code) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != want {
		t.Fatalf("%s: code %v (%v), want %v", call, st.Code(), err, want)
	}
	if want == codes.Unauthenticated && st.Message() != auth.Message {
		t.Errorf("%s: message %q, want %q", call, st.Message(), auth.Message)
	}
}

func TestTokenCredentials(t *testing.T) {
	t.Parallel()
	c := auth.TokenCredentials{Token: "abc"}
	md, err := c.GetRequestMetadata(context.Background())
	if err != nil || md["authorization"] != "Bearer abc" {
		t.Errorf("GetRequestMetadata = %v, %v", md, err)
	}
	if c.RequireTransportSecurity() {
		t.Error("RequireTransportSecurity = true, want false")
	}
	if !strings.HasPrefix(md["authorization"], auth.Scheme+" ") {
		t.Error("scheme mismatch")
	}
}
