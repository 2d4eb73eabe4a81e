package e2e_test

// More end-to-end sessions (issue 6): idle suspension on an injected clock,
// a sandbox destroyed under a session, a switch of agent (handoff),
// questions and artifacts, bad input, and the resume benchmark. Real agent
// CLIs, real sandboxes, the real gateway and checkpoint service, all started
// by `hangar up`'s stack.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
	sessionapp "github.com/hangar-dev/hangar/session-svc/app"
)

// Tool commands of the scripted answers below.
const (
	sessionMoreAlphaCmd = `printf 'alpha\n' > alpha.txt && echo alpha-done`
	sessionMoreBetaCmd  = `printf 'beta\n' > beta.txt && echo beta-done`
	sessionMoreGammaCmd = `echo gamma-done`
	// The agent hands a report back, then asks a question.
	sessionMoreAskCmd = `printf 'the report\n' > report.txt && hangar-agent artifact report.txt && hangar-agent ask "Which colour?"`
	// A long turn: it says it is waiting, then waits for a file the test
	// creates.
	sessionMoreWaitCmd = `touch waiting.flag && while [ ! -f release.flag ]; do sleep 0.05; done && echo released`
	// A crash: the tool command kills the agent CLI that runs it (its
	// nearest ancestor running `claude -p`), and nothing else. The
	// pattern is split so the shells on the way, whose command line holds
	// this text, don't match it.
	sessionMoreCrashCmd = `pat="bin/claude"" -p"; p=$PPID; while [ "$p" -gt 1 ]; do if tr '\0' ' ' < /proc/$p/cmdline | grep -q "$pat"; then kill -9 "$p"; exit 0; fi; p=$(awk '{print $4}' /proc/$p/stat); done; echo no agent found; exit 1`
)

// sessionMoreScript answers each CLI with its own shell tool. Rules for
// later turns come first: a handoff prompt holds the earlier turns'
// requests too.
func sessionMoreScript() scripted.Script {
	rules := []scripted.Rule{{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Done with the task."}}}
	for _, job := range []struct{ prompt, cmd string }{
		{"gamma job", sessionMoreGammaCmd},
		{"beta job", sessionMoreBetaCmd},
		{"alpha job", sessionMoreAlphaCmd},
		{"ask job", sessionMoreAskCmd},
		{"wait job", sessionMoreWaitCmd},
		{"crash job", sessionMoreCrashCmd},
	} {
		rules = append(rules, shellRules(job.prompt, job.cmd)...)
	}
	return scripted.Script{Rules: rules, Default: &scripted.Answer{Text: "OK."}}
}

// sessionMoreClock is the session service's injected clock: Now moves only
// when the test advances it; Tick runs one sweep per send.
type sessionMoreClock struct {
	mu   sync.Mutex
	now  time.Time
	tick chan time.Time
}

func (c *sessionMoreClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *sessionMoreClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// sweep runs one full sweep: the second send returns once the first sweep
// has finished.
func (c *sessionMoreClock) sweep(t testing.TB) {
	t.Helper()
	for range 2 {
		select {
		case c.tick <- c.Now():
		case <-time.After(2 * time.Minute):
			t.Fatal("the session service's sweep loop did not take a tick")
		}
	}
}

// sessionMoreStack is hangar with the scripted upstream and the real CLIs;
// repo is the "e2e" environment's repository.
type sessionMoreStack struct {
	*stack
	repo string
}

// sessionMoreStart starts hangar. With clock the session service's idle
// clock and sweeps are the test's. needCLIs skips the test when the agent
// CLIs aren't installed.
func sessionMoreStart(t testing.TB, clock *sessionMoreClock, needCLIs bool) *sessionMoreStack {
	t.Helper()
	script := sessionMoreScript()
	opts := stackOptions{script: &script, optionalCLIs: !needCLIs}
	if clock != nil {
		opts.clock = sessionapp.Clock{Now: clock.Now, Tick: clock.tick}
	}
	s := &sessionMoreStack{stack: startStack(t, opts), repo: gitRepo(t, nil)}
	s.applyEnvironment(t, "e2e", s.repo, 0, sandboxv1.Egress_EGRESS_FULL)
	return s
}

// sessionMoreFiles is n files of size bytes each, each different so git
// stores every one.
func sessionMoreFiles(n, size int) map[string]string {
	content := bytes.Repeat([]byte("hangar resume benchmark line\n"), size/29+1)[:size]
	files := make(map[string]string, n)
	for i := range n {
		files[filepath.Join(fmt.Sprintf("d%02d", i%50), fmt.Sprintf("f%04d.txt", i))] = fmt.Sprintf("file %d\n", i) + string(content)
	}
	return files
}

// create starts a session with a first turn and waits for it to end.
func (s *sessionMoreStack) create(t testing.TB, name string, h sessionv1.Harness, message string) *sessionv1.Turn {
	t.Helper()
	if _, err := s.sessions.CreateSession(context.Background(), &sessionv1.CreateSessionRequest{
		Name: name, Environment: "e2e", Harness: h, Message: message,
	}); err != nil {
		t.Fatalf("new %s: %v", name, err)
	}
	return s.waitTurn(t, name, 1)
}

// send runs a turn and waits for it to end.
func (s *sessionMoreStack) send(t testing.TB, name string, h sessionv1.Harness, message string) *sessionv1.Turn {
	t.Helper()
	resp, err := s.sessions.SendMessage(context.Background(), &sessionv1.SendMessageRequest{Name: name, Message: message, Harness: h})
	if err != nil {
		t.Fatalf("send to %s: %v", name, err)
	}
	return s.waitTurn(t, name, resp.GetTurn().GetNumber())
}

// sessionMoreEventually polls cond until it holds or the deadline passes.
func sessionMoreEventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		case <-poll.C:
		}
	}
}

func sessionMoreCompleted(t testing.TB, turn *sessionv1.Turn) {
	t.Helper()
	if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("turn %d: %v (%s)", turn.GetNumber(), turn.GetOutcome(), turn.GetOutcomeReason())
	}
}

func sessionMoreGone(t testing.TB, s *sessionMoreStack, sandboxID string) {
	t.Helper()
	if _, err := s.sandboxes.GetSandbox(context.Background(), &sandboxv1.GetSandboxRequest{SandboxId: sandboxID}); status.Code(err) != codes.NotFound {
		t.Errorf("sandbox %s still answers: %v", sandboxID, err)
	}
}

// TestSessionIdleSuspension: with the injected clock, a terminal hold keeps
// an idle session up past its idle time; once released, the next idle time
// suspends it. A session kept with --idle 0 never suspends.
func TestSessionIdleSuspension(t *testing.T) {
	clock := &sessionMoreClock{now: time.Now().UTC(), tick: make(chan time.Time)}
	s := sessionMoreStart(t, clock, true)
	ctx := context.Background()

	// Both first turns run at once.
	for _, name := range []string{"idle-one", "idle-never"} {
		if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
			Name: name, Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Please do the alpha job.",
		}); err != nil {
			t.Fatalf("new %s: %v", name, err)
		}
	}
	for _, name := range []string{"idle-one", "idle-never"} {
		sessionMoreCompleted(t, s.waitTurn(t, name, 1))
	}
	for name, idle := range map[string]int32{"idle-one": 1, "idle-never": 0} {
		if _, err := s.sessions.KeepSession(ctx, &sessionv1.KeepSessionRequest{Name: name, IdleMinutes: idle}); err != nil {
			t.Fatalf("keep %s --idle %d: %v", name, idle, err)
		}
	}
	sandbox := s.get(t, "idle-one").GetSandboxId()

	hold, err := s.sessions.AcquireHold(ctx, &sessionv1.AcquireHoldRequest{
		Name: "idle-one", Owner: "e2e-terminal", Kind: sessionv1.HoldKind_HOLD_KIND_TERMINAL, Description: "a terminal", TtlSeconds: 24 * 3600,
	})
	if err != nil {
		t.Fatalf("acquire hold: %v", err)
	}
	clock.advance(90 * time.Second)
	clock.sweep(t)
	held := s.get(t, "idle-one")
	if held.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE || held.GetSandboxId() != sandbox {
		t.Fatalf("held past its idle time: %v (%s), sandbox %q", held.GetState(), held.GetStateReason(), held.GetSandboxId())
	}
	if len(held.GetHolds()) != 1 || held.GetHolds()[0].GetId() != hold.GetHold().GetId() || held.GetHolds()[0].GetKind() != sessionv1.HoldKind_HOLD_KIND_TERMINAL {
		t.Fatalf("get shows holds %v, want the terminal hold %s", held.GetHolds(), hold.GetHold().GetId())
	}
	if held.GetSuspendAt() != nil {
		t.Errorf("a held session says it suspends at %v", held.GetSuspendAt().AsTime())
	}

	if _, err := s.sessions.ReleaseHold(ctx, &sessionv1.ReleaseHoldRequest{Name: "idle-one", HoldId: hold.GetHold().GetId()}); err != nil {
		t.Fatalf("release hold: %v", err)
	}
	// The idle time counts from the release, not from the turn.
	clock.sweep(t)
	if st := s.get(t, "idle-one"); st.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE {
		t.Fatalf("suspended right after the hold ended: %v (%s)", st.GetState(), st.GetStateReason())
	} else if st.GetSuspendAt() == nil || !st.GetSuspendAt().AsTime().Equal(clock.Now().Add(time.Minute).Truncate(time.Microsecond)) {
		t.Errorf("suspend_at %v, want a minute after the release (%v)", st.GetSuspendAt().AsTime(), clock.Now().Add(time.Minute))
	}
	clock.advance(61 * time.Second)
	clock.sweep(t)
	suspended := s.get(t, "idle-one")
	if suspended.GetState() != sessionv1.SessionState_SESSION_STATE_SUSPENDED || suspended.GetSandboxId() != "" {
		t.Fatalf("after its idle time: %v (%s), sandbox %q", suspended.GetState(), suspended.GetStateReason(), suspended.GetSandboxId())
	}
	if !strings.Contains(suspended.GetStateReason(), "idle") {
		t.Errorf("state_reason %q does not say it was idle", suspended.GetStateReason())
	}
	sessionMoreGone(t, s, sandbox)

	// --idle 0: never, however long.
	clock.advance(72 * time.Hour)
	clock.sweep(t)
	never := s.get(t, "idle-never")
	if never.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE || never.GetSandboxId() == "" || never.GetSuspendAt() != nil {
		t.Fatalf("--idle 0 session after 72 hours: %v (%s), sandbox %q, suspend_at %v", never.GetState(), never.GetStateReason(), never.GetSandboxId(), never.GetSuspendAt())
	}
}

// TestSessionSandboxDestroyedUnder: a sandbox released under its session
// (through the sandbox API, with the lease's token) is checkpointed by the
// destroy hook first; the session ends suspended and the next turn finds
// the change made just before.
func TestSessionSandboxDestroyedUnder(t *testing.T) {
	s := sessionMoreStart(t, nil, true)
	ctx := context.Background()
	const name = "destroyed"
	sessionMoreCompleted(t, s.create(t, name, sessionv1.Harness_HARNESS_CLAUDE, "Please do the alpha job."))
	sandboxID := s.get(t, name).GetSandboxId()
	if out, code := s.exec(t, sandboxID, `printf 'late change\n' > late.txt`); code != 0 {
		t.Fatalf("write late.txt: %d %s", code, out)
	}
	sb, err := s.sandboxes.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: sandboxID})
	if err != nil || sb.GetSandbox().GetLease().GetFencingToken() == 0 {
		t.Fatalf("sandbox %s: %v, lease %v", sandboxID, err, sb.GetSandbox().GetLease())
	}
	if _, err := s.sandboxes.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{
		SandboxId: sandboxID, FencingToken: sb.GetSandbox().GetLease().GetFencingToken(),
	}); err != nil {
		t.Fatalf("release the session's sandbox: %v", err)
	}
	sessionMoreEventually(t, 2*time.Minute, "the session to be suspended", func() bool {
		return s.get(t, name).GetState() == sessionv1.SessionState_SESSION_STATE_SUSPENDED
	})
	sessionMoreEventually(t, 2*time.Minute, "the sandbox to be destroyed", func() bool {
		_, err := s.sandboxes.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: sandboxID})
		return status.Code(err) == codes.NotFound
	})
	sess := s.get(t, name)
	if sess.GetSandboxId() != "" || !strings.Contains(sess.GetStateReason(), "destroyed") {
		t.Errorf("after the destroy: sandbox %q, reason %q", sess.GetSandboxId(), sess.GetStateReason())
	}
	if len(sess.GetCheckpoints()) == 0 || sess.GetCheckpoints()[0].GetReason() != "before_destroy" {
		var reasons []string
		for _, c := range sess.GetCheckpoints() {
			reasons = append(reasons, c.GetReason())
		}
		t.Fatalf("newest checkpoint is not before_destroy: %v", reasons)
	}

	sessionMoreCompleted(t, s.send(t, name, 0, "Anything else?"))
	after := s.get(t, name)
	if out, code := s.exec(t, after.GetSandboxId(), `cat late.txt alpha.txt`); code != 0 || out != "late change\nalpha\n" {
		t.Errorf("restored tree: code %d, late.txt + alpha.txt = %q", code, out)
	}
}

// TestSessionHandoffClaudeToCodex: switching agent starts the new one with
// an account of the earlier turns; its later turns resume its own
// conversation.
func TestSessionHandoffClaudeToCodex(t *testing.T) {
	s := sessionMoreStart(t, nil, true)
	ctx := context.Background()
	const name = "handoff"
	sessionMoreCompleted(t, s.create(t, name, sessionv1.Harness_HARNESS_CLAUDE, "Please do the alpha job."))
	claudeConversation := s.get(t, name).GetConversationId()

	second := s.send(t, name, sessionv1.Harness_HARNESS_CODEX, "Now the beta job.")
	sessionMoreCompleted(t, second)
	if second.GetHarness() != sessionv1.Harness_HARNESS_CODEX {
		t.Errorf("turn 2 ran %v", second.GetHarness())
	}
	tape, err := s.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: second.GetRunId()})
	if err != nil || len(tape.GetSteps()) == 0 {
		t.Fatalf("tape of turn 2: %v (%d steps)", err, len(tape.GetSteps()))
	}
	body := string(tape.GetSteps()[0].GetRequest().GetBody())
	for _, want := range []string{"continuing a session that another coding agent", "Turn 1 (claude)", "alpha job", "Done with the task.", "beta job"} {
		if !strings.Contains(body, want) {
			t.Errorf("turn 2's first model request lacks the handoff's %q:\n%.3000s", want, body)
		}
	}
	sess := s.get(t, name)
	if sess.GetHarness() != sessionv1.Harness_HARNESS_CODEX || sess.GetConversationId() == "" || sess.GetConversationId() == claudeConversation {
		t.Fatalf("after the switch: harness %v, conversation %q (claude's was %q)", sess.GetHarness(), sess.GetConversationId(), claudeConversation)
	}
	if !strings.Contains(sess.GetResumeCommand(), "codex") {
		t.Errorf("resume command %q is not codex's", sess.GetResumeCommand())
	}

	// Suspend between, so the third turn also restores Codex's files.
	if _, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: name}); err != nil {
		t.Fatalf("suspend: %v", err)
	}
	third := s.send(t, name, 0, "And the gamma job.")
	sessionMoreCompleted(t, third)
	if third.GetHarness() != sessionv1.Harness_HARNESS_CODEX || !strings.Contains(third.GetCommand(), "resume") || !strings.Contains(third.GetCommand(), sess.GetConversationId()) {
		t.Errorf("turn 3: harness %v, command %q: want codex resuming %s", third.GetHarness(), third.GetCommand(), sess.GetConversationId())
	}
	tape, err = s.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: third.GetRunId()})
	if err != nil || len(tape.GetSteps()) == 0 {
		t.Fatalf("tape of turn 3: %v (%d steps)", err, len(tape.GetSteps()))
	}
	body = string(tape.GetSteps()[0].GetRequest().GetBody())
	if !strings.Contains(body, "beta-done") || !strings.Contains(body, "gamma job") {
		t.Errorf("turn 3's first model request does not carry Codex's own conversation (turn 2's tool output):\n%.3000s", body)
	}
	if strings.Count(body, "continuing a session that another coding agent") != 1 {
		t.Errorf("turn 3 repeats or lost the handoff: %d copies", strings.Count(body, "continuing a session that another coding agent"))
	}
}

// TestSessionQuestionAndArtifact: `hangar-agent artifact` hands a file back
// and `hangar-agent ask` ends the turn needs_input; the next send answers.
func TestSessionQuestionAndArtifact(t *testing.T) {
	s := sessionMoreStart(t, nil, true)
	ctx := context.Background()
	const name = "asks"
	first := s.create(t, name, sessionv1.Harness_HARNESS_CLAUDE, "Please do the ask job.")
	if first.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_NEEDS_INPUT {
		t.Fatalf("turn 1: %v (%s), want needs_input", first.GetOutcome(), first.GetOutcomeReason())
	}
	sess := s.get(t, name)
	if sess.GetState() != sessionv1.SessionState_SESSION_STATE_NEEDS_INPUT || sess.GetQuestion().GetText() != "Which colour?" || sess.GetQuestion().GetTurn() != 1 {
		t.Fatalf("session: %v, question %v", sess.GetState(), sess.GetQuestion())
	}
	if len(first.GetArtifacts()) != 1 || first.GetArtifacts()[0].GetPath() != "report.txt" {
		t.Errorf("turn 1's artifacts: %v", first.GetArtifacts())
	}
	list, err := s.sessions.ListArtifacts(ctx, &sessionv1.ListArtifactsRequest{Name: name})
	if err != nil || len(list.GetArtifacts()) != 1 || list.GetArtifacts()[0].GetPath() != "report.txt" {
		t.Fatalf("list artifacts: %v, %v", err, list.GetArtifacts())
	}
	got, err := s.sessions.GetArtifact(ctx, &sessionv1.GetArtifactRequest{Name: name, Path: "report.txt"})
	if err != nil || string(got.GetContent()) != "the report\n" {
		t.Fatalf("get artifact: %v, %q", err, got.GetContent())
	}
	// The same over REST: .../artifacts lists (it was routed to
	// GetArtifact of an empty path), .../artifacts/PATH gets one.
	restGet := func(path string) (int, map[string]any) {
		req, err := http.NewRequest(http.MethodGet, s.env["HANGAR_URL"]+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+s.env["HANGAR_TOKEN"])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}
	code, listed := restGet("/api/sessions/" + name + "/artifacts")
	if arts, _ := listed["artifacts"].([]any); code != http.StatusOK || len(arts) != 1 || arts[0].(map[string]any)["path"] != "report.txt" {
		t.Errorf("GET /api/sessions/%s/artifacts = %d %v", name, code, listed)
	}
	code, one := restGet("/api/sessions/" + name + "/artifacts/report.txt")
	if code != http.StatusOK || one["content"] != base64.StdEncoding.EncodeToString([]byte("the report\n")) {
		t.Errorf("GET /api/sessions/%s/artifacts/report.txt = %d %v", name, code, one)
	}

	second := s.send(t, name, 0, "Blue.")
	sessionMoreCompleted(t, second)
	sess = s.get(t, name)
	if sess.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE || sess.GetQuestion() != nil {
		t.Errorf("after the answer: %v, question %v", sess.GetState(), sess.GetQuestion())
	}
}

// sessionMoreField is the BadRequest field an error names.
func sessionMoreField(err error) string {
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

// TestSessionBadInput: what the service refuses, and a CLI that crashes
// mid-turn.
func TestSessionBadInput(t *testing.T) {
	s := sessionMoreStart(t, nil, true)
	ctx := context.Background()
	want := func(t *testing.T, err error, code codes.Code, what string) {
		t.Helper()
		if status.Code(err) != code {
			t.Errorf("%s: %v, want %v", what, err, code)
		}
	}

	t.Run("names", func(t *testing.T) {
		for _, bad := range []string{"Upper", "under_score", "-lead", "trail-", "dot.ted", strings.Repeat("a", 64), ""} {
			_, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: bad, Environment: "e2e"})
			want(t, err, codes.InvalidArgument, fmt.Sprintf("new %q", bad))
			if f := sessionMoreField(err); f != "name" {
				t.Errorf("new %q names field %q, want name", bad, f)
			}
			_, err = s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: bad, Message: "hi"})
			want(t, err, codes.InvalidArgument, fmt.Sprintf("send %q", bad))
			if f := sessionMoreField(err); f != "name" {
				t.Errorf("send %q names field %q, want name", bad, f)
			}
		}
	})
	t.Run("duplicate", func(t *testing.T) {
		if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "twice", Environment: "e2e"}); err != nil {
			t.Fatal(err)
		}
		_, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "twice", Environment: "e2e"})
		want(t, err, codes.AlreadyExists, "second new twice")
	})
	t.Run("unknown", func(t *testing.T) {
		_, err := s.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: "nobody"})
		want(t, err, codes.NotFound, "get")
		_, err = s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: "nobody", Message: "hi"})
		want(t, err, codes.NotFound, "send")
		_, err = s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: "nobody"})
		want(t, err, codes.NotFound, "suspend")
		_, err = s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "nobody"})
		want(t, err, codes.NotFound, "open")
		_, err = s.sessions.KeepSession(ctx, &sessionv1.KeepSessionRequest{Name: "nobody", IdleMinutes: 5})
		want(t, err, codes.NotFound, "keep")
		_, err = s.sessions.ArchiveSession(ctx, &sessionv1.ArchiveSessionRequest{Name: "nobody"})
		want(t, err, codes.NotFound, "archive")
		_, err = s.sessions.ListArtifacts(ctx, &sessionv1.ListArtifactsRequest{Name: "nobody"})
		want(t, err, codes.NotFound, "artifacts")
	})
	t.Run("archived", func(t *testing.T) {
		if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "old", Environment: "e2e"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.sessions.ArchiveSession(ctx, &sessionv1.ArchiveSessionRequest{Name: "old"}); err != nil {
			t.Fatal(err)
		}
		_, err := s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: "old", Message: "hi"})
		want(t, err, codes.FailedPrecondition, "send to archived")
	})
	t.Run("suspend during a turn", func(t *testing.T) {
		const name = "busy"
		if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
			Name: name, Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Please do the wait job.",
		}); err != nil {
			t.Fatal(err)
		}
		var sandboxID string
		sessionMoreEventually(t, 2*time.Minute, "the turn's tool command to be waiting", func() bool {
			sandboxID = s.get(t, name).GetSandboxId()
			if sandboxID == "" {
				return false
			}
			_, code := s.exec(t, sandboxID, "test -f waiting.flag")
			return code == 0
		})
		_, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: name})
		want(t, err, codes.FailedPrecondition, "suspend during a turn")
		if st := s.get(t, name); st.GetState() != sessionv1.SessionState_SESSION_STATE_RUNNING || st.GetSandboxId() != sandboxID {
			t.Errorf("after the refused suspend: %v, sandbox %q", st.GetState(), st.GetSandboxId())
		}
		if out, code := s.exec(t, sandboxID, "touch release.flag"); code != 0 {
			t.Fatalf("release the turn: %s", out)
		}
		sessionMoreCompleted(t, s.waitTurn(t, name, 1))
		if _, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: name}); err != nil {
			t.Errorf("suspend after the turn: %v", err)
		}
	})
	t.Run("agent crashes", func(t *testing.T) {
		const name = "crash"
		first := s.create(t, name, sessionv1.Harness_HARNESS_CLAUDE, "Please do the crash job.")
		if first.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_FAILED {
			if evs, err := s.sessions.ListEvents(ctx, &sessionv1.ListEventsRequest{Name: name}); err == nil {
				for _, e := range evs.GetEvents() {
					t.Logf("event %v: %s", e.GetKind(), e.GetText())
				}
			}
			if tape, err := s.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: first.GetRunId()}); err == nil {
				steps := tape.GetSteps()
				body := string(steps[len(steps)-1].GetRequest().GetBody())
				if i := strings.Index(body, "tool_result"); i >= 0 {
					t.Logf("tool result: %s", body[i:min(len(body), i+800)])
				}
			}
			t.Fatalf("turn 1: %v (%s), want failed", first.GetOutcome(), first.GetOutcomeReason())
		}
		if first.GetCheckpointId() == "" {
			t.Errorf("the failed turn has no checkpoint")
		}
		if !strings.Contains(first.GetOutcomeReason(), "killed by signal KILL") {
			t.Errorf("the crashed turn's reason %q does not say the agent was killed", first.GetOutcomeReason())
		}
		sess := s.get(t, name)
		if sess.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE || sess.GetSandboxId() == "" {
			t.Fatalf("after the crash: %v (%s), sandbox %q", sess.GetState(), sess.GetStateReason(), sess.GetSandboxId())
		}
		sessionMoreCompleted(t, s.send(t, name, 0, "Please do the alpha job."))
		if out, code := s.exec(t, s.get(t, name).GetSandboxId(), "cat alpha.txt"); code != 0 || out != "alpha\n" {
			t.Errorf("after the crash the next turn did not work: %d %q", code, out)
		}
	})
}

// BenchmarkSessionResume: time until a suspended session is ready for its
// next turn (OpenSession: sandbox leased, newest checkpoint restored and
// verified), on a 5,000-file repository (~40 MB; HANGAR_BENCH_FILES=5000,20000
// runs each size, the cases named files=N/case). No agent CLI runs, so its
// start is not included. The cases:
//   - cached: the session's own sandbox, kept by the sandbox cache since its
//     suspend, checked against the checkpoint (a capture that stores
//     nothing);
//   - pooled: the cache off, a warm pool of one (restore and verify into a
//     ready clone);
//   - cold: the cache off and no pool (a new sandbox: a base layer's
//     mount or a clone; restore, verify).
//
// The cache-off cases run on a second hangar in the same process
// (HANGAR_SANDBOX_CACHE=0).
func BenchmarkSessionResume(b *testing.B) {
	cachedStack := sessionMoreStart(b, nil, false)
	script := sessionMoreScript()
	uncachedStack := &sessionMoreStack{stack: startStack(b, stackOptions{script: &script, optionalCLIs: true,
		vars: map[string]string{"HANGAR_SANDBOX_CACHE": "0"}})}
	sizes := benchFiles(b, 5000)
	for _, files := range sizes {
		prefix := ""
		if len(sizes) > 1 || files != 5000 {
			prefix = fmt.Sprintf("files=%d/", files)
		}
		benchSessionResume(b, cachedStack, uncachedStack, files, prefix)
	}
}

// benchSessionResume runs BenchmarkSessionResume's cases on a repository of
// files files.
func benchSessionResume(b *testing.B, cachedStack, uncachedStack *sessionMoreStack, files int, prefix string) {
	ctx := context.Background()
	repo := gitRepo(b, sessionMoreFiles(files, 8<<10)) // ~40 MB at 5,000
	b.ResetTimer()
	for _, c := range []struct {
		name string
		s    *sessionMoreStack
		pool int32
	}{{"cached", cachedStack, 0}, {"pooled", uncachedStack, 1}, {"cold", uncachedStack, 0}} {
		s := c.s
		env := fmt.Sprintf("bench-%s-%d", c.name, files)
		s.applyEnvironment(b, env, repo, c.pool, sandboxv1.Egress_EGRESS_FULL)
		runs := 0
		b.Run(prefix+c.name, func(b *testing.B) {
			runs++
			name := fmt.Sprintf("resume-%s-%d-%d", c.name, files, runs)
			if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: name, Environment: env}); err != nil {
				b.Fatal(err)
			}
			opened, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name})
			if err != nil {
				b.Fatal(err)
			}
			// Some work to restore: an edit, a new file and a commit.
			if out, code := s.exec(b, opened.GetSession().GetSandboxId(), `printf 'x\n' >> d00/f0000.txt && printf 'new\n' > new.txt && git add new.txt && git -c user.name=t -c user.email=t@t commit -qm work && printf 'more\n' > more.txt`); code != 0 {
				b.Fatalf("work: %s", out)
			}
			suspend := func() {
				if _, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: name}); err != nil {
					b.Fatal(err)
				}
				if c.pool > 0 {
					sessionMoreEventually(b, 5*time.Minute, "the warm pool to be ready", func() bool {
						p, err := s.sandboxes.GetPool(ctx, &sandboxv1.GetPoolRequest{Environment: env})
						return err == nil && p.GetPool().GetReady() >= c.pool && p.GetPool().GetCreating() == 0
					})
				}
			}
			b.StopTimer()
			suspend()
			misses := func() int64 {
				p, err := s.sandboxes.GetPool(ctx, &sandboxv1.GetPoolRequest{Environment: env})
				if err != nil {
					b.Fatal(err)
				}
				return p.GetPool().GetMisses()
			}
			missesBefore := misses()
			// A cached sandbox is the session's own leased again: the
			// same id every time.
			firstID, otherIDs := opened.GetSession().GetSandboxId(), 0
			b.StartTimer()
			for b.Loop() {
				o, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name})
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if o.GetSession().GetSandboxId() != firstID {
					otherIDs++
				}
				suspend()
				b.StartTimer()
			}
			b.StopTimer()
			switch {
			case c.pool > 0:
				// Every timed open was served from the warm pool.
				if n := misses() - missesBefore; n != 0 {
					b.Errorf("%d timed opens missed the warm pool", n)
				}
			case c.s == cachedStack && otherIDs != 0:
				b.Errorf("%d timed opens did not reuse the cached sandbox", otherIDs)
			case c.s != cachedStack && otherIDs == 0:
				b.Errorf("the timed opens reused the sandbox with the cache off")
			}
			if out, _ := s.exec(b, func() string {
				o, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name})
				if err != nil {
					b.Fatal(err)
				}
				return o.GetSession().GetSandboxId()
			}(), `git log --format=%s -1; cat more.txt new.txt; tail -c 2 d00/f0000.txt`); out != "work\nmore\nnew\nx\n" {
				b.Errorf("restored tree: %q", out)
			}
		})
	}
}
