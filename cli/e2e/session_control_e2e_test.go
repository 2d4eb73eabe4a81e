package e2e_test

// Steering, interrupting and budgets of a running turn, with the real Claude
// Code through the real gateway.

import (
	"context"
	"strings"
	"testing"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// controlWaitCmd holds a turn in its tool call until the test creates
// release.flag: the turn is running for as long as the test needs.
const controlWaitCmd = `touch waiting.flag; while [ ! -f release.flag ]; do sleep 0.05; done; echo released`

func controlStart(t *testing.T) *stack {
	t.Helper()
	script := scripted.Script{
		Rules: append([]scripted.Rule{
			{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Finished."}},
		}, append(shellRules("long task", controlWaitCmd), shellRules("quick task", "echo quick")...)...),
		Default: &scripted.Answer{Text: "OK."},
	}
	s := startStack(t, stackOptions{script: &script})
	s.applyEnvironment(t, "e2e", gitRepo(t, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	return s
}

// controlWaitRunning waits until the session's turn is inside its tool call
// and returns the session's sandbox.
func controlWaitRunning(t *testing.T, s *stack, name string) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if id := s.get(t, name).GetSandboxId(); id != "" {
			if _, code := s.exec(t, id, "test -f waiting.flag"); code == 0 {
				return id
			}
		}
		<-time.After(20 * time.Millisecond)
	}
	t.Fatalf("the turn of %s never reached its tool call", name)
	return ""
}

// TestSessionSteer: a message steered into a running turn reaches the
// agent's next model request.
func TestSessionSteer(t *testing.T) {
	s := controlStart(t)
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
		Name: "steered", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Do the long task.",
	}); err != nil {
		t.Fatal(err)
	}
	sandbox := controlWaitRunning(t, s, "steered")
	if _, err := s.sessions.SteerTurn(ctx, &sessionv1.SteerTurnRequest{Name: "steered", Message: "Also mention purple."}); err != nil {
		t.Fatalf("steer: %v", err)
	}
	s.mustExec(t, sandbox, "touch release.flag")
	turn := s.waitTurn(t, "steered", 1)
	if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("turn: %v (%s)", turn.GetOutcome(), turn.GetOutcomeReason())
	}
	tape, err := s.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: turn.GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	var injected []string
	for _, step := range tape.GetSteps() {
		// The tape keeps the request as the agent sent it and what the
		// gateway added to it (the data plane's tests check it went upstream).
		if step.GetInjected() != "" {
			injected = append(injected, step.GetInjected())
		}
	}
	if len(injected) != 1 || !strings.Contains(injected[0], "Also mention purple.") {
		t.Errorf("steered text on the tape: %q, want it once", injected)
	}

	// Steering a session with no running turn is refused.
	if _, err := s.sessions.SteerTurn(ctx, &sessionv1.SteerTurnRequest{Name: "steered", Message: "late"}); err == nil {
		t.Error("steer without a running turn succeeded")
	}
}

// TestSessionInterrupt: an interrupt stops the running turn (outcome
// interrupted, still checkpointed); with a message the next turn starts.
func TestSessionInterrupt(t *testing.T) {
	s := controlStart(t)
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
		Name: "stopped", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Do the long task.",
	}); err != nil {
		t.Fatal(err)
	}
	controlWaitRunning(t, s, "stopped")
	resp, err := s.sessions.InterruptTurn(ctx, &sessionv1.InterruptTurnRequest{Name: "stopped", Message: "Now the quick task."})
	if err != nil {
		t.Fatalf("interrupt: %v", err)
	}
	if resp.GetTurn().GetNumber() != 2 {
		t.Fatalf("interrupt with a message started turn %d, want 2", resp.GetTurn().GetNumber())
	}
	first := s.waitTurn(t, "stopped", 1)
	if first.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_INTERRUPTED || first.GetCheckpointId() == "" {
		t.Errorf("turn 1: %v (%s), checkpoint %q; want interrupted and checkpointed", first.GetOutcome(), first.GetOutcomeReason(), first.GetCheckpointId())
	}
	second := s.waitTurn(t, "stopped", 2)
	if second.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Errorf("turn 2: %v (%s)", second.GetOutcome(), second.GetOutcomeReason())
	}
}

// TestSessionOverBudget: a turn that crosses its token budget ends
// over_budget, and the session can go on.
func TestSessionOverBudget(t *testing.T) {
	s := controlStart(t)
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
		Name: "thrifty", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Do the quick task.",
		Budget: &sessionv1.Budget{MaxTokens: 1},
	}); err != nil {
		t.Fatal(err)
	}
	turn := s.waitTurn(t, "thrifty", 1)
	if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_OVER_BUDGET || turn.GetOutcomeReason() == "" {
		t.Fatalf("turn: %v (%q), want over_budget with a reason", turn.GetOutcome(), turn.GetOutcomeReason())
	}
	if sess := s.get(t, "thrifty"); sess.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE {
		t.Errorf("after an over-budget turn the session is %v, want idle", sess.GetState())
	}
	if _, err := s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{
		Name: "thrifty", Message: "Do the quick task.", Budget: &sessionv1.Budget{MaxTokens: 10_000_000},
	}); err != nil {
		t.Fatal(err)
	}
	if next := s.waitTurn(t, "thrifty", 2); next.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Errorf("turn 2 with a budget: %v (%s)", next.GetOutcome(), next.GetOutcomeReason())
	}
}
