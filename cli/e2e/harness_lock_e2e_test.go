package e2e_test

// Harness locks end to end: sessions thawed from harnesses.lock.yaml in a
// real git repository (HANGAR_HARNESS_REPO), run by the real Claude Code
// and Codex through the real gateway to the scripted upstream; turn 1
// checked against the lock.

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// lockCLIs are the CLIs thawed here: their pinned binary, and the model a
// lock names that the upstream serves as another (concrete) one, as a
// provider answers an alias.
var lockCLIs = []struct {
	name    string
	harness sessionv1.Harness
	bin     string
	alias   string
	served  string
}{
	{"claude", sessionv1.Harness_HARNESS_CLAUDE, harnessClaude, "claude-lock-alias", "claude-lock-alias-20260101"},
	{"codex", sessionv1.Harness_HARNESS_CODEX, harnessCodex, "gpt-lock-alias", "gpt-lock-alias-2026-01-01"},
}

// harnessLockScript answers the task with each CLI's shell tool, then
// "Done.", and serves the alias models as their concrete ones.
func harnessLockScript() scripted.Script {
	rules := []scripted.Rule{{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Done."}}}
	rules = append(rules, shellRules("lock task", "printf 'locked\\n' > locked.txt && echo lock-done")...)
	serves := map[string]string{}
	for _, c := range lockCLIs {
		serves[c.alias] = c.served
	}
	return scripted.Script{Rules: rules, Default: &scripted.Answer{Text: "OK."}, Serves: serves}
}

var releaseVersion = regexp.MustCompile(`[0-9]+\.[0-9]+\.[0-9]+`)

// cliVersion is the release version the pinned CLI at bin (below
// HANGAR_HARNESS_DIR) reports.
func cliVersion(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(os.Getenv("HANGAR_HARNESS_DIR"), bin), "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	v := releaseVersion.FindString(string(out))
	if v == "" {
		t.Fatalf("%s --version said %q", bin, out)
	}
	return v
}

// harnessLockRepo is a git repository whose harnesses.lock.yaml has, per
// CLI: NAME-ok (r1 pinned another model; r2, at the next commit, the
// default one on the installed CLI), NAME-alias@r1 (a model the upstream
// serves as another) and NAME-old@r1 (a CLI version not installed).
func harnessLockRepo(t *testing.T) string {
	t.Helper()
	var r1, r2 strings.Builder
	r1.WriteString("locks:\n")
	r2.WriteString("# the team's harnesses\nlocks:\n")
	for _, c := range lockCLIs {
		v := cliVersion(t, c.bin)
		model := map[string]string{"claude": "claude-sonnet-4-5", "codex": "gpt-5.5"}[c.name]
		rec := func(name, rev, model, version string) string {
			return "  " + name + ":\n    revision: " + rev + "\n    harness: " + c.name + "\n    model: " + model + "\n    approvals: never\n    cli_version: " + version + "\n"
		}
		r1.WriteString(rec(c.name+"-ok", "1", "retired-model", v))
		r2.WriteString(rec(c.name+"-ok", "2", model, v))
		r2.WriteString(rec(c.name+"-alias", "1", c.alias, v))
		r2.WriteString(rec(c.name+"-old", "1", model, "0.0.1"))
	}
	dir := gitRepo(t, map[string]string{"harnesses.lock.yaml": r1.String()})
	if err := os.WriteFile(filepath.Join(dir, "harnesses.lock.yaml"), []byte(r2.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"add", "-A"}, {"-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "r2"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	return dir
}

// harnessLockStart runs hangar with the lock repository, drift mode
// (warn or fail), and an environment with no warm pool: a sandbox exists
// only once a session boots.
func harnessLockStart(t *testing.T, drift string) *stack {
	t.Helper()
	if os.Getenv("HANGAR_HARNESS_DIR") == "" {
		t.Skip("HANGAR_HARNESS_DIR is unset: run .ci/install-harnesses and set it to use the real agent CLIs")
	}
	script := harnessLockScript()
	s := startStack(t, stackOptions{script: &script, vars: map[string]string{
		"HANGAR_HARNESS_REPO": harnessLockRepo(t), "HANGAR_HARNESS_DRIFT": drift,
	}})
	s.applyEnvironment(t, "locks", gitRepo(t, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	return s
}

func driftLabel(d []*sessionv1.DriftItem) string {
	var parts []string
	for _, i := range d {
		parts = append(parts, i.GetField()+": "+i.GetLocked()+" -> "+i.GetActual())
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

func (s *stack) driftEvents(t *testing.T, name string) []*sessionv1.Event {
	t.Helper()
	resp, err := s.sessions.ListEvents(context.Background(), &sessionv1.ListEventsRequest{Name: name})
	if err != nil {
		t.Fatalf("events of %s: %v", name, err)
	}
	var out []*sessionv1.Event
	for _, e := range resp.GetEvents() {
		if e.GetKind() == sessionv1.EventKind_EVENT_KIND_HARNESS_DRIFT {
			out = append(out, e)
		}
	}
	return out
}

// TestHarnessThaw, for Claude Code and Codex: a session thawed from a lock
// that matches runs the lock's harness and model and its turn 1 has drift
// []; a lock whose model the upstream serves as another lists the model,
// with a harness.drift event and a warning (turn 1 still completes under
// warn); a lock on a CLI version not installed is refused before any
// sandbox work; a thawed session refuses a harness switch.
func TestHarnessThaw(t *testing.T) {
	s := harnessLockStart(t, "warn")
	ctx := context.Background()
	thawed := 0
	for _, c := range lockCLIs {
		t.Run(c.name, func(t *testing.T) {
			thawed += 2
			ok := "thaw-ok-" + c.name
			out, _, err := s.run(t, "", "harness", "thaw", c.name+"-ok@r2", "--name", ok, "--env", "locks", "Please do the lock task.", "-w")
			if err != nil {
				t.Fatalf("harness thaw %s-ok@r2: %v\n%s", c.name, err, out)
			}
			sess := s.get(t, ok)
			if sess.GetHarness() != c.harness || sess.GetHarnessLock() != c.name+"-ok@r2" || sess.GetModel() == "" || sess.GetModel() == "retired-model" {
				t.Fatalf("thawed session: harness %v, lock %q, model %q", sess.GetHarness(), sess.GetHarnessLock(), sess.GetModel())
			}
			turn := sess.GetTurns()[0]
			if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
				t.Fatalf("turn 1 of a matching lock: %v (%s)", turn.GetOutcome(), turn.GetOutcomeReason())
			}
			if len(turn.GetDrift()) != 0 || len(s.driftEvents(t, ok)) != 0 {
				t.Errorf("turn 1 of a matching lock drifted: %s, warnings %q", driftLabel(turn.GetDrift()), turn.GetWarnings())
			}
			if got := s.mustExec(t, sess.GetSandboxId(), "cat locked.txt"); got != "locked\n" {
				t.Errorf("the agent's work: %q", got)
			}
			// The REST/CLI JSON shows drift as [] on the checked turn.
			js, _, err := s.run(t, "", "session", "get", ok, "-o", "json")
			if err != nil || !regexp.MustCompile(`"drift":\s*\[\]`).MatchString(js) {
				t.Errorf("session get -o json: %v; no \"drift\": [] in\n%s", err, js)
			}

			// A thawed session keeps its harness: send --harness and fork
			// --harness are refused.
			other := sessionv1.Harness_HARNESS_PI
			_, err = s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: ok, Message: "switch", Harness: other})
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "start another session for another lock") {
				t.Errorf("send --harness pi to a thawed session: %v", err)
			}
			_, err = s.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: ok, N: 1, Harness: other})
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "start another session for another lock") {
				t.Errorf("fork --harness pi of a thawed session: %v", err)
			}
			if _, _, err := s.run(t, "", "session", "send", ok, "switch", "--harness", "pi"); err == nil || !strings.Contains(err.Error(), "thawed from harness lock "+c.name+"-ok@r2") {
				t.Errorf("hangar session send --harness pi: %v", err)
			}
			if got := s.get(t, ok); got.GetTurnCount() != 1 || got.GetHarness() != c.harness {
				t.Errorf("after the refused switches: %d turns, harness %v", got.GetTurnCount(), got.GetHarness())
			}

			// A lock whose model is served as another: drift lists it.
			alias := "thaw-alias-" + c.name
			if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
				Name: alias, Environment: "locks", HarnessLock: c.name + "-alias@r1", Message: "Please do the lock task.",
			}); err != nil {
				t.Fatalf("thaw %s-alias@r1: %v", c.name, err)
			}
			turn = s.waitTurn(t, alias, 1)
			if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
				t.Errorf("turn 1 under warn: %v (%s)", turn.GetOutcome(), turn.GetOutcomeReason())
			}
			want := "model: " + c.alias + " -> " + c.served
			if got := driftLabel(turn.GetDrift()); got != "["+want+"]" {
				t.Errorf("drift = %s, want [%s]", got, want)
			}
			if !strings.Contains(strings.Join(turn.GetWarnings(), "\n"), "model "+c.served+" (locked "+c.alias+")") {
				t.Errorf("turn 1 warnings %q name no model drift", turn.GetWarnings())
			}
			events := s.driftEvents(t, alias)
			if len(events) != 1 || events[0].GetTurn() != 1 || !strings.Contains(events[0].GetText(), c.served) {
				t.Errorf("harness.drift events: %v", events)
			}

			// A lock on a CLI version the sandboxes do not run: refused
			// before any sandbox work, saying what to do.
			_, err = s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
				Name: "thaw-old-" + c.name, Environment: "locks", HarnessLock: c.name + "-old@r1", Message: "Please do the lock task.",
			})
			msg := status.Convert(err).Message()
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(msg, "pins "+c.name+" 0.0.1") ||
				!strings.Contains(msg, "@0.0.1") || !strings.Contains(msg, c.name+"-ok@r2") {
				t.Errorf("thaw of a lock on another CLI version: %v", err)
			}
			if _, err := s.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: "thaw-old-" + c.name}); status.Code(err) != codes.NotFound {
				t.Errorf("the refused thaw left a session: %v", err)
			}
		})
	}
	// The refused thaws made no sandbox: only the two sessions' of each CLI exist.
	list, err := s.sandboxes.ListSandboxes(ctx, &sandboxv1.ListSandboxesRequest{Environment: "locks"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(list.GetSandboxes()), thawed; got != want {
		t.Errorf("%d sandboxes of environment locks, want %d (one per thawed session)", got, want)
	}
}

// TestHarnessThawDriftFails: under HANGAR_HARNESS_DRIFT=fail a thawed
// session whose turn 1 drifted ends it failed, reason harness_drift; its
// turn 2 is not checked.
func TestHarnessThawDriftFails(t *testing.T) {
	s := harnessLockStart(t, "fail")
	ctx := context.Background()
	for _, c := range lockCLIs {
		t.Run(c.name, func(t *testing.T) {
			name := "thaw-fail-" + c.name
			if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
				Name: name, Environment: "locks", HarnessLock: c.name + "-alias@r1", Message: "Please do the lock task.",
			}); err != nil {
				t.Fatalf("thaw: %v", err)
			}
			turn := s.waitTurn(t, name, 1)
			if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_FAILED || turn.GetOutcomeReason() != "harness_drift" {
				t.Fatalf("turn 1: %v (%s), want failed (harness_drift)", turn.GetOutcome(), turn.GetOutcomeReason())
			}
			if got := driftLabel(turn.GetDrift()); !strings.Contains(got, "model: "+c.alias+" -> "+c.served) {
				t.Errorf("drift = %s", got)
			}
			if len(s.driftEvents(t, name)) != 1 {
				t.Errorf("want one harness.drift event")
			}
			if _, err := s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: name, Message: "Please do the lock task again."}); err != nil {
				t.Fatalf("send turn 2: %v", err)
			}
			second := s.waitTurn(t, name, 2)
			if second.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED || len(second.GetDrift()) != 0 {
				t.Errorf("turn 2 (not checked): %v (%s), drift %s", second.GetOutcome(), second.GetOutcomeReason(), driftLabel(second.GetDrift()))
			}
			if len(s.driftEvents(t, name)) != 1 {
				t.Errorf("turn 2 added a harness.drift event")
			}
		})
	}
}

// TestHarnessLockRefusals: locks read through the CLI, and the lock file
// errors each name what is wrong: an unknown lock or revision is NotFound,
// a malformed name InvalidArgument, a file that does not parse
// InvalidArgument naming the file and line.
func TestHarnessLockRefusals(t *testing.T) {
	repo := harnessLockRepoOrSkip(t)
	s := startStack(t, stackOptions{vars: map[string]string{"HANGAR_HARNESS_REPO": repo}})
	ctx := context.Background()
	out, _, err := s.run(t, "", "harness", "lock", "list")
	if err != nil || !strings.Contains(out, "claude-ok@r2") || !strings.Contains(out, "codex-alias@r1") {
		t.Errorf("harness lock list: %v\n%s", err, out)
	}
	out, _, err = s.run(t, "", "harness", "lock", "get", "claude-ok@r1")
	if err != nil || !strings.Contains(out, "retired-model") {
		t.Errorf("harness lock get claude-ok@r1 (an earlier commit): %v\n%s", err, out)
	}
	for ref, want := range map[string]struct {
		code codes.Code
		in   string
	}{
		"nobody@r1":    {codes.NotFound, `harness lock "nobody" is not in harnesses.lock.yaml`},
		"claude-ok@r9": {codes.NotFound, "claude-ok has no revision r9"},
		"claude-ok@9":  {codes.InvalidArgument, "want NAME@rREVISION"},
	} {
		_, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "refused", HarnessLock: ref, Message: "hi"})
		if status.Code(err) != want.code || !strings.Contains(status.Convert(err).Message(), want.in) {
			t.Errorf("thaw %s: %v, want %v saying %q", ref, err, want.code, want.in)
		}
		_, err = s.sessions.GetHarnessLock(ctx, &sessionv1.GetHarnessLockRequest{Lock: ref})
		if status.Code(err) != want.code {
			t.Errorf("get %s: %v, want %v", ref, err, want.code)
		}
	}
	// The lock sets the harness, model and approval mode: another one
	// asked for besides is refused, naming it.
	for field, req := range map[string]*sessionv1.CreateSessionRequest{
		"harness":   {Harness: sessionv1.Harness_HARNESS_CODEX},
		"model":     {Model: "claude-opus-4"},
		"approvals": {Approvals: sessionv1.ApprovalMode_APPROVAL_MODE_ASK},
	} {
		req.Name, req.HarnessLock, req.Message = "refused", "claude-ok@r2", "hi"
		_, err := s.sessions.CreateSession(ctx, req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "harness lock claude-ok@r2 sets the "+field) {
			t.Errorf("thaw with another %s: %v", field, err)
		}
	}
	// REST: harness_lock on POST /api/sessions, and the locks.
	rest := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, s.env["HANGAR_URL"]+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+s.env["HANGAR_TOKEN"])
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := rest(http.MethodPost, "/api/sessions", `{"name":"rest","harness_lock":"nobody@r1","message":"hi"}`); code != 404 || !strings.Contains(body, "HARNESS_LOCK_NOT_FOUND") {
		t.Errorf("POST /api/sessions with an unknown harness_lock = %d %s", code, body)
	}
	if code, body := rest(http.MethodGet, "/api/harness-locks", ""); code != 200 || !strings.Contains(body, `"claude-ok@r2"`) {
		t.Errorf("GET /api/harness-locks = %d %s", code, body)
	}
	if code, body := rest(http.MethodGet, "/api/harness-locks/codex-ok@r1", ""); code != 200 || !strings.Contains(body, "retired-model") {
		t.Errorf("GET /api/harness-locks/codex-ok@r1 = %d %s", code, body)
	}
	// A lock file that does not parse.
	if err := os.WriteFile(filepath.Join(repo, "harnesses.lock.yaml"), []byte("locks:\n  claude-ok:\n    revision: 3\n    harness: clod\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"add", "-A"}, {"-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "broken"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	_, err = s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "refused", HarnessLock: "claude-ok@r2", Message: "hi"})
	if msg := status.Convert(err).Message(); status.Code(err) != codes.InvalidArgument || !strings.Contains(msg, "harnesses.lock.yaml in "+repo) || !strings.Contains(msg, `line 4: lock "claude-ok": harness "clod"`) {
		t.Errorf("thaw with a lock file that does not parse: %v", err)
	}
	if _, _, err := s.run(t, "", "harness", "lock", "list"); err == nil || !strings.Contains(err.Error(), "does not parse") {
		t.Errorf("harness lock list of a broken file: %v", err)
	}
}

// harnessLockRepoOrSkip is harnessLockRepo, which asks the pinned CLIs
// their versions.
func harnessLockRepoOrSkip(t *testing.T) string {
	t.Helper()
	if os.Getenv("HANGAR_HARNESS_DIR") == "" {
		t.Skip("HANGAR_HARNESS_DIR is unset: run .ci/install-harnesses and set it to use the real agent CLIs")
	}
	return harnessLockRepo(t)
}
