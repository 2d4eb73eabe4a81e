package server

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/destroyhook"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/environment"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/pool"
)

// The default environment's warm pools (issue 16). The built-in "local"
// environment has no warm_pool_size of its own, and its repository is
// whichever one the session brings, so a resume whose sandbox is not
// cached (evicted, or the cache off) paid a full clone. With
// Deps.LocalPoolSize > 0, an acquire of "local" for a repository starts a
// pool of that many sandboxes of that repository (kept for the
// Deps.LocalPoolRepos repositories acquired most recently; the oldest is
// closed), so the next boot of any session of that repository takes a
// ready one. A pool refills only once its repository has had no acquire
// for Deps.LocalPoolQuiet (DefaultLocalPoolQuiet): the clone must not compete with the restore and the
// agent start it would serve. An environment file for "local" with a
// warm_pool_size of its own uses that pool instead.
const (
	DefaultLocalPoolRepos = 2
	DefaultLocalPoolQuiet = 5 * time.Second
)

type localPoolEntry struct {
	*poolEntry
	// last is when its repository was last acquired (unix nanoseconds).
	last *atomic.Int64
}

// localPool is the default pool to take from for an acquire of env, or
// nil (not the built-in environment, off, a pool of its own fits, or the
// acquire wants no pool). The first acquire of a repository starts its
// pool: that acquire creates its own sandbox, the next ones find one.
func (s *Server) localPool(env *environment.Environment, own *poolEntry, req *sandboxv1.AcquireSandboxRequest) *poolEntry {
	if s.deps.LocalPoolSize <= 0 || env.Name != environment.Local || env.WarmPoolSize != 0 || env.Repository == "" ||
		env.Driver != s.drv.Name() || s.drv.Name() != "local" || req.GetCold() || req.GetCopyOf() != "" {
		return nil
	}
	if own != nil && poolKey(own.spec) == poolKey(*env) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	now := time.Now().UnixNano()
	if lp := s.localPools[env.Repository]; lp != nil && poolKey(lp.spec) == poolKey(*env) {
		lp.last.Store(now)
		return lp.poolEntry
	}
	if old := s.localPools[env.Repository]; old != nil {
		s.closeLocalPool(env.Repository, old)
	}
	repos := s.deps.LocalPoolRepos
	if repos <= 0 {
		repos = DefaultLocalPoolRepos
	}
	for len(s.localPools) >= repos {
		oldest := ""
		for repo, lp := range s.localPools {
			if oldest == "" || lp.last.Load() < s.localPools[oldest].last.Load() {
				oldest = repo
			}
		}
		s.closeLocalPool(oldest, s.localPools[oldest])
	}
	spec := *env
	spec.WarmPoolSize = s.deps.LocalPoolSize
	last := new(atomic.Int64)
	last.Store(now)
	var inner pool.Limiter = rate.NewLimiter(pool.DefaultRate, pool.DefaultBurst)
	if s.deps.PoolLimiter != nil {
		inner = s.deps.PoolLimiter()
	}
	p := pool.New(pool.Options{
		Environment: spec.Name, Target: spec.WarmPoolSize, MaxInFlight: pool.DefaultMaxInFlight,
		Limiter: &quietLimiter{inner: inner, last: last, quiet: s.deps.LocalPoolQuiet},
		Create: func(ctx context.Context) (driver.Sandbox, error) {
			return s.drv.Create(ctx, specFor(&spec, newID()))
		},
		Discard: func(ctx context.Context, sb driver.Sandbox, shutdown bool) {
			reason := destroyhook.ReasonPoolShrink
			if shutdown {
				reason = destroyhook.ReasonShutdown
			}
			s.destroy(ctx, &entry{id: sb.Info().ID, env: spec.Name, sb: sb, fromPool: true, state: sandboxv1.SandboxState_SANDBOX_STATE_READY}, reason)
		},
		OnError: func(err error) {
			s.log.Warn("default warm pool create failed", slog.String("repository", spec.Repository), slog.Any("error", err))
		},
	})
	p.Start(s.ctx)
	lp := &localPoolEntry{poolEntry: &poolEntry{pool: p, spec: spec}, last: last}
	s.localPools[env.Repository] = lp
	return lp.poolEntry
}

// closeLocalPool drops a default pool and destroys its sandboxes in the
// background. s.mu is held.
func (s *Server) closeLocalPool(repo string, lp *localPoolEntry) {
	delete(s.localPools, repo)
	s.wg.Add(1)
	go func() { defer s.wg.Done(); lp.pool.Close(s.ctx, false) }()
}

// quietLimiter lets a create start only once last is quiet ago, then asks
// inner.
type quietLimiter struct {
	inner pool.Limiter
	last  *atomic.Int64
	quiet time.Duration
}

func (q *quietLimiter) Wait(ctx context.Context) error {
	for {
		d := time.Until(time.Unix(0, q.last.Load()).Add(q.quiet))
		if d <= 0 {
			break
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	return q.inner.Wait(ctx)
}
