package server_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool/tooltest"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/server"
)

// TestAcquireAtBaseCommit: base_commit makes a new sandbox start at the
// caller's commit rather than the environment's base, cloned or mounted
// over a base layer; a commit the repository lacks falls back to the
// environment's base; a malformed one is refused naming the field.
func TestAcquireAtBaseCommit(t *testing.T) {
	for _, layers := range []int{0, 2} {
		t.Run(map[int]string{0: "clone", 2: "base-layers"}[layers], func(t *testing.T) {
			e := start(t, func(d *server.Deps) {
				drv, err := local.New(local.Options{Root: d.Home, Tool: tooltest.Path(t), BaseLayers: layers})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { drv.Close() })
				d.Driver = drv
			})
			ctx := context.Background()
			old := e.commit
			// The repository moves on after the session pinned its base.
			if err := os.WriteFile(filepath.Join(e.repo, "README.md"), []byte("moved on\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			run := func(args ...string) string {
				cmd := exec.Command("git", args...)
				cmd.Dir = e.repo
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("git %v: %v %s", args, err, out)
				}
				return strings.TrimSpace(string(out))
			}
			run("-c", "user.name=t", "-c", "user.email=t@x", "commit", "-qam", "move on")
			head := run("rev-parse", "HEAD")

			acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/a", WorkKey: "a", Repository: e.repo, BaseCommit: old})
			if err != nil {
				t.Fatal(err)
			}
			sb := acq.GetSandbox()
			if sb.GetBaseCommit() != old {
				t.Errorf("base_commit %s: the sandbox says it starts at %s", old, sb.GetBaseCommit())
			}
			res, err := execOnce(t, e.client, sb.GetId(), acq.GetLease().GetFencingToken(), "", "sh", "-c", "git rev-parse HEAD && cat README.md && git status --porcelain")
			if err != nil || res.stdout != old+"\nhello\n" {
				t.Errorf("sandbox at base_commit holds %q (%v), want %s and the old README", res.stdout, err, old)
			}

			// A commit the repository never had: the environment's base.
			missing := strings.Repeat("ab", 20)
			acq2, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/b", WorkKey: "b", Repository: e.repo, BaseCommit: missing})
			if err != nil {
				t.Fatalf("acquire at a missing commit: %v, want the environment's base", err)
			}
			if got := acq2.GetSandbox().GetBaseCommit(); got != head {
				t.Errorf("acquire at a missing commit starts at %s, want the repository's HEAD %s", got, head)
			}

			_, err = e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/c", WorkKey: "c", BaseCommit: "main"})
			wantCode(t, err, codes.InvalidArgument, "base_commit")
		})
	}
}
