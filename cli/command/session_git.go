package command

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// sessionGit runs git in a local checkout for session pull and --from-local.
type sessionGit struct {
	dir string
	// env is added to the process's environment.
	env []string
}

// run runs git with args, stdin as its input, and returns its trimmed
// output; a failure is one line: the command and git's last words.
func (g sessionGit) run(ctx context.Context, stdin []byte, args ...string) (string, error) {
	out, err := g.output(ctx, stdin, args...)
	return strings.TrimSpace(string(out)), err
}

func (g sessionGit) output(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = g.dir
	if len(g.env) > 0 {
		cmd.Env = append(os.Environ(), g.env...)
	}
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		why := sessionLastLine(stderr.String())
		if why == "" {
			why = err.Error()
		}
		return out, fmt.Errorf("git %s: %s", args[0], why)
	}
	return out, nil
}

// with returns g with more environment.
func (g sessionGit) with(env ...string) sessionGit {
	return sessionGit{dir: g.dir, env: append(append([]string(nil), g.env...), env...)}
}

func sessionLastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// ok says whether git succeeds (for questions such as "does this ref exist").
func (g sessionGit) ok(ctx context.Context, args ...string) bool {
	_, err := g.output(ctx, nil, args...)
	return err == nil
}

// clean refuses a work tree with uncommitted changes to tracked files.
func (g sessionGit) clean(ctx context.Context) error {
	st, err := g.run(ctx, nil, "status", "--porcelain", "--untracked-files=no")
	if err != nil {
		return err
	}
	if st != "" {
		return errors.New("this checkout has uncommitted changes: commit or stash them, then pull with --checkout again")
	}
	return nil
}

func sessionPullCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var (
		checkout bool
		dir      string
	)
	cmd := &cobra.Command{
		Use:   "pull NAME",
		Short: "The session's commits onto local branch hangar/NAME, plus (with --checkout) its uncommitted changes",
		Args:  sessionArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			g := sessionGit{dir: dir}
			if _, err := g.run(ctx, nil, "rev-parse", "--show-toplevel"); err != nil {
				return fmt.Errorf("%s is not a git checkout: run pull in the repository to pull into, or pass -C DIR", sessionDirLabel(dir))
			}
			name := args[0]
			branch := "hangar/" + name
			if !g.ok(ctx, "check-ref-format", "refs/heads/"+branch) {
				return fmt.Errorf("hangar/%s is not a valid branch name", name)
			}
			return sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, _ []string) error {
				work, err := c.GetSessionWork(ctx, &sessionv1.GetSessionWorkRequest{Name: name, AcceptBundleChain: true})
				if status.Code(err) == codes.Unimplemented {
					return sessionPullFromPatch(ctx, c, g, streams.Out, name, branch, checkout)
				}
				if err != nil {
					return sessionCallErr(err)
				}
				if work.GetHeadCommit() == "" && work.GetBaseCommit() == "" {
					return fmt.Errorf("session %s has no work to pull yet: it has not run", name)
				}
				// A session knows its base from creation on: one that never
				// booted has nothing to pull either.
				if work.GetHeadCommit() == work.GetBaseCommit() && len(work.GetDiff()) == 0 && len(work.GetGitBundle()) == 0 && len(work.GetGitBundles()) == 0 {
					if got, err := c.GetSession(ctx, &sessionv1.GetSessionRequest{Name: name}); err == nil &&
						got.GetSession().GetSandboxId() == "" && len(got.GetSession().GetCheckpoints()) == 0 {
						return fmt.Errorf("session %s has no work to pull yet: it has not run", name)
					}
				}
				return sessionPullFromWork(ctx, g, streams.Out, work, branch, checkout)
			})(cmd, args)
		},
	}
	cmd.Flags().BoolVar(&checkout, "checkout", false, "switch to hangar/NAME and apply the session's uncommitted changes there")
	cmd.Flags().StringVarP(&dir, "dir", "C", "", "the checkout to pull into (default the current directory)")
	return cmd
}

func sessionDirLabel(dir string) string {
	if dir == "" {
		return "the current directory"
	}
	return dir
}

// sessionPullFromWork fetches the session's commits from its git bundles
// into branch; with checkout it switches there and applies the uncommitted
// changes.
func sessionPullFromWork(ctx context.Context, g sessionGit, out io.Writer, work *sessionv1.GetSessionWorkResponse, branch string, checkout bool) error {
	if checkout {
		if err := g.clean(ctx); err != nil {
			return err
		}
	}
	tip := work.GetHeadCommit()
	bundles := work.GetGitBundles()
	if len(bundles) == 0 && len(work.GetGitBundle()) > 0 {
		bundles = [][]byte{work.GetGitBundle()}
	}
	if tip == "" {
		tip = work.GetBaseCommit()
	}
	// A second pull (say pull, then pull --checkout) finds the branch the
	// first one made: at the session's tip it is used as it is.
	existing, _ := g.run(ctx, nil, "rev-parse", "--verify", "--quiet", "refs/heads/"+branch)
	switch {
	case existing != "" && existing == tip:
		fmt.Fprintf(out, "branch %s is already at the session's %s\n", branch, sessionShortCommit(tip))
	case existing != "" && len(bundles) == 0:
		return fmt.Errorf("branch %s exists at %s, not at the session's %s: delete it (git branch -D %s) and pull again", branch, sessionShortCommit(existing), sessionShortCommit(tip), branch)
	case len(bundles) == 1:
		if err := sessionFetchBundle(ctx, g, bundles[0], work.GetBranch(), branch); err != nil {
			return err
		}
		fmt.Fprintf(out, "fetched the session's commits (%s) into branch %s\n", work.GetBranch(), branch)
	case len(bundles) > 1:
		if err := sessionFetchChain(ctx, g, bundles, work, branch); err != nil {
			return err
		}
		fmt.Fprintf(out, "fetched the session's commits (%s, a chain of %d bundles) into branch %s\n", work.GetBranch(), len(bundles), branch)
	default:
		if _, err := g.run(ctx, nil, "branch", branch, tip); err != nil {
			return err
		}
		fmt.Fprintf(out, "created branch %s at %s: the session has no commits of its own\n", branch, sessionShortCommit(tip))
	}
	if !checkout {
		if len(work.GetDiff()) > 0 {
			fmt.Fprintf(out, "its uncommitted changes (%s) were left out: pull with --checkout to apply them\n", sessionSizeLabel(int64(len(work.GetDiff()))))
		}
		return nil
	}
	if _, err := g.run(ctx, nil, "checkout", "--quiet", branch); err != nil {
		return err
	}
	fmt.Fprintf(out, "switched to %s\n", branch)
	if len(work.GetDiff()) > 0 {
		if _, err := g.run(ctx, work.GetDiff(), "apply", "-"); err != nil {
			return fmt.Errorf("the session's uncommitted changes did not apply on %s: %w", branch, err)
		}
		fmt.Fprintln(out, "applied its uncommitted changes to the work tree (not committed)")
	}
	return nil
}

// sessionFetchBundle fetches one bundle's session branch (sessionBranch, or
// else its first head) into branch.
func sessionFetchBundle(ctx context.Context, g sessionGit, data []byte, sessionBranch, branch string) error {
	tmp, err := os.MkdirTemp("", "hangar-pull-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bundle := filepath.Join(tmp, "session.bundle")
	if err := os.WriteFile(bundle, data, 0o600); err != nil {
		return err
	}
	heads, err := sessionBundleHeads(ctx, g, bundle)
	if err != nil {
		return err
	}
	ref := ""
	for _, h := range heads {
		if ref == "" || h.ref == "refs/heads/"+sessionBranch {
			ref = h.ref
		}
	}
	if ref == "" {
		return errors.New("the session's git bundle has no branch in it")
	}
	_, err = g.run(ctx, nil, "fetch", "--no-tags", bundle, ref+":refs/heads/"+branch)
	return err
}

type sessionBundleHead struct{ commit, ref string }

// sessionBundleHeads lists a bundle file's refs.
func sessionBundleHeads(ctx context.Context, g sessionGit, bundle string) ([]sessionBundleHead, error) {
	out, err := g.run(ctx, nil, "bundle", "list-heads", bundle)
	if err != nil {
		return nil, err
	}
	var heads []sessionBundleHead
	for _, line := range strings.Split(out, "\n") {
		if c, r, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			heads = append(heads, sessionBundleHead{c, r})
		}
	}
	return heads, nil
}

// sessionFetchChain fetches a chain of bundles (a suspended session's
// checkpoints: the first needs the base commit, each later one the bundles
// before it) in order, every head into a temporary ref so the next
// bundle's prerequisites are there, then the session's branch into branch.
// The branch's tip is the newest head of the session's branch, else the
// head at head_commit, else the newest bundle's first head. The temporary
// refs are removed.
func sessionFetchChain(ctx context.Context, g sessionGit, bundles [][]byte, work *sessionv1.GetSessionWorkResponse, branch string) error {
	if base := work.GetBaseCommit(); base != "" && !g.ok(ctx, "cat-file", "-e", base+"^{commit}") {
		return fmt.Errorf("the session's base commit %s is not in this repository: fetch it (git fetch), then pull again", sessionShortCommit(base))
	}
	tmp, err := os.MkdirTemp("", "hangar-pull-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var nonce [6]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return err
	}
	ns := "refs/hangar-pull/" + hex.EncodeToString(nonce[:])
	defer func() {
		refs, err := g.run(context.WithoutCancel(ctx), nil, "for-each-ref", "--format=delete %(refname)", ns+"/")
		if err == nil && refs != "" {
			_, _ = g.run(context.WithoutCancel(ctx), []byte(refs+"\n"), "update-ref", "--stdin")
		}
	}()
	type fetched struct{ commit, ref, local string }
	var all [][]fetched
	for i, data := range bundles {
		bundle := filepath.Join(tmp, fmt.Sprintf("session-%d.bundle", i))
		if err := os.WriteFile(bundle, data, 0o600); err != nil {
			return err
		}
		heads, err := sessionBundleHeads(ctx, g, bundle)
		if err != nil {
			return fmt.Errorf("bundle %d of %d: %w", i+1, len(bundles), err)
		}
		args := []string{"fetch", "--no-tags", "--quiet", bundle}
		var got []fetched
		for j, h := range heads {
			f := fetched{h.commit, h.ref, fmt.Sprintf("%s/%d/%d", ns, i, j)}
			args = append(args, "+"+f.ref+":"+f.local)
			got = append(got, f)
		}
		if len(got) == 0 {
			return fmt.Errorf("bundle %d of %d of the session's commits has no head", i+1, len(bundles))
		}
		if _, err := g.run(ctx, nil, args...); err != nil {
			return fmt.Errorf("bundle %d of %d: %w", i+1, len(bundles), err)
		}
		all = append(all, got)
	}
	pick := func(match func(fetched) bool) string {
		for i := len(all) - 1; i >= 0; i-- {
			for _, f := range all[i] {
				if match(f) {
					return f.local
				}
			}
		}
		return ""
	}
	local := ""
	if b := work.GetBranch(); b != "" {
		local = pick(func(f fetched) bool { return f.ref == "refs/heads/"+b })
	}
	if h := work.GetHeadCommit(); local == "" && h != "" {
		local = pick(func(f fetched) bool { return f.commit == h })
	}
	if local == "" {
		local = all[len(all)-1][0].local
	}
	_, err = g.run(ctx, nil, "fetch", "--no-tags", ".", local+":refs/heads/"+branch)
	return err
}

// sessionPullFromPatch is pull for a server without GetSessionWork: the session's
// patch, made against its base commit, becomes branch. Without checkout the
// branch gets the whole patch as one commit and the work tree is not
// touched; with checkout the branch starts at the base and the patch is
// applied to the index and work tree (git apply --index), uncommitted.
func sessionPullFromPatch(ctx context.Context, c sessionv1.SessionServiceClient, g sessionGit, out io.Writer, name, branch string, checkout bool) error {
	resp, err := c.GetSessionPatch(ctx, &sessionv1.GetSessionPatchRequest{Name: name})
	if err != nil {
		return sessionCallErr(err)
	}
	base, patch := resp.GetBaseCommit(), []byte(resp.GetPatch())
	if base == "" && len(patch) == 0 {
		return fmt.Errorf("session %s has no work to pull yet: it has not run", name)
	}
	if base == "" {
		return fmt.Errorf("the server gave no base commit for the patch of %s", name)
	}
	if !g.ok(ctx, "cat-file", "-e", base+"^{commit}") {
		return fmt.Errorf("the session's base commit %s is not in this repository: fetch it (git fetch), then pull again", sessionShortCommit(base))
	}
	if g.ok(ctx, "rev-parse", "--verify", "--quiet", "refs/heads/"+branch) {
		return fmt.Errorf("branch %s already exists: delete it (git branch -D %s) or rename it, then pull again", branch, branch)
	}
	if checkout {
		if err := g.clean(ctx); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, "this hangar does not serve a session's commits yet (GetSessionWork): pulling from its patch against the base instead")
	if checkout {
		if _, err := g.run(ctx, nil, "checkout", "--quiet", "-b", branch, base); err != nil {
			return err
		}
		if len(patch) == 0 {
			fmt.Fprintf(out, "switched to new branch %s at the session's base %s: the session has no changes\n", branch, sessionShortCommit(base))
			return nil
		}
		if _, err := g.run(ctx, patch, "apply", "--index", "-"); err != nil {
			return fmt.Errorf("switched to new branch %s at %s, but the session's patch did not apply: %w", branch, sessionShortCommit(base), err)
		}
		fmt.Fprintf(out, "switched to new branch %s at the session's base %s and applied its changes to the index and work tree (git apply --index), uncommitted\n", branch, sessionShortCommit(base))
		return nil
	}
	if len(patch) == 0 {
		if _, err := g.run(ctx, nil, "branch", branch, base); err != nil {
			return err
		}
		fmt.Fprintf(out, "created branch %s at the session's base %s: the session has no changes\n", branch, sessionShortCommit(base))
		return nil
	}
	tmp, err := os.MkdirTemp("", "hangar-pull-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	gi := g.with("GIT_INDEX_FILE=" + filepath.Join(tmp, "index"))
	if _, err := gi.run(ctx, nil, "read-tree", base); err != nil {
		return err
	}
	if _, err := gi.run(ctx, patch, "apply", "--cached", "-"); err != nil {
		return fmt.Errorf("the session's patch does not apply to its base %s: %w", sessionShortCommit(base), err)
	}
	tree, err := gi.run(ctx, nil, "write-tree")
	if err != nil {
		return err
	}
	msg := fmt.Sprintf("hangar session %s\n\nThe work of session %s as one commit on its base %s (hangar session pull).\n", name, name, base)
	commit, err := g.run(ctx, []byte(msg), "commit-tree", tree, "-p", base, "-F", "-")
	if err != nil {
		return err
	}
	if _, err := g.run(ctx, nil, "branch", branch, commit); err != nil {
		return err
	}
	fmt.Fprintf(out, "created branch %s: the session's work as one commit %s on its base %s; your work tree is untouched (git switch %s)\n", branch, sessionShortCommit(commit), sessionShortCommit(base), branch)
	return nil
}

// sessionLocalWork is --from-local: the checkout's commits that no remote has (a
// bundle from the newest commit a remote has), its uncommitted changes
// (a binary diff against HEAD) and its untracked files that .gitignore does
// not exclude (a tarball).
func sessionLocalWork(ctx context.Context, dir string) (*sessionv1.LocalWork, error) {
	g := sessionGit{dir: dir}
	if _, err := g.run(ctx, nil, "rev-parse", "--show-toplevel"); err != nil {
		return nil, fmt.Errorf("--from-local: %s is not a git checkout", sessionDirLabel(dir))
	}
	if remotes, err := g.run(ctx, nil, "remote"); err != nil || remotes == "" {
		return nil, errors.New("--from-local: this checkout has no remote, so hangar cannot tell which commits are unpushed")
	}
	head, err := g.run(ctx, nil, "rev-parse", "HEAD")
	if err != nil {
		return nil, fmt.Errorf("--from-local: this checkout has no commit yet")
	}
	lw := &sessionv1.LocalWork{BaseCommit: head}
	if b, err := g.run(ctx, nil, "symbolic-ref", "--quiet", "--short", "HEAD"); err == nil {
		lw.Branch = b
	}
	unpushed, err := g.run(ctx, nil, "rev-list", "--reverse", "--topo-order", "HEAD", "--not", "--remotes")
	if err != nil {
		return nil, err
	}
	if unpushed != "" {
		oldest := strings.SplitN(unpushed, "\n", 2)[0]
		base, err := g.run(ctx, nil, "rev-parse", "--verify", "--quiet", oldest+"^")
		if err != nil || base == "" {
			return nil, errors.New("--from-local: no commit of this checkout is on a remote: push its base first")
		}
		lw.BaseCommit = base
		tmp, err := os.MkdirTemp("", "hangar-local-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		bundle := filepath.Join(tmp, "local.bundle")
		if _, err := g.run(ctx, nil, "bundle", "create", bundle, base+"..HEAD"); err != nil {
			return nil, err
		}
		if lw.GitBundle, err = os.ReadFile(bundle); err != nil {
			return nil, err
		}
	}
	if lw.Diff, err = g.output(ctx, nil, "diff", "--binary", "HEAD"); err != nil {
		return nil, err
	}
	if lw.UntrackedTar, err = sessionUntrackedTar(ctx, g); err != nil {
		return nil, err
	}
	return lw, nil
}

// sessionUntrackedTar packs the untracked files .gitignore does not exclude; nil
// when there are none.
func sessionUntrackedTar(ctx context.Context, g sessionGit) ([]byte, error) {
	top, err := g.run(ctx, nil, "rev-parse", "--show-toplevel")
	if err != nil {
		return nil, err
	}
	list, err := g.output(ctx, nil, "-C", top, "ls-files", "--others", "--exclude-standard", "-z")
	if err != nil {
		return nil, err
	}
	names := strings.Split(strings.TrimRight(string(list), "\x00"), "\x00")
	if len(names) == 1 && names[0] == "" {
		return nil, nil
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range names {
		p := filepath.Join(top, name)
		info, err := os.Lstat(p)
		if err != nil {
			return nil, fmt.Errorf("--from-local: %s: %w", name, sessionUnwrapPathErr(err))
		}
		link := ""
		if info.Mode()&os.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return nil, err
			}
		} else if !info.Mode().IsRegular() {
			continue
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return nil, err
		}
		hdr.Name = filepath.ToSlash(name)
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return nil, err
			}
			if _, err := tw.Write(b); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
