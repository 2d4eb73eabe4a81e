package sessions

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/harness"
	"github.com/hangar-dev/hangar/session-svc/internal/harnesslock"
)

// environmentsOf answers GetEnvironment from a map of environment name to
// driver; the rest of the sandbox service is not called here.
type environmentsOf struct {
	sandboxv1.SandboxServiceClient
	drivers map[string]string
}

func (e environmentsOf) GetEnvironment(_ context.Context, req *sandboxv1.GetEnvironmentRequest, _ ...grpc.CallOption) (*sandboxv1.GetEnvironmentResponse, error) {
	d, ok := e.drivers[req.GetName()]
	if !ok {
		return nil, fault.NotFound("ENVIRONMENT_NOT_FOUND", "no environment %q", req.GetName())
	}
	return &sandboxv1.GetEnvironmentResponse{Environment: &sandboxv1.Environment{Name: req.GetName(), Driver: d}}, nil
}

type noLocks struct{}

func (noLocks) Get(context.Context, string) (harnesslock.Lock, error)    { return harnesslock.Lock{}, nil }
func (noLocks) List(context.Context) ([]harnesslock.Lock, string, error) { return nil, "", nil }

type hostCLI struct{ line, path string }

func (h hostCLI) Version(context.Context, harness.Name) (string, string) { return h.line, h.path }

// A thaw checks the CLI version on this host only where the sandboxes see
// it (the local driver); an environment of pods leaves the check to turn
// 1 in the sandbox, which then fails on a difference whatever the drift
// mode.
func TestThawCLICheckFollowsTheDriver(t *testing.T) {
	m := &Manager{d: Deps{
		Sandboxes: environmentsOf{drivers: map[string]string{"local": "", "laptop": "local", "pods": "kubernetes"}},
		CLIs:      hostCLI{line: "2.0.1 (Claude Code)", path: "/usr/bin/claude"},
		Locks:     noLocks{},
	}}
	lock := harnesslock.Lock{Name: "team", Revision: 3, Harness: "claude", CLIVersion: "2.1.332"}
	for _, env := range []string{"", "local", "laptop", "missing"} {
		err := m.checkCLIVersion(context.Background(), lock, env)
		if fault.ReasonOf(err) != "HARNESS_CLI_VERSION" || !strings.Contains(err.Error(), "the sandboxes run 2.0.1") {
			t.Errorf("environment %q: thaw check = %v, want HARNESS_CLI_VERSION naming the host's 2.0.1", env, err)
		}
	}
	if err := m.checkCLIVersion(context.Background(), lock, "pods"); err != nil {
		t.Errorf("environment of pods: the host's CLI was checked: %v", err)
	}
	if m.sandboxesOnHost(context.Background(), "pods") {
		t.Error("pods counted as on the host: turn 1 would not enforce the lock's CLI version")
	}
	dc := &driftCheck{lock: lock, cliVersions: []string{"2.0.1 (Claude Code)"}, inSandbox: true}
	if d := dc.cliDrift(); len(d) != 1 || d[0].Actual != "2.0.1" {
		t.Errorf("turn 1's CLI drift = %+v", d)
	}
}
