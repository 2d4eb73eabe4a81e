package e2e_test

// A newcomer's first hour (issue 14), against the real stack: the CLI runs
// in a repository other than the one `hangar up` started in.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/cli/command"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// TestFirstHourRightRepository: `session new` without -e works on the
// repository the CLI runs in and says which, at which commit; --repo takes
// a path or a URL; a repository hangar cannot read is refused with what to
// pass instead.
func TestFirstHourRightRepository(t *testing.T) {
	s := sessionCLIStart(t)
	ctx := context.Background()
	mine := gitRepo(t, map[string]string{"MINE.md": "mine\n", "sub/x.txt": "x\n"})
	mineCommit := sessionCLIGit(t, mine, "rev-parse", "HEAD")
	if real, err := filepath.EvalSymlinks(mine); err == nil {
		mine = real
	}

	out, errOut, err := s.runIn(t, filepath.Join(mine, "sub"), "", "session", "new", "here")
	if err != nil {
		t.Fatalf("session new from another repository: %v\n%s%s", err, out, errOut)
	}
	first := strings.SplitN(out, "\n", 2)[0]
	if want := "created session here on " + mine + " at " + mineCommit[:12] + " (environment local)"; !strings.HasPrefix(first, want) {
		t.Errorf("first line %q, want it to start %q", first, want)
	}
	got := s.get(t, "here")
	if got.GetRepo() != mine || got.GetBaseCommit() != mineCommit {
		t.Errorf("session repo %q base %q, want %q at %s", got.GetRepo(), got.GetBaseCommit(), mine, mineCommit)
	}
	out, errOut, err = s.runIn(t, mine, "", "session", "open", "here")
	if err != nil {
		t.Fatalf("session open: %v\n%s%s", err, out, errOut)
	}
	sb := s.get(t, "here").GetSandboxId()
	if got := s.mustExec(t, sb, "cat MINE.md; git rev-parse HEAD; git branch --show-current"); got != "mine\n"+mineCommit+"\nhangar/session/here\n" {
		t.Errorf("the sandbox of a session made in %s holds:\n%s", mine, got)
	}

	// --repo: a relative path, and a URL.
	other := gitRepo(t, map[string]string{"OTHER.md": "other\n"})
	otherCommit := sessionCLIGit(t, other, "rev-parse", "HEAD")
	out, _, err = s.runIn(t, filepath.Dir(other), "", "session", "new", "by-path", "-e", "e2e", "--repo", filepath.Base(other))
	if err != nil || !strings.Contains(out, " at "+otherCommit[:12]+" (environment e2e)") {
		t.Errorf("session new --repo RELATIVE: %v\n%s", err, out)
	}
	out, _, err = s.runIn(t, mine, "", "session", "new", "by-url", "--repo", "file://"+other)
	if err != nil || !strings.Contains(out, "on file://"+other+" at "+otherCommit[:12]) {
		t.Errorf("session new --repo URL: %v\n%s", err, out)
	}
	if got := s.get(t, "by-url"); got.GetRepo() != "file://"+other || got.GetBaseCommit() != otherCommit {
		t.Errorf("session by-url: repo %q base %q", got.GetRepo(), got.GetBaseCommit())
	}
	s.fails(t, "is not a directory on hangar's machine", "session", "new", "bad-path", "--repo", filepath.Join(other, "gone"))

	// -e alone is the environment's repository, wherever the CLI runs.
	out, _, err = s.runIn(t, mine, "", "session", "new", "env-only", "-e", "e2e")
	if err != nil || !strings.Contains(out, "on "+s.repo+" at ") {
		t.Errorf("session new -e e2e from another repository: %v\n%s", err, out)
	}

	// Run where hangar up runs: the plain local environment, no override.
	out, _, err = s.run(t, "", "session", "new", "same-repo")
	if err != nil || s.get(t, "same-repo").GetRepo() != "" {
		t.Errorf("session new in hangar's own repository: %v, repo %q\n%s", err, s.get(t, "same-repo").GetRepo(), out)
	}

	// A path the server cannot read (the CLI on another machine).
	_, err = s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "elsewhere", WorkingRepository: "/no/such/checkout"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "hangar cannot read /no/such/checkout, the repository you ran this in") ||
		!strings.Contains(status.Convert(err).Message(), "pass --repo with a git URL it can clone, or -e ENV") {
		t.Errorf("an unreadable working repository: %v", err)
	}
}

// TestFirstHourAgentCLIOnPath: a turn finds the agent CLI on the PATH
// hangar up runs with (no HANGAR_CLAUDE_BIN path); a CLI that is nowhere
// fails the turn with its name and what to run, and leaves no
// resume_command behind.
func TestFirstHourAgentCLIOnPath(t *testing.T) {
	dir := os.Getenv("HANGAR_HARNESS_DIR")
	if dir == "" {
		t.Skip("HANGAR_HARNESS_DIR is unset: run .ci/install-harnesses and set it to use the real agent CLIs")
	}
	t.Setenv("PATH", filepath.Dir(filepath.Join(dir, harnessClaude))+string(filepath.ListSeparator)+os.Getenv("PATH"))
	script := scripted.Script{Default: &scripted.Answer{Text: "Done."}}
	s := &sessionCLIStack{stack: startStack(t, stackOptions{script: &script, vars: map[string]string{
		"HANGAR_CLAUDE_BIN": "claude", "HANGAR_CODEX_BIN": "codex-not-installed-here",
	}}), repo: gitRepo(t, nil)}
	s.applyEnvironment(t, "e2e", s.repo, 0, sandboxv1.Egress_EGRESS_UNSPECIFIED)

	out := s.ok(t, "session", "new", "on-path", "hello", "-e", "e2e", "-w")
	sessionCLIWant(t, "a turn of claude found on PATH", out, "turn 1 completed")
	var started bool
	for _, tr := range s.get(t, "on-path").GetTransitions() {
		started = started || (tr.GetTo() == sessionv1.SessionState_SESSION_STATE_RUNNING && tr.GetReason() == "started")
	}
	if !started {
		t.Errorf("a brand-new session's first boot is not recorded as started: %v", s.get(t, "on-path").GetTransitions())
	}
	if got := s.get(t, "on-path"); !strings.HasPrefix(got.GetResumeCommand(), "claude --resume ") {
		t.Errorf("after a completed turn: resume_command %q", got.GetResumeCommand())
	}

	out, _, err := s.run(t, "", "session", "new", "missing", "hello", "-e", "e2e", "--harness", "codex", "-w")
	if err == nil {
		t.Errorf("a turn whose CLI is missing succeeded:\n%s", out)
	}
	sessionCLIWant(t, "a turn whose CLI is missing", out, "turn 1 failed",
		`the codex CLI is not installed: "codex-not-installed-here" on the PATH hangar up runs with was not found`,
		"npm install -g @openai/codex, or set HANGAR_CODEX_BIN to its path")
	got := s.get(t, "missing")
	if got.GetConversationId() != "" || got.GetResumeCommand() != "" {
		t.Errorf("a conversation that never started: conversation %q, resume_command %q", got.GetConversationId(), got.GetResumeCommand())
	}
	if out := s.ok(t, "session", "get", "missing"); strings.Contains(out, "resume") && strings.Contains(out, "codex exec resume") {
		t.Errorf("session get shows a resume command for a conversation that never started:\n%s", out)
	}
}

// TestFirstHourMessages: errors a newcomer meets say what to do.
func TestFirstHourMessages(t *testing.T) {
	dir := os.Getenv("HANGAR_HARNESS_DIR")
	if dir == "" {
		t.Skip("HANGAR_HARNESS_DIR is unset: run .ci/install-harnesses and set it to use the real agent CLIs")
	}
	script := scripted.Script{Default: &scripted.Answer{Text: "Done."}}
	s := &sessionCLIStack{stack: startStack(t, stackOptions{script: &script}), repo: gitRepo(t, nil)}
	s.applyEnvironment(t, "e2e", s.repo, 0, sandboxv1.Egress_EGRESS_UNSPECIFIED)

	// A stopped hangar, through the endpoint file a previous start left.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stale := "http://" + ln.Addr().String()
	ln.Close()
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, "endpoint"), []byte(stale+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "token"), []byte("old-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	elsewhere := &stack{env: map[string]string{"HANGAR_HOME": home}}
	_, _, err = elsewhere.run(t, "", "session", "list")
	if want := "hangar at " + stale + " (from " + filepath.Join(home, "endpoint") + ") is not running: start it with `hangar up`"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a stopped hangar: %v, want %q", err, want)
	}
	// A wrong token from the data directory.
	elsewhere.env["HANGAR_URL"] = s.env["HANGAR_URL"]
	_, _, err = elsewhere.run(t, "", "session", "list")
	if want := "refused the token from " + filepath.Join(home, "token") + ": use the one its `hangar up` printed"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a wrong token: %v, want %q", err, want)
	}
	_, _, err = elsewhere.run(t, "", "session", "events", "x", "--follow")
	if err == nil || !strings.Contains(err.Error(), "refused the token") {
		t.Errorf("a wrong token on a stream: %v", err)
	}

	// Over budget: what was crossed, not the CLI's "Failed to authenticate".
	out, _, err := s.run(t, "", "session", "new", "tight", "hello", "-e", "e2e", "--max-tokens", "10", "-w")
	var exit *command.ExitError
	if !errors.As(err, &exit) || exit.Code != 2 {
		t.Errorf("an over-budget turn: %v, want exit 2", err)
	}
	sessionCLIWant(t, "an over-budget turn", out, "turn 1 over_budget", "turn stopped: over its budget of 10 tokens (used ")
	if end := out[strings.LastIndex(out, "turn 1 over_budget"):]; strings.Contains(end, "Failed to authenticate") {
		t.Errorf("the over-budget turn's end shows the CLI's refusal:\n%s", end)
	}

	// events --turn N of a turn that does not exist.
	s.fails(t, `session "tight" has no turn 99: it has 1 turn`, "session", "events", "tight", "--turn", "99")
	s.fails(t, `session "tight" has no turn 2: it has 1 turn`, "session", "artifacts", "tight", "--turn", "2")

	// pull, then pull --checkout: the second finds the first's branch.
	s.ok(t, "session", "new", "work", "-e", "e2e")
	s.ok(t, "session", "open", "work")
	s.mustExec(t, s.get(t, "work").GetSandboxId(), "echo changed > tracked.txt && git add tracked.txt && git commit -qm one && echo more >> tracked.txt")
	local := t.TempDir()
	sessionCLIGit(t, local, "clone", "-q", s.repo, ".")
	sessionCLIWant(t, "pull", s.ok(t, "session", "pull", "work", "-C", local), "fetched the session's commits")
	out = s.ok(t, "session", "pull", "work", "-C", local, "--checkout")
	sessionCLIWant(t, "pull --checkout after pull", out, "branch hangar/work is already at the session's", "switched to hangar/work", "applied its uncommitted changes")
	if got := sessionCLIGit(t, local, "show", ":tracked.txt"); got != "changed" {
		t.Errorf("hangar/work's tracked.txt = %q", got)
	}

	// patch of an archived session.
	s.ok(t, "session", "archive", "tight")
	s.fails(t, `session "tight" is archived: its checkpoints, and so its work, are gone`, "session", "patch", "tight")
	out = s.ok(t, "session", "archive", "work")
	if strings.Contains(out, "archived: archived") {
		t.Errorf("archive repeats itself: %q", out)
	}
}

// TestFirstHourEnvGetShowsNextBase: env get says where the next session
// starts (from where it is run), and its YAML still applies.
func TestFirstHourEnvGetShowsNextBase(t *testing.T) {
	s := sessionCLIStart(t)
	mine := gitRepo(t, map[string]string{"MINE.md": "mine\n"})
	mineCommit := sessionCLIGit(t, mine, "rev-parse", "HEAD")
	if real, err := filepath.EvalSymlinks(mine); err == nil {
		mine = real
	}
	out, _, err := s.runIn(t, mine, "", "env", "get", "local")
	if want := "# the next session started here starts at " + mineCommit[:12] + " of " + mine + "\n"; err != nil || !strings.HasPrefix(out, want) {
		t.Errorf("env get local from another repository: %v, want it to start %q:\n%s", err, want, out)
	}
	eCommit := sessionCLIGit(t, s.repo, "rev-parse", "HEAD")
	out, _, err = s.runIn(t, mine, "", "env", "get", "e2e")
	if want := "# the next session started here starts at " + eCommit[:12] + " of " + s.repo + "\n"; err != nil || !strings.HasPrefix(out, want) {
		t.Errorf("env get e2e: %v, want it to start %q:\n%s", err, want, out)
	}
	if _, errOut, err := s.run(t, out, "env", "apply", "-f", "-"); err != nil {
		t.Errorf("env get's YAML does not apply: %v %s", err, errOut)
	}
}

// TestFirstHourForkNamesNeverRepeat: a second fork call numbers its forks
// (names and branches) on from the first's.
func TestFirstHourForkNamesNeverRepeat(t *testing.T) {
	s := sessionCLIStart(t)
	ctx := context.Background()
	s.ok(t, "session", "new", "par", "-e", "e2e")
	s.ok(t, "session", "open", "par")
	for _, n := range []int32{2, 1} {
		if _, err := s.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: "par", N: n}); err != nil {
			t.Fatalf("fork -n %d: %v", n, err)
		}
	}
	if _, err := s.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: "par", Names: []string{"mine"}}); err != nil {
		t.Fatalf("fork --name mine: %v", err)
	}
	for name, branch := range map[string]string{
		"par-fork-1": "hangar/session/par-fork-1", "par-fork-2": "hangar/session/par-fork-2",
		"par-fork-3": "hangar/session/par-fork-3", "mine": "hangar/session/par-fork-4",
	} {
		if got := s.get(t, name); got.GetBranch() != branch || got.GetParentId() != "par" {
			t.Errorf("fork %s: branch %q parent %q, want branch %q", name, got.GetBranch(), got.GetParentId(), branch)
		}
	}
}

// TestFirstHourRESTErrors: REST errors carry hangar's reason, not a gRPC
// code number.
func TestFirstHourRESTErrors(t *testing.T) {
	s := sessionCLIStart(t)
	req, err := http.NewRequest(http.MethodGet, s.env["HANGAR_URL"]+"/api/sessions/nope", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.env["HANGAR_TOKEN"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 404 || !strings.Contains(string(body), `"code":"NOT_FOUND","reason":"SESSION_NOT_FOUND","message":"session \"nope\" does not exist"`) {
		t.Errorf("GET /api/sessions/nope = %d %s", resp.StatusCode, body)
	}
}

// TestFirstHourWaiting: -w shows a tool call waiting on approval with the
// commands that answer it; fork -n 2 -w tags each line with its fork and
// ends with a line per fork.
func TestFirstHourWaiting(t *testing.T) {
	s := sessionFeatStart(t)
	ctx := context.Background()

	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- command.Execute(ctx, command.Streams{In: strings.NewReader(""), Out: &out, Err: &out},
			[]string{"session", "new", "ap", "Please do the approval task.", "-e", "e2e", "--approvals", "ask", "-w"}, lookup(s.env))
	}()
	// -w shows the held tool call: answer it from there.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(out.String(), "deny:  hangar session approvals ap --deny ") {
		select {
		case <-wctx.Done():
			t.Fatalf("-w never showed the tool call waiting on approval:\n%s", out.String())
		case <-tick.C:
		}
	}
	resp, err := s.sessions.ListApprovals(ctx, &sessionv1.ListApprovalsRequest{Name: "ap"})
	if err != nil || len(resp.GetApprovals()) != 1 {
		t.Fatalf("approvals: %v %v", resp, err)
	}
	id := resp.GetApprovals()[0].GetId()
	if _, err := s.sessions.AnswerApproval(ctx, &sessionv1.AnswerApprovalRequest{Name: "ap", ApprovalId: id, Allow: true}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("session new --approvals ask -w: %v\n%s", err, out.String())
	}
	r := struct{ out string }{out.String()}
	sessionCLIWant(t, "-w under --approvals ask", r.out, "approval needed: Bash ", "allow: hangar session approvals ap --allow "+id, "deny:  hangar session approvals ap --deny "+id, "turn 1 completed")

	s.mustCLI(t, "session", "new", "base", "hello", "-e", "e2e", "-w")
	forked, err := s.cli(t, "session", "fork", "base", "-n", "2", "hello again", "-w")
	if err != nil {
		t.Fatalf("fork -w: %v\n%s", err, forked)
	}
	sessionCLIWant(t, "fork -n 2 -w", forked, "[base-fork-1] ", "[base-fork-2] ", "\nforks:\n",
		"  base-fork-1  turn 2 completed", "branch hangar/session/base-fork-1 · hangar session patch base-fork-1",
		"  base-fork-2  turn 2 completed")
}

// syncBuffer is a bytes.Buffer safe to read while a command writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestFirstHourResumeInTheSandbox: the spec's "attach, then run the
// resume_command": a terminal attached to a session's sandbox gets the
// gateway URL and a token of its own, and the command it prints continues
// the agent's conversation through the gateway.
func TestFirstHourResumeInTheSandbox(t *testing.T) {
	s := sessionFeatStart(t)
	ctx := context.Background()
	s.mustCLI(t, "session", "new", "inter", "hello", "-e", "e2e", "-w")
	sess := s.get(t, "inter")

	_, err := s.sessions.StartInteractive(ctx, &sessionv1.StartInteractiveRequest{Name: "nope"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("StartInteractive of no session: %v", err)
	}

	// Attached with piped input: the shell has the run's URL and token.
	out, errOut, err := s.run(t, "echo \"url=$ANTHROPIC_BASE_URL key=${#ANTHROPIC_API_KEY}\"\nexit\n", "sb", "attach", sess.GetSandboxId())
	if err != nil || !strings.Contains(out, "url=http") || strings.Contains(out, "key=0") {
		t.Errorf("sb attach: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	if !strings.Contains(errOut, "session inter: continue the agent's conversation here with: ") || !strings.Contains(errOut, " --resume "+sess.GetConversationId()) {
		t.Errorf("sb attach does not say how to continue the conversation:\n%s", errOut)
	}

	// The command resumes the conversation through its own run.
	in, err := s.sessions.StartInteractive(ctx, &sessionv1.StartInteractiveRequest{Name: "inter"})
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code, err := sandboxexec.New(s.sandboxes).Exec(ctx, in.GetSandboxId(), 0, []string{"sh", "-c", in.GetCommand() + " -p 'Please do it again.'"}, in.GetEnv(), "", nil, &stdout, &stderr)
	if err != nil || code != 0 {
		t.Fatalf("%s: exit %d, %v\n%s%s", in.GetCommand(), code, err, stdout.String(), stderr.String())
	}
	run, err := s.gateway.GetRun(ctx, &gatewayv1.GetRunRequest{Run: in.GetRun()})
	if err != nil || run.GetRun().GetUsage().GetModelCalls() == 0 {
		t.Errorf("the resumed conversation made no model call through run %s: %v %v", in.GetRun(), run, err)
	}
	if _, err := s.sessions.EndInteractive(ctx, &sessionv1.EndInteractiveRequest{Name: "inter", Run: in.GetRun()}); err != nil {
		t.Fatal(err)
	}
	code, _ = sandboxexec.New(s.sandboxes).Exec(ctx, in.GetSandboxId(), 0, []string{"sh", "-c", in.GetCommand() + " -p 'Once more.'"}, in.GetEnv(), "", nil, &stdout, &stderr)
	if code == 0 {
		t.Errorf("the command still works after EndInteractive")
	}

	s.mustCLI(t, "session", "suspend", "inter")
	_, err = s.sessions.StartInteractive(ctx, &sessionv1.StartInteractiveRequest{Name: "inter"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "hangar session open inter first") {
		t.Errorf("StartInteractive of a suspended session: %v", err)
	}
}

// TestFirstHourResumePiInTheSandbox: the spec's "attach, then run the
// resume_command that get shows" for pi, which turns run by path with a
// Node >= 22.19 first on PATH: the attached shell finds pi by name and that
// Node, and get's resume_command, typed as it is, continues the
// conversation through the gateway.
func TestFirstHourResumePiInTheSandbox(t *testing.T) {
	if os.Getenv("HANGAR_PI_NODE_BIN_DIR") == "" {
		t.Skip("HANGAR_PI_NODE_BIN_DIR is not set (.ci/install-harnesses sets it)")
	}
	s := sessionFeatStart(t)
	s.mustCLI(t, "session", "new", "pi-inter", "hello", "-e", "e2e", "--harness", "pi", "-w")
	sess := s.get(t, "pi-inter")
	resume := sess.GetResumeCommand()
	if !strings.HasPrefix(resume, "pi --session-id ") {
		t.Fatalf("resume_command = %q, want pi --session-id ...", resume)
	}
	script := "command -v pi\nnode --version\n" + resume + " -p 'Please do it again.'; echo \"resume-exit=$?\"\nexit\n"
	out, errOut, err := s.run(t, script, "sb", "attach", sess.GetSandboxId())
	if err != nil {
		t.Fatalf("sb attach: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	// pi by name, pi's Node (the system's is older), and the scripted
	// model's answer through the gateway.
	sessionCLIWant(t, "resume_command in an attached shell", out, "/pi\r\n", "v22.", "OK.", "resume-exit=0")
	if strings.Contains(out, "not found") {
		t.Errorf("the attached shell misses a program:\n%s", out)
	}
	sessionCLIWant(t, "sb attach's hint", errOut, "session pi-inter: continue the agent's conversation here with: ", "--session-id")
}

// TestFirstHourCompletionAndOutput: completion offers sessions,
// environments and harnesses; -o json|yaml on the read commands answers the
// REST API's JSON.
func TestFirstHourCompletionAndOutput(t *testing.T) {
	s := sessionCLIStart(t)
	s.ok(t, "session", "new", "comp-one", "-e", "e2e")
	sessionCLIWant(t, "completing a session name", s.ok(t, "__complete", "session", "get", ""), "comp-one\tsuspended")
	sessionCLIWant(t, "completing -e", s.ok(t, "__complete", "session", "new", "x", "-e", ""), "e2e\t"+s.repo)
	sessionCLIWant(t, "completing --harness", s.ok(t, "__complete", "session", "new", "x", "--harness", ""), "claude", "codex", "pi", "antigravity")

	for _, args := range [][]string{
		{"session", "list"}, {"session", "get", "comp-one"}, {"session", "events", "comp-one"}, {"session", "artifacts", "comp-one"},
		{"sb", "list"}, {"env", "list"}, {"checkpoint", "list", "comp-one"}, {"job", "list"}, {"status"},
	} {
		out := s.ok(t, append(args, "-o", "json")...)
		var v map[string]any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Errorf("hangar %s -o json is not a JSON object: %v\n%s", strings.Join(args, " "), err, out)
		}
		if y := s.ok(t, append(args, "-o", "yaml")...); strings.HasPrefix(strings.TrimSpace(y), "{") {
			t.Errorf("hangar %s -o yaml printed JSON:\n%s", strings.Join(args, " "), y)
		}
	}
	// The REST API's field names, enums as the docs write them, 64-bit
	// integers as numbers.
	out := s.ok(t, "session", "get", "comp-one", "-o", "json")
	sessionCLIWant(t, "session get -o json", out, `"base_commit":`, `"state_reason":`, `"state": "suspended"`, `"harness": "claude"`, `"input_tokens": 0`)
	if strings.Contains(out, "SESSION_STATE_") || strings.Contains(out, "HARNESS_") || strings.Contains(out, `_tokens": "`) {
		t.Errorf("session get -o json has proto enum names or 64-bit integers as strings:\n%s", out)
	}
	// -o json is the REST answer.
	req, err := http.NewRequest(http.MethodGet, s.env["HANGAR_URL"]+"/api/sessions/comp-one", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.env["HANGAR_TOKEN"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	var fromCLI, fromREST map[string]any
	if err := json.Unmarshal([]byte(out), &fromCLI); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(rest, &fromREST); err != nil {
		t.Fatalf("GET /api/sessions/comp-one = %d %s", resp.StatusCode, rest)
	}
	if got := fromREST["session"]; !reflect.DeepEqual(got, fromCLI) {
		t.Errorf("GET /api/sessions/comp-one's session = %v\nsession get -o json = %v", got, fromCLI)
	}
	// Requests take the docs' names too: ?states=suspended.
	req.URL.Path, req.URL.RawQuery = "/api/sessions", "states=suspended&states=SESSION_STATE_IDLE"
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	rest, _ = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(rest), `"name":"comp-one"`) || !strings.Contains(string(rest), `"state":"suspended"`) {
		t.Errorf("GET /api/sessions?states=suspended = %d %s", resp.StatusCode, rest)
	}
}
