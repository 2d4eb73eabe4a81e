// Package local is the default sandbox driver: a sandbox is a directory
// <root>/sandboxes/<work key>/{work,home} on this machine, its processes run
// there with HOME set to home, each exec in its own process group, and with
// egress none inside a private network namespace whose only way out is a
// relay to the gateway.
package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// Options configure the local driver.
type Options struct {
	// Root holds the sandboxes directory (HANGAR_HOME).
	Root string
	// Gateway is reachable from egress-none sandboxes through a relay.
	Gateway Gateway
	Logger  *slog.Logger
	// Now is the clock for CreatedAt.
	Now func() time.Time
	// CopyFiles makes Copy copy every file even where it could mount an
	// overlay (see overlay.go).
	CopyFiles bool
	// Isolation of the sandboxes' processes (isolation.go).
	Isolation Isolation
	// ReadOnlyPaths are host paths every sandbox sees read-only at the same
	// path (the agent CLIs' install directories, see InstallDirs).
	ReadOnlyPaths []string
	// SearchPath are directories put before the system's on an isolated
	// sandbox's PATH: where the agent CLIs named without a directory were
	// found on this service's PATH (their directories are ReadOnlyPaths).
	SearchPath []string
	// BaseLayers is how many base layers (base.go) the driver keeps: a
	// create mounts an overlay of a clone shared per (repository, base
	// commit) instead of cloning. 0: every create clones.
	BaseLayers int
	// Tool is the hangar-sandbox binary; New checks its protocol version
	// and puts a copy first on every sandbox's PATH (tool.go). Sandboxes
	// have none when it is empty (tests of the driver alone).
	Tool string
}

// Driver is the local driver.
type Driver struct {
	opts Options
	dir  string

	mu        sync.Mutex
	keys      map[string]*Sandbox // live sandboxes by directory key
	layers    map[string]*layer   // layers in use, by directory
	noOverlay bool                // an overlay mount failed: copies copy files, creates clone
	bases     baseCache           // base layers (base.go)
	cgroups   *cgroupTree         // nil where cgroups can't be made
	jail      *jail               // nil with IsolationNone or when bwrap can't run
	jailErr   error               // why jail is nil under IsolationBwrap
	starting  sync.WaitGroup      // holders starting in the background (Close waits)
	lock      *os.File            // flock on the sandboxes directory; nil after Close
	toolDir   string              // holds hangar-sandbox; "" without one
	toolProto int                 // the protocol version it speaks
}

// New returns a local driver keeping its sandboxes under opts.Root. It takes
// the sandboxes directory for this process (a second driver on the same root
// fails) until Close.
func New(opts Options) (*Driver, error) {
	if opts.Root == "" {
		return nil, errors.New("local driver: root is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	dir := filepath.Join(opts.Root, "sandboxes")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("local driver: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("local driver: %w", err)
	}
	d := &Driver{opts: opts, dir: dir, keys: map[string]*Sandbox{}, layers: map[string]*layer{}, lock: lock, cgroups: newCgroupTree(dir)}
	if opts.Tool != "" {
		if d.toolDir, d.toolProto, err = installTool(opts.Tool, dir); err != nil {
			lock.Close()
			return nil, fmt.Errorf("local driver: %w", err)
		}
	}
	if opts.BaseLayers > 0 && !canMountOverlay(dir) {
		// Not root, or no overlayfs: creates clone, as they did before
		// base layers (nothing is built that could not be mounted).
		d.opts.BaseLayers = 0
		opts.Logger.Info("sandbox base layers off: overlays cannot be mounted here (needs root and overlayfs); creates clone")
	}
	if err := d.remountLost(); err != nil {
		opts.Logger.Warn("sandboxes mounted over layers not mounted again", "error", err)
	}
	d.adoptBases()
	if err := d.sweepLayers(); err != nil {
		opts.Logger.Warn("unused sandbox layers not removed", "error", err)
	}
	// Every /tmp there is an earlier process's sandbox's.
	if err := removeAll(filepath.Join(dir, tmpsDir)); err != nil {
		opts.Logger.Warn("old sandbox tmp directories not removed", "error", err)
	}
	switch opts.Isolation {
	case IsolationBwrap:
		closeInheritedOnExec()
		d.jail, d.jailErr = newJail(opts.Root, opts.ReadOnlyPaths)
		if d.jail != nil && d.toolDir != "" {
			// hangar-sandbox and hangar-agent, read-only: the one part
			// of the sandboxes directory a sandbox sees.
			d.jail.tools = []string{d.toolDir}
		}
		if d.jailErr != nil {
			opts.Logger.Error("sandboxes cannot be isolated: none will be created (HANGAR_SANDBOX_ISOLATION=none runs them without isolation)", "error", d.jailErr)
		}
	case IsolationNone:
		opts.Logger.Warn("sandbox isolation is off (HANGAR_SANDBOX_ISOLATION=none): sandboxes run as this service's user, see its files, processes and environment")
	}
	return d, nil
}

// Isolation names how sandboxes are isolated: "bwrap", "none" (the
// operator's choice) or "unavailable" (bwrap can't run: no sandbox is
// created).
func (d *Driver) Isolation() string {
	switch {
	case d.opts.Isolation == IsolationNone:
		return "none"
	case d.jail == nil:
		return "unavailable"
	}
	return "bwrap"
}

// Name returns "local".
func (d *Driver) Name() string { return "local" }

// Dir returns the directory holding the sandboxes.
func (d *Driver) Dir() string { return d.dir }

func (d *Driver) claimKey(key string, sb *Sandbox) error {
	if !driver.ValidKey(key) {
		return fmt.Errorf("invalid work key %q", key)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.keys[key]; ok {
		return fmt.Errorf("%w: %q", driver.ErrInUse, key)
	}
	d.keys[key] = sb
	return nil
}

func (d *Driver) releaseKey(key string, sb *Sandbox) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.keys[key] == sb {
		delete(d.keys, key)
	}
}

// Create makes a sandbox of spec's repository at its base: an overlay of
// the base layer of that commit where it can (base.go), else a clone; then
// runs setup.
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (driver.Sandbox, error) {
	setup := func(sb *Sandbox) error {
		for _, cmd := range spec.Setup {
			if err := sb.runSetup(ctx, cmd); err != nil {
				return err
			}
		}
		return nil
	}
	l, commit, err := d.baseFor(ctx, spec)
	if errors.Is(err, errNoBase) {
		return nil, err
	}
	if err != nil {
		d.opts.Logger.Warn("sandbox cloned: no base layer", "sandbox", spec.ID, "repository", spec.Repository, "error", err)
	}
	if l != nil {
		sb, err := d.create(ctx, spec, l, func(sb *Sandbox) error {
			sb.baseCommit = commit
			return setup(sb)
		})
		if !errors.Is(err, errNotMounted) || ctx.Err() != nil {
			return sb, err
		}
		d.mu.Lock()
		d.noOverlay = true
		d.mu.Unlock()
		d.opts.Logger.Warn("sandbox cloned: its base layer could not be mounted; creates clone from now on", "sandbox", spec.ID, "error", err)
	}
	return d.create(ctx, spec, nil, func(sb *Sandbox) error {
		commit, err := sb.cloneAt(ctx, true)
		if err != nil {
			return err
		}
		sb.baseCommit = commit
		return setup(sb)
	})
}

// Copy makes a sandbox whose work tree and home are copies of src's (see
// driver.Copier): overlays of one read-only layer where this machine can
// mount them (overlay.go), else copies of the files, with git's object
// files (never written in place, only added and removed) hard-linked.
// Either way nothing written in one sandbox shows in the other. src's
// environment, repository and base commit carry over; spec gives the id,
// work key and egress.
func (d *Driver) Copy(ctx context.Context, src driver.Sandbox, spec driver.Spec) (driver.Sandbox, error) {
	from, ok := src.(*Sandbox)
	if !ok || from.d != d {
		return nil, errors.New("local driver: copy of a sandbox of another driver")
	}
	if from.revived {
		return nil, errors.New("local driver: a revived leftover sandbox is not copied")
	}
	if err := from.freeze(); err != nil {
		return nil, err
	}
	defer from.thaw()
	from.mu.Lock()
	srcDir := from.dir
	from.mu.Unlock()
	own := from.spec
	own.ID, own.WorkKey, own.Egress = spec.ID, spec.WorkKey, spec.Egress
	if l := d.sharedLayer(from); l != nil {
		sb, err := d.create(ctx, own, l, func(sb *Sandbox) error {
			sb.baseCommit = from.baseCommit
			return nil
		})
		if err == nil || errors.Is(err, driver.ErrInUse) || ctx.Err() != nil {
			return sb, err
		}
		d.opts.Logger.Warn("sandbox copy not mounted; copying its files", "sandbox", spec.ID, "error", err)
	}
	return d.create(ctx, own, nil, func(sb *Sandbox) error {
		for _, sub := range []string{"work", "home"} {
			if err := copyTree(ctx, filepath.Join(srcDir, sub), filepath.Join(sb.dir, sub)); err != nil {
				return fmt.Errorf("copy sandbox %s: %w", from.spec.ID, err)
			}
		}
		sb.baseCommit = from.baseCommit
		return nil
	})
}

// errNotMounted: create could not mount the layer it was given.
var errNotMounted = errors.New("sandbox layer not mounted")

// create makes the sandbox directory, its network namespace (egress none)
// and fills the work tree and home with fill; with l, a layer to mount
// (whose reference create takes over, released on error), they are the
// layer's before fill.
func (d *Driver) create(ctx context.Context, spec driver.Spec, l *layer, fill func(*Sandbox) error) (driver.Sandbox, error) {
	ok := false
	defer func() {
		if !ok && l != nil {
			if err := d.releaseLayer(l); err != nil {
				d.opts.Logger.Warn("sandbox layer not removed", "error", err)
			}
		}
	}()
	if spec.ID == "" {
		return nil, errors.New("local driver: spec.ID is required")
	}
	if d.opts.Isolation == IsolationBwrap && d.jail == nil {
		return nil, d.errIsolation()
	}
	key := spec.WorkKey
	if key == "" {
		key = spec.ID
	}
	sb := newSandbox(d, spec)
	if err := d.claimKey(key, sb); err != nil {
		return nil, err
	}
	sb.key = key
	sb.dir = filepath.Join(d.dir, key)
	if d.cgroups != nil {
		cg, err := d.cgroups.open(spec.ID)
		if err != nil {
			d.opts.Logger.Warn("sandbox without a cgroup: processes that leave their group outlive it", "sandbox", spec.ID, "error", err)
		}
		sb.cg = cg
	}
	defer func() {
		if !ok {
			sb.teardown()
		}
	}()
	// A leftover directory of a sandbox from an earlier run is stale: the
	// session restores from its checkpoint, never from a leftover tree.
	if err := removeAll(sb.dir); err != nil {
		return nil, fmt.Errorf("remove stale sandbox dir: %w", err)
	}
	m := marker{ID: spec.ID, Environment: spec.Environment, Egress: egressName(spec.Egress)}
	if l != nil {
		if err := os.Mkdir(sb.dir, 0o755); err != nil {
			return nil, err
		}
		if err := d.mountLayer(sb.dir, key, l, m); err != nil {
			return nil, fmt.Errorf("%w: %w", errNotMounted, err)
		}
		// The sandbox holds the reference now: its teardown releases it.
		sb.layerMu.Lock()
		sb.layer = l
		sb.layerMu.Unlock()
		l = nil
	} else {
		for _, p := range []string{sb.workDir(), sb.homeDir()} {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return nil, err
			}
		}
		if err := writeMarker(sb.dir, m); err != nil {
			return nil, err
		}
	}
	if spec.Egress == driver.EgressNone {
		ns, err := newNetNS()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", driver.ErrEgressUnsupported, err)
		}
		sb.ns = ns
		if gw := d.opts.Gateway; gw.Listen != "" {
			var ln net.Listener
			err := ns.Do(func() error {
				var err error
				ln, err = net.Listen("tcp", gw.Listen)
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("gateway relay listen: %w", err)
			}
			sb.relay = startRelay(ln, gw, d.opts.Logger)
		}
	}
	if d.jail != nil {
		// The sandbox's namespaces are made while it is filled (clone,
		// copy); its first process waits for them. An error here is the
		// first process's to report.
		d.starting.Add(1)
		go func() {
			defer d.starting.Done()
			_, _ = sb.namespaces()
		}()
	}
	if err := fill(sb); err != nil {
		return nil, err
	}
	sb.createdAt = d.opts.Now()
	ok = true
	return sb, nil
}

// cloneAt clones the repository into the work tree and checks out its
// base, detached; with settle, a long checkout's index is settled
// (settleIndex).
func (sb *Sandbox) cloneAt(ctx context.Context, settle bool) (string, error) {
	repo := sb.spec.Repository
	if repo == "" {
		return "", errors.New("repository is required")
	}
	if _, err := git(ctx, "", "clone", "--quiet", "--no-checkout", "--", repo, sb.workDir()); err != nil {
		return "", err
	}
	ref := sb.spec.BaseRef
	if ref == "" {
		ref = "HEAD"
	}
	var commit string
	for _, cand := range []string{ref, "origin/" + ref} {
		out, err := git(ctx, sb.workDir(), "rev-parse", "--verify", "--quiet", cand+"^{commit}")
		if err == nil {
			commit = strings.TrimSpace(out)
			break
		}
	}
	if commit == "" {
		// A commit no branch reaches: fetch it by name.
		if _, err := git(ctx, sb.workDir(), "fetch", "--quiet", "origin", ref); err == nil {
			if out, err := git(ctx, sb.workDir(), "rev-parse", "--verify", "--quiet", "FETCH_HEAD^{commit}"); err == nil {
				commit = strings.TrimSpace(out)
			}
		}
	}
	if commit == "" {
		return "", fmt.Errorf("base ref %q not found in %s", ref, repo)
	}
	began := time.Now()
	if _, err := git(ctx, sb.workDir(), "checkout", "--quiet", "--detach", commit); err != nil {
		return "", err
	}
	if settle && time.Since(began) >= settleAfter {
		if err := settleIndex(ctx, sb.workDir()); err != nil {
			return "", err
		}
	}
	return commit, nil
}

// settleAfter: a checkout that took this long wrote enough files in its
// last second for settleIndex to pay off.
const settleAfter = 200 * time.Millisecond

// settleIndex leaves no racily clean entry in a fresh checkout's index.
// The checkout wrote its last files in the second it wrote the index: git
// can't tell those from files changed after it, so every later command
// (the restore's checkout, each tree hash) reads them again, and a restore
// rewrites them, until the index is written in a later second. Waiting
// for that second and refreshing once reads each of them once, here,
// where the sandbox is being made (off the resume's path for pooled and
// cached sandboxes), instead of in every restore: the restore then costs
// what it restores, not what the repository holds. The refresh is git's
// own check: whatever wrote meanwhile (setup commands) is seen.
func settleIndex(ctx context.Context, dir string) error {
	if err := awaitIndexSecond(ctx, dir); err != nil {
		return err
	}
	_, err := git(ctx, dir, "update-index", "-q", "--refresh")
	return err
}

// coarseClockSlack is how far the kernel's coarse clock, which stamps
// files' times, may trail time.Now (one tick: 10 ms at HZ=100), with a
// margin: an index written just after time.Now entered the next second can
// still be stamped with the old one.
const coarseClockSlack = 25 * time.Millisecond

// awaitIndexSecond waits until the second the work tree dir's index was
// written in has passed, on the clock that stamps files too: an entry
// refreshed in that second would stay racily clean.
func awaitIndexSecond(ctx context.Context, dir string) error {
	st, err := os.Stat(filepath.Join(dir, ".git", "index"))
	if err != nil {
		return err
	}
	if wait := time.Until(st.ModTime().Truncate(time.Second).Add(time.Second + coarseClockSlack)); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "LC_ALL=C")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w: %s", args[0], err, strings.TrimSpace(tail(errb.String(), 2048)))
	}
	return out.String(), nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// runSetup runs one setup command. Setup runs with the host's network even
// under egress none: it is the environment's trusted preparation (package
// installs), while egress limits what the agent's processes reach.
func (sb *Sandbox) runSetup(ctx context.Context, command string) error {
	var out limitedBuffer
	p, err := sb.start(ctx, driver.ExecRequest{Argv: []string{"sh", "-c", command}, Stdout: &out, Stderr: &out}, false, false)
	if err != nil {
		return fmt.Errorf("setup %q: %w", command, err)
	}
	st, err := p.Wait()
	if err != nil {
		return fmt.Errorf("setup %q: %w", command, err)
	}
	if st.Code != 0 || st.Signal != "" {
		return fmt.Errorf("setup %q exited %d%s: %s", command, st.Code, st.Signal, strings.TrimSpace(out.String()))
	}
	return nil
}

// limitedBuffer keeps the last 4 KiB written to it.
type limitedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > 4096 {
		b.buf = b.buf[len(b.buf)-4096:]
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

var _ io.Writer = (*limitedBuffer)(nil)
