package e2e_test

// kill -9 of `hangar up` leaves the sandboxes' files behind: the next start
// revives them, and each session whose record names one is checkpointed
// from it before it goes, so what was written after the last turn survives
// a crash too.

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// TestKillRecoversLeftoverWork: files written in two sessions' sandboxes
// after their last turn are in their patch and their restored trees after
// hangar up is killed with SIGKILL and started again, and get says the
// work was recovered from the sandbox left behind. No revived sandbox
// stays once its session took it.
func TestKillRecoversLeftoverWork(t *testing.T) {
	dir := os.Getenv("HANGAR_HARNESS_DIR")
	if dir == "" {
		t.Skip("HANGAR_HARNESS_DIR is unset: run .ci/install-harnesses and set it to use the real agent CLIs")
	}
	script := scripted.Script{
		Rules: append([]scripted.Rule{
			{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Finished."}},
		}, shellRules("quick task", "echo quick > turn.txt")...),
		Default: &scripted.Answer{Text: "OK."},
	}
	upstream, err := scripted.New(script)
	if err != nil {
		t.Fatal(err)
	}
	model := httptest.NewServer(upstream)
	t.Cleanup(model.Close)
	h := newHangarProcess(t,
		"HANGAR_ANTHROPIC_URL="+model.URL, "HANGAR_ANTHROPIC_API_KEY=upstream-key",
		"HANGAR_CLAUDE_BIN="+filepath.Join(dir, harnessClaude))
	h.start(t)
	h.applyEnvironment(t, "e2e", gitRepo(t, map[string]string{"README.md": "base\n"}), 0, sandboxv1.Egress_EGRESS_FULL)

	ctx := context.Background()
	names := []string{"crashed-a", "crashed-b"}
	for _, name := range names {
		if _, err := h.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
			Name: name, Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Do the quick task.",
		}); err != nil {
			t.Fatal(err)
		}
		if turn := h.waitTurn(t, name, 1); turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
			t.Fatalf("%s: turn 1: %v (%s)", name, turn.GetOutcome(), turn.GetOutcomeReason())
		}
		// After the last turn (and its checkpoint): only the sandbox has it.
		h.mustExec(t, h.get(t, name).GetSandboxId(), "mkdir -p notes && printf 'late work of "+name+"\\n' > notes/late.txt")
	}

	h.stop(t, syscall.SIGKILL)
	h.start(t)

	for _, name := range names {
		var s *sessionv1.Session
		deadline := time.Now().Add(2 * time.Minute)
		for s = h.get(t, name); s.GetState() != sessionv1.SessionState_SESSION_STATE_SUSPENDED; s = h.get(t, name) {
			if time.Now().After(deadline) {
				t.Fatalf("%s after kill -9 and a start: %v (%s), want suspended", name, s.GetState(), s.GetStateReason())
			}
			<-time.After(50 * time.Millisecond)
		}
		if r := s.GetStateReason(); !strings.Contains(r, "recovered") || !strings.Contains(r, "left in its sandbox") {
			t.Errorf("%s: state reason %q does not say the work left in its sandbox was recovered", name, r)
		}
		patch, err := h.sessions.GetSessionPatch(ctx, &sessionv1.GetSessionPatchRequest{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(patch.GetPatch(), "late work of "+name) || !strings.Contains(patch.GetPatch(), "quick") {
			t.Errorf("%s: the patch after kill -9 lacks the work of the turn or after it:\n%s", name, patch.GetPatch())
		}
		if _, err := h.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name}); err != nil {
			t.Fatalf("open %s after kill -9: %v", name, err)
		}
		if out := h.mustExec(t, h.get(t, name).GetSandboxId(), "cat notes/late.txt turn.txt"); out != "late work of "+name+"\nquick\n" {
			t.Errorf("%s: the restored tree's files = %q", name, out)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		ls, err := h.sandboxes.ListSandboxes(ctx, &sandboxv1.ListSandboxesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, sb := range ls.GetSandboxes() {
			if sb.GetLease().GetHolder() == "sandbox-svc/leftover" {
				left = append(left, sb.GetId())
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("revived sandboxes still there after their sessions took them: %v", left)
		}
		<-time.After(50 * time.Millisecond)
	}
}
