package e2e_test

// End-to-end issue-6 features through `hangar up`'s stack and the real
// Claude Code: session pull (GetSessionWork), usage in session list,
// --approvals ask, --from-local and --schema. The hangar CLI runs in
// process (command.Execute); the agent talks to the scripted upstream.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// sessionFeatWorkCmd is the pull test's turn: a commit, an uncommitted
// edit, a staged new file and an untracked one.
const sessionFeatWorkCmd = `printf 'one\n' > tracked.txt && git add tracked.txt && git commit -qm 'session commit' && printf 'edit\n' >> tracked.txt && printf 'staged\n' > staged.txt && git add staged.txt && printf 'new\n' > untracked.txt && echo work-done`

// sessionFeatSchemaAnswer is the --schema turn's final answer.
const sessionFeatSchemaAnswer = "Here is the result.\n```json\n{\"status\": \"ok\", \"count\": 2}\n```"

func sessionFeatScript() scripted.Script {
	bash := func(prompt, cmd string) scripted.Rule {
		return scripted.Rule{Name: prompt, Tool: "Bash", Prompt: "(?i)" + prompt, LastIsToolResult: scripted.Bool(false),
			Answer: scripted.Answer{Text: "Working on it.", ToolCall: &scripted.ToolCall{Name: "Bash", Input: map[string]any{"command": cmd}}}}
	}
	return scripted.Script{
		Rules: []scripted.Rule{
			{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Done with the task."}},
			bash("work task", sessionFeatWorkCmd),
			bash("approval task", `printf 'allowed\n' > approved.txt`),
			bash("second commit task", `printf 'two\n' > two.txt && git add two.txt && git commit -qm 'second commit' && echo second-done`),
			bash("denial task", `printf 'denied\n' > denied.txt`),
			{Name: "schema", Prompt: "(?i)schema task", Answer: scripted.Answer{Text: sessionFeatSchemaAnswer}},
			{Name: "no-json", Prompt: "(?i)plain task", Answer: scripted.Answer{Text: "No JSON here, sorry."}},
		},
		Default: &scripted.Answer{Text: "OK."},
	}
}

// sessionFeatStack is hangar with the scripted upstream and the real
// Claude Code; repo is the "e2e" environment's repository.
type sessionFeatStack struct {
	*stack
	repo string
}

func sessionFeatStart(t *testing.T) *sessionFeatStack {
	t.Helper()
	script := sessionFeatScript()
	s := &sessionFeatStack{stack: startStack(t, stackOptions{script: &script}), repo: gitRepo(t, nil)}
	s.applyEnvironment(t, "e2e", s.repo, 0, sandboxv1.Egress_EGRESS_FULL)
	return s
}

// sessionFeatGit runs git in dir with a fixed identity and returns its
// output.
func sessionFeatGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// cli runs `hangar args...` in process; it returns stdout then stderr.
func (s *sessionFeatStack) cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, errOut, err := s.run(t, "", args...)
	return out + errOut, err
}

func (s *sessionFeatStack) mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, err := s.cli(t, args...)
	if err != nil {
		t.Fatalf("hangar %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// sessionFeatClone clones the environment's repository.
func (s *sessionFeatStack) clone(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "clone")
	sessionFeatGit(t, filepath.Dir(dir), "clone", "-q", s.repo, dir)
	return dir
}

func sessionFeatRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

// sessionFeatPullChecks pulls name into fresh clones, without and with
// --checkout, and checks what arrived; untracked says whether the
// untracked file is expected too.
func (s *sessionFeatStack) pullChecks(t *testing.T, name string, untracked bool) {
	t.Helper()
	plain := s.clone(t)
	out := s.mustCLI(t, "session", "pull", name, "-C", plain)
	if log := sessionFeatGit(t, plain, "log", "--format=%s", "hangar/"+name); !strings.Contains(log, "session commit") || !strings.Contains(log, "base") {
		t.Fatalf("pull: branch hangar/%s has %q (pull said %q)", name, log, out)
	}
	if head := strings.TrimSpace(sessionFeatGit(t, plain, "rev-parse", "--abbrev-ref", "HEAD")); head != "main" {
		t.Errorf("pull without --checkout switched to %s", head)
	}

	co := s.clone(t)
	s.mustCLI(t, "session", "pull", name, "--checkout", "-C", co)
	if head := strings.TrimSpace(sessionFeatGit(t, co, "rev-parse", "--abbrev-ref", "HEAD")); head != "hangar/"+name {
		t.Fatalf("pull --checkout is on %s", head)
	}
	if got := sessionFeatRead(t, filepath.Join(co, "tracked.txt")); got != "one\nedit\n" {
		t.Errorf("tracked.txt after pull --checkout: %q", got)
	}
	if got := sessionFeatRead(t, filepath.Join(co, "staged.txt")); got != "staged\n" {
		t.Errorf("staged.txt after pull --checkout: %q", got)
	}
	_, err := os.Stat(filepath.Join(co, "untracked.txt"))
	if untracked && err != nil {
		t.Errorf("untracked.txt after pull --checkout: %v", err)
	}
	if log := sessionFeatGit(t, co, "log", "--format=%s"); !strings.Contains(log, "session commit") {
		t.Errorf("pull --checkout: log %q", log)
	}
}

// TestSessionFeatPullAndUsage: a turn that commits, edits, stages and
// creates files; `session pull` brings its commits onto hangar/NAME and
// --checkout its uncommitted changes, from the live sandbox and, once
// suspended, from the newest checkpoint. `session list` carries the
// session's usage.
func TestSessionFeatPullAndUsage(t *testing.T) {
	s := sessionFeatStart(t)
	ctx := context.Background()
	name := "feat-pull"
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: name, Environment: "e2e", Message: "Please do the work task."}); err != nil {
		t.Fatalf("new: %v", err)
	}
	turn := s.waitTurn(t, name, 1)
	if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("turn 1: %v (%s)", turn.GetOutcome(), turn.GetOutcomeReason())
	}

	t.Run("usage in list", func(t *testing.T) {
		list, err := s.sessions.ListSessions(ctx, &sessionv1.ListSessionsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.GetSessions()) != 1 {
			t.Fatalf("list has %d sessions", len(list.GetSessions()))
		}
		u := list.GetSessions()[0].GetUsage()
		if u.GetModelCalls() == 0 || u.GetInputTokens() == 0 || u.GetModelCalls() != turn.GetUsage().GetModelCalls() || u.GetInputTokens() != turn.GetUsage().GetInputTokens() {
			t.Errorf("list usage %v, turn usage %v", u, turn.GetUsage())
		}
	})

	t.Run("pull from the sandbox", func(t *testing.T) { s.pullChecks(t, name, true) })

	if _, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: name}); err != nil {
		t.Fatalf("suspend: %v", err)
	}
	// The checkpoint's diff covers tracked files; untracked ones are in
	// its tarball, which pull does not get.
	t.Run("pull from the checkpoint", func(t *testing.T) { s.pullChecks(t, name, false) })

	// A second turn's commit makes the newest checkpoint's bundle
	// incremental on the first's: pull fetches the chain in order and gets
	// the sandbox's real commits, same hashes, plus the tracked changes.
	if _, err := s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: name, Message: "Please do the second commit task."}); err != nil {
		t.Fatalf("send: %v", err)
	}
	if second := s.waitTurn(t, name, 2); second.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("turn 2: %v (%s)", second.GetOutcome(), second.GetOutcomeReason())
	}
	sandboxLog := strings.TrimSpace(s.mustExec(t, s.get(t, name).GetSandboxId(), "git log --format='%H %s' HEAD"))
	if !strings.Contains(sandboxLog, "second commit") || !strings.Contains(sandboxLog, "session commit") {
		t.Fatalf("the sandbox's log: %q", sandboxLog)
	}
	if _, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: name}); err != nil {
		t.Fatalf("suspend: %v", err)
	}
	cps, err := s.checkpoints.ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: name})
	if err != nil || len(cps.GetCheckpoints()) == 0 {
		t.Fatalf("checkpoints: %v", err)
	}
	bundles := 0
	for _, p := range cps.GetCheckpoints()[0].GetParts() {
		if p.GetKind() == checkpointv1.PartKind_PART_KIND_BUNDLE && !p.GetSkipped() {
			bundles++
		}
	}
	if bundles < 2 {
		t.Fatalf("the newest checkpoint has %d bundles, want a chain", bundles)
	}
	t.Run("pull from a chained checkpoint", func(t *testing.T) {
		plain := s.clone(t)
		out := s.mustCLI(t, "session", "pull", name, "-C", plain)
		if !strings.Contains(out, "a chain of") {
			t.Errorf("pull said %q", out)
		}
		if log := strings.TrimSpace(sessionFeatGit(t, plain, "log", "--format=%H %s", "hangar/"+name)); log != sandboxLog {
			t.Errorf("pull from a chain: hangar/%s is\n%s\nwant the sandbox's commits\n%s", name, log, sandboxLog)
		}
		if head := strings.TrimSpace(sessionFeatGit(t, plain, "rev-parse", "--abbrev-ref", "HEAD")); head != "main" {
			t.Errorf("pull without --checkout switched to %s", head)
		}

		co := s.clone(t)
		s.mustCLI(t, "session", "pull", name, "--checkout", "-C", co)
		if log := strings.TrimSpace(sessionFeatGit(t, co, "log", "--format=%H %s")); log != sandboxLog {
			t.Errorf("pull --checkout from a chain: log\n%s\nwant the sandbox's commits\n%s", log, sandboxLog)
		}
		// The checkpoint's diff covers tracked files (see "pull from the
		// checkpoint").
		for file, want := range map[string]string{"tracked.txt": "one\nedit\n", "staged.txt": "staged\n", "two.txt": "two\n"} {
			if got := sessionFeatRead(t, filepath.Join(co, file)); got != want {
				t.Errorf("%s after pull --checkout from a chain: %q", file, got)
			}
		}
		if st := sessionFeatGit(t, co, "status", "--porcelain", "--", "two.txt"); st != "" {
			t.Errorf("two.txt is not committed after pull --checkout: %q", st)
		}
	})
}

// sessionFeatApprovalTurn starts a turn under --approvals ask, waits until
// its tool call is held, checks the turn waits, then answers it with the
// CLI and returns the ended turn.
func (s *sessionFeatStack) approvalTurn(t *testing.T, name, message, flag string) *sessionv1.Turn {
	t.Helper()
	ctx := context.Background()
	s.mustCLI(t, "session", "new", name, message, "-e", "e2e", "--approvals", "ask")
	if got := s.get(t, name).GetApprovals(); got != sessionv1.ApprovalMode_APPROVAL_MODE_ASK {
		t.Fatalf("session approvals: %v", got)
	}
	var held *sessionv1.Approval
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for held == nil {
		resp, err := s.sessions.ListApprovals(wctx, &sessionv1.ListApprovalsRequest{Name: name})
		if err != nil {
			t.Fatalf("list approvals: %v", err)
		}
		if len(resp.GetApprovals()) > 0 {
			held = resp.GetApprovals()[0]
			break
		}
		select {
		case <-wctx.Done():
			t.Fatalf("no tool call was held for approval")
		case <-tick.C:
		}
	}
	if held.GetToolName() != "Bash" || held.GetState() != sessionv1.ApprovalState_APPROVAL_STATE_PENDING || held.GetTurn() != 1 || !strings.Contains(held.GetInputJson(), ".txt") {
		t.Fatalf("held approval: %v", held)
	}
	if tr, err := s.sessions.GetTurn(ctx, &sessionv1.GetTurnRequest{Name: name, Turn: 1}); err != nil || tr.GetTurn().GetEndedAt() != nil {
		t.Fatalf("the turn should wait on the approval: %v, %v", tr.GetTurn(), err)
	}
	if out := s.mustCLI(t, "session", "approvals", name); !strings.Contains(out, held.GetId()) {
		t.Errorf("session approvals lists %q, not %s", out, held.GetId())
	}
	s.mustCLI(t, "session", "approvals", name, flag, held.GetId())
	turn := s.waitTurn(t, name, 1)
	all, err := s.sessions.ListApprovals(ctx, &sessionv1.ListApprovalsRequest{Name: name, All: true})
	if err != nil || len(all.GetApprovals()) == 0 || all.GetApprovals()[0].GetState() == sessionv1.ApprovalState_APPROVAL_STATE_PENDING {
		t.Errorf("answered approvals: %v, %v", all.GetApprovals(), err)
	}
	return turn
}

// TestSessionFeatApprovals: under --approvals ask Claude Code's tool call
// waits for a person; --allow runs it, --deny does not.
func TestSessionFeatApprovals(t *testing.T) {
	s := sessionFeatStart(t)
	t.Run("allow", func(t *testing.T) {
		turn := s.approvalTurn(t, "feat-allow", "Please do the approval task.", "--allow")
		if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
			t.Fatalf("turn: %v (%s)", turn.GetOutcome(), turn.GetOutcomeReason())
		}
		out, code := s.exec(t, s.get(t, "feat-allow").GetSandboxId(), "cat approved.txt")
		if code != 0 || out != "allowed\n" {
			t.Errorf("approved.txt: %q (exit %d)", out, code)
		}
	})
	t.Run("deny", func(t *testing.T) {
		turn := s.approvalTurn(t, "feat-deny", "Please do the denial task.", "--deny")
		if turn.GetEndedAt() == nil {
			t.Fatalf("turn did not end: %v", turn)
		}
		if out, code := s.exec(t, s.get(t, "feat-deny").GetSandboxId(), "test ! -e denied.txt"); code != 0 {
			t.Errorf("denied.txt exists: %s", out)
		}
	})
}

// TestSessionFeatFromLocal: a local clone with an unpushed commit, an
// uncommitted edit and an untracked file; `session new --from-local`
// continues it in the sandbox.
func TestSessionFeatFromLocal(t *testing.T) {
	s := sessionFeatStart(t)
	local := s.clone(t)
	if err := os.WriteFile(filepath.Join(local, "local.txt"), []byte("committed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sessionFeatGit(t, local, "add", "local.txt")
	sessionFeatGit(t, local, "commit", "-q", "-m", "local commit")
	if err := os.WriteFile(filepath.Join(local, "local.txt"), []byte("committed\nedited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(local, "notes"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(local, "notes", "untracked.txt"), []byte("untracked\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(local)
	s.mustCLI(t, "session", "new", "feat-local", "Say OK.", "--from-local", "-e", "e2e", "-w")
	turn := s.waitTurn(t, "feat-local", 1)
	if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("turn: %v (%s)", turn.GetOutcome(), turn.GetOutcomeReason())
	}
	out, code := s.exec(t, s.get(t, "feat-local").GetSandboxId(),
		`git rev-parse --abbrev-ref HEAD && git log --format=%s && cat local.txt && cat notes/untracked.txt && git status --porcelain -uall`)
	if code != 0 {
		t.Fatalf("sandbox tree: %s", out)
	}
	for _, want := range []string{"hangar/session/feat-local", "local commit\nbase", "committed\nedited\n", "untracked\n", "M  local.txt", "?? notes/untracked.txt"} {
		if !strings.Contains(out, want) {
			t.Errorf("the sandbox's tree lacks %q:\n%s", want, out)
		}
	}

	// A base the environment's repository lacks: the turn fails, saying so.
	origin := t.TempDir()
	sessionFeatGit(t, origin, "init", "-q", "-b", "main")
	sessionFeatGit(t, origin, "commit", "-q", "--allow-empty", "-m", "elsewhere")
	other := filepath.Join(t.TempDir(), "other")
	sessionFeatGit(t, filepath.Dir(other), "clone", "-q", origin, other)
	sessionFeatGit(t, other, "commit", "-q", "--allow-empty", "-m", "unpushed")
	t.Chdir(other)
	s.mustCLI(t, "session", "new", "feat-local-bad", "Say OK.", "--from-local", "-e", "e2e")
	bad := s.waitTurn(t, "feat-local-bad", 1)
	if bad.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_FAILED || !strings.Contains(bad.GetOutcomeReason(), "push it") {
		t.Errorf("turn on a missing base: %v (%s)", bad.GetOutcome(), bad.GetOutcomeReason())
	}
}

// TestSessionFeatSchema: --schema asks for a JSON object at the end of the
// answer; it becomes the turn's structured result, and an answer without
// one is a warning, not a failure.
func TestSessionFeatSchema(t *testing.T) {
	s := sessionFeatStart(t)
	schema := filepath.Join(t.TempDir(), "schema.json")
	if err := os.WriteFile(schema, []byte(`{"type": "object", "required": ["status", "count"], "properties": {"status": {"type": "string"}, "count": {"type": "integer"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	s.mustCLI(t, "session", "new", "feat-schema", "Please do the schema task.", "-e", "e2e", "--schema", schema, "-w")
	turn := s.waitTurn(t, "feat-schema", 1)
	if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("turn 1: %v (%s)", turn.GetOutcome(), turn.GetOutcomeReason())
	}
	got := turn.GetStructuredResult().AsMap()
	if got["status"] != "ok" || got["count"] != float64(2) || len(turn.GetWarnings()) != 0 {
		t.Errorf("structured result %v, warnings %v", got, turn.GetWarnings())
	}

	s.mustCLI(t, "session", "send", "feat-schema", "Please do the plain task.", "--schema", schema, "-w")
	plain := s.waitTurn(t, "feat-schema", 2)
	if plain.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED || plain.GetStructuredResult() != nil {
		t.Errorf("turn 2: %v (%s), structured %v", plain.GetOutcome(), plain.GetOutcomeReason(), plain.GetStructuredResult())
	}
	if w := strings.Join(plain.GetWarnings(), "; "); !strings.Contains(w, "no structured result") {
		t.Errorf("turn 2 warnings: %q", w)
	}
	if _, err := s.cli(t, "session", "send", "feat-schema", "x", "--schema", schema+".missing"); err == nil {
		t.Errorf("a missing schema file was accepted")
	}
}
