package sessions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mathrand "math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"

	"github.com/hangar-dev/hangar/session-svc/internal/holds"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// unusedSandboxes answers that no call uses a sandbox: these schedules are
// of holds alone (calls in use are sandbox-svc's, tested with it).
type unusedSandboxes struct{ sandboxv1.SandboxServiceClient }

func (unusedSandboxes) GetSandbox(context.Context, *sandboxv1.GetSandboxRequest, ...grpc.CallOption) (*sandboxv1.GetSandboxResponse, error) {
	return &sandboxv1.GetSandboxResponse{Sandbox: &sandboxv1.Sandbox{Id: "sb"}}, nil
}

// raceClock is the injected clock of the idle race schedules.
type raceClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *raceClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *raceClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestIdleClockNeverSuspendsAHeldSession drives the idle clock through
// randomized schedules of holds taken, renewed, released and left to
// expire, and of time passing, against the real Redis with the injected
// clock. At every step the idle clock's verdict (SuspendAt: would the sweep
// suspend now?) is checked against a model: a session with a live hold is
// never due, and one idle for its idle time since its last activity or the
// end of its last hold is due. HANGAR_IDLE_SCHEDULES sets the number of
// schedules (default 10,000).
func TestIdleClockNeverSuspendsAHeldSession(t *testing.T) {
	schedules := 10000
	if v := os.Getenv("HANGAR_IDLE_SCHEDULES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("HANGAR_IDLE_SCHEDULES=%q: want a positive number", v)
		}
		schedules = n
	}
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatalf("no Redis at 127.0.0.1:6379: %v", err)
	}
	var raw [6]byte
	_, _ = rand.Read(raw[:])
	prefix := "test:idlerace:" + hex.EncodeToString(raw[:]) + ":"
	t.Cleanup(func() {
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
	})

	clock := &raceClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	h := holds.New(client, prefix, clock.Now)
	const idle = 30
	m := New(Deps{Holds: h, Sandboxes: unusedSandboxes{}, Now: clock.Now, Config: Config{IdleMinutes: idle}})
	rng := mathrand.New(mathrand.NewPCG(12, 2026))

	var held, due, suspendedWhileHeld, missed int
	for n := range schedules {
		s := &store.Session{Name: fmt.Sprintf("s%d", n), State: store.StateIdle, SandboxID: "sb", LastActiveAt: clock.Now()}
		// The model: live holds by id with their expiry, and when the
		// session last stopped being held.
		live := map[string]time.Time{}
		var idleSince time.Time
		expire := func(now time.Time) {
			for id, exp := range live {
				if !exp.After(now) {
					delete(live, id)
					if exp.After(idleSince) {
						idleSince = exp
					}
				}
			}
		}
		anyLive := func() string {
			for id := range live {
				return id
			}
			return ""
		}
		for range 4 + rng.IntN(12) {
			now := clock.Now()
			expire(now)
			switch rng.IntN(5) {
			case 0: // a command, a terminal or a turn takes a hold
				ttl := time.Duration(1+rng.IntN(90)) * time.Minute
				hold, err := h.Acquire(ctx, s.Name, "owner", holds.KindCommand, "race", ttl)
				if err != nil {
					t.Fatal(err)
				}
				live[hold.ID] = now.Add(ttl)
			case 1: // a heartbeat
				if id := anyLive(); id != "" {
					ttl := time.Duration(1+rng.IntN(90)) * time.Minute
					if _, err := h.Renew(ctx, s.Name, id, ttl); err != nil {
						t.Fatalf("schedule %d: renew of a live hold: %v", n, err)
					}
					live[id] = now.Add(ttl)
				}
			case 2: // the holder is done
				if id := anyLive(); id != "" {
					if err := h.Release(ctx, s.Name, id); err != nil {
						t.Fatal(err)
					}
					delete(live, id)
					idleSince = now
				}
			default: // time passes; some holds expire
				clock.advance(time.Duration(rng.IntN(45*60)) * time.Second)
			}
			now = clock.Now()
			expire(now)
			at, err := m.SuspendAt(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			wouldSuspend := !at.IsZero() && !now.Before(at)
			since := s.LastActiveAt
			if idleSince.After(since) {
				since = idleSince
			}
			modelDue := len(live) == 0 && !now.Before(since.Add(idle*time.Minute))
			switch {
			case len(live) > 0:
				held++
				if wouldSuspend {
					suspendedWhileHeld++
					t.Errorf("schedule %d: the idle clock would suspend %s at %v with %d live holds", n, s.Name, now, len(live))
				}
			case modelDue:
				due++
				if !wouldSuspend {
					missed++
					t.Errorf("schedule %d: %s idle since %v is due at %v but the idle clock says %v", n, s.Name, since, now, at)
				}
			}
		}
	}
	t.Logf("%d schedules: %d checks with a live hold, %d suspensions of a held session; %d checks due, %d missed", schedules, held, suspendedWhileHeld, due, missed)
}
