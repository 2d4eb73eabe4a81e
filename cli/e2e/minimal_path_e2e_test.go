package e2e_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
)

// TestCheckpointWithOnlyGitOnPath runs a capture and a restore through the
// real services in sandboxes whose PATH holds git and nothing else (the
// local driver adds hangar-sandbox): a sandbox needs no shell, tar, grep,
// xargs or coreutils. The test's own commands (building the work tree,
// describing it) run with the host's PATH.
func TestCheckpointWithOnlyGitOnPath(t *testing.T) {
	// Debian's git-core holds git and its own helpers, no shell or
	// coreutils, and an isolated sandbox sees it (a directory of the
	// test's would not be).
	gitOnly := "/usr/lib/git-core"
	if _, err := os.Stat(filepath.Join(gitOnly, "git")); err != nil {
		t.Skipf("no %s/git: %v", gitOnly, err)
	}
	s := &checkpointStack{startStack(t, stackOptions{})}
	repo := gitRepo(t, map[string]string{"README.md": "hello\n", ".gitignore": "*.log\n", "src/a.go": "package a\n", "bin/run.sh": "#!/bin/sh\n"})
	ctx := context.Background()
	if _, err := s.sandboxes.ApplyEnvironment(ctx, &sandboxv1.ApplyEnvironmentRequest{Environment: &sandboxv1.Environment{
		Name: "cpe2e", Repository: repo, BaseRef: "main", Env: map[string]string{"PATH": gitOnly},
	}}); err != nil {
		t.Fatal(err)
	}
	run := func(sb *sandboxv1.AcquireSandboxResponse, path string, argv ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		env := map[string]string{"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
			"GIT_COMMITTER_EMAIL": "t@example.com", "LC_ALL": "C"}
		if path != "" {
			env["PATH"] = path
		}
		code, err := sandboxexec.New(s.sandboxes).Exec(ctx, sb.GetSandbox().GetId(), sb.GetLease().GetFencingToken(),
			argv, env, sb.GetSandbox().GetWorkDir(), nil, &out, &errOut)
		if err != nil {
			t.Fatalf("exec %v: %v", argv, err)
		}
		return code, out.String(), errOut.String()
	}
	host := os.Getenv("PATH")
	sb := s.acquire(t)
	// The sandbox's own PATH: the tool, then git alone.
	if code, _, _ := run(sb, "", "sh", "-c", "true"); code != 127 {
		t.Fatalf("sh ran in a sandbox whose PATH has only git: exit %d", code)
	}
	if code, out, errOut := run(sb, "", "hangar-agent", "ask", "which db?"); code != 0 || !strings.Contains(out, "recorded") {
		t.Fatalf("hangar-agent: %d %s %s", code, out, errOut)
	}
	if code, _, errOut := run(sb, host, "sh", "-c", checkpointBuildScript); code != 0 {
		t.Fatalf("build: %s", errOut)
	}
	_, want, _ := run(sb, host, "sh", "-c", checkpointStateScript)
	capture, err := s.checkpoints.CaptureCheckpoint(ctx, &checkpointv1.CaptureCheckpointRequest{
		Session: "s1", SandboxId: sb.GetSandbox().GetId(), FencingToken: sb.GetLease().GetFencingToken(),
		WorkDir: sb.GetSandbox().GetWorkDir(), BaseCommit: sb.GetSandbox().GetBaseCommit(), Branch: "hangar/session/s1",
		Harness: "claude", Turn: 1, Reason: checkpointv1.CheckpointReason_CHECKPOINT_REASON_AFTER_TURN,
		ConversationPaths: []string{sb.GetSandbox().GetHomeDir() + "/.hangar-agent"},
	})
	if err != nil {
		t.Fatalf("capture: %v", err)
	}
	cp := capture.GetCheckpoint()
	if _, err := s.sandboxes.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: sb.GetSandbox().GetId(), FencingToken: sb.GetLease().GetFencingToken()}); err != nil {
		t.Fatal(err)
	}
	s.waitDestroyed(t, sb.GetSandbox().GetId())
	sb2 := s.acquire(t)
	restored, err := s.checkpoints.RestoreCheckpoint(ctx, &checkpointv1.RestoreCheckpointRequest{
		CheckpointId: cp.GetId(), SandboxId: sb2.GetSandbox().GetId(), FencingToken: sb2.GetLease().GetFencingToken(),
		WorkDir: sb2.GetSandbox().GetWorkDir(),
	})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if restored.GetTreeHash() != cp.GetTreeHash() {
		t.Fatalf("tree %s, want %s", restored.GetTreeHash(), cp.GetTreeHash())
	}
	_, got, _ := run(sb2, host, "sh", "-c", checkpointStateScript)
	var kept []string
	for _, l := range strings.Split(want, "\n") {
		if !strings.Contains(l, "debug.log") {
			kept = append(kept, l)
		}
	}
	if strings.Join(kept, "\n") != got {
		t.Fatalf("restored work tree differs:\nwant:\n%s\ngot:\n%s", strings.Join(kept, "\n"), got)
	}
	// The conversation files (here: the agent's question) came back too.
	_, q, _ := run(sb2, host, "cat", sb2.GetSandbox().GetHomeDir()+"/.hangar-agent/question")
	if q != "which db?" {
		t.Errorf("question after restore: %q", q)
	}
}
