package sessions

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// Work is a session's work for `session pull`: its commits (those not
// reachable from the base) as git bundles and its uncommitted changes as a
// binary diff against HeadCommit.
type Work struct {
	Branch, BaseCommit, HeadCommit string
	// Bundles hold the commits: none when there are none, one from a live
	// sandbox, and from a checkpoint its chain, oldest first, each bundle
	// incremental on the ones before it (fetch them in order).
	Bundles [][]byte
	Diff    []byte
	// CheckpointID is the checkpoint the work was read from when the
	// sandbox was down.
	CheckpointID string
}

// Work returns the session's work: from its sandbox when it is up and not
// running a turn, else from its newest checkpoint. chain says whether the
// caller can fetch a chain of more than one bundle; without it such a
// checkpoint's work comes as its patch against the base.
func (m *Manager) Work(ctx context.Context, name string, chain bool) (*Work, error) {
	s, err := m.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	if s.SandboxID != "" && s.State != store.StateRunning {
		w, err := m.workFromSandbox(ctx, s)
		if err == nil {
			return w, nil
		}
		m.log.WarnContext(ctx, "session work not read from its sandbox; reading the newest checkpoint", "session", name, "error", err)
	}
	return m.workFromCheckpoint(ctx, s, chain)
}

// workFromSandbox makes the bundle and the diff in the sandbox, holding the
// session up while it does.
func (m *Manager) workFromSandbox(ctx context.Context, s *store.Session) (*Work, error) {
	if h, err := m.d.Holds.Acquire(ctx, s.Name, "work/"+shortID(), "command", "session pull", m.cfg.LeaseTTL); err == nil {
		defer func() {
			if err := m.d.Holds.Release(context.WithoutCancel(ctx), s.Name, h.ID); err != nil {
				m.log.WarnContext(ctx, "hold release failed", "session", s.Name, "hold", h.ID, "error", err)
			}
		}()
	}
	sb, err := m.sandboxOf(ctx, s)
	if err != nil {
		return nil, err
	}
	var hr sandboxtool.HeadResponse
	if err := m.toolJSON(ctx, sb.GetId(), s.FencingToken, sandboxtool.CommandHead, sandboxtool.HeadRequest{WorkDir: sb.GetWorkDir()}, &hr); err != nil {
		return nil, fmt.Errorf("head of %s: %w", s.Name, err)
	}
	w := &Work{Branch: s.Branch, BaseCommit: s.BaseCommit, HeadCommit: hr.Head}
	rev := "HEAD"
	if hr.Branch != "" {
		w.Branch = hr.Branch
		rev = "refs/heads/" + w.Branch
	}
	var bundle bytes.Buffer
	if err := m.tool(ctx, sb.GetId(), s.FencingToken, sandboxtool.CommandWorkBundle,
		sandboxtool.WorkBundleRequest{WorkDir: sb.GetWorkDir(), Base: s.BaseCommit, Rev: rev}, &bundle); err != nil {
		return nil, fmt.Errorf("bundle of %s: %w", s.Name, err)
	}
	if bundle.Len() > 0 {
		w.Bundles = [][]byte{bundle.Bytes()}
	}
	var diff bytes.Buffer
	if err := m.tool(ctx, sb.GetId(), s.FencingToken, sandboxtool.CommandWorkDiff,
		sandboxtool.WorkDiffRequest{WorkDir: sb.GetWorkDir(), Against: "HEAD"}, &diff); err != nil {
		return nil, fmt.Errorf("diff of %s: %w", s.Name, err)
	}
	w.Diff = diff.Bytes()
	return w, nil
}

// workFromCheckpoint reads the work from the newest checkpoint: its chain
// of bundles (each incremental on the previous checkpoint's, so all of them
// make the branch) and its diff against HEAD, which has no untracked files
// (those are in a separate tarball part). When a bundle of the chain was
// over the size limit and not kept, or the caller cannot take a chain of
// more than one bundle, the work comes as the checkpoint's patch against
// the base instead: no commits, the whole work, commits included, as
// uncommitted changes on the base.
func (m *Manager) workFromCheckpoint(ctx context.Context, s *store.Session, acceptChain bool) (*Work, error) {
	cp, err := m.restorePoint(ctx, s)
	if err != nil {
		return nil, err
	}
	if cp == nil {
		return &Work{Branch: s.Branch, BaseCommit: s.BaseCommit, HeadCommit: s.BaseCommit}, nil
	}
	w := &Work{Branch: cp.GetBranch(), BaseCommit: cp.GetBaseCommit(), HeadCommit: cp.GetHeadCommit(), CheckpointID: cp.GetId()}
	if w.Branch == "" {
		w.Branch = s.Branch
	}
	var chain []*checkpointv1.Part
	skipped := false
	for _, p := range cp.GetParts() {
		if p.GetKind() == checkpointv1.PartKind_PART_KIND_BUNDLE {
			chain = append(chain, p)
			skipped = skipped || p.GetSkipped()
		}
	}
	patch := func() (*Work, error) {
		w.HeadCommit, w.Bundles = w.BaseCommit, nil
		if w.Diff, err = m.readPart(ctx, &checkpointv1.ReadPartRequest{CheckpointId: cp.GetId(), Kind: checkpointv1.PartKind_PART_KIND_PATCH}); err != nil {
			return nil, err
		}
		return w, nil
	}
	if skipped || (len(chain) > 1 && !acceptChain) {
		return patch()
	}
	for i, p := range chain {
		req := &checkpointv1.ReadPartRequest{CheckpointId: cp.GetId(), Kind: checkpointv1.PartKind_PART_KIND_BUNDLE}
		if len(chain) > 1 {
			req.BundleIndex = proto.Int32(int32(i))
		}
		b, err := m.readPart(ctx, req)
		if err != nil {
			return nil, err
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != p.GetSha256() {
			// A checkpoint service that predates bundle_index answers
			// every index with the newest bundle.
			m.log.WarnContext(ctx, "a bundle of the checkpoint's chain does not match its manifest; pulling the patch instead",
				"session", s.Name, "checkpoint", cp.GetId(), "bundle", i)
			return patch()
		}
		w.Bundles = append(w.Bundles, b)
	}
	if w.Diff, err = m.readPart(ctx, &checkpointv1.ReadPartRequest{CheckpointId: cp.GetId(), Kind: checkpointv1.PartKind_PART_KIND_DIFF}); err != nil {
		return nil, err
	}
	return w, nil
}

// readPart reads a checkpoint part whole; a part the checkpoint does not
// have is empty.
func (m *Manager) readPart(ctx context.Context, req *checkpointv1.ReadPartRequest) ([]byte, error) {
	id, kind := req.GetCheckpointId(), req.GetKind()
	stream, err := m.d.Checkpoints.ReadPart(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("read %s of checkpoint %s: %w", kind, id, err)
	}
	var buf bytes.Buffer
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return buf.Bytes(), nil
		}
		if fault.ReasonOf(err) == "PART_NOT_FOUND" {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read %s of checkpoint %s: %w", kind, id, err)
		}
		buf.Write(resp.GetChunk())
	}
}
