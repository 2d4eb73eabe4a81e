package e2e_test

// The `hangar session` CLI against the real stack (`hangar up` in-process):
// sessions without turns, so no agent CLI is needed.

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/platform/apijson"
)

// sessionCLIStack is a running hangar; repo is the repository of its
// "e2e" environment.
type sessionCLIStack struct {
	*stack
	repo string
}

func sessionCLIStart(t *testing.T) *sessionCLIStack {
	t.Helper()
	s := &sessionCLIStack{stack: startStack(t, stackOptions{}), repo: gitRepo(t, nil)}
	s.applyEnvironment(t, "e2e", s.repo, 0, sandboxv1.Egress_EGRESS_UNSPECIFIED)
	return s
}

// ok runs a command that must succeed and returns its stdout.
func (s *sessionCLIStack) ok(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := s.run(t, "", args...)
	if err != nil {
		t.Fatalf("hangar %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// fails runs a command that must fail with one line containing want.
func (s *sessionCLIStack) fails(t *testing.T, want string, args ...string) {
	t.Helper()
	out, _, err := s.run(t, "", args...)
	if err == nil {
		t.Errorf("hangar %s succeeded, want an error containing %q:\n%s", strings.Join(args, " "), want, out)
		return
	}
	if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
		t.Errorf("hangar %s: error %q, want one line containing %q", strings.Join(args, " "), err, want)
	}
}

func sessionCLIGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func sessionCLIWant(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("%s does not show %q:\n%s", what, w, out)
		}
	}
}

// sessionCLIJSON is `session get NAME -o json`, parsed.
func (s *sessionCLIStack) getJSON(t *testing.T, name string) *sessionv1.Session {
	t.Helper()
	out := s.ok(t, "session", "get", name, "-o", "json")
	var sess sessionv1.Session
	if err := apijson.Unmarshal([]byte(out), &sess); err != nil {
		t.Fatalf("session get -o json is not a Session: %v\n%s", err, out)
	}
	return &sess
}

// TestSessionCLIWithoutTurns drives every read command and keep on sessions
// that never ran a turn, and the errors for bad names and unknown sessions.
func TestSessionCLIWithoutTurns(t *testing.T) {
	s := sessionCLIStart(t)

	sessionCLIWant(t, "an empty list", s.ok(t, "session", "list"), "no sessions yet")

	out := s.ok(t, "session", "new", "onb-1", "-e", "e2e")
	sessionCLIWant(t, "session new", out, "created session onb-1 on "+s.repo+" at ", " (environment e2e): claude, branch hangar/session/onb-1", "hangar session send onb-1 MESSAGE")
	out = s.ok(t, "session", "new", "second", "-e", "e2e", "--harness", "codex", "--idle", "45", "--branch", "feature/x", "--max-cost", "2.5")
	sessionCLIWant(t, "session new with flags", out, "created session second on "+s.repo+" at ", " (environment e2e): codex, branch feature/x")

	s.fails(t, `session "onb-1" already exists`, "session", "new", "onb-1", "-e", "e2e")
	s.fails(t, `session name "Bad_Name" must be a DNS label`, "session", "new", "Bad_Name", "-e", "e2e")
	s.fails(t, `"no-such-env"`, "session", "new", "other", "-e", "no-such-env")

	// Most recently active first: second was created last.
	out = s.ok(t, "session", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") || !strings.HasPrefix(lines[1], "second ") || !strings.HasPrefix(lines[2], "onb-1 ") {
		t.Errorf("session list, want a header, second, onb-1:\n%s", out)
	}
	sessionCLIWant(t, "session list", out, "LAST ACTIVE", "suspended", "codex", "e2e")

	out = s.ok(t, "session", "get", "onb-1")
	sessionCLIWant(t, "session get", out, "name         onb-1", "state        suspended: created", "environment  e2e",
		"branch       hangar/session/onb-1", "sandbox      none", "idle time    default", "usage        0 turns")
	got := s.getJSON(t, "second")
	if got.GetName() != "second" || got.GetHarness() != sessionv1.Harness_HARNESS_CODEX || got.GetIdleMinutes() != 45 || got.GetBudget().GetMaxCostUsd() != 2.5 || got.GetBranch() != "feature/x" {
		t.Errorf("session get -o json = %v", got)
	}

	sessionCLIWant(t, "session keep", s.ok(t, "session", "keep", "onb-1", "--idle", "240"), "session onb-1 suspends after 240m (4h) idle")
	if got := s.getJSON(t, "onb-1"); got.IdleMinutes == nil || got.GetIdleMinutes() != 240 {
		t.Errorf("after keep --idle 240: idle_minutes %v", got.IdleMinutes)
	}
	sessionCLIWant(t, "session keep --idle 0", s.ok(t, "session", "keep", "onb-1", "--idle", "0"), "session onb-1 stays up until you suspend it")
	if got := s.getJSON(t, "onb-1"); got.IdleMinutes == nil || got.GetIdleMinutes() != 0 {
		t.Errorf("after keep --idle 0: idle_minutes %v", got.IdleMinutes)
	}

	out, errOut, err := s.run(t, "", "session", "events", "onb-1")
	if err != nil || strings.Contains(out, "\n\n") {
		t.Errorf("session events: %v\n%s%s", err, out, errOut)
	}
	s.fails(t, `session "onb-1" has no turn 1: it has not run a turn yet`, "session", "events", "onb-1", "--turn", "1")

	out, errOut, err = s.run(t, "", "session", "patch", "onb-1")
	if err != nil || out != "" || !strings.Contains(errOut, "session onb-1 has no changes") {
		t.Errorf("session patch without turns: %v, stdout %q, stderr %q", err, out, errOut)
	}
	patchFile := filepath.Join(t.TempDir(), "onb.patch")
	sessionCLIWant(t, "session patch --to", s.ok(t, "session", "patch", "onb-1", "--to", patchFile), "wrote the patch of onb-1 (0 B")

	sessionCLIWant(t, "session artifacts", s.ok(t, "session", "artifacts", "onb-1"), "no artifacts")
	s.fails(t, "session onb-1 has no work to pull yet", "session", "pull", "onb-1", "-C", s.repo)

	for _, args := range [][]string{
		{"get", "nope"}, {"keep", "nope", "--idle", "5"}, {"events", "nope"}, {"patch", "nope"},
		{"artifacts", "nope"}, {"suspend", "nope"}, {"archive", "nope"}, {"open", "nope"}, {"send", "nope", "hi"},
	} {
		s.fails(t, `session "nope" does not exist`, append([]string{"session"}, args...)...)
	}
	for _, args := range [][]string{{"get", "Bad_Name"}, {"keep", "x-", "--idle", "1"}, {"events", "UPPER"}, {"patch", "a.b"}} {
		s.fails(t, "must be a DNS label", append([]string{"session"}, args...)...)
	}
	// Approvals may still be Unimplemented: whatever the server says, in one line.
	if out, _, err := s.run(t, "", "session", "approvals", "onb-1"); err != nil {
		if strings.Contains(err.Error(), "\n") || err.Error() == "" {
			t.Errorf("session approvals: %q, want the server's message in one line", err)
		}
	} else if !strings.Contains(out, "no tool calls wait") {
		t.Errorf("session approvals of a session without turns:\n%s", out)
	}
}

// TestSessionCLIOpenSuspendArchive opens a session (a sandbox boots, no
// agent runs), checks get, patch and pull on it, then suspends and archives
// it.
func TestSessionCLIOpenSuspendArchive(t *testing.T) {
	s := sessionCLIStart(t)
	s.ok(t, "session", "new", "opened", "-e", "e2e")

	out := s.ok(t, "session", "open", "opened")
	sessionCLIWant(t, "session open", out, "session opened is ", "hangar sb attach ")
	got := s.getJSON(t, "opened")
	if got.GetSandboxId() == "" {
		t.Fatalf("after open: no sandbox: %v", got)
	}
	sessionCLIWant(t, "session get of an open session", s.ok(t, "session", "get", "opened"), "sandbox      "+got.GetSandboxId())

	out, errOut, err := s.run(t, "", "session", "patch", "opened")
	if err != nil || out != "" || !strings.Contains(errOut, "has no changes (against base ") {
		t.Errorf("session patch of an open session without changes: %v, stdout %q, stderr %q", err, out, errOut)
	}

	local := t.TempDir()
	sessionCLIGit(t, local, "clone", "-q", s.repo, ".")
	out = s.ok(t, "session", "pull", "opened", "-C", local)
	sessionCLIWant(t, "session pull", out, "the session has no commits of its own")
	if base, branch := sessionCLIGit(t, s.repo, "rev-parse", "main"), sessionCLIGit(t, local, "rev-parse", "hangar/opened"); base != branch {
		t.Errorf("hangar/opened is at %s, want the base %s", branch, base)
	}

	sessionCLIWant(t, "session suspend", s.ok(t, "session", "suspend", "opened"), "session opened is suspended")
	if got := s.getJSON(t, "opened"); got.GetSandboxId() != "" || got.GetState() != sessionv1.SessionState_SESSION_STATE_SUSPENDED {
		t.Errorf("after suspend: state %v sandbox %q", got.GetState(), got.GetSandboxId())
	}
	sessionCLIWant(t, "session archive", s.ok(t, "session", "archive", "opened"), "session opened is archived")
	s.fails(t, "archived", "session", "send", "opened", "more work")
}
