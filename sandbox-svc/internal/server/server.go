// Package server implements sandboxv1.SandboxService: environments, warm
// pools, leased sandboxes, exec and terminal streams, files and destroy
// hooks. Every error it returns is, or wraps, a *fault.Error; the platform's
// interceptor turns it into a gRPC status.
package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/destroyhook"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/environment"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/lease"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/pool"
)

// Deps are the server's dependencies.
type Deps struct {
	Redis *redis.Client
	// Driver builds the sandboxes (app picks it from HANGAR_SANDBOX_DRIVER).
	// The caller closes it after Close.
	Driver driver.Driver
	// Home is HANGAR_HOME: environments/ live there.
	Home   string
	Logger *slog.Logger
	Now    func() time.Time
	// KeyPrefix prefixes every Redis key; "hangar:sandbox:" when empty.
	KeyPrefix string
	// Optional knobs (zero means the default).

	// DestroyHookTimeout bounds the wait for destroy acks (30s).
	DestroyHookTimeout time.Duration
	// ReapInterval is how often expired leases are looked for (5s).
	ReapInterval time.Duration
	// PoolLimiter paces warm-pool creates per environment (pool.DefaultRate,
	// one create every 2 s; at most pool.DefaultMaxInFlight at once).
	PoolLimiter func() pool.Limiter
	// WorkDir is where the built-in "local" environment looks for its git
	// repository (the process's working directory when empty).
	WorkDir string
	// The sandbox cache (cache.go): at most CacheSize sandboxes (-1: no
	// cache), CacheMaxBytes of disk between them, none kept while the disk
	// has less than CacheMinFree free, each for CacheTTL. Zero: the
	// Default* values.
	CacheSize     int
	CacheMaxBytes int64
	CacheMinFree  int64
	CacheTTL      time.Duration
	// LocalPoolSize: the built-in "local" environment keeps this many
	// warm sandboxes of each of the LocalPoolRepos (DefaultLocalPoolRepos
	// when 0) repositories acquired most recently (localpool.go; 0: none).
	// LocalPoolQuiet is how long after its repository's last acquire such
	// a pool waits before it refills (DefaultLocalPoolQuiet).
	LocalPoolSize  int
	LocalPoolRepos int
	LocalPoolQuiet time.Duration
	// LeftoverGrace is how long a leftover revived at start waits for its
	// session to checkpoint and release it (DefaultLeftoverGrace).
	LeftoverGrace time.Duration
}

// Defaults.
const (
	DefaultKeyPrefix = "hangar:sandbox:"
	DefaultTTL       = 60 * time.Second
	MaxTTL           = time.Hour
	// MaxReadFile caps ReadFile; larger files go through Exec with cat.
	MaxReadFile = 4 << 20
	// ExecChunk is the size of stdout/stderr messages.
	ExecChunk = 32 << 10
)

// Server implements sandboxv1.SandboxServiceServer.
type Server struct {
	sandboxv1.UnimplementedSandboxServiceServer

	deps   Deps
	log    *slog.Logger
	now    func() time.Time
	envs   *environment.Store
	leases *lease.Manager
	hooks  *destroyhook.Hub
	drv    driver.Driver

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	sandboxes map[string]*entry
	pools     map[string]*poolEntry
	terminals map[string]*termSession
	cache     map[string]*cachedSandbox // by work key (cache.go)
	// localPools are the default environment's pools, by repository
	// (localpool.go).
	localPools map[string]*localPoolEntry
	closed     bool
}

type entry struct {
	id       string
	env      string
	sb       driver.Sandbox
	fromPool bool
	extraEnv map[string]string
	// workKey is the acquire's (empty: none) and cacheSpec what the
	// sandbox was made from (cache.go).
	workKey, cacheSpec string
	// revived: a leftover of an earlier process (leftover.go).
	revived bool

	mu      sync.Mutex
	state   sandboxv1.SandboxState
	lease   lease.Lease
	destroy chan struct{} // closed when destruction finished
	// uses are the callers using it now (uses.go).
	uses useSet
}

type poolEntry struct {
	pool *pool.Pool
	spec environment.Environment
}

var _ sandboxv1.SandboxServiceServer = (*Server)(nil)

// New builds the server, revives the sandboxes an earlier process left on
// disk for their sessions to checkpoint and removes the rest whose lease is
// gone, starts a warm pool for every environment that
// asks for one and the lease reaper.
func New(ctx context.Context, deps Deps) (*Server, error) {
	if deps.Redis == nil {
		return nil, errors.New("sandbox server: Redis is required")
	}
	if deps.Driver == nil {
		return nil, errors.New("sandbox server: Driver is required")
	}
	if deps.Home == "" {
		return nil, errors.New("sandbox server: Home is required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.KeyPrefix == "" {
		deps.KeyPrefix = DefaultKeyPrefix
	}
	if deps.ReapInterval <= 0 {
		deps.ReapInterval = 5 * time.Second
	}
	if deps.LocalPoolQuiet <= 0 {
		deps.LocalPoolQuiet = DefaultLocalPoolQuiet
	}
	if deps.LeftoverGrace <= 0 {
		deps.LeftoverGrace = DefaultLeftoverGrace
	}
	envs, err := environment.Open(environment.Options{Home: deps.Home, Now: deps.Now, WorkDir: deps.WorkDir})
	if err != nil {
		return nil, err
	}
	s := &Server{
		deps: deps, log: deps.Logger, now: deps.Now, envs: envs, drv: deps.Driver,
		leases:    lease.New(deps.Redis, deps.KeyPrefix, deps.Now),
		hooks:     destroyhook.NewHub(deps.Now, deps.DestroyHookTimeout),
		sandboxes: map[string]*entry{}, pools: map[string]*poolEntry{}, terminals: map[string]*termSession{}, localPools: map[string]*localPoolEntry{},
		cache: map[string]*cachedSandbox{},
	}
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	// Before any pool creates: what is on disk now is an earlier process's.
	s.reviveLeftovers(ctx)
	if n, ok := deps.Driver.(driver.GoneNotifier); ok {
		n.NotifyGone(s.sandboxGone)
	}
	list, err := envs.List(ctx)
	if err != nil {
		s.log.Warn("environments not loaded", slog.Any("error", err))
	}
	for _, e := range list {
		s.syncPool(e)
	}
	s.wg.Add(1)
	go s.reapLoop()
	return s, nil
}

// Isolation names how sandboxes are isolated, for a driver that says
// (local.Driver.Isolation); "" for one that does not.
func (s *Server) Isolation() string {
	if d, ok := s.drv.(interface{ Isolation() string }); ok {
		return d.Isolation()
	}
	return ""
}

// Close stops the background loops and destroys every sandbox (running the
// destroy hooks with reason shutdown).
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	pools := s.pools
	s.pools = map[string]*poolEntry{}
	for repo, lp := range s.localPools {
		pools["\x00local:"+repo] = lp.poolEntry
	}
	s.localPools = map[string]*localPoolEntry{}
	var entries []*entry
	for _, e := range s.sandboxes {
		entries = append(entries, e)
	}
	s.mu.Unlock()
	// Destroy first, while WatchDestroys streams still deliver notices;
	// then stop the loops.
	var wg sync.WaitGroup
	for _, p := range pools {
		wg.Add(1)
		go func() { defer wg.Done(); p.pool.Close(ctx, true) }()
	}
	for _, e := range entries {
		wg.Add(1)
		go func() { defer wg.Done(); s.destroy(ctx, e, destroyhook.ReasonShutdown) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); s.closeCache(ctx) }()
	wg.Wait()
	s.cancel()
	s.wg.Wait()
	return nil
}

// sandboxGone destroys a sandbox someone else is removing (a pod deleted
// or evicted), running its destroy hooks while the driver keeps it whole.
func (s *Server) sandboxGone(id string) {
	s.mu.Lock()
	e, ok := s.sandboxes[id]
	s.mu.Unlock()
	if !ok {
		return
	}
	s.log.Warn("sandbox removed outside hangar", slog.String("sandbox", id))
	s.destroyAsync(e, destroyhook.ReasonFailed)
}

func newID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "sb-" + hex.EncodeToString(b[:])
}

func leaseResource(id string) string { return "sandbox:" + id }

func specFor(e *environment.Environment, id string) driver.Spec {
	spec := driver.Spec{ID: id, Environment: e.Name, Repository: e.Repository, BaseRef: e.BaseRef, Setup: e.Setup, Env: e.Env,
		Image: e.Image, CPUMillis: e.Resources.CPUMillis, MemoryMB: e.Resources.MemoryMB, DiskGB: e.Resources.DiskGB}
	if e.Egress == environment.EgressNone {
		spec.Egress = driver.EgressNone
	}
	return spec
}

// poolKey is what makes two environment definitions build the same
// sandboxes; a change replaces the pool.
func poolKey(e environment.Environment) string {
	e.WarmPoolSize, e.UpdatedAt, e.CacheTTL, e.Resources = 0, time.Time{}, "", environment.Resources{}
	return fmt.Sprintf("%#v", e)
}

// poolID names the sandboxes e's pool builds (driver.Spec.Pool): a
// WarmClaimer's replicas claim each other's warm sandboxes by it, so only
// ones built from the environment as it is now (its resources too: a
// pod's are fixed at its creation).
func poolID(e environment.Environment) string {
	sum := sha256.Sum256([]byte(poolKey(e) + fmt.Sprintf("%#v", e.Resources)))
	return hex.EncodeToString(sum[:16])
}

// syncPool makes the warm pool match e (nil: the environment is gone).
func (s *Server) syncPool(e *environment.Environment) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	name := ""
	if e != nil {
		name = e.Name
	}
	cur := s.pools[name]
	var old *pool.Pool
	switch {
	case e == nil || e.WarmPoolSize == 0 || e.Driver != s.drv.Name():
		if cur != nil {
			old = cur.pool
			delete(s.pools, name)
		}
	case cur != nil && poolKey(cur.spec) == poolKey(*e):
		cur.pool.SetTarget(s.ctx, e.WarmPoolSize)
		cur.spec = *e
	default:
		if cur != nil {
			old = cur.pool
		}
		spec := *e
		opts := pool.Options{
			Environment: e.Name, Target: e.WarmPoolSize, MaxInFlight: pool.DefaultMaxInFlight,
			Create: func(ctx context.Context) (driver.Sandbox, error) {
				sp := specFor(&spec, newID())
				sp.Pool = poolID(spec)
				return s.drv.Create(ctx, sp)
			},
			Discard: func(ctx context.Context, sb driver.Sandbox, shutdown bool) {
				reason := destroyhook.ReasonPoolShrink
				if shutdown {
					reason = destroyhook.ReasonShutdown
				}
				s.destroy(ctx, &entry{id: sb.Info().ID, env: spec.Name, sb: sb, fromPool: true, state: sandboxv1.SandboxState_SANDBOX_STATE_READY}, reason)
			},
			OnError: func(err error) {
				s.log.Warn("warm pool create failed", slog.String("environment", spec.Name), slog.Any("error", err))
			},
		}
		if s.deps.PoolLimiter != nil {
			opts.Limiter = s.deps.PoolLimiter()
		}
		p := pool.New(opts)
		p.Start(s.ctx)
		s.pools[name] = &poolEntry{pool: p, spec: spec}
	}
	s.mu.Unlock()
	if old != nil {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); old.Close(s.ctx, false) }()
	}
}

func (s *Server) lookup(id string) (*entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sandboxes[id]
	if !ok {
		return nil, fault.NotFound("SANDBOX_NOT_FOUND", "sandbox %q not found", id)
	}
	return e, nil
}

// use checks the caller may act on a sandbox: a non-zero token must be the
// current lease's; token 0 (an operator's `hangar sb exec`) needs the
// sandbox to be leased right now.
func (s *Server) use(ctx context.Context, id string, token uint64) (*entry, error) {
	if id == "" {
		return nil, fault.InvalidArgument("sandbox_id", "sandbox_id is required")
	}
	e, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	state, held := e.state, e.lease.Token
	e.mu.Unlock()
	if state == sandboxv1.SandboxState_SANDBOX_STATE_DESTROYING && token != 0 && token == held {
		// A destroy notice's subscriber finishing up (checkpoint) before
		// the deadline, even when the lease itself has expired.
		return e, nil
	}
	if state != sandboxv1.SandboxState_SANDBOX_STATE_LEASED {
		return nil, fault.FailedPrecondition("SANDBOX_NOT_LEASED", "sandbox %q is %s, not leased", id, stateName(state))
	}
	if token == 0 {
		if ok, err := s.leaseHeld(ctx, e); err != nil {
			return nil, err
		} else if !ok {
			return nil, fault.FailedPrecondition(lease.ReasonExpired, "the lease on sandbox %q has expired", id)
		}
		return e, nil
	}
	if _, err := s.checkLease(ctx, e, token); err != nil {
		return nil, err
	}
	return e, nil
}

func stateName(st sandboxv1.SandboxState) string {
	switch st {
	case sandboxv1.SandboxState_SANDBOX_STATE_READY:
		return "ready"
	case sandboxv1.SandboxState_SANDBOX_STATE_DESTROYING:
		return "being destroyed"
	case sandboxv1.SandboxState_SANDBOX_STATE_CREATING:
		return "being created"
	}
	return st.String()
}

// destroy runs the hooks and removes the sandbox. Concurrent calls wait
// for the first.
func (s *Server) destroy(ctx context.Context, e *entry, reason destroyhook.Reason) {
	e.mu.Lock()
	if e.destroy != nil {
		ch := e.destroy
		e.mu.Unlock()
		<-ch
		return
	}
	e.destroy = make(chan struct{})
	e.state = sandboxv1.SandboxState_SANDBOX_STATE_DESTROYING
	l := e.lease
	e.mu.Unlock()
	s.log.Info("sandbox being destroyed", slog.String("sandbox", e.id), slog.String("holder", l.Holder),
		slog.Int("reason", int(reason)))
	defer close(e.destroy)

	hook := func(ctx context.Context, _ driver.Sandbox) error {
		n, acked := s.hooks.Notify(ctx, destroyhook.Notice{
			SandboxID: e.id, Environment: e.env, Holder: l.Holder, Reason: reason, Token: l.Token,
		})
		if !acked {
			s.log.Warn("destroy hooks not acknowledged in time", slog.String("sandbox", e.id), slog.String("notice", n.ID))
		}
		return nil
	}
	if err := e.sb.Destroy(ctx, hook); err != nil {
		s.log.Warn("sandbox destroy failed", slog.String("sandbox", e.id), slog.Any("error", err))
	}
	s.closeTerminals(e.id)
	if l.Token != 0 && reason != destroyhook.ReasonRelease {
		// The lease dies with the sandbox; a stale holder sees NotFound.
		if _, err := s.leases.Release(context.WithoutCancel(ctx), leaseResource(e.id), l.Token); err != nil && !fault.Is(err, fault.KindFailedPrecondition) {
			s.log.Warn("lease release failed", slog.String("sandbox", e.id), slog.Any("error", err))
		}
	}
	e.mu.Lock()
	e.state = sandboxv1.SandboxState_SANDBOX_STATE_DESTROYED
	e.mu.Unlock()
	s.mu.Lock()
	if s.sandboxes[e.id] == e {
		delete(s.sandboxes, e.id)
	}
	s.mu.Unlock()
	s.log.Info("sandbox destroyed", slog.String("sandbox", e.id), slog.Int("reason", int(reason)))
}

func (s *Server) destroyAsync(e *entry, reason destroyhook.Reason) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.destroy(context.WithoutCancel(s.ctx), e, reason)
	}()
}

func (s *Server) reapLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.deps.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			s.reap(s.ctx)
		}
	}
}

// reap destroys leased sandboxes whose lease is gone (expired, or lost in
// a Redis restart) and leftovers on disk whose lease has gone since the last
// pass. Sandboxes are local to this process (the local driver locks its
// directory), so every replica reaps its own and no singleton lease guards
// this: see "Sandboxes" in docs/ARCHITECTURE.md.
func (s *Server) reap(ctx context.Context) {
	defer s.reapLeftovers(ctx)
	defer s.trimCache(ctx)
	s.mu.Lock()
	var leased []*entry
	for _, e := range s.sandboxes {
		e.mu.Lock()
		if e.state == sandboxv1.SandboxState_SANDBOX_STATE_LEASED {
			leased = append(leased, e)
		}
		e.mu.Unlock()
	}
	s.mu.Unlock()
	for _, e := range leased {
		e.mu.Lock()
		tok := e.lease.Token
		e.mu.Unlock()
		if _, err := s.checkLease(ctx, e, tok); fault.Is(err, fault.KindFailedPrecondition) {
			s.log.Info("sandbox lease expired", slog.String("sandbox", e.id))
			s.destroy(ctx, e, destroyhook.ReasonLeaseExpired)
		}
	}
}

// ---- environments ----

func envToProto(e *environment.Environment) *sandboxv1.Environment {
	p := &sandboxv1.Environment{
		Name: e.Name, Repository: e.Repository, BaseRef: e.BaseRef, Setup: e.Setup, Env: e.Env,
		WarmPoolSize: int32(e.WarmPoolSize), Driver: e.Driver, Image: e.Image, CacheTtl: e.CacheTTL,
		Resources: &sandboxv1.Resources{CpuMillis: int32(e.Resources.CPUMillis), MemoryMb: int32(e.Resources.MemoryMB), DiskGb: int32(e.Resources.DiskGB)},
		Egress:    sandboxv1.Egress_EGRESS_FULL,
	}
	if e.Egress == environment.EgressNone {
		p.Egress = sandboxv1.Egress_EGRESS_NONE
	}
	if !e.UpdatedAt.IsZero() {
		p.UpdatedAt = timestamppb.New(e.UpdatedAt)
	}
	return p
}

func envFromProto(p *sandboxv1.Environment) environment.Environment {
	e := environment.Environment{
		Name: p.GetName(), Repository: p.GetRepository(), BaseRef: p.GetBaseRef(), Setup: p.GetSetup(), Env: p.GetEnv(),
		WarmPoolSize: int(p.GetWarmPoolSize()), Driver: p.GetDriver(), Image: p.GetImage(), CacheTTL: p.GetCacheTtl(),
		Resources: environment.Resources{CPUMillis: int(p.GetResources().GetCpuMillis()), MemoryMB: int(p.GetResources().GetMemoryMb()), DiskGB: int(p.GetResources().GetDiskGb())},
	}
	switch p.GetEgress() {
	case sandboxv1.Egress_EGRESS_NONE:
		e.Egress = environment.EgressNone
	case sandboxv1.Egress_EGRESS_FULL:
		e.Egress = environment.EgressFull
	}
	return e
}

// ListEnvironments lists environments, the built-in "local" included.
func (s *Server) ListEnvironments(ctx context.Context, _ *sandboxv1.ListEnvironmentsRequest) (*sandboxv1.ListEnvironmentsResponse, error) {
	list, err := s.envs.List(ctx)
	if err != nil {
		return nil, err
	}
	resp := &sandboxv1.ListEnvironmentsResponse{}
	for _, e := range list {
		resp.Environments = append(resp.Environments, envToProto(e))
	}
	return resp, nil
}

// GetEnvironment returns one environment.
func (s *Server) GetEnvironment(ctx context.Context, req *sandboxv1.GetEnvironmentRequest) (*sandboxv1.GetEnvironmentResponse, error) {
	e, err := s.envs.GetWith(ctx, req.GetName(), req.GetRepository())
	if err != nil {
		return nil, err
	}
	resp := &sandboxv1.GetEnvironmentResponse{Environment: envToProto(e)}
	if req.GetResolveBase() || req.GetRepository() != "" {
		if resp.BaseCommit, err = environment.ResolveBase(ctx, e); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// ApplyEnvironment creates or replaces an environment and resizes its pool.
func (s *Server) ApplyEnvironment(ctx context.Context, req *sandboxv1.ApplyEnvironmentRequest) (*sandboxv1.ApplyEnvironmentResponse, error) {
	if req.GetEnvironment() == nil {
		return nil, fault.InvalidArgument("environment", "environment is required")
	}
	want := envFromProto(req.GetEnvironment())
	if err := want.Validate(); err != nil {
		return nil, err
	}
	if err := s.checkDriver(&want); err != nil {
		return nil, err
	}
	e, created, err := s.envs.Apply(ctx, want)
	if err != nil {
		return nil, err
	}
	s.syncPool(e)
	return &sandboxv1.ApplyEnvironmentResponse{Environment: envToProto(e), Created: created}, nil
}

// checkDriver refuses an environment this service's driver does not run:
// it would otherwise run on another driver than the one it names.
func (s *Server) checkDriver(e *environment.Environment) error {
	if e.Driver == s.drv.Name() {
		return nil
	}
	return fault.FailedPrecondition("DRIVER_NOT_CONFIGURED",
		"environment %q uses the %s driver, but this sandbox service runs the %s driver (HANGAR_SANDBOX_DRIVER)", e.Name, e.Driver, s.drv.Name())
}

// DeleteEnvironment removes an environment and its warm pool.
func (s *Server) DeleteEnvironment(ctx context.Context, req *sandboxv1.DeleteEnvironmentRequest) (*sandboxv1.DeleteEnvironmentResponse, error) {
	if err := s.envs.Delete(ctx, req.GetName()); err != nil {
		return nil, err
	}
	s.mu.Lock()
	pe := s.pools[req.GetName()]
	s.mu.Unlock()
	if pe != nil {
		gone := pe.spec
		gone.WarmPoolSize = 0
		s.syncPool(&gone)
	}
	if req.GetName() == environment.Local {
		if e, err := s.envs.Get(ctx, environment.Local); err == nil {
			s.syncPool(e)
		}
	}
	return &sandboxv1.DeleteEnvironmentResponse{}, nil
}

// GetPool returns an environment's warm pool state.
func (s *Server) GetPool(ctx context.Context, req *sandboxv1.GetPoolRequest) (*sandboxv1.GetPoolResponse, error) {
	e, err := s.envs.Get(ctx, req.GetEnvironment())
	if err != nil {
		return nil, err
	}
	p := &sandboxv1.Pool{Environment: e.Name, TargetSize: int32(e.WarmPoolSize)}
	s.mu.Lock()
	pe := s.pools[e.Name]
	s.mu.Unlock()
	if pe != nil {
		st := pe.pool.Stats()
		p.TargetSize, p.Ready, p.Creating, p.Hits, p.Misses = int32(st.Target), int32(st.Ready), int32(st.Creating), st.Hits, st.Misses
	}
	return &sandboxv1.GetPoolResponse{Pool: p}, nil
}

// ---- sandboxes and leases ----

func leaseToProto(l lease.Lease, id string) *sandboxv1.Lease {
	p := &sandboxv1.Lease{SandboxId: id, Holder: l.Holder, FencingToken: l.Token, TtlSeconds: int32(l.TTL / time.Second)}
	if !l.ExpiresAt.IsZero() {
		p.ExpiresAt = timestamppb.New(l.ExpiresAt)
	}
	return p
}

func (e *entry) proto() *sandboxv1.Sandbox {
	info := e.sb.Info()
	e.mu.Lock()
	defer e.mu.Unlock()
	p := &sandboxv1.Sandbox{
		Id: e.id, Environment: e.env, State: e.state, WorkDir: info.WorkDir, HomeDir: info.HomeDir,
		FromPool: e.fromPool, BaseCommit: info.BaseCommit, Driver: "local",
	}
	if !info.CreatedAt.IsZero() {
		p.CreatedAt = timestamppb.New(info.CreatedAt)
	}
	if e.lease.Token != 0 && e.state == sandboxv1.SandboxState_SANDBOX_STATE_LEASED {
		p.Lease = leaseToProto(e.lease, e.id)
	}
	e.uses.fill(p)
	return p
}

func ttlOf(secs int32) (time.Duration, error) {
	if secs < 0 {
		return 0, fault.InvalidArgument("ttl_seconds", "ttl_seconds must not be negative")
	}
	if secs == 0 {
		return DefaultTTL, nil
	}
	ttl := time.Duration(secs) * time.Second
	if ttl > MaxTTL {
		return 0, fault.InvalidArgument("ttl_seconds", "ttl_seconds must be at most %d", int(MaxTTL/time.Second))
	}
	return ttl, nil
}

func createErr(env string, err error) error {
	switch {
	case errors.Is(err, driver.ErrInUse):
		return fault.Wrap(fault.KindFailedPrecondition, "WORK_KEY_IN_USE", "the work key is in use by another live sandbox", err)
	case errors.Is(err, driver.ErrIsolationUnavailable):
		return fault.Wrap(fault.KindFailedPrecondition, "SANDBOX_ISOLATION_UNAVAILABLE",
			"sandboxes cannot be isolated on this machine (bubblewrap missing or user namespaces disabled); install bubblewrap, or set HANGAR_SANDBOX_ISOLATION=none to run them unisolated", err)
	case errors.Is(err, driver.ErrEgressUnsupported):
		return fault.Wrap(fault.KindFailedPrecondition, "EGRESS_UNSUPPORTED", "egress none cannot be enforced on this machine (a network namespace needs root)", err)
	case errors.Is(err, driver.ErrBackendUnavailable):
		// The message names the backend (the API server's URL) and says
		// nothing of this service's internals.
		return fault.Wrap(fault.KindUnavailable, "SANDBOX_BACKEND_UNAVAILABLE", err.Error(), err)
	case errors.Is(err, driver.ErrStartFailed):
		// The reason (image pull, crash, never ready: the pod's status and
		// events) is the user's to act on.
		return fault.Wrap(fault.KindFailedPrecondition, "SANDBOX_START_FAILED",
			fmt.Sprintf("the sandbox for environment %q did not start: %v", env, err), err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case strings.Contains(err.Error(), "No space left on device"):
		// A clone or setup command said so on its stderr.
		return fault.NoSpace(err)
	}
	return fault.Wrap(fault.KindFailedPrecondition, "SANDBOX_CREATE_FAILED",
		fmt.Sprintf("creating a sandbox for environment %q failed (clone or setup); see the service log", env), err)
}

// copySandbox makes a sandbox as a copy of req.copy_of (see
// AcquireSandboxRequest.copy_of).
func (s *Server) copySandbox(ctx context.Context, req *sandboxv1.AcquireSandboxRequest, env, egress string) (driver.Sandbox, error) {
	copier, ok := s.drv.(driver.Copier)
	if !ok {
		return nil, fault.Unimplemented("the %s driver can't copy sandboxes", s.drv.Name())
	}
	if req.GetCopyOfFencingToken() == 0 {
		return nil, fault.InvalidArgument("copy_of_fencing_token", "copy_of_fencing_token is required with copy_of")
	}
	src, err := s.use(ctx, req.GetCopyOf(), req.GetCopyOfFencingToken())
	if err != nil {
		return nil, err
	}
	if src.env != env {
		return nil, fault.InvalidArgument("copy_of", "sandbox %q is of environment %q, not %q", src.id, src.env, env)
	}
	spec := driver.Spec{ID: newID(), WorkKey: req.GetWorkKey(), Environment: env, Egress: driver.EgressFull}
	if egress == environment.EgressNone {
		spec.Egress = driver.EgressNone
	}
	sb, err := copier.Copy(ctx, src.sb, spec)
	switch {
	case errors.Is(err, driver.ErrBusy):
		return nil, fault.Wrap(fault.KindFailedPrecondition, "SANDBOX_BUSY", fmt.Sprintf("sandbox %q runs a command: it can be copied only when idle", src.id), err)
	case errors.Is(err, driver.ErrDestroyed):
		return nil, fault.FailedPrecondition("SANDBOX_NOT_LEASED", "sandbox %q is being destroyed", src.id)
	case err != nil:
		return nil, createErr(env, err)
	}
	return sb, nil
}

// fullCommitName is a full git object name (SHA-1 or SHA-256).
var fullCommitName = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)

// AcquireSandbox leases a ready sandbox from the warm pool, or creates one.
func (s *Server) AcquireSandbox(ctx context.Context, req *sandboxv1.AcquireSandboxRequest) (*sandboxv1.AcquireSandboxResponse, error) {
	name := req.GetEnvironment()
	if name == "" {
		name = environment.Local
	}
	env, err := s.envs.GetWith(ctx, name, req.GetRepository())
	if err != nil {
		return nil, err
	}
	ttl, err := ttlOf(req.GetTtlSeconds())
	if err != nil {
		return nil, err
	}
	if err := s.checkDriver(env); err != nil {
		return nil, err
	}
	if k := req.GetWorkKey(); k != "" && !driver.ValidKey(k) {
		return nil, fault.InvalidArgument("work_key", "work_key %q must be letters, digits, '.', '_' or '-' (at most 128)", k)
	}
	holder := req.GetHolder()
	if holder == "" {
		holder = "anonymous"
	}
	if c := req.GetBaseCommit(); c != "" && !fullCommitName.MatchString(c) {
		return nil, fault.InvalidArgument("base_commit", "base_commit %q must be a full commit name (40 or 64 lowercase hex digits)", c)
	}
	for k := range req.GetEnv() {
		if k == "" || k == "HOME" {
			return nil, fault.InvalidArgument("env", "env var %q cannot be set", k)
		}
	}
	egress := env.Egress
	switch req.GetEgress() {
	case sandboxv1.Egress_EGRESS_NONE:
		egress = environment.EgressNone
	case sandboxv1.Egress_EGRESS_FULL:
		egress = environment.EgressFull
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fault.Unavailable("SHUTTING_DOWN", "the sandbox service is shutting down")
	}
	pe := s.pools[env.Name]
	s.mu.Unlock()
	if lp := s.localPool(env, pe, req); lp != nil {
		pe = lp
	}
	s.displaceRevived(ctx, req.GetWorkKey())

	var sb driver.Sandbox
	fromPool := false
	fits := cacheSpec(*env, egress)
	cachedCheckpoint := ""
	// A cached sandbox of the work key is leased again as it is; one that
	// does not fit (or with no_cache or copy_of) is destroyed, freeing the
	// key. The caller verifies a cached one before use.
	if c := s.takeCached(ctx, req.GetWorkKey(), fits, req.GetNoCache() || req.GetCopyOf() != ""); c != nil {
		sb, fromPool, cachedCheckpoint = c.e.sb, c.e.fromPool, c.checkpoint
	}
	if sb == nil && req.GetCopyOf() != "" {
		if sb, err = s.copySandbox(ctx, req, env.Name, egress); err != nil {
			return nil, err
		}
	}
	if sb == nil && pe != nil && !req.GetCold() && egress == pe.spec.Egress && poolKey(pe.spec) == poolKey(*env) {
		if got, ok := pe.pool.Take(); ok {
			// A driver that shares warm sandboxes between replicas: claim
			// it (another replica may have first).
			if c, isClaimer := got.(driver.Claimer); isClaimer && req.GetWorkKey() == "" {
				if err := c.Claim(ctx); err != nil {
					s.destroyAsync(&entry{id: got.Info().ID, env: env.Name, sb: got, fromPool: true}, destroyhook.ReasonFailed)
					got = nil
				}
			}
			if k := req.GetWorkKey(); got != nil && k != "" {
				if err := got.Relocate(ctx, k); err != nil {
					s.destroyAsync(&entry{id: got.Info().ID, env: env.Name, sb: got, fromPool: true}, destroyhook.ReasonFailed)
					if errors.Is(err, driver.ErrInUse) {
						return nil, createErr(env.Name, err)
					}
					got = nil
				}
			}
			if got != nil {
				sb, fromPool = got, true
			}
		}
	}
	if sb == nil && !req.GetCold() && req.GetCopyOf() == "" && egress == env.Egress {
		// A driver whose replicas share warm sandboxes (pods): one of the
		// environment's pool that another replica made.
		if wc, ok := s.drv.(driver.WarmClaimer); ok && env.WarmPoolSize > 0 {
			got, err := wc.ClaimWarm(ctx, poolID(*env), req.GetWorkKey())
			switch {
			case errors.Is(err, driver.ErrBackendUnavailable):
				return nil, createErr(env.Name, err)
			case err != nil:
				s.log.Warn("warm claim failed", slog.String("environment", env.Name), slog.Any("error", err))
			case got != nil:
				sb, fromPool = got, true
			}
		}
	}
	if sb == nil {
		spec := specFor(env, newID())
		spec.WorkKey = req.GetWorkKey()
		if egress == environment.EgressNone {
			spec.Egress = driver.EgressNone
		} else {
			spec.Egress = driver.EgressFull
		}
		if c := req.GetBaseCommit(); c != "" {
			// At the caller's base (the session's), where the repository
			// gives it; else at the environment's, as without the hint.
			at := spec
			at.BaseRef = c
			sb, err = s.drv.Create(ctx, at)
			if err != nil && !errors.Is(err, driver.ErrInUse) && ctx.Err() == nil {
				s.log.Warn("sandbox not created at the caller's base commit; creating it at the environment's base",
					slog.String("environment", env.Name), slog.String("base_commit", c), slog.Any("error", err))
				sb, err = nil, nil
			}
			if err != nil {
				return nil, createErr(env.Name, err)
			}
		}
		if sb == nil {
			if sb, err = s.drv.Create(ctx, spec); err != nil {
				return nil, createErr(env.Name, err)
			}
		}
	}
	// The control plane talks to a sandbox through its hangar-sandbox: one
	// of another protocol version (an old image, a warm pod of an earlier
	// release) would fail at its first checkpoint, so it fails here.
	if v := sb.Info().ToolVersion; v != sandboxtool.Version {
		s.destroyAsync(&entry{id: sb.Info().ID, env: env.Name, sb: sb, fromPool: fromPool}, destroyhook.ReasonFailed)
		return nil, fault.FailedPrecondition("SANDBOX_TOOL_VERSION",
			"the %s driver's sandboxes carry hangar-sandbox protocol version %d, this service needs %d (0: none; set HANGAR_SANDBOX_TOOL)", s.drv.Name(), v, sandboxtool.Version)
	}
	id := sb.Info().ID
	e := &entry{id: id, env: env.Name, sb: sb, fromPool: fromPool, extraEnv: req.GetEnv(), state: sandboxv1.SandboxState_SANDBOX_STATE_LEASED,
		workKey: req.GetWorkKey(), cacheSpec: fits}
	l, err := s.leases.Acquire(ctx, leaseResource(id), holder, ttl)
	if err != nil {
		_ = sb.Destroy(context.WithoutCancel(ctx))
		return nil, err
	}
	e.lease = l
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.destroy(context.WithoutCancel(ctx), e, destroyhook.ReasonShutdown)
		return nil, fault.Unavailable("SHUTTING_DOWN", "the sandbox service is shutting down")
	}
	s.sandboxes[id] = e
	s.mu.Unlock()
	s.log.Info("sandbox leased", slog.String("sandbox", id), slog.String("environment", env.Name),
		slog.String("holder", holder), slog.Bool("from_pool", fromPool), slog.String("copy_of", req.GetCopyOf()),
		slog.String("cached_checkpoint", cachedCheckpoint))
	return &sandboxv1.AcquireSandboxResponse{Sandbox: e.proto(), Lease: leaseToProto(l, id),
		SharedCopy: req.GetCopyOf() != "" && sb.Info().Layered, CachedCheckpoint: cachedCheckpoint}, nil
}

// RenewLease extends a lease.
func (s *Server) RenewLease(ctx context.Context, req *sandboxv1.RenewLeaseRequest) (*sandboxv1.RenewLeaseResponse, error) {
	e, err := s.lookup(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if req.GetFencingToken() == 0 {
		return nil, fault.InvalidArgument("fencing_token", "fencing_token is required")
	}
	ttl, err := ttlOf(req.GetTtlSeconds())
	if err != nil {
		return nil, err
	}
	l, err := s.renewLease(ctx, e, req.GetFencingToken(), ttl)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	if e.lease.Token == l.Token {
		e.lease = l
	}
	e.mu.Unlock()
	return &sandboxv1.RenewLeaseResponse{Lease: leaseToProto(l, e.id)}, nil
}

// ReleaseSandbox ends a lease; the sandbox is kept in the cache (with
// cache_checkpoint, see cache.go) or destroyed in the background (after the
// destroy hooks), never returned to the pool.
func (s *Server) ReleaseSandbox(ctx context.Context, req *sandboxv1.ReleaseSandboxRequest) (*sandboxv1.ReleaseSandboxResponse, error) {
	e, err := s.lookup(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if req.GetFencingToken() == 0 {
		return nil, fault.InvalidArgument("fencing_token", "fencing_token is required")
	}
	if _, err := s.checkLease(ctx, e, req.GetFencingToken()); err != nil {
		return nil, err
	}
	if cp := req.GetCacheCheckpoint(); cp != "" {
		if kept, handled := s.cacheSandbox(ctx, e, req.GetFencingToken(), cp); handled {
			return &sandboxv1.ReleaseSandboxResponse{Cached: kept}, nil
		}
	}
	// The lease stays until the hooks ran, so subscribers can still use the
	// sandbox with the holder's token; destroy releases it.
	e.mu.Lock()
	e.state = sandboxv1.SandboxState_SANDBOX_STATE_DESTROYING
	e.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx := context.WithoutCancel(s.ctx)
		s.destroy(ctx, e, destroyhook.ReasonRelease)
		if _, err := s.leases.Release(ctx, leaseResource(e.id), req.GetFencingToken()); err != nil && !fault.Is(err, fault.KindFailedPrecondition) {
			s.log.Warn("lease release failed", slog.String("sandbox", e.id), slog.Any("error", err))
		}
	}()
	return &sandboxv1.ReleaseSandboxResponse{}, nil
}

// KillProcesses ends every process running in a leased sandbox.
func (s *Server) KillProcesses(ctx context.Context, req *sandboxv1.KillProcessesRequest) (*sandboxv1.KillProcessesResponse, error) {
	e, err := s.use(ctx, req.GetSandboxId(), req.GetFencingToken())
	if err != nil {
		return nil, err
	}
	killer, ok := e.sb.(driver.ProcessKiller)
	if !ok {
		return nil, fault.Unimplemented("this sandbox driver cannot end a sandbox's processes")
	}
	s.log.Info("sandbox processes being killed", slog.String("sandbox", e.id))
	if err := killer.KillProcesses(ctx); err != nil {
		return nil, fmt.Errorf("kill processes of %s: %w", e.id, err)
	}
	s.closeTerminals(e.id)
	return &sandboxv1.KillProcessesResponse{}, nil
}

// ListSandboxes lists leased sandboxes and ready pool sandboxes.
func (s *Server) ListSandboxes(ctx context.Context, req *sandboxv1.ListSandboxesRequest) (*sandboxv1.ListSandboxesResponse, error) {
	if env := req.GetEnvironment(); env != "" {
		if _, err := s.envs.Get(ctx, env); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	var out []*sandboxv1.Sandbox
	var entries []*entry
	for _, e := range s.sandboxes {
		entries = append(entries, e)
	}
	pools := make(map[string]*poolEntry, len(s.pools))
	for k, v := range s.pools {
		pools[k] = v
	}
	s.mu.Unlock()
	for _, e := range entries {
		if req.GetEnvironment() == "" || e.env == req.GetEnvironment() {
			out = append(out, e.proto())
		}
	}
	for name, pe := range pools {
		if req.GetEnvironment() != "" && name != req.GetEnvironment() {
			continue
		}
		for _, sb := range pe.pool.Ready() {
			out = append(out, (&entry{id: sb.Info().ID, env: name, sb: sb, fromPool: true, state: sandboxv1.SandboxState_SANDBOX_STATE_READY}).proto())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetId() < out[j].GetId() })
	return &sandboxv1.ListSandboxesResponse{Sandboxes: out}, nil
}

// GetSandbox returns one leased sandbox.
func (s *Server) GetSandbox(ctx context.Context, req *sandboxv1.GetSandboxRequest) (*sandboxv1.GetSandboxResponse, error) {
	e, err := s.lookup(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	return &sandboxv1.GetSandboxResponse{Sandbox: e.proto()}, nil
}

// ---- destroy hooks ----

func reasonToProto(r destroyhook.Reason) sandboxv1.DestroyReason {
	return sandboxv1.DestroyReason(r)
}

// WatchDestroys streams destroy notices until the client goes away.
func (s *Server) WatchDestroys(req *sandboxv1.WatchDestroysRequest, stream sandboxv1.SandboxService_WatchDestroysServer) error {
	if req.GetSubscriber() == "" {
		return fault.InvalidArgument("subscriber", "subscriber is required")
	}
	ch, cancel := s.hooks.Subscribe(req.GetSubscriber())
	defer cancel()
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-s.ctx.Done():
			return nil
		case n := <-ch:
			err := stream.Send(&sandboxv1.WatchDestroysResponse{Notice: &sandboxv1.DestroyNotice{
				NoticeId: n.ID, SandboxId: n.SandboxID, Environment: n.Environment, Holder: n.Holder,
				Reason: reasonToProto(n.Reason), Deadline: timestamppb.New(n.Deadline), FencingToken: n.Token,
			}})
			if err != nil {
				return err
			}
		}
	}
}

// AckDestroy records a subscriber's ack.
func (s *Server) AckDestroy(ctx context.Context, req *sandboxv1.AckDestroyRequest) (*sandboxv1.AckDestroyResponse, error) {
	if err := s.hooks.Ack(req.GetNoticeId(), req.GetSubscriber()); err != nil {
		return nil, err
	}
	return &sandboxv1.AckDestroyResponse{}, nil
}
