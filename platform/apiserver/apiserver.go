// Package apiserver serves a hangar service's gRPC API, its REST mapping
// (grpc-gateway), /healthz, /readyz, /metrics and /openapi.json on one port,
// and drains gracefully on shutdown.
//
// One http.Server speaks HTTP/1.1 and unencrypted HTTP/2 (h2c with prior
// knowledge, which is what gRPC clients send over plaintext). GET / is
// Options.Index (the dashboard), without a token. Each request is
// dispatched, in order, to:
//
//  1. Options.Routes: the longest matching path prefix, for any request,
//     gRPC or not (a front door forwards "/hangar.session.v1.SessionService/"
//     to another in-process Server's Handler, which checks the token itself);
//  2. GET /healthz (the process answers), GET /readyz (the server is
//     SERVING) and GET /openapi.json, without a token; the health endpoints
//     answer "ok" and nothing else;
//  3. the bearer-token check, from the request's headers alone (a REST call
//     without an Authorization header may carry the token in the
//     dashboard's sign-in cookie instead, see auth.CookieAuthorization): a request
//     without the token is answered (401, or Unauthenticated for gRPC)
//     before any of its body is read, whatever its path or gRPC service;
//  4. the gRPC server, for HTTP/2 requests whose content-type starts with
//     application/grpc (messages capped at Options.MaxRequestBytes);
//  5. GET /metrics;
//  6. the grpc-gateway mux, with the body capped at Options.MaxRequestBytes
//     (413 beyond it, before reading when Content-Length says so), whose
//     handlers call the gRPC server through a client connection to the
//     server's own listener, passing the caller's Authorization header on (so
//     REST calls also pass the same interceptors as gRPC calls). Enum fields
//     given by an unknown name are InvalidArgument (protojson would drop
//     them, as it drops unknown fields).
package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/hangar-dev/hangar/platform/apijson"
	"github.com/hangar-dev/hangar/platform/auth"
	"github.com/hangar-dev/hangar/platform/fault"
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
	// Token is the bearer token required on gRPC, REST and /metrics. Required.
	Token string
	// MaxRequestBytes caps a REST request body and a received gRPC message;
	// zero means rpc.DefaultMaxMessageBytes.
	MaxRequestBytes int64
	// Register registers the service implementations on the gRPC server.
	// The health and reflection services are registered already.
	Register func(s *grpc.Server)
	// Gateways are grpc-gateway RegisterXxxHandler functions. They are called
	// by Serve, once the server's own listener address is known.
	Gateways []func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error
	// OpenAPI is served at GET /openapi.json without a token; nil means 404.
	// It is protoc-gen-openapiv2's document, which New rewrites to describe
	// the JSON the gateway speaks (apijson.OpenAPI: enums by their JSON
	// names, 64-bit integers as integers) for the hangar.* enums registered
	// in protoregistry.GlobalFiles.
	OpenAPI []byte
	// Index is served at GET / (that path only) without a token: the
	// dashboard's page, which asks for the token itself. Nil means 404.
	Index http.Handler
	// Metrics is served at GET /metrics to holders of the token; nil means
	// 404.
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
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = rpc.DefaultMaxMessageBytes
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if opts.OpenAPI != nil {
		doc, err := apijson.OpenAPI(opts.OpenAPI, protoregistry.GlobalFiles, "hangar.")
		if err != nil {
			return nil, fmt.Errorf("apiserver: Options.OpenAPI: %w", err)
		}
		opts.OpenAPI = doc
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
		Logger:          logger,
		Token:           opts.Token,
		DefaultTimeout:  opts.DefaultTimeout,
		MaxRecvMsgBytes: opts.MaxRequestBytes,
		TracerProvider:  opts.TracerProvider,
		MeterProvider:   opts.MeterProvider,
	})
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	if opts.Register != nil {
		opts.Register(s.grpc)
	}
	s.setServing(healthpb.HealthCheckResponse_NOT_SERVING)

	d := &dispatcher{s: s, healthz: getOnly(http.HandlerFunc(serveLive)), readyz: getOnly(http.HandlerFunc(s.serveReady))}
	if opts.Metrics != nil {
		d.metrics = getOnly(opts.Metrics)
	}
	if opts.OpenAPI != nil {
		d.openAPI = getOnly(http.HandlerFunc(s.serveOpenAPI))
	}
	if opts.Index != nil {
		d.index = getOnly(opts.Index)
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
		MaxRecvMsgBytes: s.opts.MaxRequestBytes,
		TracerProvider:  s.opts.TracerProvider,
		MeterProvider:   s.opts.MeterProvider,
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

// newGatewayMux returns a grpc-gateway mux that writes and reads hangar's
// JSON (apijson: proto field names, all fields, enums by the names the docs
// use, 64-bit integers as numbers), ignores unknown request fields but not
// unknown enum names, and answers a body over the cap with 413.
func newGatewayMux() *runtime.ServeMux {
	return runtime.NewServeMux(
		runtime.WithOutgoingHeaderMatcher(noMetadataHeaders),
		runtime.WithOutgoingTrailerMatcher(noMetadataHeaders),
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.HTTPBodyMarshaler{
			Marshaler: &enumCheckingJSON{},
		}),
		runtime.WithErrorHandler(gatewayError),
		// {path=**} needs a path: GET /api/sessions/NAME/artifacts is
		// ListArtifacts, not GetArtifact of "" (grpc-gateway tries the
		// route registered last first, and a deep wildcard matched
		// nothing at all otherwise).
		runtime.WithStrictDeepWildcardMatching(),
	)
}

// gatewayError is restErrorHandler, except for what the body
// reader saw: a body over the cap is a 413, and an unknown enum name the
// InvalidArgument status the gRPC edge gives (with its reason and field)
// rather than the gateway's bare one.
func gatewayError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	if body, ok := r.Body.(*cappedBody); ok {
		switch {
		case body.overLimit.Load():
			writeTooLarge(w, r, body.limit)
			return
		case body.decodeFault.Load() != nil:
			err = fault.Status(body.decodeFault.Load()).Err()
		}
	}
	if status.Code(err) == codes.InvalidArgument && r.URL.RawQuery != "" {
		if md := requestDescriptor(ctx); md != nil {
			var ferr *fault.Error
			if _, qerr := apijson.NormalizeQuery(md, r.URL.Query()); errors.As(qerr, &ferr) {
				err = fault.Status(ferr).Err()
			}
		}
	}
	restErrorHandler(ctx, mux, m, w, r, err)
}

type dispatcher struct {
	s                                 *Server
	healthz, readyz, metrics, openAPI http.Handler // nil when not served
	index                             http.Handler // GET /: nil when not served
}

func (d *dispatcher) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for _, rt := range d.s.routes {
		if strings.HasPrefix(r.URL.Path, rt.prefix) {
			rt.h.ServeHTTP(w, r)
			return
		}
	}
	isGRPC := r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc")
	if !isGRPC {
		var open http.Handler
		switch r.URL.Path {
		case "/healthz":
			open = d.healthz
		case "/readyz":
			open = d.readyz
		case "/openapi.json":
			open = d.openAPI
		case "/":
			open = d.index
		}
		if open != nil {
			open.ServeHTTP(w, r)
			return
		}
	}
	// Everything else needs the token, checked on the headers alone: nothing
	// of the body is read for a caller without it, and a gRPC call to a
	// service this server does not have looks like any other.
	if !isGRPC && r.Header.Get("Authorization") == "" {
		// The dashboard's sign-in cookie stands for the bearer header on
		// REST calls from its own pages (auth.CookieAuthorization checks
		// origin and the CSRF header); the gateway passes it on as one.
		if authorization := auth.CookieAuthorization(r); authorization != "" {
			r.Header.Set("Authorization", authorization)
			r.Header.Del("Cookie")
		}
	}
	if !auth.Valid(d.s.opts.Token, r.Header.Get("Authorization")) {
		if isGRPC {
			writeGRPCUnauthenticated(w)
		} else {
			auth.WriteUnauthorized(w, r)
		}
		return
	}
	if isGRPC {
		d.s.grpc.ServeHTTP(w, r)
		return
	}
	if r.URL.Path == "/metrics" && d.metrics != nil {
		d.metrics.ServeHTTP(w, r)
		return
	}
	gw := d.s.gateway.Load()
	if gw == nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"code": 14, "message": "server is not serving yet"})
		return
	}
	limit := d.s.opts.MaxRequestBytes
	if r.ContentLength > limit {
		writeTooLarge(w, r, limit)
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &cappedBody{ReadCloser: http.MaxBytesReader(w, r.Body, limit), limit: limit}
	}
	gw.ServeHTTP(w, r)
}

// cappedBody is a REST request body read through http.MaxBytesReader. It
// remembers what went wrong while the gateway read it, for gatewayError.
type cappedBody struct {
	io.ReadCloser
	limit       int64
	overLimit   atomic.Bool
	decodeFault atomic.Pointer[fault.Error]
}

func (b *cappedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		b.overLimit.Store(true)
	}
	return n, err
}

// writeTooLarge answers 413 in the gateway's error shape. Code 8 is
// RESOURCE_EXHAUSTED, what a gRPC server answers for a message over its cap.
// An HTTP/1 connection is closed after it rather than drained of the rest.
func writeTooLarge(w http.ResponseWriter, r *http.Request, limit int64) {
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
	writeJSON(w, http.StatusRequestEntityTooLarge, RESTError{
		Code: codeName(codes.ResourceExhausted), Reason: "REQUEST_TOO_LARGE",
		Message: fmt.Sprintf("request body over the %s limit (HANGAR_MAX_REQUEST_MB)", formatLimit(limit)),
	})
}

// formatLimit writes a byte count in whole MB when it is one.
func formatLimit(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// writeGRPCUnauthenticated answers a gRPC call with status Unauthenticated
// (headers, no message, trailers), as grpc-go's handler transport would,
// without reading the request.
func writeGRPCUnauthenticated(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/grpc")
	h.Add("Trailer", "Grpc-Status")
	h.Add("Trailer", "Grpc-Message")
	w.WriteHeader(http.StatusOK)
	h.Set("Grpc-Status", strconv.Itoa(int(codes.Unauthenticated)))
	// The message is printable ASCII without '%': no percent-encoding needed.
	h.Set("Grpc-Message", auth.Message)
}

// serveLive answers that the process serves HTTP.
func serveLive(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, "ok")
}

// serveReady answers "ok" while the server is SERVING (between Serve's start
// and its drain), 503 otherwise.
func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	resp, err := s.health.Check(r.Context(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		writeText(w, http.StatusServiceUnavailable, "not ready")
		return
	}
	writeText(w, http.StatusOK, "ok")
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

func writeText(w http.ResponseWriter, code int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, text+"\n")
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
