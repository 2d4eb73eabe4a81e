package e2e_test

// hangar itself stops and starts again under live sessions: a graceful stop
// (Ctrl-C) ends running turns interrupted and checkpointed and suspends
// every session that is up, so nothing written before the stop is lost and
// every session resumes after the start.

import (
	"context"
	"strings"
	"testing"
	"time"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
	sessionapp "github.com/hangar-dev/hangar/session-svc/app"
)

// TestRestartSuspendsOpenSessions: a file written in an open session's
// sandbox after its last checkpoint survives a graceful restart: the
// session is suspended with a checkpoint holding it, says why, and opens
// again with the file in place.
func TestRestartSuspendsOpenSessions(t *testing.T) {
	s := startStack(t, stackOptions{})
	s.applyEnvironment(t, "e2e", gitRepo(t, map[string]string{"README.md": "base\n"}), 0, sandboxv1.Egress_EGRESS_FULL)
	ctx := context.Background()
	for _, name := range []string{"kept-a", "kept-b"} {
		if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: name, Environment: "e2e"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name}); err != nil {
			t.Fatal(err)
		}
		s.mustExec(t, s.get(t, name).GetSandboxId(), "printf 'late work of "+name+"\\n' > late.txt")
	}

	s = s.restart(t)

	for _, name := range []string{"kept-a", "kept-b"} {
		got := s.get(t, name)
		if got.GetState() != sessionv1.SessionState_SESSION_STATE_SUSPENDED || got.GetSandboxId() != "" {
			t.Fatalf("%s after a restart: %v in %q, want suspended without a sandbox", name, got.GetState(), got.GetSandboxId())
		}
		if !strings.Contains(got.GetStateReason(), "shut down") {
			t.Errorf("%s: state reason %q does not say hangar shut down", name, got.GetStateReason())
		}
		patch, err := s.sessions.GetSessionPatch(ctx, &sessionv1.GetSessionPatchRequest{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(patch.GetPatch(), "late work of "+name) {
			t.Errorf("%s: the patch after a restart lacks the file written before it:\n%s", name, patch.GetPatch())
		}
		if _, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name}); err != nil {
			t.Fatalf("open %s after a restart: %v", name, err)
		}
		if out := s.mustExec(t, s.get(t, name).GetSandboxId(), "cat late.txt"); out != "late work of "+name+"\n" {
			t.Errorf("%s: late.txt after resume = %q", name, out)
		}
	}
}

// TestRestartInterruptsRunningTurn: a turn running when hangar stops ends
// interrupted, checkpointed, with the reason; the session is suspended and
// the next message resumes the conversation.
func TestRestartInterruptsRunningTurn(t *testing.T) {
	s := controlStart(t)
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
		Name: "midturn", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Do the long task.",
	}); err != nil {
		t.Fatal(err)
	}
	sandbox := controlWaitRunning(t, s, "midturn")
	s.mustExec(t, sandbox, "printf 'written mid-turn\\n' > midturn.txt")

	s = s.restart(t)

	first := s.waitTurn(t, "midturn", 1)
	if first.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_INTERRUPTED || first.GetCheckpointId() == "" {
		t.Fatalf("turn 1 after a restart: %v (%s), checkpoint %q; want interrupted and checkpointed", first.GetOutcome(), first.GetOutcomeReason(), first.GetCheckpointId())
	}
	if !strings.Contains(first.GetOutcomeReason(), "shut down") {
		t.Errorf("turn 1's reason %q does not say hangar shut down", first.GetOutcomeReason())
	}
	if got := s.get(t, "midturn"); got.GetState() != sessionv1.SessionState_SESSION_STATE_SUSPENDED {
		t.Fatalf("session after a restart: %v (%s), want suspended", got.GetState(), got.GetStateReason())
	}
	if _, err := s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: "midturn", Message: "Now the quick task."}); err != nil {
		t.Fatalf("send after a restart: %v", err)
	}
	second := s.waitTurn(t, "midturn", 2)
	if second.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("turn 2 after a restart: %v (%s)", second.GetOutcome(), second.GetOutcomeReason())
	}
	if out := s.mustExec(t, s.get(t, "midturn").GetSandboxId(), "cat midturn.txt"); out != "written mid-turn\n" {
		t.Errorf("midturn.txt after resume = %q", out)
	}
}

// TestPeriodicCheckpointDuringTurn: a session whose turn runs is still
// checkpointed every HANGAR_SESSION_CHECKPOINT_MINUTES, with what the
// agent has written so far.
func TestPeriodicCheckpointDuringTurn(t *testing.T) {
	script := scripted.Script{
		Rules: append([]scripted.Rule{
			{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Finished."}},
		}, shellRules("long task", controlWaitCmd)...),
		Default: &scripted.Answer{Text: "OK."},
	}
	clock := &sessionMoreClock{now: time.Now(), tick: make(chan time.Time)}
	s := startStack(t, stackOptions{script: &script, clock: sessionapp.Clock{Now: clock.Now, Tick: clock.tick}})
	s.applyEnvironment(t, "e2e", gitRepo(t, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
		Name: "long-turn", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Do the long task.",
	}); err != nil {
		t.Fatal(err)
	}
	sandbox := controlWaitRunning(t, s, "long-turn")
	s.mustExec(t, sandbox, "printf 'an hour of work\\n' > progress.txt")
	clock.advance(11 * time.Minute)
	clock.sweep(t)

	cps, err := s.checkpoints.ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: "long-turn"})
	if err != nil {
		t.Fatal(err)
	}
	if len(cps.GetCheckpoints()) == 0 || cps.GetCheckpoints()[0].GetReason() != checkpointv1.CheckpointReason_CHECKPOINT_REASON_PERIODIC {
		t.Fatalf("checkpoints while the turn runs: %v, want a periodic one", cps.GetCheckpoints())
	}
	patch, err := s.checkpoints.GetCheckpointPatch(ctx, &checkpointv1.GetCheckpointPatchRequest{CheckpointId: cps.GetCheckpoints()[0].GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(patch.GetPatch(), "an hour of work") {
		t.Errorf("the periodic checkpoint lacks the work written during the turn:\n%s", patch.GetPatch())
	}
	if got := s.get(t, "long-turn").GetState(); got != sessionv1.SessionState_SESSION_STATE_RUNNING {
		t.Errorf("session during the periodic checkpoint: %v, want running", got)
	}
	s.mustExec(t, sandbox, "touch release.flag")
	if turn := s.waitTurn(t, "long-turn", 1); turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("turn: %v (%s)", turn.GetOutcome(), turn.GetOutcomeReason())
	}
}
