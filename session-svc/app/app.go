// Package app wires session-svc: its configuration, its records (SQLite or
// PostgreSQL), holds (Redis), the clients of the sandbox, checkpoint and
// gateway services, the session lifecycle, its gRPC and REST API and the
// dashboard (web/) at /.
// cmd/session-svc runs it alone; `hangar up` runs it in one process with the
// other services.
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
	"time"

	"google.golang.org/grpc"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/api/openapi"
	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/platform/blob"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/platform/redisconn"
	"github.com/hangar-dev/hangar/platform/rpc"
	"github.com/hangar-dev/hangar/platform/service"
	"github.com/hangar-dev/hangar/session-svc/internal/harness"
	"github.com/hangar-dev/hangar/session-svc/internal/harnesslock"
	"github.com/hangar-dev/hangar/session-svc/internal/holds"
	"github.com/hangar-dev/hangar/session-svc/internal/server"
	"github.com/hangar-dev/hangar/session-svc/internal/sessions"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
	"github.com/hangar-dev/hangar/web"
)

// Name is the service's name in logs, traces and metrics.
const Name = "session-svc"

// callTimeout bounds calls to the other services that come without a
// deadline: a cold sandbox or a checkpoint of a large tree takes minutes.
const callTimeout = 15 * time.Minute

// App is a configured session-svc, ready to serve.
type App struct {
	svc     *service.Service
	manager *sessions.Manager
	tick    <-chan time.Time
	own     *ownConn // the dashboard's client of this service
	closers []func() error
}

// New builds the service from cfg. logger may be nil.
func New(ctx context.Context, cfg Config, logger *slog.Logger) (_ *App, err error) {
	if logger == nil {
		logger = logging.New(os.Stderr, cfg.LogLevel, cfg.LogFormat)
	}
	a := &App{tick: cfg.Clock.Tick}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	records, err := store.Open(ctx, store.Options{DatabaseURL: cfg.DatabaseURL, SQLitePath: filepath.Join(cfg.Home, "sessions.db")})
	if err != nil {
		if cfg.DatabaseURL != "" {
			return nil, fmt.Errorf("HANGAR_DATABASE_URL: cannot open the session database: %w", err)
		}
		return nil, fmt.Errorf("HANGAR_HOME=%s: cannot open the session database: %w", cfg.Home, err)
	}
	a.closers = append(a.closers, records.Close)
	redis, err := redisconn.Open(ctx, cfg.RedisURL, logger)
	if err != nil {
		return nil, err
	}
	a.closers = append(a.closers, redis.Close)
	// Replicas on one Redis must share the token and the session
	// database: one that disagrees refuses to start, naming the setting.
	database := cfg.DatabaseURL
	if database == "" {
		database = "sqlite:" + filepath.Join(cfg.Home, "sessions.db")
	}
	if err := redis.Agree(ctx, []redisconn.Setting{{Name: "HANGAR_TOKEN", Value: cfg.Token}, {Name: "HANGAR_DATABASE_URL", Value: database}}); err != nil {
		return nil, err
	}
	artifacts, err := blob.NewDir(filepath.Join(cfg.Home, "artifacts"))
	if err != nil {
		return nil, fmt.Errorf("HANGAR_HOME=%s: cannot use the artifact directory: %w", cfg.Home, err)
	}
	dial := func(addr, variable string, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
		conn, err := rpc.Dial(addr, rpc.ClientOptions{Token: cfg.Token, DefaultTimeout: callTimeout}, extra...)
		if err != nil {
			return nil, fmt.Errorf("%s=%s: %w", variable, addr, err)
		}
		a.closers = append(a.closers, conn.Close)
		return conn, nil
	}
	// Turns, checks and the files they place are this service's own work,
	// not a use that keeps a session open (sandboxexec.ServiceCallKey).
	sandboxConn, err := dial(cfg.SandboxAddr, "HANGAR_SANDBOX_ADDR", sandboxexec.ServiceCallDialOptions()...)
	if err != nil {
		return nil, err
	}
	checkpointConn, err := dial(cfg.CheckpointAddr, "HANGAR_CHECKPOINT_ADDR")
	if err != nil {
		return nil, err
	}
	gatewayConn, err := dial(cfg.GatewayAddr, "HANGAR_GATEWAY_ADDR")
	if err != nil {
		return nil, err
	}
	// The dashboard (web/), as hangar up's front door serves it: the page
	// at /, the rest below /ui/, the same sign-in and cookie. Its
	// terminals reach sandbox-svc as a person's call (not this service's
	// own work) and this service through its own listener.
	terminalConn, err := dial(cfg.SandboxAddr, "HANGAR_SANDBOX_ADDR")
	if err != nil {
		return nil, err
	}
	a.own = newOwnConn(cfg.Token)
	a.closers = append(a.closers, a.own.Close)
	dashboard, err := web.New(web.Options{Token: cfg.Token, Conn: a.own, SandboxConn: terminalConn, Logger: logger.With("service", Name)})
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	now := cfg.Clock.Now
	if now == nil {
		now = time.Now
	}
	holdStore := holds.New(redis.Client, "hangar:session:holds:", now)
	var replicas *sessions.Replicas
	if !cfg.SoleReplica {
		replicas = sessions.NewReplicas(redis.Client, "hangar:session:")
	}
	a.manager = sessions.New(sessions.Deps{
		Store:       records,
		Holds:       holdStore,
		Sandboxes:   sandboxv1.NewSandboxServiceClient(sandboxConn),
		Checkpoints: checkpointv1.NewCheckpointServiceClient(checkpointConn),
		Gateway:     gatewayv1.NewGatewayServiceClient(gatewayConn),
		Artifacts:   artifacts,
		Logger:      logger.With("service", Name),
		Now:         now,
		Config: sessions.Config{
			IdleMinutes:       cfg.IdleMinutes,
			CheckpointMinutes: cfg.CheckpointMinutes,
			ReapInterval:      time.Duration(cfg.SweepSeconds) * time.Second,
			TurnTimeout:       time.Duration(cfg.TurnTimeoutMinutes) * time.Minute,
			Cache:             cfg.Cache,
			Harnesses: harness.Options{
				ClaudeBin: cfg.ClaudeBin, CodexBin: cfg.CodexBin, PiBin: cfg.PiBin, PiNodeBinDir: cfg.PiNodeBinDir,
			},
			ForkMax:      cfg.ForkMax,
			SoleReplica:  cfg.SoleReplica,
			HarnessDrift: cfg.HarnessDrift,
		},
		Claims:   sessions.NewClaims(redis.Client, "hangar:session:claims:"),
		Locks:    harnesslock.NewRepo(cfg.HarnessRepo, filepath.Join(cfg.Home, "harness-locks")),
		CLIs:     hostCLIs{cfg: cfg},
		Replicas: replicas,
	})
	jobs := sessions.NewJobs(a.manager, sessions.NewJobClaims(redis.Client, "hangar:session:jobs:"))
	sessionsServer := server.New(a.manager, records, holdStore)
	a.svc, err = service.New(ctx, service.Options{
		Name:   Name,
		Common: cfg.Common,
		Logger: logger,
		Register: func(s *grpc.Server) {
			sessionv1.RegisterSessionServiceServer(s, sessionsServer)
			sessionv1.RegisterJobServiceServer(s, server.NewJobs(jobs))
		},
		Gateways: []service.Gateway{
			sessionv1.RegisterSessionServiceHandler,
			sessionv1.RegisterJobServiceHandler,
		},
		OpenAPI: openapi.Document,
		Routes:  map[string]http.Handler{web.Prefix: dashboard},
		Index:   dashboard.Index(),
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

// drainTimeout bounds a graceful stop's drain: ending running turns and
// checkpointing and suspending every session up in this process.
const drainTimeout = 3 * time.Minute

// Run serves on lis and runs the idle clock, periodic checkpoints and
// destroy hooks until ctx ends. Then, in order: new work is refused,
// running turns end (interrupted, checkpointed), every session up in this
// process is checkpointed and suspended, and only then does the server stop
// and are resources released. The other services must still serve while
// Run drains (hangar up stops them after it).
func (a *App) Run(ctx context.Context, lis net.Listener) error {
	base := context.WithoutCancel(ctx)
	serveCtx, stopServing := context.WithCancel(base)
	defer stopServing()
	a.own.dial(lis.Addr())
	served := make(chan error, 1)
	go func() { served <- a.svc.Serve(serveCtx, lis) }()
	bgCtx, stopBackground := context.WithCancel(base)
	defer stopBackground()
	background := make(chan error, 1)
	go func() { background <- a.manager.Run(bgCtx, a.tick) }()

	var err error
	serving, running := true, true
	select {
	case <-ctx.Done():
	case err = <-served:
		serving = false
	case err = <-background:
		running = false
	}
	log := a.svc.Logger()
	log.InfoContext(base, "draining: ending turns, suspending sessions")
	drainCtx, cancel := context.WithTimeout(base, drainTimeout)
	defer cancel()
	if derr := a.manager.Drain(drainCtx); derr != nil {
		log.ErrorContext(base, "drain incomplete", "error", derr)
	}
	stopBackground()
	if running {
		if berr := <-background; err == nil {
			err = berr
		}
	}
	if cerr := a.manager.Close(drainCtx); cerr != nil {
		log.WarnContext(base, "background work did not end in time", "error", cerr)
	}
	stopServing()
	if serving {
		if serr := <-served; err == nil {
			err = serr
		}
	}
	if cerr := a.close(); cerr != nil {
		log.WarnContext(base, "session-svc resources not released", "error", cerr)
	}
	return err
}
