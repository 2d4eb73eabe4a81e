package replay_test

import (
	"testing"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/replay"
)

func TestCompare(t *testing.T) {
	t.Parallel()
	const (
		anth = gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES
		resp = gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES
		chat = gatewayv1.Provider_PROVIDER_OPENAI_CHAT_COMPLETIONS
	)
	anthBody := func(prompt, result string) string {
		return `{"model":"m","metadata":{"user_id":"` + prompt + `x"},"messages":[{"role":"user","content":"` + prompt + `"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"Bash","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"` + result + `"}]}]}`
	}
	respBody := func(prompt, out string) string {
		return `{"model":"m","prompt_cache_key":"` + out + `","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"` + prompt + `"}]},{"type":"function_call","call_id":"c","name":"exec_command","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"` + out + `"}]}`
	}
	chatBody := func(prompt, out string) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + prompt + `"},{"role":"tool","tool_call_id":"c","content":"` + out + `"}]}`
	}
	tests := []struct {
		name            string
		p               gatewayv1.Provider
		taped, incoming string
		want            gatewayv1.DivergenceKind
	}{
		{"same", anth, anthBody("a", "ok"), anthBody("a", "ok"), 0},
		{"anthropic prompt", anth, anthBody("a", "ok"), anthBody("b", "ok"), gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL},
		{"anthropic tool", anth, anthBody("a", "ok"), anthBody("a", "changed"), gatewayv1.DivergenceKind_DIVERGENCE_KIND_TOOL},
		{"anthropic network", anth, anthBody("a", "ok"), anthBody("a", "curl: (6) Could not resolve host: example.com"), gatewayv1.DivergenceKind_DIVERGENCE_KIND_NETWORK},
		{"responses same but cache key", resp, respBody("a", "ok"), `{"model":"m","prompt_cache_key":"zzz","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call","call_id":"c","name":"exec_command","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"ok"}]}`, 0},
		{"responses wall time", resp, respBody("a", "Wall time: 0.0012 seconds\\nok"), respBody("a", "Wall time: 0.0420 seconds\\nok"), 0},
		{"responses tool", resp, respBody("a", "ok"), respBody("a", "no"), gatewayv1.DivergenceKind_DIVERGENCE_KIND_TOOL},
		{"responses network", resp, respBody("a", "ok"), respBody("a", "connect: Connection refused"), gatewayv1.DivergenceKind_DIVERGENCE_KIND_NETWORK},
		{"chat model", chat, chatBody("a", "ok"), chatBody("b", "ok"), gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL},
		{"chat tool", chat, chatBody("a", "ok"), chatBody("a", "nope"), gatewayv1.DivergenceKind_DIVERGENCE_KIND_TOOL},
		{"not json", chat, chatBody("a", "ok"), "{", gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL},
		{"extra message", chat, chatBody("a", "ok"), `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"tool","tool_call_id":"c","content":"ok"},{"role":"user","content":"more"}]}`, gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := replay.Compare(tc.p, []byte(tc.taped), []byte(tc.incoming))
			if d.GetKind() != tc.want {
				t.Errorf("kind %v, want %v (%v)", d.GetKind(), tc.want, d)
			}
			if d != nil && (d.Detail == "" || d.Expected == d.Actual) {
				t.Errorf("divergence lacks detail: %v", d)
			}
		})
	}
}
