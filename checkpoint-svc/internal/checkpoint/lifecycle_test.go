package checkpoint_test

import (
	"bytes"
	"context"
	"fmt"
	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cloud.google.com/go/storage"
	"github.com/fsouza/fake-gcs-server/fakestorage"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/api/sandboxtool/tooltest"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/checkpoint"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/hostexec"
	"github.com/hangar-dev/hangar/platform/gcsstore"
)

func TestRetentionArchiveIncremental(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t)
	work, _ := w.sandbox()
	var ids []string
	var stored []int64
	for i := range 7 {
		write(t, work, "src/a.go", fmt.Sprintf("package a // %d\n", i), 0o644)
		if i%2 == 1 {
			git(t, work, "commit", "-q", "-am", fmt.Sprintf("c%d", i))
		}
		res := w.capture("s1", work)
		if !res.Created {
			t.Fatalf("capture %d not created", i)
		}
		ids = append(ids, res.Checkpoint.GetId())
		stored = append(stored, res.Checkpoint.GetStoredBytes())
		if i > 1 && res.Checkpoint.GetPreviousCheckpoint() != ids[i-1] {
			t.Fatalf("capture %d not incremental on the previous", i)
		}
	}
	// Nothing changed: the previous checkpoint is reused.
	if res := w.capture("s1", work); res.Created || res.Checkpoint.GetId() != ids[6] {
		var a, b bytes.Buffer
		_ = w.eng.ReadPart(ctx, ids[6], checkpointv1.PartKind_PART_KIND_PATCH, &a)
		_ = w.eng.ReadPart(ctx, res.Checkpoint.GetId(), checkpointv1.PartKind_PART_KIND_PATCH, &b)
		t.Logf("patch part of the previous checkpoint:\n%s\npatch part of the new one:\n%s", a.String(), b.String())
		t.Fatalf("unchanged capture created %v\n%v\n%v", res.Checkpoint.GetId(), res.Checkpoint.GetParts(), list0(t, w, ids[6]))
	}
	list, _, err := w.eng.List(ctx, "s1", 0, 0)
	if err != nil || len(list) != 5 {
		t.Fatalf("list: %d %v", len(list), err)
	}
	for i, cp := range list {
		if cp.GetId() != ids[6-i] {
			t.Fatalf("list[%d] = %s, want %s (newest first)", i, cp.GetId(), ids[6-i])
		}
	}
	page, next, _ := w.eng.List(ctx, "s1", 0, 2)
	if len(page) != 2 || next != 2 {
		t.Fatalf("page: %d next %d", len(page), next)
	}
	// The oldest kept checkpoint still restores: its bundle chain survived
	// the deletion of the checkpoints it built on.
	work2, _ := w.sandbox()
	if _, err := w.restore(ids[2], work2, ""); err != nil {
		t.Fatalf("restore oldest kept: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(work2, "src/a.go")); string(b) != "package a // 2\n" {
		t.Fatalf("restored %q", b)
	}
	work3, _ := w.sandbox()
	if _, err := w.restore(ids[6], work3, ""); err != nil {
		t.Fatalf("restore newest: %v", err)
	}
	if _, err := w.eng.Get(ctx, ids[0]); reason(err) != checkpoint.ReasonNotFound {
		t.Fatalf("pruned checkpoint: %v", err)
	}
	t.Logf("stored bytes per capture: %v", stored)
	for i := 1; i < len(stored); i++ {
		if stored[i] > 16<<10 {
			t.Errorf("capture %d stored %d bytes after a one-line edit", i, stored[i])
		}
	}

	// Fork shares the objects; deleting the source session keeps them.
	before := len(objectFiles(t, w.store))
	fork, err := w.eng.Fork(ctx, ids[6], "s1.1", "hangar/session/s1.1")
	if err != nil {
		t.Fatal(err)
	}
	if after := len(objectFiles(t, w.store)); after != before || fork.GetSharedFrom() != ids[6] {
		t.Fatalf("fork copied objects: %d -> %d", before, after)
	}
	n, err := w.eng.Archive(ctx, "s1")
	if err != nil || n != 5 {
		t.Fatalf("archive: %d %v", n, err)
	}
	if list, _, _ := w.eng.List(ctx, "s1", 0, 0); len(list) != 0 {
		t.Fatal("archived session still lists checkpoints")
	}
	work4, _ := w.sandbox()
	if _, err := w.restore(fork.GetId(), work4, "hangar/session/s1.1"); err != nil {
		t.Fatalf("restore fork after archiving its source: %v", err)
	}
	if b := git(t, work4, "symbolic-ref", "HEAD"); b != "refs/heads/hangar/session/s1.1" {
		t.Fatalf("fork branch %s", b)
	}
	if err := w.eng.Delete(ctx, fork.GetId()); err != nil {
		t.Fatal(err)
	}
	if n := len(objectFiles(t, w.store)); n != 0 {
		t.Fatalf("%d objects left with no checkpoint", n)
	}
}

// sandboxServer serves the host executor as sandbox-svc's Exec stream on
// 127.0.0.1:0 and returns a gRPC Executor for it.
func sandboxServer(t testing.TB) checkpoint.Executor {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	sandboxv1.RegisterSandboxServiceServer(srv, &hostexec.SandboxServer{Exec_: &hostexec.Executor{Root: "/",
		Env: map[string]string{"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
			// A sandbox's PATH: hangar-sandbox and git, nothing else.
			"PATH": tooltest.MinimalPATH(t)}}})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return sandboxexec.New(sandboxv1.NewSandboxServiceClient(cc))
}

func gcsStore(t testing.TB) *gcsstore.Store {
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{Scheme: "http", Host: "127.0.0.1", PublicHost: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: "ckpt"})
	client, err := storage.NewClient(context.Background(), option.WithEndpoint(srv.URL()+"/storage/v1/"),
		option.WithoutAuthentication(), storage.WithJSONReads())
	if err != nil {
		t.Fatal(err)
	}
	s, err := gcsstore.New(client, "gs://ckpt/hangar")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The fidelity round trip through the real exec stream and GCS.
func TestRoundTripOverGRPCAndGCS(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.opts.Exec = sandboxServer(t)
	w.opts.Store = gcsStore(t)
	w.store = w.opts.Store
	w.reopen()
	work, home := w.sandbox()
	conv := messUp(t, work, home)
	// A part bigger than one stdin/stdout chunk and one seal segment.
	big := strings.Repeat("line of untracked text\n", 40000)
	write(t, work, "big-untracked.txt", big, 0o644)
	cp := w.capture("s1", work, conv...).Checkpoint
	wantConv := snapshot(t, home, nil)
	os.RemoveAll(filepath.Join(home, ".claude"))
	work2, _ := w.sandbox()
	if _, err := w.restore(cp.GetId(), work2, ""); err != nil {
		t.Fatalf("restore: %v", err)
	}
	diffSnap(t, snapshot(t, work, ignored), snapshot(t, work2, nil))
	diffSnap(t, wantConv, snapshot(t, home, nil))
	if _, err := w.eng.Verify(context.Background(), cp.GetId()); err != nil {
		t.Fatal(err)
	}
}

func list0(t *testing.T, w *world, id string) any {
	cp, _ := w.eng.Get(context.Background(), id)
	return cp.GetParts()
}
