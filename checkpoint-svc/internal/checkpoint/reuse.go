package checkpoint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"slices"

	"golang.org/x/sync/errgroup"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/platform/fault"
)

// maxRecordedUntracked bounds the untracked part's request a manifest
// keeps for checkReuseByTrees (past it, a reuse check is a whole capture).
const maxRecordedUntracked = 64 << 10

// checkReuseByTrees is checkReuse's capture that stores nothing in one
// round of sandbox commands instead of two (the probe, then the parts), for
// a checkpoint that recorded its index's tree and its untracked part's
// request. The probe, the untracked files' tarball (of the files the
// checkpoint had, asked for before the probe says which there are) and the
// conversation files' tarball run at once. The sandbox holds m exactly
// when:
//   - the probe's base, HEAD, branch, branches, work tree's tree, index's
//     tree and intent-to-add entries are m's: the bundle, the work tree
//     and index diffs and the patch are functions of these (git diffs
//     between trees, commits by hash), so they are m's parts byte for byte
//     without being made again;
//   - the untracked part's request the probe's trees give is the one m
//     recorded (the same untracked files, emptied and untracked directories
//     and repositories), and its tarball, with every file's bytes, mode and
//     time, hashes as m's untracked part;
//   - the conversation files' tarball hashes as m's conversation part.
//
// Anything else is errCachedDiffers; the sandbox is not written (beyond
// the probe's stat refresh, as a capture's).
func (e *Engine) checkReuseByTrees(ctx context.Context, req *checkpointv1.CaptureCheckpointRequest, m *manifest) error {
	cp := m.cp
	sb := sandbox{req.GetSandboxId(), req.GetFencingToken()}
	wd := req.GetWorkDir()
	var recorded sandboxtool.UntrackedRequest
	if err := json.Unmarshal(m.UntrackedRequest, &recorded); err != nil {
		return fmt.Errorf("%w: untracked request: %v", errDamaged, err)
	}
	recorded.WorkDir = wd
	part := map[checkpointv1.PartKind]*checkpointv1.Part{}
	for _, p := range cp.GetParts() {
		switch p.GetKind() {
		case checkpointv1.PartKind_PART_KIND_UNTRACKED, checkpointv1.PartKind_PART_KIND_CONVERSATION:
			if part[p.GetKind()] != nil {
				return errCachedDiffers
			}
			part[p.GetKind()] = p
		}
	}
	untrackedPart := part[checkpointv1.PartKind_PART_KIND_UNTRACKED]
	if untrackedPart == nil || (len(req.GetConversationPaths()) > 0) != (part[checkpointv1.PartKind_PART_KIND_CONVERSATION] != nil) {
		return errCachedDiffers
	}

	var (
		resp                    sandboxtool.ProbeResponse
		code                    int
		untracked, conversation digest
	)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		var err error
		code, err = e.toolJSON(gctx, sb, toolCall{sandboxtool.CommandProbe, sandboxtool.ProbeRequest{WorkDir: wd, Base: req.GetBaseCommit()}},
			&resp, sandboxtool.ExitNotARepo)
		if err != nil {
			return fmt.Errorf("capture probe: %w", err)
		}
		return nil
	})
	// The tarballs' commands failing (a file the request names is gone)
	// is a sandbox that differs, not an error: digest records it.
	g.Go(func() error {
		untracked = e.digest(gctx, sb, toolCall{sandboxtool.CommandUntracked, recorded}, minLimit(e.opt.MaxUntrackedBytes, e.opt.MaxPartBytes))
		return nil
	})
	if paths := req.GetConversationPaths(); len(paths) > 0 {
		g.Go(func() error {
			conversation = e.digest(gctx, sb, toolCall{sandboxtool.CommandArchive, sandboxtool.ArchiveRequest{Paths: paths}}, e.opt.MaxPartBytes)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if code == sandboxtool.ExitNotARepo {
		return fault.FailedPrecondition(ReasonNotARepo, "work_dir %s is not the top of a git work tree", wd)
	}
	pr := probeFrom(resp)
	if pr.base != cp.GetBaseCommit() || pr.head != cp.GetHeadCommit() || pr.branch != cp.GetBranch() ||
		pr.tree != cp.GetTreeHash() || pr.itree != m.IndexTree || !slices.Equal(pr.refs, m.Refs) ||
		!slices.EqualFunc(intentToAdd(pr), m.IntentToAdd, bytes.Equal) {
		return errCachedDiffers
	}
	_, now := treeParts(pr, wd, func(bool, []string, []string) toolCall { return toolCall{} })
	a, errA := json.Marshal(now)
	b, errB := json.Marshal(recorded)
	if errA != nil || errB != nil || !bytes.Equal(a, b) {
		return errCachedDiffers
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if !untracked.is(untrackedPart) {
		return errCachedDiffers
	}
	if p := part[checkpointv1.PartKind_PART_KIND_CONVERSATION]; p != nil && !conversation.is(p) {
		return errCachedDiffers
	}
	return nil
}

// digest is a part's size and SHA-256 as a capture would store it; ok is
// false when its command failed or it was over its limit.
type digest struct {
	ok     bool
	size   int64
	sha256 string
}

func (d digest) is(p *checkpointv1.Part) bool {
	return d.ok && !p.GetSkipped() && d.size == p.GetSizeBytes() && d.sha256 == p.GetSha256()
}

// digest runs a command that writes a part and hashes its output.
func (e *Engine) digest(ctx context.Context, sb sandbox, c toolCall, limit int64) digest {
	w := &digestWriter{limit: limit, sum: sha256.New()}
	code, err := e.tool(ctx, sb, c, nil, w)
	if err != nil || code != 0 {
		return digest{}
	}
	return digest{ok: true, size: w.size, sha256: hex.EncodeToString(w.sum.Sum(nil))}
}

// digestWriter hashes what is written to it, up to limit bytes (0: no
// limit), as partWriter does without storing.
type digestWriter struct {
	limit, size int64
	sum         hash.Hash
}

func (w *digestWriter) Write(p []byte) (int, error) {
	w.size += int64(len(p))
	if w.limit > 0 && w.size > w.limit {
		return 0, errPartTooLarge
	}
	return w.sum.Write(p)
}
