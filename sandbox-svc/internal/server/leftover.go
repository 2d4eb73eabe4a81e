package server

import (
	"context"
	"log/slog"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// reapLeftovers removes the sandboxes an earlier process left behind (on
// disk, for the local driver) (it crashed, or was killed before its shutdown destroyed them) whose
// lease is gone. One whose lease still lives stays until a later pass finds
// the lease gone: its holder may still be about to hear NotFound and give
// it up, and the lease's TTL (at most MaxTTL) bounds the wait. No destroy
// hooks run: the processes are dead and no one can use the sandbox through
// this service (it is not in its table), so there is nothing to checkpoint
// through it.
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
