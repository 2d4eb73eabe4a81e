package e2e_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
)

// checkpointStack is the whole hangar (real sandbox-svc, local driver) for
// the checkpoint tests, with an environment made from a small repository.
type checkpointStack struct{ *stack }

func checkpointStart(t *testing.T) *checkpointStack {
	t.Helper()
	s := &checkpointStack{startStack(t, stackOptions{})}
	repo := gitRepo(t, map[string]string{"README.md": "hello\n", ".gitignore": "*.log\n", "src/a.go": "package a\n", "bin/run.sh": "#!/bin/sh\n"})
	s.applyEnvironment(t, "cpe2e", repo, 0, sandboxv1.Egress_EGRESS_UNSPECIFIED)
	return s
}

func (s *checkpointStack) acquire(t *testing.T) *sandboxv1.AcquireSandboxResponse {
	t.Helper()
	resp, err := s.sandboxes.AcquireSandbox(context.Background(), &sandboxv1.AcquireSandboxRequest{
		Environment: "cpe2e", Holder: "e2e/checkpoint", TtlSeconds: 600, WorkKey: "s1"})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	return resp
}

// waitDestroyed waits (bounded) until a released sandbox is gone, so its
// work key is free again.
func (s *checkpointStack) waitDestroyed(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := s.sandboxes.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: id})
		if status.Code(err) == codes.NotFound || resp.GetSandbox().GetState() == sandboxv1.SandboxState_SANDBOX_STATE_DESTROYED {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("sandbox %s not destroyed: %v %v", id, resp.GetSandbox().GetState(), err)
		case <-tick.C:
		}
	}
}

func (s *checkpointStack) exec(t *testing.T, sb *sandboxv1.AcquireSandboxResponse, script string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	env := map[string]string{"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
		"GIT_COMMITTER_EMAIL": "t@example.com", "LC_ALL": "C"}
	code, err := sandboxexec.New(s.sandboxes).Exec(context.Background(), sb.GetSandbox().GetId(), sb.GetLease().GetFencingToken(),
		[]string{"sh", "-c", script}, env, sb.GetSandbox().GetWorkDir(), nil, &out, &errOut)
	if err != nil || code != 0 {
		t.Fatalf("exec %q: code %d, %v: %s", script, code, err, errOut.String())
	}
	return out.String()
}

// cli runs `hangar args...` in process and returns its stdout.
func (s *checkpointStack) cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, _, err := s.run(t, "", args...)
	return out, err
}

// checkpointBuildScript makes every kind of change: commits on a branch,
// staged and unstaged edits, a binary file, a mode change, a deletion, a
// rename, untracked files with a symlink and an empty directory, and an
// ignored file that must not come back.
const checkpointBuildScript = `set -e
git checkout -q -b hangar/session/s1
printf 'one\n' > one.txt && git add one.txt && git commit -qm one
printf 'package a\n\nfunc A() {}\n' > src/a.go && git commit -qam two
printf 'staged\n' >> README.md && git add README.md && printf 'then unstaged\n' >> README.md
printf '\000\001\002\377binary' > data.bin && git add data.bin
chmod 644 bin/run.sh
git mv one.txt uno.txt
rm src/a.go
mkdir -p notes/empty && printf 'todo\n' > notes/todo.txt && chmod 600 notes/todo.txt
ln -s ../README.md notes/readme-link
printf 'noise\n' > debug.log
`

// checkpointStateScript describes the work tree: HEAD, branch, index,
// status, and every path's type, mode and sha256 (or link target).
const checkpointStateScript = `set -e
echo "head $(git rev-parse HEAD)"
echo "branch $(git symbolic-ref -q HEAD || echo detached)"
git ls-files -s
git status --porcelain=v2 -z | tr '\0' '\n'
find . -path ./.git -prune -o ! -name . -print | LC_ALL=C sort | while IFS= read -r f; do
  if [ -L "$f" ]; then echo "L $f -> $(readlink "$f")"
  elif [ -d "$f" ]; then echo "D $(stat -c %a "$f") $f"
  else echo "F $(stat -c %a "$f") $(sha256sum < "$f" | cut -c1-64) $f"; fi
done
`

// TestCheckpointSurvivesSandbox captures a sandbox's work through the real
// sandbox service, destroys the sandbox, restores into a fresh one and
// compares them byte for byte; then reads the patch and drives the CLI.
func TestCheckpointSurvivesSandbox(t *testing.T) {
	s := checkpointStart(t)
	ctx := context.Background()
	sb := s.acquire(t)
	s.exec(t, sb, checkpointBuildScript)
	want := s.exec(t, sb, checkpointStateScript)
	if !strings.Contains(want, "debug.log") || !strings.Contains(want, "L ./notes/readme-link -> ../README.md") {
		t.Fatalf("the build script did not build:\n%s", want)
	}
	capture, err := s.checkpoints.CaptureCheckpoint(ctx, &checkpointv1.CaptureCheckpointRequest{
		Session: "s1", SandboxId: sb.GetSandbox().GetId(), FencingToken: sb.GetLease().GetFencingToken(),
		WorkDir: sb.GetSandbox().GetWorkDir(), BaseCommit: sb.GetSandbox().GetBaseCommit(), Branch: "hangar/session/s1",
		Harness: "claude", Turn: 2, Reason: checkpointv1.CheckpointReason_CHECKPOINT_REASON_AFTER_TURN,
	})
	if err != nil {
		t.Fatalf("capture: %v", err)
	}
	cp := capture.GetCheckpoint()
	if _, err := s.sandboxes.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: sb.GetSandbox().GetId(), FencingToken: sb.GetLease().GetFencingToken()}); err != nil {
		t.Fatalf("release: %v", err)
	}

	s.waitDestroyed(t, sb.GetSandbox().GetId())
	sb2 := s.acquire(t)
	if sb2.GetSandbox().GetId() == sb.GetSandbox().GetId() {
		t.Fatal("the released sandbox came back")
	}
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
	got := s.exec(t, sb2, checkpointStateScript)
	want = strings.ReplaceAll(want, sb.GetSandbox().GetWorkDir(), sb2.GetSandbox().GetWorkDir())
	wantLines := strings.Split(want, "\n")
	var kept []string
	for _, l := range wantLines {
		if !strings.Contains(l, "debug.log") {
			kept = append(kept, l)
		}
	}
	if strings.Join(kept, "\n") != got {
		t.Fatalf("restored work tree differs:\nwant:\n%s\ngot:\n%s", strings.Join(kept, "\n"), got)
	}

	// The patch, with no sandbox: the commits, the edits, the untracked
	// files; not the ignored one.
	patch, err := s.checkpoints.GetCheckpointPatch(ctx, &checkpointv1.GetCheckpointPatchRequest{CheckpointId: cp.GetId()})
	if err != nil {
		t.Fatalf("patch: %v", err)
	}
	for _, w := range []string{"b/uno.txt", "then unstaged", "b/notes/todo.txt", "GIT binary patch", "deleted file mode 100644"} {
		if !strings.Contains(patch.GetPatch(), w) {
			t.Errorf("patch lacks %q", w)
		}
	}
	if strings.Contains(patch.GetPatch(), "debug.log") {
		t.Error("patch has the ignored file")
	}

	// The CLI.
	out, err := s.cli(t, "checkpoint", "list", "s1")
	if err != nil || !strings.Contains(out, "ID") || !strings.Contains(out, cp.GetId()) || !strings.Contains(out, "after_turn") {
		t.Fatalf("checkpoint list: %v\n%s", err, out)
	}
	for _, arg := range []string{"s1", cp.GetId()} {
		out, err = s.cli(t, "checkpoint", "get", arg)
		if err != nil || !strings.Contains(out, "id:") || !strings.Contains(out, cp.GetId()) || !strings.Contains(out, "patch") {
			t.Fatalf("checkpoint get %s: %v\n%s", arg, err, out)
		}
	}
	out, err = s.cli(t, "checkpoint", "verify", "s1")
	if err != nil || !strings.Contains(out, cp.GetId()+"  ok") {
		t.Fatalf("checkpoint verify: %v\n%s", err, out)
	}
	out, err = s.cli(t, "checkpoint", "list", "nobody")
	if err != nil || !strings.Contains(out, "no checkpoints") {
		t.Fatalf("list of an unknown session: %v %q", err, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"checkpoint", "get", "s1~20260101T000000.000000000Z-00000000"}, "not found"},
		{[]string{"checkpoint", "verify", "nobody"}, "has no checkpoints"},
		{[]string{"checkpoint", "get", "bad~id"}, "is not a checkpoint id"},
	} {
		_, err := s.cli(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "rpc error") {
			t.Errorf("hangar %v: %v, want one line with %q", tc.args, err, tc.want)
		}
	}
}
