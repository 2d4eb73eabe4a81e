package local_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/drivertest"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
)

// sh runs a script in sb and fails the test unless it exits 0.
func sh(t *testing.T, sb driver.Sandbox, script string) string {
	t.Helper()
	out, errOut, st := drivertest.Run1(t, sb, driver.ExecRequest{Argv: []string{"sh", "-c", script}})
	if st.Code != 0 {
		t.Fatalf("%q exited %d: %s", script, st.Code, errOut)
	}
	return out
}

// describe prints a work tree and home: git state, every file's hash and
// mode, links, and the home's files, with the sandbox's own paths replaced.
const describe = `git status --porcelain=v1 -uall --ignored
git rev-parse HEAD; git symbolic-ref HEAD; git for-each-ref
find . -path ./.git -prune -o -print | sort | while read -r f; do
  if [ -L "$f" ]; then echo "$f -> $(readlink "$f")"; elif [ -f "$f" ]; then echo "$f $(stat -c %a "$f") $(sha256sum < "$f")"; else echo "$f/ $(stat -c %a "$f")"; fi
done
cd "$HOME" && find . -type f | sort | xargs sha256sum`

// TestCopy: a copy has the source's work tree (commits, staged, unstaged,
// untracked, ignored files, modes, links, a read-only directory) and home
// at its own paths; git objects are shared by hard links and the two
// sandboxes change independently afterwards.
func TestCopy(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a.txt": "a\n", ".gitignore": "*.log\n"})
	d := newDriver(t, local.Gateway{})
	ctx := context.Background()
	src, err := d.Create(ctx, driver.Spec{ID: "src", WorkKey: "parent-fork-1", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	sh(t, src, `git checkout -q -b parent-fork-1 && echo b > b.txt && git add b.txt && git -c user.name=t -c user.email=t@x commit -qm b &&
echo edit >> a.txt && echo staged > s.txt && git add s.txt && echo new > u.txt && echo x > debug.log &&
printf '#!/bin/sh\n' > run.sh && chmod 755 run.sh && ln -s a.txt link && mkdir -p ro/in && echo r > ro/in/f && chmod 555 ro &&
mkdir -p "$HOME/.conv" && echo talk > "$HOME/.conv/c.jsonl"`)
	want := sh(t, src, describe)

	cp, err := d.Copy(ctx, src, driver.Spec{ID: "dst", WorkKey: "parent-fork-2"})
	if err != nil {
		t.Fatalf("copy: %v", err)
	}
	defer cp.Destroy(ctx)
	si, ci := src.Info(), cp.Info()
	if ci.ID != "dst" || ci.WorkKey != "parent-fork-2" || ci.WorkDir == si.WorkDir || ci.HomeDir == si.HomeDir || ci.BaseCommit != si.BaseCommit {
		t.Fatalf("copy info %+v (source %+v)", ci, si)
	}
	if got := sh(t, cp, describe); got != want {
		t.Errorf("copy:\n%s\nwant the source's:\n%s", got, want)
	}
	// Objects are linked, not copied.
	objs := strings.Fields(sh(t, src, `find .git/objects -type f | sort | head -3`))
	if len(objs) == 0 {
		t.Fatal("no object files")
	}
	for _, o := range objs {
		a, err1 := os.Stat(filepath.Join(si.WorkDir, o))
		b, err2 := os.Stat(filepath.Join(ci.WorkDir, o))
		if err1 != nil || err2 != nil || !os.SameFile(a, b) {
			t.Errorf("object %s is not shared: %v %v", o, err1, err2)
		}
	}
	// Independent from here on.
	sh(t, cp, `echo mine >> a.txt && git add -A && git -c user.name=t -c user.email=t@x commit -qm mine && echo more >> "$HOME/.conv/c.jsonl"`)
	if got := sh(t, src, describe); got != want {
		t.Errorf("the source changed with its copy:\n%s\nwas:\n%s", got, want)
	}
	sh(t, cp, `git fsck --no-progress --strict >/dev/null`)
}

// TestCopyBusy: a sandbox running a command is not copied; a command
// started on it after a copy runs normally.
func TestCopyBusy(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a.txt": "a\n"})
	d := newDriver(t, local.Gateway{})
	ctx := context.Background()
	src, err := d.Create(ctx, driver.Spec{ID: "src", WorkKey: "k1", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	r, w := io.Pipe()
	p, err := src.Exec(ctx, driver.ExecRequest{Argv: []string{"cat"}, Stdin: r})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Copy(ctx, src, driver.Spec{ID: "dst", WorkKey: "k2"}); !errors.Is(err, driver.ErrBusy) {
		t.Errorf("copy of a busy sandbox: %v, want ErrBusy", err)
	}
	if _, err := os.Stat(filepath.Join(d.Dir(), "k2")); !os.IsNotExist(err) {
		t.Errorf("a refused copy left its directory: %v", err)
	}
	w.Close()
	if st, err := p.Wait(); err != nil || st.Code != 0 {
		t.Fatalf("cat: %v %v", st, err)
	}
	cp, err := d.Copy(ctx, src, driver.Spec{ID: "dst", WorkKey: "k2"})
	if err != nil {
		t.Fatalf("copy of an idle sandbox: %v", err)
	}
	defer cp.Destroy(ctx)
	sh(t, src, "true")
	if err := src.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Copy(ctx, src, driver.Spec{ID: "dst2", WorkKey: "k3"}); !errors.Is(err, driver.ErrDestroyed) {
		t.Errorf("copy of a destroyed sandbox: %v, want ErrDestroyed", err)
	}
}
