package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// rel turns a request path into a path relative to the sandbox directory:
// relative paths are relative to the work tree, absolute ones must lie in
// the sandbox. Symlinks are resolved by os.Root, which refuses any that
// leave it.
func (sb *Sandbox) rel(p string) (string, error) {
	sb.mu.Lock()
	dir := sb.dir
	sb.mu.Unlock()
	var r string
	if filepath.IsAbs(p) {
		var err error
		if r, err = filepath.Rel(dir, filepath.Clean(p)); err != nil {
			return "", fmt.Errorf("%w: %s", driver.ErrOutsideSandbox, p)
		}
	} else {
		r = filepath.Join("work", p)
	}
	r = filepath.Clean(r)
	if r == ".." || strings.HasPrefix(r, "../") {
		return "", fmt.Errorf("%w: %s", driver.ErrOutsideSandbox, p)
	}
	return r, nil
}

// display is the path shown to clients: relative to the work tree when
// inside it, absolute otherwise.
func (sb *Sandbox) display(rel string) string {
	if r, ok := strings.CutPrefix(rel, "work/"); ok {
		return r
	}
	if rel == "work" {
		return "."
	}
	return filepath.Join(sb.dir, rel)
}

// root opens the sandbox directory for a file operation; done closes it.
// Like a command, the operation waits for a copy of the sandbox to end and
// keeps a new one from starting until it is done: a copy by overlay moves
// the files under it.
func (sb *Sandbox) root() (root *os.Root, done func(), err error) {
	if err := sb.begin(); err != nil {
		return nil, nil, err
	}
	sb.mu.Lock()
	dir := sb.dir
	sb.mu.Unlock()
	r, err := os.OpenRoot(dir)
	if err != nil {
		sb.end()
		return nil, nil, err
	}
	return r, func() { r.Close(); sb.end() }, nil
}

func mapErr(err error, p string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s", driver.ErrFileNotFound, p)
	case strings.Contains(err.Error(), "escapes") || strings.Contains(err.Error(), "outside"):
		return fmt.Errorf("%w: %s", driver.ErrOutsideSandbox, p)
	case errors.Is(err, driver.ErrDestroyed):
		return err
	}
	return err
}

func (sb *Sandbox) resolveDir(d string) (string, error) {
	rel, err := sb.rel(d)
	if err != nil {
		return "", err
	}
	root, done, err := sb.root()
	if err != nil {
		return "", err
	}
	defer done()
	st, err := root.Stat(rel)
	if err != nil {
		return "", mapErr(err, d)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%w: %s", driver.ErrNotDirectory, d)
	}
	return filepath.Join(root.Name(), rel), nil
}

func (sb *Sandbox) info(root *os.Root, rel string, st fs.FileInfo) driver.FileInfo {
	fi := driver.FileInfo{Path: sb.display(rel), Mode: st.Mode(), Size: st.Size(), ModTime: st.ModTime()}
	if st.Mode()&fs.ModeSymlink != 0 {
		fi.LinkTarget, _ = root.Readlink(rel)
	}
	return fi
}

// ReadFile reads a file of at most limit bytes.
func (sb *Sandbox) ReadFile(ctx context.Context, p string, limit int64) ([]byte, driver.FileInfo, error) {
	rel, err := sb.rel(p)
	if err != nil {
		return nil, driver.FileInfo{}, err
	}
	root, done, err := sb.root()
	if err != nil {
		return nil, driver.FileInfo{}, err
	}
	defer done()
	f, err := root.Open(rel)
	if err != nil {
		return nil, driver.FileInfo{}, mapErr(err, p)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, driver.FileInfo{}, err
	}
	if st.IsDir() {
		return nil, driver.FileInfo{}, fmt.Errorf("%w: %s", driver.ErrIsDirectory, p)
	}
	if limit > 0 && st.Size() > limit {
		return nil, driver.FileInfo{}, fmt.Errorf("%w: %s is %d bytes (limit %d)", driver.ErrTooLarge, p, st.Size(), limit)
	}
	r := io.Reader(f)
	if limit > 0 {
		r = io.LimitReader(f, limit+1)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, driver.FileInfo{}, err
	}
	if limit > 0 && int64(len(data)) > limit {
		return nil, driver.FileInfo{}, fmt.Errorf("%w: %s", driver.ErrTooLarge, p)
	}
	return data, sb.info(root, rel, st), nil
}

// WriteFile creates or replaces a file, creating its parents.
func (sb *Sandbox) WriteFile(ctx context.Context, p string, content []byte, mode fs.FileMode) (driver.FileInfo, error) {
	rel, err := sb.rel(p)
	if err != nil {
		return driver.FileInfo{}, err
	}
	if mode == 0 {
		mode = 0o644
	}
	mode &= fs.ModePerm
	root, done, err := sb.root()
	if err != nil {
		return driver.FileInfo{}, err
	}
	defer done()
	if err := root.MkdirAll(filepath.Dir(rel), 0o755); err != nil {
		return driver.FileInfo{}, mapErr(err, p)
	}
	if err := root.WriteFile(rel, content, mode); err != nil {
		return driver.FileInfo{}, mapErr(err, p)
	}
	if err := root.Chmod(rel, mode); err != nil {
		return driver.FileInfo{}, mapErr(err, p)
	}
	st, err := root.Lstat(rel)
	if err != nil {
		return driver.FileInfo{}, mapErr(err, p)
	}
	return sb.info(root, rel, st), nil
}

// Stat describes a path without following a final symlink.
func (sb *Sandbox) Stat(ctx context.Context, p string) (driver.FileInfo, error) {
	rel, err := sb.rel(p)
	if err != nil {
		return driver.FileInfo{}, err
	}
	root, done, err := sb.root()
	if err != nil {
		return driver.FileInfo{}, err
	}
	defer done()
	st, err := root.Lstat(rel)
	if err != nil {
		return driver.FileInfo{}, mapErr(err, p)
	}
	return sb.info(root, rel, st), nil
}

// List returns a directory's entries sorted by name.
func (sb *Sandbox) List(ctx context.Context, dir string) ([]driver.FileInfo, error) {
	rel, err := sb.rel(dir)
	if err != nil {
		return nil, err
	}
	root, done, err := sb.root()
	if err != nil {
		return nil, err
	}
	defer done()
	f, err := root.Open(rel)
	if err != nil {
		return nil, mapErr(err, dir)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%w: %s", driver.ErrNotDirectory, dir)
	}
	entries, err := f.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	out := make([]driver.FileInfo, 0, len(entries))
	for _, e := range entries {
		r := filepath.Join(rel, e.Name())
		st, err := root.Lstat(r)
		if err != nil {
			continue
		}
		out = append(out, sb.info(root, r, st))
	}
	return out, nil
}
