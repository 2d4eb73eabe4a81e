package local_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/drivertest"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
)

// A driver owns its sandboxes directory: a second one on the same root is
// refused until the first closes.
func TestOneDriverPerRoot(t *testing.T) {
	root := t.TempDir()
	first, err := local.New(local.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := local.New(local.Options{Root: root}); err == nil || !strings.Contains(err.Error(), "in use by another sandbox service") {
		t.Fatalf("second driver on one root: %v, want in use", err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second, err := local.New(local.Options{Root: root})
	if err != nil {
		t.Fatalf("driver after the first closed: %v", err)
	}
	second.Close()
}

// Directories a previous process left behind are listed with the sandbox
// id from their marker, live ones are not, and RemoveLeftover removes them.
func TestLeftovers(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	root := t.TempDir()
	crashed, err := local.New(local.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := crashed.Create(ctx, driver.Spec{ID: "sb-old", WorkKey: "sess-a", Environment: "web", Repository: repo}); err != nil {
		t.Fatal(err)
	}
	// The process "ends": its lock goes, its sandbox stays on disk.
	crashed.Close()
	junk := filepath.Join(root, "sandboxes", "no-marker")
	if err := os.MkdirAll(filepath.Join(junk, "work"), 0o755); err != nil {
		t.Fatal(err)
	}

	d, err := local.New(local.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	live, err := d.Create(ctx, driver.Spec{ID: "sb-new", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Destroy(ctx)

	got, err := d.Leftovers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]driver.Leftover{}
	for _, lo := range got {
		byKey[lo.Key] = lo
	}
	if len(got) != 2 || byKey["sess-a"].ID != "sb-old" || byKey["sess-a"].Environment != "web" || byKey["no-marker"].ID != "" {
		t.Fatalf("leftovers = %+v, want sess-a (sb-old, web) and no-marker", got)
	}
	for _, lo := range got {
		if ok, err := d.RemoveLeftover(context.Background(), lo); !ok || err != nil {
			t.Fatalf("RemoveLeftover(%s) = %v, %v", lo.Key, ok, err)
		}
		if _, err := os.Stat(lo.Where); !os.IsNotExist(err) {
			t.Errorf("%s after RemoveLeftover: %v", lo.Where, err)
		}
	}
	// A key a live sandbox holds is never removed as a leftover.
	if ok, _ := d.RemoveLeftover(context.Background(), driver.Leftover{Key: "sb-new"}); ok {
		t.Error("RemoveLeftover removed a live sandbox")
	}
	if _, err := os.Stat(live.Info().WorkDir); err != nil {
		t.Errorf("live sandbox after RemoveLeftover: %v", err)
	}
}

// Copies an earlier process left mounted over a layer: the layer stays
// while a leftover mounts it, and goes with the last of them; a new
// driver's copies work beside them.
func TestLeftoverCopies(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	root := t.TempDir()
	crashed, err := local.New(local.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := crashed.Create(ctx, driver.Spec{ID: "sb-src", WorkKey: "fork-1", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := crashed.Copy(ctx, src, driver.Spec{ID: "sb-cp", WorkKey: "fork-2"})
	if err != nil {
		t.Fatal(err)
	}
	if !drivertest.MountPoint(t, filepath.Dir(cp.Info().WorkDir)) {
		if overlaySupported(t) {
			t.Fatal("the copy is not mounted, though this machine mounts overlays")
		}
		crashed.Close()
		for _, sb := range []driver.Sandbox{src, cp} {
			sb.Destroy(ctx)
		}
		t.Skip("no overlay mount here (needs root and overlayfs)")
	}
	crashed.Close()

	d, err := local.New(local.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	layers := func() []string {
		l, _ := filepath.Glob(filepath.Join(d.Dir(), ".layers", "*"))
		return l
	}
	if len(layers()) != 1 {
		t.Fatalf("layers after a restart: %v, want the one the leftovers mount", layers())
	}
	got, err := d.Leftovers(context.Background())
	if err != nil || len(got) != 2 {
		t.Fatalf("leftovers = %+v, %v; want the source and its copy", got, err)
	}
	if ok, err := d.RemoveLeftover(context.Background(), got[0]); !ok || err != nil {
		t.Fatalf("RemoveLeftover(%s) = %v, %v", got[0].Key, ok, err)
	}
	if len(layers()) != 1 {
		t.Fatalf("layers with one leftover mounting it: %v", layers())
	}
	if b, err := os.ReadFile(filepath.Join(got[1].Where, "work", "a")); err != nil || string(b) != "b" {
		t.Errorf("the other leftover's file: %q, %v", b, err)
	}
	if ok, err := d.RemoveLeftover(context.Background(), got[1]); !ok || err != nil {
		t.Fatalf("RemoveLeftover(%s) = %v, %v", got[1].Key, ok, err)
	}
	if len(layers()) != 0 {
		t.Errorf("layers with no leftover: %v", layers())
	}
	if uppers, _ := filepath.Glob(filepath.Join(d.Dir(), ".upper", "*")); len(uppers) != 0 {
		t.Errorf("upper directories with no leftover: %v", uppers)
	}
	for _, lo := range got {
		if _, err := os.Stat(lo.Where); !os.IsNotExist(err) {
			t.Errorf("%s after RemoveLeftover: %v", lo.Where, err)
		}
	}
}

// A leftover is revived with its files as the crashed process left them
// (work written after the last checkpoint included): commands run in it,
// egress none (nothing it runs needs the network), and destroying it
// removes it. A key in use, or a leftover whose files are gone, is not
// revived and is left for RemoveLeftover.
func TestReviveLeftover(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	root := t.TempDir()
	crashed, err := local.New(local.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	old, err := crashed.Create(ctx, driver.Spec{ID: "sb-old", WorkKey: "sess-a", Environment: "web", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.WriteFile(ctx, "late.txt", []byte("late work\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	crashed.Close()
	broken := filepath.Join(root, "sandboxes", "sess-b")
	if err := os.MkdirAll(broken, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(broken, "sandbox.json"), []byte(`{"id":"sb-broken","environment":"web"}`), 0o644); err != nil {
		t.Fatal(err)
	}

	d, err := local.New(local.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	byKey := map[string]driver.Leftover{}
	list, err := d.Leftovers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, lo := range list {
		byKey[lo.Key] = lo
	}
	if _, err := d.Revive(ctx, byKey["sess-b"]); err == nil || !strings.Contains(err.Error(), "files are gone") {
		t.Errorf("revive of a leftover without files: %v, want an error saying so", err)
	}
	if _, err := os.Stat(broken); err != nil {
		t.Errorf("a leftover that was not revived is removed by RemoveLeftover, not Revive: %v", err)
	}
	sb, err := d.Revive(ctx, byKey["sess-a"])
	if err != nil {
		t.Fatal(err)
	}
	info := sb.Info()
	if info.ID != "sb-old" || info.WorkKey != "sess-a" || info.WorkDir != old.Info().WorkDir {
		t.Errorf("revived info = %+v, want sb-old at %s", info, old.Info().WorkDir)
	}
	if info.Egress != driver.EgressNone && os.Geteuid() == 0 {
		t.Errorf("revived egress = %v, want none", info.Egress)
	}
	var out bytes.Buffer
	p, err := sb.Exec(ctx, driver.ExecRequest{Argv: []string{"cat", "late.txt", "a"}, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := p.Wait(); err != nil || st.Code != 0 || out.String() != "late work\nb" {
		t.Errorf("cat in the revived sandbox: %v %v %q", st, err, out.String())
	}
	if left, _ := d.Leftovers(ctx); len(left) != 1 || left[0].Key != "sess-b" {
		t.Errorf("leftovers with sess-a revived: %+v, want only sess-b", left)
	}
	if _, err := d.Revive(ctx, byKey["sess-a"]); !errors.Is(err, driver.ErrInUse) {
		t.Errorf("second revive of one leftover: %v, want in use", err)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(byKey["sess-a"].Where); !os.IsNotExist(err) {
		t.Errorf("revived leftover after destroy: %v, want removed", err)
	}
}

// A copy an earlier process left mounted over a layer is revived on that
// mount; destroying it removes its upper directory, and the layer goes
// with the last leftover mounting it.
func TestReviveLeftoverCopy(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	root := t.TempDir()
	crashed, err := local.New(local.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := crashed.Create(ctx, driver.Spec{ID: "sb-src", WorkKey: "fork-1", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := crashed.Copy(ctx, src, driver.Spec{ID: "sb-cp", WorkKey: "fork-2"})
	if err != nil {
		t.Fatal(err)
	}
	if !drivertest.MountPoint(t, filepath.Dir(cp.Info().WorkDir)) {
		crashed.Close()
		for _, sb := range []driver.Sandbox{src, cp} {
			sb.Destroy(ctx)
		}
		t.Skip("no overlay mount here (needs root and overlayfs)")
	}
	if _, err := cp.WriteFile(ctx, "late.txt", []byte("in the copy\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	crashed.Close()

	d, err := local.New(local.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var copyLo, srcLo driver.Leftover
	list, _ := d.Leftovers(ctx)
	for _, lo := range list {
		switch lo.Key {
		case "fork-2":
			copyLo = lo
		case "fork-1":
			srcLo = lo
		}
	}
	sb, err := d.Revive(ctx, copyLo)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := sb.ReadFile(ctx, "late.txt", 1<<20)
	if err != nil || string(b) != "in the copy\n" {
		t.Fatalf("late.txt in the revived copy: %q %v", b, err)
	}
	if b, _, err := sb.ReadFile(ctx, "a", 1<<20); err != nil || string(b) != "b" {
		t.Fatalf("the layer's file in the revived copy: %q %v", b, err)
	}
	if _, err := d.Copy(ctx, sb, driver.Spec{ID: "sb-cp2", WorkKey: "fork-3"}); err == nil {
		t.Error("a revived leftover was copied")
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d.Dir(), ".upper", "fork-2")); !os.IsNotExist(err) {
		t.Errorf("the revived copy's upper directory after destroy: %v, want removed", err)
	}
	if l, _ := filepath.Glob(filepath.Join(d.Dir(), ".layers", "*")); len(l) != 1 {
		t.Errorf("layers with the source leftover still mounting: %v, want 1", l)
	}
	if ok, err := d.RemoveLeftover(ctx, srcLo); !ok || err != nil {
		t.Fatalf("RemoveLeftover(%s) = %v, %v", srcLo.Key, ok, err)
	}
	if l, _ := filepath.Glob(filepath.Join(d.Dir(), ".layers", "*")); len(l) != 0 {
		t.Errorf("layers with no leftover: %v", l)
	}
}
