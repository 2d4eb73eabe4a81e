package local_test

import (
	"context"
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
