package local_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
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
// at its own paths, and the two sandboxes change independently afterwards.
// By overlay (where this machine mounts one) the copy shares the source's
// files; copying files, it shares git's objects by hard links.
func TestCopy(t *testing.T) {
	for _, mode := range []string{"overlay", "files"} {
		t.Run(mode, func(t *testing.T) { testCopy(t, mode) })
	}
}

func testCopy(t *testing.T, mode string) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a.txt": "a\n", ".gitignore": "*.log\n"})
	// base: the source is made from a base layer (base.go), so its
	// copy stacks the source's writes on it.
	d := newDriverOpts(t, local.Options{CopyFiles: mode == "files", BaseLayers: map[bool]int{true: 1}[mode == "base"]})
	ctx := context.Background()
	src, err := d.Create(ctx, driver.Spec{ID: "src", WorkKey: "parent-fork-1", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Destroy(ctx)
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
	if got := sh(t, src, describe); got != want {
		t.Errorf("the source after the copy:\n%s\nwas:\n%s", got, want)
	}
	overlaid := drivertest.MountPoint(t, filepath.Dir(ci.WorkDir))
	switch {
	case mode == "files" && overlaid:
		t.Fatal("CopyFiles: the copy is mounted")
	case mode != "files" && !overlaid && overlaySupported(t):
		t.Fatal("the copy is not mounted, though this machine mounts overlays")
	case mode != "files" && !overlaid:
		t.Skip("no overlay mount here (needs root and overlayfs): the copy copied its files")
	}
	// Objects (every file, by overlay) are shared, not copied.
	objs := strings.Fields(sh(t, src, `find .git/objects -type f | sort | head -3`))
	if len(objs) == 0 {
		t.Fatal("no object files")
	}
	if mode != "files" {
		objs = append(objs, "a.txt", "ro/in/f")
	}
	for _, o := range objs {
		a, err1 := os.Stat(filepath.Join(si.WorkDir, o))
		b, err2 := os.Stat(filepath.Join(ci.WorkDir, o))
		if err1 != nil || err2 != nil || ino(a) != ino(b) {
			t.Errorf("%s is not shared: %v %v", o, err1, err2)
		}
	}
	// Independent from here on, both ways.
	sh(t, cp, `echo mine >> a.txt && git add -A && git -c user.name=t -c user.email=t@x commit -qm mine && echo more >> "$HOME/.conv/c.jsonl" && chmod 755 ro && rm -r ro && mv u.txt moved.txt`)
	if got := sh(t, src, describe); got != want {
		t.Errorf("the source changed with its copy:\n%s\nwas:\n%s", got, want)
	}
	sh(t, cp, `git fsck --no-progress --strict >/dev/null`)
	copied := sh(t, cp, describe)
	sh(t, src, `echo theirs > b.txt && mkdir d && echo f > d/f && mv d d2 && rm "$HOME/.conv/c.jsonl"`)
	if got := sh(t, cp, describe); got != copied {
		t.Errorf("the copy changed with its source:\n%s\nwas:\n%s", got, copied)
	}
	// A second copy of the source, written to since: its files as they
	// are now.
	want2 := sh(t, src, describe)
	cp2, err := d.Copy(ctx, src, driver.Spec{ID: "dst2", WorkKey: "parent-fork-3"})
	if err != nil {
		t.Fatalf("second copy: %v", err)
	}
	if got := sh(t, cp2, describe); got != want2 {
		t.Errorf("second copy:\n%s\nwant:\n%s", got, want2)
	}
	// Each goes on its own; the layer with the last of them.
	for _, sb := range []driver.Sandbox{src, cp2} {
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := sh(t, cp, describe); got != copied {
		t.Errorf("the copy once the source is gone:\n%s\nwas:\n%s", got, copied)
	}
	if err := cp.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	left, _ := filepath.Glob(filepath.Join(d.Dir(), "*", "*"))
	// The base layer stays cached for the next create.
	left = slices.DeleteFunc(left, func(p string) bool {
		return mode == "base" && (strings.HasPrefix(p, filepath.Join(d.Dir(), ".layers", "base-")) || strings.HasPrefix(p, filepath.Join(d.Dir(), ".bases", "base-")))
	})
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if left, _ := filepath.Glob(filepath.Join(d.Dir(), ".layers", "layer-*")); len(left) > 0 {
		t.Errorf("layers left behind: %v", left)
	}
}

func ino(fi os.FileInfo) uint64 { return fi.Sys().(*syscall.Stat_t).Ino }

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

// BenchmarkCopy: a copy of a sandbox holding a 200-file work tree, by
// overlay and by copying files.
func BenchmarkCopy(b *testing.B) {
	files := map[string]string{}
	for i := range 200 {
		files[fmt.Sprintf("dir%d/f%d.txt", i%10, i)] = strings.Repeat("line\n", i)
	}
	for _, mode := range []string{"overlay", "files"} {
		b.Run(mode, func(b *testing.B) {
			repo, _ := drivertest.NewRepo(b, files)
			d, err := local.New(local.Options{Root: b.TempDir(), CopyFiles: mode == "files"})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			ctx := context.Background()
			src, err := d.Create(ctx, driver.Spec{ID: "src", WorkKey: "src", Repository: repo})
			if err != nil {
				b.Fatal(err)
			}
			defer src.Destroy(ctx)
			var copies []driver.Sandbox
			for i := 0; b.Loop(); i++ {
				cp, err := d.Copy(ctx, src, driver.Spec{ID: fmt.Sprintf("c%d", i), WorkKey: fmt.Sprintf("c%d", i)})
				if err != nil {
					b.Fatal(err)
				}
				copies = append(copies, cp)
			}
			b.StopTimer()
			for _, cp := range copies {
				cp.Destroy(ctx)
			}
		})
	}
}

// overlaySupported says whether this process can mount an overlay.
func overlaySupported(t *testing.T) bool {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"l", "u", "w", "m"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s/l,upperdir=%s/u,workdir=%s/w", dir, dir, dir)
	if err := unix.Mount("overlay", filepath.Join(dir, "m"), "overlay", 0, opts); err != nil {
		return false
	}
	if err := unix.Unmount(filepath.Join(dir, "m"), 0); err != nil {
		t.Fatal(err)
	}
	return true
}
