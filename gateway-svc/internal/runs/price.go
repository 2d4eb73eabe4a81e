package runs

import (
	"strings"
)

// Price is USD per million tokens of each kind.
type Price struct {
	Input      float64 `json:"input"`
	Output     float64 `json:"output"`
	CacheRead  float64 `json:"cache_read"`
	CacheWrite float64 `json:"cache_write"`
}

// PriceTable maps a model-name prefix (a family, e.g. "claude-sonnet") to its
// price; the longest matching prefix wins, "" is the fallback.
type PriceTable map[string]Price

// DefaultPrices are list prices per model family (USD per million tokens) as
// published by the providers at the time of writing; override them in config.
func DefaultPrices() PriceTable {
	return PriceTable{
		"":              {Input: 3, Output: 15, CacheRead: 0.30, CacheWrite: 3.75},
		"claude-opus":   {Input: 15, Output: 75, CacheRead: 1.50, CacheWrite: 18.75},
		"claude-sonnet": {Input: 3, Output: 15, CacheRead: 0.30, CacheWrite: 3.75},
		"claude-haiku":  {Input: 1, Output: 5, CacheRead: 0.10, CacheWrite: 1.25},
		"gpt-5":         {Input: 1.25, Output: 10, CacheRead: 0.125},
		"gpt-5-mini":    {Input: 0.25, Output: 2, CacheRead: 0.025},
		"gpt-4.1":       {Input: 2, Output: 8, CacheRead: 0.50},
		"gpt-4o":        {Input: 2.5, Output: 10, CacheRead: 1.25},
		"o3":            {Input: 2, Output: 8, CacheRead: 0.50},
		"o4-mini":       {Input: 1.1, Output: 4.4, CacheRead: 0.275},
	}
}

// For returns the price of model: the longest prefix match, case-insensitive.
func (t PriceTable) For(model string) Price {
	model = strings.ToLower(model)
	best, bestLen := t[""], -1
	for prefix, p := range t {
		if strings.HasPrefix(model, strings.ToLower(prefix)) && len(prefix) > bestLen {
			best, bestLen = p, len(prefix)
		}
	}
	return best
}

// Cost is the USD cost of the given token counts of model.
func (t PriceTable) Cost(model string, in, out, cacheRead, cacheWrite int64) float64 {
	p := t.For(model)
	return (float64(in)*p.Input + float64(out)*p.Output + float64(cacheRead)*p.CacheRead + float64(cacheWrite)*p.CacheWrite) / 1e6
}
