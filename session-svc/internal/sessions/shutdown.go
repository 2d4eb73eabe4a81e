package sessions

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// errShutdown is the cause a turn is cancelled with when the service stops.
var errShutdown = errors.New("hangar is shutting down")

// reasonShutdown is the state reason of a session suspended by a shutdown.
const reasonShutdown = "hangar shut down: checkpointed and suspended; the next message resumes it"

// reasonTurnShutdown is the outcome reason of a turn a drain ended.
const reasonTurnShutdown = "hangar shut down during the turn: the work so far is checkpointed; send again to continue"

// drainParallel bounds the sessions suspended at once while draining: each
// suspend is a checkpoint (a git probe and writes) and a sandbox release.
const drainParallel = 4

// refuseWhileDraining says no to new work once Drain has begun.
func (m *Manager) refuseWhileDraining() error {
	if m.draining.Load() {
		return fault.Unavailable("SHUTTING_DOWN", "hangar is shutting down: try again once it is back up (your sessions are checkpointed and suspended)")
	}
	return nil
}

// Drain is the first step of a graceful stop, before the service stops
// serving: new turns, opens and forks are refused; every running turn ends
// "interrupted" with a checkpoint; then every session whose sandbox this
// process keeps is checkpointed and suspended, its sandbox released. What
// ctx allows is done; the error names the sessions left as they were (a
// failed suspend keeps the sandbox: releasing it would lose work).
func (m *Manager) Drain(ctx context.Context) error {
	m.draining.Store(true)
	m.mu.Lock()
	running := make([]*activeTurn, 0, len(m.turns))
	for _, at := range m.turns {
		running = append(running, at)
	}
	m.mu.Unlock()
	for _, at := range running {
		at.cancel(errShutdown)
	}
	for _, at := range running {
		select {
		case <-at.done:
		case <-ctx.Done():
			return fmt.Errorf("drain: turns still running: %w", ctx.Err())
		}
	}

	// A boot that was under way when the drain began records its sandbox
	// after the first pass: look again until nothing is left.
	var failed []string
	for pass := 0; pass < 3; pass++ {
		names := m.keptSessions()
		if len(names) == 0 {
			break
		}
		failed = m.suspendAll(ctx, names)
		if ctx.Err() != nil {
			break
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("drain: sessions not suspended: %v", failed)
	}
	return nil
}

// keptSessions are the sessions whose sandbox lease this process renews.
func (m *Manager) keptSessions() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := make([]string, 0, len(m.leases))
	for name := range m.leases {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// suspendAll suspends the named sessions, drainParallel at a time, and
// returns those it could not.
func (m *Manager) suspendAll(ctx context.Context, names []string) []string {
	var (
		mu     sync.Mutex
		failed []string
		wg     sync.WaitGroup
	)
	slots := make(chan struct{}, drainParallel)
	for _, name := range names {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			if err := m.suspendForShutdown(ctx, name); err != nil {
				m.log.ErrorContext(ctx, "session not suspended at shutdown", "session", name, "error", err)
				mu.Lock()
				failed = append(failed, name)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(failed)
	return failed
}

// suspendForShutdown suspends one session; a session whose record no
// longer names a sandbox only has its lease renewal stopped.
func (m *Manager) suspendForShutdown(ctx context.Context, name string) error {
	s, err := m.d.Store.GetSession(ctx, name)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if s == nil || s.SandboxID == "" {
		m.dropLease(name)
		return nil
	}
	if s.State == store.StateSuspending {
		// A suspend already under way (a request this process serves):
		// let it finish, and suspend again only if it failed.
		if s, err = m.waitWhileSuspending(ctx, name); err != nil {
			return err
		}
		if s.State == store.StateSuspended || s.SandboxID == "" {
			return nil
		}
	}
	_, err = m.Suspend(ctx, name, reasonShutdown)
	return err
}

// waitWhileSuspending waits until a session is no longer suspending.
func (m *Manager) waitWhileSuspending(ctx context.Context, name string) (*store.Session, error) {
	wake, stop := m.events.subscribe(name)
	defer stop()
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		s, err := m.get(ctx, name)
		if err != nil || s.State != store.StateSuspending {
			return s, err
		}
		select {
		case <-wake:
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
