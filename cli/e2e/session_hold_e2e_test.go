package e2e_test

import (
	"context"
	"testing"
	"time"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
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
	holds := held()
	if len(holds) != 1 || holds[0].GetKind() != sessionv1.HoldKind_HOLD_KIND_COMMAND {
		t.Fatalf("holds while sb exec runs: %v, want one command hold", holds)
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
