package e2e_test

import (
	"context"
	"testing"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// TestTurnEndsItsRun: a turn's gateway run has ended by the time the
// turn's end can be read (it ends alongside the after-turn checkpoint, off
// the turn's path), for a first turn and for a turn that resumed a
// suspended session.
func TestTurnEndsItsRun(t *testing.T) {
	s := sessionMoreStart(t, nil, true)
	ctx := context.Background()
	ended := func(turn *sessionv1.Turn) {
		t.Helper()
		if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
			t.Fatalf("turn %d: %v (%s)", turn.GetNumber(), turn.GetOutcome(), turn.GetOutcomeReason())
		}
		run, err := s.gateway.GetRun(ctx, &gatewayv1.GetRunRequest{Run: turn.GetRunId()})
		if err != nil {
			t.Fatalf("run %q of turn %d: %v", turn.GetRunId(), turn.GetNumber(), err)
		}
		if got := run.GetRun().GetState(); got != gatewayv1.RunState_RUN_STATE_ENDED {
			t.Fatalf("run of turn %d is %v once the turn ended, want ended", turn.GetNumber(), got)
		}
	}
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
		Name: "runs", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Say OK.",
	}); err != nil {
		t.Fatal(err)
	}
	ended(s.waitTurn(t, "runs", 1))
	if _, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: "runs"}); err != nil {
		t.Fatal(err)
	}
	ended(s.send(t, "runs", sessionv1.Harness_HARNESS_CLAUDE, "Say OK."))
}
