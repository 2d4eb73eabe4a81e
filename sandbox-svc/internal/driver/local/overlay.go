package local

// Copies by overlay. A copy of a sandbox shares its files instead of
// copying them: the source's work tree and home become a read-only layer
// (moved, not copied, to <sandboxes>/.layers/<id>), and the source and
// each copy mount an overlay of that layer on their sandbox directory,
// with an upper directory of their own (<sandboxes>/.upper/<key>), so a
// file is copied only when a sandbox writes it, and then only into that
// sandbox. Creating files is what a copy costs (on some disks most of a
// millisecond each); a mount costs the same however big the tree. Inode
// numbers and times are the layer's (one filesystem), so git's stat cache
// of the source's index holds in every copy. A layer lives while a sandbox
// mounts it.
//
// Mounting needs CAP_SYS_ADMIN and overlayfs; without them (or with a
// source that is already a copy someone has written to) a copy copies the
// files (copyTree).

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// layersDir is the directory under the sandboxes directory holding the
// layers; not a valid work key, so never a sandbox's.
const layersDir = ".layers"

// uppersDir is the directory under the sandboxes directory holding each
// mounted sandbox's upper and work directories, by key; not a valid work
// key either.
const uppersDir = ".upper"

// layer is a read-only work tree and home that overlay-mounted sandboxes
// share, over the layer lower when it has one (a sandbox mounted over a
// base layer and written to, whose writes became a layer of their own when
// it was copied).
type layer struct {
	dir   string // holds work/ and home/ (what a lower layer has is seen through)
	refs  int    // sandboxes mounting it, layers over it and the base cache's hold, on Driver.mu
	lower *layer // under this one; this layer holds a reference to it
}

// lowerdirs is the overlay's lowerdir option for a mount of l: l first,
// then the layers under it.
func (l *layer) lowerdirs() []string {
	var dirs []string
	for ; l != nil; l = l.lower {
		dirs = append(dirs, l.dir)
	}
	return dirs
}

// layerSubtrees are the directories of a sandbox that a layer holds.
var layerSubtrees = []string{"work", "home"}

// overlayOK says whether paths can go in an overlay's mount options
// (commas and colons separate them; backslashes escape).
func overlayOK(paths ...string) bool {
	for _, p := range paths {
		if strings.ContainsAny(p, ",:\\") {
			return false
		}
	}
	return true
}

// upperOf is the directory holding the upper and work directories of the
// sandbox with key key.
func (d *Driver) upperOf(key string) string { return filepath.Join(d.dir, uppersDir, key) }

// mountLayer mounts an overlay of l on the sandbox directory dir (empty),
// its upper directory in d.upperOf(key) holding the marker m. On error
// nothing stays mounted or made but dir.
func (d *Driver) mountLayer(dir, key string, l *layer, m marker) error {
	up := d.upperOf(key)
	upper, wd := filepath.Join(up, "upper"), filepath.Join(up, "wd")
	lowers := l.lowerdirs()
	if !overlayOK(append([]string{upper, wd}, lowers...)...) {
		return errors.New("overlay: the sandboxes path holds ',' ':' or '\\'")
	}
	if err := removeAll(up); err != nil {
		return err
	}
	for _, p := range []string{upper, wd} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	if err := writeMarker(upper, m); err != nil {
		_ = os.RemoveAll(up)
		return err
	}
	if err := writeLowers(up, lowers); err != nil {
		_ = os.RemoveAll(up)
		return err
	}
	if err := mountOverlay(dir, lowers, up); err != nil {
		_ = os.RemoveAll(up)
		return fmt.Errorf("mount overlay on %s: %w", dir, err)
	}
	return nil
}

// remount moves a sandbox mounted over l at dir (key) to newDir (newKey):
// unmounted, its upper directory renamed with its key, and mounted at
// newDir (made here; dir is removed). Its processes must have ended. On
// error it is mounted at dir as before, where it can be.
func (d *Driver) remount(dir, key, newDir, newKey string, l *layer) error {
	up, newUp := d.upperOf(key), d.upperOf(newKey)
	if !overlayOK(newUp) {
		return errors.New("overlay: the sandboxes path holds ',' ':' or '\\'")
	}
	if err := removeAll(newUp); err != nil {
		return err
	}
	if err := os.Mkdir(newDir, 0o755); err != nil {
		return err
	}
	if err := unix.Unmount(dir, 0); err != nil {
		_ = os.Remove(newDir)
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	mountAt := func(dir, up string) error {
		return mountOverlay(dir, l.lowerdirs(), up)
	}
	if err := os.Rename(up, newUp); err != nil {
		_ = os.Remove(newDir)
		return errors.Join(fmt.Errorf("rename %s: %w", up, err), mountAt(dir, up))
	}
	if err := mountAt(newDir, newUp); err != nil {
		_ = os.Remove(newDir)
		return errors.Join(fmt.Errorf("mount overlay on %s: %w", newDir, err), os.Rename(newUp, up), mountAt(dir, up))
	}
	if err := os.Remove(dir); err != nil {
		d.opts.Logger.Warn("relocated sandbox's old directory not removed", "dir", dir, "error", err)
	}
	return nil
}

// lowersName is the file in a mounted sandbox's upper directory's parent
// (<sandboxes>/.upper/<key>) listing the layers it mounts, top first: what
// remountLost needs to mount it again once the mount is gone (a reboot).
const lowersName = "lowers"

func writeLowers(up string, lowers []string) error {
	if err := os.WriteFile(filepath.Join(up, lowersName), []byte(strings.Join(lowers, "\n")+"\n"), 0o644); err != nil {
		return fmt.Errorf("write the sandbox's layer list: %w", err)
	}
	return nil
}

// remountLost mounts again, at start, the sandboxes mounted over layers
// whose mount is gone while their files are not (the machine restarted:
// mounts do not outlive it, directories do), so what they wrote after
// their last checkpoint is there for Leftovers and Revive as a plain
// sandbox's would be. One whose layers are not all there is left to the
// sweep.
func (d *Driver) remountLost() error {
	all, err := mounts()
	if err != nil {
		return err
	}
	mounted := map[string]bool{}
	for _, m := range all {
		mounted[m.point] = true
	}
	ents, _ := os.ReadDir(filepath.Join(d.dir, uppersDir))
	var errs []error
	for _, ent := range ents {
		key := ent.Name()
		dir := filepath.Join(d.dir, key)
		up := d.upperOf(key)
		if !driver.ValidKey(key) || mounted[dir] {
			continue
		}
		b, err := os.ReadFile(filepath.Join(up, lowersName))
		if err != nil {
			continue
		}
		lowers := strings.Fields(string(b))
		present := len(lowers) > 0
		for _, l := range lowers {
			if filepath.Dir(l) != filepath.Join(d.dir, layersDir) {
				present = false
			} else if st, err := os.Stat(l); err != nil || !st.IsDir() {
				present = false
			}
		}
		if !present || !overlayOK(append([]string{up}, lowers...)...) {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		// The work directory's leftovers are the overlay's to clear.
		if err := mountOverlay(dir, lowers, up); err != nil {
			errs = append(errs, fmt.Errorf("mount the lost overlay of %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// mountOverlay mounts on dir an overlay of lowers (top first) with the
// upper and work directories in up (up/upper, up/wd). redirect_dir: a
// directory of a layer can be renamed (else rename(2) says EXDEV, which
// not every program handles), and a layer's redirects are followed.
func mountOverlay(dir string, lowers []string, up string) error {
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=on", strings.Join(lowers, ":"), filepath.Join(up, "upper"), filepath.Join(up, "wd"))
	return unix.Mount("overlay", dir, "overlay", 0, opts)
}

// canMountOverlay says whether this process can mount an overlay in the
// sandboxes directory dir: it mounts and unmounts an empty one.
func canMountOverlay(dir string) bool {
	probe, err := os.MkdirTemp(dir, ".overlay-probe-")
	if err != nil {
		return false
	}
	defer os.RemoveAll(probe)
	for _, sub := range []string{"lower", "up/upper", "up/wd", "mnt"} {
		if err := os.MkdirAll(filepath.Join(probe, sub), 0o755); err != nil {
			return false
		}
	}
	if !overlayOK(probe) {
		return false
	}
	mnt := filepath.Join(probe, "mnt")
	if err := mountOverlay(mnt, []string{filepath.Join(probe, "lower")}, filepath.Join(probe, "up")); err != nil {
		return false
	}
	return unmount(mnt) == nil
}

// newLayerDir makes an empty directory for a layer, its name starting
// with prefix.
func (d *Driver) newLayerDir(prefix string) (string, error) {
	if err := os.MkdirAll(filepath.Join(d.dir, layersDir), 0o755); err != nil {
		return "", err
	}
	return os.MkdirTemp(filepath.Join(d.dir, layersDir), prefix)
}

// unmount unmounts p, detaching it when it is busy (a process killed a
// moment ago may still hold it).
func unmount(p string) error {
	err := unix.Unmount(p, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(p, unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", p, err)
	}
	return nil
}

// mount is one line of /proc/self/mountinfo.
type mount struct {
	point   string
	fstype  string
	options string // the superblock's (for an overlay, lowerdir=...)
}

// mounts lists this process's mounts.
func mounts() ([]mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root point options [optional...] - type source super
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || sep+3 >= len(fields) {
			continue
		}
		out = append(out, mount{point: unescapeMountinfo(fields[4]), fstype: fields[sep+1], options: unescapeMountinfo(fields[sep+3])})
	}
	return out, sc.Err()
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder unmounts every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	all, err := mounts()
	if err != nil {
		return err
	}
	var points []string
	for _, m := range all {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			points = append(points, m.point)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, p := range points {
		if err := unmount(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// layerize turns sb, a plain sandbox, into one mounted over a new layer
// holding what its work tree and home hold now (moved there, not copied).
// On error sb is as it was.
func (d *Driver) layerize(sb *Sandbox) (*layer, error) {
	sb.mu.Lock()
	dir, key := sb.dir, sb.key
	sb.mu.Unlock()
	m, err := readMarker(dir)
	if err != nil {
		return nil, err
	}
	ldir, err := d.newLayerDir("layer-")
	if err != nil {
		return nil, err
	}
	l := &layer{dir: ldir, refs: 1}
	d.mu.Lock()
	d.layers[ldir] = l
	d.mu.Unlock()
	var moved []string
	undo := func() {
		for _, sub := range moved {
			_ = os.Rename(filepath.Join(ldir, sub), filepath.Join(dir, sub))
		}
		_ = os.RemoveAll(ldir)
		d.mu.Lock()
		delete(d.layers, ldir)
		d.mu.Unlock()
	}
	for _, sub := range layerSubtrees {
		if err := os.Rename(filepath.Join(dir, sub), filepath.Join(ldir, sub)); err != nil {
			undo()
			return nil, err
		}
		moved = append(moved, sub)
	}
	// The marker stays in dir too, under the mount, for a leftover whose
	// mount is gone.
	if err := d.mountLayer(dir, key, l, m); err != nil {
		undo()
		return nil, err
	}
	return l, nil
}

// restack makes what sb (mounted over a layer, frozen, on sb.layerMu)
// wrote since it was mounted a layer of its own, over sb's layer, and
// mounts sb over it with an empty upper directory: sb's files are the
// same, and a copy can share them. It returns the new layer, holding sb's
// reference (and, as its lower, the one sb held on its old layer). On
// error sb is mounted as it was, where it can be.
func (d *Driver) restack(sb *Sandbox) (*layer, error) {
	sb.mu.Lock()
	dir, key := sb.dir, sb.key
	sb.mu.Unlock()
	old := sb.layer
	up := d.upperOf(key)
	upper := filepath.Join(up, "upper")
	m, err := readMarker(upper)
	if err != nil {
		return nil, err
	}
	ldir, err := d.newLayerDir("layer-")
	if err != nil {
		return nil, err
	}
	if !overlayOK(ldir) {
		_ = os.Remove(ldir)
		return nil, errors.New("overlay: the sandboxes path holds ',' ':' or '\\'")
	}
	if err := unix.Unmount(dir, 0); err != nil {
		_ = os.Remove(ldir)
		return nil, fmt.Errorf("unmount %s: %w", dir, err)
	}
	remountOld := func() error {
		return mountOverlay(dir, old.lowerdirs(), up)
	}
	// The upper directory becomes the layer (renamed to the name just
	// made for it: os.Rename refuses an existing directory), without the
	// marker.
	if err := os.Remove(ldir); err != nil {
		return nil, errors.Join(fmt.Errorf("restack %s: %w", dir, err), remountOld())
	}
	if err := os.Rename(upper, ldir); err != nil {
		_ = os.Remove(ldir)
		return nil, errors.Join(fmt.Errorf("restack %s: %w", dir, err), remountOld())
	}
	if err := os.Remove(filepath.Join(ldir, markerName)); err != nil {
		return nil, errors.Join(fmt.Errorf("restack %s: %w", dir, err), os.Rename(ldir, upper), remountOld())
	}
	l := &layer{dir: ldir, refs: 1, lower: old}
	d.mu.Lock()
	d.layers[ldir] = l
	d.mu.Unlock()
	if err := d.mountLayer(dir, key, l, m); err != nil {
		// Put the writes back as the upper directory.
		d.mu.Lock()
		delete(d.layers, ldir)
		d.mu.Unlock()
		err = fmt.Errorf("restack %s: %w", dir, err)
		if rerr := os.MkdirAll(filepath.Join(up, "wd"), 0o755); rerr != nil {
			return nil, errors.Join(err, rerr)
		}
		return nil, errors.Join(err, os.Rename(ldir, upper), writeMarker(upper, m), writeLowers(up, old.lowerdirs()), remountOld())
	}
	return l, nil
}

// upperEmpty says whether nothing but its marker has been written in the
// overlay of the sandbox with key key since it was mounted.
func (d *Driver) upperEmpty(key string) bool {
	f, err := os.Open(filepath.Join(d.upperOf(key), "upper"))
	if err != nil {
		return false
	}
	defer f.Close()
	names, err := f.Readdirnames(3)
	if err != nil {
		return false
	}
	return len(names) == 1 && names[0] == markerName
}

// releaseLayer drops a reference to l; the last one removes it (unless a
// mount still uses it: a revived leftover's over a base layer this driver
// adopted, which holds no reference; the sweep after that leftover's
// destroy removes it) and drops its reference to the layer under it.
func (d *Driver) releaseLayer(l *layer) error {
	var errs []error
	for l != nil {
		d.mu.Lock()
		l.refs--
		last := l.refs == 0
		if last {
			delete(d.layers, l.dir)
		}
		d.mu.Unlock()
		if !last {
			break
		}
		if all, err := mounts(); err != nil || !overlayUses(all, "lowerdir", l.dir) {
			errs = append(errs, removeAll(l.dir))
		}
		l = l.lower
	}
	return errors.Join(errs...)
}

// overlayUses says whether an overlay mount of all has dir in its option
// opt (lowerdir, upperdir).
func overlayUses(all []mount, opt, dir string) bool {
	for _, m := range all {
		if m.fstype != "overlay" {
			continue
		}
		for _, o := range strings.Split(m.options, ",") {
			name, val, _ := strings.Cut(o, "=")
			if name == opt && slices.Contains(strings.Split(val, ":"), dir) {
				return true
			}
		}
	}
	return false
}

// sweepLayers removes the layers that no live sandbox of this driver and no
// mount (a leftover's) uses, the records of base layers the cache does not
// hold (see adoptBases), and the upper directories of sandboxes that are
// neither live nor mounted.
func (d *Driver) sweepLayers() error {
	all, err := mounts()
	if err != nil {
		return err
	}
	used := func(opt, dir string) bool { return overlayUses(all, opt, dir) }
	var errs []error
	records, _ := os.ReadDir(filepath.Join(d.dir, basesDir))
	for _, ent := range records {
		name, _ := strings.CutSuffix(ent.Name(), ".json")
		dir := filepath.Join(d.dir, layersDir, name)
		d.mu.Lock()
		_, live := d.layers[dir]
		d.mu.Unlock()
		if !live || !strings.HasSuffix(ent.Name(), ".json") {
			if err := os.Remove(filepath.Join(d.dir, basesDir, ent.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	layers, _ := os.ReadDir(filepath.Join(d.dir, layersDir))
	for _, ent := range layers {
		dir := filepath.Join(d.dir, layersDir, ent.Name())
		d.mu.Lock()
		_, live := d.layers[dir]
		d.mu.Unlock()
		if !live && !used("lowerdir", dir) {
			if err := removeAll(dir); err != nil {
				errs = append(errs, err)
			}
		}
	}
	uppers, _ := os.ReadDir(filepath.Join(d.dir, uppersDir))
	for _, ent := range uppers {
		d.mu.Lock()
		_, live := d.keys[ent.Name()]
		d.mu.Unlock()
		up := d.upperOf(ent.Name())
		if !live && !used("upperdir", filepath.Join(up, "upper")) {
			if err := removeAll(up); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// sharedLayer is the layer a copy of src can mount, with a reference taken
// for the copy: src's own, first making one of src's files when src is a
// plain sandbox; nil when the copy must copy files (overlays unsupported
// here, or src written to since it was mounted). src is frozen.
func (d *Driver) sharedLayer(src *Sandbox) *layer {
	if d.opts.CopyFiles {
		return nil
	}
	src.layerMu.Lock()
	defer src.layerMu.Unlock()
	src.mu.Lock()
	key := src.key
	src.mu.Unlock()
	if src.layer == nil {
		d.mu.Lock()
		off := d.noOverlay
		d.mu.Unlock()
		if off {
			return nil
		}
		l, err := d.layerize(src)
		if err != nil {
			d.mu.Lock()
			d.noOverlay = true
			d.mu.Unlock()
			d.opts.Logger.Warn("sandbox copies copy their files: overlay mounts are not available", "error", err)
			return nil
		}
		src.layer = l
	} else if !d.upperEmpty(key) {
		// Written to since it was mounted: its writes become a layer
		// of their own over its layer, which src and the copy share.
		l, err := d.restack(src)
		if err != nil {
			d.opts.Logger.Warn("sandbox copy copies its files: the source's writes could not be made a layer", "sandbox", src.spec.ID, "error", err)
			return nil
		}
		src.layer = l
	}
	d.mu.Lock()
	src.layer.refs++
	d.mu.Unlock()
	return src.layer
}
