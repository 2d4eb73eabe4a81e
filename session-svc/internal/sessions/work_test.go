package sessions_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/sessions"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

const (
	workBase = "1111111111111111111111111111111111111111"
	workHead = "2222222222222222222222222222222222222222"
)

// fakeCheckpoints serves one checkpoint's parts. Without bundle_index
// (or when ignoreIndex, like a service that predates it) a BUNDLE read is
// the newest kept bundle.
type fakeCheckpoints struct {
	checkpointv1.CheckpointServiceClient
	cp          *checkpointv1.Checkpoint
	bundles     [][]byte // by position in the chain; nil: skipped
	diff, patch []byte
	ignoreIndex bool
	reads       []string
}

func (f *fakeCheckpoints) ListCheckpoints(context.Context, *checkpointv1.ListCheckpointsRequest, ...grpc.CallOption) (*checkpointv1.ListCheckpointsResponse, error) {
	return &checkpointv1.ListCheckpointsResponse{Checkpoints: []*checkpointv1.Checkpoint{f.cp}}, nil
}

func (f *fakeCheckpoints) ReadPart(_ context.Context, req *checkpointv1.ReadPartRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[checkpointv1.ReadPartResponse], error) {
	var body []byte
	switch req.GetKind() {
	case checkpointv1.PartKind_PART_KIND_BUNDLE:
		if req.BundleIndex != nil && !f.ignoreIndex {
			f.reads = append(f.reads, fmt.Sprintf("bundle %d", req.GetBundleIndex()))
			body = f.bundles[req.GetBundleIndex()]
		} else {
			f.reads = append(f.reads, "bundle")
			for _, b := range f.bundles {
				if b != nil {
					body = b
				}
			}
		}
	case checkpointv1.PartKind_PART_KIND_DIFF:
		f.reads = append(f.reads, "diff")
		body = f.diff
	case checkpointv1.PartKind_PART_KIND_PATCH:
		f.reads = append(f.reads, "patch")
		body = f.patch
	}
	if body == nil {
		return nil, fault.Status(fault.NotFound("PART_NOT_FOUND", "no such part")).Err()
	}
	return &partStream{chunks: [][]byte{body[:len(body)/2], body[len(body)/2:]}}, nil
}

type partStream struct {
	grpc.ClientStream
	chunks [][]byte
}

func (s *partStream) Recv() (*checkpointv1.ReadPartResponse, error) {
	if len(s.chunks) == 0 {
		return nil, io.EOF
	}
	c := s.chunks[0]
	s.chunks = s.chunks[1:]
	return &checkpointv1.ReadPartResponse{Chunk: c}, nil
}

// newFakeCheckpoints makes a checkpoint whose chain has n bundles, the
// last skipped when lastSkipped.
func newFakeCheckpoints(n int, lastSkipped bool) *fakeCheckpoints {
	f := &fakeCheckpoints{diff: []byte("the diff"), patch: []byte("the patch")}
	f.cp = &checkpointv1.Checkpoint{Id: "s~1", Session: "s", Branch: "hangar/session/s", BaseCommit: workBase, HeadCommit: workHead}
	for i := range n {
		b := []byte(fmt.Sprintf("bundle %d of %d", i, n))
		sum := sha256.Sum256(b)
		p := &checkpointv1.Part{Kind: checkpointv1.PartKind_PART_KIND_BUNDLE, SizeBytes: int64(len(b)), Sha256: hex.EncodeToString(sum[:])}
		if lastSkipped && i == n-1 {
			b, p = nil, &checkpointv1.Part{Kind: checkpointv1.PartKind_PART_KIND_BUNDLE, Skipped: true}
		}
		f.bundles = append(f.bundles, b)
		f.cp.Parts = append(f.cp.Parts, p)
	}
	f.cp.Parts = append(f.cp.Parts,
		&checkpointv1.Part{Kind: checkpointv1.PartKind_PART_KIND_DIFF},
		&checkpointv1.Part{Kind: checkpointv1.PartKind_PART_KIND_PATCH})
	return f
}

// TestWorkFromCheckpointChain: a suspended session's work is its newest
// checkpoint's whole chain of bundles, in order, for a caller that takes
// a chain; otherwise, or when a bundle was not kept, or when the
// checkpoint service answers every index with the same bundle, it is the
// patch against the base.
func TestWorkFromCheckpointChain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		bundles     int
		lastSkipped bool
		chain       bool
		ignoreIndex bool
		wantBundles int // -1: the patch fallback
		wantReads   []string
	}{
		{"chain of three", 3, false, true, false, 3, []string{"bundle 0", "bundle 1", "bundle 2", "diff"}},
		{"chain, caller takes one bundle", 3, false, false, false, -1, []string{"patch"}},
		{"one bundle, caller takes one", 1, false, false, false, 1, []string{"bundle", "diff"}},
		{"one bundle, caller takes a chain", 1, false, true, false, 1, []string{"bundle", "diff"}},
		{"no bundle", 0, false, true, false, 0, []string{"diff"}},
		{"last bundle not kept", 2, true, true, false, -1, []string{"patch"}},
		{"service ignores bundle_index", 2, false, true, true, -1, []string{"bundle", "patch"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			records, err := store.Open(ctx, store.Options{SQLitePath: filepath.Join(t.TempDir(), "sessions.db")})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = records.Close() })
			if err := records.CreateSession(ctx, &store.Session{Name: "s", Environment: "e", Harness: "claude",
				Branch: "hangar/session/s", State: store.StateSuspended, BaseCommit: workBase}); err != nil {
				t.Fatal(err)
			}
			f := newFakeCheckpoints(tc.bundles, tc.lastSkipped)
			f.ignoreIndex = tc.ignoreIndex
			m := sessions.New(sessions.Deps{Store: records, Checkpoints: f})
			t.Cleanup(func() { _ = m.Close(t.Context()) })

			w, err := m.Work(ctx, "s", tc.chain)
			if err != nil {
				t.Fatalf("Work: %v", err)
			}
			if !slices.Equal(f.reads, tc.wantReads) {
				t.Errorf("reads %q, want %q", f.reads, tc.wantReads)
			}
			if w.CheckpointID != "s~1" || w.Branch != "hangar/session/s" || w.BaseCommit != workBase {
				t.Errorf("work %+v", w)
			}
			if tc.wantBundles < 0 {
				if w.HeadCommit != workBase || len(w.Bundles) != 0 || string(w.Diff) != "the patch" {
					t.Fatalf("want the patch on the base: head %s, %d bundles, diff %q", w.HeadCommit, len(w.Bundles), w.Diff)
				}
				return
			}
			if w.HeadCommit != workHead || string(w.Diff) != "the diff" || len(w.Bundles) != tc.wantBundles {
				t.Fatalf("head %s, %d bundles, diff %q", w.HeadCommit, len(w.Bundles), w.Diff)
			}
			for i, b := range w.Bundles {
				if want := fmt.Sprintf("bundle %d of %d", i, tc.bundles); string(b) != want {
					t.Errorf("bundle %d is %q, want %q", i, b, want)
				}
			}
		})
	}
}
