package e2e_test

// End-to-end forks at a step (replay-svc): a run recorded by the real agent
// CLI through the real gateway and the scripted upstream is rebuilt at step
// N in a fresh sandbox from its tape, then continued live as trials.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/client"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// replaySteps is how many tool steps the recorded run makes.
const replaySteps = 6

// replayStepCmd is tool step k: it appends the same line and prints the
// same thing in every session (so a replay leaves the work tree the run
// left: no tree divergence).
func replayStepCmd(k int) string {
	return fmt.Sprintf(`echo "step %d" >> steps.txt && echo step-%d-done`, k, k)
}

// replayNoiseCmd writes random bytes and prints the same thing every time:
// a replay's tool output matches, its work tree does not.
const replayNoiseCmd = `head -c 32 /dev/urandom > noise.bin && echo noise-done`

// replayNoisyCmd is replayNoiseCmd as the first step of the replay
// task's chain ("noisy steps task"): the tree differs from step 1 on, the
// tool outputs never do.
const replayNoisyCmd = `head -c 32 /dev/urandom > noise.bin && echo noisy-done`

// replayTrialCmd is a trial's own work: it names its session (the sandbox
// directory is named after it), so each trial's tree differs.
const replayTrialCmd = `basename "$(dirname "$PWD")" > trial.txt && echo trial-done`

// replayNetCmd reaches the host's listener on port (hostListener): the
// recorded run's environment has egress, it prints the listener's answer;
// a replay's has none, curl's connection error instead. It exits 0 either
// way, so only the output differs.
func replayNetCmd(port int) string {
	return fmt.Sprintf(`curl -sS --http0.9 -m 5 http://127.0.0.1:%d/ 2>&1; echo net-done`, port)
}

// replayScript: "replay task" is six chained tool steps, each answered on
// the previous step's output; "clock task" prints the clock; "noise task"
// writes random bytes; "network task" (when hostPort is not 0) reaches the
// host's listener on hostPort; "noisy steps task" writes random bytes,
// then does the replay task's steps; a trial's continuation writes
// trial.txt.
func replayScript(hostPort int) scripted.Script {
	var rules []scripted.Rule
	for _, c := range agentCLIs {
		call := func(cmd string) scripted.Answer {
			return scripted.Answer{Text: "Working on it.", ToolCall: &scripted.ToolCall{Name: c.tool, Input: map[string]any{c.arg: cmd}}}
		}
		rules = append(rules,
			scripted.Rule{Name: c.tool + "-trial-done", Tool: c.tool, ToolResult: "trial-done", Answer: scripted.Answer{Text: "Trial done."}},
			scripted.Rule{Name: c.tool + "-steps-done", Tool: c.tool, ToolResult: fmt.Sprintf("step-%d-done", replaySteps), Answer: scripted.Answer{Text: "All steps done."}},
			scripted.Rule{Name: c.tool + "-clock-done", Tool: c.tool, ToolResult: "clock-", Answer: scripted.Answer{Text: "Clock read."}},
			scripted.Rule{Name: c.tool + "-noise-done", Tool: c.tool, ToolResult: "noise-done", Answer: scripted.Answer{Text: "Noise written."}},
			scripted.Rule{Name: c.tool + "-net-done", Tool: c.tool, ToolResult: "net-done", Answer: scripted.Answer{Text: "Host read."}},
			// A continuation: the trial's own task (whatever the last input).
			scripted.Rule{Name: c.tool + "-continue", Tool: c.tool, Prompt: "(?i)continue from where you stopped", Answer: call(replayTrialCmd)},
			scripted.Rule{Name: c.tool + "-step-1", Tool: c.tool, Prompt: "(?i)replay task", LastIsToolResult: scripted.Bool(false), Answer: call(replayStepCmd(1))},
			scripted.Rule{Name: c.tool + "-clock", Tool: c.tool, Prompt: "(?i)clock task", LastIsToolResult: scripted.Bool(false), Answer: call(`echo clock-$(date +%s%N)`)},
			scripted.Rule{Name: c.tool + "-noise", Tool: c.tool, Prompt: "(?i)noise task", LastIsToolResult: scripted.Bool(false), Answer: call(replayNoiseCmd)},
		)
		rules = append(rules,
			scripted.Rule{Name: c.tool + "-noisy-steps", Tool: c.tool, Prompt: "(?i)noisy steps task", LastIsToolResult: scripted.Bool(false), Answer: call(replayNoisyCmd)},
			scripted.Rule{Name: c.tool + "-noisy-done", Tool: c.tool, ToolResult: "noisy-done", Answer: call(replayStepCmd(1))})
		if hostPort != 0 {
			rules = append(rules, scripted.Rule{Name: c.tool + "-net", Tool: c.tool, Prompt: "(?i)network task", LastIsToolResult: scripted.Bool(false), Answer: call(replayNetCmd(hostPort))})
		}
		for k := 2; k <= replaySteps; k++ {
			rules = append(rules, scripted.Rule{Name: fmt.Sprintf("%s-step-%d", c.tool, k), Tool: c.tool, ToolResult: fmt.Sprintf("step-%d-done", k-1), Answer: call(replayStepCmd(k))})
		}
	}
	return scripted.Script{Rules: rules, Default: &scripted.Answer{Text: "OK."}}
}

type replayStack struct {
	*stack
	replay replayv1.ReplayServiceClient
	// hostPort is the host's listener (hostListener), on loopback.
	hostPort int
}

// hostListener starts a listener on the host's loopback that answers
// every connection with "host-reached" (no HTTP: curl --http0.9 reads it)
// and returns its port.
func hostListener(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// Read the request first: a close with it unread is a
			// reset, which curl may see before the answer.
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _ = http.ReadRequest(bufio.NewReader(c))
			_, _ = c.Write([]byte("host-reached\n"))
			_ = c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

func replayStart(t *testing.T) *replayStack {
	t.Helper()
	return replayStartWith(t, nil)
}

// replayStartWith is replayStart with more settings.
func replayStartWith(t *testing.T, vars map[string]string) *replayStack {
	t.Helper()
	port := hostListener(t)
	script := replayScript(port)
	all := map[string]string{"HANGAR_CACHE_STAGGER_SECONDS": "0"}
	for k, v := range vars {
		all[k] = v
	}
	s := startStack(t, stackOptions{script: &script, vars: all})
	s.applyEnvironment(t, "e2e", gitRepo(t, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	conn, err := client.Endpoint{URL: s.env["HANGAR_URL"], Token: s.env["HANGAR_TOKEN"]}.Dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &replayStack{stack: s, replay: replayv1.NewReplayServiceClient(conn), hostPort: port}
}

// record runs a session's first turn and returns its run id and tape.
func (s *replayStack) record(t *testing.T, name string, h sessionv1.Harness, message string) (string, []*gatewayv1.Step) {
	t.Helper()
	if _, err := s.sessions.CreateSession(context.Background(), &sessionv1.CreateSessionRequest{Name: name, Environment: "e2e", Harness: h, Message: message}); err != nil {
		t.Fatalf("new %s: %v", name, err)
	}
	turn := s.waitTurn(t, name, 1)
	if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED || turn.GetRunId() == "" {
		t.Fatalf("turn 1 of %s: %v (%s), run %q", name, turn.GetOutcome(), turn.GetOutcomeReason(), turn.GetRunId())
	}
	tape, err := s.gateway.GetTape(context.Background(), &gatewayv1.GetTapeRequest{Run: turn.GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	return turn.GetRunId(), tape.GetSteps()
}

// fork forks run and waits for the fork and its trials to settle.
func (s *replayStack) fork(t *testing.T, req *replayv1.ForkRunRequest) *replayv1.Fork {
	t.Helper()
	ctx := context.Background()
	req.WaitSeconds = 240
	resp, err := s.replay.ForkRun(ctx, req)
	if err != nil {
		t.Fatalf("fork %s at %d: %v", req.Run, req.AtSeq, err)
	}
	deadline := time.Now().Add(6 * time.Minute)
	for {
		f, err := s.replay.GetFork(ctx, &replayv1.GetForkRequest{Fork: resp.GetFork()})
		if err != nil {
			t.Fatal(err)
		}
		settled := f.GetFork().GetStatus() != replayv1.ForkStatus_FORK_STATUS_REPLAYING
		for _, tr := range f.GetFork().GetTrials() {
			settled = settled && tr.GetStatus() != replayv1.TrialStatus_TRIAL_STATUS_LIVE && tr.GetStatus() != replayv1.TrialStatus_TRIAL_STATUS_REPLAYING
		}
		if settled {
			return f.GetFork()
		}
		if time.Now().After(deadline) {
			t.Fatalf("fork %s did not settle: %v", resp.GetFork(), f.GetFork())
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// steps is the number of taped calls that answered with a tool call, up
// to and including seq.
func toolStepSeq(t *testing.T, steps []*gatewayv1.Step, k int) int32 {
	t.Helper()
	n := 0
	for _, st := range steps {
		for _, ev := range st.GetResponse().GetEvents() {
			if strings.Contains(ev.GetData(), "step-") && strings.Contains(ev.GetData(), "steps.txt") {
				n++
				break
			}
		}
		if n == k {
			return st.GetSeq()
		}
	}
	t.Fatalf("the tape has %d tool steps, want %d", n, k)
	return 0
}

func TestForkAtStep(t *testing.T) {
	s := replayStart(t)
	for _, h := range agentCLIs {
		t.Run(h.name, func(t *testing.T) {
			s.forkAtStep(t, h.name, h.harness)
		})
	}
}

func (s *replayStack) forkAtStep(t *testing.T, hname string, h sessionv1.Harness) {
	ctx := context.Background()
	name := "rec-" + hname
	run, steps := s.record(t, name, h, "Please do the replay task.")
	if got := s.mustExec(t, s.get(t, name).GetSandboxId(), "cat steps.txt"); strings.Count(got, "step ") != replaySteps {
		t.Fatalf("recorded run's steps.txt:\n%s", got)
	}
	// Every step of the run has the work tree's hash on the tape.
	for _, st := range steps {
		if st.GetTreeHash() == "" {
			t.Errorf("step %d of %s has no tree hash", st.GetSeq(), run)
		}
	}
	at := toolStepSeq(t, steps, 3)

	// Fork at step 3, two continuations: a clean prefix, both trials live.
	f := s.fork(t, &replayv1.ForkRunRequest{Run: run, AtSeq: at, Continuations: proto.Int32(2)})
	if f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_FORKED || f.GetDivergence() != nil {
		t.Fatalf("fork at %d: %v (%s), divergence %v", at, f.GetStatus(), f.GetStatusReason(), f.GetDivergence())
	}
	if f.GetReplayedSteps() != at || len(f.GetTrials()) != 2 || f.GetTrialIds()[1] != f.GetFork()+".2" {
		t.Fatalf("fork: replayed %d of %d, trials %v", f.GetReplayedSteps(), at, f.GetTrialIds())
	}
	sessionsSeen := map[string]bool{}
	for _, tr := range f.GetTrials() {
		if tr.GetSource() != "experiment" || tr.GetForkOf() != run || tr.GetStatus() != replayv1.TrialStatus_TRIAL_STATUS_ENDED ||
			tr.GetOutcome() != replayv1.TrialOutcome_TRIAL_OUTCOME_COMPLETED || tr.GetSession() == "" || tr.GetRun() == "" {
			t.Errorf("trial %s: %v", tr.GetId(), tr)
			continue
		}
		sessionsSeen[tr.GetSession()] = true
		sb := s.get(t, tr.GetSession()).GetSandboxId()
		if sb == "" {
			if _, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: tr.GetSession()}); err != nil {
				t.Fatalf("open %s: %v", tr.GetSession(), err)
			}
			sb = s.get(t, tr.GetSession()).GetSandboxId()
		}
		// Steps 1-3 rebuilt by the replay (in the prefix session), then
		// the trial's own continuation, live, in its own session: the
		// harness resumed the prefix's conversation after step 3.
		// Claude Code sends the continuation beside step 3's tool result
		// (the script answers with step 4); Codex and pi as a message of
		// its own (the script answers with the trial task, trial.txt).
		// The base commit has no steps.txt: steps 1-3 are the replay's;
		// what follows is the trial's own (Claude Code: steps 4-6;
		// Codex and pi: trial.txt, which names the trial's session).
		got := s.mustExec(t, sb, "cat steps.txt; cat trial.txt 2>/dev/null; true")
		want := "step 1\nstep 2\nstep 3\n"
		own := strings.TrimPrefix(got, want)
		if !strings.HasPrefix(got, want) || !(strings.HasPrefix(own, "step 4\n") || strings.Contains(own, tr.GetSession())) {
			t.Errorf("trial %s's steps.txt and trial.txt:\n%s\nwant steps 1-3, then work of %s", tr.GetId(), got, tr.GetSession())
		}
		// The trial's run went live: its tape's answers came from upstream.
		tape, err := s.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: tr.GetRun()})
		if err != nil || len(tape.GetSteps()) == 0 || tape.GetSteps()[0].GetReplayed() {
			t.Errorf("trial %s's run %s: %d steps, err %v", tr.GetId(), tr.GetRun(), len(tape.GetSteps()), err)
		}
	}
	if len(sessionsSeen) != 2 {
		t.Errorf("trials ran in %d sessions, want 2", len(sessionsSeen))
	}
	s.checkSealed(t, f)
	got, err := s.replay.GetTrial(ctx, &replayv1.GetTrialRequest{Trial: f.GetTrialIds()[0]})
	if err != nil || got.GetTrial().GetFork() != f.GetFork() {
		t.Errorf("get trial: %v %v", got, err)
	}
	if list, err := s.replay.ListForks(ctx, &replayv1.ListForksRequest{Run: run}); err != nil || len(list.GetForks()) != 1 {
		t.Errorf("forks of %s: %v %v", run, list, err)
	}

	// continuations 0 at the last step: the whole run reproduces.
	v := s.fork(t, &replayv1.ForkRunRequest{Run: run, AtSeq: int32(len(steps)), Continuations: proto.Int32(0)})
	if v.GetStatus() != replayv1.ForkStatus_FORK_STATUS_VERIFIED || v.GetDivergence() != nil || len(v.GetTrials()) != 0 {
		t.Errorf("verify at %d: %v (%s), divergence %v", len(steps), v.GetStatus(), v.GetStatusReason(), v.GetDivergence())
	}

	// A step that prints the clock: a tool divergence at the next request.
	crun, csteps := s.record(t, "clock-"+hname, h, "Please do the clock task.")
	c := s.fork(t, &replayv1.ForkRunRequest{Run: crun, AtSeq: int32(len(csteps)), Continuations: proto.Int32(0)})
	if c.GetStatus() != replayv1.ForkStatus_FORK_STATUS_DIVERGED || c.GetDivergence().GetKind() != replayv1.DivergenceKind_DIVERGENCE_KIND_TOOL {
		t.Errorf("clock replay: %v (%s), divergence %v", c.GetStatus(), c.GetStatusReason(), c.GetDivergence())
	}

	// A step that writes random bytes and prints the same: the tool
	// output matches, the work tree the step left does not: a tree
	// divergence at the request that follows the step.
	nrun, nsteps := s.record(t, "noise-"+hname, h, "Please do the noise task.")
	after := int32(0)
	for _, st := range nsteps {
		if strings.Contains(string(st.GetRequest().GetBody()), "noise-done") {
			after = st.GetSeq()
			break
		}
	}
	if after == 0 {
		t.Fatalf("no request of %s carries the noise step's output", nrun)
	}
	n := s.fork(t, &replayv1.ForkRunRequest{Run: nrun, AtSeq: int32(len(nsteps)), Continuations: proto.Int32(0)})
	if n.GetStatus() != replayv1.ForkStatus_FORK_STATUS_DIVERGED || n.GetDivergence().GetKind() != replayv1.DivergenceKind_DIVERGENCE_KIND_TREE || n.GetDivergence().GetSeq() != after {
		t.Errorf("noise replay: %v (%s), divergence %v, want tree at %d", n.GetStatus(), n.GetStatusReason(), n.GetDivergence(), after)
	}

	// A step that reaches a port on the host: the recorded run's
	// environment has egress (its curl prints the listener's answer), the
	// replay's has none (its curl prints a connection error): a network
	// divergence at the request that carries the step's output.
	wrun, wsteps := s.record(t, "net-"+hname, h, "Please do the network task.")
	after = 0
	for _, st := range wsteps {
		if body := string(st.GetRequest().GetBody()); strings.Contains(body, "net-done") {
			if !strings.Contains(body, "host-reached") {
				t.Fatalf("the recorded run %s did not reach the host: step %d's request:\n%s", wrun, st.GetSeq(), body)
			}
			after = st.GetSeq()
			break
		}
	}
	if after == 0 {
		t.Fatalf("no request of %s carries the network step's output", wrun)
	}
	w := s.fork(t, &replayv1.ForkRunRequest{Run: wrun, AtSeq: int32(len(wsteps)), Continuations: proto.Int32(0)})
	if w.GetStatus() != replayv1.ForkStatus_FORK_STATUS_DIVERGED || w.GetDivergence().GetKind() != replayv1.DivergenceKind_DIVERGENCE_KIND_NETWORK || w.GetDivergence().GetSeq() != after {
		t.Errorf("network replay: %v (%s), divergence %v, want network at %d", w.GetStatus(), w.GetStatusReason(), w.GetDivergence(), after)
	}
	t.Logf("network replay: %v", w.GetDivergence())

	// A second turn's run is refused.
	if _, err := s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: name, Message: "Please do the clock task."}); err != nil {
		t.Fatal(err)
	}
	second := s.waitTurn(t, name, 2)
	if _, err := s.replay.ForkRun(ctx, &replayv1.ForkRunRequest{Run: second.GetRunId(), AtSeq: 1}); status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "first run") {
		t.Errorf("fork of a second turn's run: %v", err)
	}
}

// TestForkAtStepTreeLocalised: a prefix's work tree is checked at its
// end only (tree_check_at_end), so a step early in the prefix that writes
// random bytes (and prints the same) is seen at the end; replay-svc's
// second replay, hashing every step, puts the tree divergence at the
// request after that step, as a check at every step would.
func TestForkAtStepTreeLocalised(t *testing.T) {
	s := replayStart(t)
	for _, h := range agentCLIs {
		t.Run(h.name, func(t *testing.T) {
			run, steps := s.record(t, "noisy-"+h.name, h.harness, "Please do the noisy steps task.")
			after := int32(0)
			for _, st := range steps {
				if strings.Contains(string(st.GetRequest().GetBody()), "noisy-done") {
					after = st.GetSeq()
					break
				}
			}
			if after == 0 || int(after) >= len(steps)-1 {
				t.Fatalf("the request after the noisy step is %d of %d", after, len(steps))
			}
			f := s.fork(t, &replayv1.ForkRunRequest{Run: run, AtSeq: int32(len(steps)), Continuations: proto.Int32(0)})
			if f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_DIVERGED || f.GetDivergence().GetKind() != replayv1.DivergenceKind_DIVERGENCE_KIND_TREE || f.GetDivergence().GetSeq() != after {
				t.Errorf("noisy replay: %v (%s), divergence %v, want tree at %d", f.GetStatus(), f.GetStatusReason(), f.GetDivergence(), after)
			}
		})
	}
}

// checkSealed: the replay's sandboxes (the prefix session's, copied for
// the trials) are in the sealed replay environment: egress none, none of
// the environment's variables. From one, a port on the host is out of
// reach (the recorded run's environment has egress full: it reaches it)
// while the gateway answers through the relay.
func (s *replayStack) checkSealed(t *testing.T, f *replayv1.Fork) {
	t.Helper()
	ctx := context.Background()
	tr := f.GetTrials()[0]
	sess := s.get(t, tr.GetSession())
	if sess.GetEnvironment() != "e2e-replay" {
		t.Errorf("trial %s runs in environment %q, want e2e-replay", tr.GetId(), sess.GetEnvironment())
	}
	if sess.GetSandboxId() == "" {
		if _, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: tr.GetSession()}); err != nil {
			t.Fatalf("open %s: %v", tr.GetSession(), err)
		}
		sess = s.get(t, tr.GetSession())
	}
	run, err := s.gateway.GetRun(ctx, &gatewayv1.GetRunRequest{Run: tr.GetRun()})
	if err != nil {
		t.Fatal(err)
	}
	port := s.hostPort
	if out, code := s.exec(t, sess.GetSandboxId(), fmt.Sprintf("curl -sS --http0.9 -m 5 http://127.0.0.1:%d/ || curl -sS -m 5 http://10.255.255.1/", port)); code == 0 || strings.Contains(out, "host-reached") {
		t.Errorf("a replay sandbox reached the host: code %d %q", code, out)
	}
	if out, code := s.exec(t, sess.GetSandboxId(), "curl -sS -m 10 -o /dev/null -w '%{http_code}' -I "+run.GetRun().GetAnthropicBaseUrl()+"/"); code != 0 {
		t.Errorf("a replay sandbox could not reach the gateway at %s: code %d %q", run.GetRun().GetAnthropicBaseUrl(), code, out)
	}
	env, err := s.sandboxes.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: "e2e-replay"})
	if err != nil || env.GetEnvironment().GetEgress() != sandboxv1.Egress_EGRESS_NONE || len(env.GetEnvironment().GetEnv()) != 0 {
		t.Errorf("replay environment: %v %v", env, err)
	}
	// The recorded run's own environment reaches the host.
	rec := run.GetRun()
	if src, err := s.gateway.GetRun(ctx, &gatewayv1.GetRunRequest{Run: tr.GetForkOf()}); err == nil {
		rec = src.GetRun()
	}
	sb := s.get(t, rec.GetSession()).GetSandboxId()
	if sb == "" {
		if _, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: rec.GetSession()}); err != nil {
			t.Fatalf("open %s: %v", rec.GetSession(), err)
		}
		sb = s.get(t, rec.GetSession()).GetSandboxId()
	}
	if out, code := s.exec(t, sb, fmt.Sprintf("curl -sS --http0.9 -m 5 http://127.0.0.1:%d/", port)); code != 0 || !strings.Contains(out, "host-reached") {
		t.Errorf("the recorded run's sandbox (%s) did not reach the host: code %d %q", rec.GetSession(), code, out)
	}
}

// TestForkAtStepBadInput: unknown runs and forks, fields out of range.
func TestForkAtStepBadInput(t *testing.T) {
	s := replayStart(t)
	ctx := context.Background()
	run, steps := s.record(t, "bad-input", sessionv1.Harness_HARNESS_CLAUDE, "Please do the replay task.")
	cases := []struct {
		req   *replayv1.ForkRunRequest
		code  codes.Code
		field string
	}{
		{&replayv1.ForkRunRequest{Run: "ses-nope.run-00000000", AtSeq: 1}, codes.NotFound, "ses-nope.run-00000000"},
		{&replayv1.ForkRunRequest{Run: run, AtSeq: int32(len(steps)) + 1}, codes.InvalidArgument, "at_seq"},
		{&replayv1.ForkRunRequest{Run: run, AtSeq: -1}, codes.InvalidArgument, "at_seq"},
		{&replayv1.ForkRunRequest{Run: run, AtSeq: 1, Continuations: proto.Int32(11)}, codes.InvalidArgument, "continuations"},
		// No HANGAR_HARNESS_REPO here: a pin set cannot be read.
		{&replayv1.ForkRunRequest{Run: run, AtSeq: 1, PinSet: "team-default@r1"}, codes.FailedPrecondition, "pin_set"},
	}
	for _, c := range cases {
		_, err := s.replay.ForkRun(ctx, c.req)
		if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.field) {
			t.Errorf("%v: %v, want %v naming %s", c.req, err, c.code, c.field)
		}
	}
	if _, err := s.replay.GetFork(ctx, &replayv1.GetForkRequest{Fork: "job-nope"}); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "job-nope") {
		t.Errorf("unknown fork: %v", err)
	}
	if _, err := s.replay.GetTrial(ctx, &replayv1.GetTrialRequest{Trial: "job-nope.1"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown trial: %v", err)
	}
}

// dialReplay returns a replay client of s.
func dialReplay(t *testing.T, s *stack) replayv1.ReplayServiceClient { return dialReplayTB(t, s) }

func dialReplayTB(t testing.TB, s *stack) replayv1.ReplayServiceClient {
	t.Helper()
	conn, err := client.Endpoint{URL: s.env["HANGAR_URL"], Token: s.env["HANGAR_TOKEN"]}.Dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return replayv1.NewReplayServiceClient(conn)
}

// TestForkAtStepRestart: hangar stops while a prefix is being replayed; the
// fork is carried on after the restart and settles (never replaying
// forever).
func TestForkAtStepRestart(t *testing.T) {
	s := replayStart(t)
	ctx := context.Background()
	run, steps := s.record(t, "restart-claude", sessionv1.Harness_HARNESS_CLAUDE, "Please do the replay task.")
	resp, err := s.replay.ForkRun(ctx, &replayv1.ForkRunRequest{Run: run, AtSeq: int32(len(steps)), Continuations: proto.Int32(0)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetStatus() != replayv1.ForkStatus_FORK_STATUS_REPLAYING {
		t.Fatalf("wait_seconds 0: status %v, want replaying", resp.GetStatus())
	}
	again := &replayStack{stack: s.restart(t)}
	again.replay = dialReplay(t, again.stack)
	deadline := time.Now().Add(6 * time.Minute)
	for {
		f, err := again.replay.GetFork(ctx, &replayv1.GetForkRequest{Fork: resp.GetFork()})
		if err != nil {
			t.Fatal(err)
		}
		if st := f.GetFork().GetStatus(); st != replayv1.ForkStatus_FORK_STATUS_REPLAYING {
			// The prefix went on, or was rebuilt again after the restart.
			if st != replayv1.ForkStatus_FORK_STATUS_VERIFIED {
				t.Errorf("after the restart: %v (%s) %v", st, f.GetFork().GetStatusReason(), f.GetFork().GetDivergence())
			}
			t.Logf("after the restart: %v (%s)", st, f.GetFork().GetStatusReason())
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fork still replaying after the restart: %v", f.GetFork())
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// rest calls hangar's REST API and decodes the JSON answer.
func (s *replayStack) rest(t *testing.T, method, path, body string) (int, map[string]any) {
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
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// TestForkAtStepRESTAndCLI: the spec's routes and field names, and the
// CLI's commands, on a real fork.
func TestForkAtStepRESTAndCLI(t *testing.T) {
	s := replayStart(t)
	run, steps := s.record(t, "rest-claude", sessionv1.Harness_HARNESS_CLAUDE, "Please do the replay task.")
	code, body := s.rest(t, http.MethodPost, "/api/runs/"+run+"/fork", fmt.Sprintf(`{"at_seq": %d, "continuations": 0, "wait_seconds": 240}`, len(steps)))
	if code != http.StatusOK || body["fork"] == "" || body["trial_ids"] == nil || body["divergence"] != nil {
		t.Fatalf("POST fork: %d %v", code, body)
	}
	fork, _ := body["fork"].(string)
	code, got := s.rest(t, http.MethodGet, "/api/forks/"+fork, "")
	f, _ := got["fork"].(map[string]any)
	if code != http.StatusOK || f["fork"] != fork || f["run"] != run || f["at_seq"] == nil || f["trials"] == nil || !strings.Contains(strings.ToLower(fmt.Sprint(f["status"])), "verified") {
		t.Errorf("GET fork: %d %v", code, got)
	}
	if code, got := s.rest(t, http.MethodPost, "/api/runs/"+run+"/fork", `{"at_seq": 999}`); code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(got), "at_seq") {
		t.Errorf("POST at_seq past the end: %d %v", code, got)
	}
	if code, got := s.rest(t, http.MethodGet, "/api/forks/job-nope", ""); code != http.StatusNotFound || !strings.Contains(fmt.Sprint(got), "job-nope") {
		t.Errorf("GET unknown fork: %d %v", code, got)
	}

	out, stderr, err := s.run(t, "", "fork", "get", fork)
	if err != nil || !strings.Contains(out, fork) || !strings.Contains(out, "verified") {
		t.Errorf("hangar fork get: %v\n%s%s", err, out, stderr)
	}
	out, stderr, err = s.run(t, "", "fork", "list", "--run", run, "-o", "json")
	if err != nil || !strings.Contains(out, fork) {
		t.Errorf("hangar fork list --run: %v\n%s%s", err, out, stderr)
	}
	out, stderr, err = s.run(t, "", "run", "fork", run, "--at", "1", "-k", "0", "-w")
	if err != nil || !strings.Contains(out, "verified") {
		t.Errorf("hangar run fork -w: %v\n%s%s", err, out, stderr)
	}
	if _, stderr, err := s.run(t, "", "trial", "get", "job-nope.1"); err == nil || !strings.Contains(err.Error()+stderr, "job-nope.1") {
		t.Errorf("hangar trial get of an unknown trial: %v %s", err, stderr)
	}
}

// pinSetRepo is a harness repository whose locks are pin sets (a lock
// with an environment) on env, for the installed CLIs: claude-pin (Claude
// Code on pinModel, another model than the run's), codex-pin (Codex),
// claude-old (a CLI version not installed), bare (no environment) and
// elsewhere (an environment that does not exist).
func pinSetRepo(t *testing.T, env string) string {
	t.Helper()
	if os.Getenv("HANGAR_HARNESS_DIR") == "" {
		t.Skip("HANGAR_HARNESS_DIR is unset: run .ci/install-harnesses and set it to use the real agent CLIs")
	}
	rec := func(name, harness, model, version, env string) string {
		out := "  " + name + ":\n    revision: 1\n    harness: " + harness + "\n    model: " + model + "\n    approvals: never\n    cli_version: " + version + "\n"
		if env != "" {
			out += "    environment: " + env + "\n"
		}
		return out
	}
	claude, codex := cliVersion(t, harnessClaude), cliVersion(t, harnessCodex)
	file := "locks:\n" + rec("claude-pin", "claude", pinModel, claude, env) + rec("codex-pin", "codex", "gpt-5.5", codex, env) +
		rec("claude-old", "claude", pinModel, "0.0.1", env) + rec("bare", "claude", pinModel, claude, "") +
		rec("elsewhere", "claude", pinModel, claude, "nowhere")
	return gitRepo(t, map[string]string{"harnesses.lock.yaml": file})
}

// pinModel is the model of the Claude Code pin set: not the run's.
const pinModel = "claude-opus-pinned"

// TestForkAtStepPinSet: pin_set continues a fork with a harness lock's
// harness, model, approval mode and environment (a pin set is a lock with
// an environment). A pin set on the run's harness replays the prefix there
// (on the run's model, in the pin set's environment) and its trials
// continue the prefix's conversation on the lock's model: every request of
// a trial carries it. A pin set on another harness replays the prefix on
// the lock's harness, whose first request is not the tape's: it diverges
// at step 1 (kind model) by design; with on_divergence live its trials go
// live from there on the lock's harness. Trials record the pin set. Pin
// sets that cannot be used are refused naming pin_set, before any
// sandbox work.
func TestForkAtStepPinSet(t *testing.T) {
	s := replayStartWith(t, map[string]string{"HANGAR_HARNESS_REPO": pinSetRepo(t, "e2e-pin")})
	ctx := context.Background()
	e2e, err := s.sandboxes.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	s.applyEnvironment(t, "e2e-pin", e2e.GetEnvironment().GetRepository(), 0, sandboxv1.Egress_EGRESS_FULL)
	run, steps := s.record(t, "pin-claude", sessionv1.Harness_HARNESS_CLAUDE, "Please do the replay task.")
	rec, err := s.gateway.GetRun(ctx, &gatewayv1.GetRunRequest{Run: run})
	if err != nil || rec.GetRun().GetModel() == pinModel {
		t.Fatalf("the recorded run: %v %v (its model must not be the pin set's)", rec.GetRun(), err)
	}
	at := toolStepSeq(t, steps, 3)

	// The trial's session and run are the lock's, every request on its
	// model, in the pin set's environment (its sealed replay copy).
	checkTrial := func(t *testing.T, f *replayv1.Fork, h sessionv1.Harness, model string) {
		t.Helper()
		tr := f.GetTrials()[0]
		if tr.GetStatus() != replayv1.TrialStatus_TRIAL_STATUS_ENDED || tr.GetOutcome() != replayv1.TrialOutcome_TRIAL_OUTCOME_COMPLETED || tr.GetPinSet() != f.GetPinSet() {
			t.Fatalf("trial %v", tr)
		}
		sess := s.get(t, tr.GetSession())
		if sess.GetHarness() != h || sess.GetModel() != model || sess.GetHarnessLock() != f.GetPinSet() || sess.GetEnvironment() != "e2e-pin-replay" {
			t.Errorf("trial session: harness %v model %q lock %q environment %q", sess.GetHarness(), sess.GetModel(), sess.GetHarnessLock(), sess.GetEnvironment())
		}
		if p := s.get(t, f.GetPrefixSession()); p.GetEnvironment() != "e2e-pin-replay" {
			t.Errorf("prefix session %s: environment %q, want the pin set's (sealed)", p.GetName(), p.GetEnvironment())
		}
		gr, err := s.gateway.GetRun(ctx, &gatewayv1.GetRunRequest{Run: tr.GetRun()})
		if err != nil || gr.GetRun().GetHarness() != strings.ToLower(strings.TrimPrefix(h.String(), "HARNESS_")) || gr.GetRun().GetModel() != model {
			t.Errorf("trial run %v %v", gr.GetRun(), err)
		}
		live, err := s.gateway.ListSteps(ctx, &gatewayv1.ListStepsRequest{Run: tr.GetRun()})
		if err != nil || len(live.GetSteps()) == 0 {
			t.Fatalf("steps of the trial's run %s: %v %v", tr.GetRun(), live, err)
		}
		for _, st := range live.GetSteps() {
			if st.GetModel() != model {
				t.Errorf("trial run %s step %d: model %q, want the lock's %q", tr.GetRun(), st.GetSeq(), st.GetModel(), model)
			}
		}
	}

	t.Run("same-harness", func(t *testing.T) {
		f := s.fork(t, &replayv1.ForkRunRequest{Run: run, AtSeq: at, Continuations: proto.Int32(1), PinSet: "claude-pin"})
		if f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_FORKED || f.GetDivergence() != nil || f.GetPinSet() != "claude-pin@r1" || f.GetHarness() != "claude" || f.GetReplayedSteps() != at {
			t.Fatalf("%v (%s), divergence %v, pin_set %q, harness %q, replayed %d", f.GetStatus(), f.GetStatusReason(), f.GetDivergence(), f.GetPinSet(), f.GetHarness(), f.GetReplayedSteps())
		}
		checkTrial(t, f, sessionv1.Harness_HARNESS_CLAUDE, pinModel)
	})
	t.Run("cross-harness-stop", func(t *testing.T) {
		f := s.fork(t, &replayv1.ForkRunRequest{Run: run, AtSeq: at, Continuations: proto.Int32(1), PinSet: "codex-pin@r1"})
		d := f.GetDivergence()
		if f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_DIVERGED || d.GetSeq() != 1 || d.GetKind() != replayv1.DivergenceKind_DIVERGENCE_KIND_MODEL || f.GetPinSet() != "codex-pin@r1" {
			t.Fatalf("%v (%s), divergence %v, pin_set %q", f.GetStatus(), f.GetStatusReason(), d, f.GetPinSet())
		}
		t.Logf("a pin set on another harness: %s, divergence %v", f.GetStatusReason(), d)
		tr := f.GetTrials()[0]
		if tr.GetStatus() != replayv1.TrialStatus_TRIAL_STATUS_DIVERGED || tr.GetPinSet() != "codex-pin@r1" || tr.GetRun() != "" {
			t.Errorf("trial %v", tr)
		}
		if p := s.get(t, f.GetPrefixSession()); p.GetHarness() != sessionv1.Harness_HARNESS_CODEX || p.GetHarnessLock() != "codex-pin@r1" {
			t.Errorf("prefix session: harness %v lock %q, want the pin set's", p.GetHarness(), p.GetHarnessLock())
		}
	})
	t.Run("cross-harness-live", func(t *testing.T) {
		f := s.fork(t, &replayv1.ForkRunRequest{Run: run, AtSeq: at, Continuations: proto.Int32(1), PinSet: "codex-pin",
			OnDivergence: replayv1.OnDivergence_ON_DIVERGENCE_LIVE})
		if d := f.GetDivergence(); f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_DIVERGED || d.GetSeq() != 1 || d.GetKind() != replayv1.DivergenceKind_DIVERGENCE_KIND_MODEL {
			t.Fatalf("%v (%s), divergence %v", f.GetStatus(), f.GetStatusReason(), d)
		}
		checkTrial(t, f, sessionv1.Harness_HARNESS_CODEX, "gpt-5.5")
	})

	before, err := s.replay.ListForks(ctx, &replayv1.ListForksRequest{Run: run})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pin  string
		code codes.Code
		says string
	}{
		{"nope@r1", codes.NotFound, "nope"},
		{"claude-pin@r9", codes.NotFound, "r9"},
		{"Not A Lock!", codes.InvalidArgument, "NAME@rREVISION"},
		{"bare", codes.FailedPrecondition, "pins no environment"},
		{"elsewhere@r1", codes.NotFound, `environment "nowhere"`},
		// Refused like a thaw: the CLI the sandboxes run is another version.
		{"claude-old@r1", codes.FailedPrecondition, "pins claude 0.0.1"},
	} {
		_, err := s.replay.ForkRun(ctx, &replayv1.ForkRunRequest{Run: run, AtSeq: 1, PinSet: c.pin})
		msg := status.Convert(err).Message()
		if status.Code(err) != c.code || !strings.Contains(msg, "pin_set") || !strings.Contains(msg, c.pin) || !strings.Contains(msg, c.says) {
			t.Errorf("pin_set %q: %v, want %v naming pin_set and the lock, saying %q", c.pin, err, c.code, c.says)
		}
	}
	// Refused before any sandbox work: no fork was recorded.
	if after, err := s.replay.ListForks(ctx, &replayv1.ListForksRequest{Run: run}); err != nil || len(after.GetForks()) != len(before.GetForks()) {
		t.Errorf("forks of %s after the refusals: %d, want %d (%v)", run, len(after.GetForks()), len(before.GetForks()), err)
	}
}

// TestForkAtStepAA: a fork of a run that is an attempt of a best-of-N job
// with a check records `aa` on a trial whose prefix was clean, on the
// run's own harness: whether the job's check gives the same result on the
// trial as on the attempt. The job's session has no turns of its own, so
// the attempt's run is its session's first (the one a fork can replay).
// The check passes when steps.txt ends at step 6, as the attempt left it.
// Claude Code continues the prefix at step 3 with steps 4-6 (the check
// passes on both: aa true); Codex continues with a message of its own, the
// trial's task (steps.txt ends at step 3: the check fails on the trial
// only, aa false).
func TestForkAtStepAA(t *testing.T) {
	s := replayStart(t)
	for _, c := range []struct {
		name    string
		harness sessionv1.Harness
		aa      bool
	}{
		{"claude", sessionv1.Harness_HARNESS_CLAUDE, true},
		{"codex", sessionv1.Harness_HARNESS_CODEX, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s.forkAA(t, "aa-"+c.name, c.harness, c.aa)
		})
	}
}

func (s *replayStack) forkAA(t *testing.T, name string, h sessionv1.Harness, want bool) {
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: name, Environment: "e2e", Harness: h}); err != nil {
		t.Fatal(err)
	}
	// Opened, it has a checkpoint to fork the attempts from.
	if _, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name}); err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	created, err := s.jobs.CreateJob(ctx, &sessionv1.CreateJobRequest{
		Strategy: sessionv1.JobStrategy_JOB_STRATEGY_BEST_OF_N, Session: name, Message: "Please do the replay task.", N: 1,
		Check: fmt.Sprintf(`[ "$(tail -n 1 steps.txt)" = "step %d" ]`, replaySteps),
	})
	if err != nil {
		t.Fatalf("create job: %v", err)
	}
	job := forkWaitJob(t, &forkStack{stack: s.stack}, created.GetJob().GetId())
	if job.GetState() != sessionv1.JobState_JOB_STATE_DELIVERED || len(job.GetAttempts()) != 1 || job.GetAttempts()[0].GetCheckExitCode() != 0 {
		t.Fatalf("job %s: %v (%s) attempts %v", job.GetId(), job.GetState(), job.GetError(), job.GetAttempts())
	}
	attempt := job.GetAttempts()[0].GetSession()
	turn := s.waitTurn(t, attempt, 1)
	if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED || turn.GetRunId() == "" {
		t.Fatalf("attempt %s's turn 1: %v (%s), run %q", attempt, turn.GetOutcome(), turn.GetOutcomeReason(), turn.GetRunId())
	}
	tape, err := s.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: turn.GetRunId()})
	if err != nil {
		t.Fatal(err)
	}
	at := toolStepSeq(t, tape.GetSteps(), 3)
	f := s.fork(t, &replayv1.ForkRunRequest{Run: turn.GetRunId(), AtSeq: at, Continuations: proto.Int32(1)})
	if f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_FORKED || f.GetDivergence() != nil || len(f.GetTrials()) != 1 {
		t.Fatalf("fork of %s at %d: %v (%s), divergence %v", turn.GetRunId(), at, f.GetStatus(), f.GetStatusReason(), f.GetDivergence())
	}
	tr := f.GetTrials()[0]
	if tr.GetStatus() != replayv1.TrialStatus_TRIAL_STATUS_ENDED || tr.GetOutcome() != replayv1.TrialOutcome_TRIAL_OUTCOME_COMPLETED || tr.Aa == nil || tr.GetAa() != want {
		t.Errorf("trial %s: %v, want ended, completed, aa %v", tr.GetId(), tr, want)
	}
	// Read again: aa is stored with the trial.
	got, err := s.replay.GetTrial(ctx, &replayv1.GetTrialRequest{Trial: tr.GetId()})
	if err != nil || got.GetTrial().Aa == nil || got.GetTrial().GetAa() != want {
		t.Errorf("get trial %s: %v %v", tr.GetId(), got, err)
	}
}
