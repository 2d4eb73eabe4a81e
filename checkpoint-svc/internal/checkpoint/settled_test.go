package checkpoint_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/checkpoint"
	"github.com/hangar-dev/hangar/platform/fault"
)

// writerExec runs commands like the host executor and, right after the
// first one (the probe), writes a file of the work tree: an agent working
// while a checkpoint is taken.
type writerExec struct {
	checkpoint.Executor
	file  string
	calls atomic.Int64
}

func (x *writerExec) Exec(ctx context.Context, id string, token uint64, argv []string, env map[string]string, cwd string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	code, err := x.Executor.Exec(ctx, id, token, argv, env, cwd, stdin, stdout, stderr)
	if x.calls.Add(1) == 1 {
		if werr := os.WriteFile(x.file, []byte("written during the capture\n"), 0o644); werr != nil {
			return code, werr
		}
	}
	return code, err
}

// TestCaptureVerifySettled: a capture asked to verify the tree settled
// drops itself when the tree changed while it was read; one that was not
// asked keeps it; a still tree passes.
func TestCaptureVerifySettled(t *testing.T) {
	w := newWorld(t)
	work, _ := w.sandbox()
	if err := os.WriteFile(filepath.Join(work, "notes.txt"), []byte("before\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	capture := func(x checkpoint.Executor, settled bool) (*checkpoint.CaptureResult, error) {
		opts := w.opts
		opts.Exec = x
		eng, err := checkpoint.New(opts)
		if err != nil {
			t.Fatal(err)
		}
		return eng.Capture(context.Background(), &checkpointv1.CaptureCheckpointRequest{
			SandboxId: "sb", Session: "settled", WorkDir: work, Branch: "hangar/session/s1", BaseCommit: w.base,
			Reason: checkpointv1.CheckpointReason_CHECKPOINT_REASON_PERIODIC, VerifySettled: settled,
		})
	}

	_, err := capture(&writerExec{Executor: w.exec, file: filepath.Join(work, "notes.txt")}, true)
	var fe *fault.Error
	if err == nil || !strings.Contains(err.Error(), "changed while it was captured") || !errors.As(err, &fe) || fe.Reason != checkpoint.ReasonTreeChanged {
		t.Fatalf("capture of a tree written under it: %v, want TREE_CHANGED", err)
	}
	if list, _, err := w.eng.List(context.Background(), "settled", 0, 10); err != nil || len(list) != 0 {
		t.Fatalf("a dropped capture left checkpoints %v (%v)", list, err)
	}

	if _, err := capture(w.exec, true); err != nil {
		t.Fatalf("capture of a still tree: %v", err)
	}
	if _, err := capture(&writerExec{Executor: w.exec, file: filepath.Join(work, "other.txt")}, false); err != nil {
		t.Fatalf("capture without verify_settled: %v", err)
	}
}
