package tool

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/hangar-dev/hangar/api/sandboxtool"
)

// emptyBlob is git's hash of the empty file.
const emptyBlob = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"

// location is where a work tree's git files are.
type location struct {
	gitDir, index string
}

// locate checks that dir is the top of a git work tree.
func (r repo) locate(ctx context.Context) (location, error) {
	out, _, err := r.run(ctx, gitCmd{args: []string{"rev-parse", "--is-inside-work-tree", "--show-prefix", "--absolute-git-dir", "--git-path", "index"}})
	lines := strings.Split(string(out), "\n")
	if err != nil || len(lines) < 4 || lines[0] != "true" {
		return location{}, fail(sandboxtool.ExitNotARepo, "%s is not a git work tree", r.dir)
	}
	if lines[1] != "" {
		return location{}, fail(sandboxtool.ExitNotARepo, "%s is not the top of its git work tree", r.dir)
	}
	idx := lines[3]
	if !filepath.IsAbs(idx) {
		idx = filepath.Join(r.dir, idx)
	}
	return location{gitDir: lines[2], index: idx}, nil
}

// sameFile reports whether a and b are the same file (hard links).
func sameFile(a, b string) bool {
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func nonce() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// objectTypes asks git for the object and type of each name ("missing"
// when there is none).
func (r repo) objectTypes(ctx context.Context, names ...string) ([][2]string, error) {
	in := strings.Join(names, "\n") + "\n"
	out, _, err := r.run(ctx, gitCmd{args: []string{"cat-file", "--batch-check=%(objectname) %(objecttype)"}, stdin: strings.NewReader(in)})
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(names) {
		return nil, fmt.Errorf("cat-file: %d answers for %d names", len(lines), len(names))
	}
	res := make([][2]string, len(names))
	for i, l := range lines {
		obj, typ, _ := strings.Cut(l, " ")
		res[i] = [2]string{obj, typ}
	}
	return res, nil
}

// linkOrCopy makes dst the file src: a hard link (git replaces an index,
// never writes it in place, so the original stays as it is) or a copy
// keeping its mtime (git trusts its stat cache only for entries older than
// the index file: a fresh mtime would hide edits made within the same
// second as the last index write).
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chtimes(dst, st.ModTime(), st.ModTime())
}

// probe reports the repository state and, when HEAD and the base are
// there, two trees written from copies of the index: ITree, the index's own
// ("-" when it has none, e.g. unmerged entries), and Tree, the full work
// tree after `add -A`. Every part of a capture is then a diff between
// trees, which costs what changed, not what the tree holds. The copy keeps
// the index's stat cache, so only changed files are read.
//
// Entries the index recorded in the same second it was written ("racily
// clean", e.g. everything a checkout or a restore wrote) are read again by
// every capture until the index is written in a later second, so the probe
// refreshes the real index's stat cache (what git status does; content is
// not changed) unless gitdir/hangar-index-stamp, a hard link to the index
// an earlier refresh left with no such entries, is still the index. While
// the stamp holds, the index's tree is the one recorded then
// (hangar-index-stamp.tree), not written again.
func probe(ctx context.Context, req *sandboxtool.ProbeRequest, _ io.Reader, out io.Writer) error {
	r := repo{dir: req.WorkDir}
	loc, err := r.locate(ctx)
	if err != nil {
		return err
	}
	stamp := filepath.Join(loc.gitDir, "hangar-index-stamp")
	cached := "-"
	if isFile(loc.index) && sameFile(loc.index, stamp) {
		if b, err := os.ReadFile(stamp + ".tree"); err == nil {
			if f := strings.Fields(string(b)); len(f) > 0 {
				cached = f[0]
			}
		}
	}
	// Each process costs milliseconds in a sandbox: everything that does
	// not need another's result runs at once. The scans and the refresh
	// are wasted only when there is no HEAD or base (then nothing is
	// captured).
	id := nonce()
	tmp := filepath.Join(loc.gitDir, "hangar-tree-index."+id)
	itmp := filepath.Join(loc.gitDir, "hangar-itree-index."+id)
	defer os.Remove(tmp)
	defer os.Remove(itmp)
	var (
		types              [][2]string
		refs, tree         string
		scan, staged       []byte
		ancestor, hasIndex bool
	)
	g, gctx := errgroup.WithContext(ctx)
	// The work tree's tree, from the index's copy (an empty index when
	// there is none). Its walk of the work tree runs beside the untracked
	// scan's, not after it. Its error counts only when there is something
	// to capture (a HEAD and the base).
	var treeErr error
	writeTree := func() error {
		env := []string{"GIT_INDEX_FILE=" + tmp}
		if _, _, treeErr = r.run(gctx, gitCmd{args: []string{"add", "-A"}, env: env}); treeErr != nil {
			return nil
		}
		var t []byte
		t, _, treeErr = r.run(gctx, gitCmd{args: []string{"write-tree"}, env: env})
		tree = strings.TrimSpace(string(t))
		return nil
	}
	g.Go(func() error {
		var err error
		types, err = r.objectTypes(gctx, "HEAD", "HEAD^{tree}", req.Base+"^{commit}", cached+"^{tree}")
		return err
	})
	g.Go(func() error {
		var err error
		refs, err = r.git(gctx, "for-each-ref", "--format=%(objectname) %(refname) %(HEAD)", "refs/heads/")
		return err
	})
	// The untracked scan and the index's entries of the empty blob (an
	// intent-to-add entry, git add -N, is one).
	g.Go(func() error {
		var err error
		scan, _, err = r.run(gctx, gitCmd{args: []string{"ls-files", "-z", "--others", "--exclude-standard", "--directory"}})
		return err
	})
	g.Go(func() error {
		var err error
		staged, _, err = r.run(gctx, gitCmd{args: []string{"ls-files", "-s", "-z"}})
		return err
	})
	if req.PreviousHead != "" {
		g.Go(func() error {
			_, code, err := r.run(gctx, gitCmd{args: []string{"merge-base", "--is-ancestor", req.PreviousHead, "HEAD"}, ok: []int{1, 128}})
			ancestor = err == nil && code == 0
			return nil
		})
	}
	g.Go(func() error {
		if !isFile(loc.index) {
			return writeTree()
		}
		if !sameFile(loc.index, stamp) {
			refreshStamp(gctx, r, loc.index, stamp)
		}
		// Two copies: the index's own tree and the work tree's are
		// written at once, each from its own.
		for _, p := range []string{tmp, itmp} {
			if err := linkOrCopy(loc.index, p); err != nil {
				return fmt.Errorf("copy the index: %w", err)
			}
		}
		hasIndex = true
		return writeTree()
	})
	if err := g.Wait(); err != nil {
		return err
	}
	res := sandboxtool.ProbeResponse{Head: types[0][0], Base: types[2][0], GitDir: loc.gitDir}
	if types[0][1] != "commit" {
		res.Head = "none"
	}
	if types[2][1] != "commit" {
		res.Base = "missing"
	}
	htree := types[1][0]
	for _, l := range strings.Split(refs, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		name := strings.TrimPrefix(f[1], "refs/heads/")
		res.Refs = append(res.Refs, sandboxtool.Ref{Name: name, Commit: f[0]})
		if len(f) == 3 && f[2] == "*" {
			res.Branch = name
		}
	}
	if res.Head == "none" || res.Base == "missing" {
		return writeJSON(out, res)
	}
	if treeErr != nil {
		return treeErr
	}
	res.Tree = tree
	res.Ancestor = req.PreviousHead != "" && (req.PreviousHead == res.Head || ancestor)

	g, gctx = errgroup.WithContext(ctx)
	g.Go(func() error {
		itree := "-"
		if types[3][1] == "tree" && hasIndex && sameFile(itmp, stamp) {
			itree = types[3][0]
		} else {
			// No index: the empty tree, as git write-tree gives.
			if t, _, err := r.run(gctx, gitCmd{args: []string{"write-tree"}, env: []string{"GIT_INDEX_FILE=" + itmp}}); err == nil {
				itree = strings.TrimSpace(string(t))
			}
			if itree != "-" && sameFile(loc.index, stamp) {
				_ = os.WriteFile(stamp+".tree", []byte(itree+"\n"), 0o644)
			}
		}
		res.ITree = itree
		return nil
	})
	if err := g.Wait(); err != nil {
		return err
	}
	if res.ITree == "-" {
		return writeJSON(out, res)
	}
	pairs := fmt.Sprintf("%s %s\n%s %s\n%s %s\n", htree, res.ITree, htree, res.Tree, res.ITree, res.Tree)
	diffs, _, err := r.run(ctx, gitCmd{args: []string{"diff-tree", "--stdin", "--always", "-r", "-z", "--raw", "--no-renames"}, stdin: strings.NewReader(pairs)})
	if err != nil {
		return err
	}
	changes, err := parseTreeDiffs(diffs, 3)
	if err != nil {
		return err
	}
	res.HeadIndex, res.HeadWorkTree, res.IndexWorkTree = changes[0], changes[1], changes[2]
	for _, n := range splitNUL(scan) {
		res.Untracked = append(res.Untracked, sandboxtool.Name(n))
	}
	// "mode hash stage\tpath" of stage 0 entries of the empty blob.
	for _, e := range splitNUL(staged) {
		meta, p, ok := strings.Cut(e, "\t")
		if f := strings.Fields(meta); ok && len(f) == 3 && f[1] == emptyBlob && f[2] == "0" && p != "" {
			res.EmptyBlobs = append(res.EmptyBlobs, sandboxtool.Name(p))
		}
	}
	return writeJSON(out, res)
}

// refreshStamp refreshes the index's stat cache and, when no entry of it
// is racily clean afterwards, links stamp to it.
func refreshStamp(ctx context.Context, r repo, index, stamp string) {
	for _, p := range []string{stamp, stamp + ".pre", stamp + ".tree"} {
		_ = os.Remove(p)
	}
	pre := stamp + ".pre"
	if err := os.Link(index, pre); err != nil {
		return
	}
	defer os.Remove(pre)
	before, err := os.Stat(index)
	if err != nil {
		return
	}
	// Exit 1: some files need updating (modified): still refreshed.
	if _, _, err := r.run(ctx, gitCmd{args: []string{"update-index", "-q", "--refresh"}, ok: []int{1}}); err != nil {
		return
	}
	after, err := os.Stat(index)
	if err != nil {
		return
	}
	// Not rewritten, or rewritten in a later second: no entry is racily
	// clean.
	if sameFile(index, pre) || after.ModTime().Unix() > before.ModTime().Unix() {
		_ = os.Remove(stamp)
		_ = os.Link(index, stamp)
	}
}

// parseTreeDiffs reads `git diff-tree --stdin --always -r -z --raw` of n
// tree pairs: each pair's header line "a b\n", then its entries
// ":oldmode newmode old new status\0path\0".
func parseTreeDiffs(data []byte, n int) ([][]sandboxtool.Change, error) {
	bad := func(what string) error { return fmt.Errorf("unexpected diff-tree output (%s)", what) }
	res := make([][]sandboxtool.Change, n)
	sec := -1
	for len(data) > 0 {
		if data[0] != ':' {
			nl := bytes.IndexByte(data, '\n')
			if nl < 0 {
				return nil, bad("header")
			}
			sec++
			data = data[nl+1:]
			continue
		}
		meta, after, ok1 := bytes.Cut(data, []byte{0})
		p, after, ok2 := bytes.Cut(after, []byte{0})
		f := strings.Fields(string(meta))
		if !ok1 || !ok2 || len(f) != 5 || sec < 0 || sec >= n {
			return nil, bad("entry")
		}
		res[sec] = append(res[sec], sandboxtool.Change{NewMode: f[1], Status: f[4], Path: sandboxtool.Name(p)})
		data = after
	}
	if sec != n-1 {
		return nil, bad("pairs")
	}
	return res, nil
}

// treeHash is the hash of the work tree as `git add` into a copy of the
// index sees it.
func treeHash(ctx context.Context, r repo, trackedOnly bool) (string, error) {
	loc, err := r.locate(ctx)
	if err != nil {
		return "", err
	}
	return treeHashAt(ctx, r, loc, trackedOnly)
}

// treeHashAt is treeHash of a work tree already located.
func treeHashAt(ctx context.Context, r repo, loc location, trackedOnly bool) (string, error) {
	tmp := filepath.Join(loc.gitDir, "hangar-tree-index."+nonce())
	defer os.Remove(tmp)
	if err := linkOrCopy(loc.index, tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("copy the index: %w", err)
	}
	env := []string{"GIT_INDEX_FILE=" + tmp}
	add := "-A"
	if trackedOnly {
		add = "-u"
	}
	if _, _, err := r.run(ctx, gitCmd{args: []string{"add", add}, env: env}); err != nil {
		return "", err
	}
	tree, _, err := r.run(ctx, gitCmd{args: []string{"write-tree"}, env: env})
	return strings.TrimSpace(string(tree)), err
}

func treeHashCommand(ctx context.Context, req *sandboxtool.TreeHashRequest, _ io.Reader, out io.Writer) error {
	tree, err := treeHash(ctx, repo{dir: req.WorkDir}, req.TrackedOnly)
	if err != nil {
		return err
	}
	return writeJSON(out, sandboxtool.TreeHashResponse{Tree: tree})
}
