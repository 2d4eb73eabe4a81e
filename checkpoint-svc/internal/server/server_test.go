package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool/tooltest"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/hostexec"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/server"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/vault"
	"github.com/hangar-dev/hangar/platform/blob"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/platform/rpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var gitEnv = []string{"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
	"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com", "LC_ALL=C"}

func run(t *testing.T, dir string, argv ...string) string {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), gitEnv...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", argv, err, out)
	}
	return strings.TrimSpace(string(out))
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

const token = "test-token"

// fixture is the service on 127.0.0.1:0 behind platform/rpc's interceptors
// (auth, fault mapping), a client, and an origin repository whose clones
// are the "sandboxes" (run on the host by hostexec).
type fixture struct {
	client checkpointv1.CheckpointServiceClient
	store  blob.Store
	addr   string
	origin string
	base   string
}

func start(t *testing.T) *fixture {
	t.Helper()
	st, err := blob.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	kb := make([]byte, 32)
	rand.Read(kb)
	key, err := vault.NewKey(kb)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := server.New(server.Deps{
		Store: st, VaultKeys: vault.NewKeyring(key), KeepCheckpoints: 5, MaxUntrackedMB: 20, MaxPartMB: 100,
		Exec: &hostexec.Executor{Root: "/", Env: map[string]string{"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
			// A sandbox's PATH: hangar-sandbox and git, nothing else.
			"PATH": tooltest.MinimalPATH(t)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	gs := rpc.NewServer(rpc.ServerOptions{Token: token})
	checkpointv1.RegisterCheckpointServiceServer(gs, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gs.Serve(lis) }()
	conn, err := rpc.Dial(lis.Addr().String(), rpc.ClientOptions{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.GracefulStop()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serve: %v", err)
		}
	})
	f := &fixture{client: checkpointv1.NewCheckpointServiceClient(conn), store: st, addr: lis.Addr().String(), origin: t.TempDir()}
	run(t, f.origin, "git", "init", "-q", "-b", "main")
	write(t, f.origin, "README.md", "hello\n")
	write(t, f.origin, ".gitignore", "*.log\n")
	run(t, f.origin, "git", "add", "-A")
	run(t, f.origin, "git", "commit", "-q", "-m", "base")
	f.base = run(t, f.origin, "git", "rev-parse", "HEAD")
	return f
}

func (f *fixture) sandbox(t *testing.T) string {
	work := filepath.Join(t.TempDir(), "work")
	run(t, filepath.Dir(work), "git", "clone", "-q", f.origin, work)
	run(t, work, "git", "checkout", "-q", "-b", "hangar/session/s1")
	return work
}

func (f *fixture) capture(t *testing.T, session, work string) *checkpointv1.CaptureCheckpointResponse {
	t.Helper()
	resp, err := f.client.CaptureCheckpoint(context.Background(), &checkpointv1.CaptureCheckpointRequest{
		Session: session, SandboxId: "sb", WorkDir: work, BaseCommit: f.base, Branch: "hangar/session/s1",
		Reason: checkpointv1.CheckpointReason_CHECKPOINT_REASON_AFTER_TURN, Harness: "claude", Turn: 1,
	})
	if err != nil {
		t.Fatalf("capture: %v", err)
	}
	return resp
}

func reason(err error) string { return fault.Reason(status.Convert(err)) }

func TestCaptureRestoreOverGRPC(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	work := f.sandbox(t)
	write(t, work, "a.txt", "committed\n")
	run(t, work, "git", "add", "a.txt")
	run(t, work, "git", "commit", "-q", "-m", "a")
	write(t, work, "README.md", "hello, edited\n")
	write(t, work, "new/untracked.txt", "untracked\n")
	write(t, work, "bin.dat", "\x00\x01\xff binary")
	write(t, work, "debug.log", "ignored\n")
	resp := f.capture(t, "s1", work)
	cp := resp.GetCheckpoint()
	if !resp.GetCreated() || cp.GetHeadCommit() != run(t, work, "git", "rev-parse", "HEAD") {
		t.Fatalf("capture: %v", resp)
	}

	// Get, List, Verify.
	got, err := f.client.GetCheckpoint(ctx, &checkpointv1.GetCheckpointRequest{CheckpointId: cp.GetId()})
	if err != nil || got.GetCheckpoint().GetTreeHash() != cp.GetTreeHash() {
		t.Fatalf("get: %v %v", got, err)
	}
	list, err := f.client.ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: "s1"})
	if err != nil || len(list.GetCheckpoints()) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}
	ver, err := f.client.VerifyCheckpoint(ctx, &checkpointv1.VerifyCheckpointRequest{CheckpointId: cp.GetId()})
	if err != nil || !ver.GetOk() {
		t.Fatalf("verify: %v %v", ver, err)
	}
	damageManifest(t, f.store, cp.GetId(), func() {
		ver, err := f.client.VerifyCheckpoint(ctx, &checkpointv1.VerifyCheckpointRequest{CheckpointId: cp.GetId()})
		if err != nil || ver.GetOk() || !strings.Contains(ver.GetProblem(), "is damaged") || ver.GetCheckpoint().GetDamaged() == "" {
			t.Fatalf("verify of a damaged manifest: %v %v", ver, err)
		}
		list, err := f.client.ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: "s1"})
		if err != nil || len(list.GetCheckpoints()) != 1 || list.GetCheckpoints()[0].GetDamaged() == "" {
			t.Fatalf("list with a damaged manifest: %v %v", list, err)
		}
		_, err = f.client.RestoreCheckpoint(ctx, &checkpointv1.RestoreCheckpointRequest{CheckpointId: cp.GetId(), SandboxId: "sb", WorkDir: work})
		if status.Code(err) != codes.FailedPrecondition || reason(err) != "CHECKPOINT_TAMPERED" || !strings.Contains(status.Convert(err).Message(), "has no other checkpoint that can be restored") {
			t.Fatalf("restore of a damaged manifest: %v", err)
		}
	})

	// The patch holds the commit, the edit and the untracked files, not
	// the ignored one, and applies to the base.
	patch, err := f.client.GetCheckpointPatch(ctx, &checkpointv1.GetCheckpointPatchRequest{CheckpointId: cp.GetId()})
	if err != nil {
		t.Fatalf("patch: %v", err)
	}
	for _, want := range []string{"b/a.txt", "hello, edited", "b/new/untracked.txt", "GIT binary patch"} {
		if !strings.Contains(patch.GetPatch(), want) {
			t.Errorf("patch lacks %q:\n%s", want, patch.GetPatch())
		}
	}
	if strings.Contains(patch.GetPatch(), "debug.log") || patch.GetBaseCommit() != f.base {
		t.Errorf("patch has the ignored file or a wrong base %s", patch.GetBaseCommit())
	}
	applied := filepath.Join(t.TempDir(), "applied")
	run(t, filepath.Dir(applied), "git", "clone", "-q", f.origin, applied)
	pf := filepath.Join(t.TempDir(), "p.diff")
	os.WriteFile(pf, []byte(patch.GetPatch()), 0o600)
	run(t, applied, "git", "apply", "--binary", "--index", pf)
	if tree := run(t, applied, "git", "write-tree"); tree != cp.GetTreeHash() {
		t.Errorf("base + patch is tree %s, want %s", tree, cp.GetTreeHash())
	}

	// ReadPart streams the diff.
	stream, err := f.client.ReadPart(ctx, &checkpointv1.ReadPartRequest{CheckpointId: cp.GetId(), Kind: checkpointv1.PartKind_PART_KIND_DIFF})
	if err != nil {
		t.Fatal(err)
	}
	var diff bytes.Buffer
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read part: %v", err)
		}
		diff.Write(m.GetChunk())
	}
	if !strings.Contains(diff.String(), "hello, edited") {
		t.Fatalf("diff part: %q", diff.String())
	}

	// Restore into a fresh clone.
	work2 := f.sandbox(t)
	rr, err := f.client.RestoreCheckpoint(ctx, &checkpointv1.RestoreCheckpointRequest{CheckpointId: cp.GetId(), SandboxId: "sb2", WorkDir: work2})
	if err != nil || rr.GetTreeHash() != cp.GetTreeHash() {
		t.Fatalf("restore: %v %v", rr, err)
	}
	if a, b := run(t, work, "git", "status", "--porcelain"), run(t, work2, "git", "status", "--porcelain"); a != b {
		t.Fatalf("status differs:\n%s\nrestored:\n%s", a, b)
	}
	if _, err := os.Stat(filepath.Join(work2, "debug.log")); !os.IsNotExist(err) {
		t.Fatal("ignored file restored")
	}

	// Fork, then archive and delete.
	fork, err := f.client.ForkCheckpoint(ctx, &checkpointv1.ForkCheckpointRequest{CheckpointId: cp.GetId(), NewSession: "s2"})
	if err != nil || fork.GetCheckpoint().GetSharedFrom() != cp.GetId() {
		t.Fatalf("fork: %v %v", fork, err)
	}
	arch, err := f.client.ArchiveSessionCheckpoints(ctx, &checkpointv1.ArchiveSessionCheckpointsRequest{Session: "s1"})
	if err != nil || arch.GetDeleted() != 1 {
		t.Fatalf("archive: %v %v", arch, err)
	}
	if _, err := f.client.GetCheckpointPatch(ctx, &checkpointv1.GetCheckpointPatchRequest{CheckpointId: fork.GetCheckpoint().GetId()}); err != nil {
		t.Fatalf("the fork lost its data with the source's archive: %v", err)
	}
	if _, err := f.client.DeleteCheckpoint(ctx, &checkpointv1.DeleteCheckpointRequest{CheckpointId: fork.GetCheckpoint().GetId()}); err != nil {
		t.Fatal(err)
	}
	_, err = f.client.GetCheckpoint(ctx, &checkpointv1.GetCheckpointRequest{CheckpointId: fork.GetCheckpoint().GetId()})
	if status.Code(err) != codes.NotFound || reason(err) != "CHECKPOINT_NOT_FOUND" {
		t.Fatalf("get deleted: %v", err)
	}
}

func TestErrorsAtTheEdge(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	work := f.sandbox(t)
	for _, tc := range []struct {
		name   string
		call   func() error
		code   codes.Code
		reason string
	}{
		{"bad session", func() error {
			_, err := f.client.CaptureCheckpoint(ctx, &checkpointv1.CaptureCheckpointRequest{Session: "../x", SandboxId: "sb", WorkDir: work, BaseCommit: f.base})
			return err
		}, codes.InvalidArgument, ""},
		{"relative work dir", func() error {
			_, err := f.client.CaptureCheckpoint(ctx, &checkpointv1.CaptureCheckpointRequest{Session: "s", SandboxId: "sb", WorkDir: "work", BaseCommit: f.base})
			return err
		}, codes.InvalidArgument, ""},
		{"not a repository", func() error {
			_, err := f.client.CaptureCheckpoint(ctx, &checkpointv1.CaptureCheckpointRequest{Session: "s", SandboxId: "sb", WorkDir: t.TempDir(), BaseCommit: f.base})
			return err
		}, codes.FailedPrecondition, "WORK_DIR_NOT_A_REPOSITORY"},
		{"missing base", func() error {
			_, err := f.client.CaptureCheckpoint(ctx, &checkpointv1.CaptureCheckpointRequest{Session: "s", SandboxId: "sb", WorkDir: work, BaseCommit: strings.Repeat("ab", 20)})
			return err
		}, codes.FailedPrecondition, "BASE_COMMIT_MISSING"},
		{"malformed id", func() error {
			_, err := f.client.GetCheckpoint(ctx, &checkpointv1.GetCheckpointRequest{CheckpointId: "nope"})
			return err
		}, codes.InvalidArgument, ""},
		{"unknown id", func() error {
			_, err := f.client.VerifyCheckpoint(ctx, &checkpointv1.VerifyCheckpointRequest{CheckpointId: "s~20260101T000000.000000000Z-00000000"})
			return err
		}, codes.NotFound, "CHECKPOINT_NOT_FOUND"},
		{"bad page token", func() error {
			_, err := f.client.ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: "s", PageToken: "x"})
			return err
		}, codes.InvalidArgument, ""},
	} {
		err := tc.call()
		if status.Code(err) != tc.code || (tc.reason != "" && reason(err) != tc.reason) {
			t.Errorf("%s: %v, want %v %s", tc.name, err, tc.code, tc.reason)
		}
		if st := status.Convert(err); strings.Contains(st.Message(), "exited") {
			t.Errorf("%s: internal text leaked: %q", tc.name, st.Message())
		}
	}

	// Without the token nothing answers.
	conn, err := rpc.Dial(f.addr, rpc.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = checkpointv1.NewCheckpointServiceClient(conn).ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: "s1"})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v", err)
	}
}

func TestListPagesAndVerifyDamage(t *testing.T) {
	f := start(t)
	ctx := context.Background()
	work := f.sandbox(t)
	var ids []string
	for i := range 3 {
		write(t, work, "n.txt", strings.Repeat("x", i+1))
		ids = append(ids, f.capture(t, "s1", work).GetCheckpoint().GetId())
	}
	var got []string
	token := ""
	for {
		page, err := f.client.ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: "s1", PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, cp := range page.GetCheckpoints() {
			got = append(got, cp.GetId())
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	if strings.Join(got, ",") != ids[2]+","+ids[1]+","+ids[0] {
		t.Fatalf("pages %v, want newest first of %v", got, ids)
	}
}

// damageManifest flips a byte of checkpoint id's manifest for the time of
// check, then puts it back.
func damageManifest(t *testing.T, st blob.Store, id string, check func()) {
	t.Helper()
	ctx := context.Background()
	i := strings.LastIndexByte(id, '~')
	key := "checkpoints/" + id[:i] + "/" + id[i+1:]
	rc, err := st.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	saved, _ := io.ReadAll(rc)
	rc.Close()
	bad := bytes.Clone(saved)
	bad[len(bad)-3] ^= 1
	if err := st.Put(ctx, key, bytes.NewReader(bad)); err != nil {
		t.Fatal(err)
	}
	check()
	if err := st.Put(ctx, key, bytes.NewReader(saved)); err != nil {
		t.Fatal(err)
	}
}
