package sessions

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/session-svc/internal/holds"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// Reasons recovery records, on the session (get shows them) and on turns.
const (
	reasonTurnOrphaned = "hangar stopped while this turn ran: interrupted; the work up to the last checkpoint is kept, send again to continue"
	reasonSandboxGone  = "hangar restarted and the sandbox is gone: suspended; the next message resumes from checkpoint %s"
	reasonNoCheckpoint = "hangar restarted and the sandbox is gone: suspended; it has no checkpoint, the next message starts from its base"
	reasonLeftBehind   = "hangar stopped uncleanly: the work left in its sandbox was recovered into checkpoint %s and the session suspended"
)

// leftoverHolder holds a sandbox an earlier sandbox-svc process left
// behind (api: Lease.holder); the session whose record names its id takes
// a checkpoint of it.
const leftoverHolder = "sandbox-svc/leftover"

// transientGrace is how long a session may be resuming or suspending in
// another replica before it counts as left behind: longer than the calls
// those make may take (a cold boot, a checkpoint of a large tree, the wait
// for a release).
const transientGrace = 20 * time.Minute

// recoverableStates are the states a session can be found in after its
// process stopped without a drain.
var recoverableStates = []string{
	store.StateRunning, store.StateResuming, store.StateSuspending,
	store.StateIdle, store.StateNeedsInput, store.StateFailed,
}

// Recover reconciles the sessions a stopped process (a crash, a kill -9, a
// drain that ran out of time) left behind, so that none stays wedged:
//   - a turn without an end that no live hold keeps running is ended
//     "interrupted", with the usage the gateway counted for its run;
//   - a session whose sandbox is gone is suspended (from its newest
//     checkpoint, which the next message restores);
//   - a session whose sandbox was left behind (the sandbox service found
//     it at start and kept it leased for its session) is checkpointed from
//     it and suspended;
//   - a session left running, resuming or suspending by a stopped process
//     ends the same way.
//
// Every change is a state transition with its reason (get and the history
// say why). Sessions that a live process still serves (a live turn hold,
// a lease this process renews) are left alone, so a replica starting
// beside others does not disturb them. It returns the sessions changed.
func (m *Manager) Recover(ctx context.Context) ([]string, error) {
	sessions, err := m.d.Store.ListSessionsByState(ctx, recoverableStates...)
	if err != nil {
		return nil, fmt.Errorf("recover: list sessions: %w", err)
	}
	var changed []string
	var errs []error
	for _, s := range sessions {
		did, err := m.recoverOnce(ctx, s.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("recover %s: %w", s.Name, err))
			continue
		}
		if did {
			changed = append(changed, s.Name)
		}
	}
	return changed, errors.Join(errs...)
}

// recoverSession reconciles one session; did says it changed anything.
func (m *Manager) recoverSession(ctx context.Context, s *store.Session) (did bool, err error) {
	m.mu.Lock()
	_, turnHere := m.turns[s.Name]
	_, leaseHere := m.leases[s.Name]
	m.mu.Unlock()
	if turnHere || leaseHere {
		return false, nil
	}
	live, err := m.d.Holds.List(ctx, s.Name)
	if err != nil {
		return false, fmt.Errorf("holds: %w", err)
	}
	transient := s.State == store.StateRunning || s.State == store.StateResuming || s.State == store.StateSuspending
	// The replica that owns it (moved it to this state, or renews its
	// lease) has stopped: what it was doing is left behind at once, its
	// turn hold (lapsing in up to a lease TTL) notwithstanding.
	ownerDead := false
	if transient {
		ownerDead, _ = m.ownerDead(ctx, s.Name)
	}
	for _, h := range live {
		if h.Kind == holds.KindTurn && !ownerDead {
			// Another process runs a turn of it.
			return false, nil
		}
	}
	if transient && s.State != store.StateRunning && !m.cfg.SoleReplica && !ownerDead && m.now().Sub(s.StateChangedAt) < transientGrace {
		// Another replica may be opening or suspending it right now (no
		// hold marks those; its owner mark says which, and it lives):
		// only one that has been at it for longer than any call may
		// take is stuck.
		return false, nil
	}
	if transient && s.State != store.StateRunning && m.cfg.SoleReplica && !s.StateChangedAt.Before(m.startedAt) {
		// This process is opening or suspending it (no lease is recorded
		// yet while a sandbox boots): only a previous process's is stuck.
		return false, nil
	}
	var sb *sandboxv1.Sandbox
	if s.SandboxID != "" {
		resp, err := m.d.Sandboxes.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: s.SandboxID})
		switch {
		case status.Code(err) == codes.NotFound:
		case err != nil:
			return false, fmt.Errorf("sandbox %s: %w", s.SandboxID, err)
		default:
			sb = resp.GetSandbox()
		}
	}
	leftBehind := leftBehindIn(s, sb)
	if !transient && !leftBehind && (s.SandboxID == "" || sb != nil) {
		// Idle on a live sandbox (another replica's, or a sandbox service
		// that outlived us: its lease expiry checkpoints it), or suspended
		// already.
		return false, m.endOrphanedTurns(ctx, s.Name)
	}

	if err := m.endOrphanedTurns(ctx, s.Name); err != nil {
		return false, err
	}
	reason, err := m.settle(ctx, s, sb, leftBehind)
	if err != nil {
		return false, err
	}
	from := []string{s.State}
	if _, err := m.transition(ctx, s.Name, store.StateSuspended, reason, from...); err != nil {
		return false, err
	}
	m.log.WarnContext(ctx, "session recovered", "session", s.Name, "was", s.State, "reason", reason)
	return true, nil
}

// leftBehindIn says sb, the sandbox s's record names, was left by a
// stopped process: the sandbox service revived it after a crash (leased to
// leftoverHolder), or its lease is s's but not the one s's record holds.
func leftBehindIn(s *store.Session, sb *sandboxv1.Sandbox) bool {
	l := sb.GetLease()
	return sb != nil && (l.GetHolder() == leftoverHolder || l.GetHolder() == holder(s.Name) && l.GetFencingToken() != s.FencingToken)
}

// recoverOnce recovers the session name (recoverSession, on its record as
// it is now); a recovery of it already under way is waited for instead.
func (m *Manager) recoverOnce(ctx context.Context, name string) (bool, error) {
	m.mu.Lock()
	if ch, ok := m.recovering[name]; ok {
		m.mu.Unlock()
		select {
		case <-ch:
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	ch := make(chan struct{})
	m.recovering[name] = ch
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.recovering, name)
		m.mu.Unlock()
		close(ch)
	}()
	s, err := m.d.Store.GetSession(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("load session: %w", err)
	}
	return m.recoverSession(ctx, s)
}

// settleLeftBehind recovers s now when its record names a sandbox that a
// stopped process left (leftBehindIn) and no one here serves: the recovery
// at start may not have got to it yet, and a call acting on it as it is
// would use a sandbox whose lease is no longer the session's. It returns
// the session as it is after; on a failure (logged; the sweeps try again),
// as it was.
func (m *Manager) settleLeftBehind(ctx context.Context, s *store.Session) *store.Session {
	if s.SandboxID == "" {
		return s
	}
	m.mu.Lock()
	_, turnHere := m.turns[s.Name]
	_, leaseHere := m.leases[s.Name]
	m.mu.Unlock()
	if turnHere || leaseHere {
		return s
	}
	resp, err := m.d.Sandboxes.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: s.SandboxID})
	if err != nil || !leftBehindIn(s, resp.GetSandbox()) {
		return s
	}
	if _, err := m.recoverOnce(ctx, s.Name); err != nil {
		m.log.WarnContext(ctx, "session left on a sandbox of a stopped process not recovered", "session", s.Name, "error", err)
		return s
	}
	if cur, err := m.d.Store.GetSession(ctx, s.Name); err == nil {
		return cur
	}
	return s
}

// settle takes what can be kept from a stopped process's session: a
// checkpoint of the sandbox it left behind (then released), and forgets the
// sandbox. It returns why the session is now suspended.
func (m *Manager) settle(ctx context.Context, s *store.Session, sb *sandboxv1.Sandbox, leftBehind bool) (string, error) {
	if sb != nil && (sb.GetLease().GetHolder() == holder(s.Name) || leftBehind) {
		token := sb.GetLease().GetFencingToken()
		m.mu.Lock()
		m.sandboxes[sb.GetId()] = sb
		m.mu.Unlock()
		// A turn's agent (its detached tool shells) may still write:
		// nothing may while the tree is captured.
		m.killProcesses(ctx, s.Name, sb.GetId(), token)
		cp, err := m.checkpoint(ctx, s, 0, "before_destroy", token)
		if err != nil {
			// Keep the sandbox leased: releasing it would lose the work.
			// Its lease runs out (nobody renews it) and the destroy hook
			// tries the checkpoint once more.
			return "", fmt.Errorf("checkpoint of the sandbox left behind: %w", err)
		}
		if _, err := m.clearSandbox(ctx, s.Name); err != nil {
			return "", err
		}
		m.releaseSandbox(ctx, s.Name, sb.GetId(), token, "")
		if leftBehind {
			return fmt.Sprintf(reasonLeftBehind, cp.GetId()), nil
		}
		return fmt.Sprintf("hangar stopped during %s: checkpointed (%s) and suspended", s.State, cp.GetId()), nil
	}
	if s.SandboxID != "" {
		if _, err := m.clearSandbox(ctx, s.Name); err != nil {
			return "", err
		}
	}
	cps, err := m.Checkpoints(ctx, s.Name)
	if err != nil || len(cps) == 0 {
		return reasonNoCheckpoint, nil
	}
	return fmt.Sprintf(reasonSandboxGone, cps[0].GetId()), nil
}

// endOrphanedTurns ends the session's turns that have no end: none runs
// (the caller checked there is no live turn hold). Each is "interrupted",
// with the usage the gateway counted for its run.
func (m *Manager) endOrphanedTurns(ctx context.Context, name string) error {
	turns, err := m.d.Store.ListTurns(ctx, name)
	if err != nil {
		return fmt.Errorf("turns: %w", err)
	}
	for _, t := range turns {
		if t.EndedAt != nil {
			continue
		}
		var usage *store.Usage
		if t.RunID != "" {
			if run, err := m.d.Gateway.GetRun(ctx, &gatewayv1.GetRunRequest{Run: t.RunID}); err == nil {
				u := usageFromGateway(run.GetRun().GetUsage())
				usage = &u
			}
			if _, err := m.d.Gateway.EndRun(ctx, &gatewayv1.EndRunRequest{Run: t.RunID}); err != nil {
				m.log.WarnContext(ctx, "gateway run not ended", "session", name, "run", t.RunID, "error", err)
			}
		}
		_, err := m.d.Store.UpdateTurn(ctx, name, t.Number, func(cur *store.Turn) error {
			if cur.EndedAt != nil {
				return nil
			}
			cur.Outcome, cur.OutcomeReason = store.OutcomeInterrupted, reasonTurnOrphaned
			if usage != nil {
				cur.Usage = *usage
			}
			end := m.now()
			cur.EndedAt = &end
			return nil
		})
		if err != nil {
			return fmt.Errorf("end turn %d: %w", t.Number, err)
		}
		m.events.publish(name)
		m.appendStoreEvents(ctx, name, []store.Event{{Turn: t.Number, Kind: store.EventError, Text: "turn " + fmt.Sprint(t.Number) + " interrupted: " + reasonTurnOrphaned}})
	}
	return nil
}

// recoverAtStart runs Recover until it succeeds for every session, a few
// times at most (at start the other services may not serve yet, and a
// session whose checkpoint fails is tried again by later sweeps).
func (m *Manager) recoverAtStart(ctx context.Context) {
	delay := 200 * time.Millisecond
	for try := 1; ; try++ {
		changed, err := m.Recover(ctx)
		if len(changed) > 0 {
			m.log.WarnContext(ctx, "sessions recovered after a restart", "sessions", changed)
		}
		if err == nil {
			return
		}
		if try == recoverTries {
			m.log.ErrorContext(ctx, "recovery incomplete; the idle sweep tries again", "error", err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// recoverTries bounds recoverAtStart: about half a minute of tries.
const recoverTries = 8
