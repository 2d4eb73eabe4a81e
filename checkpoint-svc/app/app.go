// Package app wires checkpoint-svc: its configuration, its store, the vault
// key, the sandbox service it reads sandboxes through, its gRPC service and
// its REST routes. cmd/checkpoint-svc runs it alone; `hangar up` runs it in
// one process with the other services.
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
	"strings"
	"time"

	"google.golang.org/grpc"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/openapi"
	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/server"
	"github.com/hangar-dev/hangar/platform/blob"
	"github.com/hangar-dev/hangar/platform/gcsstore"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/platform/redisconn"
	"github.com/hangar-dev/hangar/platform/rpc"
	"github.com/hangar-dev/hangar/platform/service"
)

// Name is the service's name in logs, traces and metrics.
const Name = "checkpoint-svc"

// longCallTimeout is the deadline for unary calls that come without one.
const longCallTimeout = 15 * time.Minute

// App is a configured checkpoint-svc, ready to serve.
type App struct {
	svc      *service.Service
	sandbox  *grpc.ClientConn
	closeGCS func() error
}

// New builds the service from cfg. logger may be nil.
func New(ctx context.Context, cfg Config, logger *slog.Logger) (*App, error) {
	if logger == nil {
		logger = logging.New(os.Stderr, cfg.LogLevel, cfg.LogFormat)
	}
	keys, err := server.LoadVaultKeys(cfg.VaultKeyFile)
	if err != nil {
		return nil, fmt.Errorf("HANGAR_VAULT_KEY_FILE=%s: %w", cfg.VaultKeyFile, err)
	}
	store, closeGCS, err := openStore(ctx, cfg)
	if err != nil {
		return nil, err
	}
	// Replicas sharing a Redis (and so a store) must seal with one vault
	// key into one store: one that disagrees refuses to start.
	var agreed *redisconn.Conn
	if cfg.RedisURL != "" {
		keyBytes, err := os.ReadFile(cfg.VaultKeyFile)
		if err != nil {
			_ = closeGCS()
			return nil, fmt.Errorf("HANGAR_VAULT_KEY_FILE=%s: %w", cfg.VaultKeyFile, err)
		}
		storeName := cfg.Store
		if storeName == "" {
			storeName = filepath.Join(cfg.Home, "checkpoints")
		}
		if agreed, err = redisconn.Open(ctx, cfg.RedisURL, logger); err != nil {
			_ = closeGCS()
			return nil, err
		}
		if err := agreed.Agree(ctx, []redisconn.Setting{
			{Name: "HANGAR_TOKEN", Value: cfg.Token},
			{Name: "HANGAR_VAULT_KEY_FILE", Value: strings.TrimSpace(string(keyBytes))},
			{Name: "HANGAR_SESSION_STORE", Value: storeName},
		}); err != nil {
			_ = agreed.Close()
			_ = closeGCS()
			return nil, err
		}
		prev := closeGCS
		closeGCS = func() error { return errors.Join(agreed.Close(), prev()) }
	}
	// Checkpoint streams run as long as a capture or restore takes: no
	// default per-call deadline on this connection.
	// Captures and restores are this service's own work, not a use that
	// keeps a session open (sandboxexec.ServiceCallKey).
	sandbox, err := rpc.Dial(cfg.SandboxAddr, rpc.ClientOptions{Token: cfg.Token, DefaultTimeout: -1}, sandboxexec.ServiceCallDialOptions()...)
	if err != nil {
		_ = closeGCS()
		return nil, fmt.Errorf("HANGAR_SANDBOX_ADDR=%s: %w", cfg.SandboxAddr, err)
	}
	checkpoints, err := server.New(server.Deps{
		Store:           store,
		Exec:            sandboxexec.New(sandboxv1.NewSandboxServiceClient(sandbox)),
		VaultKeys:       keys,
		Logger:          logger.With("service", Name),
		Now:             time.Now,
		KeepCheckpoints: cfg.KeepCheckpoints,
		MaxUntrackedMB:  cfg.MaxUntrackedMB,
		MaxPartMB:       cfg.MaxPartMB,
	})
	if err != nil {
		_ = sandbox.Close()
		_ = closeGCS()
		return nil, fmt.Errorf("starting the checkpoint service: %w", err)
	}
	svc, err := service.New(ctx, service.Options{
		Name:   Name,
		Common: cfg.Common,
		Logger: logger,
		Register: func(s *grpc.Server) {
			checkpointv1.RegisterCheckpointServiceServer(s, checkpoints)
		},
		Gateways: []service.Gateway{checkpointv1.RegisterCheckpointServiceHandler},
		OpenAPI:  openapi.Document,
		// Unary calls run long here: a capture or restore moves the whole work tree.
		DefaultTimeout: longCallTimeout,
	})
	if err != nil {
		_ = sandbox.Close()
		_ = closeGCS()
		return nil, err
	}
	return &App{svc: svc, sandbox: sandbox, closeGCS: closeGCS}, nil
}

// openStore opens HANGAR_SESSION_STORE: a directory (the data directory's
// checkpoints/ when empty) or gs://bucket[/prefix].
func openStore(ctx context.Context, cfg Config) (blob.Store, func() error, error) {
	noop := func() error { return nil }
	if strings.HasPrefix(cfg.Store, "gs://") {
		store, closeStore, err := gcsstore.Open(ctx, cfg.Store)
		if err != nil {
			return nil, nil, fmt.Errorf("HANGAR_SESSION_STORE=%s: %w", cfg.Store, err)
		}
		return store, closeStore, nil
	}
	dir := cfg.Store
	if dir == "" {
		dir = filepath.Join(cfg.Home, "checkpoints")
	}
	store, err := blob.NewDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("HANGAR_SESSION_STORE=%s: cannot use the directory: %w", dir, err)
	}
	return store, noop, nil
}

// Handler serves gRPC and REST in-process (for a front door).
func (a *App) Handler() http.Handler { return a.svc.Handler() }

// Run serves on lis until ctx ends, then releases the service's resources.
func (a *App) Run(ctx context.Context, lis net.Listener) error {
	err := a.svc.Serve(ctx, lis)
	if cerr := a.sandbox.Close(); cerr != nil {
		a.svc.Logger().WarnContext(ctx, "sandbox connection close failed", "error", cerr)
	}
	if cerr := a.closeGCS(); cerr != nil {
		a.svc.Logger().WarnContext(ctx, "gcs client close failed", "error", cerr)
	}
	return err
}
