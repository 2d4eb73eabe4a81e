package replay

import (
	"encoding/json"
	"strings"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
)

// OutsideEffect reports whether a tool call has effects outside the
// sandbox, so that a replay answers it from the tape: MCP tools
// ("mcp__<server>__<tool>": Claude Code, Codex, and pi 1.6, whose MCP
// tools declared to the model, "direct" or loaded by tool_search, are
// named so too), the MCP resource tools Codex and pi offer
// (list_mcp_resources, list_mcp_resource_templates, read_mcp_resource:
// they read the servers), and client-side web access (Claude Code's
// WebFetch; WebSearch and Codex's web_search run at the provider, inside
// the taped answer, and never reach the sandbox). pi's codemode tool is
// one when its script calls an MCP tool (OutsideCall).
func OutsideEffect(tool string) bool {
	return strings.HasPrefix(tool, "mcp__") || mcpResourceTools[tool] ||
		tool == "WebFetch" || tool == "WebSearch" || tool == "web_search" || tool == "web_fetch"
}

// mcpResourceTools read an MCP server's resources (Codex; pi's built-in
// MCP offers Codex's names).
var mcpResourceTools = map[string]bool{"list_mcp_resources": true, "list_mcp_resource_templates": true, "read_mcp_resource": true}

// piCodemode is pi's codemode tool: the model sends a script that calls
// other tools; MCP tools of servers with the default exposure
// ("codemode") are reachable only from such scripts, as
// tools.mcp__<server>__<tool>(...).
const piCodemode = "codemode"

// OutsideCall reports whether a call of tool with input (its arguments:
// decoded JSON or the JSON text) has effects outside the sandbox: the
// tool has (OutsideEffect), or it is a codemode script that names an MCP
// tool. Such a script may do local work too; the tape's output stands
// for the whole script, and what its local part left is still checked
// as the replay's work tree.
func OutsideCall(tool string, input any) bool {
	return OutsideEffect(tool) || tool == piCodemode && namesMCPTool(input)
}

// namesMCPTool reports whether a string in v names an MCP tool.
func namesMCPTool(v any) bool {
	switch x := v.(type) {
	case string:
		return strings.Contains(x, "mcp__")
	case map[string]any:
		for _, e := range x {
			if namesMCPTool(e) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if namesMCPTool(e) {
				return true
			}
		}
	}
	return false
}

// answerFromTape replaces, in the decoded incoming request, the output of
// every call of a tool with outside effects (OutsideEffect) with the
// output the taped request holds for the same call id: in a replay such a
// call runs in a sandbox that reaches nothing (egress none, no MCP
// credentials), and what the model is shown, and what is compared, is the
// original's output. It reports whether it replaced anything.
func answerFromTape(provider gatewayv1.Provider, taped, incoming any) bool {
	ids := outsideCalls(provider, taped)
	if len(ids) == 0 {
		return false
	}
	want := toolOutputs(provider, taped, ids)
	changed := false
	for id, slot := range toolOutputs(provider, incoming, ids) {
		if orig, ok := want[id]; ok {
			slot.copyFrom(orig)
			changed = true
		}
	}
	return changed
}

// outsideCalls are the call ids of the tool calls with outside effects in
// a request's conversation.
func outsideCalls(provider gatewayv1.Provider, req any) map[string]bool {
	ids := map[string]bool{}
	m, _ := req.(map[string]any)
	switch provider {
	case gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES:
		for _, msg := range asSlice(m["messages"]) {
			for _, blk := range asSlice(asMap(msg)["content"]) {
				b := asMap(blk)
				if str(b, "type") == "tool_use" && OutsideCall(str(b, "name"), b["input"]) {
					ids[str(b, "id")] = true
				}
			}
		}
	case gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES:
		for _, it := range asSlice(m["input"]) {
			i := asMap(it)
			if (str(i, "type") == "function_call" || str(i, "type") == "custom_tool_call") && OutsideCall(str(i, "name"), i["arguments"]) {
				ids[str(i, "call_id")] = true
			}
		}
	case gatewayv1.Provider_PROVIDER_OPENAI_CHAT_COMPLETIONS:
		for _, msg := range asSlice(m["messages"]) {
			for _, tc := range asSlice(asMap(msg)["tool_calls"]) {
				c := asMap(tc)
				if f := asMap(c["function"]); OutsideCall(str(f, "name"), f["arguments"]) {
					ids[str(c, "id")] = true
				}
			}
		}
	}
	delete(ids, "")
	return ids
}

// slot is where one tool output sits in a decoded request: the fields of
// its block that hold the output (for Anthropic the content and is_error:
// a replay's failed call is an error, the taped one was not).
type slot struct {
	m    map[string]any
	keys []string
}

// copyFrom sets s's output fields to o's (a field o lacks is removed).
func (s slot) copyFrom(o slot) {
	for _, k := range s.keys {
		if v, ok := o.m[k]; ok {
			s.m[k] = v
		} else {
			delete(s.m, k)
		}
	}
}

// toolOutputs are the outputs of the calls ids in a request, by call id.
func toolOutputs(provider gatewayv1.Provider, req any, ids map[string]bool) map[string]slot {
	out := map[string]slot{}
	m, _ := req.(map[string]any)
	switch provider {
	case gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES:
		for _, msg := range asSlice(m["messages"]) {
			for _, blk := range asSlice(asMap(msg)["content"]) {
				b := asMap(blk)
				if str(b, "type") == "tool_result" && ids[str(b, "tool_use_id")] {
					out[str(b, "tool_use_id")] = slot{b, []string{"content", "is_error"}}
				}
			}
		}
	case gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES:
		for _, it := range asSlice(m["input"]) {
			i := asMap(it)
			if strings.HasSuffix(str(i, "type"), "_output") && ids[str(i, "call_id")] {
				out[str(i, "call_id")] = slot{i, []string{"output"}}
			}
		}
	case gatewayv1.Provider_PROVIDER_OPENAI_CHAT_COMPLETIONS:
		for _, msg := range asSlice(m["messages"]) {
			mm := asMap(msg)
			if str(mm, "role") == "tool" && ids[str(mm, "tool_call_id")] {
				out[str(mm, "tool_call_id")] = slot{mm, []string{"content"}}
			}
		}
	}
	return out
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	if m == nil {
		return map[string]any{}
	}
	return m
}

func str(m map[string]any, k string) string { s, _ := m[k].(string); return s }

// AnswerFromTape is answerFromTape on request bodies: incoming with the
// outputs of its calls with outside effects replaced by taped's, and
// whether anything was replaced (incoming is returned as is otherwise).
func AnswerFromTape(provider gatewayv1.Provider, taped, incoming []byte) ([]byte, bool) {
	var a, b any
	if decode(taped, &a) != nil || decode(incoming, &b) != nil || !answerFromTape(provider, a, b) {
		return incoming, false
	}
	out, err := json.Marshal(b)
	if err != nil {
		return incoming, false
	}
	return out, true
}
