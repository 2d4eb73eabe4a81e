package tool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/hangar-dev/hangar/api/sandboxtool"
)

// maxLinks is how many symbolic links resolveAll follows.
const maxLinks = 40

// resolveAll is p with every symbolic link resolved, components that do
// not exist kept as they are (realpath -m).
func resolveAll(p string) (string, error) {
	rest := strings.Split(strings.TrimPrefix(filepath.Clean(p), "/"), "/")
	cur := "/"
	links := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		if c == "" || c == "." {
			continue
		}
		if c == ".." {
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		st, err := os.Lstat(next)
		if err != nil || st.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("%s: too many levels of symbolic links", p)
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return cur, nil
}

// inside reports whether p is root or under it.
func inside(root, p string) bool {
	return p == root || strings.HasPrefix(p, strings.TrimSuffix(root, "/")+"/")
}

func fileStatus(p string) (*sandboxtool.FileStatus, error) {
	st, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, fmt.Errorf("%s: no stat", p)
	}
	fsz := &sandboxtool.FileStatus{Mode: sys.Mode, Size: st.Size(), MTime: st.ModTime().Unix()}
	if st.Mode()&fs.ModeSymlink != 0 {
		l, err := os.Readlink(p)
		if err != nil {
			return nil, err
		}
		fsz.Link = sandboxtool.Name(l)
	}
	return fsz, nil
}

// fileCommand is the file access of a driver that cannot reach the
// sandbox's files from outside: the path is resolved here, so a link
// that leaves the root is refused as the local driver's os.Root refuses
// it.
func fileCommand(_ context.Context, req *sandboxtool.FileRequest, in io.Reader, out io.Writer) error {
	root := filepath.Clean(req.Root)
	if !filepath.IsAbs(root) || !filepath.IsAbs(req.Path) {
		return fail(sandboxtool.ExitUsage, "file: root and path must be absolute")
	}
	p := filepath.Clean(req.Path)
	outside := func() error { return fail(sandboxtool.ExitOutside, "%s is outside %s", p, root) }
	notFound := func() error { return fail(sandboxtool.ExitNotFound, "%s: no such file", p) }
	// parentOf is p's parent resolved, and p's final component in it.
	parentOf := func(p string) (string, error) {
		if p == root {
			return p, nil
		}
		parent, err := resolveAll(filepath.Dir(p))
		if err != nil {
			return "", err
		}
		if !inside(root, parent) {
			return "", outside()
		}
		return filepath.Join(parent, filepath.Base(p)), nil
	}
	switch req.Op {
	case sandboxtool.FileStat:
		f, err := parentOf(p)
		if err != nil {
			return err
		}
		st, err := fileStatus(f)
		if err != nil {
			return notFound()
		}
		return writeJSON(out, sandboxtool.FileResponse{File: st})
	case sandboxtool.FileRead:
		r, err := resolveAll(p)
		if err != nil {
			return err
		}
		if !inside(root, r) {
			return outside()
		}
		st, err := fileStatus(r)
		if err != nil {
			return notFound()
		}
		if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			return fail(sandboxtool.ExitIsDir, "%s is a directory", p)
		}
		if req.Limit > 0 && st.Size > req.Limit {
			return fail(sandboxtool.ExitTooLarge, "%s is %d bytes, over the limit of %d", p, st.Size, req.Limit)
		}
		f, err := os.Open(r)
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		defer f.Close()
		// Read before answering: a file that grew past the limit since
		// its stat is refused, not sent in part.
		var src io.Reader = f
		if req.Limit > 0 {
			src = io.LimitReader(f, req.Limit+1)
		}
		data, err := io.ReadAll(src)
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		if req.Limit > 0 && int64(len(data)) > req.Limit {
			return fail(sandboxtool.ExitTooLarge, "%s is over the limit of %d bytes", p, req.Limit)
		}
		st.Size = int64(len(data))
		if err := writeJSON(out, sandboxtool.FileResponse{File: st}); err != nil {
			return err
		}
		_, err = out.Write(data)
		return err
	case sandboxtool.FileWrite:
		f, err := parentOf(p)
		if err != nil {
			return err
		}
		if st, err := os.Lstat(f); err == nil && st.Mode()&fs.ModeSymlink != 0 {
			if f, err = resolveAll(f); err != nil {
				return err
			}
			if !inside(root, f) {
				return outside()
			}
		}
		if st, err := os.Stat(f); err == nil && st.IsDir() {
			return fail(sandboxtool.ExitIsDir, "%s is a directory", p)
		}
		parent := filepath.Dir(f)
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return fail(sandboxtool.ExitNotDir, "make %s: %v", parent, err)
		}
		mode := fs.FileMode(req.Mode).Perm()
		if mode == 0 {
			mode = 0o644
		}
		tmp, err := os.CreateTemp(parent, ".hangar-write.")
		if err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		_, err = io.Copy(tmp, in)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Chmod(tmp.Name(), mode)
		}
		if err == nil {
			err = os.Rename(tmp.Name(), f)
		}
		if err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("write %s: %w", p, err)
		}
		st, err := fileStatus(f)
		if err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		return writeJSON(out, sandboxtool.FileResponse{File: st})
	case sandboxtool.FileList:
		r, err := resolveAll(p)
		if err != nil {
			return err
		}
		if !inside(root, r) {
			return outside()
		}
		st, err := os.Stat(r)
		if err != nil {
			return notFound()
		}
		if !st.IsDir() {
			return fail(sandboxtool.ExitNotDir, "%s is not a directory", p)
		}
		entries, err := os.ReadDir(r)
		if err != nil {
			return fmt.Errorf("list %s: %w", p, err)
		}
		resp := sandboxtool.FileResponse{Entries: []sandboxtool.FileStatus{}}
		for _, e := range entries {
			st, err := fileStatus(filepath.Join(r, e.Name()))
			if errors.Is(err, fs.ErrNotExist) {
				continue // gone meanwhile
			}
			if err != nil {
				return fmt.Errorf("list %s: %w", p, err)
			}
			st.Name = sandboxtool.Name(e.Name())
			resp.Entries = append(resp.Entries, *st)
		}
		return writeJSON(out, resp)
	}
	return fail(sandboxtool.ExitUsage, "file: no operation %q", req.Op)
}
