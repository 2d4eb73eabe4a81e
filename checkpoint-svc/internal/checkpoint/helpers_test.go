package checkpoint_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool/tooltest"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/checkpoint"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/hostexec"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/vault"
	"github.com/hangar-dev/hangar/platform/blob"
)

var testEnv = []string{"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
	"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com", "LC_ALL=C"}

func git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), testEnv...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func write(t testing.TB, dir, name, content string, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// world is an origin repository, a sandbox clone of it, a store and an
// engine.
type world struct {
	t      testing.TB
	origin string
	base   string
	store  blob.Store
	// storeRoot is the directory the store keeps its objects in.
	storeRoot string
	keys      *vault.Keyring
	eng       *checkpoint.Engine
	exec      checkpoint.Executor
	// ticks counts clock readings; shared by copies of the world made for
	// parallel subtests, so it is atomic.
	ticks *atomic.Int64
	opts  checkpoint.Options
}

func newKeys(t testing.TB) *vault.Keyring {
	b := make([]byte, 32)
	rand.Read(b)
	k, err := vault.NewKey(b)
	if err != nil {
		t.Fatal(err)
	}
	return vault.NewKeyring(k)
}

func newWorld(t testing.TB, tweak ...func(*checkpoint.Options)) *world {
	t.Helper()
	w := &world{t: t, ticks: new(atomic.Int64)}
	w.origin = t.TempDir()
	git(t, w.origin, "init", "-q", "-b", "main")
	write(t, w.origin, "README.md", "hello\n", 0o644)
	write(t, w.origin, ".gitignore", "*.log\nnode_modules/\n", 0o644)
	write(t, w.origin, "src/a.go", "package a\n", 0o644)
	write(t, w.origin, "src/b.go", "package b\n\nfunc B() {}\n", 0o644)
	write(t, w.origin, "bin/run.sh", "#!/bin/sh\necho run\n", 0o755)
	write(t, w.origin, "data.bin", string([]byte{0, 1, 2, 255, 254, 0, 10, 13}), 0o644)
	if err := os.Symlink("src/a.go", filepath.Join(w.origin, "link-a")); err != nil {
		t.Fatal(err)
	}
	git(t, w.origin, "add", "-A")
	git(t, w.origin, "commit", "-q", "-m", "base")
	w.base = git(t, w.origin, "rev-parse", "HEAD")
	w.storeRoot = t.TempDir()
	st, err := blob.NewDir(w.storeRoot)
	if err != nil {
		t.Fatal(err)
	}
	w.store = st
	w.keys = newKeys(t)
	w.exec = &hostexec.Executor{Root: "/", Env: map[string]string{"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
		// A sandbox's PATH: hangar-sandbox and git, nothing else.
		"PATH": tooltest.MinimalPATH(t)}}
	w.opts = checkpoint.Options{Store: w.store, Exec: w.exec, Keys: w.keys, Now: w.clock,
		KeepCheckpoints: 5, MaxUntrackedBytes: 20 << 20, MaxPartBytes: 100 << 20}
	for _, f := range tweak {
		f(&w.opts)
	}
	w.reopen()
	return w
}

func (w *world) reopen() {
	eng, err := checkpoint.New(w.opts)
	if err != nil {
		w.t.Fatal(err)
	}
	w.eng = eng
}

// clockStart is the injected clock's first reading; each reading is a
// second later than the one before.
var clockStart = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func (w *world) clock() time.Time {
	return clockStart.Add(time.Duration(w.ticks.Add(1)) * time.Second)
}

// sandbox makes a fresh "sandbox": a clone of origin at the base on the
// session branch, with a home for conversation files.
func (w *world) sandbox() (work, home string) {
	root := w.t.TempDir()
	work, home = filepath.Join(root, "work"), filepath.Join(root, "home")
	git(w.t, root, "clone", "-q", w.origin, work)
	git(w.t, work, "checkout", "-q", "-b", "hangar/session/s1")
	os.MkdirAll(home, 0o755)
	return work, home
}

func (w *world) capture(session, work string, conv ...string) *checkpoint.CaptureResult {
	w.t.Helper()
	res, err := w.eng.Capture(context.Background(), &checkpointv1.CaptureCheckpointRequest{
		SandboxId: "sb", Session: session, WorkDir: work, Branch: "hangar/session/s1", BaseCommit: w.base,
		Harness: "claude", ConversationId: "c1", Turn: 1, ConversationPaths: conv,
		Reason: checkpointv1.CheckpointReason_CHECKPOINT_REASON_AFTER_TURN,
	})
	if err != nil {
		w.t.Fatalf("capture: %v", err)
	}
	return res
}

func (w *world) restore(id, work, branch string) (string, error) {
	_, tree, err := w.eng.Restore(context.Background(), &checkpointv1.RestoreCheckpointRequest{
		CheckpointId: id, SandboxId: "sb2", WorkDir: work, Branch: branch,
	})
	return tree, err
}

// snapshot describes a directory: every entry's type, mode and content
// (or link target), skipping .git and names matching skip.
func snapshot(t testing.TB, root string, skip func(rel string) bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == ".git" {
			return filepath.SkipDir
		}
		if rel == "." || (skip != nil && skip(rel)) {
			if d.IsDir() && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		desc := fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			desc += " " + string(b)
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diffSnap(t testing.TB, want, got map[string]string) {
	t.Helper()
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b bytes.Buffer
	for _, k := range keys {
		if want[k] != got[k] {
			b.WriteString("  " + strings.ToValidUTF8(k, "?") + ": want " + trunc(want[k]) + " got " + trunc(got[k]) + "\n")
		}
	}
	if b.Len() > 0 {
		t.Fatalf("restored tree differs:\n%s", b.String())
	}
}

func trunc(s string) string {
	if len(s) > 60 {
		s = s[:60] + "..."
	}
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\n", `\n`), "?")
}

func nowMono() time.Time { return time.Now() }

func sinceMono(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }
