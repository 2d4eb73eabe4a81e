package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// A suspended session's sandbox is kept with its files (the sandbox cache)
// and its resume leases it again after checking it holds the newest
// checkpoint exactly; a cached sandbox changed behind hangar's back (here a
// file rewritten with the same size on the host) is never used: the resume
// destroys it and restores the checkpoint into a fresh sandbox.
func TestSessionResumeFromCache(t *testing.T) {
	s := sessionMoreStart(t, nil, false)
	ctx := context.Background()
	name := "cached"
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: name, Environment: "e2e"}); err != nil {
		t.Fatal(err)
	}
	open := func() *sessionv1.Session {
		t.Helper()
		o, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return o.GetSession()
	}
	suspend := func() {
		t.Helper()
		if _, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	first := open()
	sb := first.GetSandboxId()
	s.mustExec(t, sb, `printf 'work\n' > work.txt && git add work.txt && git -c user.name=t -c user.email=t@t commit -qm work && printf 'draft\n' > draft.txt`)
	got, err := s.sandboxes.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: sb})
	if err != nil {
		t.Fatal(err)
	}
	workDir := got.GetSandbox().GetWorkDir()
	suspend()
	if _, err := os.Stat(filepath.Join(workDir, "draft.txt")); err != nil {
		t.Fatalf("the suspended session's sandbox was not kept: %v", err)
	}

	// Cache hit: the same sandbox, its files as they were.
	second := open()
	if second.GetSandboxId() != sb {
		t.Fatalf("resume leased %s, want the cached %s", second.GetSandboxId(), sb)
	}
	if out := s.mustExec(t, sb, `git log --format=%s -1; cat draft.txt`); out != "work\ndraft\n" {
		t.Fatalf("cached sandbox holds %q", out)
	}
	// The agent can commit after a cached resume (its git identity is kept).
	s.mustExec(t, sb, `printf 'more\n' >> draft.txt`)
	suspend()

	// Tampered while cached: same size, same time.
	p := filepath.Join(workDir, "draft.txt")
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("DRAFT\nMORE\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	third := open()
	if third.GetSandboxId() == sb {
		t.Fatalf("a tampered cached sandbox %s was used", sb)
	}
	if out := s.mustExec(t, third.GetSandboxId(), `git log --format=%s -1; cat draft.txt`); out != "work\ndraft\nmore\n" {
		t.Fatalf("restored after tampering: %q", out)
	}
	// And its resume is cached again.
	suspend()
	if fourth := open(); fourth.GetSandboxId() != third.GetSandboxId() {
		t.Errorf("resume after a restore leased %s, want the cached %s", fourth.GetSandboxId(), third.GetSandboxId())
	}
}
