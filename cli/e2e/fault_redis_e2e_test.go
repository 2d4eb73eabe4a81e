package e2e_test

// Redis and PostgreSQL faults: hangar with an external redis-server (and
// an external PostgreSQL cluster) that the test restarts in the middle of
// a turn, a lease and a hold. A Redis restarted empty is the hard case (a
// deployment without persistence, or one whose data was lost); each test
// restarts it empty.

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
	sessionapp "github.com/hangar-dev/hangar/session-svc/app"
)

// privateRedis is a redis-server of the test's own on a free port, without
// persistence: a restart empties it.
type privateRedis struct {
	bin, port, dir string
	cmd            *exec.Cmd
	exited         chan struct{}
}

func startPrivateRedis(t *testing.T) *privateRedis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed (apt-get install redis-server)")
	}
	_, port, _ := net.SplitHostPort(freeAddr(t))
	r := &privateRedis{bin: bin, port: port, dir: t.TempDir()}
	r.start(t)
	t.Cleanup(func() { r.stop() })
	return r
}

func (r *privateRedis) url() string { return "redis://127.0.0.1:" + r.port + "/0" }

func (r *privateRedis) start(t *testing.T) {
	t.Helper()
	r.cmd = exec.Command(r.bin, "--port", r.port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", r.dir)
	log, err := os.OpenFile(filepath.Join(r.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	r.cmd.Stdout, r.cmd.Stderr = log, log
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		_ = cmd.Wait()
		_ = log.Close()
		close(exited)
	}(r.cmd, r.exited)
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + r.port})
	defer client.Close()
	deadline := time.Now().Add(30 * time.Second)
	for client.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on port %s did not answer", r.port)
		}
		<-time.After(10 * time.Millisecond)
	}
}

// stop kills it (a crash: nothing is saved).
func (r *privateRedis) stop() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.exited
	r.cmd = nil
}

// restart kills it and starts it again, empty, on the same port.
func (r *privateRedis) restart(t *testing.T) {
	t.Helper()
	r.stop()
	r.start(t)
}

// redisFaultStart is hangar on r with the scripted upstream: "long task"
// waits in its tool call until release.flag exists.
func redisFaultStart(t *testing.T, r *privateRedis, vars map[string]string) *stack {
	t.Helper()
	script := scripted.Script{
		Rules: append([]scripted.Rule{
			{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Finished."}},
		}, append(shellRules("long task", controlWaitCmd), shellRules("quick task", "echo quick")...)...),
		Default: &scripted.Answer{Text: "OK."},
	}
	all := map[string]string{"HANGAR_REDIS_URL": r.url()}
	for k, v := range vars {
		all[k] = v
	}
	s := startStack(t, stackOptions{script: &script, vars: all})
	s.applyEnvironment(t, "e2e", gitRepo(t, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	return s
}

// TestRedisRestartMidTurn: Redis restarted empty while turns wait in their
// tool call, N times: every turn completes (the agent's next model call
// goes through), with the usage of all its model calls, and get answers
// throughout.
func TestRedisRestartMidTurn(t *testing.T) {
	rounds := faultRounds(3)
	r := startPrivateRedis(t)
	s := redisFaultStart(t, r, nil)
	ctx := context.Background()
	// The same turn without a fault: the usage every faulted turn must
	// report (a Redis that lost the run's counters reports less).
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
		Name: "redis-baseline", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Do the long task.",
	}); err != nil {
		t.Fatal(err)
	}
	s.mustExec(t, controlWaitRunning(t, s, "redis-baseline"), "touch release.flag")
	baseline := s.waitTurn(t, "redis-baseline", 1).GetUsage()
	if baseline.GetModelCalls() < 2 || baseline.GetInputTokens() == 0 {
		t.Fatalf("baseline turn's usage %v: want at least 2 model calls", baseline)
	}
	completed, usageKept := 0, 0
	for i := 1; i <= rounds; i++ {
		name := fmt.Sprintf("redis-turn-%d", i)
		if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
			Name: name, Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Do the long task.",
		}); err != nil {
			t.Fatalf("round %d: new: %v", i, err)
		}
		sandbox := controlWaitRunning(t, s, name)
		r.restart(t)
		if _, err := s.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: name}); err != nil {
			t.Errorf("round %d: get right after Redis restarted: %v", i, err)
		}
		s.mustExec(t, sandbox, "touch release.flag")
		turn := s.waitTurn(t, name, 1)
		if turn.GetOutcome() == sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
			completed++
		} else {
			t.Errorf("round %d: turn %v (%s)", i, turn.GetOutcome(), turn.GetOutcomeReason())
		}
		u := turn.GetUsage()
		// Input tokens differ by the length of the session's name in
		// the prompt; a lost count is about half.
		near := math.Abs(float64(u.GetInputTokens()-baseline.GetInputTokens())) < 0.01*float64(baseline.GetInputTokens())
		if u.GetModelCalls() == baseline.GetModelCalls() && near && u.GetOutputTokens() == baseline.GetOutputTokens() {
			usageKept++
		} else {
			t.Errorf("round %d: usage %v, want the baseline's %v", i, u, baseline)
		}
		// The gateway's own record agrees (it was put back after the
		// restart, counters and all).
		if run, err := s.gateway.GetRun(ctx, &gatewayv1.GetRunRequest{Run: turn.GetRunId()}); err != nil || run.GetRun().GetUsage().GetModelCalls() != baseline.GetModelCalls() {
			t.Errorf("round %d: gateway run %s: %v, %v", i, turn.GetRunId(), run.GetRun().GetUsage(), err)
		}
	}
	t.Logf("Redis restarted empty %d times mid-turn: %d/%d turns completed, %d/%d kept their usage", rounds, completed, rounds, usageKept, rounds)
}

// TestRedisDownMidTurn: Redis unreachable for a few seconds while a turn
// runs (the agent's tool call ends and its next model call comes during
// the outage): get and list answer, the sandbox stays usable, and the turn
// completes with all its usage once Redis is back.
func TestRedisDownMidTurn(t *testing.T) {
	r := startPrivateRedis(t)
	s := redisFaultStart(t, r, nil)
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
		Name: "redis-down", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Do the long task.",
	}); err != nil {
		t.Fatal(err)
	}
	sandbox := controlWaitRunning(t, s, "redis-down")
	r.stop()
	if got, err := s.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: "redis-down"}); err != nil || got.GetSession().GetState() != sessionv1.SessionState_SESSION_STATE_RUNNING {
		t.Errorf("get while Redis is down: %v, %v", got.GetSession().GetState(), err)
	}
	if _, err := s.sessions.ListSessions(ctx, &sessionv1.ListSessionsRequest{}); err != nil {
		t.Errorf("list while Redis is down: %v", err)
	}
	s.mustExec(t, sandbox, "touch release.flag")
	// The outage's length (the fault itself, not a wait for something):
	// the agent's next model call meets it and retries.
	<-time.After(3 * time.Second)
	r.start(t)
	turn := s.waitTurn(t, "redis-down", 1)
	if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED || turn.GetUsage().GetModelCalls() < 2 {
		t.Fatalf("turn after a Redis outage: %v (%s), usage %v", turn.GetOutcome(), turn.GetOutcomeReason(), turn.GetUsage())
	}
	if got := s.get(t, "redis-down"); got.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE || got.GetSandboxId() != sandbox {
		t.Errorf("session after the outage: %v (%s) on %q, want idle on %s", got.GetState(), got.GetStateReason(), got.GetSandboxId(), sandbox)
	}
}

// faultRounds is HANGAR_FAULT_REDIS_ROUNDS, or def.
func faultRounds(def int) int {
	if v, err := strconv.Atoi(os.Getenv("HANGAR_FAULT_REDIS_ROUNDS")); err == nil && v > 0 {
		return v
	}
	return def
}

// TestRedisRestartMidLease: Redis restarted empty while sessions keep
// sandboxes: each sandbox keeps its lease (same holder, same fencing
// token, renewable, usable), no sandbox is leased to anyone else, and
// every lease taken afterwards has a higher token than any before.
func TestRedisRestartMidLease(t *testing.T) {
	r := startPrivateRedis(t)
	s := startStack(t, stackOptions{vars: map[string]string{"HANGAR_REDIS_URL": r.url()}})
	s.applyEnvironment(t, "e2e", gitRepo(t, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	ctx := context.Background()
	leaseOf := func(sandbox string) *sandboxv1.Lease {
		t.Helper()
		got, err := s.sandboxes.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: sandbox})
		if err != nil {
			t.Fatalf("sandbox %s: %v", sandbox, err)
		}
		return got.GetSandbox().GetLease()
	}
	open := func(name string) (string, *sandboxv1.Lease) {
		t.Helper()
		if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: name, Environment: "e2e"}); err != nil {
			t.Fatal(err)
		}
		opened, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		sb := opened.GetSession().GetSandboxId()
		return sb, leaseOf(sb)
	}
	type kept struct {
		name, sandbox string
		lease         *sandboxv1.Lease
	}
	var sessions []kept
	maxToken := uint64(0)
	rounds := faultRounds(3)
	for i := 1; i <= rounds; i++ {
		name := fmt.Sprintf("lease-%d", i)
		sb, l := open(name)
		if l.GetFencingToken() <= maxToken {
			t.Errorf("round %d: %s leased with token %d, not above every earlier token (%d)", i, sb, l.GetFencingToken(), maxToken)
		}
		maxToken = max(maxToken, l.GetFencingToken())
		sessions = append(sessions, kept{name, sb, l})
		r.restart(t)
		for _, k := range sessions {
			// The holder's heartbeat and an operator's command both go on.
			if _, err := s.sandboxes.RenewLease(ctx, &sandboxv1.RenewLeaseRequest{SandboxId: k.sandbox, FencingToken: k.lease.GetFencingToken(), TtlSeconds: 60}); err != nil {
				t.Errorf("round %d: renew %s's lease after Redis restarted empty: %v", i, k.name, err)
			}
			if out, code := s.exec(t, k.sandbox, "echo ok"); code != 0 || out != "ok\n" {
				t.Errorf("round %d: exec in %s's sandbox: %q, %d", i, k.name, out, code)
			}
			if l := leaseOf(k.sandbox); l.GetHolder() != k.lease.GetHolder() || l.GetFencingToken() != k.lease.GetFencingToken() {
				t.Errorf("round %d: %s's lease is now %v, was %v", i, k.name, l, k.lease)
			}
		}
	}
	list, err := s.sandboxes.ListSandboxes(ctx, &sandboxv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	holders := map[string]string{}
	for _, sb := range list.GetSandboxes() {
		h := sb.GetLease().GetHolder()
		if h == "" {
			continue
		}
		if other, ok := holders[h]; ok {
			t.Errorf("%s holds two sandboxes: %s and %s", h, other, sb.GetId())
		}
		holders[h] = sb.GetId()
	}
	if len(holders) != rounds {
		t.Errorf("%d leased sandboxes, want %d: %v", len(holders), rounds, holders)
	}
	for _, k := range sessions {
		if _, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: k.name}); err != nil {
			t.Errorf("suspend %s after the restarts: %v", k.name, err)
		}
	}
	t.Logf("Redis restarted empty %d times with %d sandboxes leased: leases kept with their tokens, none leased twice, tokens only rose", rounds, rounds)
}

// TestRedisRestartMidHold: with the injected clock, a session held by an
// API client is never suspended across Redis restarts that empty it: the
// idle clock waits (a grace) while the holder takes its vanished hold
// again, as the CLI does, and suspends the session only once released.
func TestRedisRestartMidHold(t *testing.T) {
	clock := &sessionMoreClock{now: time.Now().UTC(), tick: make(chan time.Time)}
	r := startPrivateRedis(t)
	s := startStack(t, stackOptions{clock: sessionapp.Clock{Now: clock.Now, Tick: clock.tick}, vars: map[string]string{"HANGAR_REDIS_URL": r.url()}})
	s.applyEnvironment(t, "e2e", gitRepo(t, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "held-r", Environment: "e2e"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "held-r"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.sessions.KeepSession(ctx, &sessionv1.KeepSessionRequest{Name: "held-r", IdleMinutes: 5}); err != nil {
		t.Fatal(err)
	}
	acquire := &sessionv1.AcquireHoldRequest{Name: "held-r", Owner: "api/test", Kind: sessionv1.HoldKind_HOLD_KIND_COMMAND, TtlSeconds: 3600}
	hold, err := s.sessions.AcquireHold(ctx, acquire)
	if err != nil {
		t.Fatal(err)
	}
	id := hold.GetHold().GetId()
	suspended := 0
	check := func(round int, when string) {
		t.Helper()
		if got := s.get(t, "held-r"); got.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE {
			suspended++
			t.Fatalf("round %d, %s: the held session is %v (%s)", round, when, got.GetState(), got.GetStateReason())
		}
	}
	rounds := faultRounds(3)
	for i := 1; i <= rounds; i++ {
		clock.advance(10 * time.Minute)
		clock.sweep(t)
		check(i, "10 minutes into an idle time of 5")
		r.restart(t)
		clock.sweep(t)
		check(i, "right after Redis restarted empty")
		// The holder's heartbeat finds its hold gone and takes it again.
		if _, err := s.sessions.RenewHold(ctx, &sessionv1.RenewHoldRequest{Name: "held-r", HoldId: id, TtlSeconds: 3600}); err == nil {
			t.Fatalf("round %d: the hold survived a Redis restarted empty", i)
		}
		again, err := s.sessions.AcquireHold(ctx, acquire)
		if err != nil {
			t.Fatalf("round %d: hold again: %v", i, err)
		}
		id = again.GetHold().GetId()
		clock.advance(10 * time.Minute)
		clock.sweep(t)
		check(i, "10 minutes after the restart, held again")
	}
	if _, err := s.sessions.ReleaseHold(ctx, &sessionv1.ReleaseHoldRequest{Name: "held-r", HoldId: id}); err != nil {
		t.Fatal(err)
	}
	clock.advance(6 * time.Minute)
	clock.sweep(t)
	if got := s.get(t, "held-r"); got.GetState() != sessionv1.SessionState_SESSION_STATE_SUSPENDED {
		t.Fatalf("6 minutes after the release (idle 5): %v (%s), want suspended", got.GetState(), got.GetStateReason())
	}
	t.Logf("Redis restarted empty %d times while a session was held past its idle time: %d suspensions of the held session", rounds, suspended)
}

// TestRedisRestartMidJob: Redis restarted empty while a best-of-N job's
// attempts are mid-turn: the runner takes its claim and its holds again,
// the attempts' turns go on, and the job delivers.
func TestRedisRestartMidJob(t *testing.T) {
	r := startPrivateRedis(t)
	script := forkScript()
	st := startStack(t, stackOptions{script: &script, vars: map[string]string{"HANGAR_REDIS_URL": r.url(), "HANGAR_CACHE_STAGGER_SECONDS": "0"}})
	st.applyEnvironment(t, "e2e", gitRepo(t, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	s := &forkStack{stack: st}
	ctx := context.Background()
	s.parent(t, "redisjob", sessionv1.Harness_HARNESS_CLAUDE)
	check := `case "$(basename "$(dirname "$PWD")")" in *-1) echo "score 3";; *) exit 1;; esac`
	created, err := s.jobs.CreateJob(ctx, &sessionv1.CreateJobRequest{
		Strategy: sessionv1.JobStrategy_JOB_STRATEGY_BEST_OF_N, Session: "redisjob", Message: "Please do the slow task.", N: 2, Check: check,
	})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetJob().GetId()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		job, err := s.jobs.GetJob(ctx, &sessionv1.GetJobRequest{Id: id})
		if err != nil {
			t.Fatal(err)
		}
		running := 0
		for _, a := range job.GetJob().GetAttempts() {
			if got, err := s.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: a.GetSession()}); err == nil &&
				got.GetSession().GetState() == sessionv1.SessionState_SESSION_STATE_RUNNING {
				running++
			}
		}
		if running == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job's attempts are not both running: %v", job.GetJob())
		}
		<-time.After(100 * time.Millisecond)
	}
	r.restart(t)
	releaseSlowTasks(t, s.stack)
	job := forkWaitJob(t, s, id)
	if job.GetState() != sessionv1.JobState_JOB_STATE_DELIVERED || !strings.HasSuffix(job.GetWinner(), "-1") {
		t.Fatalf("job after Redis restarted empty: %v (%s), winner %q, attempts %v", job.GetState(), job.GetError(), job.GetWinner(), job.GetAttempts())
	}
	for _, a := range job.GetAttempts() {
		if a.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED || a.GetUsage().GetModelCalls() < 2 {
			t.Errorf("attempt %s: %v, usage %v", a.GetSession(), a.GetOutcome(), a.GetUsage())
		}
	}
}
