package e2e_test

// The dashboard in a real browser: headless Chromium (Debian's chromium)
// driven over the DevTools protocol (chromedp) against a real hangar with
// the scripted model and the real agent CLIs.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// browserWait bounds each wait for the page; generous, as the machine is
// shared (a cold sandbox restore, an agent CLI starting).
const browserWait = 3 * time.Minute

// chromiumPath is the browser to drive: HANGAR_CHROMIUM, or chromium on
// PATH (Debian's package; .ci/run installs it).
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("HANGAR_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium on PATH (apt-get install chromium, or set HANGAR_CHROMIUM)")
	return ""
}

// browser starts a headless Chromium with a fresh profile for the test and
// returns a tab's context. apiStatuses collects the status of every /api/
// response the page got.
type browser struct {
	ctx context.Context
	mu  sync.Mutex
	api []string // "GET /api/sessions 401"
	dir string   // screenshots
}

func startBrowser(t *testing.T) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1366, 900), // a laptop screen
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	b := &browser{ctx: ctx, dir: t.ArtifactDir()}
	// The first call starts the browser, on the tab's own context (a
	// timeout there would stop the browser).
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	if err := chromedp.Listen(ctx, func(ev any) {
		if r, ok := ev.(*network.EventResponseReceived); ok && strings.Contains(r.Response.URL, "/api/") {
			b.mu.Lock()
			b.api = append(b.api, fmt.Sprintf("%s %d", r.Response.URL, r.Response.Status))
			b.mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("enabling network events: %v", err)
	}
	return b
}

// run runs actions on the tab, each wait bounded by browserWait.
func (b *browser) run(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserWait)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		page, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body.innerText`))
		b.screenshot(t, "failed-"+strings.ReplaceAll(what, " ", "-"))
		t.Fatalf("%s: %v\npage:\n%s", what, err, page)
	}
}

// typeInTerminal types a line into the focused terminal: the text as a
// keyboard or IME would insert it, then Enter as a key press.
func typeInTerminal(line string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Focus(chromedp.CSS(`.xterm-helper-textarea`)),
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := cdp.Call(ctx, t, input.InsertText, input.InsertTextParams{Text: line})
			return err
		}),
		chromedp.KeyEvent(kb.Enter))
}

// waitJS waits until the JavaScript expression is true.
func waitJS(expr string) chromedp.Action[chromedp.Void] {
	poll := chromedp.Poll[bool](expr, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(browserWait))
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := poll(ctx, t)
		return err
	})
}

// eval runs a JavaScript expression (awaiting a promise) and returns its
// value.
func eval[T any](t *testing.T, b *browser, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserWait)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// screenshot saves the page as NAME.png in the test's artifact directory
// and, when HANGAR_DASHBOARD_SCREENSHOTS names a directory (docs/dashboard
// for the README), there too.
func (b *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Logf("screenshot %s: %v", name, err)
		return
	}
	dirs := []string{b.dir}
	if d := os.Getenv("HANGAR_DASHBOARD_SCREENSHOTS"); d != "" && !strings.HasPrefix(name, "failed") {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, name+".png"), png, 0o644); err != nil {
			t.Errorf("screenshot %s: %v", name, err)
		}
	}
}

func (b *browser) apiResponses() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.api...)
}

// terminalText is the xterm buffer's text, every line.
const terminalText = `(() => { const t = window.hangarTerminal; if (!t) return ""; const b = t.buffer.active; let s = ""; for (let i = 0; i < b.length; i++) { const l = b.getLine(i); if (l) s += l.translateToString(true) + "\n"; } return s; })()`

// TestDashboard: sign in, list, open a session, message the agent and see
// the turn finish, a shell terminal, the agent's own terminal, the idle
// time and forks, in a real browser; without the token the page asks for
// it and no data call succeeds.
func TestDashboard(t *testing.T) {
	s := sessionFeatStart(t)
	b := startBrowser(t)
	url, token := s.env["HANGAR_URL"], s.env["HANGAR_TOKEN"]
	s.mustCLI(t, "session", "new", "dash", "hello from the CLI", "-e", "e2e", "-w")

	// No token: the page asks for one, and every data call it made was
	// refused.
	b.run(t, "load without a token",
		chromedp.Navigate(url+"/"),
		chromedp.WaitVisible(chromedp.ID("token")),
		waitJS(`document.activeElement && document.activeElement.id === "token"`))
	status := eval[int](t, b, `fetch("/api/sessions", {headers: {"X-Hangar-Request": "1"}}).then(r => r.status)`)
	if status != 401 {
		t.Errorf("GET /api/sessions without a token answered %d, want 401", status)
	}
	calls := b.apiResponses()
	if len(calls) == 0 {
		t.Error("the page made no API call before asking for the token")
	}
	for _, c := range calls {
		if !strings.HasSuffix(c, " 401") {
			t.Errorf("a data call succeeded without a token: %s", c)
		}
	}
	b.screenshot(t, "signin")

	// A wrong token is refused, the right one signs in.
	b.run(t, "sign in with a wrong token",
		chromedp.SendKeys(chromedp.ID("token"), "not-the-token"),
		chromedp.Click(chromedp.ID("signin-submit")),
		waitJS(`document.getElementById("signin-error").textContent.includes("not this hangar's API token")`))
	b.run(t, "sign in",
		chromedp.SetValue(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("signin-submit")),
		chromedp.WaitVisible(chromedp.CSS(`#sessions tr[data-session="dash"]`)),
		waitJS(`document.querySelector('#sessions tr[data-session="dash"] [data-state]').dataset.state === "idle"`))
	if eval[bool](t, b, `document.cookie.includes("hangar_token")`) {
		t.Error("the sign-in cookie is readable from script (want HttpOnly)")
	}
	b.screenshot(t, "sessions")

	// The session's page: send a message and see the turn finish.
	b.run(t, "open the session",
		chromedp.Click(chromedp.CSS(`#sessions tr[data-session="dash"] a`)),
		chromedp.WaitVisible(chromedp.ID("send-form")),
		waitJS(`document.querySelector('#turns tr[data-turn="1"] [data-outcome]')?.dataset.outcome === "completed"`))
	b.run(t, "send a message",
		chromedp.SendKeys(chromedp.ID("message"), "Please say OK from the dashboard."),
		chromedp.Click(chromedp.ID("send")),
		waitJS(`document.getElementById("progress").textContent.includes("Turn 2 finished: completed")`),
		waitJS(`document.querySelector('#turns tr[data-turn="2"] [data-outcome]')?.dataset.outcome === "completed"`),
		waitJS(`[...document.querySelectorAll('#events li')].some(li => li.textContent.includes("#2"))`))
	if turns := s.get(t, "dash").GetTurns(); len(turns) != 2 || turns[1].GetMessage() != "Please say OK from the dashboard." {
		t.Errorf("turns after sending from the dashboard: %v", turns)
	}

	// The idle time, as hangar session get shows it.
	b.run(t, "set the idle time",
		chromedp.SetValue(chromedp.ID("idle"), "45"),
		chromedp.Click(chromedp.ID("keep")),
		waitJS(`document.getElementById("idle-time").textContent === "45 min"`))
	if out := s.mustCLI(t, "session", "get", "dash"); !strings.Contains(out, "45m") {
		t.Errorf("hangar session get after setting the idle time to 45 in the dashboard:\n%s", out)
	}

	// A shell in the work tree: type, read the output back; it holds the
	// session while open.
	b.run(t, "open a shell",
		chromedp.Click(chromedp.ID("open-shell")),
		waitJS(`document.querySelector(".terminal-panel")?.dataset.ready === "1"`),
		typeInTerminal("echo dash-$((6*7)) in $(basename $PWD)"),
		waitJS(terminalText+`.includes("dash-42 in ")`))
	if !sessionHasHold(s.get(t, "dash"), sessionv1.HoldKind_HOLD_KIND_TERMINAL) {
		t.Errorf("no terminal hold while the dashboard's shell is open: %v", s.get(t, "dash").GetHolds())
	}
	b.run(t, "see the hold", waitJS(`document.getElementById("awake").textContent.includes("terminal")`))
	b.screenshot(t, "session-shell")
	// Closing the terminal ends it: the shell and what it left running
	// (a background job, in a process group of its own) are killed, and
	// the hold is released.
	sleepArg := fmt.Sprintf("1000.%d", time.Now().UnixNano()%1_000_000_000)
	b.run(t, "start a background job",
		typeInTerminal("sleep "+sleepArg+" & echo job-$((40+2))"),
		waitJS(terminalText+`.includes("job-42")`))
	waitFor(t, "the background sleep", func() bool { return len(sleepers(sleepArg)) == 1 })
	b.run(t, "close the shell", chromedp.Click(chromedp.ID("terminal-close")), waitJS(`!document.querySelector(".terminal-panel")`))
	waitFor(t, "the terminal hold to be released", func() bool { return !sessionHasHold(s.get(t, "dash"), sessionv1.HoldKind_HOLD_KIND_TERMINAL) })
	waitFor(t, "the shell's background job to be killed", func() bool { return len(sleepers(sleepArg)) == 0 })

	// Talk to the agent here: the agent CLI, interactive, in its own
	// conversation.
	b.run(t, "talk to the agent",
		chromedp.Click(chromedp.ID("talk-agent")),
		waitJS(`document.querySelector(".terminal-panel")?.dataset.ready === "1"`),
		waitJS(`document.getElementById("terminal-status").textContent.includes("--resume")`),
		waitJS(agentPromptJS))
	b.screenshot(t, "session-agent")
	b.run(t, "close the agent terminal", chromedp.Click(chromedp.ID("terminal-close")), waitJS(`!document.querySelector(".terminal-panel")`))
	waitFor(t, "the agent terminal's hold to be released", func() bool { return !sessionHasHold(s.get(t, "dash"), sessionv1.HoldKind_HOLD_KIND_TERMINAL) })

	// Fork two and see the tree.
	b.run(t, "fork",
		chromedp.SetValue(chromedp.ID("fork-n"), "2"),
		chromedp.Click(chromedp.ID("fork")),
		waitJS(`document.querySelectorAll('#forks li[data-fork]').length === 3`),
		waitJS(`document.querySelector('#forks li[data-fork="dash"] ul.tree')?.querySelectorAll('li[data-fork]').length === 2`))
	forks, err := s.sessions.ListSessions(context.Background(), &sessionv1.ListSessionsRequest{ParentId: "dash"})
	if err != nil || len(forks.GetSessions()) != 2 {
		t.Errorf("forks of dash after forking from the dashboard: %v, %v", forks.GetSessions(), err)
	}
	b.screenshot(t, "session")

	// Live updates on the list: a session made elsewhere appears without
	// a reload.
	b.run(t, "back to the list", chromedp.Click(chromedp.CSS(`a[href="#/"]`)), chromedp.WaitVisible(chromedp.ID("sessions")))
	s.mustCLI(t, "session", "new", "dash-later", "-e", "e2e")
	b.run(t, "see a new session appear", chromedp.WaitVisible(chromedp.CSS(`#sessions tr[data-session="dash-later"]`)))
	b.run(t, "search", chromedp.SendKeys(chromedp.ID("search"), "later"),
		waitJS(`document.querySelectorAll('#sessions tr[data-session]').length === 1`))
}

// agentPromptJS is true once the terminal shows an agent CLI waiting for
// input: Claude Code's prompt box, Codex's or pi's.
var agentPromptJS = `(() => { const s = ` + terminalText + `; return /❯|›|\? for shortcuts/.test(s) && !s.includes("[exited"); })()`

func sessionHasHold(s *sessionv1.Session, kind sessionv1.HoldKind) bool {
	for _, h := range s.GetHolds() {
		if h.GetKind() == kind {
			return true
		}
	}
	return false
}

// sleepers lists the host's processes running `sleep ARG` (a sandbox's
// processes are the host's, in a pid namespace of their own or not).
func sleepers(arg string) []string {
	var found []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	want := []byte("sleep\x00" + arg + "\x00")
	for _, d := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !bytes.Contains(cmdline, want) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join(d, "stat")); err == nil && bytes.Contains(stat, []byte(") Z ")) {
			continue // ended, not yet reaped
		}
		found = append(found, filepath.Base(d))
	}
	return found
}

// waitFor polls cond until it holds or a deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-time.After(50 * time.Millisecond)
	}
}
