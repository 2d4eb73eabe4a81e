package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
)

// readPart reads a ReadPart stream whole.
func (f *fixture) readPart(ctx context.Context, req *checkpointv1.ReadPartRequest) ([]byte, error) {
	stream, err := f.client.ReadPart(ctx, req)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return b.Bytes(), nil
		}
		if err != nil {
			return nil, err
		}
		b.Write(m.GetChunk())
	}
}

// TestReadPartBundleIndex: bundle_index picks a bundle of the chain over
// gRPC; unset is the newest; a bad index or another kind is
// InvalidArgument.
func TestReadPartBundleIndex(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	work := f.sandbox(t)
	write(t, work, "a.txt", "one\n")
	run(t, work, "git", "add", "a.txt")
	run(t, work, "git", "commit", "-q", "-m", "one")
	f.capture(t, "s1", work)
	write(t, work, "b.txt", "two\n")
	run(t, work, "git", "add", "b.txt")
	run(t, work, "git", "commit", "-q", "-m", "two")
	cp := f.capture(t, "s1", work).GetCheckpoint()

	bundle := checkpointv1.PartKind_PART_KIND_BUNDLE
	var chain [][]byte
	for i := range int32(2) {
		b, err := f.readPart(ctx, &checkpointv1.ReadPartRequest{CheckpointId: cp.GetId(), Kind: bundle, BundleIndex: proto.Int32(i)})
		if err != nil || len(b) == 0 {
			t.Fatalf("bundle %d: %d bytes, %v", i, len(b), err)
		}
		chain = append(chain, b)
	}
	if bytes.Equal(chain[0], chain[1]) {
		t.Fatal("bundles 0 and 1 are the same")
	}
	newest, err := f.readPart(ctx, &checkpointv1.ReadPartRequest{CheckpointId: cp.GetId(), Kind: bundle})
	if err != nil || !bytes.Equal(newest, chain[1]) {
		t.Fatalf("unset bundle_index is not the newest bundle: %v", err)
	}

	for name, req := range map[string]*checkpointv1.ReadPartRequest{
		"past the end": {CheckpointId: cp.GetId(), Kind: bundle, BundleIndex: proto.Int32(2)},
		"negative":     {CheckpointId: cp.GetId(), Kind: bundle, BundleIndex: proto.Int32(-1)},
		"another kind": {CheckpointId: cp.GetId(), Kind: checkpointv1.PartKind_PART_KIND_DIFF, BundleIndex: proto.Int32(0)},
	} {
		_, err := f.readPart(ctx, req)
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() == "internal error" {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
}
