package sessions

import (
	"testing"

	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

func TestOverBudgetReason(t *testing.T) {
	for _, tc := range []struct {
		budget  store.Budget
		usage   store.Usage
		gateway string
		want    string
	}{
		{store.Budget{MaxCostUSD: 0.01}, store.Usage{CostUSD: 0.0667}, "max_cost_usd 0.01 exceeded (spent 0.0667)",
			"turn stopped: over its budget of $0.01 (spent $0.07; --max-cost)"},
		{store.Budget{MaxCostUSD: 5, MaxTokens: 10}, store.Usage{InputTokens: 22000, OutputTokens: 41, CacheReadTokens: 19}, "",
			"turn stopped: over its budget of 10 tokens (used 22060; --max-tokens)"},
		{store.Budget{MaxCostUSD: 5}, store.Usage{CostUSD: 1}, "max_cost_usd 5 exceeded",
			"turn stopped: over its budget: max_cost_usd 5 exceeded"},
		{store.Budget{}, store.Usage{}, "", "turn stopped: over its budget"},
	} {
		if got := overBudgetReason(tc.budget, tc.usage, tc.gateway); got != tc.want {
			t.Errorf("overBudgetReason(%+v, %+v, %q) = %q, want %q", tc.budget, tc.usage, tc.gateway, got, tc.want)
		}
	}
}
