package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// markerName is the file in a sandbox's directory (beside work/ and home/)
// that names the sandbox, so a directory left behind by a crash can be
// matched with its lease.
const markerName = "sandbox.json"

// lockName is the lock file in the sandboxes directory; the driver holds an
// exclusive flock on it for its life, so one process at a time owns the
// directory and everything in it that is not live in that process is a
// leftover of a process that is gone.
const lockName = ".lock"

// marker is the content of markerName.
type marker struct {
	ID          string `json:"id"`
	Environment string `json:"environment"`
	// Egress is "none" or "full"; empty in markers written before it was
	// recorded.
	Egress string `json:"egress,omitempty"`
}

func egressName(e driver.Egress) string {
	if e == driver.EgressNone {
		return "none"
	}
	return "full"
}

// lockDir takes the sandboxes directory for this process.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open the sandboxes lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s is in use by another sandbox service (one process per HANGAR_HOME): %w", dir, err)
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f, nil
}

func writeMarker(dir string, m marker) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, markerName), b, 0o644); err != nil {
		return fmt.Errorf("write sandbox marker: %w", err)
	}
	return nil
}

func readMarker(dir string) (marker, error) {
	var m marker
	b, err := os.ReadFile(filepath.Join(dir, markerName))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("sandbox marker %s: %w", dir, err)
	}
	return m, nil
}

// Leftovers lists the sandbox directories that no live sandbox of this
// driver owns.
func (d *Driver) Leftovers(context.Context) ([]driver.Leftover, error) {
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	var out []driver.Leftover
	for _, ent := range ents {
		if !ent.IsDir() || !driver.ValidKey(ent.Name()) {
			continue
		}
		d.mu.Lock()
		_, live := d.keys[ent.Name()]
		d.mu.Unlock()
		if live {
			continue
		}
		dir := filepath.Join(d.dir, ent.Name())
		lo := driver.Leftover{Key: ent.Name(), Where: dir}
		// A missing or unreadable marker leaves the id empty: no lease can
		// name such a directory.
		if m, err := readMarker(dir); err == nil {
			lo.ID, lo.Environment = m.ID, m.Environment
		}
		out = append(out, lo)
	}
	return out, nil
}

// RemoveLeftover removes a leftover directory unless a live sandbox has
// taken its key since it was listed (then it reports false).
func (d *Driver) RemoveLeftover(_ context.Context, lo driver.Leftover) (bool, error) {
	// Claiming the key keeps a concurrent Create of the same work key out
	// while the directory goes.
	guard := &Sandbox{}
	if err := d.claimKey(lo.Key, guard); err != nil {
		return false, nil
	}
	defer d.releaseKey(lo.Key, guard)
	dir := filepath.Join(d.dir, lo.Key)
	if err := removeAll(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("remove leftover sandbox %s: %w", dir, err)
	}
	if err := removeAll(d.upperOf(lo.Key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("remove leftover sandbox %s: %w", dir, err)
	}
	// The layers only leftovers mounted go with them.
	if err := d.sweepLayers(); err != nil {
		return true, fmt.Errorf("remove unused sandbox layers: %w", err)
	}
	return true, nil
}

// Revive makes the leftover lo a live sandbox again (driver.LeftoverReviver):
// its directory and, for a copy an earlier process mounted over a layer,
// that mount (still in place: mounts outlive the process that made them)
// are kept as they are, with a new cgroup and, where one can be made, a
// private network namespace with no way out (nothing a revived sandbox
// runs needs the network: it is there to be checkpointed). Its processes
// are gone: New killed what the crashed process's cgroups held.
// Destroying it removes the directory, its upper directory and the layers
// no one mounts any more.
func (d *Driver) Revive(_ context.Context, lo driver.Leftover) (driver.Sandbox, error) {
	if lo.ID == "" {
		return nil, fmt.Errorf("revive %s: no sandbox id recorded", lo.Where)
	}
	if d.opts.Isolation == IsolationBwrap && d.jail == nil {
		return nil, d.errIsolation()
	}
	dir := filepath.Join(d.dir, lo.Key)
	m, err := readMarker(dir)
	if err != nil {
		return nil, fmt.Errorf("revive %s: %w", dir, err)
	}
	if m.ID != lo.ID {
		return nil, fmt.Errorf("revive %s: it holds sandbox %q, not %q", dir, m.ID, lo.ID)
	}
	sb := newSandbox(d, driver.Spec{ID: lo.ID, WorkKey: lo.Key, Environment: m.Environment, Egress: driver.EgressNone})
	if err := d.claimKey(lo.Key, sb); err != nil {
		return nil, err
	}
	sb.key, sb.dir, sb.revived = lo.Key, dir, true
	ok := false
	defer func() {
		if !ok {
			// Not revived: nothing of the leftover is removed here (the
			// caller removes it as a leftover).
			sb.mu.Lock()
			sb.dir = ""
			sb.mu.Unlock()
			sb.revived = false
			_ = sb.teardown()
		}
	}()
	for _, p := range []string{sb.workDir(), sb.homeDir()} {
		if st, err := os.Stat(p); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("revive %s: its files are gone (%s)", dir, p)
		}
	}
	if d.cgroups != nil {
		cg, err := d.cgroups.open(lo.ID)
		if err != nil {
			d.opts.Logger.Warn("sandbox without a cgroup: processes that leave their group outlive it", "sandbox", lo.ID, "error", err)
		}
		sb.cg = cg
	}
	ns, err := newNetNS()
	switch {
	case err == nil:
		sb.ns = ns
	case m.Egress != "none":
		// Egress full, or not recorded (a marker of an older
		// release).
		sb.spec.Egress = driver.EgressFull
	default:
		return nil, fmt.Errorf("revive %s: %w: %v", dir, driver.ErrEgressUnsupported, err)
	}
	sb.createdAt = d.opts.Now()
	if st, err := os.Stat(filepath.Join(dir, markerName)); err == nil {
		sb.createdAt = st.ModTime()
	}
	ok = true
	return sb, nil
}

// Close releases the sandboxes directory. Live sandboxes are not touched:
// destroy them first.
func (d *Driver) Close() error {
	// A child between fork and exec shares the lock's open file: let
	// the background starts finish so the lock is free once Close returns.
	d.starting.Wait()
	d.closeBases()
	d.mu.Lock()
	f := d.lock
	d.lock = nil
	d.mu.Unlock()
	if f == nil {
		return nil
	}
	d.cgroups.close()
	return f.Close()
}

var _ driver.LeftoverReviver = (*Driver)(nil)
