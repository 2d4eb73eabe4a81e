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

	got, err := d.Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]local.Leftover{}
	for _, lo := range got {
		byKey[lo.Key] = lo
	}
	if len(got) != 2 || byKey["sess-a"].ID != "sb-old" || byKey["sess-a"].Environment != "web" || byKey["no-marker"].ID != "" {
		t.Fatalf("leftovers = %+v, want sess-a (sb-old, web) and no-marker", got)
	}
	for _, lo := range got {
		if ok, err := d.RemoveLeftover(lo); !ok || err != nil {
			t.Fatalf("RemoveLeftover(%s) = %v, %v", lo.Key, ok, err)
		}
		if _, err := os.Stat(lo.Dir); !os.IsNotExist(err) {
			t.Errorf("%s after RemoveLeftover: %v", lo.Dir, err)
		}
	}
	// A key a live sandbox holds is never removed as a leftover.
	if ok, _ := d.RemoveLeftover(local.Leftover{Key: "sb-new"}); ok {
		t.Error("RemoveLeftover removed a live sandbox")
	}
	if _, err := os.Stat(live.Info().WorkDir); err != nil {
		t.Errorf("live sandbox after RemoveLeftover: %v", err)
	}
}
