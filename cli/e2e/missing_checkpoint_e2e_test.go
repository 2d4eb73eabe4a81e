package e2e_test

import (
	"context"
	"strings"
	"testing"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/platform/fault"
)

// TestDeletedNewestCheckpoint: a suspended session whose newest checkpoint
// was deleted is not resumed from the older one (that would silently lose
// the work after it): the resume fails saying which checkpoint is missing
// and what can be restored, and `get` lists the missing one.
func TestDeletedNewestCheckpoint(t *testing.T) {
	s := sessionE2EStart(t)
	ctx := context.Background()
	const name = "lost-newest"
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
		Name: name, Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Please do the first task.",
	}); err != nil {
		t.Fatalf("new: %v", err)
	}
	first := s.waitTurn(t, name, 1)
	if first.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED || first.GetCheckpointId() == "" {
		t.Fatalf("turn 1: %v (%s), checkpoint %q", first.GetOutcome(), first.GetOutcomeReason(), first.GetCheckpointId())
	}
	s.mustExec(t, s.get(t, name).GetSandboxId(), `echo "written after the turn" > after.txt`)
	if _, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: name}); err != nil {
		t.Fatalf("suspend: %v", err)
	}
	cps := s.get(t, name).GetCheckpoints()
	if len(cps) < 2 || cps[0].GetId() == first.GetCheckpointId() || cps[0].GetReason() != "suspend" {
		t.Fatalf("checkpoints after suspend: %v", cps)
	}
	newest := cps[0].GetId()
	if _, err := s.checkpoints.DeleteCheckpoint(ctx, &checkpointv1.DeleteCheckpointRequest{CheckpointId: newest}); err != nil {
		t.Fatalf("delete the newest: %v", err)
	}

	// The resume fails, naming the missing checkpoint and the restorable one.
	reason := ""
	if _, err := s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: name, Message: "Now the second task."}); err != nil {
		if fault.ReasonOf(err) != "CHECKPOINT_MISSING" {
			t.Fatalf("send: %v", err)
		}
		reason = err.Error()
	} else {
		second := s.waitTurn(t, name, 2)
		if second.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_FAILED {
			t.Fatalf("turn 2 ran from the older checkpoint: %v (%s)", second.GetOutcome(), second.GetOutcomeReason())
		}
		reason = second.GetOutcomeReason()
	}
	for _, want := range []string{newest + " is missing", "restored from: " + first.GetCheckpointId()} {
		if !strings.Contains(reason, want) {
			t.Errorf("the failure %q does not say %q", reason, want)
		}
	}
	got := s.get(t, name)
	t.Logf("state %v (%s); the failure: %s", got.GetState(), got.GetStateReason(), reason)
	if got.GetSandboxId() != "" {
		t.Errorf("a sandbox %s was booted for the session", got.GetSandboxId())
	}
	if len(got.GetCheckpoints()) == 0 || got.GetCheckpoints()[0].GetId() != newest || !strings.HasPrefix(got.GetCheckpoints()[0].GetDamaged(), "missing") {
		t.Errorf("get does not list the missing checkpoint first: %v", got.GetCheckpoints())
	}
	out, _, err := s.run(t, "", "session", "get", name)
	if err != nil || !strings.Contains(out, "DAMAGED") || !strings.Contains(out, "damaged ("+newest+"): missing") {
		t.Errorf("session get: %v\n%s", err, out)
	}
}
