package e2e_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// TestFaultKillMidJob: `hangar up` (a process) killed with kill -9, then
// stopped with SIGTERM, while a best-of-N job's attempts are inside their
// tool call: each time the next process picks the job up (the attempts'
// cut-off turns are sent again) and delivers; the job is never failed.
func TestFaultKillMidJob(t *testing.T) {
	dir := os.Getenv("HANGAR_HARNESS_DIR")
	if dir == "" {
		t.Skip("HANGAR_HARNESS_DIR is unset: run .ci/install-harnesses and set it to use the real agent CLIs")
	}
	root := t.TempDir()
	// The slow task waits for release.flag in its work tree (an isolated
	// sandbox sees nothing of the test's files).
	const slow = `touch waiting.flag; while [ ! -e release.flag ]; do sleep 0.05; done; echo slow-done`
	script := scripted.Script{
		Rules: append(append([]scripted.Rule{
			{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Done with the task."}},
		}, shellRules("first task", forkFirstCmd)...), shellRules("slow task", slow)...),
		Default: &scripted.Answer{Text: "OK."},
	}
	upstream, err := scripted.New(script)
	if err != nil {
		t.Fatal(err)
	}
	model := httptest.NewServer(upstream)
	t.Cleanup(model.Close)
	h := &hangarProcess{bin: buildHangar(t), home: filepath.Join(root, "hangar"), addr: freeAddr(t)}
	h.log, err = os.Create(filepath.Join(root, "hangar.log"))
	if err != nil {
		t.Fatal(err)
	}
	h.env = append(os.Environ(),
		"HANGAR_HOME="+h.home, "HANGAR_ADDR="+h.addr,
		"HANGAR_SESSION_ADDR=127.0.0.1:0", "HANGAR_SANDBOX_ADDR=127.0.0.1:0", "HANGAR_CHECKPOINT_ADDR=127.0.0.1:0",
		"HANGAR_GATEWAY_ADDR=127.0.0.1:0", "HANGAR_REPLAY_ADDR=127.0.0.1:0",
		"HANGAR_ANTHROPIC_URL="+model.URL, "HANGAR_ANTHROPIC_API_KEY=upstream-key",
		"HANGAR_CLAUDE_BIN="+filepath.Join(dir, harnessClaude),
		"HANGAR_CACHE_STAGGER_SECONDS=0", "HANGAR_LOG_LEVEL=info",
	)
	t.Cleanup(func() {
		h.stop(t, syscall.SIGTERM)
		if left := processesUnder(h.home); len(left) > 0 {
			t.Errorf("processes left running in hangar's sandboxes after it stopped (killed now): %v", left)
		}
		if t.Failed() {
			// The log is in the test's temporary directory, gone after
			// it: show its warnings.
			b, _ := os.ReadFile(h.log.Name())
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") || strings.Contains(line, "job") && !strings.Contains(line, "rpc finished") {
					t.Log(line)
				}
			}
		}
	})
	h.start(t)
	h.applyEnvironment(t, "e2e", gitRepo(t, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	ctx := context.Background()
	delivered := 0
	for i, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		parent := fmt.Sprintf("killjob-%d", i)
		if _, err := h.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
			Name: parent, Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Please do the first task.",
		}); err != nil {
			t.Fatal(err)
		}
		if first := h.waitTurn(t, parent, 1); first.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
			t.Fatalf("%s turn 1: %v (%s)", parent, first.GetOutcome(), first.GetOutcomeReason())
		}
		check := `case "$(basename "$(dirname "$PWD")")" in *-2) echo "score 9";; *) exit 1;; esac`
		created, err := h.jobs.CreateJob(ctx, &sessionv1.CreateJobRequest{
			Strategy: sessionv1.JobStrategy_JOB_STRATEGY_BEST_OF_N, Session: parent, Message: "Please do the slow task.", N: 2, Check: check,
		})
		if err != nil {
			t.Fatal(err)
		}
		id := created.GetJob().GetId()
		deadline := time.Now().Add(3 * time.Minute)
		for waiting := 0; waiting < 2; <-time.After(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the attempts never reached their tool call", id)
			}
			job, err := h.jobs.GetJob(ctx, &sessionv1.GetJobRequest{Id: id})
			if err != nil {
				t.Fatal(err)
			}
			if job.GetJob().GetEndedAt() != nil {
				t.Fatalf("%s ended before the fault: %v (%s), attempts %v", id, job.GetJob().GetState(), job.GetJob().GetError(), job.GetJob().GetAttempts())
			}
			waiting = 0
			for _, a := range job.GetJob().GetAttempts() {
				got, err := h.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: a.GetSession()})
				if err != nil || got.GetSession().GetSandboxId() == "" {
					continue
				}
				if _, code := h.exec(t, got.GetSession().GetSandboxId(), "test -f waiting.flag"); code == 0 {
					waiting++
				}
			}
		}
		h.stop(t, sig)
		h.start(t)
		if job, err := h.jobs.GetJob(ctx, &sessionv1.GetJobRequest{Id: id}); err != nil || job.GetJob().GetState() == sessionv1.JobState_JOB_STATE_FAILED {
			t.Fatalf("%s after %v: %v, %v", id, sig, job.GetJob(), err)
		}
		stopReleasing := releaseSlowTasks(t, &h.stack)
		var job *sessionv1.Job
		deadline = time.Now().Add(5 * time.Minute)
		for ; ; <-time.After(100 * time.Millisecond) {
			resp, err := h.jobs.GetJob(ctx, &sessionv1.GetJobRequest{Id: id})
			if err != nil {
				t.Fatal(err)
			}
			if job = resp.GetJob(); job.GetEndedAt() != nil {
				stopReleasing()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still %v 5 minutes after %v", id, job.GetState(), sig)
			}
		}
		if job.GetState() != sessionv1.JobState_JOB_STATE_DELIVERED || !strings.HasSuffix(job.GetWinner(), "-2") {
			t.Errorf("%s after %v: %v (%s), winner %q, attempts %v", id, sig, job.GetState(), job.GetError(), job.GetWinner(), job.GetAttempts())
			continue
		}
		delivered++
	}
	t.Logf("best-of-N jobs cut off mid-turn by kill -9 and by SIGTERM: %d/2 picked up and delivered", delivered)
}
