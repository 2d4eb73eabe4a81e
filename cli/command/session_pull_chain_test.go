package command_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/command"
)

// sessionChainBundle makes a bundle of dir's HEAD and branches minus what
// the excluded commits reach, the way checkpoints bundle, and returns it.
func sessionChainBundle(t *testing.T, dir string, exclude ...string) []byte {
	t.Helper()
	f := filepath.Join(t.TempDir(), "b.bundle")
	args := []string{"bundle", "create", "-q", f, "HEAD", "--branches"}
	for _, e := range exclude {
		args = append(args, "^"+e)
	}
	sessionGitRun(t, dir, args...)
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sessionCommitFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	sessionGitRun(t, dir, "add", name)
	sessionGitRun(t, dir, "commit", "-q", "-m", "add "+name)
	return sessionGitRun(t, dir, "rev-parse", "HEAD")
}

// TestSessionPullChain fetches a chain of incremental bundles (each
// checkpoint's commits since the one before) in order: the branch gets the
// session's real commits, the temporary refs are gone, and --checkout
// applies the diff on top. The newest bundle need not hold the session
// branch (only another branch moved).
func TestSessionPullChain(t *testing.T) {
	t.Parallel()
	sandbox := sessionGitRepo(t)
	base := sessionGitRun(t, sandbox, "rev-parse", "HEAD")
	sessionGitRun(t, sandbox, "checkout", "-q", "-b", "hangar/session/s")
	c1 := sessionCommitFile(t, sandbox, "b.txt", "one\n")
	b0 := sessionChainBundle(t, sandbox, base)
	sessionCommitFile(t, sandbox, "c.txt", "two\n")
	c3 := sessionCommitFile(t, sandbox, "d.txt", "three\n")
	b1 := sessionChainBundle(t, sandbox, base, c1)
	// Only a side branch moves in the third checkpoint.
	sessionGitRun(t, sandbox, "checkout", "-q", "-b", "side")
	sessionCommitFile(t, sandbox, "side.txt", "side\n")
	sessionGitRun(t, sandbox, "checkout", "-q", "hangar/session/s")
	b2 := sessionChainBundle(t, sandbox, base, c3)
	want := sessionGitRun(t, sandbox, "log", "--format=%H %s", "hangar/session/s")
	diff := []byte("diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1,2 @@\n one\n+uncommitted\n")
	work := &sessionv1.GetSessionWorkResponse{Branch: "hangar/session/s", BaseCommit: base, HeadCommit: c3,
		GitBundles: [][]byte{b0, b1, b2}, Diff: diff}

	for _, checkout := range []bool{false, true} {
		local := t.TempDir()
		// Only the base: the session's commits must come from the bundles.
		sessionGitRun(t, local, "init", "-q", "-b", "main")
		sessionGitRun(t, local, "fetch", "-q", "--update-head-ok", sandbox, "main:main")
		sessionGitRun(t, local, "reset", "-q", "--hard")
		if err := exec0(local, "cat-file", "-e", c1); err == nil {
			t.Fatal("the clone still has the session's commits")
		}
		var out bytes.Buffer
		if err := command.SessionPullFromWork(context.Background(), local, &out, work, "s", checkout); err != nil {
			t.Fatalf("pull (checkout %v): %v", checkout, err)
		}
		if !strings.Contains(out.String(), "a chain of 3 bundles") {
			t.Errorf("pull said %q", out.String())
		}
		if got := sessionGitRun(t, local, "log", "--format=%H %s", "hangar/s"); got != want {
			t.Errorf("hangar/s:\n%s\nwant the session's commits:\n%s", got, want)
		}
		if refs := sessionGitRun(t, local, "for-each-ref", "refs/hangar-pull/"); refs != "" {
			t.Errorf("temporary refs left: %s", refs)
		}
		if checkout {
			if got := sessionGitRun(t, local, "branch", "--show-current"); got != "hangar/s" {
				t.Errorf("on %s", got)
			}
			if b, _ := os.ReadFile(filepath.Join(local, "a.txt")); string(b) != "one\nuncommitted\n" {
				t.Errorf("a.txt = %q", b)
			}
		}
	}

	t.Run("base not here", func(t *testing.T) {
		other := sessionGitRepo(t)
		w := &sessionv1.GetSessionWorkResponse{Branch: "b", BaseCommit: strings.Repeat("1", 40), HeadCommit: c3, GitBundles: [][]byte{b0, b1}}
		err := command.SessionPullFromWork(context.Background(), other, &bytes.Buffer{}, w, "s", false)
		if err == nil || !strings.Contains(err.Error(), "is not in this repository") {
			t.Errorf("pull without the base: %v", err)
		}
	})
	t.Run("a bundle out of order", func(t *testing.T) {
		local := t.TempDir()
		sessionGitRun(t, local, "init", "-q", "-b", "main")
		sessionGitRun(t, local, "fetch", "-q", "--update-head-ok", sandbox, "main:main")
		w := &sessionv1.GetSessionWorkResponse{Branch: "hangar/session/s", BaseCommit: base, HeadCommit: c3, GitBundles: [][]byte{b1, b0}}
		err := command.SessionPullFromWork(context.Background(), local, &bytes.Buffer{}, w, "s", false)
		if err == nil || !strings.Contains(err.Error(), "bundle 1 of 2") {
			t.Errorf("pull of a chain out of order: %v", err)
		}
		if refs := sessionGitRun(t, local, "for-each-ref", "refs/hangar-pull/", "refs/heads/hangar/"); refs != "" {
			t.Errorf("refs left after a failed pull: %s", refs)
		}
	})
}

// exec0 runs git in dir and returns its error only.
func exec0(dir string, args ...string) error {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	return cmd.Run()
}
