package lease_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/lease"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/redistest"
)

func reasonOf(err error) string {
	var fe *fault.Error
	for e := err; e != nil; {
		if f, ok := e.(*fault.Error); ok {
			fe = f
			break
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	if fe == nil {
		return ""
	}
	return fe.Reason
}

// No resource is leased twice across 1,000 concurrent acquires.
func TestExclusiveUnderConcurrentAcquire(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		m := lease.New(b.Client, b.Prefix, time.Now)
		const acquirers, resources = 1000, 100
		winners := make([]atomic.Int32, resources)
		var won, lost atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range acquirers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r := i % resources // ten contenders per resource
				_, err := m.Acquire(context.Background(), fmt.Sprintf("sb-%d", r), fmt.Sprintf("h%d", i), time.Minute)
				switch {
				case err == nil:
					winners[r].Add(1)
					won.Add(1)
				case reasonOf(err) == lease.ReasonHeld:
					lost.Add(1)
				default:
					t.Errorf("acquire: %v", err)
				}
			}()
		}
		close(start)
		wg.Wait()
		for r := range winners {
			if n := winners[r].Load(); n != 1 {
				t.Errorf("sb-%d leased %d times", r, n)
			}
		}
		if won.Load() != resources || lost.Load() != acquirers-resources {
			t.Errorf("won %d lost %d", won.Load(), lost.Load())
		}
	})
}

// Under churn (acquire, use, release) no two holders overlap.
func TestExclusiveUnderChurn(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		m := lease.New(b.Client, b.Prefix, time.Now)
		const workers, resources = 1000, 250
		var busy [resources]atomic.Int32
		var lastToken [resources]atomic.Uint64
		var wg sync.WaitGroup
		for i := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := i % resources
				name := fmt.Sprintf("r%d", r)
				for {
					l, err := m.Acquire(context.Background(), name, "w", time.Minute)
					if err != nil {
						if reasonOf(err) != lease.ReasonHeld {
							t.Errorf("acquire: %v", err)
							return
						}
						runtime.Gosched()
						continue
					}
					if !busy[r].CompareAndSwap(0, 1) {
						t.Errorf("%s leased twice at once", name)
					}
					if prev := lastToken[r].Swap(l.Token); prev >= l.Token {
						t.Errorf("%s token went from %d to %d", name, prev, l.Token)
					}
					busy[r].Store(0)
					if _, err := m.Release(context.Background(), name, l.Token); err != nil {
						t.Errorf("release: %v", err)
					}
					return
				}
			}()
		}
		wg.Wait()
	})
}

func TestExpiryAndFencing(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		clock := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
		now := func() time.Time { return clock }
		m := lease.New(b.Client, b.Prefix, now)
		const ttl = 300 * time.Millisecond
		a, err := m.Acquire(ctx, "sb", "alice", ttl)
		if err != nil {
			t.Fatal(err)
		}
		if a.Token == 0 || !a.ExpiresAt.Equal(clock.Add(ttl)) || a.Holder != "alice" {
			t.Errorf("lease = %+v", a)
		}
		if _, err := m.Acquire(ctx, "sb", "bob", ttl); reasonOf(err) != lease.ReasonHeld || !fault.Is(err, fault.KindFailedPrecondition) {
			t.Errorf("second acquire: %v", err)
		}
		if _, err := m.Check(ctx, "sb", a.Token); err != nil {
			t.Errorf("check: %v", err)
		}
		if _, err := m.Check(ctx, "sb", a.Token-1); reasonOf(err) != lease.ReasonStaleToken {
			t.Errorf("check wrong token: %v", err)
		}
		r, err := m.Renew(ctx, "sb", a.Token, ttl)
		if err != nil || r.Holder != "alice" {
			t.Fatalf("renew: %+v %v", r, err)
		}

		b.Expire(t, b.Prefix+"lease:sb", ttl)

		for name, call := range map[string]func() error{
			"check":   func() error { _, err := m.Check(ctx, "sb", a.Token); return err },
			"renew":   func() error { _, err := m.Renew(ctx, "sb", a.Token, ttl); return err },
			"release": func() error { _, err := m.Release(ctx, "sb", a.Token); return err },
		} {
			if err := call(); !fault.Is(err, fault.KindFailedPrecondition) || reasonOf(err) != lease.ReasonExpired {
				t.Errorf("%s after expiry: %v", name, err)
			}
		}
		bl, err := m.Acquire(ctx, "sb", "bob", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if bl.Token <= a.Token {
			t.Errorf("new token %d not above old %d", bl.Token, a.Token)
		}
		if _, err := m.Renew(ctx, "sb", a.Token, ttl); reasonOf(err) != lease.ReasonStaleToken {
			t.Errorf("renew with the expired lease's token: %v", err)
		}
		if _, err := m.Release(ctx, "sb", a.Token); reasonOf(err) != lease.ReasonStaleToken {
			t.Errorf("release with a stale token: %v", err)
		}
		got, ok, err := m.Get(ctx, "sb")
		if err != nil || !ok || got.Holder != "bob" || got.Token != bl.Token {
			t.Errorf("get = %+v %v %v", got, ok, err)
		}
		if _, err := m.Release(ctx, "sb", bl.Token); err != nil {
			t.Fatal(err)
		}
		if _, ok, _ := m.Get(ctx, "sb"); ok {
			t.Error("lease present after release")
		}
		// The counter does not stay forever; once it has gone, tokens
		// still go up.
		fence := b.Prefix + "fence:sb"
		if left, err := b.Client.PTTL(ctx, fence).Result(); err != nil || left <= 0 || left > lease.FenceTTL {
			t.Fatalf("fence counter TTL = %v, %v; want at most %v", left, err, lease.FenceTTL)
		}
		if b.Mini != nil {
			b.Expire(t, fence, lease.FenceTTL)
		} else if err := b.Client.Del(ctx, fence).Err(); err != nil { // a day's wait, on a real server
			t.Fatal(err)
		}
		clock = clock.Add(lease.FenceTTL)
		cl, err := m.Acquire(ctx, "sb", "carol", ttl)
		if err != nil {
			t.Fatal(err)
		}
		if cl.Token <= bl.Token {
			t.Errorf("token after the counter expired %d not above %d", cl.Token, bl.Token)
		}
	})
}

func TestSingleton(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		m := lease.New(b.Client, b.Prefix, time.Now)
		const ttl = 200 * time.Millisecond
		r1, r2 := m.Singleton("refill:web", "replica-1", ttl), m.Singleton("refill:web", "replica-2", ttl)
		mustHold := func(s *lease.Singleton, want bool) {
			t.Helper()
			got, err := s.Hold(ctx)
			if err != nil || got != want {
				t.Fatalf("Hold = %v, %v; want %v", got, err, want)
			}
		}
		mustHold(r1, true)
		mustHold(r2, false)
		mustHold(r1, true)
		b.Expire(t, b.Prefix+"lease:singleton:refill:web", ttl)
		mustHold(r2, true)
		mustHold(r1, false)
		if err := r2.Release(ctx); err != nil {
			t.Fatal(err)
		}
		mustHold(r1, true)
	})
}

// Redis restarts empty in the middle of a lease: the old holder is refused
// and the new lease gets a higher token; never two valid holders.
func TestRedisRestartMidLease(t *testing.T) {
	srv := redistest.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	m := lease.New(c, "hangar:sandbox:", time.Now)
	a, err := m.Acquire(ctx, "sb-1", "alice", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	srv.Restart(t)

	// Calls during and right after the restart fail or are refused; they
	// never succeed for the old holder.
	var lastErr error
	redistestWait(t, func() bool {
		_, lastErr = m.Check(ctx, "sb-1", a.Token)
		return !fault.Is(lastErr, fault.KindUnavailable)
	})
	if !fault.Is(lastErr, fault.KindFailedPrecondition) {
		t.Fatalf("old holder after restart: %v", lastErr)
	}
	if _, err := m.Renew(ctx, "sb-1", a.Token, time.Minute); !fault.Is(err, fault.KindFailedPrecondition) {
		t.Errorf("old holder renew after restart: %v", err)
	}
	bl, err := m.Acquire(ctx, "sb-1", "bob", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if bl.Token <= a.Token {
		t.Errorf("token after restart %d is not above %d", bl.Token, a.Token)
	}
	if _, err := m.Check(ctx, "sb-1", a.Token); reasonOf(err) != lease.ReasonStaleToken {
		t.Errorf("old token after the new lease: %v", err)
	}
	if _, err := m.Check(ctx, "sb-1", bl.Token); err != nil {
		t.Errorf("new holder: %v", err)
	}
}

func redistestWait(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		<-time.After(5 * time.Millisecond)
	}
}

// A lease Redis lost (its keys gone, as after a restart without data) is
// put back with its token and holder by the resource's owner; the counter
// is raised to the token, so the next lease gets a higher one; a lease
// another holder has now is never overwritten, and one past its term is
// not put back.
func TestRestore(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		m := lease.New(b.Client, b.Prefix, time.Now)
		l, err := m.Acquire(ctx, "sb-r", "session/a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		b.Client.Del(ctx, b.Prefix+"lease:sb-r", b.Prefix+"fence:sb-r")
		if _, err := m.Check(ctx, "sb-r", l.Token); reasonOf(err) != lease.ReasonExpired {
			t.Fatalf("check of a lost lease: %v", err)
		}
		if ok, err := m.Restore(ctx, l); err != nil || !ok {
			t.Fatalf("Restore = %v, %v", ok, err)
		}
		got, err := m.Check(ctx, "sb-r", l.Token)
		if err != nil || got.Holder != "session/a" {
			t.Fatalf("check after restore: %v, %v", got, err)
		}
		if ok, err := m.Restore(ctx, l); err != nil || ok {
			t.Fatalf("Restore over a live lease = %v, %v; want false", ok, err)
		}
		if _, err := m.Release(ctx, "sb-r", l.Token); err != nil {
			t.Fatal(err)
		}
		next, err := m.Acquire(ctx, "sb-r", "session/b", time.Minute)
		if err != nil || next.Token <= l.Token {
			t.Fatalf("next lease %v, %v: want a token above %d", next, err, l.Token)
		}
		if ok, _ := m.Restore(ctx, l); ok {
			t.Fatal("a lost lease was put back over another holder's")
		}
		old := l
		old.ExpiresAt = time.Now().Add(-time.Second)
		if _, err := m.Release(ctx, "sb-r", next.Token); err != nil {
			t.Fatal(err)
		}
		if ok, _ := m.Restore(ctx, old); ok {
			t.Fatal("a lease past its term was put back")
		}
	})
}
