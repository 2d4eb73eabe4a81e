// Package up runs every hangar service in one process on loopback with
// embedded defaults: `hangar up`. Data lives under HANGAR_HOME; Redis is an
// in-process server unless HANGAR_REDIS_URL is set. A front door on
// HANGAR_ADDR serves the whole API (gRPC and REST) so a client needs one URL
// and one token; each service also listens on its own address.
package up

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/api/openapi"
	checkpointapp "github.com/hangar-dev/hangar/checkpoint-svc/app"
	gatewayapp "github.com/hangar-dev/hangar/gateway-svc/app"
	"github.com/hangar-dev/hangar/platform/config"
	"github.com/hangar-dev/hangar/platform/redisconn"
	"github.com/hangar-dev/hangar/platform/rpc"
	"github.com/hangar-dev/hangar/platform/service"
	replayapp "github.com/hangar-dev/hangar/replay-svc/app"
	sandboxapp "github.com/hangar-dev/hangar/sandbox-svc/app"
	sessionapp "github.com/hangar-dev/hangar/session-svc/app"
)

// Config is `hangar up`'s own configuration; each service reads its own
// settings from the same environment.
type Config struct {
	config.Common
	// Addr is the front door: the one URL clients use.
	Addr string `env:"HANGAR_ADDR" flag:"addr" default:"127.0.0.1:7400" help:"host:port of the front door (HANGAR_URL for clients); the services listen on the next five ports unless their own address is set"`
	// Port replaces Addr's port: a second hangar needs only --port.
	Port int `env:"HANGAR_PORT" flag:"port" min:"0" max:"65530" help:"the front door's port (0: HANGAR_ADDR's); the services take the next five"`
	// Verbose shows every record at the log level on the terminal, not
	// only warnings and errors (the log file has them all either way).
	Verbose bool `env:"HANGAR_VERBOSE" flag:"v" help:"show every log record on the terminal, not only warnings and errors"`

	// SessionClock drives the session service's idle clock (tests); zero
	// means real time.
	SessionClock sessionapp.Clock
}

// Endpoint is where one service listens.
type Endpoint struct {
	Name string
	Addr string
}

// Stack is a running hangar.
type Stack struct {
	// URL is the front door, for HANGAR_URL.
	URL   string
	Token string
	Home  string
	// Services lists each service's own address, in start order.
	Services []Endpoint
	// TokenGenerated says the token was made by this start (not read from
	// HANGAR_TOKEN or the data directory).
	TokenGenerated bool
	// OfflineModel is the URL of the scripted upstream the gateway uses when
	// no model credentials are set (empty when a real upstream is set).
	OfflineModel string
	// AgentCLIs are the agent CLIs turns would run, found or not.
	AgentCLIs []sessionapp.AgentCLI

	group *errgroup.Group
}

// Wait blocks until the stack has stopped (its context ended) and returns the
// first error any part stopped with.
func (s *Stack) Wait() error { return s.group.Wait() }

// serviceSpec is one service as up starts it.
type serviceSpec struct {
	name    string
	addrVar string
	// addr loads and validates the service's config from env and returns
	// the address it listens on.
	addr func(env func(string) (string, bool)) (string, error)
	// build loads the service's config from env and returns its app.
	build func(ctx context.Context, env func(string) (string, bool), logger *slog.Logger) (app, error)
	// grpcServices are the fully-qualified gRPC service names it serves.
	grpcServices []string
}

type app interface {
	Handler() http.Handler
	Run(ctx context.Context, lis net.Listener) error
}

func specs(clock sessionapp.Clock) []serviceSpec {
	return []serviceSpec{
		{
			name: sessionapp.Name, addrVar: "HANGAR_SESSION_ADDR",
			grpcServices: []string{sessionv1.SessionService_ServiceDesc.ServiceName, sessionv1.JobService_ServiceDesc.ServiceName},
			addr: func(env func(string) (string, bool)) (string, error) {
				cfg, err := sessionapp.LoadConfig(nil, nil, env)
				return cfg.Addr, err
			},
			build: func(ctx context.Context, env func(string) (string, bool), logger *slog.Logger) (app, error) {
				cfg, err := sessionapp.LoadConfig(nil, nil, env)
				if err != nil {
					return nil, err
				}
				cfg.Clock = clock
				return sessionapp.New(ctx, cfg, logger)
			},
		},
		{
			name: sandboxapp.Name, addrVar: "HANGAR_SANDBOX_ADDR",
			grpcServices: []string{sandboxv1.SandboxService_ServiceDesc.ServiceName},
			addr: func(env func(string) (string, bool)) (string, error) {
				cfg, err := sandboxapp.LoadConfig(nil, nil, env)
				return cfg.Addr, err
			},
			build: func(ctx context.Context, env func(string) (string, bool), logger *slog.Logger) (app, error) {
				cfg, err := sandboxapp.LoadConfig(nil, nil, env)
				if err != nil {
					return nil, err
				}
				return sandboxapp.New(ctx, cfg, logger)
			},
		},
		{
			name: checkpointapp.Name, addrVar: "HANGAR_CHECKPOINT_ADDR",
			grpcServices: []string{checkpointv1.CheckpointService_ServiceDesc.ServiceName},
			addr: func(env func(string) (string, bool)) (string, error) {
				cfg, err := checkpointapp.LoadConfig(nil, nil, env)
				return cfg.Addr, err
			},
			build: func(ctx context.Context, env func(string) (string, bool), logger *slog.Logger) (app, error) {
				cfg, err := checkpointapp.LoadConfig(nil, nil, env)
				if err != nil {
					return nil, err
				}
				return checkpointapp.New(ctx, cfg, logger)
			},
		},
		{
			name: gatewayapp.Name, addrVar: "HANGAR_GATEWAY_ADDR",
			grpcServices: []string{gatewayv1.GatewayService_ServiceDesc.ServiceName},
			addr: func(env func(string) (string, bool)) (string, error) {
				cfg, err := gatewayapp.LoadConfig(nil, nil, env)
				return cfg.Addr, err
			},
			build: func(ctx context.Context, env func(string) (string, bool), logger *slog.Logger) (app, error) {
				cfg, err := gatewayapp.LoadConfig(nil, nil, env)
				if err != nil {
					return nil, err
				}
				return gatewayapp.New(ctx, cfg, logger)
			},
		},
		{
			name: replayapp.Name, addrVar: "HANGAR_REPLAY_ADDR",
			grpcServices: []string{replayv1.ReplayService_ServiceDesc.ServiceName},
			addr: func(env func(string) (string, bool)) (string, error) {
				cfg, err := replayapp.LoadConfig(nil, nil, env)
				return cfg.Addr, err
			},
			build: func(ctx context.Context, env func(string) (string, bool), logger *slog.Logger) (app, error) {
				cfg, err := replayapp.LoadConfig(nil, nil, env)
				if err != nil {
					return nil, err
				}
				return replayapp.New(ctx, cfg, logger)
			},
		},
	}
}

// Start prepares the data directory, the token and the vault key, starts
// every service and the front door, and returns once all listen. They stop
// when ctx ends; Wait reports how.
func Start(ctx context.Context, cfg Config, lookupEnv func(string) (string, bool), logger *slog.Logger) (*Stack, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	if err := prepareHome(cfg.Home); err != nil {
		return nil, err
	}
	token, generated, err := loadOrCreateToken(cfg.Home, cfg.Token)
	if err != nil {
		return nil, err
	}
	if _, err := loadOrCreateVaultKey(filepath.Join(cfg.Home, "vault.key")); err != nil {
		return nil, err
	}

	// Everything that must be released if start fails half way.
	var cleanup []func()
	fail := func(err error) (*Stack, error) {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
		return nil, err
	}

	overlay := map[string]string{
		"HANGAR_HOME":           cfg.Home,
		"HANGAR_TOKEN":          token,
		"HANGAR_VAULT_KEY_FILE": filepath.Join(cfg.Home, "vault.key"),
	}
	var redis *redisconn.Conn
	if cfg.RedisURL == "" {
		redis, err = redisconn.Open(ctx, "", logger)
		if err != nil {
			return fail(fmt.Errorf("starting the embedded redis: %w", err))
		}
		cleanup = append(cleanup, func() { _ = redis.Close() })
		overlay["HANGAR_REDIS_URL"] = "redis://" + redis.Addr()
	}
	var model *offlineModel
	if needsOfflineModel(lookupEnv) {
		if model, err = listenOfflineModel(lookupEnv, logger); err != nil {
			return fail(err)
		}
		cleanup = append(cleanup, model.close)
		overlay["HANGAR_ANTHROPIC_URL"] = model.URL
		overlay["HANGAR_OPENAI_URL"] = model.URL + "/v1"
		overlay["HANGAR_MODEL_FREE"] = "true"
	}
	env := func(name string) (string, bool) {
		if v, ok := overlay[name]; ok {
			return v, true
		}
		return lookupEnv(name)
	}

	// One base port: the services listen on the five ports after the front
	// door's, unless their own address is set.
	frontAddr, err := frontDoorAddr(cfg.Addr, cfg.Port)
	if err != nil {
		return fail(err)
	}
	all := specs(cfg.SessionClock)
	for i, spec := range all {
		if v, ok := lookupEnv(spec.addrVar); !ok || v == "" {
			if addr := serviceAddr(frontAddr, i+1); addr != "" {
				overlay[spec.addrVar] = addr
			}
		}
	}

	// Every service's settings are checked before anything listens.
	addrs := make([]string, len(all))
	for i, spec := range all {
		if addrs[i], err = spec.addr(env); err != nil {
			return fail(fmt.Errorf("%s: %w", spec.name, err))
		}
	}

	front, err := service.Listen(frontAddr, "HANGAR_ADDR")
	if err != nil {
		return fail(err)
	}
	cleanup = append(cleanup, func() { _ = front.Close() })

	// Listen on every service's address first, so each knows where the
	// others are (an address of port 0 gets a free port).
	listeners := make([]net.Listener, len(all))
	for i, spec := range all {
		lis, err := service.Listen(addrs[i], spec.addrVar)
		if err != nil {
			return fail(err)
		}
		cleanup = append(cleanup, func() { _ = lis.Close() })
		listeners[i] = lis
		overlay[spec.addrVar] = lis.Addr().String()
	}

	stack := &Stack{URL: "http://" + front.Addr().String(), Token: token, Home: cfg.Home, TokenGenerated: generated}
	if model != nil {
		stack.OfflineModel = model.URL
	}
	group, gctx := errgroup.WithContext(ctx)
	apps := make([]app, len(all))
	routes := map[string]http.Handler{}
	for i, spec := range all {
		a, err := spec.build(ctx, env, logger)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", spec.name, err))
		}
		apps[i] = a
		for _, name := range spec.grpcServices {
			routes["/"+name+"/"] = a.Handler()
		}
		stack.Services = append(stack.Services, Endpoint{Name: spec.name, Addr: listeners[i].Addr().String()})
	}

	frontDoor, err := service.New(ctx, service.Options{
		Name:   "hangar",
		Common: config.Common{Token: token, LogLevel: cfg.LogLevel, LogFormat: cfg.LogFormat, OTLPEndpoint: cfg.OTLPEndpoint},
		Logger: logger,
		Routes: routes,
		Gateways: []service.Gateway{
			sessionv1.RegisterSessionServiceHandler,
			sessionv1.RegisterJobServiceHandler,
			sandboxv1.RegisterSandboxServiceHandler,
			checkpointv1.RegisterCheckpointServiceHandler,
			gatewayv1.RegisterGatewayServiceHandler,
			replayv1.RegisterReplayServiceHandler,
		},
		OpenAPI: openapi.Document,
	})
	if err != nil {
		return fail(err)
	}
	if sessionCfg, err := sessionapp.LoadConfig(nil, nil, env); err == nil {
		stack.AgentCLIs = sessionapp.FindAgentCLIs(ctx, sessionCfg)
	}
	if err := os.WriteFile(filepath.Join(cfg.Home, "endpoint"), []byte(stack.URL+"\n"), 0o600); err != nil {
		return fail(fmt.Errorf("HANGAR_HOME=%s: cannot write the endpoint file: %w", cfg.Home, err))
	}

	// From here on, the errgroup owns the listeners and the redis.
	for i := range all {
		a, lis := apps[i], listeners[i]
		group.Go(func() error { return a.Run(gctx, lis) })
	}
	group.Go(func() error { return frontDoor.Serve(gctx, front) })
	for i, spec := range all {
		addr := listeners[i].Addr().String()
		group.Go(func() error {
			mirrorHealth(gctx, addr, token, spec.grpcServices, frontDoor.Health(), logger)
			return nil
		})
	}
	if model != nil {
		group.Go(func() error { return model.serve(gctx) })
	}
	if redis != nil {
		group.Go(func() error {
			<-gctx.Done()
			return redis.Close()
		})
	}
	stack.group = group
	return stack, nil
}

// frontDoorAddr is HANGAR_ADDR with its port replaced by port when set.
func frontDoorAddr(addr string, port int) (string, error) {
	if port == 0 {
		return addr, nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("HANGAR_ADDR=%q: want host:port", addr)
	}
	return net.JoinHostPort(host, fmt.Sprint(port)), nil
}

// serviceAddr is the address of the offset-th service after the front door
// at front: same host, port + offset (any free port when front's is 0); ""
// when front's port is not a number.
func serviceAddr(front string, offset int) string {
	host, port, err := net.SplitHostPort(front)
	if err != nil {
		return ""
	}
	n, err := strconv.Atoi(port)
	if err != nil || n+offset > 65535 {
		return ""
	}
	if n == 0 {
		return net.JoinHostPort(host, "0")
	}
	return net.JoinHostPort(host, strconv.Itoa(n+offset))
}

// mirrorHealth copies a service's health onto the front door's health server
// under the service's own names, so `hangar status` sees each service through
// the one URL.
func mirrorHealth(ctx context.Context, addr, token string, names []string, into *health.Server, logger *slog.Logger) {
	set := func(status healthpb.HealthCheckResponse_ServingStatus) {
		for _, name := range names {
			into.SetServingStatus(name, status)
		}
	}
	set(healthpb.HealthCheckResponse_NOT_SERVING)
	conn, err := rpc.Dial(addr, rpc.ClientOptions{Token: token})
	if err != nil {
		logger.ErrorContext(ctx, "health mirror cannot dial", "addr", addr, "error", err)
		return
	}
	defer conn.Close()
	for ctx.Err() == nil {
		watchHealth(ctx, conn, set)
		set(healthpb.HealthCheckResponse_NOT_SERVING)
		// The watch ended (the service restarts or stops): look again soon,
		// without spinning.
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func watchHealth(ctx context.Context, conn *grpc.ClientConn, set func(healthpb.HealthCheckResponse_ServingStatus)) {
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return
		}
		set(resp.GetStatus())
	}
}

// prepareHome makes the data directory (mode 0700) and checks it is usable.
func prepareHome(home string) error {
	if err := os.MkdirAll(home, 0o700); err != nil {
		return fmt.Errorf("HANGAR_HOME=%s: cannot create the data directory: %w", home, unwrapPath(err))
	}
	probe, err := os.CreateTemp(home, ".probe-*")
	if err != nil {
		return fmt.Errorf("HANGAR_HOME=%s: the data directory is not writable: %w", home, unwrapPath(err))
	}
	name := probe.Name()
	_ = probe.Close()
	return os.Remove(name)
}

// loadOrCreateToken returns the API token: the given one, the one in the data
// directory, or a new one saved there with mode 0600.
func loadOrCreateToken(home, given string) (string, bool, error) {
	if given != "" {
		return given, false, nil
	}
	path := filepath.Join(home, "token")
	b, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(b)) != "" {
		return strings.TrimSpace(string(b)), false, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", false, fmt.Errorf("HANGAR_HOME=%s: cannot read the token file: %w", home, unwrapPath(err))
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", false, fmt.Errorf("generating the API token: %w", err)
	}
	token := hex.EncodeToString(raw)
	if err := writeSecret(path, []byte(token+"\n")); err != nil {
		return "", false, fmt.Errorf("HANGAR_HOME=%s: cannot save the token: %w", home, err)
	}
	return token, true, nil
}

// loadOrCreateVaultKey makes the vault key on first start: 32 random bytes,
// base64, mode 0600. An existing key readable by others is refused.
func loadOrCreateVaultKey(path string) ([]byte, error) {
	info, err := os.Stat(path)
	switch {
	case err == nil:
		if info.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("vault key %s has mode %04o: run chmod 600 %s", path, info.Mode().Perm(), path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("cannot read the vault key: %w", unwrapPath(err))
		}
		key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
		if err != nil || len(key) != 32 {
			return nil, fmt.Errorf("vault key %s is not 32 bytes of base64: restore it from your backup", path)
		}
		return key, nil
	case errors.Is(err, fs.ErrNotExist):
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("generating the vault key: %w", err)
		}
		if err := writeSecret(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n")); err != nil {
			return nil, fmt.Errorf("cannot save the vault key: %w", err)
		}
		return key, nil
	default:
		return nil, fmt.Errorf("cannot read the vault key: %w", unwrapPath(err))
	}
}

// writeSecret creates path with mode 0600, failing if it exists.
func writeSecret(path string, content []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return unwrapPath(err)
	}
	if _, err := f.Write(content); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// unwrapPath drops the *fs.PathError wrapper whose path the message already
// names.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
