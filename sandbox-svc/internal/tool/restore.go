package tool

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/hangar-dev/hangar/api/sandboxtool"
)

func stage(_ context.Context, req *sandboxtool.StageRequest, in io.Reader, _ io.Writer) error {
	if !filepath.IsAbs(req.Path) {
		return fail(sandboxtool.ExitUsage, "stage: %q is not absolute", req.Path)
	}
	if err := os.MkdirAll(filepath.Dir(req.Path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(req.Path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, in); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func remove(_ context.Context, req *sandboxtool.RemoveRequest, _ io.Reader, _ io.Writer) error {
	if !filepath.IsAbs(req.Path) || filepath.Clean(req.Path) == "/" {
		return fail(sandboxtool.ExitUsage, "remove: %q is not an absolute path below /", req.Path)
	}
	return os.RemoveAll(req.Path)
}

func restoreProbe(ctx context.Context, req *sandboxtool.RestoreProbeRequest, _ io.Reader, out io.Writer) error {
	r := repo{dir: req.WorkDir}
	loc, err := r.locate(ctx)
	if err != nil {
		return err
	}
	types, err := r.objectTypes(ctx, req.Base+"^{commit}")
	if err != nil {
		return err
	}
	if types[0][1] != "commit" {
		// A sandbox cloned before the base existed (a warm one, the
		// repository moved on since): fetch it, as a first boot does.
		if _, code, err := r.run(ctx, gitCmd{args: []string{"fetch", "-q", "origin", req.Base}, ok: []int{1, 128}}); err != nil || code != 0 {
			return fail(sandboxtool.ExitBaseMissing, "the repository lacks base commit %s", req.Base)
		}
		if types, err = r.objectTypes(ctx, req.Base+"^{commit}"); err != nil {
			return err
		}
		if types[0][1] != "commit" {
			return fail(sandboxtool.ExitBaseMissing, "the repository lacks base commit %s", req.Base)
		}
	}
	return writeJSON(out, sandboxtool.RestoreProbeResponse{GitDir: loc.gitDir})
}

// noReflog: the refs a restore sets get no reflog entry; it would only say
// "restored" (the captured sandbox's reflogs are not kept), and a sandbox
// copied by overlay would copy each up when its branch is renamed. Git
// starts one at the next commit.
var noReflog = []string{"-c", "core.logAllRefUpdates=false"}

// restore rebuilds the repository state in the work tree from the staged
// parts: unbundle the chain in order, set the branches, check out HEAD,
// drop the untracked files the sandbox had, apply the index and work tree
// diffs, unpack the untracked files (never through a symbolic link), mark
// the intent-to-add ones, and hash the tree; the conversation files are
// unpacked only when the tree is the one wanted.
//
// The checkout goes one of two ways. When the sandbox's index is exactly
// its HEAD's tree (its cache-tree says so) and it has no empty
// directories, the fast way moves it from HEAD to the checkpoint's head
// touching only the paths that differ (`read-tree -m -u`, no stat of the
// files that stay) and leaves the untracked files to the tree hash: the
// work tree's hash sees every file the index does not know. Otherwise, or
// when the fast way's tree is not the one wanted (the sandbox had files of
// its own), the full way: `checkout -f` and `clean -f -d`, then everything
// again. Either way the tree is hashed from the work tree before the
// answer, so only what the hash verified is ever reported.
func restore(ctx context.Context, req *sandboxtool.RestoreRequest, _ io.Reader, out io.Writer) error {
	r := repo{dir: req.WorkDir}
	st := req.Staging
	defer os.RemoveAll(st)
	began := time.Now()
	loc, err := r.locate(ctx)
	if err != nil {
		return err
	}
	// Before anything in the sandbox writes the index: its times are
	// still those of the write that recorded its entries.
	smudged := adoptForeignOwner(loc, len(req.Head)/2, r.dir)
	// Whether the work tree has an empty directory (which the fast way
	// can't take) is read beside the unbundling, which writes only in
	// .git: the walk reads every directory of the work tree, at 20,000
	// files 15-45 ms on a loaded 2-core machine, most of the fast way's
	// own cost before this ran alongside.
	emptyDir := make(chan bool, 1)
	go func() { emptyDir <- hasEmptyDir(r.dir) }()
	bundles, err := filepath.Glob(filepath.Join(st, "bundle-*"))
	if err != nil {
		return err
	}
	sort.Strings(bundles)
	for _, b := range bundles {
		if _, _, err := r.run(ctx, gitCmd{args: []string{"bundle", "unbundle", b}}); err != nil {
			return err
		}
	}
	refs, err := os.ReadFile(filepath.Join(st, "refs"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var updates [][2]string // ref, commit
	if len(bytes.TrimSpace(refs)) > 0 {
		for _, l := range strings.Split(strings.TrimSpace(string(refs)), "\n") {
			sha, ref, ok := strings.Cut(l, " ")
			if !ok {
				return fmt.Errorf("staged refs: bad line %q", l)
			}
			updates = append(updates, [2]string{ref, sha})
		}
	}
	fast, err := checkoutFast(ctx, r, loc, req, updates, emptyDir)
	if err != nil {
		return err
	}
	if !fast {
		if err := checkoutFull(ctx, r, req, updates); err != nil {
			return err
		}
	}
	tree, err := restoreWork(ctx, r, loc, req, began, smudged)
	if err != nil && (!fast || ctx.Err() != nil) {
		return err
	}
	if fast && (err != nil || tree != req.WantTree) {
		// The sandbox held something the fast way keeps (a file of its
		// own in the way of a diff or an untracked file, a change its
		// index did not show): the full way, from the top, which
		// reports its own failure.
		if err := checkoutFull(ctx, r, req, updates); err != nil {
			return err
		}
		if tree, err = restoreWork(ctx, r, loc, req, began, smudged); err != nil {
			return err
		}
	}
	if tree == req.WantTree && req.Conversation {
		f, err := os.Open(filepath.Join(st, "conversation.tar"))
		if err != nil {
			return err
		}
		err = extract(bufio.NewReaderSize(f, 64<<10), "")
		f.Close()
		if err != nil {
			return fmt.Errorf("conversation files: %w", err)
		}
	}
	return writeJSON(out, sandboxtool.RestoreResponse{Tree: tree})
}

// checkoutFull sets the branches and checks HEAD out over whatever the
// work tree holds, removing its untracked files.
func checkoutFull(ctx context.Context, r repo, req *sandboxtool.RestoreRequest, updates [][2]string) error {
	if len(updates) > 0 {
		if err := updateRefs(ctx, r, updates); err != nil {
			return err
		}
	}
	checkout := append(append([]string(nil), noReflog...), "checkout", "-q", "-f")
	if req.Branch == "" {
		checkout = append(checkout, "--detach", req.Head)
	} else {
		checkout = append(checkout, "-B", req.Branch, req.Head)
	}
	if _, _, err := r.run(ctx, gitCmd{args: checkout}); err != nil {
		return err
	}
	_, _, err := r.run(ctx, gitCmd{args: []string{"clean", "-q", "-f", "-d"}})
	return err
}

// checkoutFast moves a sandbox whose index is its HEAD's tree to the
// checkpoint's head, writing only the paths that differ, and sets the
// branches and HEAD. It reports false, having changed nothing, when the
// sandbox is not such a one (the full way is then taken). emptyDir
// delivers hasEmptyDir of the work tree.
func checkoutFast(ctx context.Context, r repo, loc location, req *sandboxtool.RestoreRequest, updates [][2]string, emptyDir <-chan bool) (bool, error) {
	if len(req.Head) != 40 && len(req.Head) != 64 {
		return false, nil
	}
	trees, err := r.objectTypes(ctx, "HEAD^{tree}", req.Head+"^{tree}")
	if err != nil || trees[0][1] != "tree" || trees[1][1] != "tree" {
		return false, nil
	}
	idx, err := readIndex(loc.index, len(req.Head)/2)
	if err != nil || idx.tree != trees[0][0] {
		// No index, one git can't vouch for (its cache-tree is not
		// HEAD's tree: staged changes, unmerged or intent-to-add
		// entries), or one this reader does not know.
		return false, nil
	}
	if <-emptyDir {
		return false, nil // clean -d removes those
	}
	if trees[0][0] != trees[1][0] {
		// Two-tree merge from HEAD: only the paths whose entries differ
		// are checked and written; it refuses (and writes nothing) when
		// one of them is changed in the work tree or an untracked file
		// is in the way.
		if _, code, err := r.run(ctx, gitCmd{args: []string{"read-tree", "-m", "-u", "HEAD", req.Head}, ok: []int{128}}); err != nil {
			return false, err
		} else if code != 0 {
			return false, nil
		}
	}
	head := req.Head + "\n"
	if req.Branch != "" {
		// As checkout -B: the branch is made or reset at the head.
		ref := "refs/heads/" + req.Branch
		updates = slices.DeleteFunc(slices.Clone(updates), func(u [2]string) bool { return u[0] == ref })
		updates = append(updates, [2]string{ref, req.Head})
		head = "ref: " + ref + "\n"
	}
	if len(updates) > 0 {
		if err := updateRefs(ctx, r, updates); err != nil {
			return false, err
		}
	}
	// HEAD as git writes it: a new file renamed into place.
	tmp := filepath.Join(loc.gitDir, "HEAD.hangar-"+nonce())
	if err := os.WriteFile(tmp, []byte(head), 0o644); err != nil {
		return false, err
	}
	if err := os.Rename(tmp, filepath.Join(loc.gitDir, "HEAD")); err != nil {
		os.Remove(tmp)
		return false, err
	}
	return true, nil
}

// updateRefs sets the refs in one transaction.
func updateRefs(ctx context.Context, r repo, updates [][2]string) error {
	var cmds strings.Builder
	for _, u := range updates {
		fmt.Fprintf(&cmds, "update %s %s\n", u[0], u[1])
	}
	_, _, err := r.run(ctx, gitCmd{args: append(append([]string(nil), noReflog...), "update-ref", "--stdin"), stdin: strings.NewReader(cmds.String())})
	return err
}

// hasEmptyDir reports whether the work tree (its .git aside) has an empty
// directory, reading directories only (no file is stat'ed, nothing sorted).
func hasEmptyDir(root string) bool {
	found := false
	var walk func(dir string)
	walk = func(dir string) {
		ents, err := readDirUnsorted(dir)
		if err != nil {
			found = true // unreadable: let the full way deal with it
			return
		}
		if len(ents) == 0 {
			found = true
			return
		}
		for _, e := range ents {
			if found {
				return
			}
			if e.IsDir() && !(dir == root && e.Name() == ".git") {
				walk(filepath.Join(dir, e.Name()))
			}
		}
	}
	walk(root)
	return found
}

// readDirUnsorted is os.ReadDir without the sort.
func readDirUnsorted(dir string) ([]os.DirEntry, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.ReadDir(-1)
}

// restoreWork does what follows the checkout: the index and work tree
// diffs, settling the index, the untracked files and the intent-to-add
// marks; it returns the work tree's hash.
func restoreWork(ctx context.Context, r repo, loc location, req *sandboxtool.RestoreRequest, began time.Time, smudged map[string]bool) (string, error) {
	st := req.Staging
	// A diff may hold no patch, only lines like "* Unmerged path x".
	var written []string // the work tree files the work tree diff wrote
	for _, d := range []struct {
		name string
		args []string
	}{{"index.diff", []string{"apply", "--cached", "--binary"}}, {"worktree.diff", []string{"apply", "--binary", "--numstat", "-z", "--apply"}}} {
		p := filepath.Join(st, d.name)
		if hasPatch(p) {
			out, _, err := r.run(ctx, gitCmd{args: append(d.args, p)})
			if err != nil {
				return "", err
			}
			if d.name == "worktree.diff" {
				written = numstatPaths(out)
			}
		}
	}
	if err := settle(ctx, r, loc, len(req.Head)/2, began, written, smudged); err != nil {
		return "", err
	}
	if req.Untracked {
		f, err := os.Open(filepath.Join(st, "untracked.tar"))
		if err != nil {
			return "", err
		}
		err = extract(bufio.NewReaderSize(f, 64<<10), req.WorkDir)
		f.Close()
		if errors.Is(err, errUnsafe) {
			return "", fail(sandboxtool.ExitUnsafePath, "untracked files: %w", err)
		}
		if err != nil {
			return "", fmt.Errorf("untracked files: %w", err)
		}
		if len(req.IntentToAdd) > 0 {
			args := []string{"add", "-N", "--"}
			for _, p := range req.IntentToAdd {
				args = append(args, string(p))
			}
			if _, _, err := r.run(ctx, gitCmd{args: args, env: []string{"GIT_LITERAL_PATHSPECS=1"}}); err != nil {
				return "", err
			}
		}
	}
	return treeHashAt(ctx, r, loc, req.TrackedOnly)
}

// hasPatch reports whether the file holds a patch ("diff --git" lines).
func hasPatch(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<30)
	for sc.Scan() {
		if bytes.HasPrefix(sc.Bytes(), []byte("diff --git ")) {
			return true
		}
	}
	return false
}

// settle leaves no index entry racily clean. The checkout wrote files in
// the second it wrote the index: git takes such entries for "racily clean"
// and reads every one again at each status until the index is written in
// a later second (and a copy of this sandbox by overlay would copy each one
// up to do so). The tracked files written since the start of the second
// the restore began in (what it wrote, and what the sandbox's own checkout
// wrote in that second) are dated two seconds before it began and their
// entries refreshed (each of them read once, against the index): then no
// entry is racy (every other file is older than the second the restore
// began in, and the index is written no earlier), and one of them the
// diffs changed differs from its entry in mtime, whatever its size. Older
// files are left alone: not racy, not read again, so a restore into a
// sandbox made a few seconds ago reads only what it wrote.
//
// Which files those are comes from the index itself (entries recorded in
// or after that second, or with no stat data: what the checkout and `apply
// --cached` wrote), so only they are stat'ed and refreshed; an index this
// reader does not know has every tracked file stat'ed and the whole index
// refreshed instead.
//
// An index whose entries name another owner than the work tree has here
// (the local driver clones on the host, outside the sandbox's user
// namespace, so a fresh clone's entries carry the host's uid while the
// files here belong to the sandbox's) had every entry taken for changed
// by git: each later command (each step's tree hash, each checkpoint's
// probe, the agent's git status) read and hashed every tracked file
// again, at 5,000 files 300-800 ms a time instead of 20-40 ms. The
// restore adopts such entries before it writes the index
// (adoptForeignOwner); smudged are the entries that left for reading
// again, refreshed here with the rest. One still foreign (the index could
// not be rewritten) has the whole index refreshed (every file read once).
func settle(ctx context.Context, r repo, loc location, hashLen int, began time.Time, written []string, smudged map[string]bool) error {
	recent := began.Truncate(time.Second).Add(-time.Nanosecond)
	past := began.Add(-2 * time.Second).Truncate(time.Second)
	idx, err := readIndex(loc.index, hashLen)
	if err != nil {
		return settleAll(ctx, r, recent, past)
	}
	if foreignOwner(idx, r.dir) {
		return settleAll(ctx, r, recent, past)
	}
	tracked := make(map[string]bool, len(written))
	for _, w := range written {
		tracked[w] = false
	}
	var paths []string
	for _, e := range idx.entries {
		_, isWritten := tracked[e.name]
		if isWritten {
			tracked[e.name] = true
		}
		if !isWritten && e.mtime != 0 && e.mtime < began.Unix() && !smudged[e.name] {
			continue
		}
		if dateBack(filepath.Join(r.dir, e.name), recent, past) {
			paths = append(paths, e.name)
		}
	}
	for w, inIndex := range tracked {
		if !inIndex {
			dateBack(filepath.Join(r.dir, w), recent, past)
		}
	}
	switch {
	case len(paths) == 0:
		return nil
	case len(paths) > 2000:
		// Matching many paths costs more than stat'ing every file.
		_, _, err = r.run(ctx, gitCmd{args: []string{"update-index", "-q", "--refresh"}, ok: []int{1}})
		return err
	}
	_, _, err = r.run(ctx, gitCmd{args: []string{"add", "--refresh", "--pathspec-from-file=-", "--pathspec-file-nul"},
		env: []string{"GIT_LITERAL_PATHSPECS=1"}, stdin: strings.NewReader(strings.Join(paths, "\x00") + "\x00"), ok: []int{1}})
	return err
}

// dateBack dates p to past when it was written after recent; it reports
// whether p exists.
func dateBack(p string, recent, past time.Time) bool {
	st, err := os.Lstat(p)
	if err != nil {
		return false
	}
	if st.ModTime().After(recent) {
		_ = lchtimes(p, past)
	}
	return true
}

// numstatPaths are the paths of `git apply --numstat -z` output: records
// "added<TAB>deleted<TAB>path", or, for a rename or copy, an empty path
// followed by the old and the new path (only the new one is written).
func numstatPaths(out []byte) []string {
	var paths []string
	recs := bytes.Split(out, []byte{0})
	for i := 0; i < len(recs); i++ {
		f := bytes.SplitN(recs[i], []byte{'\t'}, 3)
		if len(f) != 3 {
			continue
		}
		if len(f[2]) > 0 {
			paths = append(paths, string(f[2]))
			continue
		}
		if i+2 < len(recs) {
			paths = append(paths, string(recs[i+2]))
			i += 2
		}
	}
	return paths
}

// foreignOwner reports whether an entry of idx with stat data names
// another owner (uid or gid) than dir's here: git's stat check then fails
// for it whatever its content.
func foreignOwner(idx *gitIndex, dir string) bool {
	st, err := os.Lstat(dir)
	if err != nil {
		return false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	for _, e := range idx.entries {
		if e.mtime != 0 && (e.uid != sys.Uid || e.gid != sys.Gid) {
			return true
		}
	}
	return false
}

// adoptForeignOwner is adoptOwner of an index with entries of another
// owner, before the restore writes it; the entries to read again (nil when
// there was none, or the index could not be rewritten: settle then
// refreshes it whole).
func adoptForeignOwner(loc location, hashLen int, dir string) map[string]bool {
	idx, err := readIndex(loc.index, hashLen)
	if err != nil || !foreignOwner(idx, dir) {
		return nil
	}
	smudged, ok, err := adoptOwner(loc.index, hashLen, dir)
	if err != nil || !ok {
		return nil
	}
	return smudged
}

// adoptOwner rewrites an index whose entries name another owner than the
// work tree's here (the local driver's clone, recorded on the host, outside
// the sandbox's user namespace) so that they name the owner the files have
// here, without reading them: the files are the same files, seen through
// the namespace's uid map, and every other part of each entry's stat data
// (inode, size, modification and change times) still has to match for git
// to trust it. A file changed since the index was written has a change
// time no one can set back: in a later second than the one its entry
// recorded, which git compares, or else in the second the index was
// written. So the entries whose modification or change time is in or
// after that second (git compares seconds only) have their size smudged
// to 0, as git does for racily clean entries, and are read again; a
// change made in that second with its modification time put back is
// caught too (TestRestoreAdoptsForeignOwnerYetCatchesAChange). It must
// run before anything writes the index in the sandbox: a write there
// leaves the entries as they are (their owner makes git take them for
// changed, so it does not smudge them) and dates the index anew. Before
// this, such an index was refreshed whole, every tracked file read and hashed: the most of a
// restore into a pooled or cold sandbox (at 5,000 files, ~40 MB,
// 400-800 ms on the loaded 2-core machine). smudged are the entries the
// caller refreshes (reads again); ok false: the index is not one this
// reader can rewrite (the caller refreshes it whole).
func adoptOwner(index string, hashLen int, dir string) (smudged map[string]bool, ok bool, err error) {
	st, err := os.Lstat(dir)
	if err != nil {
		return nil, false, err
	}
	sys, isUnix := st.Sys().(*syscall.Stat_t)
	if !isUnix {
		return nil, false, nil
	}
	f, err := os.Open(index)
	if err != nil {
		return nil, false, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, false, err
	}
	ist, err := f.Stat()
	f.Close()
	if err != nil {
		return nil, false, err
	}
	if len(data) < 12+hashLen || string(data[:4]) != "DIRC" {
		return nil, false, nil
	}
	version := binary.BigEndian.Uint32(data[4:8])
	if version != 2 && version != 3 {
		return nil, false, nil
	}
	var sum []byte
	switch hashLen {
	case sha1.Size:
		s := sha1.Sum(data[:len(data)-hashLen])
		sum = s[:]
	case sha256.Size:
		s := sha256.Sum256(data[:len(data)-hashLen])
		sum = s[:]
	default:
		return nil, false, nil
	}
	if !bytes.Equal(sum, data[len(data)-hashLen:]) {
		return nil, false, nil // not the index git wrote: let git judge it
	}
	smudged = map[string]bool{}
	racy := uint32(ist.ModTime().Unix())
	body := data[:len(data)-hashLen]
	n := int(binary.BigEndian.Uint32(data[8:12]))
	fixed := 40 + hashLen + 2
	off := 12
	for range n {
		if off+fixed > len(body) {
			return nil, false, nil
		}
		e := body[off:]
		flags := binary.BigEndian.Uint16(e[40+hashLen:])
		start := fixed
		if flags&0x4000 != 0 {
			if version < 3 {
				return nil, false, nil
			}
			start += 2
		}
		if off+start > len(body) {
			return nil, false, nil
		}
		end := bytes.IndexByte(body[off+start:], 0)
		if end < 0 {
			return nil, false, nil
		}
		// Entries without stat data (as apply --cached leaves them) are
		// read again by git anyway.
		if mtime := binary.BigEndian.Uint32(e[8:12]); mtime != 0 {
			binary.BigEndian.PutUint32(e[28:32], sys.Uid)
			binary.BigEndian.PutUint32(e[32:36], sys.Gid)
			if mtime >= racy || binary.BigEndian.Uint32(e[0:4]) >= racy {
				binary.BigEndian.PutUint32(e[36:40], 0)
				smudged[string(body[off+start:off+start+end])] = true
			}
		}
		off += (start + end + 8) &^ 7
	}
	switch hashLen {
	case sha1.Size:
		s := sha1.Sum(body)
		copy(data[len(body):], s[:])
	default:
		s := sha256.Sum256(body)
		copy(data[len(body):], s[:])
	}
	// As git writes an index: its lock file, renamed into place.
	lock := index + ".lock"
	lf, err := os.OpenFile(lock, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, false, err
	}
	if _, err := lf.Write(data); err != nil {
		lf.Close()
		os.Remove(lock)
		return nil, false, err
	}
	if err := lf.Close(); err != nil {
		os.Remove(lock)
		return nil, false, err
	}
	if err := os.Rename(lock, index); err != nil {
		os.Remove(lock)
		return nil, false, err
	}
	return smudged, true, nil
}

// settleAll is settle for an index this reader does not know, or one
// written under another owner: every tracked file is stat'ed and the whole
// index refreshed.
func settleAll(ctx context.Context, r repo, recent, past time.Time) error {
	list, _, err := r.run(ctx, gitCmd{args: []string{"ls-files", "-z"}})
	if err != nil {
		return err
	}
	for _, name := range splitNUL(list) {
		p := filepath.Join(r.dir, name)
		st, err := os.Lstat(p)
		if err != nil || !st.ModTime().After(recent) {
			continue
		}
		_ = lchtimes(p, past)
	}
	_, _, err = r.run(ctx, gitCmd{args: []string{"update-index", "-q", "--refresh"}, ok: []int{1}})
	return err
}
