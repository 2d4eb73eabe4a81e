package e2e_test

// End-to-end sessions: the real agent CLIs (Claude Code, Codex, pi) in real
// sandboxes, through the real gateway to the scripted upstream, checkpointed
// by the real checkpoint service, all started by `hangar up`'s stack.

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// The first turn's work: a commit, an uncommitted edit, a staged file and an
// untracked one.
const sessionE2EFirstCmd = `printf 'one\n' > tracked.txt && git add tracked.txt && git commit -qm 'first commit' && printf 'edit\n' >> tracked.txt && printf 'staged\n' > staged.txt && git add staged.txt && printf 'new\n' > untracked.txt && echo first-done`

// The second turn's work.
const sessionE2ESecondCmd = `printf 'second\n' > second.txt && echo second-done`

// sessionE2EScript answers each CLI with its own shell tool: Claude Code
// offers Bash, Codex exec_command, pi bash.
func sessionE2EScript() scripted.Script {
	rules := []scripted.Rule{{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Done with the task."}}}
	rules = append(rules, shellRules("first task", sessionE2EFirstCmd)...)
	rules = append(rules, shellRules("second task", sessionE2ESecondCmd)...)
	return scripted.Script{
		Rules:   rules,
		Default: &scripted.Answer{Text: "OK."},
	}
}

// sessionE2EStart starts hangar with the scripted upstream and the real
// CLIs, and an "e2e" environment of a small repository of its own, so
// sandboxes clone fast.
func sessionE2EStart(t *testing.T, vars ...map[string]string) *stack {
	t.Helper()
	script := sessionE2EScript()
	opts := stackOptions{script: &script}
	if len(vars) > 0 {
		opts.vars = vars[0]
	}
	s := startStack(t, opts)
	s.applyEnvironment(t, "e2e", gitRepo(t, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	return s
}

// TestSessionSurvivesSuspendAndResume is the product's promise, for each
// real CLI: a first turn that commits, edits, stages and creates files; a
// suspend that releases the sandbox; a second turn that resumes the agent's
// own conversation in a restored work tree that is exactly as it was left.
// The sandbox cache is off so the resume restores into a new sandbox
// (TestSessionResumeFromCache and BenchmarkTurnLatency resume from it).
func TestSessionSurvivesSuspendAndResume(t *testing.T) {
	s := sessionE2EStart(t, map[string]string{"HANGAR_SANDBOX_CACHE": "0"})
	for _, h := range agentCLIs {
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
			first := s.waitTurn(t, name, 1)
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
			before := s.mustExec(t, sess.GetSandboxId(), sessionE2ETreeScript)
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
			second := s.waitTurn(t, name, 2)
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
			after := s.mustExec(t, resumed.GetSandboxId(), sessionE2ETreeScript)
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
