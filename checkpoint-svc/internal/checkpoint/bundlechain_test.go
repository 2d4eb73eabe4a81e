package checkpoint_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/checkpoint"
	"github.com/hangar-dev/hangar/platform/fault"
)

// bundleCount is how many BUNDLE parts (kept or not) a checkpoint lists.
func bundleCount(cp *checkpointv1.Checkpoint) int {
	n := 0
	for _, p := range cp.GetParts() {
		if p.GetKind() == checkpointv1.PartKind_PART_KIND_BUNDLE {
			n++
		}
	}
	return n
}

// readBundles reads every bundle of a checkpoint's chain into files under
// dir, oldest first.
func (w *world) readBundles(id string, n int, dir string) []string {
	w.t.Helper()
	var files []string
	for i := range n {
		var b bytes.Buffer
		if err := w.eng.ReadBundle(context.Background(), id, i, &b); err != nil {
			w.t.Fatalf("read bundle %d of %s: %v", i, id, err)
		}
		f := filepath.Join(dir, fmt.Sprintf("b%d.bundle", i))
		if err := os.WriteFile(f, b.Bytes(), 0o600); err != nil {
			w.t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// TestReadBundleChain: commits over several checkpoints make a chain of
// incremental bundles; every one can be read by its index, and fetching
// them in order into a clone of the origin gives the sandbox's commits
// (same hashes, every branch). The newest bundle alone lacks its
// prerequisites; ReadPart without an index is still the newest.
func TestReadBundleChain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t)
	work, _ := w.sandbox()

	write(t, work, "src/a.go", "package a // 1\n", 0o644)
	git(t, work, "commit", "-q", "-am", "first")
	if cp := w.capture("s1", work).Checkpoint; bundleCount(cp) != 1 {
		t.Fatalf("first checkpoint has %d bundles", bundleCount(cp))
	}
	write(t, work, "src/b.go", "package b // 2\n", 0o644)
	git(t, work, "commit", "-q", "-am", "second")
	git(t, work, "branch", "side")
	// An uncommitted edit only: a checkpoint that carries the chain and
	// adds no bundle of its own.
	write(t, work, "README.md", "edited\n", 0o644)
	if cp := w.capture("s1", work).Checkpoint; bundleCount(cp) != 2 {
		t.Fatalf("second checkpoint has %d bundles", bundleCount(cp))
	}
	if cp := w.capture("s1", work).Checkpoint; bundleCount(cp) != 2 {
		t.Fatalf("edit-only checkpoint has %d bundles", bundleCount(cp))
	}
	git(t, work, "commit", "-q", "-am", "third")
	write(t, work, "new.txt", "new\n", 0o644)
	git(t, work, "add", "new.txt")
	git(t, work, "commit", "-q", "-m", "fourth")
	res := w.capture("s1", work)
	cp := res.Checkpoint
	n := bundleCount(cp)
	if !res.Created || n != 3 || cp.GetPreviousCheckpoint() == "" {
		t.Fatalf("newest checkpoint: created %v, %d bundles, previous %q", res.Created, n, cp.GetPreviousCheckpoint())
	}

	files := w.readBundles(cp.GetId(), n, t.TempDir())

	// The newest bundle alone needs the ones before it.
	lone := filepath.Join(t.TempDir(), "lone")
	git(t, filepath.Dir(lone), "clone", "-q", w.origin, lone)
	if out, err := gitErr(lone, "bundle", "verify", files[n-1]); err == nil {
		t.Fatalf("the newest bundle verified alone in a clone of the origin: %s", out)
	}

	clone := filepath.Join(t.TempDir(), "clone")
	git(t, filepath.Dir(clone), "clone", "-q", w.origin, clone)
	for i, f := range files {
		git(t, clone, "fetch", "-q", "--no-tags", f, fmt.Sprintf("+refs/heads/*:refs/chain/%d/*", i))
	}
	for _, ref := range []string{"hangar/session/s1", "side"} {
		want := git(t, work, "rev-parse", "refs/heads/"+ref)
		got := ""
		for i := n - 1; i >= 0 && got == ""; i-- {
			got, _ = gitErr(clone, "rev-parse", "--verify", "--quiet", fmt.Sprintf("refs/chain/%d/%s", i, ref))
		}
		if got != want {
			t.Errorf("branch %s from the chain is %q, want %s", ref, got, want)
		}
	}
	if a, b := git(t, work, "log", "--format=%H %s", "HEAD"), git(t, clone, "log", "--format=%H %s", cp.GetHeadCommit()); a != b {
		t.Fatalf("history from the chain:\n%s\nwant:\n%s", b, a)
	}

	// Unset index: the newest bundle, as before.
	var newest bytes.Buffer
	if err := w.eng.ReadPart(ctx, cp.GetId(), checkpointv1.PartKind_PART_KIND_BUNDLE, &newest); err != nil {
		t.Fatal(err)
	}
	if last, _ := os.ReadFile(files[n-1]); !bytes.Equal(newest.Bytes(), last) {
		t.Fatal("ReadPart(BUNDLE) is not the newest bundle of the chain")
	}

	for _, bad := range []int{-1, n, n + 5} {
		err := w.eng.ReadBundle(ctx, cp.GetId(), bad, &bytes.Buffer{})
		if !fault.Is(err, fault.KindInvalidArgument) || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("bundle_index %d: %v, want InvalidArgument out of range", bad, err)
		}
	}
	if err := w.eng.ReadBundle(ctx, "s1~nope", 0, &bytes.Buffer{}); !fault.Is(err, fault.KindInvalidArgument) {
		t.Errorf("bad checkpoint id: %v", err)
	}
}

// TestReadBundleNone: a checkpoint without commits of its own has no
// bundle; any index is out of range.
func TestReadBundleNone(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	work, _ := w.sandbox()
	write(t, work, "README.md", "edited\n", 0o644)
	cp := w.capture("s1", work).Checkpoint
	if bundleCount(cp) != 0 {
		t.Fatalf("%d bundles without commits", bundleCount(cp))
	}
	err := w.eng.ReadBundle(context.Background(), cp.GetId(), 0, &bytes.Buffer{})
	if !fault.Is(err, fault.KindInvalidArgument) || !strings.Contains(err.Error(), "has no bundle") {
		t.Fatalf("index 0 of no bundle: %v", err)
	}
}

// TestReadBundleSkipped: a bundle over the size limit ends the chain as a
// skipped part; reading it is FailedPrecondition PART_NOT_KEPT, the kept
// ones before it still read.
func TestReadBundleSkipped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, func(o *checkpoint.Options) { o.MaxPartBytes = 1 << 20 })
	work, _ := w.sandbox()
	write(t, work, "src/a.go", "package a // 1\n", 0o644)
	git(t, work, "commit", "-q", "-am", "small")
	w.capture("s1", work)
	big := make([]byte, 2<<20)
	rand.Read(big)
	write(t, work, "big.bin", string(big), 0o644)
	git(t, work, "add", "big.bin")
	git(t, work, "commit", "-q", "-m", "big")
	cp := w.capture("s1", work).Checkpoint
	if n := bundleCount(cp); n != 2 {
		t.Fatalf("%d bundles, want the small one and the skipped big one", n)
	}
	if err := w.eng.ReadBundle(ctx, cp.GetId(), 0, &bytes.Buffer{}); err != nil {
		t.Fatalf("bundle 0: %v", err)
	}
	if err := w.eng.ReadBundle(ctx, cp.GetId(), 1, &bytes.Buffer{}); !fault.Is(err, fault.KindFailedPrecondition) || reason(err) != "PART_NOT_KEPT" {
		t.Fatalf("skipped bundle 1: %v", err)
	}
}

// gitErr runs git in dir and returns its trimmed output and error.
func gitErr(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), testEnv...)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
