package tool

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
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
		return fail(sandboxtool.ExitBaseMissing, "the repository lacks base commit %s", req.Base)
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
func restore(ctx context.Context, req *sandboxtool.RestoreRequest, _ io.Reader, out io.Writer) error {
	r := repo{dir: req.WorkDir}
	st := req.Staging
	defer os.RemoveAll(st)
	began := time.Now()
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
	if len(bytes.TrimSpace(refs)) > 0 {
		// One transaction for every branch.
		var cmds strings.Builder
		for _, l := range strings.Split(strings.TrimSpace(string(refs)), "\n") {
			sha, ref, ok := strings.Cut(l, " ")
			if !ok {
				return fmt.Errorf("staged refs: bad line %q", l)
			}
			fmt.Fprintf(&cmds, "update %s %s\n", ref, sha)
		}
		if _, _, err := r.run(ctx, gitCmd{args: append(append([]string(nil), noReflog...), "update-ref", "--stdin"), stdin: strings.NewReader(cmds.String())}); err != nil {
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
	if _, _, err := r.run(ctx, gitCmd{args: []string{"clean", "-q", "-f", "-d"}}); err != nil {
		return err
	}
	// A diff may hold no patch, only lines like "* Unmerged path x".
	for _, d := range []struct {
		name string
		args []string
	}{{"index.diff", []string{"apply", "--cached", "--binary"}}, {"worktree.diff", []string{"apply", "--binary"}}} {
		p := filepath.Join(st, d.name)
		if hasPatch(p) {
			if _, _, err := r.run(ctx, gitCmd{args: append(d.args, p)}); err != nil {
				return err
			}
		}
	}
	if err := settle(ctx, r, began); err != nil {
		return err
	}
	if req.Untracked {
		f, err := os.Open(filepath.Join(st, "untracked.tar"))
		if err != nil {
			return err
		}
		err = extract(bufio.NewReaderSize(f, 64<<10), req.WorkDir)
		f.Close()
		if errors.Is(err, errUnsafe) {
			return fail(sandboxtool.ExitUnsafePath, "untracked files: %w", err)
		}
		if err != nil {
			return fmt.Errorf("untracked files: %w", err)
		}
		if len(req.IntentToAdd) > 0 {
			args := []string{"add", "-N", "--"}
			for _, p := range req.IntentToAdd {
				args = append(args, string(p))
			}
			if _, _, err := r.run(ctx, gitCmd{args: args, env: []string{"GIT_LITERAL_PATHSPECS=1"}}); err != nil {
				return err
			}
		}
	}
	tree, err := treeHash(ctx, r, req.TrackedOnly)
	if err != nil {
		return err
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
// wrote in that second) are dated two seconds before it began and the index is
// refreshed (each of them read once, against the index): then no entry is
// racy (every other file is older than the second the restore began in,
// and the index is written no earlier), and one of them the diffs changed
// differs from its entry in mtime, whatever its size. Older files are left
// alone: not racy, not read again, so a restore into a sandbox made a few
// seconds ago reads only what it wrote.
func settle(ctx context.Context, r repo, began time.Time) error {
	list, _, err := r.run(ctx, gitCmd{args: []string{"ls-files", "-z"}})
	if err != nil {
		return err
	}
	// Racy against the index written below: written in or after the
	// second the restore began in. Older files are not, whatever the
	// sandbox's own index said of them (the refresh checks those).
	recent := began.Truncate(time.Second).Add(-time.Nanosecond)
	past := began.Add(-2 * time.Second).Truncate(time.Second)
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
