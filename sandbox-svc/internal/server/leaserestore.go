package server

import (
	"context"
	"log/slog"
	"time"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/lease"
)

// A Redis that restarts empty (no persistence, or lost data) forgets every
// lease while the sandboxes and their holders carry on. This process's
// record of each of its sandboxes (entry.lease, kept current by every
// acquire and renewal) is authoritative for them: no one else can lease a
// sandbox this process serves. So a lease missing from Redis that the
// record says is still in its term, with the same token, is put back
// (lease.Restore) rather than refused, and the reaper does not destroy its
// sandbox. A lease that ran out in the record too stays gone; a lease
// another holder has in Redis is never overwritten; tokens only rise.

// restoreMargin: a lease with less left than this in its record is let go
// (it expired in Redis by itself, give or take the two clocks).
const restoreMargin = time.Second

// restoreLost puts e's lease back when Redis lost it: err is the refusal
// of a call made with token (0: any), and true says the lease is back.
func (s *Server) restoreLost(ctx context.Context, e *entry, token uint64, err error) bool {
	if !fault.Is(err, fault.KindFailedPrecondition) || fault.Reason(fault.Status(err)) != lease.ReasonExpired {
		return false
	}
	e.mu.Lock()
	l, state := e.lease, e.state
	e.mu.Unlock()
	if state != sandboxv1.SandboxState_SANDBOX_STATE_LEASED || l.Token == 0 || (token != 0 && token != l.Token) ||
		l.ExpiresAt.Sub(s.now()) < restoreMargin {
		return false
	}
	if l.Resource == "" {
		l.Resource = leaseResource(e.id)
	}
	ok, rerr := s.leases.Restore(ctx, l)
	if rerr != nil {
		return false
	}
	if !ok {
		// Put back meanwhile by another call on this sandbox (a renewal
		// and an exec racing to restore it; seen in TestRedisRestartMidTurn):
		// held if Redis has this very lease now.
		cur, found, err := s.leases.Get(ctx, l.Resource)
		return err == nil && found && cur.Token == l.Token
	}
	s.log.Warn("sandbox lease restored: the lease store had lost it", slog.String("sandbox", e.id),
		slog.String("holder", l.Holder), slog.Uint64("fencing_token", l.Token))
	return true
}

// whileDown is the record's lease when the lease store can't be reached
// (err is Unavailable) and the record says token holds e in its term: a
// Redis blip does not stop the sandboxes this process serves. The record
// is this process's own (see above), so nothing can have taken the lease
// meanwhile; once Redis answers, a lease it lost is put back.
func (s *Server) whileDown(e *entry, token uint64, err error) (lease.Lease, bool) {
	if !fault.Is(err, fault.KindUnavailable) {
		return lease.Lease{}, false
	}
	e.mu.Lock()
	l, state := e.lease, e.state
	e.mu.Unlock()
	if state != sandboxv1.SandboxState_SANDBOX_STATE_LEASED || l.Token == 0 || (token != 0 && token != l.Token) || !s.now().Before(l.ExpiresAt) {
		return lease.Lease{}, false
	}
	s.log.Info("lease store unavailable: the sandbox's own lease record is used", slog.String("sandbox", e.id))
	return l, true
}

// checkLease is leases.Check for one of this process's sandboxes.
func (s *Server) checkLease(ctx context.Context, e *entry, token uint64) (lease.Lease, error) {
	l, err := s.leases.Check(ctx, leaseResource(e.id), token)
	if err == nil {
		return l, nil
	}
	if s.restoreLost(ctx, e, token, err) {
		return s.leases.Check(ctx, leaseResource(e.id), token)
	}
	if l, ok := s.whileDown(e, token, err); ok {
		return l, nil
	}
	return l, err
}

// renewLease is leases.Renew for one of this process's sandboxes. While
// the lease store is down the renewal is kept in the record only (and put
// into Redis once it answers and has lost the lease).
func (s *Server) renewLease(ctx context.Context, e *entry, token uint64, ttl time.Duration) (lease.Lease, error) {
	l, err := s.leases.Renew(ctx, leaseResource(e.id), token, ttl)
	if err == nil {
		return l, nil
	}
	if s.restoreLost(ctx, e, token, err) {
		return s.leases.Renew(ctx, leaseResource(e.id), token, ttl)
	}
	if l, ok := s.whileDown(e, token, err); ok {
		l.TTL, l.ExpiresAt = ttl, s.now().Add(ttl)
		return l, nil
	}
	return l, err
}

// leaseHeld says e is leased now (a call with token 0), putting a lost
// lease back.
func (s *Server) leaseHeld(ctx context.Context, e *entry) (bool, error) {
	_, ok, err := s.leases.Get(ctx, leaseResource(e.id))
	if err != nil {
		if _, held := s.whileDown(e, 0, err); held {
			return true, nil
		}
		return false, err
	}
	if ok {
		return true, nil
	}
	lost := fault.FailedPrecondition(lease.ReasonExpired, "lost")
	return s.restoreLost(ctx, e, 0, lost), nil
}
