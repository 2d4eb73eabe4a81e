package pool_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/pool"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fakeSandbox struct {
	driver.Sandbox
	id int
}

// tokens is a Limiter fed by the test: each Wait takes one token.
type tokens chan struct{}

func (t tokens) Wait(ctx context.Context) error {
	select {
	case <-t:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

type harness struct {
	mu        sync.Mutex
	created   atomic.Int32
	inFlight  atomic.Int32
	maxFlight atomic.Int32
	release   chan struct{} // each create waits for one
	discarded []string
	fail      atomic.Bool
}

func (h *harness) create(ctx context.Context) (driver.Sandbox, error) {
	n := h.inFlight.Add(1)
	defer h.inFlight.Add(-1)
	for {
		m := h.maxFlight.Load()
		if n <= m || h.maxFlight.CompareAndSwap(m, n) {
			break
		}
	}
	select {
	case <-h.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if h.fail.Load() {
		return nil, errors.New("clone failed")
	}
	return &fakeSandbox{id: int(h.created.Add(1))}, nil
}

func (h *harness) discard(_ context.Context, sb driver.Sandbox, shutdown bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if shutdown {
		h.discarded = append(h.discarded, "shutdown")
	} else {
		h.discarded = append(h.discarded, "shrink")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-time.After(time.Millisecond)
	}
}

func TestRefillBoundedAndNeverOverCreates(t *testing.T) {
	h := &harness{release: make(chan struct{})}
	lim := make(tokens, 100)
	p := pool.New(pool.Options{Environment: "web", Target: 3, Create: h.create, Discard: h.discard, Limiter: lim})
	p.Start(context.Background())
	defer p.Close(context.Background(), true)

	// Two tokens: exactly two creates start, however long they take.
	lim <- struct{}{}
	lim <- struct{}{}
	waitFor(t, "two creates in flight", func() bool { return p.Stats().Creating == 2 })
	if len(lim) != 0 {
		t.Fatal("tokens left over")
	}
	// A miss while they are in flight does not make the pool over-create.
	if _, ok := p.Take(); ok {
		t.Fatal("Take returned a sandbox that is still being created")
	}
	for range 10 {
		lim <- struct{}{}
	}
	// Wait for the creates themselves, not the pool's count: the pool counts
	// a create before its goroutine calls Create.
	waitFor(t, "three in flight", func() bool { return p.Stats().Creating == 3 && h.inFlight.Load() == 3 })
	// Let them finish one at a time, so which is oldest is known: the
	// sandbox with id 1.
	for i := range 3 {
		h.release <- struct{}{}
		waitFor(t, "one more ready", func() bool { return p.Stats().Ready == i+1 })
	}
	close(h.release) // later creates (the refill) go through at once
	waitFor(t, "three ready", func() bool { s := p.Stats(); return s.Ready == 3 && s.Creating == 0 })
	if got := h.maxFlight.Load(); got != 3 {
		t.Errorf("max creates in flight = %d, want 3", got)
	}
	if h.created.Load() != 3 {
		t.Errorf("created %d, want 3", h.created.Load())
	}

	sb, ok := p.Take()
	if !ok || sb.(*fakeSandbox).id != 1 {
		t.Fatalf("Take = %v %v, want the oldest", sb, ok)
	}
	waitFor(t, "refill after a take", func() bool { return p.Stats().Ready == 3 })
	s := p.Stats()
	if s.Hits != 1 || s.Misses != 1 || h.created.Load() != 4 {
		t.Errorf("stats %+v created %d", s, h.created.Load())
	}

	p.SetTarget(context.Background(), 1)
	if s := p.Stats(); s.Ready != 1 {
		t.Errorf("after shrink: %+v", s)
	}
	h.mu.Lock()
	if len(h.discarded) != 2 || h.discarded[0] != "shrink" {
		t.Errorf("discarded %v", h.discarded)
	}
	h.mu.Unlock()
}

func TestConcurrentTakesHandOutEachOnce(t *testing.T) {
	h := &harness{release: make(chan struct{})}
	close(h.release)
	lim := make(tokens, 1000)
	for range 1000 {
		lim <- struct{}{}
	}
	p := pool.New(pool.Options{Environment: "web", Target: 20, Create: h.create, Discard: h.discard, Limiter: lim})
	p.Start(context.Background())
	waitFor(t, "full pool", func() bool { return p.Stats().Ready == 20 })
	var seen sync.Map
	var wg sync.WaitGroup
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sb, ok := p.Take(); ok {
				if _, dup := seen.LoadOrStore(sb.(*fakeSandbox).id, true); dup {
					t.Errorf("sandbox %d handed out twice", sb.(*fakeSandbox).id)
				}
			}
		}()
	}
	wg.Wait()
	s := p.Stats()
	if s.Hits+s.Misses != 200 || s.Hits < 20 {
		t.Errorf("stats %+v", s)
	}
	p.Close(context.Background(), true)
	if st := p.Stats(); st.Ready != 0 || st.Creating != 0 {
		t.Errorf("after close %+v", st)
	}
}

func TestFailedCreatesAreCountedAndRetried(t *testing.T) {
	h := &harness{release: make(chan struct{})}
	close(h.release)
	h.fail.Store(true)
	lim := make(tokens, 10)
	var errs atomic.Int32
	p := pool.New(pool.Options{Environment: "web", Target: 1, Create: h.create, Discard: h.discard, Limiter: lim,
		OnError: func(error) { errs.Add(1) }})
	p.Start(context.Background())
	defer p.Close(context.Background(), true)
	lim <- struct{}{}
	lim <- struct{}{}
	waitFor(t, "two failures", func() bool { return p.Stats().Failures == 2 })
	h.fail.Store(false)
	lim <- struct{}{}
	waitFor(t, "ready", func() bool { return p.Stats().Ready == 1 })
	if errs.Load() != 2 {
		t.Errorf("OnError called %d times", errs.Load())
	}
}

// MaxInFlight bounds creates running at once even with tokens to spare.
func TestMaxInFlight(t *testing.T) {
	h := &harness{release: make(chan struct{})}
	lim := make(tokens, 100)
	for range 100 {
		lim <- struct{}{}
	}
	p := pool.New(pool.Options{Environment: "web", Target: 3, MaxInFlight: 1, Create: h.create, Discard: h.discard, Limiter: lim})
	p.Start(context.Background())
	defer p.Close(context.Background(), true)
	for i := 1; i <= 3; i++ {
		waitFor(t, "one create in flight", func() bool { return h.inFlight.Load() == 1 })
		h.release <- struct{}{}
		waitFor(t, "one more ready", func() bool { return p.Stats().Ready == i })
	}
	if got := h.maxFlight.Load(); got != 1 {
		t.Errorf("max creates in flight = %d, want 1", got)
	}
}
