package server_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/platform/fault"
)

// Where bubblewrap cannot run, an acquire is refused with a reason that
// says what to do; the service itself starts.
func TestAcquireRefusedWithoutIsolation(t *testing.T) {
	bin := t.TempDir()
	for _, name := range []string{"git", "sh", "cat", "true"} {
		p, err := exec.LookPath(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin)
	e := start(t, nil)
	_, err := e.client.AcquireSandbox(context.Background(), &sandboxv1.AcquireSandboxRequest{})
	wantCode(t, err, codes.FailedPrecondition, "HANGAR_SANDBOX_ISOLATION=none")
	if r := fault.Reason(status.Convert(err)); r != "SANDBOX_ISOLATION_UNAVAILABLE" {
		t.Errorf("reason %q, want SANDBOX_ISOLATION_UNAVAILABLE", r)
	}
}
