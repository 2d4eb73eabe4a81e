// Package service assembles one hangar service process: its logger, its
// telemetry and its API server (gRPC and REST on one port), and runs it until
// its context ends. Every service's app package and `hangar up` use it, so a
// service runs the same way alone and in one process with the others.
package service

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/hangar-dev/hangar/platform/apiserver"
	"github.com/hangar-dev/hangar/platform/config"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/platform/telemetry"
)

// Gateway registers a grpc-gateway handler (a generated
// Register<Service>Handler function).
type Gateway = func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error

// Options describe a service.
type Options struct {
	// Name is the service's name, e.g. "session-svc".
	Name   string
	Common config.Common
	// Logger is used when set; otherwise one is built from Common.
	Logger *slog.Logger
	// Register registers the service's gRPC implementations.
	Register func(s *grpc.Server)
	// Gateways are the REST handlers of the registered services.
	Gateways []Gateway
	// Routes are extra path prefixes served before gRPC and REST (the
	// gateway's data plane, a front door's forwarding).
	Routes  map[string]http.Handler
	OpenAPI []byte
	// Index is served at GET / without a token (the dashboard's page).
	Index http.Handler
	// DefaultTimeout is the deadline given to unary calls that arrive
	// without one (rpc.DefaultTimeout when zero). Services whose calls run
	// long (a cold sandbox create, a checkpoint capture) raise it.
	DefaultTimeout time.Duration
}

// Service is a service ready to serve.
type Service struct {
	name      string
	logger    *slog.Logger
	telemetry *telemetry.Telemetry
	server    *apiserver.Server
}

// New builds the service's telemetry and API server. It does not listen.
func New(ctx context.Context, opts Options) (*Service, error) {
	if opts.Common.Token == "" {
		return nil, errors.New("HANGAR_TOKEN is required: set it to the API bearer token")
	}
	logger := opts.Logger
	if logger == nil {
		logger = logging.New(os.Stderr, opts.Common.LogLevel, opts.Common.LogFormat)
	}
	logger = logger.With("service", opts.Name)
	tel, err := telemetry.Setup(ctx, telemetry.Options{ServiceName: opts.Name, OTLPEndpoint: opts.Common.OTLPEndpoint})
	if err != nil {
		return nil, fmt.Errorf("HANGAR_OTLP_ENDPOINT=%q: cannot set up telemetry: %w", opts.Common.OTLPEndpoint, err)
	}
	srv, err := apiserver.New(apiserver.Options{
		Name:     opts.Name,
		Logger:   logger,
		Token:    opts.Common.Token,
		Register: opts.Register,
		Gateways: opts.Gateways,
		OpenAPI:  opts.OpenAPI,
		Metrics:  tel.MetricsHandler(),
		Routes:   opts.Routes,
		Index:    opts.Index,

		MaxRequestBytes: opts.Common.MaxRequestBytes(),
		DefaultTimeout:  opts.DefaultTimeout,
	})
	if err != nil {
		_ = tel.Shutdown(ctx)
		return nil, fmt.Errorf("%s: building the API server: %w", opts.Name, err)
	}
	return &Service{name: opts.Name, logger: logger, telemetry: tel, server: srv}, nil
}

// Handler is the whole dispatcher (gRPC, REST, health, metrics), for a front
// door that routes to this service in-process.
func (s *Service) Handler() http.Handler { return s.server.Handler() }

// Health is the service's gRPC health server.
func (s *Service) Health() *health.Server { return s.server.Health() }

// Logger is the service's logger.
func (s *Service) Logger() *slog.Logger { return s.logger }

// Serve serves on lis until ctx ends, then drains and shuts telemetry down.
func (s *Service) Serve(ctx context.Context, lis net.Listener) error {
	s.logger.InfoContext(ctx, "service listening", "addr", lis.Addr().String())
	err := s.server.Serve(ctx, lis)
	shutdownCtx := context.WithoutCancel(ctx)
	if terr := s.telemetry.Shutdown(shutdownCtx); terr != nil {
		s.logger.WarnContext(ctx, "telemetry shutdown failed", "error", terr)
	}
	s.logger.InfoContext(ctx, "service stopped")
	return err
}

// Listen listens on addr, or says in one line which setting to change.
func Listen(addr, variable string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) && errno == syscall.EADDRINUSE {
			return nil, fmt.Errorf("%s=%s: address already in use: stop what listens there or choose another address", variable, addr)
		}
		return nil, fmt.Errorf("%s=%s: cannot listen: %w", variable, addr, err)
	}
	return lis, nil
}

// Main runs a service binary: run gets a context that ends on SIGINT or
// SIGTERM and the command-line arguments. An error is printed as one line and
// the process exits with status 1.
func Main(name string, run func(ctx context.Context, args []string) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}
