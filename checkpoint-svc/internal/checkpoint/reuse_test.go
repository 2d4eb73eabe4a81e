package checkpoint_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/checkpoint"
	"github.com/hangar-dev/hangar/platform/fault"
)

// A cached sandbox (the one a checkpoint was just taken of, kept) is
// reused only when it holds exactly the checkpoint: any change to its
// files, index, refs, untracked or conversation files — even one that
// keeps a file's size and time — makes the reuse fail with
// CACHED_SANDBOX_DIFFERS and leaves the sandbox as it was; nothing is
// stored either way.
func TestRestoreReuseSandbox(t *testing.T) {
	t.Parallel()
	type tamper struct {
		name string
		do   func(t *testing.T, work, conv string)
	}
	sameSizeSameTime := func(t *testing.T, p, content string) {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), st.Mode()); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, st.ModTime(), st.ModTime()); err != nil {
			t.Fatal(err)
		}
	}
	cases := []tamper{
		{"nothing", nil},
		{"tracked file, same size and time", func(t *testing.T, work, _ string) {
			sameSizeSameTime(t, filepath.Join(work, "src/a.go"), "package z\n")
		}},
		{"untracked file added", func(t *testing.T, work, _ string) { write(t, work, "dropped.txt", "x\n", 0o644) }},
		{"untracked file changed", func(t *testing.T, work, _ string) {
			sameSizeSameTime(t, filepath.Join(work, "notes.txt"), "NOTES\n")
		}},
		{"file staged", func(t *testing.T, work, _ string) { git(t, work, "add", "src/b.go") }},
		{"branch moved", func(t *testing.T, work, _ string) {
			git(t, work, "branch", "-f", "main", "HEAD")
		}},
		{"commit made", func(t *testing.T, work, _ string) {
			git(t, work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "sneaky")
		}},
		// The work tree's tree stays the same in these: only the
		// untracked part's bytes, the probe's scan or the index show them.
		{"untracked file made private", func(t *testing.T, work, _ string) {
			if err := os.Chmod(filepath.Join(work, "notes.txt"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"untracked file's time changed", func(t *testing.T, work, _ string) {
			old := time.Now().Add(-time.Hour)
			if err := os.Chtimes(filepath.Join(work, "notes.txt"), old, old); err != nil {
				t.Fatal(err)
			}
		}},
		{"empty directory added", func(t *testing.T, work, _ string) {
			if err := os.Mkdir(filepath.Join(work, "empty"), 0o755); err != nil {
				t.Fatal(err)
			}
		}},
		{"untracked file marked intent-to-add", func(t *testing.T, work, _ string) { git(t, work, "add", "-N", "notes.txt") }},
		{"another content staged, the work tree put back", func(t *testing.T, work, _ string) {
			p := filepath.Join(work, "src/b.go")
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			write(t, work, "src/b.go", "package b // staged\n", 0o644)
			git(t, work, "add", "src/b.go")
			write(t, work, "src/b.go", string(b), 0o644)
		}},
		{"conversation changed", func(t *testing.T, _, conv string) {
			sameSizeSameTime(t, filepath.Join(conv, "c1.jsonl"), `{"turn":9}`+"\n")
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			work, home := w.sandbox()
			conv := filepath.Join(home, ".claude", "projects", "p")
			write(t, conv, "c1.jsonl", `{"turn":1}`+"\n", 0o600)
			git(t, work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "work")
			write(t, work, "src/b.go", "package b\n\nfunc B() { println() }\n", 0o644)
			write(t, work, "notes.txt", "notes\n", 0o644)
			cp := w.capture("s1", work, conv).Checkpoint
			before := snapshot(t, work, nil)
			// Some time passes while it is cached: a rewrite in the same
			// second would look the same to git's stat check.
			if c.do != nil {
				c.do(t, work, conv)
			}
			tampered := snapshot(t, work, nil)
			objects := countFiles(t, w.storeRoot)
			_, tree, err := w.eng.Restore(context.Background(), &checkpointv1.RestoreCheckpointRequest{
				CheckpointId: cp.GetId(), SandboxId: "sb", WorkDir: work, Branch: "hangar/session/s1", ReuseSandbox: true,
			})
			if n := countFiles(t, w.storeRoot); n != objects {
				t.Errorf("the check stored %d files", n-objects)
			}
			if c.do == nil {
				if err != nil || tree != cp.GetTreeHash() {
					t.Fatalf("reuse of an untouched sandbox: %q %v, want tree %s", tree, err, cp.GetTreeHash())
				}
				diffSnap(t, before, snapshot(t, work, nil))
				return
			}
			if fault.ReasonOf(err) != checkpoint.ReasonCachedDiffers {
				t.Fatalf("reuse after %s: %q %v, want %s", c.name, tree, err, checkpoint.ReasonCachedDiffers)
			}
			// Untouched by the check.
			diffSnap(t, tampered, snapshot(t, work, nil))
			// The fresh path restores it as captured.
			work2, _ := w.sandbox()
			if got, err := w.restore(cp.GetId(), work2, ""); err != nil || got != cp.GetTreeHash() {
				t.Fatalf("fresh restore: %q %v", got, err)
			}
			diffSnap(t, before, snapshot(t, work2, nil))
		})
	}
}

// A reuse check of a checkpoint that recorded its index's tree is one round
// of sandbox commands (the probe beside the untracked and conversation
// tarballs), not the probe and then a capture's parts.
func TestRestoreReuseSandboxIsOneRound(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	work, home := w.sandbox()
	conv := filepath.Join(home, ".claude", "projects", "p")
	write(t, conv, "c1.jsonl", `{"turn":1}`+"\n", 0o600)
	write(t, work, "src/b.go", "package b\n\nfunc B() { println() }\n", 0o644)
	write(t, work, "notes.txt", "notes\n", 0o644)
	git(t, work, "add", "-N", "notes.txt")
	cp := w.capture("s1", work, conv).Checkpoint
	execs := &countingExec{Executor: w.exec}
	w.opts.Exec = execs
	w.reopen()
	if _, tree, err := w.eng.Restore(context.Background(), &checkpointv1.RestoreCheckpointRequest{
		CheckpointId: cp.GetId(), SandboxId: "sb", WorkDir: work, Branch: "hangar/session/s1", ReuseSandbox: true,
	}); err != nil || tree != cp.GetTreeHash() {
		t.Fatalf("reuse of an untouched sandbox: %q %v, want tree %s", tree, err, cp.GetTreeHash())
	}
	if n := execs.n.Load(); n != 3 {
		t.Errorf("the check ran %d sandbox commands, want 3 (probe, untracked, conversation)", n)
	}
}

// countingExec counts the commands run through it.
type countingExec struct {
	checkpoint.Executor
	n atomic.Int64
}

func (c *countingExec) Exec(ctx context.Context, id string, token uint64, argv []string, env map[string]string, cwd string,
	stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	c.n.Add(1)
	return c.Executor.Exec(ctx, id, token, argv, env, cwd, stdin, stdout, stderr)
}

// A checkpoint that left a part out (over its limit) can't be compared:
// never reused.
func TestRestoreReuseRefusesSkippedParts(t *testing.T) {
	t.Parallel()
	w := newWorld(t, func(o *checkpoint.Options) { o.MaxUntrackedBytes = 1 << 10 })
	work, _ := w.sandbox()
	write(t, work, "big.bin", string(make([]byte, 4<<10)), 0o644)
	cp := w.capture("s1", work).Checkpoint
	_, _, err := w.eng.Restore(context.Background(), &checkpointv1.RestoreCheckpointRequest{
		CheckpointId: cp.GetId(), SandboxId: "sb", WorkDir: work, ReuseSandbox: true,
	})
	if fault.ReasonOf(err) != checkpoint.ReasonCachedDiffers {
		t.Fatalf("reuse with a skipped part: %v, want %s", err, checkpoint.ReasonCachedDiffers)
	}
}

func countFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.Walk(dir, func(_ string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if !info.IsDir() {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
