// Package server implements hangar.checkpoint.v1 over the checkpoint
// engine.
package server

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/checkpoint"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/vault"
	"github.com/hangar-dev/hangar/platform/blob"
	"github.com/hangar-dev/hangar/platform/fault"
)

// Executor runs commands in a sandbox; sandboxexec.New(client) is the real
// one (sandbox-svc's Exec stream).
type Executor = checkpoint.Executor

// Keyring is the vault keyring; LoadVaultKeys reads it.
type Keyring = vault.Keyring

// LoadVaultKeys reads the vault key file (HANGAR_VAULT_KEY_FILE, written
// by `hangar up` as one line of standard base64 of 32 random bytes, mode
// 0600). Extra lines are retired keys kept for reading old checkpoints.
func LoadVaultKeys(path string) (*Keyring, error) { return vault.LoadKeyFile(path) }

// Deps are what the service needs.
type Deps struct {
	Store     blob.Store
	Exec      Executor
	VaultKeys *Keyring
	Logger    *slog.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// KeepCheckpoints per session (HANGAR_SESSION_KEEP_CHECKPOINTS).
	KeepCheckpoints int
	// Limits in MB (HANGAR_SESSION_MAX_UNTRACKED_MB, _MAX_PART_MB).
	MaxUntrackedMB, MaxPartMB int
}

// Checkpoints serves hangar.checkpoint.v1.CheckpointService.
type Checkpoints struct {
	checkpointv1.UnimplementedCheckpointServiceServer
	eng *checkpoint.Engine
}

// New returns the service.
func New(deps Deps) (*Checkpoints, error) {
	if deps.Store == nil || deps.Exec == nil || deps.VaultKeys == nil {
		return nil, errors.New("checkpoint server: Store, Exec and VaultKeys are required")
	}
	eng, err := checkpoint.New(checkpoint.Options{
		Store: deps.Store, Exec: deps.Exec, Keys: deps.VaultKeys, Logger: deps.Logger, Now: deps.Now,
		KeepCheckpoints:   deps.KeepCheckpoints,
		MaxUntrackedBytes: int64(deps.MaxUntrackedMB) << 20,
		MaxPartBytes:      int64(deps.MaxPartMB) << 20,
	})
	if err != nil {
		return nil, err
	}
	return &Checkpoints{eng: eng}, nil
}

// CaptureCheckpoint implements the RPC.
func (s *Checkpoints) CaptureCheckpoint(ctx context.Context, req *checkpointv1.CaptureCheckpointRequest) (*checkpointv1.CaptureCheckpointResponse, error) {
	res, err := s.eng.Capture(ctx, req)
	if err != nil {
		return nil, err
	}
	return &checkpointv1.CaptureCheckpointResponse{Checkpoint: res.Checkpoint, Warnings: res.Warnings, Created: res.Created}, nil
}

// RestoreCheckpoint implements the RPC.
func (s *Checkpoints) RestoreCheckpoint(ctx context.Context, req *checkpointv1.RestoreCheckpointRequest) (*checkpointv1.RestoreCheckpointResponse, error) {
	cp, tree, err := s.eng.Restore(ctx, req)
	if err != nil {
		return nil, err
	}
	// With reuse_sandbox, success is a reuse (a sandbox that differs fails).
	return &checkpointv1.RestoreCheckpointResponse{Checkpoint: cp, TreeHash: tree, Reused: req.GetReuseSandbox()}, nil
}

// ListCheckpoints implements the RPC; page tokens are offsets.
func (s *Checkpoints) ListCheckpoints(ctx context.Context, req *checkpointv1.ListCheckpointsRequest) (*checkpointv1.ListCheckpointsResponse, error) {
	offset := 0
	if t := req.GetPageToken(); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 0 {
			return nil, fault.InvalidArgument("page_token", "page_token is not one this service returned")
		}
		offset = n
	}
	size := int(req.GetPageSize())
	if size <= 0 || size > 100 {
		size = 100
	}
	cps, next, err := s.eng.List(ctx, req.GetSession(), offset, size)
	if err != nil {
		return nil, err
	}
	resp := &checkpointv1.ListCheckpointsResponse{Checkpoints: cps}
	if next > 0 {
		resp.NextPageToken = strconv.Itoa(next)
	}
	return resp, nil
}

// GetCheckpoint implements the RPC.
func (s *Checkpoints) GetCheckpoint(ctx context.Context, req *checkpointv1.GetCheckpointRequest) (*checkpointv1.GetCheckpointResponse, error) {
	cp, err := s.eng.Get(ctx, req.GetCheckpointId())
	if err != nil {
		return nil, err
	}
	return &checkpointv1.GetCheckpointResponse{Checkpoint: cp}, nil
}

// VerifyCheckpoint implements the RPC: a damaged checkpoint (its data or
// its manifest) is ok=false with the problem, not an error.
func (s *Checkpoints) VerifyCheckpoint(ctx context.Context, req *checkpointv1.VerifyCheckpointRequest) (*checkpointv1.VerifyCheckpointResponse, error) {
	cp, err := s.eng.Verify(ctx, req.GetCheckpointId())
	var fe *fault.Error
	switch {
	case err == nil:
		return &checkpointv1.VerifyCheckpointResponse{Checkpoint: cp, Ok: true}, nil
	case errors.As(err, &fe) && fe.Kind == fault.KindFailedPrecondition && (fe.Reason == checkpoint.ReasonTampered || fe.Reason == checkpoint.ReasonUnknownKey):
		if cp == nil { // the manifest itself is damaged
			cp = &checkpointv1.Checkpoint{Id: req.GetCheckpointId(), Damaged: fe.Message}
		}
		return &checkpointv1.VerifyCheckpointResponse{Checkpoint: cp, Ok: false, Problem: fe.Message}, nil
	case cp != nil && errors.As(err, &fe) && fe.Kind == fault.KindFailedPrecondition:
		return &checkpointv1.VerifyCheckpointResponse{Checkpoint: cp, Ok: false, Problem: fe.Message}, nil
	}
	return nil, err
}

// DeleteCheckpoint implements the RPC.
func (s *Checkpoints) DeleteCheckpoint(ctx context.Context, req *checkpointv1.DeleteCheckpointRequest) (*checkpointv1.DeleteCheckpointResponse, error) {
	if err := s.eng.Delete(ctx, req.GetCheckpointId()); err != nil {
		return nil, err
	}
	return &checkpointv1.DeleteCheckpointResponse{}, nil
}

// ArchiveSessionCheckpoints implements the RPC.
func (s *Checkpoints) ArchiveSessionCheckpoints(ctx context.Context, req *checkpointv1.ArchiveSessionCheckpointsRequest) (*checkpointv1.ArchiveSessionCheckpointsResponse, error) {
	n, err := s.eng.Archive(ctx, req.GetSession())
	if err != nil {
		return nil, err
	}
	return &checkpointv1.ArchiveSessionCheckpointsResponse{Deleted: int32(n)}, nil
}

// ForkCheckpoint implements the RPC.
func (s *Checkpoints) ForkCheckpoint(ctx context.Context, req *checkpointv1.ForkCheckpointRequest) (*checkpointv1.ForkCheckpointResponse, error) {
	cp, err := s.eng.Fork(ctx, req.GetCheckpointId(), req.GetNewSession(), req.GetBranch())
	if err != nil {
		return nil, err
	}
	return &checkpointv1.ForkCheckpointResponse{Checkpoint: cp}, nil
}

// GetCheckpointPatch implements the RPC from the checkpoint's patch part:
// the whole work (commits, uncommitted and untracked changes) against the
// base commit, with no sandbox. Checkpoints made before the patch part
// existed have the uncommitted diff only, so those with commits past the
// base answer FailedPrecondition.
func (s *Checkpoints) GetCheckpointPatch(ctx context.Context, req *checkpointv1.GetCheckpointPatchRequest) (*checkpointv1.GetCheckpointPatchResponse, error) {
	cp, err := s.eng.Get(ctx, req.GetCheckpointId())
	if err != nil {
		return nil, err
	}
	kind := checkpointv1.PartKind_PART_KIND_UNSPECIFIED
	for _, p := range cp.GetParts() {
		if p.GetKind() != checkpointv1.PartKind_PART_KIND_PATCH {
			continue
		}
		if p.GetSkipped() {
			return nil, fault.FailedPrecondition("PATCH_TOO_LARGE",
				"checkpoint %s has no patch: it was over the size limit when captured", cp.GetId())
		}
		kind = p.GetKind()
	}
	if kind == checkpointv1.PartKind_PART_KIND_UNSPECIFIED {
		if cp.GetHeadCommit() != cp.GetBaseCommit() {
			return nil, fault.FailedPrecondition("PATCH_NEEDS_SANDBOX",
				"checkpoint %s has commits past its base and no patch part; open the session to get its patch", cp.GetId())
		}
		kind = checkpointv1.PartKind_PART_KIND_DIFF
	}
	var b patchBuffer
	if err := s.eng.ReadPart(ctx, cp.GetId(), kind, &b); err != nil {
		return nil, err
	}
	return &checkpointv1.GetCheckpointPatchResponse{Patch: string(b.b), BaseCommit: cp.GetBaseCommit()}, nil
}

type patchBuffer struct{ b []byte }

func (p *patchBuffer) Write(b []byte) (int, error) {
	if len(p.b)+len(b) > 32<<20 {
		return 0, fault.FailedPrecondition("PATCH_TOO_LARGE", "the patch is over 32 MB; read the diff part instead")
	}
	p.b = append(p.b, b...)
	return len(b), nil
}

// ReadPart implements the RPC, streaming the plaintext in 64 KiB chunks.
// With bundle_index it reads that bundle of the checkpoint's chain.
func (s *Checkpoints) ReadPart(req *checkpointv1.ReadPartRequest, stream checkpointv1.CheckpointService_ReadPartServer) error {
	w := &chunkSender{stream: stream}
	if req.BundleIndex == nil {
		return s.eng.ReadPart(stream.Context(), req.GetCheckpointId(), req.GetKind(), w)
	}
	if req.GetKind() != checkpointv1.PartKind_PART_KIND_BUNDLE {
		return fault.InvalidArgument("bundle_index", "bundle_index is only for kind PART_KIND_BUNDLE, not %s", req.GetKind())
	}
	return s.eng.ReadBundle(stream.Context(), req.GetCheckpointId(), int(req.GetBundleIndex()), w)
}

type chunkSender struct {
	stream checkpointv1.CheckpointService_ReadPartServer
}

func (c *chunkSender) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), 64<<10)
		if err := c.stream.Send(&checkpointv1.ReadPartResponse{Chunk: p[:k]}); err != nil {
			return n, err
		}
		p, n = p[k:], n+k
	}
	return n, nil
}
