package runs_test

import (
	"context"
	"testing"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/redistest"
	"github.com/hangar-dev/hangar/gateway-svc/internal/runs"
	"github.com/hangar-dev/hangar/platform/blob"
)

// A run outlives a Redis that lost it: its token authenticates, its usage,
// budget state and step numbers are what they were, and a call counted
// after the loss adds to them.
func TestJournalRestoresLostRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, prefix := redistest.New(t)
	journal, err := blob.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := runs.New(rdb, runs.Options{Prefix: prefix, Journal: journal, JournalNotFound: blob.ErrNotFound})
	run, token, err := s.Create(ctx, &gatewayv1.Run{Session: "ses-j", Turn: 1, Model: "claude-sonnet-4-5", Budget: &gatewayv1.Budget{MaxTokens: 1500}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		seq, err := s.NextSeq(ctx, run.Id)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := s.AddUsage(ctx, run, seq, runs.StepUsage{Input: 500, Output: 100}); err != nil {
			t.Fatal(err)
		}
	}
	lose := func() {
		t.Helper()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	}
	lose()
	got, err := s.Authenticate(ctx, token)
	if err != nil || got.Id != run.Id {
		t.Fatalf("Authenticate after the loss = %v, %v", got, err)
	}
	if u := got.GetUsage(); u.GetModelCalls() != 2 || u.GetInputTokens() != 1000 || got.GetSteps() != 2 {
		t.Fatalf("usage after the loss: %v, %d steps", u, got.GetSteps())
	}
	seq, err := s.NextSeq(ctx, run.Id)
	if err != nil || seq != 3 {
		t.Fatalf("next step after the loss = %d, %v; want 3", seq, err)
	}
	lose() // lost again mid-call: the call is still counted
	_, state, _, err := s.AddUsage(ctx, run, seq, runs.StepUsage{Input: 500, Output: 100})
	if err != nil || state != gatewayv1.RunState_RUN_STATE_OVER_BUDGET {
		t.Fatalf("third call = %v, %v; want over budget (1800 of 1500 tokens)", state, err)
	}
	lose()
	got, err = s.Get(ctx, run.Id)
	if err != nil || got.GetUsage().GetModelCalls() != 3 || got.GetState() != gatewayv1.RunState_RUN_STATE_OVER_BUDGET {
		t.Fatalf("run after a third loss = %v, %v", got, err)
	}
	if _, err := s.Authenticate(ctx, "hgr_unknown"); err == nil {
		t.Fatal("an unknown token authenticated")
	}
}
