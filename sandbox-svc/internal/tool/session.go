package tool

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/hangar-dev/hangar/api/sandboxtool"
)

// initWork gives the work tree a committer identity unless it has one (a
// restored work tree has lost the one its first boot set) and checks out
// the branch.
func initWork(ctx context.Context, req *sandboxtool.InitWorkRequest, _ io.Reader, _ io.Writer) error {
	r := repo{dir: req.WorkDir}
	for _, kv := range [][2]string{{"user.name", "hangar"}, {"user.email", "hangar@localhost"}} {
		if _, code, err := r.run(ctx, gitCmd{args: []string{"config", kv[0]}, ok: []int{1}}); err != nil {
			return err
		} else if code == 1 {
			if _, err := r.git(ctx, "config", kv[0], kv[1]); err != nil {
				return err
			}
		}
	}
	if req.Branch != "" {
		args := []string{"checkout", "-q", "-B", req.Branch}
		if req.Base != "" {
			// A sandbox cloned earlier (a warm pool) or later (the
			// repository moved on) may not have the base: fetch it.
			if _, code, err := r.run(ctx, gitCmd{args: []string{"cat-file", "-e", req.Base + "^{commit}"}, ok: []int{1, 128}}); err != nil {
				return err
			} else if code != 0 {
				if _, err := r.git(ctx, "fetch", "-q", "origin", req.Base); err != nil {
					return err
				}
			}
			args = append(args, req.Base)
		}
		if _, err := r.git(ctx, args...); err != nil {
			return err
		}
	}
	return nil
}

func head(ctx context.Context, req *sandboxtool.HeadRequest, _ io.Reader, out io.Writer) error {
	r := repo{dir: req.WorkDir}
	h, err := r.git(ctx, "rev-parse", "HEAD")
	if err != nil {
		return err
	}
	b, _, err := r.run(ctx, gitCmd{args: []string{"symbolic-ref", "--quiet", "--short", "HEAD"}, ok: []int{1}})
	if err != nil {
		return err
	}
	return writeJSON(out, sandboxtool.HeadResponse{Head: h, Branch: strings.TrimSpace(string(b))})
}

// workBundle writes a bundle of the commits of Rev the base does not reach,
// or nothing when there are none.
func workBundle(ctx context.Context, req *sandboxtool.WorkBundleRequest, _ io.Reader, out io.Writer) error {
	if strings.HasPrefix(req.Rev, "-") || strings.HasPrefix(req.Base, "-") {
		return fail(sandboxtool.ExitUsage, "work-bundle: bad revision")
	}
	r := repo{dir: req.WorkDir}
	args := []string{req.Rev}
	types, err := r.objectTypes(ctx, req.Base+"^{commit}")
	if err != nil {
		return err
	}
	if types[0][1] == "commit" {
		args = append(args, "^"+types[0][0])
	}
	first, err := r.git(ctx, append([]string{"rev-list", "-n", "1"}, args...)...)
	if err != nil || first == "" {
		return err
	}
	_, _, err = r.run(ctx, gitCmd{args: append([]string{"bundle", "create", "-q", "-"}, args...), stdout: out})
	return err
}

// workDiff writes the work tree against a commit as `git add -A` into a
// copy of the index sees it.
func workDiff(ctx context.Context, req *sandboxtool.WorkDiffRequest, _ io.Reader, out io.Writer) error {
	if strings.HasPrefix(req.Against, "-") {
		return fail(sandboxtool.ExitUsage, "work-diff: bad revision %q", req.Against)
	}
	r := repo{dir: req.WorkDir}
	loc, err := r.locate(ctx)
	if err != nil {
		return err
	}
	tmp := filepath.Join(loc.gitDir, "hangar-work-index."+nonce())
	defer os.Remove(tmp)
	if err := linkOrCopy(loc.index, tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("copy the index: %w", err)
	}
	env := []string{"GIT_INDEX_FILE=" + tmp}
	if _, _, err := r.run(ctx, gitCmd{args: []string{"add", "-A"}, env: env}); err != nil {
		return err
	}
	_, _, err = r.run(ctx, gitCmd{args: []string{"diff", "--cached", "--binary", req.Against}, env: env, stdout: out})
	return err
}

// copyPrepare renames the branch (no reflog: a restore leaves none for
// it), moves the paths and, when asked, hashes the work tree.
func copyPrepare(ctx context.Context, req *sandboxtool.CopyPrepareRequest, _ io.Reader, out io.Writer) error {
	r := repo{dir: req.WorkDir}
	if _, err := r.git(ctx, append(append([]string(nil), noReflog...), "branch", "-m", req.FromBranch, req.ToBranch)...); err != nil {
		return err
	}
	for _, m := range req.Moves {
		if !filepath.IsAbs(m.From) || !filepath.IsAbs(m.To) {
			return fail(sandboxtool.ExitUsage, "copy-prepare: moves take absolute paths")
		}
		if _, err := os.Lstat(m.From); err != nil {
			continue // the restore did not make it
		}
		if _, err := os.Lstat(m.To); err == nil {
			return fmt.Errorf("%s exists", m.To)
		}
		if err := os.MkdirAll(filepath.Dir(m.To), 0o755); err != nil {
			return err
		}
		if err := os.Rename(m.From, m.To); err != nil {
			return err
		}
	}
	var res sandboxtool.CopyPrepareResponse
	if req.Verify {
		tree, err := treeHash(ctx, r, false)
		if err != nil {
			return err
		}
		res.Tree = tree
	}
	return writeJSON(out, res)
}

// fromLocal applies a local checkout's work: the branch moves to the local
// HEAD (the bundle's tip, or the base when nothing is unpushed); the diff
// goes to the index and work tree (the CLI sends staged and unstaged
// changes as one diff, so all of it ends up staged, new files tracked);
// the untracked files are unpacked as they were.
func fromLocal(ctx context.Context, req *sandboxtool.FromLocalRequest, _ io.Reader, _ io.Writer) error {
	r := repo{dir: req.WorkDir}
	types, err := r.objectTypes(ctx, req.Base+"^{commit}")
	if err != nil {
		return err
	}
	if types[0][1] != "commit" {
		return fail(sandboxtool.ExitBaseMissing, "base commit %s is not in the environment's repository", req.Base)
	}
	tip := types[0][0]
	if bundle := filepath.Join(req.Dir, "bundle"); nonEmpty(bundle) {
		if _, err := r.git(ctx, "fetch", "-q", "--no-tags", bundle); err != nil {
			return err
		}
		heads, err := r.git(ctx, "bundle", "list-heads", bundle)
		if err != nil {
			return err
		}
		first, _, _ := strings.Cut(heads, "\n")
		if f := strings.Fields(first); len(f) > 0 {
			tip = f[0]
		}
	}
	if _, err := r.git(ctx, "checkout", "-q", "-B", req.Branch, tip); err != nil {
		return err
	}
	if diff := filepath.Join(req.Dir, "diff"); nonEmpty(diff) {
		if _, err := r.git(ctx, "apply", "--index", "--binary", diff); err != nil {
			return err
		}
	}
	if tarball := filepath.Join(req.Dir, "untracked.tar"); nonEmpty(tarball) {
		f, err := os.Open(tarball)
		if err != nil {
			return err
		}
		err = extract(bufio.NewReaderSize(f, 64<<10), req.WorkDir)
		f.Close()
		if err != nil {
			return fmt.Errorf("untracked files: %w", err)
		}
	}
	return os.RemoveAll(req.Dir)
}

func nonEmpty(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Size() > 0
}
