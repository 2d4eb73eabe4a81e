package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/cli/client"
	"github.com/hangar-dev/hangar/cli/command"
	"github.com/hangar-dev/hangar/cli/up"
)

// sandboxStack is a running hangar for the sandbox tests: the environment
// a CLI invocation sees and a client of the front door.
type sandboxStack struct {
	env    map[string]string
	client sandboxv1.SandboxServiceClient
}

// sandboxStart runs the whole stack in-process (embedded Redis, every
// address a free loopback port, a fresh data directory) until the test ends.
func sandboxStart(t testing.TB) *sandboxStack {
	t.Helper()
	var cfg up.Config
	cfg.Home, cfg.Addr, cfg.LogLevel, cfg.LogFormat = filepath.Join(t.TempDir(), "hangar"), "127.0.0.1:0", "error", "text"
	vars := map[string]string{
		"HANGAR_SESSION_ADDR": "127.0.0.1:0", "HANGAR_SANDBOX_ADDR": "127.0.0.1:0", "HANGAR_CHECKPOINT_ADDR": "127.0.0.1:0",
		"HANGAR_GATEWAY_ADDR": "127.0.0.1:0", "HANGAR_REPLAY_ADDR": "127.0.0.1:0",
	}
	ctx, cancel := context.WithCancel(context.Background())
	stack, err := up.Start(ctx, cfg, sandboxLookup(vars), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		cancel()
		t.Fatalf("starting hangar: %v", err)
	}
	ep := client.Endpoint{URL: stack.URL, Token: stack.Token}
	conn, err := ep.Dial()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := stack.Wait(); err != nil {
			t.Errorf("hangar stopped with %v", err)
		}
	})
	return &sandboxStack{
		env:    map[string]string{"HANGAR_URL": stack.URL, "HANGAR_TOKEN": stack.Token, "HANGAR_HOME": filepath.Join(t.TempDir(), "client")},
		client: sandboxv1.NewSandboxServiceClient(conn),
	}
}

func sandboxLookup(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

// sandboxRun runs `hangar args...` with stdin against the stack.
func (s *sandboxStack) run(t testing.TB, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = command.Execute(context.Background(), command.Streams{In: strings.NewReader(stdin), Out: &out, Err: &errOut}, args, sandboxLookup(s.env))
	return out.String(), errOut.String(), err
}

// sandboxRepo makes a git repository with files and returns its path.
func sandboxRepo(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "-A"}, {"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "init"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	return dir
}

// sandboxApply writes an environment file and applies it with the CLI.
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

// sandboxAcquire leases a sandbox through the front door.
func (s *sandboxStack) acquire(t testing.TB, env string) *sandboxv1.AcquireSandboxResponse {
	t.Helper()
	resp, err := s.client.AcquireSandbox(context.Background(), &sandboxv1.AcquireSandboxRequest{Environment: env, Holder: "e2e/" + t.Name(), TtlSeconds: 600})
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
