package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
)

// TestSandboxCLI drives `hangar env` and `hangar sb` against the whole
// stack: apply an environment made from a test repository, lease a sandbox
// through the front door, list it, exec with stdin and an exit code, attach
// a terminal with piped input, and the one-line errors for unknown names.
func TestSandboxCLI(t *testing.T) {
	s := sandboxStart(t)
	repo := gitRepo(t, map[string]string{"README.md": "hello from the repo\n"})
	spec := fmt.Sprintf("name: e2e\nrepository: %s\nbase_ref: main\nenv:\n  GREETING: hi\negress: full\n", repo)

	if out := s.apply(t, spec); out != "environment e2e created\n" {
		t.Errorf("first apply printed %q", out)
	}
	if out := s.apply(t, spec+"setup:\n  - touch made-by-setup\n"); out != "environment e2e updated\n" {
		t.Errorf("second apply printed %q", out)
	}
	out, _, err := s.run(t, "", "env", "list")
	if err != nil || !strings.Contains(out, "e2e") || !strings.Contains(out, repo) || !strings.Contains(out, "local") {
		t.Errorf("env list: %v\n%s", err, out)
	}
	out, _, err = s.run(t, "", "env", "get", "e2e")
	for _, want := range []string{"name: e2e", "repository: " + repo, "egress: full", "- touch made-by-setup", "GREETING: hi"} {
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("env get e2e: %v, want %q in\n%s", err, want, out)
		}
	}

	acq := s.acquire(t, "e2e")
	id := acq.GetSandbox().GetId()

	t.Run("list", func(t *testing.T) {
		out, _, err := s.run(t, "", "sb", "list")
		if err != nil {
			t.Fatal(err)
		}
		var row string
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, id+" ") {
				row = line
			}
		}
		for _, want := range []string{"e2e", "leased", "e2e/TestSandboxCLI", acq.GetSandbox().GetWorkDir()} {
			if !strings.Contains(row, want) {
				t.Errorf("sb list row for %s lacks %q:\n%s", id, want, out)
			}
		}
		if !strings.HasPrefix(out, "ID") || !strings.Contains(out, "LEASE EXPIRES") {
			t.Errorf("sb list header:\n%s", out)
		}
	})

	t.Run("exec", func(t *testing.T) {
		stdout, stderr, err := s.run(t, "piped input\n", "sb", "exec", id, "--", "sh", "-c", `cat; cat README.md made-by-setup; echo "$GREETING" >&2; exit 7`)
		if code := sandboxExitCode(err); code != 7 {
			t.Errorf("exit code %d (%v), want 7", code, err)
		}
		if stdout != "piped input\nhello from the repo\n" || stderr != "hi\n" {
			t.Errorf("stdout %q stderr %q", stdout, stderr)
		}
		stdout, _, err = s.run(t, "", "sb", "exec", id, "--cwd", ".", "--env", "X=1", "--", "sh", "-c", "echo $X")
		if err != nil || stdout != "1\n" {
			t.Errorf("exec with env: %q %v", stdout, err)
		}
		// A missing binary is the command's failure, not the CLI's.
		_, stderr, err = s.run(t, "", "sb", "exec", id, "--", "no-such-binary-here")
		if code := sandboxExitCode(err); code != 127 || !strings.Contains(stderr, "no-such-binary-here") {
			t.Errorf("missing binary: code %d (%v) stderr %q, want 127", code, err, stderr)
		}
	})

	t.Run("attach", func(t *testing.T) {
		// Piped input is typed into the pty; its end is Ctrl-D.
		stdout, _, err := s.run(t, "echo pty-''works\nexit 3\n", "sb", "attach", id)
		if code := sandboxExitCode(err); code != 3 {
			t.Errorf("attach exit %d (%v), want 3; output %q", code, err, stdout)
		}
		if !strings.Contains(stdout, "pty-works") {
			t.Errorf("attach output lacks the echo: %q", stdout)
		}
		stdout, _, err = s.run(t, "abc\n", "sb", "attach", id, "--", "sh", "-c", `read x; echo "got:$x"; test -t 0`)
		if err != nil || !strings.Contains(stdout, "got:abc") {
			t.Errorf("attach a command: %v %q", err, stdout)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"sb", "exec", "sb-nope", "--", "true"}, `"sb-nope"`},
			{[]string{"sb", "attach", "sb-nope"}, `"sb-nope"`},
			{[]string{"env", "get", "nope"}, `"nope"`},
			{[]string{"sb", "list", "-e", "nope"}, `"nope"`},
			{[]string{"sb", "exec", id}, "usage"},
		} {
			_, _, err := s.run(t, "", tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("hangar %v: %v, want one line containing %s", tc.args, err, tc.want)
			}
		}
		file := filepath.Join(t.TempDir(), "bad.yaml")
		if err := os.WriteFile(file, []byte("name: e2e\nrepo: typo\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := s.run(t, "", "env", "apply", "-f", file)
		if err == nil || !strings.Contains(err.Error(), "repo") || strings.Contains(err.Error(), "\n") {
			t.Errorf("apply of a file with an unknown field: %v, want one line naming it", err)
		}
	})

	// The lease ends: the sandbox is destroyed and disappears from the list.
	if _, err := s.sandboxes.ReleaseSandbox(context.Background(), &sandboxv1.ReleaseSandboxRequest{SandboxId: id, FencingToken: acq.GetLease().GetFencingToken()}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _, err := s.run(t, "", "sb", "list")
		if err == nil && !strings.Contains(out, id) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("released sandbox still listed:\n%s", out)
		}
	}
}

// TestSandboxEgressNone: in an environment with egress none, a connect to a
// non-loopback address fails fast inside the sandbox while a server on the
// sandbox's own loopback is reachable.
func TestSandboxEgressNone(t *testing.T) {
	s := sandboxStart(t)
	repo := gitRepo(t, map[string]string{"README.md": "x\n"})
	s.apply(t, fmt.Sprintf(`{"name": "sealed", "repository": %q, "egress": "none"}`, repo))
	acq := s.acquire(t, "sealed")
	id := acq.GetSandbox().GetId()

	start := time.Now()
	_, stderr, err := s.run(t, "", "sb", "exec", id, "--", "curl", "-sS", "-m", "20", "http://10.255.255.1/")
	if sandboxExitCode(err) <= 0 {
		t.Errorf("curl to a non-loopback address under egress none: %v (stderr %q), want a failure", err, stderr)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("curl took %v to fail, want fast", el)
	}
	stdout, stderr, err := s.run(t, "", "sb", "exec", id, "--", "python3", "-c", `import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
c = socket.create_connection(s.getsockname(), timeout=5)
a, _ = s.accept(); a.sendall(b"loopback-ok"); a.close()
print(c.recv(64).decode())`)
	if err != nil || strings.TrimSpace(stdout) != "loopback-ok" {
		t.Errorf("loopback inside the sandbox: %v %q %q", err, stdout, stderr)
	}
}
