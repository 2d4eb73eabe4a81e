// Package app wires replay-svc: its configuration, its records, its gRPC
// service and its REST routes. cmd/replay-svc runs it alone; `hangar up`
// runs it in one process with the other services.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"

	"google.golang.org/grpc"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/api/openapi"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/platform/rpc"
	"github.com/hangar-dev/hangar/platform/service"
	"github.com/hangar-dev/hangar/replay-svc/internal/forks"
	"github.com/hangar-dev/hangar/replay-svc/internal/server"
	"github.com/hangar-dev/hangar/replay-svc/internal/store"
)

// Name is the service's name in logs, traces and metrics.
const Name = "replay-svc"

// App is a configured replay-svc, ready to serve.
type App struct {
	svc     *service.Service
	forks   *forks.Manager
	closers []func() error
}

// New builds the service from cfg. logger may be nil.
func New(ctx context.Context, cfg Config, logger *slog.Logger) (_ *App, err error) {
	if logger == nil {
		logger = logging.New(os.Stderr, cfg.LogLevel, cfg.LogFormat)
	}
	a := &App{}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	records, err := store.Open(ctx, store.Options{DatabaseURL: cfg.DatabaseURL, SQLitePath: filepath.Join(cfg.Home, "replay.db")})
	if err != nil {
		if cfg.DatabaseURL != "" {
			return nil, fmt.Errorf("HANGAR_DATABASE_URL: cannot open the replay database: %w", err)
		}
		return nil, fmt.Errorf("HANGAR_HOME=%s: cannot open the replay database: %w", cfg.Home, err)
	}
	a.closers = append(a.closers, records.Close)
	dial := func(addr, variable string) (*grpc.ClientConn, error) {
		conn, err := rpc.Dial(addr, rpc.ClientOptions{Token: cfg.Token, DefaultTimeout: rpc.DefaultTimeout})
		if err != nil {
			return nil, fmt.Errorf("%s=%s: %w", variable, addr, err)
		}
		a.closers = append(a.closers, conn.Close)
		return conn, nil
	}
	sessionConn, err := dial(cfg.SessionAddr, "HANGAR_SESSION_ADDR")
	if err != nil {
		return nil, err
	}
	gatewayConn, err := dial(cfg.GatewayAddr, "HANGAR_GATEWAY_ADDR")
	if err != nil {
		return nil, err
	}
	sandboxConn, err := dial(cfg.SandboxAddr, "HANGAR_SANDBOX_ADDR")
	if err != nil {
		return nil, err
	}
	a.forks = forks.New(forks.Options{
		Store:        records,
		Environments: sandboxv1.NewSandboxServiceClient(sandboxConn),
		Jobs:         sessionv1.NewJobServiceClient(sessionConn),
		Checks: forks.SandboxChecks{Sessions: sessionv1.NewSessionServiceClient(sessionConn),
			Sandboxes: sandboxv1.NewSandboxServiceClient(sandboxConn)},
		Gateway:          gatewayv1.NewGatewayServiceClient(gatewayConn),
		Sessions:         sessionv1.NewSessionServiceClient(sessionConn),
		Logger:           logger.With("service", Name),
		MaxContinuations: cfg.ContinuationsMax,
	})
	replays := server.New(a.forks, records)
	a.svc, err = service.New(ctx, service.Options{
		Name:   Name,
		Common: cfg.Common,
		Logger: logger,
		Register: func(s *grpc.Server) {
			replayv1.RegisterReplayServiceServer(s, replays)
		},
		Gateways: []service.Gateway{replayv1.RegisterReplayServiceHandler},
		OpenAPI:  openapi.Document,
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

func (a *App) close() error {
	var errs []error
	for i := len(a.closers) - 1; i >= 0; i-- {
		errs = append(errs, a.closers[i]())
	}
	a.closers = nil
	return errors.Join(errs...)
}

// Handler serves gRPC and REST in-process (for a front door).
func (a *App) Handler() http.Handler { return a.svc.Handler() }

// Run serves on lis and carries out forks until ctx ends.
func (a *App) Run(ctx context.Context, lis net.Listener) error {
	defer func() { _ = a.close() }()
	bg, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.forks.Run(bg)
	}()
	err := a.svc.Serve(ctx, lis)
	stop()
	<-done
	return err
}
