package forks

import (
	"context"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/replay-svc/internal/store"
)

type aaGateway struct{ Gateway }

func (aaGateway) GetRun(context.Context, *gatewayv1.GetRunRequest, ...grpc.CallOption) (*gatewayv1.GetRunResponse, error) {
	return &gatewayv1.GetRunResponse{Run: &gatewayv1.Run{Id: "att.run-1", Session: "att", Turn: 1, Harness: "claude"}}, nil
}

type aaJobs struct{ code int32 }

func (j aaJobs) ListJobs(context.Context, *sessionv1.ListJobsRequest, ...grpc.CallOption) (*sessionv1.ListJobsResponse, error) {
	return &sessionv1.ListJobsResponse{Jobs: []*sessionv1.Job{
		{Id: "other", Strategy: sessionv1.JobStrategy_JOB_STRATEGY_BEST_OF_N, Check: "true", Attempts: []*sessionv1.Attempt{{Session: "x"}}},
		{Id: "job-1", Strategy: sessionv1.JobStrategy_JOB_STRATEGY_BEST_OF_N, Check: "make test", Attempts: []*sessionv1.Attempt{
			{Session: "att", Outcome: sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED, CheckExitCode: j.code}}},
	}}, nil
}

// aaChecks answers every check with code, and records what it ran.
type aaChecks struct {
	code int
	ran  *[]string
}

func (c aaChecks) Check(_ context.Context, session, check string) (int, error) {
	*c.ran = append(*c.ran, session+": "+check)
	return c.code, nil
}

// TestAA: a trial of a clean prefix of a best-of-N attempt records whether
// the job's check gives the same result on it as on the attempt; a
// diverged prefix or a run outside any job records none.
func TestAA(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := store.Open(ctx, store.Options{SQLitePath: filepath.Join(t.TempDir(), "replay.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	clean := &replayv1.Fork{Fork: "job-clean", Run: "att.run-1", Harness: "claude", Status: replayv1.ForkStatus_FORK_STATUS_FORKED,
		Trials: []*replayv1.Trial{{Id: "job-clean.1", Fork: "job-clean", Session: "job-clean-1", Outcome: replayv1.TrialOutcome_TRIAL_OUTCOME_COMPLETED}}, TrialIds: []string{"job-clean.1"}}
	diverged := &replayv1.Fork{Fork: "job-div", Run: "att.run-1", Harness: "claude", Status: replayv1.ForkStatus_FORK_STATUS_DIVERGED,
		Divergence: &replayv1.Divergence{Seq: 2, Kind: replayv1.DivergenceKind_DIVERGENCE_KIND_TOOL},
		Trials:     []*replayv1.Trial{{Id: "job-div.1", Fork: "job-div", Session: "job-div-1"}}, TrialIds: []string{"job-div.1"}}
	for _, f := range []*replayv1.Fork{clean, diverged} {
		if err := st.CreateFork(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name              string
		original, onTrial int
		trial             *replayv1.Trial
		want, ok          bool
	}{
		{"both pass", 0, 0, clean.Trials[0], true, true},
		{"original passed, trial fails", 0, 1, clean.Trials[0], false, true},
		{"both fail", 2, 1, clean.Trials[0], true, true},
		{"trial did not complete", 0, 0, &replayv1.Trial{Id: "job-clean.1", Fork: "job-clean", Session: "job-clean-1", Outcome: replayv1.TrialOutcome_TRIAL_OUTCOME_FAILED}, false, true},
		{"diverged prefix", 0, 0, diverged.Trials[0], false, false},
	}
	for _, tc := range tests {
		var ran []string
		m := New(Options{Store: st, Gateway: aaGateway{}, Jobs: aaJobs{code: int32(tc.original)}, Checks: aaChecks{code: tc.onTrial, ran: &ran}})
		aa, ok := m.aa(ctx, tc.trial)
		if aa != tc.want || ok != tc.ok {
			t.Errorf("%s: aa %v ok %v, want %v %v", tc.name, aa, ok, tc.want, tc.ok)
		}
		if tc.ok && tc.trial.GetOutcome() == replayv1.TrialOutcome_TRIAL_OUTCOME_COMPLETED && (len(ran) != 1 || ran[0] != "job-clean-1: make test") {
			t.Errorf("%s: checks run %v", tc.name, ran)
		}
	}
	// A run that is no job's attempt: no aa.
	m := New(Options{Store: st, Gateway: aaGateway{}, Jobs: noJobs{}, Checks: aaChecks{ran: new([]string)}})
	if _, ok := m.aa(ctx, clean.Trials[0]); ok {
		t.Error("aa recorded for a run outside any job")
	}
}

type noJobs struct{}

func (noJobs) ListJobs(context.Context, *sessionv1.ListJobsRequest, ...grpc.CallOption) (*sessionv1.ListJobsResponse, error) {
	return &sessionv1.ListJobsResponse{}, nil
}
