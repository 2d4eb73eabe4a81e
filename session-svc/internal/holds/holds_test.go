package holds_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hangar-dev/hangar/session-svc/internal/holds"
)

// realRedis is the machine's Redis; each test uses its own key prefix.
const realRedis = "127.0.0.1:6379"

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock {
	return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type backend struct {
	client *redis.Client
	prefix string
}

// backends runs body against the real Redis and an embedded miniredis.
func backends(t *testing.T, body func(t *testing.T, b backend)) {
	t.Helper()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		client := redis.NewClient(&redis.Options{Addr: realRedis})
		t.Cleanup(func() { _ = client.Close() })
		if err := client.Ping(t.Context()).Err(); err != nil {
			t.Skipf("no Redis at %s: %v", realRedis, err)
		}
		var raw [6]byte
		_, _ = rand.Read(raw[:])
		prefix := "test:holds:" + hex.EncodeToString(raw[:]) + ":"
		t.Cleanup(func() {
			ctx := context.Background()
			iter := client.Scan(ctx, 0, prefix+"*", 100).Iterator()
			for iter.Next(ctx) {
				client.Del(ctx, iter.Val())
			}
		})
		body(t, backend{client: client, prefix: prefix})
	})
	t.Run("miniredis", func(t *testing.T) {
		t.Parallel()
		mr := miniredis.RunT(t)
		client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { _ = client.Close() })
		body(t, backend{client: client, prefix: "hangar:session:"})
	})
}

func TestAcquireRenewRelease(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		clk := newClock()
		h := holds.New(b.client, b.prefix, clk.Now)
		start := clk.Now()

		if _, ok, err := h.IdleSince(ctx, "s1"); err != nil || ok {
			t.Fatalf("IdleSince before any hold = %v, %v; want false, nil", ok, err)
		}
		hold, err := h.Acquire(ctx, "s1", "cli:alice", holds.KindTerminal, "terminal 1", time.Minute)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		want := holds.Hold{ID: hold.ID, Session: "s1", Owner: "cli:alice", Kind: holds.KindTerminal, Description: "terminal 1",
			AcquiredAt: start, ExpiresAt: start.Add(time.Minute)}
		if hold != want || hold.ID == "" {
			t.Fatalf("Acquire = %+v, want %+v", hold, want)
		}
		list, err := h.List(ctx, "s1")
		if err != nil || len(list) != 1 || list[0] != want {
			t.Fatalf("List = %+v, %v; want [%+v]", list, err, want)
		}
		if since, ok, err := h.IdleSince(ctx, "s1"); err != nil || !ok || !since.Equal(start) {
			t.Fatalf("IdleSince while held = %v, %v, %v; want now", since, ok, err)
		}
		if other, err := h.List(ctx, "s2"); err != nil || len(other) != 0 {
			t.Fatalf("List of another session = %+v, %v", other, err)
		}

		clk.Advance(50 * time.Second)
		renewed, err := h.Renew(ctx, "s1", hold.ID, time.Minute)
		if err != nil {
			t.Fatalf("Renew: %v", err)
		}
		want.ExpiresAt = clk.Now().Add(time.Minute)
		if renewed != want {
			t.Fatalf("Renew = %+v, want %+v", renewed, want)
		}
		clk.Advance(50 * time.Second) // past the first expiry, before the renewed one
		if list, err := h.List(ctx, "s1"); err != nil || len(list) != 1 {
			t.Fatalf("List after renew = %+v, %v; want the hold", list, err)
		}

		clk.Advance(time.Second)
		released := clk.Now()
		if err := h.Release(ctx, "s1", hold.ID); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := h.Release(ctx, "s1", hold.ID); err != nil {
			t.Fatalf("second Release: %v", err)
		}
		if list, err := h.List(ctx, "s1"); err != nil || len(list) != 0 {
			t.Fatalf("List after release = %+v, %v; want none", list, err)
		}
		if _, err := h.Renew(ctx, "s1", hold.ID, time.Minute); !errors.Is(err, holds.ErrNotFound) {
			t.Fatalf("Renew after release = %v, want ErrNotFound", err)
		}
		clk.Advance(time.Hour)
		if since, ok, err := h.IdleSince(ctx, "s1"); err != nil || !ok || !since.Equal(released) {
			t.Fatalf("IdleSince after release = %v, %v, %v; want %v", since, ok, err, released)
		}

		if err := h.Forget(ctx, "s1"); err != nil {
			t.Fatalf("Forget: %v", err)
		}
		if _, ok, err := h.IdleSince(ctx, "s1"); err != nil || ok {
			t.Fatalf("IdleSince after Forget = %v, %v; want false", ok, err)
		}
	})
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		clk := newClock()
		h := holds.New(b.client, b.prefix, clk.Now)

		short, err := h.Acquire(ctx, "s", "sandbox", holds.KindRunAgent, "", 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		long, err := h.Acquire(ctx, "s", "turn-runner", holds.KindTurn, "turn 3", 90*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(30 * time.Second) // exactly at short's expiry: expired
		list, err := h.List(ctx, "s")
		if err != nil || len(list) != 1 || list[0].ID != long.ID {
			t.Fatalf("List at first expiry = %+v, %v; want only %s", list, err, long.ID)
		}
		if _, err := h.Renew(ctx, "s", short.ID, time.Minute); !errors.Is(err, holds.ErrNotFound) {
			t.Fatalf("Renew of expired hold = %v, want ErrNotFound", err)
		}
		if since, _, err := h.IdleSince(ctx, "s"); err != nil || !since.Equal(clk.Now()) {
			t.Fatalf("IdleSince while one is live = %v, %v; want now", since, err)
		}

		clk.Advance(10 * time.Minute)
		if list, err := h.List(ctx, "s"); err != nil || len(list) != 0 {
			t.Fatalf("List after all expired = %+v, %v", list, err)
		}
		// The session stopped being held when the later hold expired.
		if since, ok, err := h.IdleSince(ctx, "s"); err != nil || !ok || !since.Equal(long.ExpiresAt) {
			t.Fatalf("IdleSince after expiry = %v, %v, %v; want %v", since, ok, err, long.ExpiresAt)
		}
		// A release of an expired hold does not move the idle clock.
		if err := h.Release(ctx, "s", long.ID); err != nil {
			t.Fatal(err)
		}
		if since, _, err := h.IdleSince(ctx, "s"); err != nil || !since.Equal(long.ExpiresAt) {
			t.Fatalf("IdleSince after late release = %v, %v; want %v", since, err, long.ExpiresAt)
		}
	})
}

// A job's hold is Redis data: a new Holds (a restarted control plane) sees
// it and its holder can keep renewing it.
func TestHoldSurvivesRestart(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		clk := newClock()
		before := holds.New(b.client, b.prefix, clk.Now)
		hold, err := before.Acquire(ctx, "job-s", "job:42", holds.KindJob, "best-of-3 delivery", 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}

		client := redis.NewClient(&redis.Options{Addr: b.client.Options().Addr})
		t.Cleanup(func() { _ = client.Close() })
		clk.Advance(time.Minute)
		after := holds.New(client, b.prefix, clk.Now)
		list, err := after.List(ctx, "job-s")
		if err != nil || len(list) != 1 || list[0] != hold {
			t.Fatalf("List after restart = %+v, %v; want [%+v]", list, err, hold)
		}
		if _, err := after.Renew(ctx, "job-s", hold.ID, 2*time.Minute); err != nil {
			t.Fatalf("Renew after restart: %v", err)
		}
		clk.Advance(90 * time.Second) // past the original expiry
		if list, err := after.List(ctx, "job-s"); err != nil || len(list) != 1 {
			t.Fatalf("List after renewal = %+v, %v; want the hold", list, err)
		}
	})
}

func TestConcurrentAcquireRelease(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		clk := newClock()
		h := holds.New(b.client, b.prefix, clk.Now)
		const n = 20
		ids := make([]string, n)
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Go(func() {
				hold, err := h.Acquire(ctx, "busy", fmt.Sprintf("owner-%d", i), holds.KindCommand, "exec", time.Minute)
				if err != nil {
					errs <- err
					return
				}
				ids[i] = hold.ID
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("Acquire: %v", err)
		}
		list, err := h.List(ctx, "busy")
		if err != nil || len(list) != n {
			t.Fatalf("List = %d holds, %v; want %d", len(list), err, n)
		}

		clk.Advance(time.Second)
		errs = make(chan error, n)
		for i := range n {
			wg.Go(func() {
				if err := h.Release(ctx, "busy", ids[i]); err != nil {
					errs <- err
				}
			})
			if i == n/2 {
				// Half released: the session is still held.
				wg.Wait()
				if since, _, err := h.IdleSince(ctx, "busy"); err != nil || !since.Equal(clk.Now()) {
					t.Fatalf("IdleSince half released = %v, %v; want now", since, err)
				}
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("Release: %v", err)
		}
		if list, err := h.List(ctx, "busy"); err != nil || len(list) != 0 {
			t.Fatalf("List after releases = %+v, %v", list, err)
		}
		released := clk.Now()
		clk.Advance(time.Minute)
		if since, ok, err := h.IdleSince(ctx, "busy"); err != nil || !ok || !since.Equal(released) {
			t.Fatalf("IdleSince = %v, %v, %v; want %v", since, ok, err, released)
		}
	})
}

func TestAcquireRejectsBadInput(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	h := holds.New(client, "p:", nil)
	for _, tc := range []struct {
		name, session, kind string
		ttl                 time.Duration
	}{
		{"no session", "", holds.KindTurn, time.Minute},
		{"unknown kind", "s", "nap", time.Minute},
		{"zero ttl", "s", holds.KindTurn, 0},
	} {
		if _, err := h.Acquire(t.Context(), tc.session, "o", tc.kind, "", tc.ttl); err == nil {
			t.Errorf("%s: Acquire succeeded", tc.name)
		}
	}
}
