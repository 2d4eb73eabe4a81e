// Package apiserver serves a hangar service's gRPC API, its REST mapping
// (grpc-gateway), /healthz, /metrics and /openapi.json on one port, and
// drains gracefully on shutdown.
//
// One http.Server speaks HTTP/1.1 and unencrypted HTTP/2 (h2c with prior
// knowledge, which is what gRPC clients send over plaintext). Each request is
// dispatched, in order, to:
//
//  1. Options.Routes: the longest matching path prefix, for any request,
//     gRPC or not (a front door forwards "/hangar.session.v1.SessionService/"
//     to another in-process Server's Handler);
//  2. the gRPC server, for HTTP/2 requests whose content-type starts with
//     application/grpc;
//  3. GET /healthz (bearer token required), GET /metrics and
//     GET /openapi.json (no token);
//  4. the grpc-gateway mux, whose handlers call the gRPC server through a
//     client connection to the server's own listener, passing the caller's
//     Authorization header on (so REST calls are authenticated by the same
//     interceptor as gRPC calls).
package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/hangar-dev/hangar/platform/auth"
	"github.com/hangar-dev/hangar/platform/rpc"
)

// DefaultShutdownTimeout bounds the graceful drain when
// Options.ShutdownTimeout is zero.
const DefaultShutdownTimeout = 10 * time.Second

// readHeaderTimeout bounds how long a client may take to send request
// headers (slowloris). It does not limit streaming calls.
const readHeaderTimeout = 10 * time.Second

// Options configures a Server.
type Options struct {
	// Name is the service name, e.g. "session-svc"; the server's own log
	// records carry it as "server" (the Logger's attributes are left to the
	// caller).
	Name string
	// Logger receives the server's and the gRPC chain's records. Nil discards.
	Logger *slog.Logger
	// Token is the bearer token required on gRPC, REST and /healthz. Required.
	Token string
	// Register registers the service implementations on the gRPC server.
	// The health and reflection services are registered already.
	Register func(s *grpc.Server)
	// Gateways are grpc-gateway RegisterXxxHandler functions. They are called
	// by Serve, once the server's own listener address is known.
	Gateways []func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error
	// OpenAPI is served at GET /openapi.json without a token; nil means 404.
	OpenAPI []byte
	// Metrics is served at GET /metrics without a token; nil means 404.
	Metrics http.Handler
	// Routes maps path prefixes (starting with "/") to handlers that get
	// matching requests before anything else, without a token check of this
	// server's own (the target does its own).
	Routes map[string]http.Handler
	// ShutdownTimeout bounds the graceful drain; zero means 10s. Calls still
	// running after it are canceled.
	ShutdownTimeout time.Duration

	// DefaultTimeout is the deadline given to unary gRPC calls that arrive
	// without one; zero means 30s (see rpc.ServerOptions).
	DefaultTimeout time.Duration
	// TracerProvider and MeterProvider are used for the gRPC server and the
	// gateway's client connection; nil means the OpenTelemetry globals.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// Server is one service's API endpoint. Create it with New and run it with
// Serve.
type Server struct {
	opts    Options
	logger  *slog.Logger
	grpc    *grpc.Server
	health  *health.Server
	routes  []route
	handler http.Handler
	gateway atomic.Pointer[runtime.ServeMux] // set by Serve
	started atomic.Bool
}

type route struct {
	prefix string
	h      http.Handler
}

// New builds the gRPC server (with rpc.NewServer), registers the health and
// reflection services and opts.Register's services, and the HTTP dispatcher.
// Health reports NOT_SERVING until Serve runs.
func New(opts Options) (*Server, error) {
	if opts.Token == "" {
		return nil, errors.New("apiserver: Options.Token is required")
	}
	if opts.ShutdownTimeout <= 0 {
		opts.ShutdownTimeout = DefaultShutdownTimeout
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts, logger: logger}
	for prefix, h := range opts.Routes {
		if !strings.HasPrefix(prefix, "/") || h == nil {
			return nil, fmt.Errorf("apiserver: route %q: want a path prefix starting with / and a non-nil handler", prefix)
		}
		s.routes = append(s.routes, route{prefix: prefix, h: h})
	}
	// Longest prefix first, so "/a/b/" wins over "/a/".
	slices.SortFunc(s.routes, func(a, b route) int {
		if n := len(b.prefix) - len(a.prefix); n != 0 {
			return n
		}
		return strings.Compare(a.prefix, b.prefix)
	})

	s.grpc = rpc.NewServer(rpc.ServerOptions{
		Logger:         logger,
		Token:          opts.Token,
		DefaultTimeout: opts.DefaultTimeout,
		TracerProvider: opts.TracerProvider,
		MeterProvider:  opts.MeterProvider,
	})
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	if opts.Register != nil {
		opts.Register(s.grpc)
	}
	s.setServing(healthpb.HealthCheckResponse_NOT_SERVING)

	d := &dispatcher{s: s, healthz: auth.HTTPMiddleware(opts.Token, getOnly(http.HandlerFunc(s.serveHealthz)))}
	if opts.Metrics != nil {
		d.metrics = getOnly(opts.Metrics)
	}
	if opts.OpenAPI != nil {
		d.openAPI = getOnly(http.HandlerFunc(s.serveOpenAPI))
	}
	s.handler = d
	return s, nil
}

// setServing sets the overall status ("") and every registered service's.
func (s *Server) setServing(st healthpb.HealthCheckResponse_ServingStatus) {
	s.health.SetServingStatus("", st)
	for name := range s.grpc.GetServiceInfo() {
		s.health.SetServingStatus(name, st)
	}
}

// GRPC returns the gRPC server.
func (s *Server) GRPC() *grpc.Server { return s.grpc }

// Health returns the health server. Serve sets "" and every registered
// service SERVING once it serves and NOT_SERVING when it starts draining; a
// service may set its own status in between (e.g. while its store is down).
func (s *Server) Health() *health.Server { return s.health }

// Handler returns the whole dispatcher, so that another server can route
// requests to this one in process (Options.Routes). gRPC calls work through
// it at any time; REST calls and a SERVING health need Serve to be running
// (on any listener: the gateway dials it).
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves on lis until ctx is done, then drains: health goes
// NOT_SERVING, new connections are refused, and running calls get up to
// Options.ShutdownTimeout to finish before they are canceled. It returns nil
// after a shutdown caused by ctx, and an error if the server could not start
// or the listener failed. Serve may be called once; it closes lis.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("apiserver: Serve called twice")
	}
	addr := lis.Addr().String()
	conn, err := rpc.Dial(dialTarget(lis.Addr()), rpc.ClientOptions{
		TracerProvider: s.opts.TracerProvider,
		MeterProvider:  s.opts.MeterProvider,
	})
	if err != nil {
		_ = lis.Close()
		return fmt.Errorf("apiserver: %s: dial own listener: %w", s.opts.Name, err)
	}
	gw := newGatewayMux()
	for _, register := range s.opts.Gateways {
		if err := register(ctx, gw, conn); err != nil {
			_ = conn.Close()
			_ = lis.Close()
			return fmt.Errorf("apiserver: %s: register gateway: %w", s.opts.Name, err)
		}
	}
	s.gateway.Store(gw)

	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:   s.handler,
		Protocols: &protocols,
		HTTP2: &http.HTTP2Config{
			MaxReceiveBufferPerStream:     rpc.StreamWindow,
			MaxReceiveBufferPerConnection: rpc.ConnWindow,
		},
		ReadHeaderTimeout: readHeaderTimeout,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	s.setServing(healthpb.HealthCheckResponse_SERVING)
	s.logger.LogAttrs(ctx, slog.LevelInfo, "apiserver serving",
		slog.String("server", s.opts.Name), slog.String("addr", addr))

	var serveErr error
	serveDone := false
	select {
	case <-ctx.Done():
	case serveErr = <-served: // the listener failed
		serveDone = true
	}

	s.logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelInfo, "apiserver draining",
		slog.String("server", s.opts.Name), slog.String("addr", addr), slog.Duration("timeout", s.opts.ShutdownTimeout))
	// NOT_SERVING first, so load balancers and watchers stop sending.
	s.health.Shutdown()
	drainCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.ShutdownTimeout)
	defer cancel()
	forced := false
	if err := srv.Shutdown(drainCtx); err != nil {
		// Calls still running (long streams): cancel them.
		forced = true
		s.grpc.Stop()
		_ = srv.Close()
	}
	// Every HTTP handler has returned, so no gRPC call is left; GracefulStop
	// only releases the server. Bounded anyway.
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-drainCtx.Done():
		forced = true
		s.grpc.Stop()
		<-stopped
	}
	_ = conn.Close()
	if !serveDone {
		serveErr = <-served
	}
	if forced {
		s.logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelWarn, "apiserver drain timed out, calls canceled",
			slog.String("server", s.opts.Name), slog.String("addr", addr))
	}
	s.logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelInfo, "apiserver stopped",
		slog.String("server", s.opts.Name), slog.String("addr", addr))
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("apiserver: %s: serve on %s: %w", s.opts.Name, addr, serveErr)
	}
	return nil
}

// dialTarget is a gRPC target reaching the listener at addr from this host.
func dialTarget(addr net.Addr) string {
	switch a := addr.(type) {
	case *net.TCPAddr:
		switch {
		case a.IP == nil || a.IP.Equal(net.IPv4zero):
			return net.JoinHostPort("127.0.0.1", fmt.Sprint(a.Port))
		case a.IP.IsUnspecified():
			// "[::]" may be dual-stack or IPv6-only; localhost resolves to
			// both loopbacks and gRPC tries each.
			return net.JoinHostPort("localhost", fmt.Sprint(a.Port))
		}
	case *net.UnixAddr:
		if name, ok := strings.CutPrefix(a.Name, "@"); ok {
			return "unix-abstract:" + name
		}
		return "unix:" + a.Name
	}
	return addr.String()
}

// newGatewayMux returns a grpc-gateway mux that writes JSON with the proto
// field names and all fields, and ignores unknown request fields.
func newGatewayMux() *runtime.ServeMux {
	return runtime.NewServeMux(
		runtime.WithErrorHandler(restErrorHandler),
		runtime.WithOutgoingHeaderMatcher(noMetadataHeaders),
		runtime.WithOutgoingTrailerMatcher(noMetadataHeaders),
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.HTTPBodyMarshaler{
			Marshaler: &runtime.JSONPb{
				MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
				UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: true},
			},
		}),
	)
}

type dispatcher struct {
	s                         *Server
	healthz, metrics, openAPI http.Handler // nil when not served
}

func (d *dispatcher) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for _, rt := range d.s.routes {
		if strings.HasPrefix(r.URL.Path, rt.prefix) {
			rt.h.ServeHTTP(w, r)
			return
		}
	}
	if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
		d.s.grpc.ServeHTTP(w, r)
		return
	}
	var fixed http.Handler
	switch r.URL.Path {
	case "/healthz":
		fixed = d.healthz
	case "/metrics":
		fixed = d.metrics
	case "/openapi.json":
		fixed = d.openAPI
	}
	if fixed != nil {
		fixed.ServeHTTP(w, r)
		return
	}
	gw := d.s.gateway.Load()
	if gw == nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"code": 14, "message": "server is not serving yet"})
		return
	}
	gw.ServeHTTP(w, r)
}

func (s *Server) serveHealthz(w http.ResponseWriter, r *http.Request) {
	resp, err := s.health.Check(r.Context(), &healthpb.HealthCheckRequest{})
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if err == nil {
		st = resp.GetStatus()
	}
	code := http.StatusOK
	if st != healthpb.HealthCheckResponse_SERVING {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, map[string]string{"status": st.String()})
}

func (s *Server) serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(s.opts.OpenAPI)
}

func getOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeJSON(w, http.StatusMethodNotAllowed, map[string]any{"code": 12, "message": "method not allowed"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
