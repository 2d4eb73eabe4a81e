package e2e_test

// The multi-replica topology as processes on this machine: two each of
// session-svc, sandbox-svc, gateway-svc, checkpoint-svc and replay-svc, on one
// PostgreSQL (a schema of the test's own on the machine's cluster) and one
// redis-server the test starts, with the real Claude Code and a scripted
// upstream. Sessions created through one replica are resumed, forked,
// suspended and interrupted through another, a tape recorded through one
// gateway is read through the other, and a fork at a step survives its
// replay-svc killed mid-replay; one replica is killed with SIGKILL mid-turn,
// mid-suspend and mid-fork, and every session must end where it can be
// resumed from, its newest checkpoint intact (the fault suite's
// checkAfterFault); the idle sweep of two replicas suspends an idle
// session exactly once.

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/client"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// svcProcess is one service binary run as its own process, restartable
// on its address.
type svcProcess struct {
	name, bin, addr string
	env             []string
	cmd             *exec.Cmd
	exited          chan struct{}
	log             *os.File
}

func (p *svcProcess) start(t *testing.T) {
	t.Helper()
	p.cmd = exec.Command(p.bin)
	p.cmd.Env = p.env
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		_ = cmd.Wait()
		close(exited)
	}(p.cmd, p.exited)
}

// waitListening waits until the process accepts connections.
func (p *svcProcess) waitListening(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for ; ; <-time.After(50 * time.Millisecond) {
		select {
		case <-p.exited:
			b, _ := os.ReadFile(p.log.Name())
			t.Fatalf("%s exited at start:\n%s", p.name, b)
		default:
		}
		if c, err := net.Dial("tcp", p.addr); err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never listened on %s", p.name, p.addr)
		}
	}
}

func (p *svcProcess) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(4 * time.Minute):
		t.Errorf("%s did not exit within 4 minutes of %v; killing it", p.name, sig)
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd = nil
}

// replicaSet is the whole topology.
type replicaSet struct {
	procs  []*svcProcess
	byName map[string]*svcProcess
	// a and b are the two sides: session-svc, sandbox-svc and
	// checkpoint-svc replica 1 or 2 each.
	a, b  stack
	token string
	// replays are the two replay-svc replicas, by "1" and "2".
	replays map[string]replayv1.ReplayServiceClient
}

func startReplicas(t *testing.T, model string, vars ...string) *replicaSet {
	t.Helper()
	dir := os.Getenv("HANGAR_HARNESS_DIR")
	if dir == "" {
		t.Skip("HANGAR_HARNESS_DIR is unset: run .ci/install-harnesses and set it to use the real agent CLIs")
	}
	if os.Getenv("HANGAR_DATABASE_URL") == "" && exec.Command("psql", "postgres://postgres@127.0.0.1:5432/test", "-c", "select 1").Run() != nil {
		t.Skip("no PostgreSQL at 127.0.0.1:5432 (db test)")
	}
	r := startPrivateRedis(t)
	root := t.TempDir()
	bins := filepath.Join(root, "bin")
	build := exec.Command("go", "build", "-o", bins+"/",
		"github.com/hangar-dev/hangar/session-svc/cmd/session-svc",
		"github.com/hangar-dev/hangar/sandbox-svc/cmd/sandbox-svc",
		"github.com/hangar-dev/hangar/sandbox-svc/cmd/hangar-sandbox",
		"github.com/hangar-dev/hangar/checkpoint-svc/cmd/checkpoint-svc",
		"github.com/hangar-dev/hangar/gateway-svc/cmd/gateway-svc",
		"github.com/hangar-dev/hangar/replay-svc/cmd/replay-svc")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// One schema of the test's own on the machine's PostgreSQL.
	var raw [4]byte
	_, _ = rand.Read(raw[:])
	schema := "replicas_" + hex.EncodeToString(raw[:])
	dbURL := "postgres://postgres@127.0.0.1:5432/test?sslmode=disable&search_path=" + schema
	if out, err := exec.Command("psql", "postgres://postgres@127.0.0.1:5432/test", "-c", "CREATE SCHEMA "+schema).CombinedOutput(); err != nil {
		t.Fatalf("create schema: %v %s", err, out)
	}
	t.Cleanup(func() {
		_ = exec.Command("psql", "postgres://postgres@127.0.0.1:5432/test", "-c", "DROP SCHEMA "+schema+" CASCADE").Run()
	})
	home := filepath.Join(root, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	keyFile := filepath.Join(home, "vault.key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _ = rand.Read(raw[:])
	rs := &replicaSet{byName: map[string]*svcProcess{}, token: "replicas-" + hex.EncodeToString(raw[:])}
	addrs := map[string]string{}
	for _, n := range []string{"session-1", "session-2", "sandbox-1", "sandbox-2", "checkpoint-1", "checkpoint-2", "gateway-1", "gateway-2", "replay-1", "replay-2"} {
		addrs[n] = freeAddr(t)
	}
	t.Logf("addresses: %v", addrs)
	common := append(append(os.Environ(),
		"HANGAR_HOME="+home, "HANGAR_TOKEN="+rs.token, "HANGAR_REDIS_URL="+r.url(),
		"HANGAR_LOG_LEVEL=info", "HANGAR_VAULT_KEY_FILE="+keyFile,
		"HANGAR_DATABASE_URL="+dbURL,
		"HANGAR_ANTHROPIC_URL="+model, "HANGAR_ANTHROPIC_API_KEY=upstream-key",
		"HANGAR_CLAUDE_BIN="+filepath.Join(dir, harnessClaude),
		"HANGAR_SANDBOX_TOOL="+filepath.Join(bins, "hangar-sandbox"),
		"HANGAR_SANDBOX_CACHE=0", "HANGAR_SESSION_SWEEP_SECONDS=2",
	), vars...)
	add := func(name, bin string, env ...string) {
		log, err := os.Create(filepath.Join(root, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		p := &svcProcess{name: name, bin: filepath.Join(bins, bin), addr: addrs[name], log: log, env: append(append([]string{}, common...), env...)}
		rs.procs = append(rs.procs, p)
		rs.byName[name] = p
	}
	// One store for checkpoints and tapes (a bucket on GKE); each gateway
	// has a data directory of its own, as a pod does, so a tape is read
	// through the other replica only from the shared store.
	store := filepath.Join(root, "store")
	for _, i := range []string{"1", "2"} {
		// The gateway hashes each step's work tree through sandbox-svc (any
		// replica serves any sandbox).
		add("gateway-"+i, "gateway-svc", "HANGAR_GATEWAY_ADDR="+addrs["gateway-"+i], "HANGAR_SESSION_STORE="+store,
			"HANGAR_HOME="+filepath.Join(root, "gateway-home-"+i), "HANGAR_SANDBOX_ADDR="+addrs["sandbox-"+i])
	}
	for _, i := range []string{"1", "2"} {
		add("sandbox-"+i, "sandbox-svc", "HANGAR_SANDBOX_ADDR="+addrs["sandbox-"+i], "HANGAR_SANDBOX_PEER_ADDR="+addrs["sandbox-"+i],
			"HANGAR_SANDBOX_ROOT="+filepath.Join(root, "sandboxes-"+i), "HANGAR_GATEWAY_ADDR="+addrs["gateway-"+i])
		add("checkpoint-"+i, "checkpoint-svc", "HANGAR_CHECKPOINT_ADDR="+addrs["checkpoint-"+i], "HANGAR_SANDBOX_ADDR="+addrs["sandbox-"+i],
			"HANGAR_SESSION_STORE="+store)
	}
	for _, i := range []string{"1", "2"} {
		add("session-"+i, "session-svc", "HANGAR_SESSION_ADDR="+addrs["session-"+i], "HANGAR_SANDBOX_ADDR="+addrs["sandbox-"+i],
			"HANGAR_CHECKPOINT_ADDR="+addrs["checkpoint-"+i], "HANGAR_GATEWAY_ADDR="+addrs["gateway-"+i])
	}
	for _, i := range []string{"1", "2"} {
		add("replay-"+i, "replay-svc", "HANGAR_REPLAY_ADDR="+addrs["replay-"+i], "HANGAR_SESSION_ADDR="+addrs["session-"+i],
			"HANGAR_SANDBOX_ADDR="+addrs["sandbox-"+i], "HANGAR_CHECKPOINT_ADDR="+addrs["checkpoint-"+i], "HANGAR_GATEWAY_ADDR="+addrs["gateway-"+i])
	}
	t.Cleanup(func() {
		// Front to back, as a rolling update would.
		for i := len(rs.procs) - 1; i >= 0; i-- {
			rs.procs[i].stop(t, syscall.SIGTERM)
		}
		if left := processesUnder(root); len(left) > 0 {
			t.Errorf("processes left running in the sandboxes after the services stopped: %v", left)
		}
		if t.Failed() {
			for _, p := range rs.procs {
				b, _ := os.ReadFile(p.log.Name())
				var lines []string
				for _, line := range strings.Split(string(b), "\n") {
					if (strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR")) && !strings.Contains(line, "has no password") {
						lines = append(lines, line)
					}
				}
				if len(lines) > 30 {
					lines = lines[len(lines)-30:]
				}
				all := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("%s's warnings and errors:\n%s\nits last lines:\n%s", p.name, strings.Join(lines, "\n"), strings.Join(all[max(0, len(all)-4):], "\n"))
			}
		}
	})
	// In dependency order, each tier listening before the next starts
	// (a deployment's readiness): a client that dialed a service not yet
	// up waits out its reconnect backoff.
	for _, tier := range []string{"gateway-", "sandbox-", "checkpoint-", "session-", "replay-"} {
		for _, p := range rs.procs {
			if strings.HasPrefix(p.name, tier) {
				p.start(t)
			}
		}
		for _, p := range rs.procs {
			if strings.HasPrefix(p.name, tier) {
				p.waitListening(t)
			}
		}
	}
	rs.a = rs.dial(t, "1")
	rs.b = rs.dial(t, "2")
	rs.replays = map[string]replayv1.ReplayServiceClient{}
	for _, i := range []string{"1", "2"} {
		c, err := client.Endpoint{URL: "http://" + rs.byName["replay-"+i].addr, Token: rs.token}.Dial()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		rs.replays[i] = replayv1.NewReplayServiceClient(c)
	}
	return rs
}

// dial connects to side i (its session, sandbox and checkpoint replica)
// once all three answer.
func (rs *replicaSet) dial(t *testing.T, i string) stack {
	t.Helper()
	conn := func(name string) *grpc.ClientConn {
		c, err := client.Endpoint{URL: "http://" + rs.byName[name].addr, Token: rs.token}.Dial()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	s := stack{
		sessions:    sessionv1.NewSessionServiceClient(conn("session-" + i)),
		sandboxes:   sandboxv1.NewSandboxServiceClient(conn("sandbox-" + i)),
		checkpoints: checkpointv1.NewCheckpointServiceClient(conn("checkpoint-" + i)),
		gateway:     gatewayv1.NewGatewayServiceClient(conn("gateway-" + i)),
	}
	rs.waitUp(t, s)
	return s
}

func (rs *replicaSet) waitUp(t *testing.T, s stack) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for ; ; <-time.After(100 * time.Millisecond) {
		_, e1 := s.sessions.ListSessions(ctx, &sessionv1.ListSessionsRequest{})
		_, e2 := s.sandboxes.ListEnvironments(ctx, &sandboxv1.ListEnvironmentsRequest{})
		_, e3 := s.checkpoints.ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: "none"})
		if e1 == nil && e2 == nil && e3 == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas never answered: %v / %v / %v", e1, e2, e3)
		}
	}
}

// restart starts a killed replica again and waits for its side to answer.
func (rs *replicaSet) restart(t *testing.T, name string, side stack) {
	t.Helper()
	rs.byName[name].start(t)
	rs.byName[name].waitListening(t)
	rs.waitUp(t, side)
}

// waitState waits until name is in one of states (via s).
func waitState(t *testing.T, s stack, name string, within time.Duration, states ...sessionv1.SessionState) *sessionv1.Session {
	t.Helper()
	deadline := time.Now().Add(within)
	for ; ; <-time.After(100 * time.Millisecond) {
		got := s.get(t, name)
		for _, st := range states {
			if got.GetState() == st {
				return got
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v (%s) after %v, want one of %v", name, got.GetState(), got.GetStateReason(), within, states)
		}
	}
}

func TestReplicas(t *testing.T) {
	script := scripted.Script{
		Rules: append([]scripted.Rule{
			{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Finished."}},
		}, append(shellRules("long task", `for i in $(seq 1 100); do echo "line $i" >> progress.txt; sleep 0.1; done; echo worked`),
			shellRules("quick task", "echo quick >> quick.txt")...)...),
		Default: &scripted.Answer{Text: "OK."},
	}
	upstream, err := scripted.New(script)
	if err != nil {
		t.Fatal(err)
	}
	model := httptest.NewServer(upstream)
	t.Cleanup(model.Close)
	rs := startReplicas(t, model.URL)
	a, b := rs.a, rs.b
	ctx := context.Background()
	repo := gitRepo(t, map[string]string{"README.md": "base\n"})
	a.applyEnvironment(t, "e2e", repo, 0, sandboxv1.Egress_EGRESS_FULL)

	// Created through one replica, resumed, forked and suspended through
	// the other.
	if _, err := a.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "cross", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Do the quick task."}); err != nil {
		t.Fatal(err)
	}
	if got := b.waitTurn(t, "cross", 1); got.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("cross turn 1: %v %s", got.GetOutcome(), got.GetOutcomeReason())
	}
	// Its run was taped by gateway 1 (session-svc 1's gateway); gateway
	// 2 reads the same tape (fork at a step and replay read it through
	// any replica).
	run := b.get(t, "cross").GetTurns()[0].GetRunId()
	tapeA, err := a.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: run})
	if err != nil {
		t.Fatalf("tape of %s through gateway 1: %v", run, err)
	}
	tapeB, err := b.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: run})
	if err != nil {
		t.Fatalf("tape of %s (taped by gateway 1) through gateway 2: %v", run, err)
	}
	if len(tapeA.GetSteps()) == 0 || len(tapeB.GetSteps()) != len(tapeA.GetSteps()) {
		t.Fatalf("tape of %s: %d steps through gateway 1, %d through gateway 2", run, len(tapeA.GetSteps()), len(tapeB.GetSteps()))
	}
	for i := range tapeA.GetSteps() {
		if !proto.Equal(tapeA.GetSteps()[i], tapeB.GetSteps()[i]) {
			t.Fatalf("tape of %s: step %d differs between the gateways", run, i+1)
		}
	}
	// Two replay-svc replicas: a fork at a step started through replay 1,
	// which is killed with SIGKILL while the prefix replays; replay 2
	// takes the fork over once its lease has expired and settles it.
	fr, err := rs.replays["1"].ForkRun(ctx, &replayv1.ForkRunRequest{Run: run, AtSeq: int32(len(tapeA.GetSteps())), Continuations: proto.Int32(0)})
	if err != nil {
		t.Fatalf("fork at a step through replay 1: %v", err)
	}
	// Killed once the prefix's turn runs (session-svc 1 runs it on, the
	// replay needs no replay-svc meanwhile): a kill while replay 1 is still
	// in its CreateSession call cancels that call, and the prefix is then
	// rebuilt through the other side, whose sandbox-svc has another
	// HANGAR_SANDBOX_ROOT, so another work tree path (see ARCHITECTURE).
	for deadline := time.Now().Add(2 * time.Minute); ; <-time.After(50 * time.Millisecond) {
		p, err := b.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: fr.GetFork() + "-prefix"})
		if err == nil && p.GetSession().GetState() == sessionv1.SessionState_SESSION_STATE_RUNNING {
			break
		}
		f, ferr := rs.replays["2"].GetFork(ctx, &replayv1.GetForkRequest{Fork: fr.GetFork()})
		if ferr == nil && f.GetFork().GetStatus() != replayv1.ForkStatus_FORK_STATUS_REPLAYING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the prefix of fork %s never ran: %v %v", fr.GetFork(), err, ferr)
		}
	}
	rs.byName["replay-1"].stop(t, syscall.SIGKILL)
	killed := time.Now()
	atKill, err := rs.replays["2"].GetFork(ctx, &replayv1.GetForkRequest{Fork: fr.GetFork()})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(4 * time.Minute); ; <-time.After(500 * time.Millisecond) {
		f, err := rs.replays["2"].GetFork(ctx, &replayv1.GetForkRequest{Fork: fr.GetFork()})
		if err != nil {
			t.Fatal(err)
		}
		if st := f.GetFork().GetStatus(); st != replayv1.ForkStatus_FORK_STATUS_REPLAYING {
			if st != replayv1.ForkStatus_FORK_STATUS_VERIFIED {
				t.Fatalf("fork %s after replay 1 was killed: %v (%s) %v", fr.GetFork(), st, f.GetFork().GetStatusReason(), f.GetFork().GetDivergence())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fork %s still replaying 4 minutes after replay 1 was killed", fr.GetFork())
		}
	}
	if atKill.GetFork().GetStatus() == replayv1.ForkStatus_FORK_STATUS_REPLAYING {
		if log, _ := os.ReadFile(rs.byName["replay-2"].log.Name()); !strings.Contains(string(log), "fork resumed") || !strings.Contains(string(log), fr.GetFork()) {
			t.Errorf("fork %s settled, but replay 2's log does not say it took it over", fr.GetFork())
		}
		t.Logf("fork %s: replaying when replay 1 was killed, verified by replay 2 %v after the kill", fr.GetFork(), time.Since(killed).Round(100*time.Millisecond))
	} else {
		t.Logf("fork %s had settled (%v) before replay 1 was killed: the takeover was not exercised", fr.GetFork(), atKill.GetFork().GetStatus())
	}
	rs.byName["replay-1"].start(t)
	rs.byName["replay-1"].waitListening(t)

	if _, err := b.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: "cross", Message: "Do the quick task."}); err != nil {
		t.Fatalf("send through the other replica: %v", err)
	}
	if got := a.waitTurn(t, "cross", 2); got.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("cross turn 2 (sent through replica 2): %v %s", got.GetOutcome(), got.GetOutcomeReason())
	}
	if out := b.mustExec(t, b.get(t, "cross").GetSandboxId(), "cat quick.txt"); out != "quick\nquick\n" {
		t.Fatalf("quick.txt through replica 2's sandbox-svc = %q", out)
	}
	if _, err := b.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: "cross", N: 1}); err != nil {
		t.Fatalf("fork through replica 2: %v", err)
	}
	fork := waitState(t, a, "cross-fork-1", time.Minute, sessionv1.SessionState_SESSION_STATE_IDLE, sessionv1.SessionState_SESSION_STATE_SUSPENDED)
	t.Logf("fork: %v", fork.GetState())
	if _, err := a.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: "cross"}); err != nil {
		t.Fatalf("suspend through replica 1: %v", err)
	}
	if _, err := b.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "cross"}); err != nil {
		t.Fatalf("open through replica 2: %v", err)
	}
	if out := b.mustExec(t, b.get(t, "cross").GetSandboxId(), "cat quick.txt"); out != "quick\nquick\n" {
		t.Fatalf("quick.txt after suspend and open through the other replica = %q", out)
	}

	// An interrupt sent to the replica that does not run the turn: the
	// replica running it stops it (interrupted, checkpointed), and the
	// interrupt's message starts the next turn.
	if _, err := a.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "interrupt", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Do the long task."}); err != nil {
		t.Fatal(err)
	}
	waitProgress(t, a, "interrupt")
	ir, err := b.sessions.InterruptTurn(ctx, &sessionv1.InterruptTurnRequest{Name: "interrupt", Message: "Do the quick task."})
	if err != nil {
		t.Fatalf("interrupt through the replica not running the turn: %v", err)
	}
	if got := a.waitTurn(t, "interrupt", 1); got.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_INTERRUPTED || got.GetCheckpointId() == "" {
		t.Fatalf("interrupt turn 1 after an interrupt through replica 2: %v %q, checkpoint %q", got.GetOutcome(), got.GetOutcomeReason(), got.GetCheckpointId())
	}
	if n := ir.GetTurn().GetNumber(); n != 2 {
		t.Fatalf("the interrupt's message started turn %d, want 2", n)
	}
	if got := a.waitTurn(t, "interrupt", 2); got.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("interrupt turn 2: %v %s", got.GetOutcome(), got.GetOutcomeReason())
	}
	if out := a.mustExec(t, a.get(t, "interrupt").GetSandboxId(), "cat quick.txt; grep -c line progress.txt"); !strings.HasPrefix(out, "quick\n") || strings.HasSuffix(out, "\n100\n") {
		t.Fatalf("after the interrupt: quick.txt and progress lines = %q (the long task must have been stopped before its 100 lines)", out)
	}

	tally := &faultTally{byOp: map[string]int{}}
	h := &hangarProcess{stack: b}
	check := func(name string) {
		t.Helper()
		waitState(t, b, name, 2*time.Minute, sessionv1.SessionState_SESSION_STATE_SUSPENDED, sessionv1.SessionState_SESSION_STATE_IDLE,
			sessionv1.SessionState_SESSION_STATE_FAILED, sessionv1.SessionState_SESSION_STATE_NEEDS_INPUT)
		h.checkAfterFault(t, name, "", false, tally)
	}

	// kill -9 of session-svc replica 1 mid-turn: replica 2 ends the turn
	// with a checkpoint once replica 1's heartbeat has expired.
	if _, err := a.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "midturn", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Do the long task."}); err != nil {
		t.Fatal(err)
	}
	waitProgress(t, a, "midturn")
	rs.byName["session-1"].stop(t, syscall.SIGKILL)
	got := waitState(t, b, "midturn", 2*time.Minute, sessionv1.SessionState_SESSION_STATE_SUSPENDED)
	t.Logf("midturn after session-svc 1 was killed: %s", got.GetStateReason())
	check("midturn")
	rs.restart(t, "session-1", a)

	// kill -9 of session-svc replica 2 mid-suspend, through replica 1.
	if _, err := b.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "midsuspend", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "midsuspend"}); err != nil {
		t.Fatal(err)
	}
	b.mustExec(t, b.get(t, "midsuspend").GetSandboxId(), `mkdir -p data && for i in $(seq 1 200); do head -c 4096 /dev/urandom > data/f$i; done`)
	go func() { _, _ = b.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: "midsuspend"}) }()
	waitState(t, a, "midsuspend", time.Minute, sessionv1.SessionState_SESSION_STATE_SUSPENDING, sessionv1.SessionState_SESSION_STATE_SUSPENDED)
	rs.byName["session-2"].stop(t, syscall.SIGKILL)
	hA := &hangarProcess{stack: a}
	waitState(t, a, "midsuspend", 2*time.Minute, sessionv1.SessionState_SESSION_STATE_SUSPENDED)
	hA.checkAfterFault(t, "midsuspend", "", false, tally)
	rs.restart(t, "session-2", b)

	// kill -9 of session-svc replica 1 mid-fork.
	if _, err := a.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "midfork", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "midfork"}); err != nil {
		t.Fatal(err)
	}
	a.mustExec(t, a.get(t, "midfork").GetSandboxId(), `echo forked > f.txt`)
	forked := make(chan struct{})
	go func() {
		defer close(forked)
		_, _ = a.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: "midfork", N: 2})
	}()
	waitExists(t, b, "midfork-fork-1")
	rs.byName["session-1"].stop(t, syscall.SIGKILL)
	<-forked
	for _, n := range []string{"midfork", "midfork-fork-1", "midfork-fork-2"} {
		if _, err := b.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: n}); err != nil {
			continue
		}
		check(n)
	}
	rs.restart(t, "session-1", a)

	// kill -9 of sandbox-svc replica 2 and gateway-svc replica 2
	// mid-turn: the turn ends, the session can be resumed from its
	// checkpoint once they are back.
	if _, err := b.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "midsandbox", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Do the long task."}); err != nil {
		t.Fatal(err)
	}
	waitProgress(t, b, "midsandbox")
	rs.byName["sandbox-2"].stop(t, syscall.SIGKILL)
	rs.byName["gateway-2"].stop(t, syscall.SIGKILL)
	rs.byName["sandbox-2"].start(t)
	rs.byName["gateway-2"].start(t)
	rs.byName["sandbox-2"].waitListening(t)
	rs.byName["gateway-2"].waitListening(t)
	rs.waitUp(t, b)
	// Its turn ended when its sandbox's process died; the sandbox-svc
	// back on its root revived the sandbox under its lease: suspend it
	// (the work since the last checkpoint is captured), then check.
	waitState(t, b, "midsandbox", 2*time.Minute, sessionv1.SessionState_SESSION_STATE_SUSPENDED, sessionv1.SessionState_SESSION_STATE_IDLE,
		sessionv1.SessionState_SESSION_STATE_FAILED, sessionv1.SessionState_SESSION_STATE_NEEDS_INPUT)
	// session-svc 2's connections to the restarted services may still be
	// in their reconnect backoff: Unavailable says to try again, as a
	// client does.
	for deadline := time.Now().Add(time.Minute); ; <-time.After(200 * time.Millisecond) {
		s := b.get(t, "midsandbox")
		if s.GetState() == sessionv1.SessionState_SESSION_STATE_SUSPENDED {
			break
		}
		_, err := b.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: "midsandbox"})
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			t.Fatalf("midsandbox: suspend after sandbox-svc 2 came back (%v, %s): %v", s.GetState(), s.GetStateReason(), err)
		}
	}
	check("midsandbox")

	// The idle sweeps of both replicas: an idle session is suspended once.
	idle := int32(1)
	for _, n := range []string{"idle-1", "idle-2"} {
		if _, err := a.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: n, Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, IdleMinutes: &idle}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "idle-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "idle-2"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"idle-1", "idle-2"} {
		s := waitState(t, a, n, 3*time.Minute, sessionv1.SessionState_SESSION_STATE_SUSPENDED)
		idles := 0
		for _, tr := range s.GetTransitions() {
			// One suspend is idle → suspending → suspended, both with
			// the idle clock's reason.
			if tr.GetTo() == sessionv1.SessionState_SESSION_STATE_SUSPENDING && strings.HasPrefix(tr.GetReason(), "idle for") {
				idles++
			}
		}
		if idles != 1 {
			t.Errorf("%s: suspended by the idle clock %d times, want once: %v", n, idles, s.GetTransitions())
		}
	}
	t.Logf("checked after faults: %d resumed, %d identical, %d stuck, %d failed to open", tally.resumed, tally.identical, tally.stuck, tally.failedOpen)
}

// waitProgress waits until the long task's agent has written in its
// sandbox: the turn is under way.
func waitProgress(t *testing.T, s stack, name string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for ; ; <-time.After(100 * time.Millisecond) {
		got := s.get(t, name)
		if got.GetState() == sessionv1.SessionState_SESSION_STATE_RUNNING && got.GetSandboxId() != "" {
			if out, code := s.exec(t, got.GetSandboxId(), "cat progress.txt 2>/dev/null | wc -l"); code == 0 && strings.TrimSpace(out) != "0" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the long task never started (%v, %s)", name, got.GetState(), got.GetStateReason())
		}
	}
}

func waitExists(t *testing.T, s stack, name string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for ; ; <-time.After(20 * time.Millisecond) {
		if _, err := s.sessions.GetSession(context.Background(), &sessionv1.GetSessionRequest{Name: name}); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never existed", name)
		}
	}
}

var _ = fmt.Sprint
