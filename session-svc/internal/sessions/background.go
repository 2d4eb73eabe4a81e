package sessions

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"path"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// subscriber is this service's name for destroy notices.
const subscriber = "session-svc"

// Run runs the background work until ctx ends: the idle clock (suspend
// sessions idle past their idle time with nothing holding them), periodic
// checkpoints while something changes, and checkpoints before any of our
// sandboxes is destroyed. tick, when set, replaces the real ticker (tests
// drive the clock and the ticks themselves).
func (m *Manager) Run(ctx context.Context, tick <-chan time.Time) error {
	if tick == nil {
		ticker := time.NewTicker(m.cfg.ReapInterval)
		defer ticker.Stop()
		tick = ticker.C
	}
	stopBeat := m.runReplica(ctx)
	defer stopBeat()
	stopInterrupts := m.runInterrupts(ctx)
	defer stopInterrupts()
	m.recoverAtStart(ctx)
	// The hold table as found at start is this process's baseline: only
	// a loss after it starts a grace (holdsInDoubt).
	if _, err := m.d.Holds.Lost(ctx); err != nil {
		m.log.WarnContext(ctx, "hold table not checked", "error", err)
	}
	m.adoptJobs(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		defer logging.Recover(ctx, m.log, "destroy watch")
		m.watchDestroys(ctx)
	}()
	defer func() { <-watchDone }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			m.sweepGuarded(ctx)
		}
	}
}

// sweepGuarded is one sweep that a panic ends without ending the loop.
func (m *Manager) sweepGuarded(ctx context.Context) {
	defer logging.Recover(ctx, m.log, "idle sweep")
	m.Sweep(ctx)
}

// Sweep does one round of the idle clock and the periodic checkpoints.
func (m *Manager) Sweep(ctx context.Context) {
	m.recoverStuck(ctx)
	m.checkpointRunning(ctx)
	sessions, err := m.d.Store.ListSessionsByState(ctx, store.StateIdle, store.StateNeedsInput)
	if err != nil {
		m.log.WarnContext(ctx, "idle sweep could not list sessions", "error", err)
		return
	}
	now := m.now()
	for _, s := range sessions {
		if s.SandboxID == "" {
			continue
		}
		if m.sandboxGone(ctx, s) {
			// Its sandbox went without a destroy notice (a sandbox
			// service that crashed): suspend it from its checkpoint.
			if _, err := m.recoverOnce(ctx, s.Name); err != nil {
				m.log.WarnContext(ctx, "session with a gone sandbox not recovered", "session", s.Name, "error", err)
			}
			continue
		}
		// Up on a replica that died: keep its lease from here.
		m.adoptOrphan(ctx, s.Name, s.SandboxID, s.FencingToken)
		m.sweepSession(ctx, s, now)
	}
	m.adoptJobs(ctx)
}

// sweepSession is the idle clock's work on one up session, under its
// sweep lease (one replica at a time): an idle suspend, or a periodic
// checkpoint. The record is read again under the lease, so a session
// another replica's sweep just suspended is left alone.
func (m *Manager) sweepSession(ctx context.Context, s *store.Session, now time.Time) {
	release, ok := m.sweepLease(ctx, s.Name)
	if !ok {
		return
	}
	defer release()
	cur, err := m.d.Store.GetSession(ctx, s.Name)
	if err != nil || cur.SandboxID == "" || (cur.State != store.StateIdle && cur.State != store.StateNeedsInput) {
		return
	}
	at, err := m.SuspendAt(ctx, cur)
	if err != nil {
		m.log.WarnContext(ctx, "idle clock unreadable", "session", s.Name, "error", err)
		return
	}
	if !at.IsZero() && !now.Before(at) && !m.holdsInDoubt(ctx, now) {
		reason := fmt.Sprintf("idle for %d minutes", m.idleMinutes(cur))
		if _, err := m.Suspend(ctx, s.Name, reason); err != nil {
			m.log.WarnContext(ctx, "idle suspend failed", "session", s.Name, "error", err)
		}
		return
	}
	m.periodicCheckpoint(ctx, cur, now)
}

// holdGrace is how long the idle clock suspends nothing after the hold
// table was found lost (Redis restarted without its data): long enough for
// every holder renewing at least every few minutes (the CLI renews every
// 20 s; turns and jobs every LeaseTTL/3) to take its hold again, so a
// session in use is never suspended because Redis forgot it was held.
const holdGrace = 5 * time.Minute

// holdsInDoubt says an idle suspend must wait: the hold table is new
// (checked after the holds were read, so a Redis that restarted empty
// since is caught; a grace starts), it can't be checked, or a grace runs.
func (m *Manager) holdsInDoubt(ctx context.Context, now time.Time) bool {
	lost, err := m.d.Holds.Lost(ctx)
	if err != nil {
		m.log.WarnContext(ctx, "hold table unreadable: no idle suspends this sweep", "error", err)
		return true
	}
	if lost {
		until := now.Add(holdGrace)
		m.mu.Lock()
		m.holdGraceUntil = until
		m.mu.Unlock()
		m.log.WarnContext(ctx, "the hold table is new (Redis restarted without its data): no idle suspends until holders have taken their holds again", "until", until)
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return now.Before(m.holdGraceUntil)
}

// adoptJobs picks up the unfinished jobs no runner holds.
func (m *Manager) adoptJobs(ctx context.Context) {
	m.mu.Lock()
	js := m.jobs
	m.mu.Unlock()
	if js != nil {
		js.Adopt(ctx)
	}
}

// recoverStuck recovers the sessions a stopped process left running,
// resuming or suspending (recoverSession leaves the live ones alone).
func (m *Manager) recoverStuck(ctx context.Context) {
	stuck, err := m.d.Store.ListSessionsByState(ctx, store.StateRunning, store.StateResuming, store.StateSuspending)
	if err != nil {
		m.log.WarnContext(ctx, "idle sweep could not list sessions", "error", err)
		return
	}
	for _, s := range stuck {
		if _, err := m.recoverOnce(ctx, s.Name); err != nil {
			m.log.WarnContext(ctx, "stuck session not recovered", "session", s.Name, "state", s.State, "error", err)
		}
	}
}

// sandboxGone says the sandbox service no longer has s's sandbox, or has
// it for another holder (not said on errors: the sweep tries again).
func (m *Manager) sandboxGone(ctx context.Context, s *store.Session) bool {
	m.mu.Lock()
	_, here := m.leases[s.Name]
	m.mu.Unlock()
	if here {
		return false
	}
	_, err := m.d.Sandboxes.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: s.SandboxID})
	return status.Code(err) == codes.NotFound
}

// checkpointRunning takes the periodic checkpoints of sessions whose turn
// is running (a two-hour turn is checkpointed every CheckpointMinutes, not
// only at its end). The agent writes while the tree is read, so the
// checkpoint service drops a capture that saw the tree change; the next
// sweep tries again.
func (m *Manager) checkpointRunning(ctx context.Context) {
	running, err := m.d.Store.ListSessionsByState(ctx, store.StateRunning)
	if err != nil {
		m.log.WarnContext(ctx, "idle sweep could not list sessions", "error", err)
		return
	}
	now := m.now()
	for _, s := range running {
		if s.SandboxID == "" {
			continue
		}
		release, ok := m.sweepLease(ctx, s.Name)
		if !ok {
			continue
		}
		m.periodicCheckpointWith(ctx, s, now, true)
		release()
	}
}

// periodicCheckpoint checkpoints an up session every CheckpointMinutes; the
// checkpoint service reuses the previous checkpoint when nothing changed.
func (m *Manager) periodicCheckpoint(ctx context.Context, s *store.Session, now time.Time) {
	m.periodicCheckpointWith(ctx, s, now, false)
}

func (m *Manager) periodicCheckpointWith(ctx context.Context, s *store.Session, now time.Time, settled bool) {
	cps, err := m.Checkpoints(ctx, s.Name)
	if err != nil {
		return
	}
	if len(cps) > 0 && now.Sub(cps[0].GetCreatedAt().AsTime()) < time.Duration(m.cfg.CheckpointMinutes)*time.Minute {
		return
	}
	if _, err := m.checkpointWith(ctx, s, 0, "periodic", 0, settled); err != nil {
		if settled && status.Code(err) == codes.Aborted {
			m.log.InfoContext(ctx, "periodic checkpoint of a running turn dropped: the tree changed under it", "session", s.Name)
			return
		}
		m.log.WarnContext(ctx, "periodic checkpoint failed", "session", s.Name, "error", err)
	}
}

// watchDestroys subscribes to the sandbox service's destroy notices and
// checkpoints a session before its sandbox goes, whatever the reason
// (release, lease expiry, pool shrink, shutdown). It resubscribes until ctx
// ends.
func (m *Manager) watchDestroys(ctx context.Context) {
	for ctx.Err() == nil {
		stream, err := m.d.Sandboxes.WatchDestroys(ctx, &sandboxv1.WatchDestroysRequest{Subscriber: subscriber})
		if err == nil {
			for {
				resp, err := stream.Recv()
				if err != nil {
					break
				}
				m.onDestroy(ctx, resp.GetNotice())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// onDestroy handles one destroy notice, then acks it.
func (m *Manager) onDestroy(ctx context.Context, n *sandboxv1.DestroyNotice) {
	defer func() {
		if _, err := m.d.Sandboxes.AckDestroy(context.WithoutCancel(ctx), &sandboxv1.AckDestroyRequest{NoticeId: n.GetNoticeId(), Subscriber: subscriber}); err != nil {
			m.log.WarnContext(ctx, "destroy notice not acked", "sandbox", n.GetSandboxId(), "error", err)
		}
	}()
	name, ok := sessionOfHolder(n.GetHolder())
	if !ok {
		return
	}
	s, err := m.d.Store.GetSession(ctx, name)
	if err != nil || s.SandboxID != n.GetSandboxId() {
		// Not ours any more (we released it after our own checkpoint).
		return
	}
	deadline := n.GetDeadline().AsTime()
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	m.killProcesses(cctx, name, n.GetSandboxId(), n.GetFencingToken())
	if _, err := m.checkpoint(cctx, s, 0, "before_destroy", n.GetFencingToken()); err != nil {
		m.log.ErrorContext(ctx, "checkpoint before destroy failed", "session", name, "sandbox", n.GetSandboxId(), "error", err)
	}
	m.dropLease(name)
	if _, err := m.clearSandbox(ctx, name); err != nil {
		m.log.WarnContext(ctx, "sandbox not forgotten", "session", name, "error", err)
		return
	}
	m.mu.Lock()
	delete(m.sandboxes, n.GetSandboxId())
	running := m.turns[name] != nil
	m.mu.Unlock()
	if !running {
		reason := "sandbox destroyed (" + destroyReason(n.GetReason()) + ")"
		if _, err := m.transition(ctx, name, store.StateSuspended, reason, store.StateIdle, store.StateNeedsInput, store.StateFailed); err != nil && !errors.Is(err, context.Canceled) {
			m.log.WarnContext(ctx, "session not suspended after destroy", "session", name, "error", err)
		}
	}
}

func destroyReason(r sandboxv1.DestroyReason) string {
	switch r {
	case sandboxv1.DestroyReason_DESTROY_REASON_RELEASE:
		return "released"
	case sandboxv1.DestroyReason_DESTROY_REASON_LEASE_EXPIRED:
		return "lease expired"
	case sandboxv1.DestroyReason_DESTROY_REASON_POOL_SHRINK:
		return "pool shrink"
	case sandboxv1.DestroyReason_DESTROY_REASON_SHUTDOWN:
		return "shutdown"
	default:
		return "failed"
	}
}

func contentType(name string, content []byte) string {
	if t := mime.TypeByExtension(path.Ext(name)); t != "" {
		return t
	}
	return http.DetectContentType(content)
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
