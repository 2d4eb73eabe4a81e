package e2e_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/cli/command"
)

// sandboxStack is a running hangar for the sandbox tests.
type sandboxStack struct{ *stack }

// sandboxStart runs the whole stack in-process until the test ends.
func sandboxStart(t testing.TB) *sandboxStack {
	t.Helper()
	return &sandboxStack{startStack(t, stackOptions{})}
}

// apply writes an environment file and applies it with the CLI.
func (s *sandboxStack) apply(t testing.TB, content string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "env.yaml")
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := s.run(t, "", "env", "apply", "-f", file)
	if err != nil {
		t.Fatalf("env apply: %v\n%s", err, errOut)
	}
	return out
}

// acquire leases a sandbox through the front door.
func (s *sandboxStack) acquire(t testing.TB, env string) *sandboxv1.AcquireSandboxResponse {
	t.Helper()
	resp, err := s.sandboxes.AcquireSandbox(context.Background(), &sandboxv1.AcquireSandboxRequest{Environment: env, Holder: "e2e/" + t.Name(), TtlSeconds: 600})
	if err != nil {
		t.Fatalf("AcquireSandbox(%s): %v", env, err)
	}
	return resp
}

// sandboxExitCode is the code of a command.ExitError, or -1.
func sandboxExitCode(err error) int {
	var e *command.ExitError
	if errors.As(err, &e) {
		return e.Code
	}
	return -1
}
