package local

// Base layers (issue 16). A cold create used to clone the repository and
// check out its base: at 5,000 files that is seconds on this machine's
// disk, most of it creating inodes, and the destroy that later deletes
// them slows the next creates down (ext4 skips recently freed inodes one
// by one). A create now mounts an overlay of a base layer instead: one
// read-only clone per (repository, base commit), made once by the first
// create that needs it and shared by every sandbox made from it after, so
// a sandbox costs one mount and its own writes, and its destroy removes
// only those. A base layer is made as a sandbox of its own (cloned like
// any, its index refreshed inside the jail so its entries carry the uid
// and stat data the sandboxes see: git in a sandbox then reads none of
// the files again), whose work tree and home are then moved into the
// layer. Nothing is trusted more than a clone: a session's restore
// verifies the tree it restored by its hash as before, and a sandbox
// reads the layer only through its own overlay (a write goes to its upper
// directory, never to the layer).
//
// The cache keeps the Options.BaseLayers layers used most recently
// (each holds a reference; a layer goes once nothing mounts it), a layer
// is used for BaseLayerMaxAge after it was made (its clone's origin refs
// are those of that time, as a pooled sandbox's are), and none is made
// while the disk has less than baseMinFree free. Whatever fails on the way
// (no overlays here, a ref that can't be resolved without a clone, a
// build that fails) makes the create clone, as before.
//
// The cached layers outlive the process: each has a record in .bases
// (its repository, commit and when it was made), Close leaves them, and
// a driver starting on the directory adopts those still in their hour,
// the most recent first up to its limit (adoptBases), so a restart of
// hangar does not make the next cold create of each repository clone
// again. The rest go with the sweep.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// BaseLayerMaxAge is how long after it was made a base layer serves new
// sandboxes.
const BaseLayerMaxAge = time.Hour

// baseMinFree: no base layer is made with less free disk than this.
const baseMinFree = 2 << 30

// basesDir is the directory under the sandboxes directory holding a record
// of each cached base layer (<layer's name>.json); not a valid work key.
const basesDir = ".bases"

// baseRecord is what .bases keeps of a cached base layer.
type baseRecord struct {
	Repository string    `json:"repository"`
	Commit     string    `json:"commit"`
	Made       time.Time `json:"made"`
}

// baseRecordOf is the path of layer dir's record.
func (d *Driver) baseRecordOf(dir string) string {
	return filepath.Join(d.dir, basesDir, filepath.Base(dir)+".json")
}

// baseKey names what a base layer holds.
type baseKey struct {
	repository string
	commit     string
}

// baseLayer is a cached base layer.
type baseLayer struct {
	l        *layer
	made     time.Time
	lastUsed time.Time
}

// baseCache is the driver's base layers, and the builds in flight.
type baseCache struct {
	mu       sync.Mutex
	layers   map[baseKey]*baseLayer
	building map[baseKey]*baseBuild
}

// baseBuild is a base layer being made; done closes when l or err is set.
type baseBuild struct {
	done chan struct{}
	l    *layer
	err  error
}

// errNoBase: the repository does not hold the base asked for.
var errNoBase = errors.New("base not found")

// fullCommit is a full object name.
var fullCommit = regexp.MustCompile(`^[0-9a-f]{40}([0-9a-f]{24})?$`)

// resolveBase is the commit a clone of repository at ref would check out,
// found without cloning: for a local repository by reading it, for a URL
// by asking it (ls-remote). ok is false when it can't be told so (a ref
// that is neither HEAD, a branch, a tag nor a full commit name; the clone
// then finds it its own way).
func resolveBase(ctx context.Context, repository, ref string) (commit string, ok bool, err error) {
	if ref == "" {
		ref = "HEAD"
	}
	if st, statErr := os.Stat(repository); statErr == nil && st.IsDir() {
		cands := []string{"refs/tags/" + ref, "refs/heads/" + ref}
		switch {
		case ref == "HEAD":
			cands = []string{"HEAD"}
		case fullCommit.MatchString(ref):
			cands = []string{ref}
		}
		for _, c := range cands {
			out, err := git(ctx, repository, "rev-parse", "--verify", "--quiet", "--end-of-options", c+"^{commit}")
			if err == nil {
				return strings.TrimSpace(out), true, nil
			}
		}
		if fullCommit.MatchString(ref) {
			// No clone of it would have it either.
			return "", false, fmt.Errorf("%w: commit %s is not in %s", errNoBase, ref, repository)
		}
		return "", false, nil
	}
	if fullCommit.MatchString(ref) {
		return ref, true, nil
	}
	pattern := []string{"refs/tags/" + ref, "refs/tags/" + ref + "^{}", "refs/heads/" + ref}
	if ref == "HEAD" {
		pattern = []string{"HEAD"}
	}
	out, err := git(ctx, "", "ls-remote", "--", repository, ref)
	if err != nil {
		return "", false, err
	}
	found := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		hash, name, ok := strings.Cut(line, "\t")
		if ok {
			found[name] = hash
		}
	}
	// A peeled tag names the commit; an unpeeled one the tag object.
	if c, ok := found[pattern[0]+"^{}"]; ok && ref != "HEAD" {
		return c, true, nil
	}
	for _, p := range pattern {
		if c, ok := found[p]; ok && fullCommit.MatchString(c) {
			return c, true, nil
		}
	}
	return "", false, nil
}

// baseFor returns a base layer of spec's repository at its base, with a
// reference taken for the caller, and the commit it holds; nil when the
// create must clone (base layers off or not possible here, the base not
// resolvable without a clone).
func (d *Driver) baseFor(ctx context.Context, spec driver.Spec) (*layer, string, error) {
	if d.opts.BaseLayers <= 0 || spec.Repository == "" {
		return nil, "", nil
	}
	d.mu.Lock()
	off := d.noOverlay
	d.mu.Unlock()
	if off {
		return nil, "", nil
	}
	commit, ok, err := resolveBase(ctx, spec.Repository, spec.BaseRef)
	if err != nil || !ok {
		return nil, "", err
	}
	key := baseKey{repository: spec.Repository, commit: commit}
	now := d.opts.Now()
	c := &d.bases
	for {
		c.mu.Lock()
		if bl := c.layers[key]; bl != nil && now.Sub(bl.made) < BaseLayerMaxAge {
			bl.lastUsed = now
			d.mu.Lock()
			bl.l.refs++
			d.mu.Unlock()
			c.mu.Unlock()
			return bl.l, commit, nil
		}
		if b := c.building[key]; b != nil {
			c.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil, "", ctx.Err()
			case <-b.done:
			}
			if b.err != nil {
				return nil, "", b.err
			}
			continue // take it from the cache (or build again if it left)
		}
		b := &baseBuild{done: make(chan struct{})}
		if c.building == nil {
			c.building = map[baseKey]*baseBuild{}
		}
		c.building[key] = b
		c.mu.Unlock()
		b.l, b.err = d.buildBase(context.WithoutCancel(ctx), spec, commit)
		c.mu.Lock()
		delete(c.building, key)
		if b.err == nil {
			// The caller's reference, beside the cache's.
			d.mu.Lock()
			b.l.refs++
			d.mu.Unlock()
			d.keepBase(key, b.l, now)
		}
		c.mu.Unlock()
		close(b.done)
		if b.err != nil {
			return nil, "", b.err
		}
		return b.l, commit, nil
	}
}

// keepBase puts l in the cache under key (the cache holds the reference
// buildBase returned) and drops the layers past the limit, least recently
// used first. On d.bases.mu.
func (d *Driver) keepBase(key baseKey, l *layer, now time.Time) {
	c := &d.bases
	if c.layers == nil {
		c.layers = map[baseKey]*baseLayer{}
	}
	if old := c.layers[key]; old != nil {
		d.dropBase(old)
	}
	c.layers[key] = &baseLayer{l: l, made: now, lastUsed: now}
	if err := d.writeBaseRecord(l.dir, baseRecord{Repository: key.repository, Commit: key.commit, Made: now}); err != nil {
		// Kept for this process only: a restart sweeps it.
		d.opts.Logger.Warn("sandbox base layer not recorded", "layer", l.dir, "error", err)
	}
	for len(c.layers) > d.opts.BaseLayers {
		var oldest baseKey
		var found *baseLayer
		for k, bl := range c.layers {
			if k == key {
				continue // the one just kept
			}
			if found == nil || bl.lastUsed.Before(found.lastUsed) {
				oldest, found = k, bl
			}
		}
		delete(c.layers, oldest)
		d.dropBase(found)
	}
}

// dropBase releases the cache's reference to bl's layer and its record: it
// goes once no sandbox mounts it.
func (d *Driver) dropBase(bl *baseLayer) {
	if err := os.Remove(d.baseRecordOf(bl.l.dir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		d.opts.Logger.Warn("sandbox base layer's record not removed", "layer", bl.l.dir, "error", err)
	}
	if err := d.releaseLayer(bl.l); err != nil {
		d.opts.Logger.Warn("sandbox base layer not removed", "layer", bl.l.dir, "error", err)
	}
}

// closeBases forgets the cached base layers (Close): their files and
// records stay for the next driver on the directory to adopt.
func (d *Driver) closeBases() {
	c := &d.bases
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.layers)
}

// writeBaseRecord writes the record of the base layer in dir (a new file
// renamed into place: a crash leaves the old record or the new one).
func (d *Driver) writeBaseRecord(dir string, r baseRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	p := d.baseRecordOf(dir)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	return nil
}

// adoptBases takes into the cache, at start, the base layers an earlier
// driver on this directory kept (their records in .bases): those whose
// files are there and that are still in their BaseLayerMaxAge, the most
// recently made first, up to Options.BaseLayers. What it does not adopt
// the sweep that follows removes (a layer is not in d.layers; a record
// whose layer is not, see sweepLayers).
func (d *Driver) adoptBases() {
	if d.opts.BaseLayers <= 0 {
		return
	}
	ents, _ := os.ReadDir(filepath.Join(d.dir, basesDir))
	type found struct {
		key baseKey
		dir string
		rec baseRecord
	}
	var all []found
	now := d.opts.Now()
	for _, ent := range ents {
		name, ok := strings.CutSuffix(ent.Name(), ".json")
		if !ok || !strings.HasPrefix(name, "base-") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d.dir, basesDir, ent.Name()))
		var r baseRecord
		if err != nil || json.Unmarshal(b, &r) != nil || r.Repository == "" || !fullCommit.MatchString(r.Commit) {
			continue
		}
		if age := now.Sub(r.Made); age < 0 || age >= BaseLayerMaxAge {
			continue
		}
		dir := filepath.Join(d.dir, layersDir, name)
		if !isLayer(dir) {
			continue
		}
		all = append(all, found{key: baseKey{repository: r.Repository, commit: r.Commit}, dir: dir, rec: r})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].rec.Made.After(all[j].rec.Made) })
	c := &d.bases
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.layers == nil {
		c.layers = map[baseKey]*baseLayer{}
	}
	for _, f := range all {
		if len(c.layers) >= d.opts.BaseLayers {
			break
		}
		if c.layers[f.key] != nil {
			continue // an older layer of the same base: swept
		}
		d.mu.Lock()
		l := d.layers[f.dir]
		if l == nil {
			l = &layer{dir: f.dir}
			d.layers[f.dir] = l
		}
		l.refs++ // the cache's
		d.mu.Unlock()
		c.layers[f.key] = &baseLayer{l: l, made: f.rec.Made, lastUsed: f.rec.Made}
	}
}

// isLayer says whether dir holds a layer's files (work/ and home/).
func isLayer(dir string) bool {
	for _, sub := range layerSubtrees {
		if st, err := os.Stat(filepath.Join(dir, sub)); err != nil || !st.IsDir() {
			return false
		}
	}
	return true
}

// buildBase makes a base layer of spec's repository at commit: a sandbox
// is created as a cold create makes one (a clone checked out at commit,
// no setup), its index refreshed by git inside it, then its work tree and
// home become the layer. It returns the layer with one reference (the
// caller's).
func (d *Driver) buildBase(ctx context.Context, spec driver.Spec, commit string) (*layer, error) {
	if free, err := d.FreeDisk(); err == nil && free < baseMinFree {
		return nil, fmt.Errorf("base layer: %d MB free on the sandboxes' disk", free>>20)
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	name := "base-" + hex.EncodeToString(id[:])
	built, err := d.create(ctx, driver.Spec{ID: name, Environment: spec.Environment, Repository: spec.Repository, BaseRef: commit}, nil, func(sb *Sandbox) error {
		got, err := sb.cloneAt(ctx, false)
		if err != nil {
			return err
		}
		if got != commit {
			return fmt.Errorf("base layer: the clone checked out %s, not %s", got, commit)
		}
		return sb.refreshIndexInside(ctx)
	})
	if err != nil {
		return nil, fmt.Errorf("base layer of %s at %s: %w", spec.Repository, commit, err)
	}
	sb := built.(*Sandbox)
	l, err := d.takeFiles(sb)
	if derr := sb.Destroy(ctx); derr != nil {
		d.opts.Logger.Warn("base layer's build sandbox not removed", "sandbox", name, "error", derr)
	}
	if err != nil {
		return nil, fmt.Errorf("base layer of %s at %s: %w", spec.Repository, commit, err)
	}
	return l, nil
}

// refreshIndexInside refreshes the work tree's index with git run in the
// sandbox, once the second the index was written in has passed (an entry
// of that second would stay racily clean): the entries then hold the
// owner, inode and times that git in a sandbox sees, where a clone made
// outside left the service's uid (git would read every file again at each
// command in every sandbox made from the layer).
func (sb *Sandbox) refreshIndexInside(ctx context.Context) error {
	if err := awaitIndexSecond(ctx, sb.workDir()); err != nil {
		return err
	}
	var out limitedBuffer
	p, err := sb.start(ctx, driver.ExecRequest{Argv: []string{"git", "update-index", "-q", "--refresh"}, Stdout: &out, Stderr: &out}, false, false)
	if err != nil {
		return fmt.Errorf("refresh the index: %w", err)
	}
	es, err := p.Wait()
	if err != nil {
		return fmt.Errorf("refresh the index: %w", err)
	}
	// 1: entries that need updating (none after a checkout; said, not
	// fatal). Anything else failed.
	if es.Code > 1 || es.Signal != "" {
		return fmt.Errorf("refresh the index: exit %d%s: %s", es.Code, es.Signal, strings.TrimSpace(out.String()))
	}
	return nil
}

// takeFiles moves sb's work tree and home (sb is plain, its processes
// ended) into a new layer with one reference, the caller's. sb is left
// without them.
func (d *Driver) takeFiles(sb *Sandbox) (*layer, error) {
	if err := sb.KillProcesses(context.Background()); err != nil {
		return nil, err
	}
	sb.stopHolder()
	sb.mu.Lock()
	dir := sb.dir
	sb.mu.Unlock()
	ldir, err := d.newLayerDir("base-")
	if err != nil {
		return nil, err
	}
	for _, sub := range layerSubtrees {
		if err := os.Rename(filepath.Join(dir, sub), filepath.Join(ldir, sub)); err != nil {
			return nil, errors.Join(err, removeAll(ldir))
		}
	}
	l := &layer{dir: ldir, refs: 1}
	d.mu.Lock()
	d.layers[ldir] = l
	d.mu.Unlock()
	return l, nil
}
