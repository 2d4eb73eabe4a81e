package runs_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/redistest"
	"github.com/hangar-dev/hangar/gateway-svc/internal/runs"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func newStore(t *testing.T) (*runs.Store, *clock) {
	rdb, prefix := redistest.New(t)
	c := &clock{t: time.Now()}
	return runs.New(rdb, runs.Options{Prefix: prefix, Now: c.Now}), c
}

func TestTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, clk := newStore(t)
	a, tokA, err := s.Create(ctx, &gatewayv1.Run{Session: "ses-a", Turn: 1, Harness: "claude"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	b, tokB, err := s.Create(ctx, &gatewayv1.Run{Session: "ses-a", Turn: 2}, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if tokA == tokB || !strings.HasPrefix(tokA, "hgr_") || a.Id == b.Id || !strings.HasPrefix(a.Id, "ses-a.run-") {
		t.Fatalf("ids/tokens: %s %s %s %s", a.Id, b.Id, tokA, tokB)
	}
	got, err := s.Authenticate(ctx, tokA)
	if err != nil || got.Id != a.Id {
		t.Fatalf("Authenticate(A) = %v, %v", got, err)
	}
	if _, err := s.Authenticate(ctx, "hgr_nope"); !errors.Is(err, runs.ErrUnknownToken) {
		t.Errorf("unknown token: %v", err)
	}
	// A expires after an hour; B still works.
	clk.Advance(61 * time.Minute)
	if _, err := s.Authenticate(ctx, tokA); !errors.Is(err, runs.ErrUnknownToken) {
		t.Errorf("expired token: %v", err)
	}
	if r, _ := s.Get(ctx, a.Id); r.State != gatewayv1.RunState_RUN_STATE_ENDED || r.StateReason != "expired" {
		t.Errorf("expired run: %v %q", r.State, r.StateReason)
	}
	if _, err := s.Authenticate(ctx, tokB); err != nil {
		t.Errorf("B: %v", err)
	}
	ended, err := s.End(ctx, b.Id, "ended by caller")
	if err != nil || ended.State != gatewayv1.RunState_RUN_STATE_ENDED || ended.EndedAt == nil {
		t.Errorf("End: %v %v", ended, err)
	}
	list, _, err := s.List(ctx, "ses-a", 10, "")
	if err != nil || len(list) != 2 || list[0].Id != b.Id {
		t.Errorf("List: %v %v", list, err)
	}
	if _, err := s.Get(ctx, "nope"); !errors.Is(err, runs.ErrNotFound) {
		t.Errorf("Get(nope): %v", err)
	}
}

func TestBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	tests := []struct {
		name   string
		budget *gatewayv1.Budget
		usage  runs.StepUsage
		want   gatewayv1.RunState
		reason string
	}{
		{"no budget", nil, runs.StepUsage{Input: 1e6, Output: 1e6}, gatewayv1.RunState_RUN_STATE_ACTIVE, ""},
		{"tokens", &gatewayv1.Budget{MaxTokens: 1}, runs.StepUsage{Input: 10, Output: 2}, gatewayv1.RunState_RUN_STATE_OVER_BUDGET, "max_tokens 1 exceeded (used 12)"},
		{"cost", &gatewayv1.Budget{MaxCostUsd: 0.01}, runs.StepUsage{Model: "claude-sonnet-4-5", Input: 10000}, gatewayv1.RunState_RUN_STATE_OVER_BUDGET, "max_cost_usd 0.01 exceeded (spent 0.0300)"},
		{"under", &gatewayv1.Budget{MaxCostUsd: 1, MaxTokens: 100}, runs.StepUsage{Input: 10}, gatewayv1.RunState_RUN_STATE_ACTIVE, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run, _, err := s.Create(ctx, &gatewayv1.Run{Model: "claude-sonnet-4-5", Budget: tc.budget}, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			u, state, reason, err := s.AddUsage(ctx, run, 1, tc.usage)
			if err != nil {
				t.Fatal(err)
			}
			if state != tc.want || reason != tc.reason {
				t.Errorf("state %v %q, want %v %q", state, reason, tc.want, tc.reason)
			}
			got, _ := s.Get(ctx, run.Id)
			if got.State != tc.want || got.StateReason != tc.reason || got.Usage.InputTokens != tc.usage.Input || got.Steps != 1 || got.Usage.ModelCalls != 1 {
				t.Errorf("run after: %v", got)
			}
			if diff := got.Usage.CostUsd - u.CostUsd; diff > 1e-9 || diff < -1e-9 {
				t.Errorf("cost %v vs step %v", got.Usage.CostUsd, u.CostUsd)
			}
		})
	}
}

func TestSteeringAndReplayState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	run, _, _ := s.Create(ctx, &gatewayv1.Run{}, time.Hour)
	for i, m := range []string{"one", "two"} {
		if n, err := s.Steer(ctx, run.Id, m); err != nil || n != i+1 {
			t.Fatalf("Steer: %d %v", n, err)
		}
	}
	msgs, err := s.TakeSteering(ctx, run.Id)
	if err != nil || strings.Join(msgs, ",") != "one,two" {
		t.Fatalf("TakeSteering: %v %v", msgs, err)
	}
	if msgs, _ := s.TakeSteering(ctx, run.Id); len(msgs) != 0 {
		t.Errorf("second take: %v", msgs)
	}
	if _, err := s.SetReplay(ctx, run.Id, &gatewayv1.Replay{TapeRun: "x", AtSeq: 3}); err != nil {
		t.Fatal(err)
	}
	_ = s.ReplayProgress(ctx, run.Id)
	first, _ := s.SetDivergence(ctx, run.Id, &gatewayv1.Divergence{Seq: 2, Kind: gatewayv1.DivergenceKind_DIVERGENCE_KIND_TOOL})
	second, _ := s.SetDivergence(ctx, run.Id, &gatewayv1.Divergence{Seq: 3})
	d, n, err := s.Divergence(ctx, run.Id)
	if err != nil || !first || second || d.Seq != 2 || n != 1 {
		t.Errorf("divergence %v %d %v %v %v", d, n, err, first, second)
	}
	got, _ := s.Get(ctx, run.Id)
	if got.Replay.GetAtSeq() != 3 {
		t.Errorf("replay not stored: %v", got.Replay)
	}
}

func TestPrices(t *testing.T) {
	t.Parallel()
	p := runs.DefaultPrices()
	if p.For("claude-opus-4-1").Output != 75 || p.For("gpt-5-mini-2025").Input != 0.25 || p.For("unknown").Input != 3 {
		t.Errorf("price lookup wrong")
	}
}
