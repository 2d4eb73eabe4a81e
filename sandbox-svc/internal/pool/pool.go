// Package pool keeps a warm pool of ready sandboxes for one environment:
// it refills in the background at a bounded rate, counts creates in flight
// so it never makes more than its target, hands out only ready sandboxes
// and counts hits and misses. A sandbox taken from the pool never comes
// back: whoever took it destroys it.
package pool

import (
	"context"
	"sync"

	"golang.org/x/time/rate"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// Limiter paces creates; *rate.Limiter implements it.
type Limiter interface {
	Wait(ctx context.Context) error
}

// Refill pacing. Measured on the 2-core CI machine (BenchmarkAcquire in
// internal/server, a generated repository of 5,000 files / 100 MB): a local
// create (clone with hardlinks, checkout) takes 2.0 s on a quiet machine and
// 4.2 s when other builds share it, mostly one core of checkout; a
// one-file repository takes ~25 ms. So:
//   - DefaultMaxInFlight: one create at a time per environment, so refill
//     of a large repository holds at most one of the two cores and an
//     acquire's cold create (the pool is empty) gets the other;
//   - DefaultRate/DefaultBurst: at most one create every 2 s, so a pool of
//     small sandboxes refills in ~2 s per sandbox instead of a burst of
//     clones, and a large one is bounded by MaxInFlight (2-4 s a create)
//     rather than piling up behind the limiter.
//
// The earlier default (1/s, burst 2, no in-flight bound) let four 100 MB
// creates overlap on two cores.
const (
	DefaultRate        = rate.Limit(0.5)
	DefaultBurst       = 1
	DefaultMaxInFlight = 1
)

// Options configure a pool.
type Options struct {
	Environment string
	Target      int
	// Create makes one ready sandbox.
	Create func(ctx context.Context) (driver.Sandbox, error)
	// Discard destroys a sandbox the pool no longer wants (shrink,
	// shutdown) with the given reason, running the destroy hooks.
	Discard func(ctx context.Context, sb driver.Sandbox, shutdown bool)
	// Limiter paces creates; DefaultRate/DefaultBurst when nil.
	Limiter Limiter
	// MaxInFlight bounds creates running at once (0: only the limiter and
	// the target bound them). The server uses DefaultMaxInFlight.
	MaxInFlight int
	// Gate, when set, is asked before each refill round (a singleton lease
	// when pool state is shared between replicas).
	Gate func(ctx context.Context) bool
	// OnError hears about failed creates.
	OnError func(err error)
}

// Stats is a pool's state.
type Stats struct {
	Environment string
	Target      int
	Ready       int
	Creating    int
	Hits        int64
	Misses      int64
	Failures    int64
}

// Pool is one environment's warm pool.
type Pool struct {
	opts Options

	mu       sync.Mutex
	target   int
	ready    []driver.Sandbox
	creating int
	hits     int64
	misses   int64
	failures int64
	closed   bool

	wake   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns a pool; Start begins refilling.
func New(opts Options) *Pool {
	if opts.Limiter == nil {
		opts.Limiter = rate.NewLimiter(DefaultRate, DefaultBurst)
	}
	return &Pool{opts: opts, target: max(opts.Target, 0), wake: make(chan struct{}, 1)}
}

// Start runs the refill loop until Close.
func (p *Pool) Start(ctx context.Context) {
	ctx, p.cancel = context.WithCancel(ctx)
	p.wg.Add(1)
	go p.loop(ctx)
}

func (p *Pool) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *Pool) need() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.needLocked()
}

// needLocked is how many creates may start now.
func (p *Pool) needLocked() int {
	if p.closed {
		return 0
	}
	n := p.target - len(p.ready) - p.creating
	if m := p.opts.MaxInFlight; m > 0 {
		n = min(n, m-p.creating)
	}
	return n
}

func (p *Pool) loop(ctx context.Context) {
	defer p.wg.Done()
	for {
		if p.need() <= 0 || (p.opts.Gate != nil && !p.opts.Gate(ctx)) {
			select {
			case <-p.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		if err := p.opts.Limiter.Wait(ctx); err != nil {
			return
		}
		p.mu.Lock()
		if p.needLocked() <= 0 {
			p.mu.Unlock()
			continue
		}
		p.creating++
		p.mu.Unlock()
		p.wg.Add(1)
		go p.createOne(ctx)
	}
}

func (p *Pool) createOne(ctx context.Context) {
	defer p.wg.Done()
	sb, err := p.opts.Create(ctx)
	p.mu.Lock()
	p.creating--
	if err != nil {
		p.failures++
		p.mu.Unlock()
		if p.opts.OnError != nil && ctx.Err() == nil {
			p.opts.OnError(err)
		}
		p.signal()
		return
	}
	if p.closed || len(p.ready) >= p.target {
		shutdown := p.closed
		p.mu.Unlock()
		p.opts.Discard(context.WithoutCancel(ctx), sb, shutdown)
		p.signal()
		return
	}
	p.ready = append(p.ready, sb)
	p.mu.Unlock()
	p.signal()
}

// Take returns the oldest ready sandbox (a hit) or false (a miss: the
// caller creates one cold).
func (p *Pool) Take() (driver.Sandbox, bool) {
	p.mu.Lock()
	defer p.signal()
	defer p.mu.Unlock()
	if len(p.ready) == 0 || p.closed {
		p.misses++
		return nil, false
	}
	sb := p.ready[0]
	p.ready = p.ready[1:]
	p.hits++
	return sb, true
}

// SetTarget changes the pool size; ready sandboxes over it are discarded.
func (p *Pool) SetTarget(ctx context.Context, n int) {
	p.mu.Lock()
	p.target = max(n, 0)
	var extra []driver.Sandbox
	if over := len(p.ready) - p.target; over > 0 {
		extra = append(extra, p.ready[len(p.ready)-over:]...)
		p.ready = p.ready[:len(p.ready)-over]
	}
	p.mu.Unlock()
	for _, sb := range extra {
		p.opts.Discard(ctx, sb, false)
	}
	p.signal()
}

// Stats returns the pool's state.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Environment: p.opts.Environment, Target: p.target, Ready: len(p.ready), Creating: p.creating,
		Hits: p.hits, Misses: p.misses, Failures: p.failures}
}

// Ready lists the ready sandboxes (for listing; they stay in the pool).
func (p *Pool) Ready() []driver.Sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]driver.Sandbox(nil), p.ready...)
}

// Close stops refilling, waits for creates in flight and discards every
// ready sandbox (shutdown when shutdown is true, else pool shrink).
func (p *Pool) Close(ctx context.Context, shutdown bool) {
	p.mu.Lock()
	p.closed = true
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
	for _, sb := range ready {
		p.opts.Discard(ctx, sb, shutdown)
	}
}
