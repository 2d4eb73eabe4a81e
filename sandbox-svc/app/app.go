// Package app wires sandbox-svc: its configuration, its gRPC service and its
// REST routes. cmd/sandbox-svc runs it alone; `hangar up` runs it in one
// process with the other services.
package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/openapi"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/platform/redisconn"
	"github.com/hangar-dev/hangar/platform/service"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/server"
)

// Name is the service's name in logs, traces and metrics.
const Name = "sandbox-svc"

// shutdownTimeout bounds destroying every sandbox (destroy hooks included)
// when the service stops.
const shutdownTimeout = 60 * time.Second

// longCallTimeout is the deadline for unary calls that come without one.
const longCallTimeout = 15 * time.Minute

// App is a configured sandbox-svc, ready to serve.
type App struct {
	svc       *service.Service
	sandboxes *server.Server
	redis     *redisconn.Conn
}

// New builds the service from cfg. logger may be nil.
func New(ctx context.Context, cfg Config, logger *slog.Logger) (*App, error) {
	if logger == nil {
		logger = logging.New(os.Stderr, cfg.LogLevel, cfg.LogFormat)
	}
	redis, err := redisconn.Open(ctx, cfg.RedisURL, logger)
	if err != nil {
		return nil, err
	}
	sandboxes, err := server.New(ctx, server.Deps{
		Redis:       redis.Client,
		Home:        cfg.Home,
		Logger:      logger.With("service", Name),
		Now:         time.Now,
		KeyPrefix:   server.DefaultKeyPrefix,
		GatewayAddr: cfg.GatewayAddr,
		CopyFiles:   cfg.Copies == "files",
		Isolation:   isolation(cfg.Isolation),
		// Agent CLIs named without a directory are looked up on this
		// service's PATH too (`hangar up` with the CLIs on PATH): their
		// install directories are bound and go on the sandboxes' PATH.
		ReadOnlyPaths: append(local.InstallDirs(local.SandboxPath+string(filepath.ListSeparator)+os.Getenv("PATH"), cfg.ClaudeBin, cfg.CodexBin, cfg.PiBin, cfg.PiNodeBinDir),
			cfg.ReadOnlyPaths...),
		SearchPath: local.FoundDirs(os.Getenv("PATH"), cfg.ClaudeBin, cfg.CodexBin, cfg.PiBin),
	})
	if err != nil {
		_ = redis.Close()
		return nil, fmt.Errorf("starting the sandbox service: %w", err)
	}
	svc, err := service.New(ctx, service.Options{
		Name:   Name,
		Common: cfg.Common,
		Logger: logger,
		Register: func(s *grpc.Server) {
			sandboxv1.RegisterSandboxServiceServer(s, sandboxes)
		},
		Gateways: []service.Gateway{sandboxv1.RegisterSandboxServiceHandler},
		OpenAPI:  openapi.Document,
		// Unary calls run long here: a cold create clones the repository and runs setup.
		DefaultTimeout: longCallTimeout,
	})
	if err != nil {
		_ = sandboxes.Close(ctx)
		_ = redis.Close()
		return nil, err
	}
	return &App{svc: svc, sandboxes: sandboxes, redis: redis}, nil
}

func isolation(name string) local.Isolation {
	if name == "none" {
		return local.IsolationNone
	}
	return local.IsolationBwrap
}

// Isolation names how sandboxes are isolated: "bwrap", "none" (the
// operator opted out) or "unavailable" (bwrap cannot run here: no sandbox
// starts). `hangar up` shows it.
func (a *App) Isolation() string { return a.sandboxes.Isolation() }

// Handler serves gRPC and REST in-process (for a front door).
func (a *App) Handler() http.Handler { return a.svc.Handler() }

// Run serves on lis until ctx ends, then destroys every sandbox (running
// destroy hooks) and releases the service's resources.
func (a *App) Run(ctx context.Context, lis net.Listener) error {
	err := a.svc.Serve(ctx, lis)
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if cerr := a.sandboxes.Close(closeCtx); cerr != nil {
		a.svc.Logger().WarnContext(ctx, "sandbox shutdown failed", "error", cerr)
	}
	if cerr := a.redis.Close(); cerr != nil {
		a.svc.Logger().WarnContext(ctx, "redis close failed", "error", cerr)
	}
	return err
}
