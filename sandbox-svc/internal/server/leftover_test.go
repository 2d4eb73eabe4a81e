package server_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool/tooltest"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/drivertest"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/lease"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/server"
)

// A process that died without destroying its sandboxes leaves their
// directories; of those no session can claim (warm or ad-hoc sandboxes,
// named by their id) the next start removes those whose lease is gone at
// once and the others once their lease expires.
func TestStartReapsLeftovers(t *testing.T) {
	home := t.TempDir()
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	crashed, err := local.New(local.Options{Root: home})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dirs := map[string]string{}
	for _, id := range []string{"sb-unleased", "sb-leased"} {
		sb, err := crashed.Create(ctx, driver.Spec{ID: id, Environment: "local", Repository: repo})
		if err != nil {
			t.Fatal(err)
		}
		dirs[id] = filepath.Dir(sb.Info().WorkDir)
	}
	crashed.Close() // the process is gone; its directories stay

	mini := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mini.Addr()})
	defer rdb.Close()
	const prefix = "hangar:leftover-test:"
	if _, err := lease.New(rdb, prefix, nil).Acquire(ctx, "sandbox:sb-leased", "session/x", 30*time.Second); err != nil {
		t.Fatal(err)
	}

	e := start(t, func(d *server.Deps) { d.Home, d.Redis, d.KeyPrefix = home, rdb, prefix })
	if _, err := os.Stat(dirs["sb-unleased"]); !os.IsNotExist(err) {
		t.Errorf("unleased leftover after start: %v, want removed", err)
	}
	if _, err := os.Stat(dirs["sb-leased"]); err != nil {
		t.Errorf("leased leftover after start: %v, want kept while its lease lives", err)
	}
	e.srv.ReapNow(ctx)
	if _, err := os.Stat(dirs["sb-leased"]); err != nil {
		t.Errorf("leased leftover after a reap with the lease alive: %v", err)
	}
	mini.FastForward(31 * time.Second)
	e.srv.ReapNow(ctx)
	if _, err := os.Stat(dirs["sb-leased"]); !os.IsNotExist(err) {
		t.Errorf("leftover after its lease expired: %v, want removed", err)
	}
}

// testClock is the server's and the leases' clock, moved with miniredis's.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) advance(mini *miniredis.Miniredis, d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	mini.FastForward(d)
}

// After a crash the sandboxes made for a session (a work key) are revived
// at start with the work written in them after their last checkpoint:
// leased to sandbox-svc/leftover for the grace when their lease is gone
// (the session service's recovery checkpoints and releases them), under
// the lease they still have otherwise (its holder goes on with it). One
// whose work key is acquired again is removed first; one nobody claims goes
// when the grace ends.
func TestStartRevivesLeftovers(t *testing.T) {
	home := t.TempDir()
	repo, _ := drivertest.NewRepo(t, map[string]string{"README.md": "hello\n"})
	crashed, err := local.New(local.Options{Root: home, Tool: tooltest.Path(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dirs := map[string]string{}
	for _, key := range []string{"a", "b", "c", "d"} {
		sb, err := crashed.Create(ctx, driver.Spec{ID: "sb-" + key, WorkKey: "sess-" + key, Environment: "local", Repository: repo})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sb.WriteFile(ctx, "late.txt", []byte("late work of "+key+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		dirs[key] = filepath.Dir(sb.Info().WorkDir)
	}
	crashed.Close() // killed: the directories stay

	mini := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mini.Addr()})
	defer rdb.Close()
	const prefix = "hangar:revive-test:"
	clock := &testClock{now: time.Now()}
	// Redis outlived the crash for sess-c's lease.
	held, err := lease.New(rdb, prefix, clock.Now).Acquire(ctx, "sandbox:sb-c", "session/sess-c", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	e := start(t, func(d *server.Deps) {
		d.Home, d.Redis, d.KeyPrefix, d.Now, d.LeftoverGrace = home, rdb, prefix, clock.Now, time.Minute
	})

	get := func(id string) *sandboxv1.Sandbox {
		t.Helper()
		g, err := e.client.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: id})
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		return g.GetSandbox()
	}
	a := get("sb-a")
	if a.GetState() != sandboxv1.SandboxState_SANDBOX_STATE_LEASED || a.GetLease().GetHolder() != server.LeftoverHolder ||
		a.GetLease().GetFencingToken() == 0 || a.GetWorkDir() != filepath.Join(dirs["a"], "work") {
		t.Fatalf("revived sb-a = %v, want leased to %s at its old work tree", a, server.LeftoverHolder)
	}
	res, err := execOnce(t, e.client, "sb-a", a.GetLease().GetFencingToken(), "", "cat", "late.txt")
	if err != nil || res.stdout != "late work of a\n" {
		t.Fatalf("the work left in sb-a: %+v %v", res, err)
	}
	c := get("sb-c")
	if c.GetLease().GetHolder() != "session/sess-c" || c.GetLease().GetFencingToken() != held.Token {
		t.Fatalf("revived sb-c's lease = %v, want the one Redis kept (session/sess-c, %d)", c.GetLease(), held.Token)
	}
	if _, err := e.client.RenewLease(ctx, &sandboxv1.RenewLeaseRequest{SandboxId: "sb-c", FencingToken: held.Token, TtlSeconds: 30}); err != nil {
		t.Errorf("the holder renews the lease it kept: %v", err)
	}

	// The session records sb-a: it checkpoints the work and releases it.
	if _, err := e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: "sb-a", FencingToken: a.GetLease().GetFencingToken()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "sb-a removed after its release", func() bool {
		_, err := os.Stat(dirs["a"])
		return os.IsNotExist(err)
	})
	// sess-b opens afresh (its record names no sandbox): the leftover of
	// its key goes first.
	acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/sess-b", WorkKey: "sess-b"})
	if err != nil {
		t.Fatalf("acquire for a revived leftover's work key: %v", err)
	}
	if _, err := e.client.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: "sb-b"}); status.Code(err) != codes.NotFound {
		t.Errorf("sb-b after its key was acquired again: %v, want not found", err)
	}
	res, err = execOnce(t, e.client, acq.GetSandbox().GetId(), acq.GetLease().GetFencingToken(), "", "sh", "-c", "test ! -e late.txt && cat README.md")
	if err != nil || res.stdout != "hello\n" {
		t.Errorf("the new sandbox of sess-b is fresh: %+v %v", res, err)
	}

	// Unclaimed, sb-d goes when the grace ends; sb-c when its lease does.
	e.srv.ReapNow(ctx)
	if get("sb-d").GetState() != sandboxv1.SandboxState_SANDBOX_STATE_LEASED {
		t.Fatal("sb-d reaped within its grace")
	}
	clock.advance(mini, 2*time.Minute)
	e.srv.ReapNow(ctx)
	for _, id := range []string{"sb-c", "sb-d"} {
		waitFor(t, id+" destroyed when its lease ran out", func() bool {
			_, err := e.client.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: id})
			return status.Code(err) == codes.NotFound
		})
	}
	for _, key := range []string{"c", "d"} {
		if _, err := os.Stat(dirs[key]); !os.IsNotExist(err) {
			t.Errorf("leftover sess-%s after its lease ran out: %v, want removed", key, err)
		}
	}
}
