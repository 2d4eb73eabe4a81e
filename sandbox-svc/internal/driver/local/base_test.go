package local_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/drivertest"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
)

// baseLayers lists the base layers on disk.
func baseLayers(t *testing.T, d *local.Driver) []string {
	t.Helper()
	got, err := filepath.Glob(filepath.Join(d.Dir(), ".layers", "base-*"))
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// needOverlay skips t where this process can't mount an overlay.
func needOverlay(t *testing.T) {
	t.Helper()
	if !overlaySupported(t) {
		t.Skip("no overlay mount here (needs root and overlayfs): creates clone")
	}
}

func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestConformanceBaseLayers: the conformance suite with creates served
// by base layers.
func TestConformanceBaseLayers(t *testing.T) {
	needOverlay(t)
	drivertest.Run(t, func(t *testing.T) driver.Driver { return newDriverOpts(t, local.Options{BaseLayers: 2}) })
}

// TestCreateFromBaseLayer: sandboxes of one repository at one commit are
// overlays of one base layer, made once; each holds the clone at its base,
// writes only to itself, and git in it finds the index clean without
// rewriting it (the layer's entries carry what the sandbox sees). Another
// base gets a layer of its own; a sandbox outlives its layer's eviction;
// nothing is left once they are gone.
func TestCreateFromBaseLayer(t *testing.T) {
	needOverlay(t)
	repo, first := drivertest.NewRepo(t, map[string]string{"a.txt": "a\n", "dir/b.txt": "b\n", ".gitignore": "*.log\n"})
	d := newDriverOpts(t, local.Options{BaseLayers: 1})
	ctx := context.Background()

	// Concurrent creates build one layer.
	var wg sync.WaitGroup
	sbs := make([]driver.Sandbox, 3)
	errs := make([]error, 3)
	for i := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sbs[i], errs[i] = d.Create(ctx, driver.Spec{ID: "s" + string(rune('0'+i)), WorkKey: "k" + string(rune('0'+i)), Repository: repo})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		defer sbs[i].Destroy(ctx)
	}
	if got := baseLayers(t, d); len(got) != 1 {
		t.Fatalf("base layers after 3 creates: %v, want 1", got)
	}
	for i, sb := range sbs {
		info := sb.Info()
		if info.BaseCommit != first {
			t.Errorf("sandbox %d base %q, want %q", i, info.BaseCommit, first)
		}
		if !drivertest.MountPoint(t, filepath.Dir(info.WorkDir)) {
			t.Errorf("sandbox %d is not mounted over the base layer", i)
		}
		if got := sh(t, sb, `git rev-parse HEAD && git status --porcelain && cat a.txt dir/b.txt`); got != first+"\na\nb\n" {
			t.Errorf("sandbox %d: %q", i, got)
		}
		// git status found every entry clean: it did not write the
		// index, so the upper directory holds no index.
		if _, err := os.Stat(filepath.Join(d.Dir(), ".upper", info.WorkKey, "upper", "work", ".git", "index")); !os.IsNotExist(err) {
			t.Errorf("sandbox %d: git rewrote the index (its entries did not match what the sandbox sees): %v", i, err)
		}
	}
	// Writes stay in their sandbox.
	sh(t, sbs[0], `echo mine >> a.txt && rm dir/b.txt && echo new > c.txt && git add -A && git -c user.name=t -c user.email=t@x commit -qm mine`)
	if got := sh(t, sbs[1], `git status --porcelain && git rev-parse HEAD && cat a.txt dir/b.txt; ls`); got != first+"\na\nb\na.txt\ndir\n" {
		t.Errorf("a sibling sees another's writes: %q", got)
	}
	layer := baseLayers(t, d)[0]
	if b, err := os.ReadFile(filepath.Join(layer, "work", "a.txt")); err != nil || string(b) != "a\n" {
		t.Errorf("the layer changed: %q %v", b, err)
	}

	// A new commit: a layer of its own (the cache keeps one: the first
	// goes once its sandboxes do).
	second := commitFile(t, repo, "a.txt", "a2\n")
	other, err := d.Create(ctx, driver.Spec{ID: "o", WorkKey: "other", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Destroy(ctx)
	if other.Info().BaseCommit != second {
		t.Errorf("base after a commit: %q, want %q", other.Info().BaseCommit, second)
	}
	if got := sh(t, other, `cat a.txt; git status --porcelain`); got != "a2\n" {
		t.Errorf("sandbox at the new commit: %q", got)
	}
	if got := baseLayers(t, d); len(got) != 2 {
		t.Errorf("layers while the first still has sandboxes: %v, want 2", got)
	}
	if got := sh(t, sbs[2], `cat a.txt`); got != "a\n" {
		t.Errorf("an evicted layer's sandbox: %q", got)
	}
	// A branch and a tag name their commits.
	gitIn(t, repo, "tag", "v1", first)
	gitIn(t, repo, "branch", "old", first)
	for _, ref := range []string{"v1", "old", first} {
		sb, err := d.Create(ctx, driver.Spec{ID: "r-" + ref[:2], WorkKey: "ref-" + ref[:2], Repository: repo, BaseRef: ref})
		if err != nil {
			t.Fatalf("base %s: %v", ref, err)
		}
		if sb.Info().BaseCommit != first || sh(t, sb, `git rev-parse HEAD`) != first+"\n" {
			t.Errorf("base %s: %q", ref, sb.Info().BaseCommit)
		}
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, sb := range append(sbs, other) {
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cached := baseLayers(t, d)
	if len(cached) != 1 {
		t.Errorf("layers once every sandbox is gone: %v, want the cached one", cached)
	}
	d.Close()
	// The cached layer stays for the next driver (TestBaseLayerKeptAcrossRestart);
	// nothing else does.
	if left, _ := filepath.Glob(filepath.Join(d.Dir(), ".layers", "*")); !slices.Equal(left, cached) {
		t.Errorf("layers left after Close: %v, want the cached %v", left, cached)
	}
	if left, _ := filepath.Glob(filepath.Join(d.Dir(), ".upper", "*")); len(left) > 0 {
		t.Errorf("upper directories left: %v", left)
	}
}

// TestBaseLayerKeptAcrossRestart: a cached base layer outlives the driver
// (a restart of hangar): the next driver on the directory adopts it and
// its next create mounts it (no clone, no new layer); one starting past
// the layer's hour, or with base layers off, removes it and its record.
func TestBaseLayerKeptAcrossRestart(t *testing.T) {
	needOverlay(t)
	repo, first := drivertest.NewRepo(t, map[string]string{"a.txt": "a\n"})
	root := t.TempDir()
	made := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	ctx := context.Background()
	start := func(at time.Time, layers int) *local.Driver {
		t.Helper()
		d, err := local.New(local.Options{Root: root, BaseLayers: layers, Now: func() time.Time { return at }})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	records := func(d *local.Driver) []string {
		got, _ := filepath.Glob(filepath.Join(d.Dir(), ".bases", "*"))
		return got
	}

	d := start(made, 1)
	sb, err := d.Create(ctx, driver.Spec{ID: "s1", WorkKey: "k1", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	layer := baseLayers(t, d)
	if len(layer) != 1 || len(records(d)) != 1 {
		t.Fatalf("after a create: layers %v, records %v", layer, records(d))
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	d.Close()

	for _, later := range []time.Duration{30 * time.Minute, 59 * time.Minute} {
		d = start(made.Add(later), 1)
		sb, err = d.Create(ctx, driver.Spec{ID: "s2", WorkKey: "k2", Repository: repo})
		if err != nil {
			t.Fatal(err)
		}
		if got := baseLayers(t, d); !slices.Equal(got, layer) {
			t.Errorf("%v later: layers %v, want the one kept %v", later, got, layer)
		}
		// Mounted over it: an untouched file is the layer's own.
		inLayer, err := os.Stat(filepath.Join(layer[0], "work", "a.txt"))
		if err != nil {
			t.Fatal(err)
		}
		inSandbox, err := os.Stat(filepath.Join(sb.Info().WorkDir, "a.txt"))
		if err != nil {
			t.Fatal(err)
		}
		if ino(inLayer) != ino(inSandbox) {
			t.Errorf("%v later: the sandbox's a.txt is not the kept layer's", later)
		}
		if got := sh(t, sb, `git rev-parse HEAD && git status --porcelain && cat a.txt`); got != first+"\na\n" {
			t.Errorf("%v later: %q", later, got)
		}
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
		d.Close()
	}

	// Base layers off: nothing is adopted, all of it is swept.
	d = start(made.Add(time.Minute), 0)
	if got, recs := baseLayers(t, d), records(d); len(got) != 0 || len(recs) != 0 {
		t.Errorf("with base layers off: layers %v, records %v, want none", got, recs)
	}
	d.Close()

	// Past its hour: swept at start.
	d = start(made, 1)
	sb, err = d.Create(ctx, driver.Spec{ID: "s3", WorkKey: "k3", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	d.Close()
	d = start(made.Add(time.Hour), 1)
	defer d.Close()
	if got, recs := baseLayers(t, d), records(d); len(got) != 0 || len(recs) != 0 {
		t.Errorf("an hour after it was made: layers %v, records %v, want none", got, recs)
	}
}

// commitFile commits name with content in repo and returns the commit.
func commitFile(t *testing.T, repo, name, content string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(repo, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	gitIn(t, repo, "add", name)
	gitIn(t, repo, "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-qm", "change "+name)
	return gitIn(t, repo, "rev-parse", "HEAD")
}

// TestBaseLayerRelocate: a sandbox made from a base layer (a warm one)
// moves to its session's directory with what setup wrote.
func TestBaseLayerRelocate(t *testing.T) {
	needOverlay(t)
	repo, _ := drivertest.NewRepo(t, map[string]string{"a.txt": "a\n"})
	d := newDriverOpts(t, local.Options{BaseLayers: 1})
	ctx := context.Background()
	sb, err := d.Create(ctx, driver.Spec{ID: "warm1", Repository: repo, Setup: []string{"echo set > setup.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	old := filepath.Dir(sb.Info().WorkDir)
	if err := sb.Relocate(ctx, "session-one"); err != nil {
		t.Fatalf("relocate: %v", err)
	}
	info := sb.Info()
	if info.WorkKey != "session-one" || filepath.Base(filepath.Dir(info.WorkDir)) != "session-one" {
		t.Fatalf("relocated to %+v", info)
	}
	if got := sh(t, sb, `pwd; cat a.txt setup.txt`); got != info.WorkDir+"\na\nset\n" {
		t.Errorf("after relocate: %q", got)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("the old directory is still there: %v", err)
	}
	if !drivertest.MountPoint(t, filepath.Dir(info.WorkDir)) {
		t.Error("relocated sandbox is not mounted")
	}
	sh(t, sb, `echo more > more.txt`)
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(d.Dir(), ".upper", "*")); len(left) > 0 {
		t.Errorf("upper directories left: %v", left)
	}
}

// TestBaseLayerCopy: the copy checks of TestCopy with a source made from a
// base layer: what it wrote becomes a layer over the base one, shared.
func TestBaseLayerCopy(t *testing.T) {
	needOverlay(t)
	testCopy(t, "base")
}

// TestBaseLayersOff: with no base layers, a create clones.
func TestBaseLayersOff(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a.txt": "a\n"})
	d := newDriverOpts(t, local.Options{})
	ctx := context.Background()
	sb, err := d.Create(ctx, driver.Spec{ID: "s", WorkKey: "k", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	if drivertest.MountPoint(t, filepath.Dir(sb.Info().WorkDir)) || len(baseLayers(t, d)) != 0 {
		t.Error("a create with base layers off is mounted over one")
	}
}

// TestBaseLayerSandboxAfterReboot: a machine restart takes the mounts and
// leaves the files: the next driver mounts each sandbox made from a base
// layer (and a copy stacked on it) again, so its work since its last
// checkpoint is revived as a plain sandbox's is.
func TestBaseLayerSandboxAfterReboot(t *testing.T) {
	needOverlay(t)
	repo, _ := drivertest.NewRepo(t, map[string]string{"a.txt": "a\n"})
	root := t.TempDir()
	crashed, err := local.New(local.Options{Root: root, BaseLayers: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src, err := crashed.Create(ctx, driver.Spec{ID: "sb-src", WorkKey: "s-1", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	sh(t, src, `echo late > late.txt && rm a.txt`)
	cp, err := crashed.Copy(ctx, src, driver.Spec{ID: "sb-cp", WorkKey: "s-2"})
	if err != nil {
		t.Fatal(err)
	}
	sh(t, cp, `echo mine > mine.txt`)
	// The crash: the process is gone (its lock with it), then the
	// machine: every mount is gone.
	crashed.Close()
	for _, k := range []string{"s-1", "s-2"} {
		if err := unix.Unmount(filepath.Join(root, "sandboxes", k), unix.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
	}

	d, err := local.New(local.Options{Root: root, BaseLayers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	list, err := d.Leftovers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"s-1": "late\ngone\n", "s-2": "late\nmine\ngone\n"}
	for _, lo := range list {
		script, ok := map[string]string{"s-1": `cat late.txt; test -e a.txt || echo gone`, "s-2": `cat late.txt mine.txt; test -e a.txt || echo gone`}[lo.Key]
		if !ok {
			continue
		}
		sb, err := d.Revive(ctx, lo)
		if err != nil {
			t.Fatalf("revive %s: %v", lo.Key, err)
		}
		if got := sh(t, sb, script); got != want[lo.Key] {
			t.Errorf("revived %s: %q, want %q", lo.Key, got, want[lo.Key])
		}
		delete(want, lo.Key)
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(want) > 0 {
		t.Errorf("not listed as leftovers with their ids: %v (listed %v)", want, list)
	}
	// The base layer the crashed driver kept is adopted (it is in its
	// hour); the layers of the copy go with the sandboxes.
	if left, _ := filepath.Glob(filepath.Join(d.Dir(), ".layers", "*")); len(left) != 1 || !strings.HasPrefix(filepath.Base(left[0]), "base-") {
		t.Errorf("layers left once the revived sandboxes are gone: %v, want the base layer", left)
	}
}

// TestAdoptedBaseLayerOutlivesItsEviction: after a restart (mounts kept),
// a sandbox revived over a base layer the new driver adopted keeps its
// files when the cache evicts that layer (the revived sandbox holds no
// reference to it); the layer goes with the sandbox's destroy.
func TestAdoptedBaseLayerOutlivesItsEviction(t *testing.T) {
	needOverlay(t)
	repo, _ := drivertest.NewRepo(t, map[string]string{"a.txt": "a\n"})
	other, _ := drivertest.NewRepo(t, map[string]string{"b.txt": "b\n"})
	root := t.TempDir()
	ctx := context.Background()
	first, err := local.New(local.Options{Root: root, BaseLayers: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Create(ctx, driver.Spec{ID: "sb-old", WorkKey: "s-1", Repository: repo}); err != nil {
		t.Fatal(err)
	}
	layer := baseLayers(t, first)
	first.Close() // the process ends; its sandbox's mount stays

	d, err := local.New(local.Options{Root: root, BaseLayers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	list, err := d.Leftovers(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("leftovers: %v %v", list, err)
	}
	revived, err := d.Revive(ctx, list[0])
	if err != nil {
		t.Fatal(err)
	}
	// Another repository's create evicts the adopted layer (one kept).
	sb, err := d.Create(ctx, driver.Spec{ID: "sb-new", WorkKey: "s-2", Repository: other})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	if got := sh(t, revived, `cat a.txt`); got != "a\n" {
		t.Errorf("the revived sandbox after its layer's eviction: %q", got)
	}
	if _, err := os.Stat(layer[0]); err != nil {
		t.Errorf("the evicted layer a revived sandbox mounts: %v", err)
	}
	if err := revived.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(layer[0]); !os.IsNotExist(err) {
		t.Errorf("the evicted layer once nothing mounts it: %v, want removed", err)
	}
}
