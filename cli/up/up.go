// Package up runs every hangar service in one process on loopback with
// embedded defaults: `hangar up`. Data lives under HANGAR_HOME; Redis is an
// in-process server, with the password in HANGAR_HOME/redis.password, unless
// HANGAR_REDIS_URL is set. A front door on
// HANGAR_ADDR serves the whole API (gRPC and REST, and the MCP tools at
// /mcp) so a client needs one URL and one token; each service also listens
// on its own address.
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

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
	"github.com/hangar-dev/hangar/cli/client"
	"github.com/hangar-dev/hangar/cli/mcp"
	gatewayapp "github.com/hangar-dev/hangar/gateway-svc/app"
	"github.com/hangar-dev/hangar/platform/config"
	"github.com/hangar-dev/hangar/platform/redisconn"
	"github.com/hangar-dev/hangar/platform/rpc"
	"github.com/hangar-dev/hangar/platform/service"
	replayapp "github.com/hangar-dev/hangar/replay-svc/app"
	sandboxapp "github.com/hangar-dev/hangar/sandbox-svc/app"
	sessionapp "github.com/hangar-dev/hangar/session-svc/app"
	"github.com/hangar-dev/hangar/web"
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
	// URL is the front door, for HANGAR_URL; the dashboard is its page.
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
	// EmbeddedRedis is the embedded Redis's address (empty when
	// HANGAR_REDIS_URL is set). It requires the password in
	// HANGAR_HOME/redis.password.
	EmbeddedRedis string
	// SandboxIsolation is how sandboxes are isolated: "bwrap", "none" (the
	// operator opted out: HANGAR_SANDBOX_ISOLATION=none) or "unavailable"
	// (bubblewrap cannot run here: sandboxes do not start).
	SandboxIsolation string
	// AgentCLIs are the agent CLIs turns would run, found or not.
	AgentCLIs []sessionapp.AgentCLI

	done chan struct{}
	err  error
}

// Wait blocks until the stack has stopped (its context ended, then every
// part stopped in order) and returns the errors parts stopped with.
func (s *Stack) Wait() error {
	<-s.done
	return s.err
}

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

func specs(clock sessionapp.Clock, soleReplica bool) []serviceSpec {
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
				cfg.SoleReplica = soleReplica
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

	// The services read their settings from the environment; what up's own
	// flags set (or up made) goes to them through this overlay.
	overlay := map[string]string{
		"HANGAR_HOME":           cfg.Home,
		"HANGAR_TOKEN":          token,
		"HANGAR_VAULT_KEY_FILE": filepath.Join(cfg.Home, "vault.key"),
	}
	if cfg.MaxRequestMB > 0 {
		overlay["HANGAR_MAX_REQUEST_MB"] = strconv.Itoa(cfg.MaxRequestMB)
	}
	var redis *redisconn.Conn
	if cfg.RedisURL == "" {
		password, err := loadOrCreateSecret(filepath.Join(cfg.Home, "redis.password"), "the embedded redis password")
		if err != nil {
			return fail(err)
		}
		redis, err = redisconn.OpenEmbedded(ctx, password, logger)
		if err != nil {
			return fail(fmt.Errorf("starting the embedded redis: %w", err))
		}
		cleanup = append(cleanup, func() { _ = redis.Close() })
		// The password travels in memory only: the overlay is not the
		// process environment, so nothing started later inherits it.
		overlay["HANGAR_REDIS_URL"] = redis.URL()
	} else {
		overlay["HANGAR_REDIS_URL"] = cfg.RedisURL
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
	all := specs(cfg.SessionClock, redis != nil)
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
	if redis != nil {
		stack.EmbeddedRedis = redis.Addr()
	}
	apps := make([]app, 0, len(all))
	routes := map[string]http.Handler{}
	for i, spec := range all {
		a, err := spec.build(ctx, env, logger)
		if err != nil {
			closeUnstarted(apps, listeners)
			return fail(fmt.Errorf("%s: %w", spec.name, err))
		}
		apps = append(apps, a)
		if iso, ok := a.(interface{ Isolation() string }); ok {
			stack.SandboxIsolation = iso.Isolation()
		}
		for _, name := range spec.grpcServices {
			routes["/"+name+"/"] = a.Handler()
		}
		stack.Services = append(stack.Services, Endpoint{Name: spec.name, Addr: listeners[i].Addr().String()})
	}

	// The MCP façade at /mcp: a client of the front door like any other,
	// behind the same token.
	mcpConn, err := client.Endpoint{URL: stack.URL, Token: token}.Dial()
	if err != nil {
		closeUnstarted(apps, listeners)
		return fail(err)
	}
	cleanup = append(cleanup, func() { _ = mcpConn.Close() })
	routes[mcpPath] = exactPath(mcpPath, mcp.HTTPHandler(mcp.Options{
		Sessions: sessionv1.NewSessionServiceClient(mcpConn),
		Replay:   replayv1.NewReplayServiceClient(mcpConn),
		Logger:   logger.With("service", "mcp"),
	}, mcp.HTTPOptions{Token: token, MaxRequestBytes: cfg.MaxRequestBytes()}))
	// The dashboard: its page at /, the rest below /ui/; its terminals
	// reach the services through the front door itself.
	uiConn, err := rpc.Dial(front.Addr().String(), rpc.ClientOptions{Token: token})
	if err != nil {
		closeUnstarted(apps, listeners)
		return fail(fmt.Errorf("dashboard: %w", err))
	}
	cleanup = append(cleanup, func() { _ = uiConn.Close() })
	dashboard, err := web.New(web.Options{Token: token, Conn: uiConn, Logger: logger})
	if err != nil {
		closeUnstarted(apps, listeners)
		return fail(fmt.Errorf("dashboard: %w", err))
	}
	routes[web.Prefix] = dashboard

	frontDoor, err := service.New(ctx, service.Options{
		Name:   "hangar",
		Common: config.Common{Token: token, LogLevel: cfg.LogLevel, LogFormat: cfg.LogFormat, OTLPEndpoint: cfg.OTLPEndpoint, MaxRequestMB: cfg.MaxRequestMB},
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
		Index:   dashboard.Index(),
	})
	if err != nil {
		closeUnstarted(apps, listeners)
		return fail(err)
	}
	if sessionCfg, err := sessionapp.LoadConfig(nil, nil, env); err == nil {
		stack.AgentCLIs = sessionapp.FindAgentCLIs(ctx, sessionCfg)
	}
	if err := os.WriteFile(filepath.Join(cfg.Home, "endpoint"), []byte(stack.URL+"\n"), 0o600); err != nil {
		closeUnstarted(apps, listeners)
		return fail(fmt.Errorf("HANGAR_HOME=%s: cannot write the endpoint file: %w", cfg.Home, err))
	}

	// From here on, the parts own the listeners and the redis. Each runs on
	// a context of its own so that the stop is ordered (see stopOrder).
	byName := map[string]int{}
	for i, spec := range all {
		byName[spec.name] = i
	}
	var parts []*part
	for i, spec := range all {
		a, lis := apps[i], listeners[i]
		parts = append(parts, startPart(spec.name, stageOf[spec.name], func(ctx context.Context) error { return a.Run(ctx, lis) }))
	}
	parts = append(parts, startPart("front door", stageFront, func(ctx context.Context) error {
		var mirrors sync.WaitGroup
		for i, spec := range all {
			addr := listeners[i].Addr().String()
			mirrors.Go(func() { mirrorHealth(ctx, addr, token, spec.grpcServices, frontDoor.Health(), logger) })
		}
		err := frontDoor.Serve(ctx, front)
		mirrors.Wait()
		_ = mcpConn.Close()
		_ = uiConn.Close()
		return err
	}))
	if model != nil {
		parts = append(parts, startPart("offline model", stageBackends, model.serve))
	}
	if redis != nil {
		parts = append(parts, startPart("embedded redis", stageStore, func(ctx context.Context) error {
			<-ctx.Done()
			return redis.Close()
		}))
	}
	stack.done = make(chan struct{})
	go func() {
		defer close(stack.done)
		stack.err = stopInOrder(ctx, parts, logger)
	}()
	return stack, nil
}

// mcpPath is where the front door serves the MCP façade (streamable HTTP).
const mcpPath = "/mcp"

// exactPath serves h at path alone (the front door's routes are prefixes).
func exactPath(path string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// StopStepMessage is the log message of each step of the ordered stop
// (attributes step and took): `hangar up` shows these on the terminal.
const StopStepMessage = "stopped"

// Stop stages: a stage starts stopping once every part of the stages
// before it has stopped.
const (
	// session-svc drains first: it refuses new work, ends running turns
	// (interrupted, checkpointed) and checkpoints and suspends every session
	// that is up, which needs every other service still serving.
	stageSessions = iota
	// Then the front door (its clients saw their turns end) and replay-svc.
	stageFront
	// Then sandbox-svc destroys what is left (nothing, if the drain went
	// well) and releases its directory.
	stageSandboxes
	// Then what the sandboxes and the drain used.
	stageBackends
	// Redis last: every part above keeps leases, holds or runs in it.
	stageStore
)

var stageOf = map[string]int{
	sessionapp.Name:    stageSessions,
	replayapp.Name:     stageFront,
	sandboxapp.Name:    stageSandboxes,
	checkpointapp.Name: stageBackends,
	gatewayapp.Name:    stageBackends,
}

var stageNames = map[int]string{
	stageSessions:  "sessions: ending turns, checkpointing and suspending every session that is up",
	stageFront:     "front door and replay",
	stageSandboxes: "sandboxes",
	stageBackends:  "checkpoints, gateway and model",
	stageStore:     "redis",
}

// part is one piece of the running stack.
type part struct {
	name  string
	stage int
	stop  context.CancelFunc
	done  chan struct{}
	err   error
}

// startPart runs run on a context of its own, cancelled only by stop.
func startPart(name string, stage int, run func(ctx context.Context) error) *part {
	ctx, stop := context.WithCancel(context.Background())
	p := &part{name: name, stage: stage, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.err = run(ctx)
	}()
	return p
}

// stopInOrder waits until ctx ends or a part stops by itself (a failure),
// then stops the parts stage by stage, logging each step, and returns the
// first error a part stopped with.
func stopInOrder(ctx context.Context, parts []*part, logger *slog.Logger) error {
	early := make(chan *part, len(parts))
	for _, p := range parts {
		go func() {
			<-p.done
			early <- p
		}()
	}
	select {
	case <-ctx.Done():
		logger.Info("stopping hangar: checkpointing and suspending sessions first (a second Ctrl-C stops at once)")
	case p := <-early:
		logger.Error("a part stopped on its own; stopping hangar", "part", p.name, "error", p.err)
	}
	stages := map[int][]*part{}
	var order []int
	for _, p := range parts {
		if _, ok := stages[p.stage]; !ok {
			order = append(order, p.stage)
		}
		stages[p.stage] = append(stages[p.stage], p)
	}
	slices.Sort(order)
	var errs []error
	for _, stage := range order {
		started := time.Now()
		for _, p := range stages[stage] {
			p.stop()
		}
		for _, p := range stages[stage] {
			<-p.done
			if p.err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", p.name, p.err))
			}
		}
		logger.Info(StopStepMessage, "step", stageNames[stage], "took", time.Since(started).Round(time.Millisecond))
	}
	return errors.Join(errs...)
}

// closeUnstarted releases apps built but never run (a later part failed to
// start): each runs on an ended context, which closes what it holds.
func closeUnstarted(apps []app, listeners []net.Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := len(apps) - 1; i >= 0; i-- {
		_ = apps[i].Run(ctx, listeners[i])
	}
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream when the watch returns
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
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			// A service that stops serving is draining: end the watch, or
			// the drain waits for this stream until it times out.
			return
		}
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

// loadOrCreateSecret returns the secret in path, or makes one on first start:
// 32 random bytes, hex, mode 0600. An existing file readable by others is
// refused, as for the vault key.
func loadOrCreateSecret(path, what string) (string, error) {
	info, err := os.Stat(path)
	switch {
	case err == nil:
		if info.Mode().Perm()&0o077 != 0 {
			return "", fmt.Errorf("%s file %s has mode %04o: run chmod 600 %s", what, path, info.Mode().Perm(), path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("cannot read %s: %w", what, unwrapPath(err))
		}
		if secret := strings.TrimSpace(string(b)); secret != "" {
			return secret, nil
		}
		return "", fmt.Errorf("%s file %s is empty: remove it and start again to make a new one", what, path)
	case errors.Is(err, fs.ErrNotExist):
		raw := make([]byte, 32)
		if _, err := rand.Read(raw); err != nil {
			return "", fmt.Errorf("generating %s: %w", what, err)
		}
		secret := hex.EncodeToString(raw)
		if err := writeSecret(path, []byte(secret+"\n")); err != nil {
			return "", fmt.Errorf("cannot save %s: %w", what, err)
		}
		return secret, nil
	default:
		return "", fmt.Errorf("cannot read %s: %w", what, unwrapPath(err))
	}
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
