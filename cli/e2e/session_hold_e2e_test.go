package e2e_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
)

// TestCommandHoldsSession: `hangar sb exec` on a session's sandbox holds the
// session open for the command's whole run, and releases it at the end.
func TestCommandHoldsSession(t *testing.T) {
	s := startStack(t, stackOptions{})
	s.applyEnvironment(t, "e2e", gitRepo(t, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "held", Environment: "e2e"}); err != nil {
		t.Fatal(err)
	}
	opened, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "held"})
	if err != nil {
		t.Fatal(err)
	}
	sandbox := opened.GetSession().GetSandboxId()

	done := make(chan error, 1)
	go func() {
		_, _, err := s.run(t, "", "sb", "exec", sandbox, "--", "sh", "-c", "touch started; while [ ! -f finish ]; do sleep 0.05; done")
		done <- err
	}()
	deadline := time.Now().Add(time.Minute)
	held := func() []*sessionv1.Hold { return s.get(t, "held").GetHolds() }
	for {
		if _, code := s.exec(t, sandbox, "test -f started"); code == 0 && len(held()) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no hold while sb exec runs: %v", held())
		}
		<-time.After(20 * time.Millisecond)
	}
	// The CLI's own hold, and the exec call itself (the sandbox service
	// reports it as a use).
	holds := held()
	if len(holds) != 2 || holds[0].GetKind() != sessionv1.HoldKind_HOLD_KIND_COMMAND || holds[1].GetKind() != sessionv1.HoldKind_HOLD_KIND_COMMAND {
		t.Fatalf("holds while sb exec runs: %v, want two command holds", holds)
	}
	if s.get(t, "held").GetSuspendAt() != nil {
		t.Error("a held session says when it will suspend")
	}
	s.mustExec(t, sandbox, "touch finish")
	if err := <-done; err != nil {
		t.Fatalf("sb exec: %v", err)
	}
	if h := held(); len(h) != 0 {
		t.Errorf("holds after sb exec ended: %v", h)
	}
}

// TestSandboxUseHoldsSession: a caller going straight to the sandbox API
// (a raw gRPC client, no CLI) holds the session open while its call runs:
// with the injected clock, a session whose exec (then terminal) runs past
// its idle time is not suspended; once the call has ended, it is.
func TestSandboxUseHoldsSession(t *testing.T) {
	clock := &sessionMoreClock{now: time.Now().UTC(), tick: make(chan time.Time)}
	s := sessionMoreStart(t, clock, false)
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "rawheld", Environment: "e2e"}); err != nil {
		t.Fatal(err)
	}
	opened, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "rawheld"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.sessions.KeepSession(ctx, &sessionv1.KeepSessionRequest{Name: "rawheld", IdleMinutes: 5}); err != nil {
		t.Fatal(err)
	}
	sandbox := opened.GetSession().GetSandboxId()
	waitHeldBy := func(owner string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			for _, h := range s.get(t, "rawheld").GetHolds() {
				if h.GetOwner() == owner {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no hold by %s: %v", owner, s.get(t, "rawheld").GetHolds())
			}
			<-time.After(20 * time.Millisecond)
		}
	}
	up := func(when string) {
		t.Helper()
		got := s.get(t, "rawheld")
		if got.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE || got.GetSandboxId() != sandbox || got.GetSuspendAt() != nil {
			t.Fatalf("%s: %v (%s), sandbox %q, suspend at %v; want idle on %s, held", when, got.GetState(), got.GetStateReason(), got.GetSandboxId(), got.GetSuspendAt(), sandbox)
		}
	}

	done := make(chan error, 1)
	go func() {
		var out bytes.Buffer
		_, err := sandboxexec.New(s.sandboxes).Exec(ctx, sandbox, 0, []string{"sh", "-c", "while [ ! -f finish ]; do sleep 0.05; done"}, nil, "", nil, &out, &out)
		done <- err
	}()
	waitHeldBy("sandbox/exec")
	clock.advance(10 * time.Minute)
	clock.sweep(t)
	up("an exec running 10 minutes into an idle time of 5")

	termCtx, endTerminal := context.WithCancel(ctx)
	term, err := s.sandboxes.AttachTerminal(termCtx)
	if err != nil {
		t.Fatal(err)
	}
	if err := term.Send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Open{Open: &sandboxv1.TerminalOpen{SandboxId: sandbox, Command: []string{"sh"}}}}); err != nil {
		t.Fatal(err)
	}
	waitHeldBy("sandbox/terminal")
	if _, err := s.sandboxes.WriteFile(ctx, &sandboxv1.WriteFileRequest{SandboxId: sandbox, Path: "finish", Content: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("exec: %v", err)
	}
	clock.advance(10 * time.Minute)
	clock.sweep(t)
	up("a terminal attached 10 minutes into an idle time of 5")

	endTerminal()
	deadline := time.Now().Add(time.Minute)
	for len(s.get(t, "rawheld").GetHolds()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("holds after the terminal detached: %v", s.get(t, "rawheld").GetHolds())
		}
		<-time.After(20 * time.Millisecond)
	}
	clock.sweep(t)
	if got := s.get(t, "rawheld"); got.GetState() != sessionv1.SessionState_SESSION_STATE_SUSPENDED {
		t.Fatalf("once nothing uses it: %v (%s), want suspended", got.GetState(), got.GetStateReason())
	}
}

// TestPeriodicCheckpoint: while a session is up, a checkpoint is taken every
// HANGAR_SESSION_CHECKPOINT_MINUTES (10) when something changed, and none
// when nothing did.
func TestPeriodicCheckpoint(t *testing.T) {
	clock := &sessionMoreClock{now: time.Now().UTC(), tick: make(chan time.Time)}
	s := sessionMoreStart(t, clock, false)
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "periodic", Environment: "e2e"}); err != nil {
		t.Fatal(err)
	}
	opened, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "periodic"})
	if err != nil {
		t.Fatal(err)
	}
	count := func() int {
		resp, err := s.checkpoints.ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: "periodic"})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range resp.GetCheckpoints() {
			if c.GetReason() != checkpointv1.CheckpointReason_CHECKPOINT_REASON_PERIODIC {
				t.Errorf("checkpoint %s has reason %v, want periodic", c.GetId(), c.GetReason())
			}
		}
		return len(resp.GetCheckpoints())
	}

	clock.sweep(t) // an up session with no checkpoint gets one
	if n := count(); n != 1 {
		t.Fatalf("after the first sweep: %d checkpoints, want 1", n)
	}
	s.mustExec(t, opened.GetSession().GetSandboxId(), "echo changed > notes.txt")
	clock.advance(5 * time.Minute)
	clock.sweep(t)
	if n := count(); n != 1 {
		t.Fatalf("5 minutes later: %d checkpoints, want still 1", n)
	}
	clock.advance(6 * time.Minute)
	clock.sweep(t)
	if n := count(); n != 2 {
		t.Fatalf("11 minutes after a change: %d checkpoints, want 2", n)
	}
	clock.advance(11 * time.Minute)
	clock.sweep(t)
	if n := count(); n != 2 {
		t.Fatalf("11 more minutes without a change: %d checkpoints, want still 2", n)
	}
}
