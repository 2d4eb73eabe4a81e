package replay_test

import (
	"strings"
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

// TestCanonicalisation has one case per rule of what two executions of the
// same CLI legitimately send differently (docs/ARCHITECTURE.md, "Fork at a
// step"), and for each a change the rule must not hide.
func TestCanonicalisation(t *testing.T) {
	t.Parallel()
	const (
		anth = gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES
		resp = gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES
	)
	canon := replay.Canon{TapeSession: "demo", Session: "job-1a2b3c4d-p"}
	system := func(s string) string {
		return `{"model":"m","system":[{"type":"text","text":"` + s + `"}],"messages":[{"role":"user","content":"hi"}]}`
	}
	tests := []struct {
		name            string
		p               gatewayv1.Provider
		taped, incoming string
		want            gatewayv1.DivergenceKind
	}{
		{"session id (metadata.user_id)", anth,
			`{"model":"m","metadata":{"user_id":"user_abc_session_1111"},"messages":[]}`,
			`{"model":"m","metadata":{"user_id":"user_abc_session_2222"},"messages":[]}`, 0},
		{"conversation id (prompt_cache_key)", resp,
			`{"model":"m","prompt_cache_key":"0199-aaaa","input":[]}`,
			`{"model":"m","prompt_cache_key":"0199-bbbb","input":[]}`, 0},
		{"request item ids", resp,
			`{"model":"m","input":[{"type":"message","id":"msg_1","role":"user","content":[{"type":"input_text","text":"a"}]}]}`,
			`{"model":"m","input":[{"type":"message","id":"msg_2","role":"user","content":[{"type":"input_text","text":"a"}]}]}`, 0},
		{"date line", anth, system(`Today's date is 2026-11-30.`), system(`Today's date is 2026-12-01.`), 0},
		{"codex date", resp,
			`{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"<current_date>2026-11-30</current_date>"}]}]}`,
			`{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"<current_date>2026-12-01</current_date>"}]}]}`, 0},
		{"date line (Today's date:)", anth, system(`Today's date: 2026-11-30`), system(`Today's date: 2026-12-01`), 0},
		{"date line (Current date:)", anth, system(`Current date: 2026-11-30`), system(`Current date: 2026-12-01`), 0},
		{"two dates of two forms", anth, system(`Today's date is 2026-11-30. Current date: 2026-11-30`), system(`Today's date is 2026-12-01. Current date: 2026-12-02`), 0},
		{"a date line's text still compared", anth, system(`Today's date is 2026-11-30. a`), system(`Today's date is 2026-12-01. b`), gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL},
		{"the same request spaced otherwise", anth,
			`{"model":"m","metadata":{"user_id":"s1"},"messages":[{"role":"user","content":"hi"}]}`,
			`{"model": "m", "metadata": {"user_id": "s2"}, "messages": [{"role": "user", "content": "hi"}]}`, 0},
		{"a field only one side has", anth,
			`{"model":"m","metadata":{"user_id":"s1"},"messages":[]}`,
			`{"model":"m","metadata":{"user_id":"s2"},"messages":[],"temperature":1}`, gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL},
		{"date elsewhere still differs", anth, system(`release 2026-11-30`), system(`release 2026-12-01`), gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL},
		{"work tree path", anth,
			system(`Working directory: /var/hangar/sandboxes/demo/work`),
			system(`Working directory: /var/hangar/sandboxes/job-1a2b3c4d-p/work`), 0},
		{"claude project directory", anth,
			system(`see /root/.claude/projects/-var-hangar-sandboxes-demo-work/memory`),
			system(`see /root/.claude/projects/-var-hangar-sandboxes-job-1a2b3c4d-p-work/memory`), 0},
		{"sandbox home path", anth,
			system(`memory at /var/hangar/sandboxes/demo/home/.claude/projects/x`),
			system(`memory at /var/hangar/sandboxes/job-1a2b3c4d-p/home/.claude/projects/x`), 0},
		{"session branch", anth,
			system(`Current branch: hangar/session/demo`),
			system(`Current branch: hangar/session/job-1a2b3c4d-p`), 0},
		{"job attempt's branch", anth,
			system(`Current branch: hangar/session/demo-fork-1`),
			system(`Current branch: hangar/session/job-1a2b3c4d-p`), 0},
		{"another branch still differs", anth,
			system(`Current branch: main`),
			system(`Current branch: hangar/session/job-1a2b3c4d-p`), gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL},
		{"another path still differs", anth,
			system(`Working directory: /var/hangar/sandboxes/demo/work`),
			system(`Working directory: /var/hangar/sandboxes/other/work`), gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL},
		{"MCP tools the replay cannot reach", anth,
			`{"model":"m","messages":[],"tools":[{"name":"Bash","input_schema":{}},{"name":"mcp__counter__count","input_schema":{}}]}`,
			`{"model":"m","messages":[],"tools":[{"name":"Bash","input_schema":{}}]}`, 0},
		{"codex MCP tools", resp,
			`{"model":"m","input":[],"tools":[{"type":"function","name":"exec_command"},{"type":"function","name":"mcp__jira__search"}]}`,
			`{"model":"m","input":[],"tools":[{"type":"function","name":"exec_command"}]}`, 0},
		{"another tool missing still differs", anth,
			`{"model":"m","messages":[],"tools":[{"name":"Bash","input_schema":{}},{"name":"counter_count","input_schema":{}}]}`,
			`{"model":"m","messages":[],"tools":[{"name":"Bash","input_schema":{}}]}`, gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL},
		{"tool wall time", resp,
			`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"exec_command","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"Chunk ID: ab12\nWall time: 0.0100 seconds\nok"}]}`,
			`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"exec_command","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"Chunk ID: cd34\nWall time: 0.9000 seconds\nok"}]}`, 0},
		{"tool time (took)", resp,
			`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"exec_command","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"ok, took 12ms"}]}`,
			`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"exec_command","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"ok, took 1.5s"}]}`, 0},
		{"tool output beside a wall time still compared", resp,
			`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"exec_command","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"Wall time: 0.0100 seconds\nok"}]}`,
			`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"exec_command","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"Wall time: 0.9000 seconds\nno"}]}`, gatewayv1.DivergenceKind_DIVERGENCE_KIND_TOOL},
		{"tool output printing the clock", anth,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"Tue Dec  1 08:00:00 UTC 2026"}]}]}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"Tue Dec  1 08:00:07 UTC 2026"}]}]}`, gatewayv1.DivergenceKind_DIVERGENCE_KIND_TOOL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := replay.CompareCanon(tc.p, canon, []byte(tc.taped), []byte(tc.incoming))
			if d.GetKind() != tc.want {
				t.Errorf("kind %v, want %v (%v)", d.GetKind(), tc.want, d)
			}
		})
	}
}

func TestCompareTree(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, taped, replayed string
		diverged              bool
	}{
		{"same", "4b825dc", "4b825dc", false},
		{"differs", "4b825dc", "9f3a2e1", true},
		{"not taped", "", "9f3a2e1", false},
		{"not taken", "4b825dc", "", false},
	}
	for _, tc := range tests {
		d := replay.CompareTree(tc.taped, tc.replayed)
		if (d != nil) != tc.diverged {
			t.Errorf("%s: %v", tc.name, d)
			continue
		}
		if d != nil && (d.GetKind() != gatewayv1.DivergenceKind_DIVERGENCE_KIND_TREE || d.GetExpected() != tc.taped || d.GetActual() != tc.replayed) {
			t.Errorf("%s: %v", tc.name, d)
		}
	}
}

// TestOutsideEffectAnsweredFromTape: the output of a tool with effects
// outside the sandbox (an MCP tool, WebFetch) is the tape's in a replay:
// another output is no divergence and the request sent on holds the
// tape's; any other tool's output is still compared.
func TestOutsideEffectAnsweredFromTape(t *testing.T) {
	t.Parallel()
	const (
		anth = gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES
		resp = gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES
		chat = gatewayv1.Provider_PROVIDER_OPENAI_CHAT_COMPLETIONS
	)
	anthBody := func(tool, result string) string {
		return `{"model":"m","messages":[{"role":"user","content":"go"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"` + tool + `","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"` + result + `"}]}]}`
	}
	respBody := func(tool, out string) string {
		return `{"model":"m","input":[{"type":"function_call","call_id":"c1","name":"` + tool + `","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"` + out + `"}]}`
	}
	chatBody := func(tool, out string) string {
		return `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"` + tool + `","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"` + out + `"}]}`
	}
	// piCodemode is a pi request whose codemode call ran script (its
	// arguments are JSON text: {"code": script}) and printed out.
	piCodemode := func(script, out string) string {
		return `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"codemode","arguments":"{\"code\":\"` + script + `\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"` + out + `"}]}`
	}
	tests := []struct {
		name            string
		p               gatewayv1.Provider
		taped, incoming string
		want            gatewayv1.DivergenceKind
		replaced        bool
	}{
		{"mcp tool", anth, anthBody("mcp__jira__create_issue", "JIRA-7 created"), anthBody("mcp__jira__create_issue", "MCP server jira not connected"), 0, true},
		{"mcp tool the replay's CLI does not have", anth, anthBody("mcp__counter__count", "counted-1"),
			strings.Replace(anthBody("mcp__counter__count", "<tool_use_error>Error: No such tool available: mcp__counter__count</tool_use_error>"), `"tool_use_id":"t1"`, `"tool_use_id":"t1","is_error":true`, 1), 0, true},
		{"web fetch", anth, anthBody("WebFetch", "page text"), anthBody("WebFetch", "getaddrinfo ENOTFOUND example.com"), 0, true},
		{"bash still compared", anth, anthBody("Bash", "ok"), anthBody("Bash", "changed"), gatewayv1.DivergenceKind_DIVERGENCE_KIND_TOOL, false},
		{"codex mcp tool", resp, respBody("mcp__slack__post", "posted"), respBody("mcp__slack__post", "error"), 0, true},
		{"codex shell still compared", resp, respBody("exec_command", "ok"), respBody("exec_command", "no"), gatewayv1.DivergenceKind_DIVERGENCE_KIND_TOOL, false},
		{"chat mcp tool", chat, chatBody("mcp__gh__comment", "done"), chatBody("mcp__gh__comment", "refused"), 0, true},
		// pi 1.6 (Chat Completions through the gateway): an MCP tool
		// declared to the model is mcp__<server>__<tool>; with the default
		// exposure it is called from a codemode script.
		{"pi mcp tool (direct)", chat, chatBody("mcp__counter__count", "counted-1"), chatBody("mcp__counter__count", "Tool mcp__counter__count not found"), 0, true},
		{"pi codemode script calling an MCP tool", chat,
			piCodemode(`return await tools.mcp__counter__count({})`, `Script completed\ncounted-1`),
			piCodemode(`return await tools.mcp__counter__count({})`, `Script failed\nScript error: fetch failed`), 0, true},
		{"pi codemode script without MCP still compared", chat,
			piCodemode(`return await tools.bash({command: 'date'})`, `Script completed\nMon`),
			piCodemode(`return await tools.bash({command: 'date'})`, `Script completed\nTue`), gatewayv1.DivergenceKind_DIVERGENCE_KIND_TOOL, false},
		{"codex mcp resource", resp, respBody("read_mcp_resource", "resource text"), respBody("read_mcp_resource", "server unreachable"), 0, true},
		{"pi mcp resource", chat, chatBody("list_mcp_resources", "res://a"), chatBody("list_mcp_resources", "no servers"), 0, true},
	}
	for _, tc := range tests {
		d := replay.Compare(tc.p, []byte(tc.taped), []byte(tc.incoming))
		if d.GetKind() != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, d, tc.want)
		}
		out, replaced := replay.AnswerFromTape(tc.p, []byte(tc.taped), []byte(tc.incoming))
		if replaced != tc.replaced {
			t.Errorf("%s: replaced %v, want %v", tc.name, replaced, tc.replaced)
		}
		if replaced && strings.Contains(string(out), "is_error") {
			t.Errorf("%s: the request sent on %s keeps the replay's is_error", tc.name, out)
		}
		for _, orig := range []string{"JIRA-7 created", "page text", "posted", "done", "counted-1", "resource text", "res://a"} {
			if replaced && strings.Contains(tc.taped, orig) && !strings.Contains(string(out), orig) {
				t.Errorf("%s: the request sent on %s does not hold the tape's output %q", tc.name, out, orig)
			}
		}
	}
}
