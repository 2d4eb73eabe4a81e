// Package app wires sandbox-svc: its configuration, its gRPC service and its
// REST routes. cmd/sandbox-svc runs it alone; `hangar up` runs it in one
// process with the other services.
package app

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/openapi"
	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/api/sandboxtool/toolbuild"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/platform/redisconn"
	"github.com/hangar-dev/hangar/platform/service"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/kubernetes"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/peers"
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
	driver    driver.Driver
	redis     *redisconn.Conn
	// peers forwards calls on other replicas' sandboxes (nil: one replica).
	peers *peers.Server
}

// baseLayers is how many base layers the local driver keeps: none when
// copies copy files (HANGAR_SANDBOX_COPIES=files asks for no overlay
// mounts at all).
func baseLayers(cfg Config) int {
	if cfg.Copies == "files" {
		return 0
	}
	return cfg.BaseLayers
}

// newDriver builds the driver cfg.Driver names.
func newDriver(ctx context.Context, cfg Config, logger *slog.Logger) (driver.Driver, error) {
	switch cfg.Driver {
	case "local":
		tool, err := findTool(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return local.New(local.Options{
			Root: cmp.Or(cfg.Root, cfg.Home), Gateway: local.ParseGateway(cfg.GatewayAddr), Logger: logger, Now: time.Now,
			CopyFiles: cfg.Copies == "files", Tool: tool, BaseLayers: baseLayers(cfg),
			Isolation: isolation(cfg.Isolation),
			// Agent CLIs named without a directory are looked up on this
			// service's PATH too (`hangar up` with the CLIs on PATH): their
			// install directories are bound and go on the sandboxes' PATH.
			ReadOnlyPaths: append(local.InstallDirs(local.SandboxPath+string(filepath.ListSeparator)+os.Getenv("PATH"), cfg.ClaudeBin, cfg.CodexBin, cfg.PiBin, cfg.PiNodeBinDir),
				cfg.ReadOnlyPaths...),
			SearchPath: local.FoundDirs(os.Getenv("PATH"), cfg.ClaudeBin, cfg.CodexBin, cfg.PiBin),
		})
	case "kubernetes":
		rc, err := kubernetes.ConfigFrom(cfg.KubeConfig)
		if err != nil {
			return nil, fmt.Errorf("HANGAR_SANDBOX_DRIVER=kubernetes: HANGAR_KUBE_CONFIG=%q: %w", cfg.KubeConfig, err)
		}
		// Validate has checked both.
		selector, _ := kubernetes.ParseNodeSelector(cfg.KubeNodeSelector)
		tolerations, _ := kubernetes.ParseTolerations(cfg.KubeTolerations)
		return kubernetes.New(ctx, kubernetes.Options{
			Config: rc, Namespace: cfg.KubeNamespace, Image: cfg.KubeImage, ToolImage: cfg.KubeToolImage,
			ToolPath: cfg.KubeToolPath, NodeName: cfg.KubeNode, NodeSelector: selector, Tolerations: tolerations,
			Gateway: cfg.GatewayAddr, Logger: logger, Now: time.Now,
		})
	default:
		return nil, fmt.Errorf("HANGAR_SANDBOX_DRIVER=%q: no such sandbox driver (local or kubernetes)", cfg.Driver)
	}
}

// findTool returns the hangar-sandbox to place in sandboxes: the one
// HANGAR_SANDBOX_TOOL names, else the one beside this program (a release
// ships them together), else one built from the source tree this runs in
// (`go run ./cli/cmd/hangar up`) into HANGAR_HOME/bin. The hangar binary
// is not the tool itself: it takes ~50 ms to start (88 MB, every
// service's init) against ~3 ms, and a capture runs the tool six times.
func findTool(ctx context.Context, cfg Config) (string, error) {
	if cfg.Tool != "" {
		return cfg.Tool, nil
	}
	if exe, err := os.Executable(); err == nil {
		beside := filepath.Join(filepath.Dir(exe), sandboxtool.Binary)
		if st, err := os.Stat(beside); err == nil && st.Mode().IsRegular() {
			return beside, nil
		}
	}
	tool, err := toolbuild.Build(ctx, filepath.Join(cfg.Home, "bin"))
	if err != nil {
		beside := Name
		if exe, err := os.Executable(); err == nil {
			beside = exe
		}
		return "", fmt.Errorf("no hangar-sandbox: set HANGAR_SANDBOX_TOOL to its path, put it beside %s (go install ./sandbox-svc/cmd/hangar-sandbox in the checkout), or run from the source tree with go on PATH (%w)", beside, err)
	}
	return tool, nil
}

// closeDriver releases what the driver holds (the local driver's lock on
// the sandboxes directory), after every sandbox is destroyed.
func closeDriver(d driver.Driver) error {
	if c, ok := d.(io.Closer); ok {
		return c.Close()
	}
	return nil
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
	if err := redis.Agree(ctx, []redisconn.Setting{{Name: "HANGAR_TOKEN", Value: cfg.Token}}); err != nil {
		_ = redis.Close()
		return nil, err
	}
	svcLogger := logger.With("service", Name)
	drv, err := newDriver(ctx, cfg, svcLogger)
	if err != nil {
		_ = redis.Close()
		return nil, fmt.Errorf("starting the %s sandbox driver: %w", cfg.Driver, err)
	}
	sandboxes, err := server.New(ctx, server.Deps{
		Redis:     redis.Client,
		Driver:    drv,
		Home:      cfg.Home,
		Logger:    svcLogger,
		Now:       time.Now,
		KeyPrefix: server.DefaultKeyPrefix,
		CacheSize: cacheSize(cfg.Cache), CacheMaxBytes: int64(cfg.CacheMB) << 20,
		LocalPoolSize: cfg.LocalWarmPool,
	})
	if err != nil {
		_ = closeDriver(drv)
		_ = redis.Close()
		return nil, fmt.Errorf("starting the sandbox service: %w", err)
	}
	var served sandboxv1.SandboxServiceServer = sandboxes
	var fwd *peers.Server
	if cfg.PeerAddr != "" {
		fwd = peers.New(sandboxes, peers.Options{
			Self: cfg.PeerAddr, Token: cfg.Token, Redis: redis.Client, Prefix: "hangar:sandbox:",
			Logger: svcLogger, Timeout: longCallTimeout,
		})
		served = fwd
	}
	svc, err := service.New(ctx, service.Options{
		Name:   Name,
		Common: cfg.Common,
		Logger: logger,
		Register: func(s *grpc.Server) {
			sandboxv1.RegisterSandboxServiceServer(s, served)
		},
		Gateways: []service.Gateway{sandboxv1.RegisterSandboxServiceHandler},
		OpenAPI:  openapi.Document,
		// Unary calls run long here: a cold create clones the repository and runs setup.
		DefaultTimeout: longCallTimeout,
	})
	if err != nil {
		_ = sandboxes.Close(ctx)
		_ = closeDriver(drv)
		_ = redis.Close()
		return nil, err
	}
	return &App{svc: svc, sandboxes: sandboxes, driver: drv, redis: redis, peers: fwd}, nil
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
	base := context.WithoutCancel(ctx)
	peersDone := make(chan struct{})
	peersCtx, stopPeers := context.WithCancel(base)
	go func() {
		defer close(peersDone)
		if a.peers != nil {
			a.peers.Run(peersCtx)
		}
	}()
	serveCtx, stopServing := context.WithCancel(base)
	defer stopServing()
	served := make(chan error, 1)
	go func() { served <- a.svc.Serve(serveCtx, lis) }()
	var err error
	serving := true
	select {
	case <-ctx.Done():
	case err = <-served:
		serving = false
	}
	// Destroy every sandbox while still serving: the destroy hooks'
	// subscribers (session-svc) checkpoint through this replica before
	// each goes, so a rolling update keeps the work of the turns it ends.
	// It stops counting as a live replica first (no new copies land here).
	stopPeers()
	<-peersDone
	closeCtx, cancel := context.WithTimeout(base, shutdownTimeout)
	defer cancel()
	if cerr := a.sandboxes.Close(closeCtx); cerr != nil {
		a.svc.Logger().WarnContext(ctx, "sandbox shutdown failed", "error", cerr)
	}
	stopServing()
	if serving {
		err = <-served
	}
	if cerr := closeDriver(a.driver); cerr != nil {
		a.svc.Logger().WarnContext(ctx, "sandbox driver close failed", "error", cerr)
	}
	if cerr := a.redis.Close(); cerr != nil {
		a.svc.Logger().WarnContext(ctx, "redis close failed", "error", cerr)
	}
	return err
}

// cacheSize is the server's CacheSize for HANGAR_SANDBOX_CACHE (0: none).
func cacheSize(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}
