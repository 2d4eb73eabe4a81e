package local

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// After settleIndex no entry of a fresh checkout is racily clean: every
// file's mtime is in an earlier second than the index's (git compares in
// seconds), so no later command reads or rewrites one again.
func TestSettleIndexLeavesNoRacyEntry(t *testing.T) {
	src := t.TempDir()
	run := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	run(src, "init", "-q", "-b", "main")
	for i := range 300 {
		p := filepath.Join(src, fmt.Sprintf("d%d/f%d.txt", i%10, i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(fmt.Sprintf("file %d\n", i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(src, "add", "-A")
	run(src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
	work := filepath.Join(t.TempDir(), "work")
	run("", "clone", "-q", src, work) // its checkout writes the index last, in the same second
	if err := settleIndex(context.Background(), work); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(work, ".git", "index"))
	if err != nil {
		t.Fatal(err)
	}
	index := st.ModTime().Unix()
	racy := 0
	for _, line := range strings.Split(run(work, "ls-files", "--debug"), "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "mtime: ")
		if !ok {
			continue
		}
		sec, err := strconv.ParseInt(strings.SplitN(v, ":", 2)[0], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if sec >= index {
			racy++
		}
	}
	if racy > 0 {
		t.Errorf("%d entries are as new as the index (racily clean)", racy)
	}
	// And nothing needs refreshing: the entries match the files.
	if out := run(work, "diff-files", "--name-only"); out != "" {
		t.Errorf("files differ from the index after settling: %s", out)
	}
}
