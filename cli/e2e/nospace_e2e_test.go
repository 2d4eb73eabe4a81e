package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/platform/fault"
)

// TestCheckpointStoreFull: hangar's checkpoint store on a 4 MB filesystem
// (a tmpfs the test mounts: root only). A capture of more than fits fails,
// through the front door, with "no space left on the data volume
// (HANGAR_HOME)"; `checkpoint list` still shows only the previous
// checkpoint as the newest, and it restores into a new sandbox.
func TestCheckpointStoreFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the full-disk test mounts a small tmpfs, which needs root; run it as root (CI does)")
	}
	disk := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(disk, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", disk, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size=4m,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v)", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(disk, syscall.MNT_DETACH) })
	s := &checkpointStack{startStack(t, stackOptions{vars: map[string]string{"HANGAR_SESSION_STORE": disk}})}
	repo := gitRepo(t, map[string]string{"README.md": "hello\n"})
	s.applyEnvironment(t, "cpe2e", repo, 0, sandboxv1.Egress_EGRESS_UNSPECIFIED)
	ctx := context.Background()

	capture := func(sb *sandboxv1.AcquireSandboxResponse) (*checkpointv1.CaptureCheckpointResponse, error) {
		return s.checkpoints.CaptureCheckpoint(ctx, &checkpointv1.CaptureCheckpointRequest{
			Session: "s1", SandboxId: sb.GetSandbox().GetId(), FencingToken: sb.GetLease().GetFencingToken(),
			WorkDir: sb.GetSandbox().GetWorkDir(), BaseCommit: sb.GetSandbox().GetBaseCommit(), Branch: "hangar/session/s1",
			Reason: checkpointv1.CheckpointReason_CHECKPOINT_REASON_AFTER_TURN,
		})
	}
	sb := s.acquire(t)
	s.exec(t, sb, `git checkout -q -b hangar/session/s1 && echo "before the disk filled" > notes.txt`)
	first, err := capture(sb)
	if err != nil {
		t.Fatalf("first capture: %v", err)
	}
	s.exec(t, sb, `head -c 6000000 /dev/urandom > big.bin`)
	_, err = capture(sb)
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || fault.Reason(st) != fault.ReasonNoSpace || st.Message() != "no space left on the data volume (HANGAR_HOME)" {
		t.Fatalf("capture on a full store: %v %s %q", st.Code(), fault.Reason(st), st.Message())
	}
	out, err := s.cli(t, "checkpoint", "list", "s1")
	if err != nil || strings.Count(out, "s1~") != 1 || !strings.Contains(out, first.GetCheckpoint().GetId()) {
		t.Fatalf("checkpoint list after the failed capture: %v\n%s", err, out)
	}
	if _, err := s.sandboxes.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: sb.GetSandbox().GetId(), FencingToken: sb.GetLease().GetFencingToken()}); err != nil {
		t.Fatalf("release: %v", err)
	}
	s.waitDestroyed(t, sb.GetSandbox().GetId())
	sb2 := s.acquire(t)
	if _, err := s.checkpoints.RestoreCheckpoint(ctx, &checkpointv1.RestoreCheckpointRequest{
		CheckpointId: first.GetCheckpoint().GetId(), SandboxId: sb2.GetSandbox().GetId(), FencingToken: sb2.GetLease().GetFencingToken(),
		WorkDir: sb2.GetSandbox().GetWorkDir(),
	}); err != nil {
		t.Fatalf("restore the previous checkpoint: %v", err)
	}
	if got := s.exec(t, sb2, `cat notes.txt; ls big.bin 2>&1 || true`); !strings.Contains(got, "before the disk filled") || !strings.Contains(got, "No such file") {
		t.Fatalf("restored tree: %q", got)
	}
}
