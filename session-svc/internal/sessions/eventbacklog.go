package sessions

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// A session database that is down (a restart, a failover) must not lose
// what the agent does meanwhile: the turn goes on, and its events (tool
// calls, output, text, usage) are kept in memory, in order, and written
// once the database answers again. A session's new events wait behind its
// kept ones, so its log stays in order; their times are when they
// happened. What is kept is bounded (maxEventBacklog); a process that
// stops before the database is back loses what it kept (logged).

// maxEventBacklog bounds the events kept while the database is down.
const maxEventBacklog = 20000

// eventBacklog holds the events not yet written, by session.
type eventBacklog struct {
	mu       sync.Mutex
	pending  map[string][]store.Event
	order    []string // sessions with pending events, in the order they first had some
	count    int
	dropped  int
	flushing bool
}

// appendStoreEvents records events of a session: written now, or kept
// (behind the session's kept ones) while the database is unreachable.
func (m *Manager) appendStoreEvents(ctx context.Context, name string, evs []store.Event) {
	if len(evs) == 0 {
		return
	}
	now := m.now()
	for i := range evs {
		evs[i].Session = name
		if evs[i].Time.IsZero() {
			evs[i].Time = now
		}
	}
	if m.keepBehind(name, evs) {
		return
	}
	_, err := m.d.Store.AppendEvents(ctx, name, evs)
	if err == nil {
		m.events.publish(name)
		return
	}
	if refused(ctx, err) {
		m.log.WarnContext(ctx, "events not recorded", "session", name, "error", err)
		return
	}
	// Kept even when the database answers a ping by now: it may have come
	// back since the write failed. The writer gives up on a write that
	// fails while it answers (writeTries).
	m.log.WarnContext(ctx, "events not written (session database unreachable?): kept to be written again", "session", name, "events", len(evs), "error", err)
	m.keep(name, evs)
}

// keepBehind keeps evs when the session has events waiting already (they
// go first); false when it has none.
func (m *Manager) keepBehind(name string, evs []store.Event) bool {
	b := &m.backlog
	b.mu.Lock()
	waiting := len(b.pending[name]) > 0
	b.mu.Unlock()
	if waiting {
		m.keep(name, evs)
	}
	return waiting
}

// keep adds evs to the session's kept events and starts the writer.
func (m *Manager) keep(name string, evs []store.Event) {
	b := &m.backlog
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pending == nil {
		b.pending = map[string][]store.Event{}
	}
	room := maxEventBacklog - b.count
	if room < len(evs) {
		b.dropped += len(evs) - max(room, 0)
		evs = evs[:max(room, 0)]
	}
	if len(evs) == 0 {
		m.log.Error("session database unreachable and too many events kept: events dropped", "session", name, "dropped_so_far", b.dropped)
		return
	}
	if len(b.pending[name]) == 0 {
		b.order = append(b.order, name)
	}
	b.pending[name] = append(b.pending[name], evs...)
	b.count += len(evs)
	if !b.flushing {
		b.flushing = true
		go m.flushBacklog()
	}
}

// flushBacklog writes the kept events once the database answers, session
// by session in the order they were kept, backing off up to 5 s between
// tries. It ends when none is left, or with the Manager (the rest is
// lost, and said).
func (m *Manager) flushBacklog() {
	ctx := m.background
	defer logging.Recover(ctx, m.log, "event backlog")
	b := &m.backlog
	delay := 100 * time.Millisecond
	failsWhileUp := 0
	for {
		b.mu.Lock()
		if len(b.order) == 0 {
			b.flushing = false
			b.mu.Unlock()
			return
		}
		name := b.order[0]
		evs := append([]store.Event(nil), b.pending[name]...)
		b.mu.Unlock()

		_, err := m.d.Store.AppendEvents(ctx, name, evs)
		if err != nil && !refused(ctx, err) && m.d.Store.Ping(ctx) == nil {
			failsWhileUp++
		}
		switch {
		case err == nil, refused(ctx, err), failsWhileUp >= writeTries:
			if err != nil {
				m.log.WarnContext(ctx, "kept events not recorded", "session", name, "events", len(evs), "error", err)
			} else {
				m.log.InfoContext(ctx, "kept events recorded", "session", name, "events", len(evs))
			}
			b.mu.Lock()
			rest := b.pending[name][len(evs):]
			b.count -= len(evs)
			if len(rest) == 0 {
				delete(b.pending, name)
				b.order = b.order[1:]
			} else {
				b.pending[name] = rest
			}
			b.mu.Unlock()
			if err == nil {
				m.events.publish(name)
			}
			delay, failsWhileUp = 100*time.Millisecond, 0
			continue
		}
		select {
		case <-ctx.Done():
			b.mu.Lock()
			lost := b.count
			b.flushing = false
			b.mu.Unlock()
			m.log.Error("stopped with events kept while the session database was unreachable: they are lost", "events", lost)
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// writeTries is how many times the writer tries kept events that fail
// while the database answers a ping, before it gives them up.
const writeTries = 5

// refused says err is the store refusing the write itself (a hangar error:
// the session is gone, a conflict, no space), or the caller gone: trying
// again would not help.
func refused(ctx context.Context, err error) bool {
	var he *fault.Error
	return errors.As(err, &he) || errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrConflict) || ctx.Err() != nil
}

// keptEvents is how many events wait for the database.
func (m *Manager) keptEvents() int {
	m.backlog.mu.Lock()
	defer m.backlog.mu.Unlock()
	return m.backlog.count
}
