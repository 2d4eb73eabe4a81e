package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/api/sandboxtool"
)

// recordTimed records session name's first run (Claude Code, the replay
// task) and returns the time from CreateSession to its turn's end (the
// turn's result on WaitForTurn's stream), the turn and the run's tape.
func recordTimed(b *testing.B, s *stack, name string) (time.Duration, *sessionv1.Turn, *gatewayv1.GetTapeResponse) {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: name, Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Please do the replay task."}); err != nil {
		b.Fatal(err)
	}
	turn := s.waitTurn(b, name, 1)
	wall := time.Since(start)
	if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED || turn.GetRunId() == "" {
		b.Fatalf("turn 1 of %s: %v (%s), run %q", name, turn.GetOutcome(), turn.GetOutcomeReason(), turn.GetRunId())
	}
	tape, err := s.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: turn.GetRunId()})
	if err != nil {
		b.Fatal(err)
	}
	return wall, turn, tape
}

// tapeToolTime is the run's own time between answers and the next
// requests for steps 1..n: the tools and the harness between two calls.
func tapeToolTime(steps []*gatewayv1.Step, n int) time.Duration {
	var d time.Duration
	for i := 0; i < n && i+1 < len(steps); i++ {
		answered := steps[i].GetTime().AsTime().Add(time.Duration(steps[i].GetLatencyMs()) * time.Millisecond)
		d += steps[i+1].GetTime().AsTime().Sub(answered)
	}
	return d
}

// BenchmarkForkAtStep measures, with the real Claude Code through the real
// gateway: the time to a rebuilt prefix at step N (continuations 0, from
// ForkRun to verified) against the recorded run's own tool time for steps
// 1..N (prefix: means over the loop; step-overhead-ms is the replay's span
// of steps 1..N over the run's tool time, per step; fixed-ms the rest of
// ForkRun to verified), against the same run's own wall time measured the
// same way less its model calls (rec-nonmodel-ms: like for like, the same
// sandbox boot, harness start and settle; each prefix forks a recording
// made just before it), and the time to forked (prefix
// rebuilt, k trial sessions copied and started) for k = 1, 4, 10 (k).
//
//	go test -run '^$' -bench BenchmarkForkAtStep -benchtime 1x ./e2e/
//	go test -run '^$' -bench 'BenchmarkForkAtStep/prefix' -benchtime 5x ./e2e/
func BenchmarkForkAtStep(b *testing.B) {
	script := replayScript(0)
	s := startStack(b, stackOptions{script: &script, vars: map[string]string{"HANGAR_CACHE_STAGGER_SECONDS": "0"}})
	s.applyEnvironment(b, "e2e", gitRepo(b, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	rs := &replayStack{stack: s}
	rs.replay = dialReplayTB(b, s)
	ctx := context.Background()
	// The stack's first recording (a warm-up: caches, first CLI start)
	// is forked for k; each prefix below has a recording of its own.
	_, turn, tape := recordTimed(b, s, "bench-rec")
	steps := tape.GetSteps()
	n := len(steps)
	settle := func(req *replayv1.ForkRunRequest, until func(*replayv1.Fork) bool) (time.Duration, *replayv1.Fork) {
		start := time.Now()
		resp, err := rs.replay.ForkRun(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		for {
			f, err := rs.replay.GetFork(ctx, &replayv1.GetForkRequest{Fork: resp.GetFork()})
			if err != nil {
				b.Fatal(err)
			}
			if until(f.GetFork()) {
				return time.Since(start), f.GetFork()
			}
			if time.Since(start) > 10*time.Minute {
				b.Fatalf("fork %s did not settle: %v", resp.GetFork(), f.GetFork())
			}
			time.Sleep(20 * time.Millisecond) // polling resolution of the measurement
		}
	}
	notReplaying := func(f *replayv1.Fork) bool { return f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_REPLAYING }
	allEnded := func(f *replayv1.Fork) bool { return notReplaying(f) && forkTrialsEnded(f) }
	hash, exec := treeHashTime(b, rs, turn.GetRunId())
	b.Run("prefix", func(b *testing.B) {
		var d, span, latency, tool, runLatency, rec time.Duration
		runs := 0
		for b.Loop() {
			// A recording of its own for each prefix, measured the same
			// way (the call that starts it to its end), so the two are
			// taken under the same load.
			wall, rturn, rtape := recordTimed(b, s, fmt.Sprintf("bench-rec-%d", runs))
			rsteps := rtape.GetSteps()
			if len(rsteps) != n {
				b.Fatalf("recording %d taped %d steps, want %d", runs, len(rsteps), n)
			}
			var lat time.Duration
			for _, st := range rsteps[:n] {
				lat += time.Duration(st.GetLatencyMs()) * time.Millisecond
			}
			runLatency += lat
			rec += wall - lat
			tool += tapeToolTime(rsteps, n)
			got, f := settle(&replayv1.ForkRunRequest{Run: rturn.GetRunId(), AtSeq: int32(n), Continuations: proto.Int32(0), WaitSeconds: 600}, notReplaying)
			if f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_VERIFIED {
				b.Fatalf("verify: %v (%s)", f.GetStatus(), f.GetStatusReason())
			}
			d += got
			// The replay's own tape: its span from the first request to
			// the last answer, and the gateway's time on each step.
			psteps := prefixTape(b, rs, f)
			if len(psteps) < n {
				b.Fatalf("the prefix run taped %d steps, want %d", len(psteps), n)
			}
			first, last := psteps[0], psteps[n-1]
			span += last.GetTime().AsTime().Add(time.Duration(last.GetLatencyMs()) * time.Millisecond).Sub(first.GetTime().AsTime())
			for _, st := range psteps[:n] {
				latency += time.Duration(st.GetLatencyMs()) * time.Millisecond
			}
			runs++
		}
		per := func(v time.Duration) time.Duration { return v / time.Duration(runs) }
		d, span, latency, tool, runLatency, rec = per(d), per(span), per(latency), per(tool), per(runLatency), per(rec)
		// prefix: ForkRun to verified, all in; fixed: the part before the
		// replay's first request and after its last answer (the sealed
		// environment, the sandbox, the harness's start, the settle);
		// step-overhead: the replay's span of steps 1..N over the run's
		// own tool time, per step (the target: at most 10 ms);
		// replay-latency: the gateway's time per replayed step (the tape
		// read, the request check, the tree hash), run-latency the same on
		// the recording (the scripted upstream, the tree hash); tree-hash:
		// one `hangar-sandbox tree-hash` exec, as the gateway runs it;
		// exec-true: an exec of `true` there (the floor of any exec).
		// rec-nonmodel: the recording's own wall time from CreateSession
		// to its turn's end less its model calls (the steps' latency: the
		// scripted upstream and the gateway), i.e. the same sandbox boot,
		// harness start, tools and settle the prefix has; prefix-over-rec:
		// the prefix's time over it, per step: the like-for-like overhead
		// of a replay (its answers from the tape are not model calls, so
		// they count as overhead here).
		b.ReportMetric(float64(d.Milliseconds()), fmt.Sprintf("prefix@%d-ms", n))
		b.ReportMetric(float64(rec.Milliseconds()), "rec-nonmodel-ms")
		b.ReportMetric(float64((d-rec).Milliseconds())/float64(n), "prefix-over-rec-ms/step")
		b.ReportMetric(float64(tool.Milliseconds()), "run-tool-ms")
		b.ReportMetric(float64(span.Milliseconds()), "replay-span-ms")
		b.ReportMetric(float64((d - span).Milliseconds()), "fixed-ms")
		b.ReportMetric(float64((span-tool).Milliseconds())/float64(n), "step-overhead-ms")
		b.ReportMetric(float64(latency.Milliseconds())/float64(n), "replay-latency-ms/step")
		b.ReportMetric(float64(runLatency.Milliseconds())/float64(n), "run-latency-ms/step")
		b.ReportMetric(float64(hash.Microseconds())/1000, "tree-hash-ms")
		b.ReportMetric(float64(exec.Microseconds())/1000, "exec-true-ms")
	})
	b.Run("k", func(b *testing.B) {
		for b.Loop() {
			var k1 time.Duration
			for _, k := range []int32{1, 4, 10} {
				d, f := settle(&replayv1.ForkRunRequest{Run: turn.GetRunId(), AtSeq: 3, Continuations: proto.Int32(k), WaitSeconds: 600}, notReplaying)
				if f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_FORKED {
					b.Fatalf("k=%d: %v (%s)", k, f.GetStatus(), f.GetStatusReason())
				}
				b.ReportMetric(float64(d.Milliseconds()), fmt.Sprintf("k%d-forked-ms", k))
				if k == 1 {
					k1 = d
				} else if k == 10 {
					b.ReportMetric(float64(d)/float64(k1), "k10/k1")
				}
				// Untimed: the trials run to their end before the next k.
				b.StopTimer()
				deadline := time.Now().Add(5 * time.Minute)
				for !allEnded(f) {
					if time.Now().After(deadline) {
						b.Fatalf("k=%d: trials still running after 5m: %v", k, f.GetTrials())
					}
					time.Sleep(200 * time.Millisecond)
					got, err := rs.replay.GetFork(ctx, &replayv1.GetForkRequest{Fork: f.GetFork()})
					if err != nil {
						b.Fatal(err)
					}
					f = got.GetFork()
				}
				b.StartTimer()
			}
		}
	})
}

// treeHashTime is the mean time of the sandbox exec the gateway runs at
// each step (`hangar-sandbox tree-hash`) in the sandbox of run's session,
// and of an exec of `true` there.
func treeHashTime(b *testing.B, rs *replayStack, run string) (hash, exec time.Duration) {
	b.Helper()
	ctx := context.Background()
	r, err := rs.gateway.GetRun(ctx, &gatewayv1.GetRunRequest{Run: run})
	if err != nil {
		b.Fatal(err)
	}
	sb := rs.get(b, r.GetRun().GetSession()).GetSandboxId()
	if sb == "" {
		if _, err := rs.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: r.GetRun().GetSession()}); err != nil {
			b.Fatal(err)
		}
		sb = rs.get(b, r.GetRun().GetSession()).GetSandboxId()
	}
	line, err := sandboxtool.Request(sandboxtool.TreeHashRequest{WorkDir: r.GetRun().GetSandbox().GetWorkDir()})
	if err != nil {
		b.Fatal(err)
	}
	const times = 5
	for range times {
		for _, c := range []struct {
			argv  []string
			stdin []byte
			d     *time.Duration
		}{{sandboxtool.Argv(sandboxtool.CommandTreeHash), line, &hash}, {[]string{"true"}, nil, &exec}} {
			var out, errOut bytes.Buffer
			start := time.Now()
			code, err := sandboxexec.New(rs.sandboxes).Exec(ctx, sb, 0, c.argv, nil, "", bytes.NewReader(c.stdin), &out, &errOut)
			*c.d += time.Since(start)
			if err != nil || code != 0 {
				b.Fatalf("%v in %s: %d %v %s", c.argv, sb, code, err, errOut.String())
			}
		}
	}
	return hash / times, exec / times
}

// prefixTape is the tape of the run that rebuilt f's prefix.
func prefixTape(b *testing.B, rs *replayStack, f *replayv1.Fork) []*gatewayv1.Step {
	b.Helper()
	ctx := context.Background()
	runs, err := rs.gateway.ListRuns(ctx, &gatewayv1.ListRunsRequest{Session: f.GetPrefixSession()})
	if err != nil || len(runs.GetRuns()) == 0 {
		b.Fatalf("runs of %s: %v %v", f.GetPrefixSession(), runs, err)
	}
	tape, err := rs.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: runs.GetRuns()[0].GetId()})
	if err != nil {
		b.Fatal(err)
	}
	return tape.GetSteps()
}

func forkTrialsEnded(f *replayv1.Fork) bool {
	for _, t := range f.GetTrials() {
		if t.GetStatus() == replayv1.TrialStatus_TRIAL_STATUS_LIVE || t.GetStatus() == replayv1.TrialStatus_TRIAL_STATUS_REPLAYING {
			return false
		}
	}
	return true
}
