package e2e_test

// The fault suite: `hangar up` as a process of its own, with the real
// Claude Code and a scripted upstream, stopped by SIGTERM or kill -9 at
// seeded random points of a turn, a capture (suspend), a restore (open) and
// a fork, then started again on the same data directory. Afterwards every
// session must be out of the in-between states, open again from its newest
// checkpoint with the tree byte-identical (a capture right after the open
// finds nothing changed and keeps that checkpoint), and after SIGTERM what
// was written before the signal must be there.
//
// HANGAR_FAULT_POINTS (default 52) and HANGAR_FAULT_SEED (default 1) set
// the number of points and the seed.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/client"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// faultWorkCmd is the turn the faults land in: it writes for about a
// second, so a point can fall anywhere in it.
const faultWorkCmd = `for i in $(seq 1 20); do echo "line $i" >> progress.txt; sleep 0.05; done; echo worked`

// hangarProcess is `hangar up` run as its own process on one data
// directory and one front door address, restartable.
type hangarProcess struct {
	bin, home, addr string
	env             []string
	cmd             *exec.Cmd
	exited          chan struct{}
	log             *os.File
	// keepLog: keep the log as if the test failed (HANGAR_E2E_KEEP_LOG).
	keepLog atomic.Bool
	conn    interface{ Close() error }
	stack
}

// buildHangar builds the hangar binary once for the test.
func buildHangar(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "hangar")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/hangar-dev/hangar/cli/cmd/hangar")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build hangar: %v\n%s", err, out)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// newHangarProcess prepares `hangar up` as a process on a fresh data
// directory, with more HANGAR_* settings in vars; the test's cleanup stops
// it (SIGTERM) and checks nothing its sandboxes ran outlives it.
func newHangarProcess(t *testing.T, vars ...string) *hangarProcess {
	t.Helper()
	root := t.TempDir()
	h := &hangarProcess{bin: buildHangar(t), home: filepath.Join(root, "hangar"), addr: freeAddr(t)}
	var err error
	h.log, err = os.Create(filepath.Join(root, "hangar.log"))
	if err != nil {
		t.Fatal(err)
	}
	h.env = append(append(os.Environ(),
		"HANGAR_HOME="+h.home, "HANGAR_ADDR="+h.addr,
		"HANGAR_SESSION_ADDR=127.0.0.1:0", "HANGAR_SANDBOX_ADDR=127.0.0.1:0", "HANGAR_CHECKPOINT_ADDR=127.0.0.1:0",
		"HANGAR_GATEWAY_ADDR=127.0.0.1:0", "HANGAR_REPLAY_ADDR=127.0.0.1:0",
		"HANGAR_LOG_LEVEL=info",
	), vars...)
	t.Cleanup(func() {
		h.stop(t, syscall.SIGTERM)
		if left := processesUnder(h.home); len(left) > 0 {
			t.Errorf("processes left running in hangar's sandboxes after it stopped (killed now): %v", left)
		}
		if t.Failed() || h.keepLog.Load() {
			// The data directory goes with the test: show its warnings
			// (HANGAR_E2E_KEEP_LOG=FILE keeps the whole log).
			b, _ := os.ReadFile(h.log.Name())
			if keep := os.Getenv("HANGAR_E2E_KEEP_LOG"); keep != "" {
				_ = os.WriteFile(keep, b, 0o644)
			}
			var lines []string
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
					lines = append(lines, line)
				}
			}
			if len(lines) > 80 {
				lines = lines[len(lines)-80:]
			}
			t.Logf("hangar's warnings and errors:\n%s", strings.Join(lines, "\n"))
		}
	})
	return h
}

// start runs hangar up and waits until its API answers.
func (h *hangarProcess) start(t *testing.T) {
	t.Helper()
	_ = os.Remove(filepath.Join(h.home, "endpoint"))
	h.cmd = exec.Command(h.bin, "up")
	if os.Getenv("HANGAR_E2E_KEEP_LOG") != "" {
		h.cmd.Args = append(h.cmd.Args, "-v") // every record, kept across restarts
	}
	h.cmd.Env = h.env
	h.cmd.Stdout, h.cmd.Stderr = h.log, h.log
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		_ = cmd.Wait()
		close(exited)
	}(h.cmd, h.exited)
	token := ""
	deadline := time.Now().Add(2 * time.Minute)
	for ; time.Now().Before(deadline); <-time.After(50 * time.Millisecond) {
		select {
		case <-h.exited:
			t.Fatalf("hangar up exited at start; its log: %s", h.log.Name())
		default:
		}
		b, err := os.ReadFile(filepath.Join(h.home, "token"))
		if err != nil || len(b) == 0 {
			continue
		}
		token = strings.TrimSpace(string(b))
		if _, err := os.Stat(filepath.Join(h.home, "endpoint")); err != nil {
			continue
		}
		break
	}
	conn, err := client.Endpoint{URL: "http://" + h.addr, Token: token}.Dial()
	if err != nil {
		t.Fatal(err)
	}
	h.conn = conn
	h.stack = stack{
		sessions:    sessionv1.NewSessionServiceClient(conn),
		jobs:        sessionv1.NewJobServiceClient(conn),
		sandboxes:   sandboxv1.NewSandboxServiceClient(conn),
		checkpoints: checkpointv1.NewCheckpointServiceClient(conn),
	}
	for ; time.Now().Before(deadline); <-time.After(50 * time.Millisecond) {
		if _, err := h.sessions.ListSessions(context.Background(), &sessionv1.ListSessionsRequest{}); err == nil {
			return
		}
	}
	t.Fatalf("hangar up never answered; its log: %s", h.log.Name())
}

// stop signals hangar up and waits for it to exit (a SIGTERM drains
// first; a stop that takes too long is a failure, then killed).
func (h *hangarProcess) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if h.cmd == nil {
		return
	}
	_ = h.conn.Close()
	_ = h.cmd.Process.Signal(sig)
	select {
	case <-h.exited:
	case <-time.After(4 * time.Minute):
		t.Errorf("hangar up did not exit within 4 minutes of %v; killing it", sig)
		_ = h.cmd.Process.Kill()
		<-h.exited
	}
	h.cmd = nil
}

// faultTally counts what came of the points.
type faultTally struct {
	mu                                    sync.Mutex
	points, resumed, identical, lostWrite int
	stuck, failedOpen, retriedOpen        int
	byOp                                  map[string]int
}

func TestFaultKillPoints(t *testing.T) {
	dir := os.Getenv("HANGAR_HARNESS_DIR")
	if dir == "" {
		t.Skip("HANGAR_HARNESS_DIR is unset: run .ci/install-harnesses and set it to use the real agent CLIs")
	}
	points := 52
	if v := os.Getenv("HANGAR_FAULT_POINTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("HANGAR_FAULT_POINTS=%q: want a positive number", v)
		}
		points = n
	}
	seed := uint64(1)
	if v := os.Getenv("HANGAR_FAULT_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("HANGAR_FAULT_SEED=%q: want a number", v)
		}
		seed = n
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

	script := scripted.Script{
		Rules: append([]scripted.Rule{
			{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Finished."}},
		}, append(shellRules("long task", faultWorkCmd), shellRules("quick task", "echo quick")...)...),
		Default: &scripted.Answer{Text: "OK."},
	}
	upstream, err := scripted.New(script)
	if err != nil {
		t.Fatal(err)
	}
	model := httptest.NewServer(upstream)
	t.Cleanup(model.Close)

	// The sandbox cache off: a resume restores, so the restore points
	// fall in a restore (a cached resume would restore nothing).
	h := newHangarProcess(t,
		"HANGAR_ANTHROPIC_URL="+model.URL, "HANGAR_ANTHROPIC_API_KEY=upstream-key",
		"HANGAR_CLAUDE_BIN="+filepath.Join(dir, harnessClaude), "HANGAR_SANDBOX_CACHE=0")
	h.start(t)
	h.applyEnvironment(t, "e2e", gitRepo(t, map[string]string{"README.md": "base\n"}), 0, sandboxv1.Egress_EGRESS_FULL)

	tally := &faultTally{byOp: map[string]int{}}
	ops := []string{"turn", "capture", "restore", "fork"}
	// How long each operation takes here, roughly: a point falls in
	// [0, that).
	span := map[string]time.Duration{"turn": 4 * time.Second, "capture": 400 * time.Millisecond, "restore": 800 * time.Millisecond, "fork": 1500 * time.Millisecond}
	for i := range points {
		op := ops[i%len(ops)]
		sig := syscall.SIGKILL
		if rng.IntN(2) == 0 {
			sig = syscall.SIGTERM
		}
		delay := time.Duration(rng.Int64N(int64(span[op])))
		name := fmt.Sprintf("fault-%d", i)
		marker := fmt.Sprintf("point %d, %s, %v after %v", i, op, sig, delay)
		h.faultPoint(t, op, name, marker, sig, delay, tally)
	}
	t.Logf("fault points (seed %d): %d in all %v; %d/%d sessions opened again, %d/%d with the newest checkpoint's tree byte-identical, %d stuck in between, %d failed to open (%d needed a second try), %d SIGTERM points lost a write",
		seed, tally.points, tally.byOp, tally.resumed, tally.resumed+tally.failedOpen, tally.identical, tally.resumed, tally.stuck, tally.failedOpen, tally.retriedOpen, tally.lostWrite)
}

// faultPoint sets a session up for op, starts op, signals hangar after
// delay, starts hangar again and checks the session (and its forks).
func (h *hangarProcess) faultPoint(t *testing.T, op, name, marker string, sig syscall.Signal, delay time.Duration, tally *faultTally) {
	t.Helper()
	ctx := context.Background()
	if _, err := h.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: name, Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE}); err != nil {
		t.Fatalf("%s: create: %v", name, err)
	}
	if _, err := h.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name}); err != nil {
		t.Fatalf("%s: open: %v", name, err)
	}
	sandbox := h.get(t, name).GetSandboxId()
	// Some work before the operation: files a capture has to read.
	h.mustExec(t, sandbox, `mkdir -p data && for i in $(seq 1 40); do head -c 2048 /dev/urandom > data/f$i; done`)
	if op == "restore" || op == "fork" {
		if _, err := h.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: name}); err != nil {
			t.Fatalf("%s: suspend: %v", name, err)
		}
	} else {
		h.mustExec(t, sandbox, "printf '%s\\n' '"+marker+"' > marker.txt")
	}

	started := make(chan struct{})
	go func() {
		close(started)
		octx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		// The call fails when hangar goes: that is the point.
		switch op {
		case "turn":
			_, _ = h.sessions.SendMessage(octx, &sessionv1.SendMessageRequest{Name: name, Message: "Do the long task."})
		case "capture":
			_, _ = h.sessions.SuspendSession(octx, &sessionv1.SuspendSessionRequest{Name: name})
		case "restore":
			_, _ = h.sessions.OpenSession(octx, &sessionv1.OpenSessionRequest{Name: name})
		case "fork":
			_, _ = h.sessions.ForkSession(octx, &sessionv1.ForkSessionRequest{Name: name, N: 2})
		}
	}()
	<-started
	<-time.After(delay) // the fault point itself, not a wait for a condition
	h.stop(t, sig)
	h.start(t)

	names := []string{name}
	for _, fork := range []string{name + "-fork-1", name + "-fork-2"} {
		if _, err := h.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: fork}); err == nil {
			names = append(names, fork)
		}
	}
	tally.mu.Lock()
	tally.points++
	tally.byOp[op]++
	tally.mu.Unlock()
	for _, n := range names {
		h.checkAfterFault(t, n, marker, sig == syscall.SIGTERM && n == name && (op == "turn" || op == "capture"), tally)
	}
}

// checkAfterFault: the session leaves the in-between states, opens again,
// its tree is its newest checkpoint's, and (wantMarker) the write made
// before the signal is there. It is suspended again after.
func (h *hangarProcess) checkAfterFault(t *testing.T, name, marker string, wantMarker bool, tally *faultTally) {
	t.Helper()
	ctx := context.Background()
	var s *sessionv1.Session
	deadline := time.Now().Add(time.Minute)
	for ; ; <-time.After(50 * time.Millisecond) {
		s = h.get(t, name)
		switch s.GetState() {
		case sessionv1.SessionState_SESSION_STATE_RUNNING, sessionv1.SessionState_SESSION_STATE_RESUMING, sessionv1.SessionState_SESSION_STATE_SUSPENDING:
			if time.Now().Before(deadline) {
				continue
			}
			tally.mu.Lock()
			tally.stuck++
			tally.mu.Unlock()
			t.Errorf("%s: still %v a minute after the restart (%s)", name, s.GetState(), s.GetStateReason())
			return
		}
		break
	}
	for _, turn := range s.GetTurns() {
		if turn.GetEndedAt() == nil {
			t.Errorf("%s: turn %d has no end after the restart", name, turn.GetNumber())
		}
	}
	cps, err := h.checkpoints.ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: name})
	if err != nil {
		t.Fatalf("%s: checkpoints: %v", name, err)
	}
	newest := ""
	if len(cps.GetCheckpoints()) > 0 {
		newest = cps.GetCheckpoints()[0].GetId()
	}
	if _, err := h.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name}); err != nil {
		// Counted, and tried once more: a restore's exec is seen ended
		// early about once in a thousand restores (issue #12, open); a
		// session that opens on the second try is not wedged, one that
		// does not is.
		tally.mu.Lock()
		tally.retriedOpen++
		h.keepLog.Store(true)
		tally.mu.Unlock()
		t.Logf("%s: first open after the restart failed (state %v, %s): %v", name, s.GetState(), s.GetStateReason(), err)
		if _, err := h.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name}); err != nil {
			tally.mu.Lock()
			tally.failedOpen++
			tally.mu.Unlock()
			t.Errorf("%s: open after the restart, twice (state %v, %s): %v", name, s.GetState(), s.GetStateReason(), err)
			return
		}
	}
	tally.mu.Lock()
	tally.resumed++
	tally.mu.Unlock()
	if wantMarker {
		out, code := h.exec(t, h.get(t, name).GetSandboxId(), "cat marker.txt")
		if code != 0 || strings.TrimSpace(out) != marker {
			tally.mu.Lock()
			tally.lostWrite++
			tally.mu.Unlock()
			t.Errorf("%s: written before SIGTERM, marker.txt = %q (exit %d), want %q", name, out, code, marker)
		}
	}
	resp, err := h.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: name})
	if err != nil {
		t.Fatalf("%s: suspend after the check: %v", name, err)
	}
	after, err := h.checkpoints.ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: name})
	if err != nil || len(after.GetCheckpoints()) == 0 {
		t.Fatalf("%s: checkpoints after the check: %v (state %v)", name, err, resp.GetSession().GetState())
	}
	if newest == "" || after.GetCheckpoints()[0].GetId() == newest {
		tally.mu.Lock()
		tally.identical++
		tally.mu.Unlock()
		return
	}
	t.Errorf("%s: the tree opened from checkpoint %s differs from it (a capture right after the open made %s)", name, newest, after.GetCheckpoints()[0].GetId())
}
