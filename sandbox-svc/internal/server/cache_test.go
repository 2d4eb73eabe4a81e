package server_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/server"
)

// A sandbox released with cache_checkpoint is kept, files and all, and the
// next acquire of its work key leases it again (a new lease, the old
// token refused), saying which checkpoint it was released after.
func TestSandboxCacheHit(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/one", WorkKey: "one"})
	if err != nil {
		t.Fatal(err)
	}
	if acq.GetCachedCheckpoint() != "" {
		t.Fatalf("a new sandbox says it is cached: %q", acq.GetCachedCheckpoint())
	}
	id, tok := acq.GetSandbox().GetId(), acq.GetLease().GetFencingToken()
	if r, err := execOnce(t, e.client, id, tok, "", "sh", "-c", "echo kept > kept.txt"); err != nil || r.exit.GetExitCode() != 0 {
		t.Fatalf("write: %v %v", r, err)
	}
	rel, err := e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: id, FencingToken: tok, CacheCheckpoint: "cp-1"})
	if err != nil || !rel.GetCached() {
		t.Fatalf("release = %v %v, want cached", rel, err)
	}
	// Cached, it is no one's: not found, and its old lease is gone.
	_, err = e.client.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: id})
	wantCode(t, err, codes.NotFound, "not found")

	again, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/one", WorkKey: "one"})
	if err != nil {
		t.Fatal(err)
	}
	if again.GetCachedCheckpoint() != "cp-1" || again.GetSandbox().GetId() != id || again.GetSandbox().GetWorkDir() != acq.GetSandbox().GetWorkDir() {
		t.Fatalf("acquire again = %v, want sandbox %s cached after cp-1", again, id)
	}
	tok2 := again.GetLease().GetFencingToken()
	if tok2 <= tok {
		t.Errorf("the new lease's token %d is not above the old %d", tok2, tok)
	}
	if _, err := execOnce(t, e.client, id, tok, "", "true"); grpcstatus.Code(err) != codes.FailedPrecondition {
		t.Errorf("the old token still works: %v", err)
	}
	r, err := execOnce(t, e.client, id, tok2, "", "cat", "kept.txt")
	if err != nil || r.stdout != "kept\n" {
		t.Fatalf("the cached sandbox's file: %q %v", r.stdout, err)
	}
	// Released without a checkpoint it is destroyed as before; the next
	// acquire makes a new one.
	if rel, err := e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: id, FencingToken: tok2}); err != nil || rel.GetCached() {
		t.Fatalf("plain release = %v %v", rel, err)
	}
	waitFor(t, "the released sandbox to go", func() bool {
		_, err := e.client.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: id})
		return grpcstatus.Code(err) == codes.NotFound
	})
	third, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/one", WorkKey: "one"})
	if err != nil {
		t.Fatal(err)
	}
	if third.GetCachedCheckpoint() != "" || third.GetSandbox().GetId() == id {
		t.Fatalf("after a plain release the acquire got %v", third)
	}
}

// no_cache, another environment definition, or a copy onto the key
// destroy the cached sandbox instead of leasing it.
func TestSandboxCacheNotWanted(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	cache := func() (string, string) {
		t.Helper()
		acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/two", WorkKey: "two"})
		if err != nil {
			t.Fatal(err)
		}
		rel, err := e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: acq.GetSandbox().GetId(), FencingToken: acq.GetLease().GetFencingToken(), CacheCheckpoint: "cp"})
		if err != nil || !rel.GetCached() {
			t.Fatalf("release = %v %v", rel, err)
		}
		return acq.GetSandbox().GetId(), acq.GetSandbox().GetWorkDir()
	}
	id, _ := cache()
	acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/two", WorkKey: "two", NoCache: true})
	if err != nil {
		t.Fatal(err)
	}
	if acq.GetCachedCheckpoint() != "" || acq.GetSandbox().GetId() == id {
		t.Fatalf("no_cache leased the cached sandbox: %v", acq)
	}
	if _, err := e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: acq.GetSandbox().GetId(), FencingToken: acq.GetLease().GetFencingToken(), CacheCheckpoint: "cp"}); err != nil {
		t.Fatal(err)
	}
	// Egress none is another sandbox than the one cached (egress full).
	acq, err = e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/two", WorkKey: "two", Egress: sandboxv1.Egress_EGRESS_NONE})
	if err != nil {
		t.Skipf("egress none unavailable here: %v", err)
	}
	if acq.GetCachedCheckpoint() != "" {
		t.Fatalf("a cached sandbox of another egress was leased: %v", acq)
	}
}

// A cache over its byte budget keeps nothing: the release destroys the
// sandbox at once (its directory is gone when the release answers), and
// the next acquire is a new sandbox.
func TestSandboxCacheEvictedOverDiskLimit(t *testing.T) {
	e := start(t, func(d *server.Deps) { d.CacheMaxBytes = 1 })
	ctx := context.Background()
	acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/three", WorkKey: "three"})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(acq.GetSandbox().GetWorkDir())
	rel, err := e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: acq.GetSandbox().GetId(), FencingToken: acq.GetLease().GetFencingToken(), CacheCheckpoint: "cp"})
	if err != nil || rel.GetCached() {
		t.Fatalf("release = %v %v, want not cached (over the budget)", rel, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the evicted sandbox's directory %s is still there: %v", dir, err)
	}
	again, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/three", WorkKey: "three"})
	if err != nil {
		t.Fatal(err)
	}
	if again.GetCachedCheckpoint() != "" {
		t.Fatalf("an evicted sandbox was leased: %v", again)
	}
}

// The oldest cached sandbox makes room for a newer one when the cache is
// full (by count here; bytes and free disk go the same way).
func TestSandboxCacheEvictsOldest(t *testing.T) {
	e := start(t, func(d *server.Deps) { d.CacheSize = 1 })
	ctx := context.Background()
	var dirs []string
	for _, key := range []string{"old", "new"} {
		acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/" + key, WorkKey: key})
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, filepath.Dir(acq.GetSandbox().GetWorkDir()))
		if rel, err := e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: acq.GetSandbox().GetId(), FencingToken: acq.GetLease().GetFencingToken(), CacheCheckpoint: "cp-" + key}); err != nil || !rel.GetCached() {
			t.Fatalf("release %s = %v %v", key, rel, err)
		}
	}
	if _, err := os.Stat(dirs[0]); !os.IsNotExist(err) {
		t.Errorf("the oldest cached sandbox %s was not evicted: %v", dirs[0], err)
	}
	if _, err := os.Stat(dirs[1]); err != nil {
		t.Errorf("the newest cached sandbox is gone: %v", err)
	}
	for key, want := range map[string]string{"old": "", "new": "cp-new"} {
		acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/" + key, WorkKey: key})
		if err != nil {
			t.Fatal(err)
		}
		if acq.GetCachedCheckpoint() != want {
			t.Errorf("acquire %s: cached %q, want %q", key, acq.GetCachedCheckpoint(), want)
		}
	}
}
