package apiserver_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/hangar-dev/hangar/platform/apiserver"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/platform/rpc"
	"github.com/hangar-dev/hangar/platform/telemetry"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const token = "apiserver-test-token"

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

type running struct {
	srv    *apiserver.Server
	addr   string
	cancel context.CancelFunc
	done   chan error
}

// stop cancels Serve and returns its result.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return after cancel")
		return nil
	}
}

func servingStatus(srv *apiserver.Server, service string) healthpb.HealthCheckResponse_ServingStatus {
	resp, err := srv.Health().Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN
	}
	return resp.GetStatus()
}

func start(t *testing.T, opts apiserver.Options) *running {
	t.Helper()
	if opts.Token == "" {
		opts.Token = token
	}
	if opts.Logger == nil {
		opts.Logger = logging.New(t.Output(), "debug", "text")
	}
	srv, err := apiserver.New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{srv: srv, addr: lis.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		if err := r.stop(t); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	waitFor(t, "SERVING", 5*time.Second, func() bool {
		return servingStatus(srv, "") == healthpb.HealthCheckResponse_SERVING
	})
	return r
}

func httpClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func get(t *testing.T, c *http.Client, url, bearer string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatalf("NewRequest: %v", err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, string(body), resp.Header
}

func dial(t *testing.T, addr, tok string) healthpb.HealthClient {
	t.Helper()
	conn, err := rpc.Dial(addr, rpc.ClientOptions{Token: tok})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// registerHealthGateway maps GET /v1/health to Health.Check the way
// protoc-gen-grpc-gateway's generated RegisterXxxHandler code does.
func registerHealthGateway(_ context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
	client := healthpb.NewHealthClient(conn)
	return mux.HandlePath(http.MethodGet, "/v1/health", func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
		_, outbound := runtime.MarshalerForRequest(mux, r)
		ctx, err := runtime.AnnotateContext(r.Context(), mux, r, "/grpc.health.v1.Health/Check", runtime.WithHTTPPathPattern("/v1/health"))
		if err != nil {
			runtime.HTTPError(ctx, mux, outbound, w, r, err)
			return
		}
		var md runtime.ServerMetadata
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: r.URL.Query().Get("service")},
			grpc.Header(&md.HeaderMD), grpc.Trailer(&md.TrailerMD))
		ctx = runtime.NewServerMetadataContext(ctx, md)
		if err != nil {
			runtime.HTTPError(ctx, mux, outbound, w, r, err)
			return
		}
		runtime.ForwardResponseMessage(ctx, mux, outbound, w, r, resp)
	})
}

func TestServer(t *testing.T) {
	ctx := context.Background()
	tel, err := telemetry.Setup(ctx, telemetry.Options{ServiceName: "test-svc"})
	if err != nil {
		t.Fatalf("telemetry: %v", err)
	}
	defer func() { _ = tel.Shutdown(ctx) }()

	// Served as the gateway's JSON has it: 64-bit integers are integers.
	openAPI := []byte(`{"swagger":"2.0","definitions":{"v1Usage":{"properties":{"input_tokens":{"type":"string","format":"int64"}}}}}`)
	const openAPIServed = "{\n  \"swagger\": \"2.0\",\n  \"definitions\": {\n    \"v1Usage\": {\n      \"properties\": {\n        \"input_tokens\": {\n          \"type\": \"integer\",\n          \"format\": \"int64\"\n        }\n      }\n    }\n  }\n}\n"
	r := start(t, apiserver.Options{
		Name:           "test-svc",
		Gateways:       []func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error{registerHealthGateway},
		OpenAPI:        openAPI,
		Metrics:        tel.MetricsHandler(),
		TracerProvider: tel.TracerProvider(),
		MeterProvider:  tel.MeterProvider(),
	})
	base := "http://" + r.addr

	t.Run("grpc health", func(t *testing.T) {
		tests := []struct {
			name     string
			token    string
			wantCode codes.Code
		}{
			{"right token", token, codes.OK},
			{"no token", "", codes.Unauthenticated},
			{"wrong token", "wrong", codes.Unauthenticated},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				resp, err := dial(t, r.addr, tt.token).Check(t.Context(), &healthpb.HealthCheckRequest{})
				if got := status.Code(err); got != tt.wantCode {
					t.Fatalf("Check code = %v (%v), want %v", got, err, tt.wantCode)
				}
				if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					t.Errorf("Check = %v, want SERVING", resp.GetStatus())
				}
				if tt.wantCode == codes.Unauthenticated && status.Convert(err).Message() != "missing or invalid bearer token" {
					t.Errorf("message = %q", status.Convert(err).Message())
				}
			})
		}
		// Every registered service is SERVING.
		resp, err := dial(t, r.addr, token).Check(t.Context(), &healthpb.HealthCheckRequest{Service: "grpc.health.v1.Health"})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check(grpc.health.v1.Health) = %v, %v", resp.GetStatus(), err)
		}
	})

	t.Run("http", func(t *testing.T) {
		c := httpClient(t)
		tests := []struct {
			name, path, token string
			wantCode          int
			wantBody          string // substring
		}{
			{"healthz without token", "/healthz", "", 200, "ok\n"},
			{"healthz with a wrong token", "/healthz", "nope", 200, "ok\n"},
			{"readyz without token", "/readyz", "", 200, "ok\n"},
			{"openapi without token", "/openapi.json", "", 200, openAPIServed},
			{"metrics with token", "/metrics", token, 200, "target_info"},
			{"metrics without token", "/metrics", "", 401, `{"code":"UNAUTHENTICATED","reason":"UNAUTHENTICATED","message":"missing or invalid bearer token"}`},
			{"metrics wrong token", "/metrics", "nope", 401, `"code":"UNAUTHENTICATED"`},
			{"rest with token", "/v1/health", token, 200, `{"status":"serving"}`},
			{"rest with token, service field", "/v1/health?service=grpc.health.v1.Health", token, 200, `"status":"serving"`},
			{"rest without token", "/v1/health", "", 401, `"message":"missing or invalid bearer token"`},
			{"rest wrong token", "/v1/health", "nope", 401, `"code":"UNAUTHENTICATED"`},
			{"rest unknown service", "/v1/health?service=nope", token, 404, `"code":"NOT_FOUND"`},
			{"unknown path", "/v1/nothing", token, 404, `"code":"NOT_FOUND"`},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				code, body, header := get(t, c, base+tt.path, tt.token)
				if code != tt.wantCode || !strings.Contains(body, tt.wantBody) {
					t.Errorf("GET %s = %d %q, want %d containing %q", tt.path, code, body, tt.wantCode, tt.wantBody)
				}
				if code == http.StatusUnauthorized && !strings.HasPrefix(header.Get("WWW-Authenticate"), `Bearer realm="hangar"`) {
					t.Errorf("GET %s: WWW-Authenticate = %q, want a Bearer challenge", tt.path, header.Get("WWW-Authenticate"))
				}
				// The health endpoints say nothing but ok.
				if (tt.path == "/healthz" || tt.path == "/readyz") && body != "ok\n" {
					t.Errorf("GET %s body = %q, want just ok", tt.path, body)
				}
			})
		}
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/healthz", nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("POST /healthz: %v", err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("POST /healthz = %d, want 405", resp.StatusCode)
		}
	})

	t.Run("metrics include rpc instrumentation", func(t *testing.T) {
		_, body, _ := get(t, httpClient(t), base+"/metrics", token)
		if !strings.Contains(body, "rpc_server") {
			t.Errorf("/metrics lacks otelgrpc server metrics:\n%s", body)
		}
	})

	t.Run("reflection is registered", func(t *testing.T) {
		if _, ok := r.srv.GRPC().GetServiceInfo()["grpc.reflection.v1.ServerReflection"]; !ok {
			t.Errorf("services = %v", r.srv.GRPC().GetServiceInfo())
		}
	})

	if err := r.stop(t); err != nil {
		t.Fatalf("Serve returned %v after cancel, want nil", err)
	}
	if got := servingStatus(r.srv, ""); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health after stop = %v, want NOT_SERVING", got)
	}
}

func TestNotServingBeforeServe(t *testing.T) {
	srv, err := apiserver.New(apiserver.Options{Name: "idle", Token: token})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || rec.Body.String() != "not ready\n" {
		t.Errorf("/readyz before Serve = %d %q, want 503 not ready", rec.Code, rec.Body.String())
	}
	rec = httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "ok\n" {
		t.Errorf("/healthz before Serve = %d %q, want 200 ok (the process answers)", rec.Code, rec.Body.String())
	}
	rec = httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	srv.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("/metrics (nil handler, no gateway yet) = %d, want 503", rec.Code)
	}
	srv.GRPC().Stop()
}

func TestNewValidates(t *testing.T) {
	if _, err := apiserver.New(apiserver.Options{Name: "x"}); err == nil {
		t.Error("New without a token succeeded")
	}
	if _, err := apiserver.New(apiserver.Options{Token: token, Routes: map[string]http.Handler{"nope": http.NotFoundHandler()}}); err == nil {
		t.Error("New with a bad route prefix succeeded")
	}
}

// TestRoutes forwards gRPC health calls from a front door to another
// server's Handler in process.
func TestRoutes(t *testing.T) {
	back := start(t, apiserver.Options{Name: "back"})
	back.srv.Health().SetServingStatus("hangar.back.v1.Back", healthpb.HealthCheckResponse_SERVING)
	front := start(t, apiserver.Options{
		Name:   "front",
		Routes: map[string]http.Handler{"/grpc.health.v1.Health/": back.srv.Handler()},
	})

	resp, err := dial(t, front.addr, token).Check(t.Context(), &healthpb.HealthCheckRequest{Service: "hangar.back.v1.Back"})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check via front = %v, %v; want SERVING from back", resp.GetStatus(), err)
	}
	_, err = dial(t, front.addr, "wrong").Check(t.Context(), &healthpb.HealthCheckRequest{Service: "hangar.back.v1.Back"})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("Check via front with a wrong token = %v, want Unauthenticated from back", err)
	}
	// The front's own /readyz is not routed.
	if code, _, _ := get(t, httpClient(t), "http://"+front.addr+"/readyz", ""); code != 200 {
		t.Errorf("front /readyz = %d", code)
	}
}

// slowService blocks in its handlers so tests can shut down mid-call.
type slowService struct {
	entered chan struct{}
	release chan struct{}
}

func (s *slowService) desc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "hangar.test.v1.Slow",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Wait",
			Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
				in := new(emptypb.Empty)
				if err := dec(in); err != nil {
					return nil, err
				}
				h := func(ctx context.Context, _ any) (any, error) {
					s.entered <- struct{}{}
					select {
					case <-s.release:
						return &emptypb.Empty{}, nil
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				}
				return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: "/hangar.test.v1.Slow/Wait"}, h)
			},
		}},
		Streams: []grpc.StreamDesc{{
			StreamName:    "Forever",
			ServerStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				s.entered <- struct{}{}
				<-ss.Context().Done()
				return ss.Context().Err()
			},
		}},
	}
}

func TestGracefulDrain(t *testing.T) {
	slow := &slowService{entered: make(chan struct{}, 1), release: make(chan struct{})}
	r := start(t, apiserver.Options{
		Name:            "slow",
		ShutdownTimeout: 10 * time.Second,
		Register:        func(s *grpc.Server) { s.RegisterService(slow.desc(), slow) },
	})
	conn, err := rpc.Dial(r.addr, rpc.ClientOptions{Token: token})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer conn.Close()

	callErr := make(chan error, 1)
	go func() {
		callErr <- conn.Invoke(context.Background(), "/hangar.test.v1.Slow/Wait", &emptypb.Empty{}, &emptypb.Empty{})
	}()
	<-slow.entered
	r.cancel()
	waitFor(t, "NOT_SERVING", 5*time.Second, func() bool {
		return servingStatus(r.srv, "") == healthpb.HealthCheckResponse_NOT_SERVING
	})
	select {
	case err := <-r.done:
		t.Fatalf("Serve returned %v with a call in flight", err)
	default:
	}
	close(slow.release)
	if err := <-callErr; err != nil {
		t.Errorf("in-flight call failed during drain: %v", err)
	}
	if err := r.stop(t); err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}
}

func TestDrainTimeoutCancelsStreams(t *testing.T) {
	slow := &slowService{entered: make(chan struct{}, 1), release: make(chan struct{})}
	r := start(t, apiserver.Options{
		Name:            "slow",
		ShutdownTimeout: 200 * time.Millisecond,
		Register:        func(s *grpc.Server) { s.RegisterService(slow.desc(), slow) },
	})
	conn, err := rpc.Dial(r.addr, rpc.ClientOptions{Token: token})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer conn.Close()
	stream, err := conn.NewStream(t.Context(), &grpc.StreamDesc{ServerStreams: true}, "/hangar.test.v1.Slow/Forever")
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	if err := stream.SendMsg(&emptypb.Empty{}); err != nil {
		t.Fatalf("SendMsg: %v", err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatalf("CloseSend: %v", err)
	}
	<-slow.entered
	if err := r.stop(t); err != nil {
		t.Errorf("Serve = %v, want nil after a forced drain", err)
	}
	if err := stream.RecvMsg(&emptypb.Empty{}); err == nil {
		t.Error("stream still open after a forced drain")
	}
}

func TestServeTwice(t *testing.T) {
	r := start(t, apiserver.Options{Name: "twice"})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	defer lis.Close()
	if err := r.srv.Serve(context.Background(), lis); err == nil {
		t.Error("second Serve succeeded")
	}
}
