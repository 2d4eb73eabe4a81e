package server

import (
	"context"
	"log/slog"
	"time"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/destroyhook"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// LeftoverHolder holds the lease of a sandbox an earlier process of this
// service left behind (api: Lease.holder) and this one revived: whoever
// recorded its id (a session) takes what is in it (a checkpoint) and
// releases it; it goes when the lease runs out otherwise.
const LeftoverHolder = "sandbox-svc/leftover"

// DefaultLeftoverGrace is how long a revived leftover waits for its
// session to take it (Deps.LeftoverGrace): longer than the session
// service's recovery at start takes to get round to it, with retries.
const DefaultLeftoverGrace = 10 * time.Minute

// reviveLeftovers runs at start, before anything is created: the
// sandboxes an earlier process left (it crashed, or was killed before its
// shutdown destroyed them) still hold the work written since their
// session's last checkpoint. Each one made for a work key (a session's;
// a warm or ad-hoc sandbox is named by its id, and no session can claim
// it) is revived (driver.LeftoverReviver) and leased again: under the
// lease it still has (a Redis that outlived the crash), whose holder may
// go on with it or let it run out (the destroy hooks checkpoint it then);
// else under a new lease held by LeftoverHolder for Deps.LeftoverGrace,
// which the session service's recovery finds through the id its session
// records, checkpoints and releases. The rest are removed as before.
func (s *Server) reviveLeftovers(ctx context.Context) {
	defer s.reapLeftovers(ctx)
	reviver, ok := s.drv.(driver.LeftoverReviver)
	if !ok {
		return
	}
	list, err := reviver.Leftovers(ctx)
	if err != nil {
		s.log.WarnContext(ctx, "leftover sandboxes not listed", slog.Any("error", err))
		return
	}
	for _, lo := range list {
		if lo.ID == "" || lo.Key == lo.ID {
			continue
		}
		l, held, err := s.leases.Get(ctx, leaseResource(lo.ID))
		if err != nil {
			s.log.WarnContext(ctx, "leftover sandbox lease not checked", slog.String("sandbox", lo.ID), slog.Any("error", err))
			continue
		}
		sb, err := reviver.Revive(ctx, lo)
		if err != nil {
			s.log.WarnContext(ctx, "leftover sandbox not revived: removed", slog.String("sandbox", lo.ID), slog.String("where", lo.Where), slog.Any("error", err))
			continue
		}
		e := &entry{id: lo.ID, env: lo.Environment, sb: sb, revived: true, state: sandboxv1.SandboxState_SANDBOX_STATE_LEASED}
		if v := sb.Info().ToolVersion; v != sandboxtool.Version {
			s.log.WarnContext(ctx, "leftover sandbox not revived: its tool is of another version", slog.String("sandbox", lo.ID), slog.Int("tool_version", v))
			s.destroy(ctx, e, destroyhook.ReasonFailed)
			continue
		}
		if held {
			l.TTL = max(time.Second, l.ExpiresAt.Sub(s.now()).Round(time.Second))
		} else if l, err = s.leases.Acquire(ctx, leaseResource(lo.ID), LeftoverHolder, s.deps.LeftoverGrace); err != nil {
			s.log.WarnContext(ctx, "leftover sandbox not leased: removed", slog.String("sandbox", lo.ID), slog.Any("error", err))
			s.destroy(ctx, e, destroyhook.ReasonFailed)
			continue
		}
		e.lease = l
		s.mu.Lock()
		s.sandboxes[e.id] = e
		s.mu.Unlock()
		s.log.WarnContext(ctx, "leftover sandbox revived for its session to checkpoint", slog.String("sandbox", lo.ID),
			slog.String("work_key", lo.Key), slog.String("holder", l.Holder), slog.Time("lease_expires", l.ExpiresAt))
	}
}

// displaceRevived destroys the revived leftover holding workKey, if there
// is one: a sandbox is being acquired for that key (a session opening
// without a sandbox on its record, which therefore names no leftover),
// and the key is the sandbox directory's name.
func (s *Server) displaceRevived(ctx context.Context, workKey string) {
	if workKey == "" {
		return
	}
	s.mu.Lock()
	var found *entry
	for _, e := range s.sandboxes {
		if e.revived && e.sb.Info().WorkKey == workKey {
			found = e
			break
		}
	}
	s.mu.Unlock()
	if found == nil {
		return
	}
	s.log.InfoContext(ctx, "revived leftover sandbox removed: a new sandbox is acquired for its work key", slog.String("sandbox", found.id), slog.String("work_key", workKey))
	s.destroy(context.WithoutCancel(ctx), found, destroyhook.ReasonLeaseExpired)
}

// reapLeftovers removes the sandboxes an earlier process left behind (on
// disk, for the local driver) (it crashed, or was killed before its
// shutdown destroyed them) and this one did not revive, whose lease is
// gone. One whose lease still lives stays until a later pass finds
// the lease gone: its holder may still be about to hear NotFound and give
// it up, and the lease's TTL (at most MaxTTL) bounds the wait. No destroy
// hooks run: no one can use the sandbox through this service (it is not in
// its table), so there is nothing to checkpoint through it.
// Drivers whose sandboxes end with the process have no leftovers.
func (s *Server) reapLeftovers(ctx context.Context) {
	cleaner, ok := s.drv.(driver.LeftoverCleaner)
	if !ok {
		return
	}
	list, err := cleaner.Leftovers(ctx)
	if err != nil {
		s.log.WarnContext(ctx, "leftover sandboxes not listed", slog.Any("error", err))
		return
	}
	for _, lo := range list {
		if lo.ID != "" {
			_, held, err := s.leases.Get(ctx, leaseResource(lo.ID))
			if err != nil {
				s.log.WarnContext(ctx, "leftover sandbox lease not checked", slog.String("sandbox", lo.ID), slog.Any("error", err))
				continue
			}
			if held {
				s.log.DebugContext(ctx, "leftover sandbox kept while its lease lives", slog.String("sandbox", lo.ID), slog.String("where", lo.Where))
				continue
			}
		}
		removed, err := cleaner.RemoveLeftover(ctx, lo)
		if err != nil {
			s.log.WarnContext(ctx, "leftover sandbox not removed", slog.String("where", lo.Where), slog.Any("error", err))
			continue
		}
		if removed {
			s.log.InfoContext(ctx, "leftover sandbox removed", slog.String("sandbox", lo.ID),
				slog.String("environment", lo.Environment), slog.String("where", lo.Where))
		}
	}
}
