package checkpoint_test

import (
	"context"
	"crypto/rand"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/platform/blob"
	"github.com/hangar-dev/hangar/platform/fault"
)

// smallDisk mounts a tmpfs of size bytes (e.g. "4m") for the test, or
// skips it when the test cannot mount (not root).
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the full-disk test mounts a small tmpfs, which needs root; run it as root (CI does)")
	}
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size="+size+",mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v): the full-disk test needs a mount namespace that allows it", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// TestFullDisk: with the checkpoint store on a 4 MB filesystem, a capture
// of more than fits fails saying the data volume is full; the previous
// checkpoint stays the newest and restores; nothing half-written is left
// (no manifest, no temporary file, no chunk of the failed capture).
func TestFullDisk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	disk := smallDisk(t, "4m")
	w := newWorld(t)
	st, err := blob.NewDir(filepath.Join(disk, "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	w.store, w.opts.Store = st, st
	w.reopen()
	work, _ := w.sandbox()
	write(t, work, "notes.txt", "before the disk filled\n", 0o644)
	first := w.capture("s1", work).Checkpoint
	objectsBefore := len(objectFiles(t, w.store))

	// 6 MB that does not compress or deduplicate.
	big := make([]byte, 6<<20)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(work, "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = w.eng.Capture(ctx, &checkpointv1.CaptureCheckpointRequest{
		SandboxId: "sb", Session: "s1", WorkDir: work, Branch: "hangar/session/s1", BaseCommit: w.base,
		Reason: checkpointv1.CheckpointReason_CHECKPOINT_REASON_AFTER_TURN,
	})
	if s := fault.Status(err); s.Code() != codes.ResourceExhausted || fault.Reason(s) != fault.ReasonNoSpace ||
		s.Message() != "no space left on the data volume (HANGAR_HOME)" {
		t.Fatalf("capture on a full disk: %v %s %q (%v)", s.Code(), fault.Reason(s), s.Message(), err)
	}
	if objectsBefore == 0 {
		t.Fatal("the first checkpoint stored no objects on the small disk")
	}

	list, _, err := w.eng.List(ctx, "s1", 0, 0)
	if err != nil || len(list) != 1 || list[0].GetId() != first.GetId() {
		t.Fatalf("list after the failed capture: %v %v (want only %s)", list, err, first.GetId())
	}
	var leftovers []string
	_ = filepath.WalkDir(disk, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".blob-tmp-") {
			leftovers = append(leftovers, p)
		}
		return nil
	})
	if len(leftovers) > 0 {
		t.Fatalf("temporary files left: %v", leftovers)
	}
	if n := len(objectFiles(t, w.store)); n != objectsBefore {
		t.Fatalf("%d objects after the failed capture, %d before: its chunks were not freed", n, objectsBefore)
	}
	work2, _ := w.sandbox()
	if _, err := w.restore(first.GetId(), work2, ""); err != nil {
		t.Fatalf("previous checkpoint after a full disk: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(work2, "notes.txt")); err != nil || string(b) != "before the disk filled\n" {
		t.Fatalf("restored notes.txt = %q, %v", b, err)
	}

	// With the space back, capturing works again.
	if err := os.Remove(filepath.Join(work, "big.bin")); err != nil {
		t.Fatal(err)
	}
	write(t, work, "notes.txt", "after\n", 0o644)
	if res := w.capture("s1", work); !res.Created {
		t.Fatal("capture after freeing space made nothing")
	}
}
