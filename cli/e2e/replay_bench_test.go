package e2e_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

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
// 1..N, and the time to forked (prefix rebuilt, k trial sessions copied and
// started) for k = 1, 4, 10.
//
//	go test -run '^$' -bench BenchmarkForkAtStep -benchtime 1x ./e2e/
func BenchmarkForkAtStep(b *testing.B) {
	script := replayScript(0)
	s := startStack(b, stackOptions{script: &script, vars: map[string]string{"HANGAR_CACHE_STAGGER_SECONDS": "0"}})
	s.applyEnvironment(b, "e2e", gitRepo(b, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	rs := &replayStack{stack: s}
	rs.replay = dialReplayTB(b, s)
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "bench-rec", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Please do the replay task."}); err != nil {
		b.Fatal(err)
	}
	turn := s.waitTurn(b, "bench-rec", 1)
	tape, err := s.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: turn.GetRunId()})
	if err != nil {
		b.Fatal(err)
	}
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
	b.ResetTimer()
	for b.Loop() {
		d, f := settle(&replayv1.ForkRunRequest{Run: turn.GetRunId(), AtSeq: int32(n), Continuations: proto.Int32(0), WaitSeconds: 600}, notReplaying)
		if f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_VERIFIED {
			b.Fatalf("verify: %v (%s)", f.GetStatus(), f.GetStatusReason())
		}
		tool := tapeToolTime(steps, n)
		b.ReportMetric(float64(d.Milliseconds()), fmt.Sprintf("prefix@%d-ms", n))
		b.ReportMetric(float64(tool.Milliseconds()), "run-tool-ms")
		b.ReportMetric(float64((d-tool).Milliseconds())/float64(n), "overhead-ms/step")
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
			for !allEnded(f) {
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
}

func forkTrialsEnded(f *replayv1.Fork) bool {
	for _, t := range f.GetTrials() {
		if t.GetStatus() == replayv1.TrialStatus_TRIAL_STATUS_LIVE || t.GetStatus() == replayv1.TrialStatus_TRIAL_STATUS_REPLAYING {
			return false
		}
	}
	return true
}
