package dataplane

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/runs"
)

// protocolFor returns the wire protocol of a data-plane path.
func protocolFor(path string) gatewayv1.Provider {
	switch path {
	case "/v1/messages", "/v1/messages/count_tokens":
		return gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES
	case "/v1/responses":
		return gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES
	case "/v1/chat/completions":
		return gatewayv1.Provider_PROVIDER_OPENAI_CHAT_COMPLETIONS
	}
	return gatewayv1.Provider_PROVIDER_UNSPECIFIED
}

// Error types of each protocol.
const (
	errInvalid    = "invalid_request_error"
	errAuth       = "authentication_error"
	errPermission = "permission_error"
	errTooLarge   = "request_too_large"
	errAPI        = "api_error"
)

// errorBody is the provider's error shape for a non-streaming error.
func errorBody(p gatewayv1.Provider, typ, msg string) []byte {
	var v any
	if p == gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES || p == gatewayv1.Provider_PROVIDER_UNSPECIFIED {
		v = map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}}
	} else {
		code := any(nil)
		switch typ {
		case errAuth:
			typ, code = errInvalid, "invalid_api_key"
		case errPermission:
			code = "insufficient_quota"
		case errTooLarge:
			typ, code = errInvalid, "request_too_large"
		case errAPI:
			typ = "server_error"
		}
		v = map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}}
	}
	b, _ := json.Marshal(v)
	return b
}

func writeError(w http.ResponseWriter, p gatewayv1.Provider, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("x-should-retry", "false")
	w.WriteHeader(status)
	_, _ = w.Write(errorBody(p, typ, msg))
}

// errorEvent is the provider's error event for a failure mid-stream.
func errorEvent(p gatewayv1.Provider, msg string) (event, data string) {
	switch p {
	case gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES:
		b, _ := json.Marshal(map[string]any{"type": "response.failed", "response": map[string]any{
			"id": "resp_hangar_failed", "object": "response", "status": "failed", "output": []any{},
			"error": map[string]any{"code": "server_error", "message": msg}}})
		return "response.failed", string(b)
	case gatewayv1.Provider_PROVIDER_OPENAI_CHAT_COMPLETIONS:
		b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": "server_error", "param": nil, "code": nil}})
		return "", string(b)
	default:
		b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]any{"type": errAPI, "message": msg}})
		return "error", string(b)
	}
}

// usageOf accumulates a step's usage from its answer.
type usageOf struct {
	model string
	u     runs.StepUsage
	seen  bool
}

type anthropicUsage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
}

func (a *usageOf) anthropic(u *anthropicUsage) {
	if u == nil {
		return
	}
	a.seen = true
	if u.InputTokens > 0 {
		a.u.Input = u.InputTokens
	}
	if u.OutputTokens > a.u.Output {
		a.u.Output = u.OutputTokens
	}
	if u.CacheReadInputTokens > 0 {
		a.u.CacheRead = u.CacheReadInputTokens
	}
	if u.CacheCreationInputTokens > 0 {
		a.u.CacheWrite = u.CacheCreationInputTokens
	}
}

type openaiUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	OutputTokens       int64 `json:"output_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (a *usageOf) openai(u *openaiUsage) {
	if u == nil {
		return
	}
	a.seen = true
	in, cached := u.InputTokens+u.PromptTokens, u.InputTokensDetails.CachedTokens+u.PromptTokensDetails.CachedTokens
	a.u.Input = max(0, in-cached)
	a.u.CacheRead = cached
	a.u.Output = u.OutputTokens + u.CompletionTokens
}

// event reads the usage an SSE event carries.
func (a *usageOf) event(p gatewayv1.Provider, data string) {
	if len(data) == 0 || data[0] != '{' {
		return
	}
	switch p {
	case gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES:
		var e struct {
			Type    string `json:"type"`
			Message struct {
				Model string          `json:"model"`
				Usage *anthropicUsage `json:"usage"`
			} `json:"message"`
			Usage *anthropicUsage `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &e) != nil {
			return
		}
		switch e.Type {
		case "message_start":
			if e.Message.Model != "" {
				a.model = e.Message.Model
			}
			a.anthropic(e.Message.Usage)
		case "message_delta":
			a.anthropic(e.Usage)
		}
	case gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES:
		if !bytes.Contains([]byte(data), []byte(`"usage"`)) {
			return
		}
		var e struct {
			Response struct {
				Model string       `json:"model"`
				Usage *openaiUsage `json:"usage"`
			} `json:"response"`
		}
		if json.Unmarshal([]byte(data), &e) == nil && e.Response.Usage != nil {
			if e.Response.Model != "" {
				a.model = e.Response.Model
			}
			a.openai(e.Response.Usage)
		}
	case gatewayv1.Provider_PROVIDER_OPENAI_CHAT_COMPLETIONS:
		if !bytes.Contains([]byte(data), []byte(`"usage"`)) {
			return
		}
		var e struct {
			Model string       `json:"model"`
			Usage *openaiUsage `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &e) == nil && e.Usage != nil {
			a.model = e.Model
			a.openai(e.Usage)
		}
	}
}

// body reads the usage of a non-streaming answer.
func (a *usageOf) body(p gatewayv1.Provider, b []byte) {
	var e struct {
		Model string          `json:"model"`
		Usage json.RawMessage `json:"usage"`
	}
	if json.Unmarshal(b, &e) != nil || len(e.Usage) == 0 {
		return
	}
	if e.Model != "" {
		a.model = e.Model
	}
	if p == gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES {
		var u anthropicUsage
		if json.Unmarshal(e.Usage, &u) == nil {
			a.anthropic(&u)
		}
		return
	}
	var u openaiUsage
	if json.Unmarshal(e.Usage, &u) == nil {
		a.openai(&u)
	}
}

// injectSteering adds msgs as user text at the end of the request's input.
func injectSteering(p gatewayv1.Provider, body []byte, msgs []string) ([]byte, error) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	text := msgs[0]
	for _, m := range msgs[1:] {
		text += "\n\n" + m
	}
	switch p {
	case gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES:
		var messages []map[string]json.RawMessage
		if err := json.Unmarshal(req["messages"], &messages); err != nil {
			return nil, fmt.Errorf("messages: %w", err)
		}
		block := map[string]any{"type": "text", "text": text}
		last := len(messages) - 1
		if last >= 0 && string(messages[last]["role"]) == `"user"` {
			var blocks []any
			var s string
			if json.Unmarshal(messages[last]["content"], &s) == nil {
				blocks = []any{map[string]any{"type": "text", "text": s}}
			} else if err := json.Unmarshal(messages[last]["content"], &blocks); err != nil {
				return nil, fmt.Errorf("content: %w", err)
			}
			blocks = append(blocks, block)
			messages[last]["content"], _ = json.Marshal(blocks)
		} else {
			c, _ := json.Marshal([]any{block})
			messages = append(messages, map[string]json.RawMessage{"role": json.RawMessage(`"user"`), "content": c})
		}
		req["messages"], _ = json.Marshal(messages)
	case gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES:
		var items []any
		var s string
		if json.Unmarshal(req["input"], &s) == nil {
			items = []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": s}}}}
		} else if err := json.Unmarshal(req["input"], &items); err != nil {
			return nil, fmt.Errorf("input: %w", err)
		}
		items = append(items, map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": text}}})
		req["input"], _ = json.Marshal(items)
	case gatewayv1.Provider_PROVIDER_OPENAI_CHAT_COMPLETIONS:
		var messages []any
		if err := json.Unmarshal(req["messages"], &messages); err != nil {
			return nil, fmt.Errorf("messages: %w", err)
		}
		messages = append(messages, map[string]any{"role": "user", "content": text})
		req["messages"], _ = json.Marshal(messages)
	}
	return json.Marshal(req)
}

// applyCacheTTL sets the TTL of an Anthropic request's cache_control
// breakpoints: "5m" or "1h" sets it on every breakpoint (and adds one on the
// last system block when there is none), "off" removes them, "auto" or ""
// leaves the request as the harness sent it.
func applyCacheTTL(body []byte, ttl string) ([]byte, error) {
	if ttl == "" || ttl == "auto" {
		return body, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var req map[string]any
	if err := dec.Decode(&req); err != nil {
		return nil, err
	}
	found := false
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if cc, ok := x["cache_control"].(map[string]any); ok {
				found = true
				if ttl == "off" {
					delete(x, "cache_control")
				} else {
					cc["ttl"] = ttl
				}
			}
			for k, c := range x {
				if k != "cache_control" {
					walk(c)
				}
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(req)
	if !found && ttl != "off" {
		if sys, ok := req["system"].([]any); ok && len(sys) > 0 {
			if blk, ok := sys[len(sys)-1].(map[string]any); ok {
				blk["cache_control"] = map[string]any{"type": "ephemeral", "ttl": ttl}
			}
		} else if s, ok := req["system"].(string); ok && s != "" {
			req["system"] = []any{map[string]any{"type": "text", "text": s, "cache_control": map[string]any{"type": "ephemeral", "ttl": ttl}}}
		}
	}
	return json.Marshal(req)
}

// modelOf returns the request's model name.
func modelOf(body []byte) string {
	var m struct {
		Model string `json:"model"`
	}
	// One scan: the body was validated already (json.Unmarshal would
	// validate it again first).
	_ = json.NewDecoder(bytes.NewReader(body)).Decode(&m)
	return m.Model
}
