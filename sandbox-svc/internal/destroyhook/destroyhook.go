// Package destroyhook tells subscribers (the session service) that a
// sandbox is about to be destroyed and waits, bounded by a deadline, until
// each has acknowledged, so they can checkpoint first.
package destroyhook

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"github.com/hangar-dev/hangar/platform/fault"
)

// Reason is why a sandbox is destroyed.
type Reason int

// Reasons, as in the API's DestroyReason.
const (
	ReasonUnspecified Reason = iota
	ReasonRelease
	ReasonLeaseExpired
	ReasonPoolShrink
	ReasonShutdown
	ReasonFailed
)

// Notice announces one destruction.
type Notice struct {
	ID          string
	SandboxID   string
	Environment string
	Holder      string
	Reason      Reason
	Deadline    time.Time
	// Token lets subscribers use the sandbox until the deadline.
	Token uint64
}

// DefaultTimeout bounds the wait for acks: a checkpoint of a typical work
// tree takes a few seconds.
const DefaultTimeout = 30 * time.Second

// Hub fans notices out to subscribers and collects acks.
type Hub struct {
	now     func() time.Time
	timeout time.Duration

	mu      sync.Mutex
	subs    map[*sub]struct{}
	pending map[string]*pending
}

type sub struct {
	name string
	ch   chan Notice
}

type pending struct {
	waiting map[string]bool // subscriber name → still waiting
	done    chan struct{}
}

// NewHub returns a hub; timeout bounds each wait (DefaultTimeout when 0).
func NewHub(now func() time.Time, timeout time.Duration) *Hub {
	if now == nil {
		now = time.Now
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &Hub{now: now, timeout: timeout, subs: map[*sub]struct{}{}, pending: map[string]*pending{}}
}

// Subscribe registers a subscriber stream. Notices arrive on the channel
// until cancel is called. A subscriber that goes away no longer holds up
// destruction.
func (h *Hub) Subscribe(name string) (<-chan Notice, func()) {
	s := &sub{name: name, ch: make(chan Notice, 64)}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	return s.ch, func() {
		h.mu.Lock()
		delete(h.subs, s)
		for id, p := range h.pending {
			if !h.hasName(name) {
				h.ackLocked(id, p, name)
			}
		}
		h.mu.Unlock()
	}
}

func (h *Hub) hasName(name string) bool {
	for s := range h.subs {
		if s.name == name {
			return true
		}
	}
	return false
}

// Subscribers returns the number of subscriber streams.
func (h *Hub) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// Notify sends n to every subscriber and waits until each subscriber name
// acked, went away, or the deadline passed. It fills n.ID and n.Deadline.
// It reports whether every subscriber acked in time.
func (h *Hub) Notify(ctx context.Context, n Notice) (Notice, bool) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	n.ID = "dn-" + hex.EncodeToString(b[:])
	n.Deadline = h.now().Add(h.timeout)
	p := &pending{waiting: map[string]bool{}, done: make(chan struct{})}
	h.mu.Lock()
	var targets []*sub
	for s := range h.subs {
		targets = append(targets, s)
		p.waiting[s.name] = true
	}
	if len(p.waiting) == 0 {
		h.mu.Unlock()
		return n, true
	}
	h.pending[n.ID] = p
	h.mu.Unlock()
	for _, s := range targets {
		select {
		case s.ch <- n:
		default: // a subscriber 64 notices behind is not waited for
			h.Ack(n.ID, s.name)
		}
	}
	timer := time.NewTimer(h.timeout)
	defer timer.Stop()
	acked := true
	select {
	case <-p.done:
	case <-timer.C:
		acked = false
	case <-ctx.Done():
		acked = false
	}
	h.mu.Lock()
	delete(h.pending, n.ID)
	h.mu.Unlock()
	return n, acked
}

// Ack records that subscriber is done with the notice.
func (h *Hub) Ack(noticeID, subscriber string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	p, ok := h.pending[noticeID]
	if !ok {
		return fault.NotFound("DESTROY_NOTICE_NOT_FOUND", "destroy notice %q not found (already done or expired)", noticeID)
	}
	if _, ok := p.waiting[subscriber]; !ok {
		return fault.NotFound("SUBSCRIBER_NOT_FOUND", "subscriber %q was not sent notice %q", subscriber, noticeID)
	}
	h.ackLocked(noticeID, p, subscriber)
	return nil
}

func (h *Hub) ackLocked(id string, p *pending, name string) {
	if !p.waiting[name] {
		return
	}
	p.waiting[name] = false
	for _, w := range p.waiting {
		if w {
			return
		}
	}
	close(p.done)
}
