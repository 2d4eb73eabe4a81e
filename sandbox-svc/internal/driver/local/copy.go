package local

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// copyTree copies the directory src to dst (which must not exist yet, or be
// empty): directories, regular files and symbolic links with their modes
// and modification times; other file types (sockets, fifos) are skipped.
// Files of a git object store (".git/objects/" below src) are hard-linked:
// git only adds and removes them, never writes one in place. Everything
// else is copied.
func copyTree(ctx context.Context, src, dst string) error {
	type dir struct {
		path string
		perm fs.FileMode
	}
	var dirs []dir
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch mode := info.Mode(); {
		case mode.IsDir():
			// Owner-writable while it is filled; its mode is set after.
			dirs = append(dirs, dir{to, mode.Perm()})
			return os.MkdirAll(to, 0o700)
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case mode.IsRegular():
			if objectFile(rel) {
				if err := os.Link(p, to); err == nil {
					return nil
				}
			}
			return copyFile(p, to, info)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, d := range dirs {
		if err := os.Chmod(d.path, d.perm); err != nil {
			return err
		}
	}
	return nil
}

// objectFile says whether rel (slash or OS separated) lies in a git object
// store: loose objects and packs.
func objectFile(rel string) bool {
	rel = filepath.ToSlash(rel)
	return strings.HasPrefix(rel, ".git/objects/") || strings.Contains(rel, "/.git/objects/")
}

func copyFile(from, to string, info fs.FileInfo) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, info.Mode().Perm()|0o200)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", from, err)
	}
	// The mode is the source's (not the umask's) and the modification time
	// is kept: git's stat cache and tools that look at times see the files
	// as the source had them.
	if err := out.Chmod(info.Mode().Perm()); err != nil {
		out.Close()
		return err
	}
	mtime := unix.NsecToTimeval(info.ModTime().UnixNano())
	if err := unix.Futimes(int(out.Fd()), []unix.Timeval{mtime, mtime}); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
