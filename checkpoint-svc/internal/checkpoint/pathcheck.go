package checkpoint

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"io"
	"path"
	"strconv"
	"strings"
)

// errUnsafePath: a tar entry or diff path would land outside the work tree
// (or the conversation directories), or write through a symbolic link.
var errUnsafePath = errors.New("unsafe path in checkpoint")

// tarPolicy says where a tarball's entries may go.
type tarPolicy struct {
	// absolute: entries are absolute paths that must lie under one of
	// roots (conversation files); otherwise relative to the work tree.
	absolute bool
	roots    []string
	// symlinks already in the target (cleaned, relative for the work tree):
	// nothing may be written through them.
	symlinks map[string]bool
	// relocate moves entries under a root to another place (absolute
	// policies only); directory entries above a moved root are dropped.
	relocate []*checkpointv1.PathRewrite
}

// moved returns where a checked absolute name goes, and whether it is kept.
func (pol tarPolicy) moved(name string) (string, bool) {
	for _, r := range pol.relocate {
		from := r.GetFrom()
		if name == from || strings.HasPrefix(name, from+"/") {
			return r.GetTo() + name[len(from):], true
		}
		if strings.HasPrefix(from, name+"/") || name == "/" {
			// A parent of a moved root: it belongs to the old place.
			return "", false
		}
	}
	return name, true
}

// filterTar reads a tarball, checks every header, and writes the entries
// it accepts, re-encoded, to w: what reaches the sandbox's tar is only
// what was checked. Names are returned for later checks.
func filterTar(src io.Reader, w io.Writer, pol tarPolicy) ([]string, error) {
	tr := tar.NewReader(src)
	tw := tar.NewWriter(w)
	links := map[string]bool{}
	for k := range pol.symlinks {
		links[k] = true
	}
	files := map[string]bool{}
	var names []string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return names, fmt.Errorf("%w: bad tarball: %v", errDamaged, err)
		}
		name, err := pol.clean(hdr.Name)
		if err != nil {
			return names, err
		}
		if name == "." || name == "/" {
			if hdr.Typeflag != tar.TypeDir {
				return names, fmt.Errorf("%w: %q is not a directory", errUnsafePath, hdr.Name)
			}
			continue
		}
		if pol.absolute && !pol.underRoot(name) && hdr.Typeflag != tar.TypeDir {
			return names, fmt.Errorf("%w: %q above the conversation paths is not a directory", errUnsafePath, hdr.Name)
		}
		if links[name] {
			return names, fmt.Errorf("%w: %q replaces a symbolic link", errUnsafePath, hdr.Name)
		}
		for p := path.Dir(name); p != "." && p != "/"; p = path.Dir(p) {
			if links[p] {
				return names, fmt.Errorf("%w: %q goes through the symbolic link %q", errUnsafePath, hdr.Name, p)
			}
		}
		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeDir, tar.TypeFifo:
		case tar.TypeSymlink:
			if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
				return names, fmt.Errorf("%w: %q: bad link target", errUnsafePath, hdr.Name)
			}
			links[name] = true
		case tar.TypeLink:
			target, err := pol.clean(hdr.Linkname)
			if err != nil || !files[target] {
				return names, fmt.Errorf("%w: %q: hard link to %q outside the archive", errUnsafePath, hdr.Name, hdr.Linkname)
			}
		default:
			return names, fmt.Errorf("%w: %q: entry type %q not allowed", errUnsafePath, hdr.Name, hdr.Typeflag)
		}
		if hdr.Typeflag == tar.TypeReg {
			files[name] = true
		}
		names = append(names, name)
		outName, outLink := hdr.Name, hdr.Linkname
		if len(pol.relocate) > 0 {
			var keep bool
			if outName, keep = pol.moved(name); !keep {
				continue
			}
			if hdr.Typeflag == tar.TypeLink {
				target, _ := pol.clean(hdr.Linkname)
				outLink, _ = pol.moved(target)
			}
		}
		out := &tar.Header{
			Typeflag: hdr.Typeflag, Name: outName, Linkname: outLink,
			Size: hdr.Size, Mode: hdr.Mode & 0o7777, ModTime: hdr.ModTime,
			Uid: hdr.Uid, Gid: hdr.Gid, Format: tar.FormatGNU,
		}
		if out.Typeflag != tar.TypeReg {
			out.Size = 0
		}
		if err := tw.WriteHeader(out); err != nil {
			return names, fmt.Errorf("re-encode tar entry: %w", err)
		}
		if out.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return names, err
			}
		}
	}
	return names, tw.Close()
}

// underRoot reports whether a clean absolute name is a root or under one.
func (pol tarPolicy) underRoot(name string) bool {
	for _, r := range pol.roots {
		if name == r || strings.HasPrefix(name, r+"/") {
			return true
		}
	}
	return false
}

// clean checks a tar name and returns its clean form.
func (pol tarPolicy) clean(name string) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("%w: %q %s", errUnsafePath, name, why)
	}
	if name == "" || strings.ContainsRune(name, 0) {
		return bad("is empty or has a NUL byte")
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return bad("has a '..' component")
		}
	}
	c := path.Clean(name)
	if !pol.absolute {
		if path.IsAbs(name) {
			return bad("is absolute")
		}
		if c == ".git" || strings.HasPrefix(c, ".git/") {
			return bad("is inside .git")
		}
		return c, nil
	}
	if !path.IsAbs(name) {
		return bad("is not absolute")
	}
	for _, r := range pol.roots {
		if c == r || strings.HasPrefix(c, r+"/") {
			return c, nil
		}
		// Parents of a root come as directory entries of the tarball.
		if strings.HasPrefix(r, c+"/") || c == "/" {
			return c, nil
		}
	}
	return bad("is outside the conversation paths")
}

// checkDiff reads a patch made by captureDiff and fails on any path that
// is absolute, has '..', is inside .git, or on a header it never makes
// (renames, copies). git apply refuses these too; this is the second lock.
func checkDiff(src io.Reader, w io.Writer) error {
	br := bufio.NewReaderSize(src, 64<<10)
	bol := true
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if bol {
				if err := checkDiffLine(line); err != nil {
					return err
				}
			}
			if _, werr := w.Write(line); werr != nil {
				return werr
			}
			bol = len(line) > 0 && line[len(line)-1] == '\n'
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return err
		}
	}
}

func checkDiffLine(line []byte) error {
	for _, p := range [][]byte{[]byte("rename "), []byte("copy ")} {
		if bytes.HasPrefix(line, p) {
			return fmt.Errorf("%w: unexpected %q header", errUnsafePath, strings.TrimSpace(string(p)))
		}
	}
	rest, ok := bytes.CutPrefix(line, []byte("diff --git "))
	if !ok {
		return nil
	}
	s := strings.TrimRight(string(rest), "\n")
	var a, b string
	if strings.HasPrefix(s, `"`) {
		qa, err := strconv.QuotedPrefix(s)
		if err != nil {
			return fmt.Errorf("%w: bad diff header", errUnsafePath)
		}
		a, _ = unquoteGit(qa)
		b, _ = unquoteGit(strings.TrimPrefix(s[len(qa):], " "))
	} else {
		// Without renames both names are the same: "a/X b/X".
		if (len(s)-5)%2 != 0 || len(s) < 7 {
			return fmt.Errorf("%w: bad diff header", errUnsafePath)
		}
		x := (len(s) - 5) / 2
		a, b = s[:2+x], s[3+x:]
	}
	for _, p := range []string{a, b} {
		rel, ok := strings.CutPrefix(p, "a/")
		if !ok {
			rel, ok = strings.CutPrefix(p, "b/")
		}
		if !ok {
			return fmt.Errorf("%w: bad diff header", errUnsafePath)
		}
		if _, err := (tarPolicy{}).clean(rel); err != nil {
			return err
		}
	}
	if a[2:] != b[2:] {
		return fmt.Errorf("%w: diff header names two paths", errUnsafePath)
	}
	return nil
}

// unquoteGit undoes git's C-style path quoting (octal escapes are bytes,
// not runes, so strconv.Unquote is not enough).
func unquoteGit(q string) (string, bool) {
	if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' {
		return q, false
	}
	q = q[1 : len(q)-1]
	var out []byte
	for i := 0; i < len(q); i++ {
		c := q[i]
		if c != '\\' || i+1 == len(q) {
			out = append(out, c)
			continue
		}
		i++
		switch q[i] {
		case 'a':
			out = append(out, 7)
		case 'b':
			out = append(out, 8)
		case 't':
			out = append(out, 9)
		case 'n':
			out = append(out, 10)
		case 'v':
			out = append(out, 11)
		case 'f':
			out = append(out, 12)
		case 'r':
			out = append(out, 13)
		case '0', '1', '2', '3':
			if i+2 < len(q) {
				v, err := strconv.ParseUint(q[i:i+3], 8, 8)
				if err == nil {
					out = append(out, byte(v))
					i += 2
					continue
				}
			}
			out = append(out, q[i])
		default:
			out = append(out, q[i])
		}
	}
	return string(out), true
}
