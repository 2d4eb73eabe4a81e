package sessions

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"google.golang.org/protobuf/proto"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
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

// workHeadScript prints the work tree's HEAD and current branch ("" when
// detached).
const workHeadScript = `git rev-parse HEAD && (git symbolic-ref --quiet --short HEAD || true)`

// workBundleScript writes a bundle of the commits of $2 not reachable from
// the base $1, or nothing when there are none.
const workBundleScript = `set -e
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
git cat-file -e "$1^{commit}" 2>/dev/null && excl="^$1" || excl=""
[ -n "$(git rev-list -n 1 "$2" $excl)" ] || exit 0
git bundle create -q "$tmp" "$2" $excl
cat "$tmp"`

// workDiffScript writes the uncommitted changes, untracked files that
// .gitignore does not exclude included, as a binary diff against HEAD; the
// real index is left alone.
const workDiffScript = `set -e
idx=$(mktemp)
trap 'rm -f "$idx"' EXIT
cp .git/index "$idx" 2>/dev/null || true
GIT_INDEX_FILE="$idx" git add -A
GIT_INDEX_FILE="$idx" git diff --cached --binary HEAD`

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
	exec := func(script string, args ...string) ([]byte, error) {
		var out, stderr bytes.Buffer
		argv := append([]string{"sh", "-c", script, "sh"}, args...)
		code, err := sandboxexec.New(m.d.Sandboxes).Exec(ctx, sb.GetId(), s.FencingToken, argv, nil, "", nil, &out, &stderr)
		if err != nil {
			return nil, err
		}
		if code != 0 {
			return nil, fmt.Errorf("exited %d: %s", code, strings.TrimSpace(lastLines(stderr.String(), 3)))
		}
		return out.Bytes(), nil
	}
	out, err := exec(workHeadScript)
	if err != nil {
		return nil, fmt.Errorf("head of %s: %w", s.Name, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	w := &Work{Branch: s.Branch, BaseCommit: s.BaseCommit, HeadCommit: strings.TrimSpace(lines[0])}
	rev := "HEAD"
	if len(lines) > 1 && strings.TrimSpace(lines[1]) != "" {
		w.Branch = strings.TrimSpace(lines[1])
		rev = "refs/heads/" + w.Branch
	}
	bundle, err := exec(workBundleScript, s.BaseCommit, rev)
	if err != nil {
		return nil, fmt.Errorf("bundle of %s: %w", s.Name, err)
	}
	if len(bundle) > 0 {
		w.Bundles = [][]byte{bundle}
	}
	if w.Diff, err = exec(workDiffScript); err != nil {
		return nil, fmt.Errorf("diff of %s: %w", s.Name, err)
	}
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
