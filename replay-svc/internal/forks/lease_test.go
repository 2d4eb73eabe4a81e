package forks

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	"github.com/hangar-dev/hangar/replay-svc/internal/store"
)

// drivers records which replica is rebuilding which run's fork now: the
// rebuild's first call (GetRun) blocks until the replica stops driving it.
type drivers struct {
	mu    sync.Mutex
	now   map[string][]string // run -> replicas driving it
	twice []string
}

func (d *drivers) of(run string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.now[run]...)
}

type drivingGateway struct {
	Gateway
	d       *drivers
	replica string
}

func (g drivingGateway) GetRun(ctx context.Context, in *gatewayv1.GetRunRequest, _ ...grpc.CallOption) (*gatewayv1.GetRunResponse, error) {
	d := g.d
	d.mu.Lock()
	d.now[in.GetRun()] = append(d.now[in.GetRun()], g.replica)
	if len(d.now[in.GetRun()]) > 1 {
		d.twice = append(d.twice, in.GetRun())
	}
	d.mu.Unlock()
	<-ctx.Done()
	d.mu.Lock()
	var left []string
	for _, r := range d.now[in.GetRun()] {
		if r != g.replica {
			left = append(left, r)
		}
	}
	d.now[in.GetRun()] = left
	d.mu.Unlock()
	return nil, ctx.Err()
}

// waitFor polls cond until it holds or a minute has passed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-time.After(20 * time.Millisecond)
	}
}

// TestTwoReplicasDriveEachForkOnce: two replay-svc replicas on one
// database. Each fork still replaying is driven by one of them at a time:
// a fork whose lease a killed replica holds is taken over once the lease
// has expired, and a fork whose driver stops is carried on by the other.
func TestTwoReplicasDriveEachForkOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "replay.db")
	open := func() *store.Store {
		st, err := store.Open(ctx, store.Options{SQLitePath: path})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	st1, st2 := open(), open()
	for _, id := range []string{"a", "b"} {
		if err := st1.CreateFork(ctx, &replayv1.Fork{Fork: "job-" + id, Run: "run-" + id, Harness: "claude", Status: replayv1.ForkStatus_FORK_STATUS_REPLAYING}); err != nil {
			t.Fatal(err)
		}
	}
	// A replica killed while it drove job-a: its lease runs out in 2 s.
	ttl := 2 * time.Second
	if ok, err := st1.TakeLease(ctx, "fork:job-a", "killed", time.Now(), ttl); err != nil || !ok {
		t.Fatalf("killed replica's lease: %v %v", ok, err)
	}
	d := &drivers{now: map[string][]string{}}
	start := func(name string, st *store.Store) context.CancelFunc {
		m := New(Options{Store: st, Gateway: drivingGateway{d: d, replica: name}, Holder: name, LeaseTTL: ttl, Rescan: 100 * time.Millisecond})
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = m.Run(runCtx) }()
		t.Cleanup(func() { cancel(); <-done })
		return func() { cancel(); <-done }
	}
	stop := map[string]context.CancelFunc{"r1": start("r1", st1), "r2": start("r2", st2)}

	waitFor(t, "job-b driven", func() bool { return len(d.of("run-b")) == 1 })
	killedUntil := time.Now().Add(ttl)
	waitFor(t, "job-a taken over after the killed replica's lease expired", func() bool { return len(d.of("run-a")) == 1 })
	if time.Now().Before(killedUntil.Add(-ttl / 2)) {
		t.Errorf("job-a was taken over before the killed replica's lease could have expired")
	}
	// Several renewals later, each fork still has its one driver.
	renewed := time.Now().Add(2 * ttl)
	waitFor(t, "two lease periods", func() bool {
		if len(d.of("run-a")) != 1 || len(d.of("run-b")) != 1 {
			t.Fatalf("drivers: job-a %v, job-b %v, want one each", d.of("run-a"), d.of("run-b"))
		}
		return time.Now().After(renewed)
	})
	// The driver of job-b stops: the other replica carries it on.
	was := d.of("run-b")[0]
	stop[was]()
	waitFor(t, "job-b carried on by the other replica", func() bool {
		got := d.of("run-b")
		return len(got) == 1 && got[0] != was
	})
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.twice) > 0 {
		t.Errorf("forks driven by two replicas at once: %v", d.twice)
	}
}
