package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"golang.org/x/sync/errgroup"

	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/platform/fault"
)

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
	if req.GetReuseSandbox() {
		if err := e.checkReuse(ctx, req, m); err != nil {
			return nil, "", err
		}
		return m.cp, m.cp.GetTreeHash(), nil
	}
	tree, err := e.restore(ctx, req, m)
	return m.cp, tree, domainErr(id, err)
}

// errCachedDiffers: the sandbox does not hold the checkpoint.
var errCachedDiffers = errors.New("the sandbox differs from the checkpoint")

// checkReuse checks that the sandbox already holds checkpoint m (a cached
// sandbox leased again): a capture of it, storing nothing, must yield
// exactly m's parts — the same HEAD, branches, index, work tree and
// untracked files byte for byte, and the same conversation files — and
// its tree hash m's. A checkpoint with a part left out (over a limit)
// can't be compared, so it is never reused. The sandbox is not written.
func (e *Engine) checkReuse(ctx context.Context, req *checkpointv1.RestoreCheckpointRequest, m *manifest) error {
	cp := m.cp
	differs := func(why string, err error) error {
		return fault.Wrap(fault.KindFailedPrecondition, ReasonCachedDiffers,
			fmt.Sprintf("the sandbox does not hold checkpoint %s (%s): restore it into a fresh sandbox", cp.GetId(), why), err)
	}
	for _, p := range cp.GetParts() {
		if p.GetSkipped() {
			return differs("a part of it was not kept", nil)
		}
	}
	if req.GetBranch() != "" && req.GetBranch() != cp.GetBranch() {
		return differs("another branch was asked for", nil)
	}
	for _, r := range req.GetRelocate() {
		if r.GetFrom() != r.GetTo() {
			return differs("its conversation files move", nil)
		}
	}
	cap := &checkpointv1.CaptureCheckpointRequest{
		SandboxId: req.GetSandboxId(), FencingToken: req.GetFencingToken(), Session: cp.GetSession(),
		Reason: cp.GetReason(), WorkDir: req.GetWorkDir(), Branch: cp.GetBranch(), BaseCommit: cp.GetBaseCommit(),
		Harness: cp.GetHarness(), ConversationId: cp.GetConversationId(), Turn: cp.GetTurn(),
		ConversationPaths: cp.GetConversationPaths(),
	}
	if err := checkCapture(cap); err != nil {
		return differs("it cannot be captured", err)
	}
	defer e.lockSession(cp.GetSession())()
	var err error
	if m.IndexTree != "" && len(m.UntrackedRequest) > 0 {
		err = e.checkReuseByTrees(ctx, cap, m)
	} else {
		_, err = e.capture(ctx, cap, m)
	}
	switch {
	case errors.Is(err, errCachedDiffers):
		return differs("its files, index or refs changed", err)
	case fault.Is(err, fault.KindFailedPrecondition):
		return differs("it is not a repository at the checkpoint's base", err)
	case err != nil:
		return fmt.Errorf("check cached sandbox for %s: %w", cp.GetId(), err)
	}
	return nil
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

	var rp sandboxtool.RestoreProbeResponse
	code, err := e.toolJSON(ctx, sb, toolCall{sandboxtool.CommandRestoreProbe, sandboxtool.RestoreProbeRequest{WorkDir: wd, Base: cp.GetBaseCommit()}},
		&rp, sandboxtool.ExitNotARepo, sandboxtool.ExitBaseMissing)
	switch {
	case err != nil:
		return "", fmt.Errorf("restore probe: %w", err)
	case code == sandboxtool.ExitNotARepo:
		return "", fault.FailedPrecondition(ReasonNotARepo, "work_dir %s is not the top of a git work tree", wd)
	case code == sandboxtool.ExitBaseMissing:
		return "", fault.FailedPrecondition(ReasonBaseMissing, "the sandbox's repository lacks base commit %s", cp.GetBaseCommit())
	}
	var r [6]byte
	rand.Read(r[:])
	// The restore command removes the staging directory when it ends;
	// until it runs, this does.
	st := rp.GitDir + "/hangar-restore-" + hex.EncodeToString(r[:])
	restored := false
	defer func() {
		if restored {
			return
		}
		if _, err := e.tool(context.WithoutCancel(ctx), sb, toolCall{sandboxtool.CommandRemove, sandboxtool.RemoveRequest{Path: st}}, nil, nil); err != nil {
			e.opt.Logger.LogAttrs(ctx, slog.LevelWarn, "restore staging cleanup failed", slog.Any("error", err))
		}
	}()

	// Phase 1: stage and check every part, each on its own exec stream,
	// all at once (each stage is a round trip to the sandbox; none
	// depends on another).
	g, gctx := errgroup.WithContext(ctx)
	stage := func(name string, src io.Reader) error {
		_, err := e.tool(gctx, sb, toolCall{sandboxtool.CommandStage, sandboxtool.StageRequest{Path: st + "/" + name}}, src, nil)
		return err
	}
	// stagePart streams a part through check (which copies what it
	// accepts to its writer) into the staging file.
	stagePart := func(p *checkpointv1.Part, name string, check func(io.Reader, io.Writer) error) error {
		pr := openPart(gctx, e.opt.Store, e.opt.Keys, p.GetObjects(), p.GetSizeBytes(), p.GetSha256())
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
		cerr := <-done
		// A stage that ended early closes the pipe under check: then
		// the stage's own error (its exit, its signal) says why, not
		// the closed pipe.
		if cerr != nil && (err == nil || !errors.Is(cerr, io.ErrClosedPipe)) {
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
	g.Go(func() error { return stage("refs", strings.NewReader(refs.String())) })
	nb := 0
	var untrackedNames []string
	untracked, conversation := false, false
	for _, p := range cp.GetParts() {
		if p.GetSkipped() {
			continue
		}
		switch p.GetKind() {
		case checkpointv1.PartKind_PART_KIND_BUNDLE:
			name := fmt.Sprintf("bundle-%04d", nb)
			g.Go(func() error { return stagePart(p, name, copyAll) })
			nb++
		case checkpointv1.PartKind_PART_KIND_DIFF:
			g.Go(func() error { return stagePart(p, "worktree.diff", checkDiff) })
		case checkpointv1.PartKind_PART_KIND_INDEX:
			g.Go(func() error { return stagePart(p, "index.diff", checkDiff) })
		case checkpointv1.PartKind_PART_KIND_UNTRACKED:
			untracked = true
			g.Go(func() error {
				return stagePart(p, "untracked.tar", func(src io.Reader, dst io.Writer) error {
					names, err := filterTar(src, dst, tarPolicy{})
					untrackedNames = names
					return err
				})
			})
		case checkpointv1.PartKind_PART_KIND_CONVERSATION:
			conversation = true
			roots := cp.GetConversationPaths()
			for _, r := range roots {
				if checkAbs("conversation_paths", r) != nil {
					_ = g.Wait()
					return "", fmt.Errorf("%w: bad conversation path in manifest", errDamaged)
				}
			}
			g.Go(func() error {
				return stagePart(p, "conversation.tar", func(src io.Reader, dst io.Writer) error {
					_, err := filterTar(src, dst, tarPolicy{absolute: true, roots: roots, relocate: req.GetRelocate()})
					return err
				})
			})
		}
	}
	if err := g.Wait(); err != nil {
		return "", err
	}

	// Phase 2: rebuild the work tree. From here a failure leaves it half
	// rebuilt.
	failed := func(err error) error {
		return fault.Wrap(fault.KindFailedPrecondition, "CHECKPOINT_RESTORE_FAILED",
			fmt.Sprintf("restoring checkpoint %s failed part way; the sandbox is in an unknown state and must be destroyed", cp.GetId()), err)
	}
	target := branch
	if rename != "" {
		target = rename
	}
	want := cp.GetTreeHash()
	if untrackedSkipped {
		want = m.TrackedTreeHash
	}
	rreq := sandboxtool.RestoreRequest{WorkDir: wd, Staging: st, Branch: target, Head: cp.GetHeadCommit(),
		Untracked: untracked, TrackedOnly: untrackedSkipped, WantTree: want, Conversation: conversation}
	if untracked && len(m.IntentToAdd) > 0 {
		// Only files the untracked part held, whose names it checked.
		names := map[string]bool{}
		for _, n := range untrackedNames {
			names[n] = true
		}
		for _, p := range m.IntentToAdd {
			if !names[string(p)] {
				return "", failed(fmt.Errorf("%w: intent-to-add %q is not among the untracked files", errDamaged, p))
			}
			rreq.IntentToAdd = append(rreq.IntentToAdd, sandboxtool.Name(p))
		}
	}
	// One command: check out, apply, unpack the untracked files (never
	// through a symbolic link the checkout or the diffs made), hash the
	// tree, and unpack the conversation files only when it is the one
	// captured.
	var rr sandboxtool.RestoreResponse
	restored = true
	code, err = e.toolJSON(ctx, sb, toolCall{sandboxtool.CommandRestore, rreq}, &rr, sandboxtool.ExitUnsafePath)
	switch {
	case err != nil:
		return "", failed(err)
	case code == sandboxtool.ExitUnsafePath:
		return "", failed(fmt.Errorf("%w: an untracked file goes through a symbolic link", errUnsafePath))
	}
	got := rr.Tree
	if got != want {
		return got, fault.Wrap(fault.KindFailedPrecondition, ReasonTreeMismatch,
			fmt.Sprintf("the restored work tree of checkpoint %s differs from the one captured; the sandbox must be destroyed", cp.GetId()),
			fmt.Errorf("tree %s, want %s", got, want))
	}
	return got, nil
}
