package server

import (
	"context"
	"log/slog"
	"sort"
	"time"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/environment"
)

// The sandbox cache: a sandbox released with a checkpoint it holds (a
// session's suspend, just captured) is kept, files and all, for the next
// lease of its work key (the session's resume), which then skips the clone
// and the restore. The server never trusts it: the lease says which
// checkpoint it was released after (AcquireSandboxResponse.cached_checkpoint)
// and the session verifies it against that checkpoint before any agent runs
// (RestoreCheckpointRequest.reuse_sandbox), destroying it when anything
// differs. Only drivers that report disk use (driver.Cacher) cache; the cache
// is bounded by count, bytes, free disk and age, oldest out first.

// Cache limits (Deps' zero values).
const (
	DefaultCacheSize     = 8
	DefaultCacheMaxBytes = 20 << 30
	DefaultCacheMinFree  = 2 << 30
	DefaultCacheTTL      = time.Hour
)

type cachedSandbox struct {
	e          *entry
	key        string // work key
	spec       string // cacheSpec of what it was made from
	checkpoint string
	bytes      int64
	at         time.Time
}

// cacheSpec is what makes a cached sandbox fit an acquire: the
// environment's definition (as for the pool) with the repository, and the
// egress.
func cacheSpec(e environment.Environment, egress string) string {
	return poolKey(e) + "|egress=" + egress
}

// cacheSandbox keeps a released sandbox for its work key. handled false:
// it can't be (no work key, a driver without disk reports, the cache off,
// its processes would not end) and the caller destroys it as a release
// does. handled true: the lease is released and the sandbox is cached
// (kept) or, when the cache's limits left no room for it, destroyed
// already. The lease must have been checked.
func (s *Server) cacheSandbox(ctx context.Context, e *entry, token uint64, checkpoint string) (kept, handled bool) {
	cacher, ok := s.drv.(driver.Cacher)
	if !ok || s.deps.CacheSize < 0 || e.workKey == "" || e.cacheSpec == "" {
		return false, false
	}
	// Nothing may run in it while it waits: what ran wrote the tree the
	// checkpoint holds.
	killer, ok := e.sb.(driver.ProcessKiller)
	if !ok {
		return false, false
	}
	e.mu.Lock()
	if e.state != sandboxv1.SandboxState_SANDBOX_STATE_LEASED || e.lease.Token != token {
		e.mu.Unlock()
		return false, false
	}
	e.state = sandboxv1.SandboxState_SANDBOX_STATE_READY
	e.mu.Unlock()
	s.closeTerminals(e.id)
	if err := killer.KillProcesses(ctx); err != nil {
		s.log.Warn("released sandbox not cached: its processes did not end", slog.String("sandbox", e.id), slog.Any("error", err))
		return s.uncache(e)
	}
	n, err := cacher.DiskUsage(ctx, e.sb)
	if err != nil {
		s.log.Warn("released sandbox not cached: disk use unknown", slog.String("sandbox", e.id), slog.Any("error", err))
		return s.uncache(e)
	}
	s.mu.Lock()
	if s.closed || s.sandboxes[e.id] != e {
		s.mu.Unlock()
		return s.uncache(e)
	}
	delete(s.sandboxes, e.id)
	s.mu.Unlock()
	if _, err := s.leases.Release(ctx, leaseResource(e.id), token); err != nil {
		s.log.Warn("lease release failed", slog.String("sandbox", e.id), slog.Any("error", err))
	}
	e.mu.Lock()
	e.lease.Token = 0
	e.mu.Unlock()
	c := &cachedSandbox{e: e, key: e.workKey, spec: e.cacheSpec, checkpoint: checkpoint, bytes: n, at: s.now()}
	s.mu.Lock()
	old := s.cache[c.key]
	s.cache[c.key] = c
	s.mu.Unlock()
	if old != nil {
		s.evict(ctx, old, "replaced")
	}
	s.trimCache(ctx)
	s.mu.Lock()
	kept = s.cache[c.key] == c
	s.mu.Unlock()
	if kept {
		s.log.Info("sandbox cached", slog.String("sandbox", e.id), slog.String("work_key", c.key),
			slog.String("checkpoint", checkpoint), slog.Int64("bytes", n))
	}
	return kept, true
}

// uncache puts an entry that was not cached back to leased (the caller
// destroys it).
func (s *Server) uncache(e *entry) (kept, handled bool) {
	e.mu.Lock()
	e.state = sandboxv1.SandboxState_SANDBOX_STATE_LEASED
	e.mu.Unlock()
	return false, false
}

// takeCached removes the sandbox cached for key and returns it when it
// fits spec; one that does not (or any, with discard) is destroyed first,
// so the key is free for a new sandbox.
func (s *Server) takeCached(ctx context.Context, key, spec string, discard bool) *cachedSandbox {
	if key == "" {
		return nil
	}
	s.mu.Lock()
	c := s.cache[key]
	delete(s.cache, key)
	s.mu.Unlock()
	switch {
	case c == nil:
		return nil
	case discard:
		s.evict(ctx, c, "not wanted")
		return nil
	case c.spec != spec:
		s.evict(ctx, c, "environment changed")
		return nil
	}
	return c
}

// trimCache evicts the oldest cached sandboxes until the cache is within
// its limits: count, bytes, free disk and age.
func (s *Server) trimCache(ctx context.Context) {
	cacher, ok := s.drv.(driver.Cacher)
	if !ok {
		return
	}
	size, maxBytes, minFree, ttl := s.deps.CacheSize, s.deps.CacheMaxBytes, s.deps.CacheMinFree, s.deps.CacheTTL
	if size == 0 {
		size = DefaultCacheSize
	}
	if maxBytes == 0 {
		maxBytes = DefaultCacheMaxBytes
	}
	if minFree == 0 {
		minFree = DefaultCacheMinFree
	}
	if ttl == 0 {
		ttl = DefaultCacheTTL
	}
	for {
		s.mu.Lock()
		list := make([]*cachedSandbox, 0, len(s.cache))
		var total int64
		for _, c := range s.cache {
			list = append(list, c)
			total += c.bytes
		}
		s.mu.Unlock()
		if len(list) == 0 {
			return
		}
		sort.Slice(list, func(i, j int) bool { return list[i].at.Before(list[j].at) })
		oldest := list[0]
		why := ""
		switch {
		case size < 0 || len(list) > size:
			why = "cache full"
		case total > maxBytes:
			why = "cache over its bytes"
		case s.now().Sub(oldest.at) > ttl:
			why = "expired"
		default:
			if free, err := cacher.FreeDisk(); err == nil && free < minFree {
				why = "disk low"
			}
		}
		if why == "" {
			return
		}
		s.mu.Lock()
		if s.cache[oldest.key] == oldest {
			delete(s.cache, oldest.key)
		} else {
			oldest = nil // taken meanwhile
		}
		s.mu.Unlock()
		if oldest != nil {
			s.evict(ctx, oldest, why)
		}
	}
}

// evict destroys a cached sandbox (already out of the cache). It holds no
// lease and no session's work (its checkpoint has it): no destroy hooks.
func (s *Server) evict(ctx context.Context, c *cachedSandbox, why string) {
	if err := c.e.sb.Destroy(context.WithoutCancel(ctx)); err != nil {
		s.log.Warn("cached sandbox destroy failed", slog.String("sandbox", c.e.id), slog.Any("error", err))
	}
	s.log.Info("cached sandbox evicted", slog.String("sandbox", c.e.id), slog.String("work_key", c.key), slog.String("why", why))
}

// closeCache destroys every cached sandbox (shutdown).
func (s *Server) closeCache(ctx context.Context) {
	s.mu.Lock()
	list := s.cache
	s.cache = map[string]*cachedSandbox{}
	s.mu.Unlock()
	for _, c := range list {
		s.evict(ctx, c, "shutdown")
	}
}
