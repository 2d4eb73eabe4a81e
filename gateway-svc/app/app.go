// Package app wires gateway-svc: its configuration, the control API (gRPC and
// REST) and the model data plane on the same port. cmd/gateway-svc runs it
// alone; `hangar up` runs it in one process with the other services.
package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/openapi"
	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/gateway-svc/internal/dataplane"
	"github.com/hangar-dev/hangar/gateway-svc/internal/server"
	"github.com/hangar-dev/hangar/gateway-svc/internal/trees"
	"github.com/hangar-dev/hangar/platform/blob"
	"github.com/hangar-dev/hangar/platform/gcsstore"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/platform/redisconn"
	"github.com/hangar-dev/hangar/platform/rpc"
	"github.com/hangar-dev/hangar/platform/service"
)

// Name is the service's name in logs, traces and metrics.
const Name = "gateway-svc"

// App is a configured gateway-svc, ready to serve.
type App struct {
	svc     *service.Service
	gateway *server.Server
	redis   *redisconn.Conn
	// closeSandbox closes the connection to sandbox-svc.
	closeSandbox func()
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
	agree := []redisconn.Setting{{Name: "HANGAR_TOKEN", Value: cfg.Token}}
	if cfg.Store != "" {
		// The same value checkpoint-svc agrees on: one store for all.
		agree = append(agree, redisconn.Setting{Name: "HANGAR_SESSION_STORE", Value: cfg.Store})
	}
	if err := redis.Agree(ctx, agree); err != nil {
		_ = redis.Close()
		return nil, err
	}
	tapes, closeStore, err := openStore(ctx, cfg)
	if err != nil {
		_ = redis.Close()
		return nil, err
	}
	publicURL := cfg.PublicURL
	if publicURL == "" {
		publicURL = "http://" + cfg.Addr
	}
	var hasher dataplane.TreeHasher
	var sandboxConn *grpc.ClientConn
	if cfg.SandboxAddr != "" {
		// Hashing a work tree is the gateway's own work, not a use that
		// keeps a session open.
		sandboxConn, err = rpc.Dial(cfg.SandboxAddr, rpc.ClientOptions{Token: cfg.Token}, sandboxexec.ServiceCallDialOptions()...)
		if err != nil {
			_ = closeStore()
			_ = redis.Close()
			return nil, fmt.Errorf("HANGAR_SANDBOX_ADDR=%s: %w", cfg.SandboxAddr, err)
		}
		hasher = trees.New(sandboxv1.NewSandboxServiceClient(sandboxConn))
	}
	closeSandbox := func() {
		if sandboxConn != nil {
			_ = sandboxConn.Close()
		}
		_ = closeStore()
	}
	gw, err := server.New(ctx, server.Deps{
		Redis:     redis.Client,
		Tapes:     tapes,
		Logger:    logger.With("service", Name),
		Now:       time.Now,
		KeyPrefix: "hangar:gateway:",
		Upstreams: server.Upstreams{
			AnthropicURL: cfg.AnthropicURL,
			AnthropicKey: cfg.AnthropicAPIKey,
			OpenAIURL:    cfg.OpenAIURL,
			OpenAIKey:    cfg.OpenAIAPIKey,
		},
		PublicURL:      publicURL,
		Prices:         prices(cfg.FreeModel),
		TapeDays:       cfg.TapeDays,
		CacheTTL:       cfg.Cache,
		StaggerSeconds: cfg.CacheStaggerSeconds,
		Trees:          hasher,
	})
	if err != nil {
		closeSandbox()
		_ = redis.Close()
		return nil, fmt.Errorf("starting the gateway: %w", err)
	}
	dataPlane := gw.DataPlane()
	svc, err := service.New(ctx, service.Options{
		Name:   Name,
		Common: cfg.Common,
		Logger: logger,
		Register: func(s *grpc.Server) {
			gatewayv1.RegisterGatewayServiceServer(s, gw)
		},
		Gateways: []service.Gateway{gatewayv1.RegisterGatewayServiceHandler},
		OpenAPI:  openapi.Document,
		// The data plane authenticates run tokens itself: harnesses never
		// hold the API token.
		Routes: map[string]http.Handler{"/v1/": dataPlane, "/runs/": dataPlane},
	})
	if err != nil {
		_ = gw.Close(ctx)
		closeSandbox()
		_ = redis.Close()
		return nil, err
	}
	return &App{svc: svc, gateway: gw, redis: redis, closeSandbox: closeSandbox}, nil
}

// openStore opens the store of tapes and run records: HANGAR_SESSION_STORE
// (a directory or gs://bucket[/prefix], shared by every replica), or the
// data directory's tapes/ when it is unset.
func openStore(ctx context.Context, cfg Config) (blob.Store, func() error, error) {
	if strings.HasPrefix(cfg.Store, "gs://") {
		store, closeStore, err := gcsstore.Open(ctx, cfg.Store)
		if err != nil {
			return nil, nil, fmt.Errorf("HANGAR_SESSION_STORE=%s: %w", cfg.Store, err)
		}
		return store, closeStore, nil
	}
	dir, name := cfg.Store, "HANGAR_SESSION_STORE"
	if dir == "" {
		dir, name = filepath.Join(cfg.Home, "tapes"), "HANGAR_HOME"
	}
	store, err := blob.NewDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: cannot use the tape directory %s: %w", name, dir, err)
	}
	return store, func() error { return nil }, nil
}

// Handler serves gRPC, REST and the data plane in-process (for a front door).
func (a *App) Handler() http.Handler { return a.svc.Handler() }

// Run serves on lis until ctx ends, then releases the gateway's resources.
func (a *App) Run(ctx context.Context, lis net.Listener) error {
	err := a.svc.Serve(ctx, lis)
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if cerr := a.gateway.Close(closeCtx); cerr != nil {
		a.svc.Logger().WarnContext(ctx, "gateway close failed", "error", cerr)
	}
	a.closeSandbox()
	if cerr := a.redis.Close(); cerr != nil {
		a.svc.Logger().WarnContext(ctx, "redis close failed", "error", cerr)
	}
	return err
}

// prices is the price table's overrides: none, or with free every family at
// $0.00 (an offline scripted upstream costs nothing).
func prices(free bool) map[string]server.Price {
	if !free {
		return nil
	}
	out := map[string]server.Price{}
	for family := range server.DefaultPrices() {
		out[family] = server.Price{}
	}
	return out
}
