package local

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"syscall"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

var _ driver.Cacher = (*Driver)(nil)

// DiskUsage is the blocks sb's directory takes (a file hard-linked into
// another sandbox counts in each). A sandbox mounted over a layer counts
// what it wrote (its upper directory): its layers are shared, and the
// base layers are bounded by their own cache (base.go).
func (d *Driver) DiskUsage(ctx context.Context, s driver.Sandbox) (int64, error) {
	sb, ok := s.(*Sandbox)
	if !ok || sb.d != d {
		return 0, errors.New("local driver: disk usage of a sandbox of another driver")
	}
	sb.layerMu.Lock()
	layered := sb.layer != nil
	sb.layerMu.Unlock()
	sb.mu.Lock()
	dir, key := sb.dir, sb.key
	sb.mu.Unlock()
	if layered {
		dir = d.upperOf(key)
	}
	var n int64
	err := filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return nil // gone meanwhile
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += info.Size()
		}
		return nil
	})
	return n, err
}

// FreeDisk is the space unprivileged users may still take on the file
// system holding the sandboxes.
func (d *Driver) FreeDisk() (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
