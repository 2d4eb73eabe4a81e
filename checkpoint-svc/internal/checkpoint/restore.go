package checkpoint

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"path"
	"slices"
	"strings"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/platform/fault"
)

const restoreProbeScript = `cd "$1" && [ "$(git rev-parse --is-inside-work-tree 2>/dev/null)" = true ] || exit 10
[ "$(git rev-parse --show-prefix)" = "" ] || exit 10
git cat-file -e "$2^{commit}" 2>/dev/null || exit 11
git rev-parse --absolute-git-dir
`

// Restore rebuilds a checkpoint in a fresh sandbox whose work_dir is a
// clone holding the checkpoint's base commit.
//
// It runs in two phases. First every part is fetched, authenticated,
// checked against the manifest's size and hash, its paths checked, and
// staged as a file in the sandbox's .git directory: a damaged checkpoint,
// a wrong key or an unsafe path fails here with the work tree untouched.
// Then the work tree is rebuilt from the staged files and its tree hash
// compared with the manifest's; conversation files are put in place only
// after that. If the second phase fails the work tree is half rebuilt:
// the error says so and the caller must destroy the sandbox (never hand
// it to an agent).
func (e *Engine) Restore(ctx context.Context, req *checkpointv1.RestoreCheckpointRequest) (*checkpointv1.Checkpoint, string, error) {
	if req.GetSandboxId() == "" {
		return nil, "", fault.InvalidArgument("sandbox_id", "sandbox_id is required")
	}
	if err := checkAbs("work_dir", req.GetWorkDir()); err != nil {
		return nil, "", err
	}
	if b := req.GetBranch(); b != "" {
		if err := checkBranch("branch", b); err != nil {
			return nil, "", err
		}
	}
	for _, r := range req.GetRelocate() {
		if err := checkAbs("relocate.from", r.GetFrom()); err != nil {
			return nil, "", err
		}
		if err := checkAbs("relocate.to", r.GetTo()); err != nil {
			return nil, "", err
		}
	}
	id := req.GetCheckpointId()
	m, err := e.readManifest(ctx, id)
	if err != nil {
		return nil, "", e.notRestorable(ctx, id, err)
	}
	for _, r := range req.GetRelocate() {
		if !slices.Contains(m.cp.GetConversationPaths(), r.GetFrom()) {
			return nil, "", fault.InvalidArgument("relocate.from", "relocate.from %q is not one of the checkpoint's conversation paths", r.GetFrom())
		}
	}
	tree, err := e.restore(ctx, req, m)
	return m.cp, tree, domainErr(id, err)
}

func (e *Engine) restore(ctx context.Context, req *checkpointv1.RestoreCheckpointRequest, m *manifest) (string, error) {
	cp := m.cp
	sb := sandbox{req.GetSandboxId(), req.GetFencingToken()}
	wd := req.GetWorkDir()
	untrackedSkipped := false
	for _, p := range cp.GetParts() {
		switch {
		case !p.GetSkipped():
		case p.GetKind() == checkpointv1.PartKind_PART_KIND_UNTRACKED:
			untrackedSkipped = true
		case p.GetKind() != checkpointv1.PartKind_PART_KIND_CONVERSATION && p.GetKind() != checkpointv1.PartKind_PART_KIND_PATCH:
			return "", fault.FailedPrecondition(ReasonIncomplete,
				"checkpoint %s cannot be restored: its %s part was over the size limit and not kept", cp.GetId(), partName(p.GetKind()))
		}
	}

	var out bytes.Buffer
	code, err := e.run(ctx, sb, shArgv(restoreProbeScript, wd, cp.GetBaseCommit()), gitEnv, nil, &out, 10, 11)
	switch {
	case err != nil:
		return "", fmt.Errorf("restore probe: %w", err)
	case code == 10:
		return "", fault.FailedPrecondition(ReasonNotARepo, "work_dir %s is not the top of a git work tree", wd)
	case code == 11:
		return "", fault.FailedPrecondition(ReasonBaseMissing, "the sandbox's repository lacks base commit %s", cp.GetBaseCommit())
	}
	gitdir := strings.TrimSpace(out.String())
	var r [6]byte
	rand.Read(r[:])
	st := gitdir + "/hangar-restore-" + hex.EncodeToString(r[:])
	if _, err := e.run(ctx, sb, []string{"mkdir", "-m", "0700", st}, nil, nil, nil); err != nil {
		return "", fmt.Errorf("restore: staging dir: %w", err)
	}
	defer func() {
		if _, err := e.run(context.WithoutCancel(ctx), sb, []string{"rm", "-rf", st}, nil, nil, nil); err != nil {
			e.opt.Logger.LogAttrs(ctx, slog.LevelWarn, "restore staging cleanup failed", slog.Any("error", err))
		}
	}()

	// Phase 1: stage and check every part.
	stage := func(name string, src io.Reader) error {
		_, err := e.run(ctx, sb, shArgv(stageScript, st+"/"+name), nil, src, nil)
		return err
	}
	// stagePart streams a part through check (which copies what it
	// accepts to its writer) into the staging file.
	stagePart := func(p *checkpointv1.Part, name string, check func(io.Reader, io.Writer) error) error {
		pr := openPart(ctx, e.opt.Store, e.opt.Keys, p.GetObjects(), p.GetSizeBytes(), p.GetSha256())
		defer pr.Close()
		r, w := io.Pipe()
		done := make(chan error, 1)
		go func() {
			err := check(pr, w)
			if err == nil {
				// Drain to the end so the size and hash are checked.
				_, err = io.Copy(io.Discard, pr)
			}
			w.CloseWithError(err)
			done <- err
		}()
		err := stage(name, r)
		r.CloseWithError(io.ErrClosedPipe)
		if cerr := <-done; cerr != nil {
			return cerr
		}
		return err
	}
	copyAll := func(src io.Reader, dst io.Writer) error { _, err := io.Copy(dst, src); return err }

	branch := cp.GetBranch()
	rename := req.GetBranch()
	var refs strings.Builder
	for _, r := range m.Refs {
		name := r.Name
		if rename != "" && branch != "" && name == branch {
			continue // the renamed branch is made by checkout
		}
		if !commitRE.MatchString(r.Commit) || checkBranch("ref", name) != nil {
			return "", fmt.Errorf("%w: bad ref in manifest", errDamaged)
		}
		fmt.Fprintf(&refs, "%s refs/heads/%s\n", r.Commit, name)
	}
	if err := stage("refs", strings.NewReader(refs.String())); err != nil {
		return "", err
	}
	nb := 0
	var untrackedNames []string
	untracked, conversation := false, false
	for _, p := range cp.GetParts() {
		if p.GetSkipped() {
			continue
		}
		var err error
		switch p.GetKind() {
		case checkpointv1.PartKind_PART_KIND_BUNDLE:
			err = stagePart(p, fmt.Sprintf("bundle-%04d", nb), copyAll)
			nb++
		case checkpointv1.PartKind_PART_KIND_DIFF:
			err = stagePart(p, "worktree.diff", checkDiff)
		case checkpointv1.PartKind_PART_KIND_INDEX:
			err = stagePart(p, "index.diff", checkDiff)
		case checkpointv1.PartKind_PART_KIND_UNTRACKED:
			untracked = true
			err = stagePart(p, "untracked.tar", func(src io.Reader, dst io.Writer) error {
				names, err := filterTar(src, dst, tarPolicy{})
				untrackedNames = names
				return err
			})
		case checkpointv1.PartKind_PART_KIND_CONVERSATION:
			conversation = true
			roots := cp.GetConversationPaths()
			for _, r := range roots {
				if checkAbs("conversation_paths", r) != nil {
					return "", fmt.Errorf("%w: bad conversation path in manifest", errDamaged)
				}
			}
			err = stagePart(p, "conversation.tar", func(src io.Reader, dst io.Writer) error {
				_, err := filterTar(src, dst, tarPolicy{absolute: true, roots: roots, relocate: req.GetRelocate()})
				return err
			})
		}
		if err != nil {
			return "", err
		}
	}

	// Phase 2: rebuild the work tree. From here a failure leaves it half
	// rebuilt.
	failed := func(err error) error {
		return fault.Wrap(fault.KindFailedPrecondition, "CHECKPOINT_RESTORE_FAILED",
			fmt.Sprintf("restoring checkpoint %s failed part way; the sandbox is in an unknown state and must be destroyed", cp.GetId()), err)
	}
	target, head := branch, cp.GetHeadCommit()
	if rename != "" {
		target = rename
	}
	if target == "" {
		target = "-"
	}
	if _, err := e.run(ctx, sb, shArgv(restoreScript, wd, st, target, head), gitEnv, nil, nil); err != nil {
		return "", failed(err)
	}
	if untracked {
		// Nothing may be written through a symbolic link the checkout or
		// the diffs made.
		var links bytes.Buffer
		if _, err := e.run(ctx, sb, shArgv(symlinkScript, wd), nil, nil, &links); err != nil {
			return "", failed(err)
		}
		set := map[string]bool{}
		for _, l := range bytes.Split(links.Bytes(), []byte{0}) {
			if len(l) > 0 {
				set[path.Clean(string(l))] = true
			}
		}
		for _, n := range untrackedNames {
			for p := n; p != "." && p != "/"; p = path.Dir(p) {
				if set[p] {
					return "", failed(fmt.Errorf("%w: untracked %q goes through the symbolic link %q", errUnsafePath, n, p))
				}
			}
		}
		if _, err := e.run(ctx, sb, shArgv(untarScript, wd, st+"/untracked.tar"), nil, nil, nil); err != nil {
			return "", failed(err)
		}
		if len(m.IntentToAdd) > 0 {
			// Only files the untracked part held, whose names it checked.
			names := map[string]bool{}
			for _, n := range untrackedNames {
				names[n] = true
			}
			var list bytes.Buffer
			for _, p := range m.IntentToAdd {
				if !names[string(p)] {
					return "", failed(fmt.Errorf("%w: intent-to-add %q is not among the untracked files", errDamaged, p))
				}
				list.Write(p)
				list.WriteByte(0)
			}
			if _, err := e.run(ctx, sb, shArgv(intentToAddScript, wd), literalEnv, &list, nil); err != nil {
				return "", failed(err)
			}
		}
	}
	var tout bytes.Buffer
	if _, err := e.run(ctx, sb, shArgv(treeScript, wd, "-A"), gitEnv, nil, &tout); err != nil {
		return "", failed(err)
	}
	got, want := strings.TrimSpace(tout.String()), cp.GetTreeHash()
	if untrackedSkipped {
		want = m.TrackedTreeHash
	}
	if got != want {
		return got, fault.Wrap(fault.KindFailedPrecondition, ReasonTreeMismatch,
			fmt.Sprintf("the restored work tree of checkpoint %s differs from the one captured; the sandbox must be destroyed", cp.GetId()),
			fmt.Errorf("tree %s, want %s", got, want))
	}
	if conversation {
		if _, err := e.run(ctx, sb, []string{"tar", "-x", "-p", "--no-same-owner", "-P", "-f", st + "/conversation.tar"}, nil, nil, nil); err != nil {
			return got, failed(err)
		}
	}
	return got, nil
}
