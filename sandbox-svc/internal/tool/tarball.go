package tool

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hangar-dev/hangar/api/sandboxtool"
)

// tarWriter writes GNU tarballs of files as they are on disk: regular
// files, directories, symbolic links (as links) and FIFOs; other types
// and files gone since they were listed are left out.
type tarWriter struct {
	tw   *tar.Writer
	root string // names are relative to it ("" for absolute names)
}

func newTarWriter(out io.Writer, root string) *tarWriter {
	return &tarWriter{tw: tar.NewWriter(out), root: root}
}

// add writes the entry for name.
func (w *tarWriter) add(name string) error {
	p := name
	if w.root != "" {
		p = filepath.Join(w.root, name)
	}
	st, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	hdr := &tar.Header{Name: name, Mode: int64(unixMode(st.Mode())), ModTime: st.ModTime().Truncate(time.Second), Format: tar.FormatGNU}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		hdr.Uid, hdr.Gid = int(sys.Uid), int(sys.Gid)
	}
	switch {
	case st.Mode().IsRegular():
		hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size()
	case st.IsDir():
		hdr.Typeflag = tar.TypeDir
		if !strings.HasSuffix(hdr.Name, "/") {
			hdr.Name += "/"
		}
	case st.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(p)
		if err != nil {
			return nil
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	case st.Mode()&fs.ModeNamedPipe != 0:
		hdr.Typeflag = tar.TypeFifo
	default:
		return nil // sockets, devices: as GNU tar, left out
	}
	if hdr.Typeflag != tar.TypeReg {
		return w.tw.WriteHeader(hdr)
	}
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			return nil
		}
		return err
	}
	defer f.Close()
	if err := w.tw.WriteHeader(hdr); err != nil {
		return err
	}
	// A file that shrank since its stat is padded with zeros (as GNU tar
	// does); one that grew is cut at the size written.
	n, err := io.Copy(w.tw, io.LimitReader(f, hdr.Size))
	if err != nil {
		return err
	}
	if n < hdr.Size {
		_, err = io.CopyN(w.tw, zeros{}, hdr.Size-n)
	}
	return err
}

// walk adds name and everything under it (name itself unless skipSelf).
func (w *tarWriter) walk(name string, skipSelf, dirsOnlyIfEmpty bool) error {
	p := name
	if w.root != "" {
		p = filepath.Join(w.root, name)
	}
	return filepath.WalkDir(p, func(full string, d fs.DirEntry, err error) error {
		if err != nil {
			if full == p && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if errors.Is(err, fs.ErrPermission) {
				return nil
			}
			return err
		}
		rel := full
		if w.root != "" {
			rel = name + strings.TrimPrefix(full, p)
		}
		if full == p && skipSelf {
			return nil
		}
		if dirsOnlyIfEmpty {
			if !d.IsDir() || !emptyDir(full) {
				return nil
			}
		}
		return w.add(rel)
	})
}

func (w *tarWriter) close() error { return w.tw.Close() }

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// unixMode is the permission bits (with setuid, setgid, sticky) of m.
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= syscall.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		u |= syscall.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		u |= syscall.S_ISVTX
	}
	return u
}

func emptyDir(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	return len(names) == 0 && errors.Is(err, io.EOF)
}

func isRealDir(p string) bool {
	st, err := os.Lstat(p)
	return err == nil && st.IsDir()
}

// untracked writes the untracked files .gitignore does not ignore: every
// such file, untracked directories (for their modes) with the empty
// directories under them, untracked repositories whole, and directories
// left empty by deleted tracked files (which applying the diff would
// remove).
func untracked(ctx context.Context, req *sandboxtool.UntrackedRequest, _ io.Reader, out io.Writer) error {
	r := repo{dir: req.WorkDir}
	files, emptied, repos, dirs := names(req.Files), names(req.Emptied), names(req.Repos), names(req.Dirs)
	if req.Scan {
		var err error
		if files, emptied, repos, dirs, err = scanUntracked(ctx, r); err != nil {
			return err
		}
	}
	w := newTarWriter(out, req.WorkDir)
	for _, f := range files {
		if err := w.add(f); err != nil {
			return err
		}
	}
	for _, d := range emptied {
		if isRealDir(filepath.Join(req.WorkDir, d)) && emptyDir(filepath.Join(req.WorkDir, d)) {
			if err := w.add(d); err != nil {
				return err
			}
		}
	}
	for _, d := range repos {
		if err := w.walk(d, true, false); err != nil {
			return err
		}
	}
	for _, d := range dirs {
		if err := w.add(d); err != nil {
			return err
		}
		if err := w.walk(d, true, true); err != nil {
			return err
		}
	}
	return w.close()
}

func names(ns []sandboxtool.Name) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = string(n)
	}
	return out
}

// scanUntracked finds what untracked writes with git's scan of the work
// tree (a capture whose index has no tree of its own).
func scanUntracked(ctx context.Context, r repo) (files, emptied, repos, dirs []string, err error) {
	others, _, err := r.run(ctx, gitCmd{args: []string{"ls-files", "-z", "--others", "--exclude-standard"}})
	if err != nil {
		return
	}
	for _, n := range splitNUL(others) {
		if d, ok := strings.CutSuffix(n, "/"); ok {
			repos = append(repos, d) // a nested repository
			continue
		}
		files = append(files, n)
	}
	collapsed, _, err := r.run(ctx, gitCmd{args: []string{"ls-files", "-z", "--others", "--exclude-standard", "--directory"}})
	if err != nil {
		return
	}
	for _, n := range splitNUL(collapsed) {
		if d, ok := strings.CutSuffix(n, "/"); ok {
			if _, serr := os.Lstat(filepath.Join(r.dir, d, ".git")); serr != nil {
				dirs = append(dirs, d)
			}
		}
	}
	deleted, _, err := r.run(ctx, gitCmd{args: []string{"ls-files", "-z", "--deleted"}})
	if err != nil {
		return
	}
	seen := map[string]bool{}
	for _, f := range splitNUL(deleted) {
		for d := path.Dir(f); d != "." && d != "/" && !seen[d]; d = path.Dir(d) {
			seen[d] = true
			emptied = append(emptied, d)
		}
	}
	return
}

// archive writes absolute paths and everything under them; missing or
// unreadable ones are left out.
func archive(_ context.Context, req *sandboxtool.ArchiveRequest, _ io.Reader, out io.Writer) error {
	w := newTarWriter(out, "")
	for _, p := range req.Paths {
		if !filepath.IsAbs(p) {
			return fail(sandboxtool.ExitUsage, "archive: %q is not absolute", p)
		}
		if err := w.walk(p, false, false); err != nil {
			return err
		}
	}
	return w.close()
}

// errUnsafe: a tarball entry would be written through a symbolic link.
var errUnsafe = errors.New("unsafe path")

// extract unpacks a tarball under root ("" for absolute names), keeping
// modes and mtimes but not owners. Nothing is written through a symbolic
// link: an entry whose parent is one fails; an entry replacing a file or
// link replaces it (as tar -x does).
func extract(src io.Reader, root string) error {
	tr := tar.NewReader(src)
	type dirTime struct {
		path string
		t    time.Time
	}
	var dirs []dirTime
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read tarball: %w", err)
		}
		name := path.Clean(hdr.Name)
		if name == "." || name == "/" {
			continue
		}
		for _, c := range strings.Split(name, "/") {
			if c == ".." {
				return fmt.Errorf("unsafe path %q", hdr.Name)
			}
		}
		target := name
		if root != "" {
			if path.IsAbs(name) {
				return fmt.Errorf("unsafe path %q: absolute", hdr.Name)
			}
			target = filepath.Join(root, name)
		} else if !path.IsAbs(name) {
			return fmt.Errorf("unsafe path %q: not absolute", hdr.Name)
		}
		if err := noLinkAbove(root, target); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		mode := fs.FileMode(hdr.Mode) & fs.ModePerm
		switch hdr.Typeflag {
		case tar.TypeDir:
			if st, err := os.Lstat(target); err == nil && !st.IsDir() {
				if err := os.Remove(target); err != nil {
					return err
				}
			}
			if err := os.Mkdir(target, mode); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			if err := os.Chmod(target, mode|specialBits(hdr.Mode)); err != nil {
				return err
			}
			dirs = append(dirs, dirTime{target, hdr.ModTime})
			continue
		case tar.TypeReg:
			if err := replaceable(target); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			if err := os.Chmod(target, mode|specialBits(hdr.Mode)); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := replaceable(target); err != nil {
				return err
			}
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return err
			}
			// A link's own time is not kept (tar -x keeps it; git
			// ignores it).
			continue
		case tar.TypeLink:
			if err := replaceable(target); err != nil {
				return err
			}
			from := path.Clean(hdr.Linkname)
			if root != "" {
				from = filepath.Join(root, from)
			}
			if err := noLinkAbove(root, from); err != nil {
				return err
			}
			if err := os.Link(from, target); err != nil {
				return err
			}
			continue
		case tar.TypeFifo:
			if err := replaceable(target); err != nil {
				return err
			}
			if err := syscall.Mkfifo(target, uint32(mode)); err != nil {
				return err
			}
		default:
			return fmt.Errorf("tarball entry %q: type %q not allowed", hdr.Name, hdr.Typeflag)
		}
		if err := os.Chtimes(target, hdr.ModTime, hdr.ModTime); err != nil {
			return err
		}
	}
	// Directories last, deepest first: their contents changed their mtimes.
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Chtimes(dirs[i].path, dirs[i].t, dirs[i].t)
	}
	return nil
}

func specialBits(m int64) fs.FileMode {
	var out fs.FileMode
	if m&syscall.S_ISUID != 0 {
		out |= fs.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		out |= fs.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		out |= fs.ModeSticky
	}
	return out
}

// replaceable removes what is at p, unless it is a directory (an error,
// as tar -x gives for a file over a non-empty directory).
func replaceable(p string) error {
	st, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.IsDir() {
		return os.Remove(p) // fails unless empty
	}
	return os.Remove(p)
}

// noLinkAbove fails when a directory between root and p (exclusive) is a
// symbolic link.
func noLinkAbove(root, p string) error {
	start := root
	rel := p
	if root != "" {
		var err error
		if rel, err = filepath.Rel(root, p); err != nil {
			return err
		}
	} else {
		start = "/"
		rel = strings.TrimPrefix(p, "/")
	}
	parts := strings.Split(rel, "/")
	cur := start
	for _, c := range parts[:len(parts)-1] {
		cur = filepath.Join(cur, c)
		st, err := os.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if st.Mode()&fs.ModeSymlink != 0 {
			if root == "" {
				// Absolute names (conversation files) follow the
				// system's links (/home may be one); only the
				// sandbox's work tree is checked.
				continue
			}
			return fmt.Errorf("%w %q: goes through the symbolic link %q", errUnsafe, p, cur)
		}
	}
	return nil
}
