package dataplane

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Tape headers of a held answer (StepResponse.headers): the contract's Step
// has one response, which is what the harness got; what upstream sent when
// it differs (a denial) and the decisions are kept beside it.
const (
	// HeaderUpstreamAnswer holds the upstream's own answer (a StepResponse
	// in protojson) when the harness got a denial instead.
	HeaderUpstreamAnswer = "x-hangar-upstream-answer"
	// HeaderToolCalls holds the held tool calls with their decisions (JSON).
	HeaderToolCalls = "x-hangar-tool-calls"
)

// forwardHeld is forward for a run with approvals: the upstream answer is
// read whole before the harness sees any of it; an answer with tool calls
// is held until each call is allowed or denied. All allowed: the answer goes
// out as upstream sent it. Any denied: the harness gets a text-only answer
// (stop reason end_turn) saying which calls were denied.
func (h *Handler) forwardHeld(w http.ResponseWriter, r *http.Request, c *call, body []byte, leader func()) {
	ctx := r.Context()
	if leader != nil {
		defer leader()
	}
	resp := h.send(w, r, c, body)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	raw, rerr := io.ReadAll(io.LimitReader(resp.Body, h.o.MaxBodyBytes))
	sr := &gatewayv1.StepResponse{Status: int32(resp.StatusCode), Headers: map[string]string{}}
	c.step.Response = sr
	for _, k := range []string{"content-type", "request-id", "x-request-id"} {
		if v := resp.Header.Get(k); v != "" {
			sr.Headers[k] = v
		}
	}
	stream := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	if stream {
		sr.Events = parseEvents(raw, h.o.Now().Sub(c.start).Milliseconds())
		for _, ev := range sr.Events {
			c.usage.event(c.p, ev.GetData())
		}
	} else {
		sr.Body = raw
		if resp.StatusCode == http.StatusOK {
			c.usage.body(c.p, raw)
		}
	}
	switch {
	case rerr != nil:
		c.failure = "upstream body: " + rerr.Error()
	case resp.StatusCode != http.StatusOK:
		c.failure = fmt.Sprintf("upstream status %d", resp.StatusCode)
	case stream && !terminated(c.p, sr.Events):
		c.failure = "upstream stream ended without its final event"
	}
	if leader != nil {
		leader()
		leader = nil
	}
	var calls []*gatewayv1.ToolCall
	if c.failure == "" {
		calls = toolCalls(c.p, sr)
	}
	passThrough := func() {
		h.finish(c)
		copyHeaders(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(raw)
	}
	if len(calls) == 0 {
		passThrough()
		return
	}

	now := timestamppb.New(h.o.Now())
	for i, tc := range calls {
		if tc.Id == "" {
			tc.Id = fmt.Sprintf("call-%d-%d", c.step.Seq, i+1)
		}
		tc.Seq, tc.State, tc.RequestedAt = c.step.Seq, gatewayv1.ToolCallState_TOOL_CALL_STATE_PENDING, now
	}
	if err := h.o.Runs.HoldToolCalls(ctx, c.run.GetId(), calls); err != nil {
		h.o.Logger.LogAttrs(ctx, slog.LevelError, "tool calls not held", slog.String("run", c.run.GetId()), slog.Any("error", err))
		c.failure = "tool calls could not be held for approval"
		writeError(w, c.p, http.StatusServiceUnavailable, errAPI, "hangar gateway: run store unavailable")
		return
	}
	h.o.Logger.LogAttrs(ctx, slog.LevelInfo, "tool calls held for approval", slog.String("run", c.run.GetId()), slog.Int("seq", int(c.step.Seq)), slog.Int("calls", len(calls)))
	rc := http.NewResponseController(w)
	if stream {
		// Headers now, and an SSE comment at each keepalive, so the harness's
		// idle timeout does not fire while a person decides.
		copyHeaders(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		_ = rc.Flush()
	}
	decided, err := h.awaitDecisions(r, c, calls, func() {
		if stream {
			if _, err := io.WriteString(w, ": hangar: waiting for a tool call approval\n\n"); err == nil {
				_ = rc.Flush()
			}
		}
	})
	if err != nil {
		c.failure = "held for approval: " + err.Error()
		h.finish(c)
		return
	}
	summary, _ := json.Marshal(decisionSummary(decided))
	var denied []*gatewayv1.ToolCall
	for _, tc := range decided {
		if tc.GetState() == gatewayv1.ToolCallState_TOOL_CALL_STATE_DENIED {
			denied = append(denied, tc)
		}
	}
	if len(denied) == 0 {
		sr.Headers[HeaderToolCalls] = string(summary)
		h.finish(c)
		if !stream {
			copyHeaders(w.Header(), resp.Header)
			w.WriteHeader(resp.StatusCode)
		}
		_, _ = w.Write(raw)
		return
	}
	upstreamJSON, _ := protojson.Marshal(sr)
	text := denialText(denied, len(decided))
	model := c.usage.model
	if model == "" {
		model = c.step.Model
	}
	got := denialAnswer(c.p, stream, model, text, h.o.Now().Sub(c.start).Milliseconds())
	got.Headers[HeaderUpstreamAnswer] = string(upstreamJSON)
	got.Headers[HeaderToolCalls] = string(summary)
	c.step.Response = got
	h.finish(c)
	if stream {
		_, _ = w.Write(encodeEvents(got.Events))
		_ = rc.Flush()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(got.Body)
}

// awaitDecisions blocks until every call is allowed or denied, calling
// keepalive each HoldKeepalive while none arrives. It returns the calls with
// their states, or the context's error.
func (h *Handler) awaitDecisions(r *http.Request, c *call, calls []*gatewayv1.ToolCall, keepalive func()) ([]*gatewayv1.ToolCall, error) {
	ctx := r.Context()
	want := map[string]bool{}
	for _, tc := range calls {
		want[tc.GetId()] = true
	}
	for {
		all, err := h.o.Runs.ToolCalls(ctx, c.run.GetId())
		if err != nil && ctx.Err() == nil {
			return nil, err
		}
		var mine []*gatewayv1.ToolCall
		pending := false
		for _, tc := range all {
			if want[tc.GetId()] && tc.GetSeq() == c.step.Seq {
				mine = append(mine, tc)
				pending = pending || tc.GetState() == gatewayv1.ToolCallState_TOOL_CALL_STATE_PENDING
			}
		}
		if err == nil && !pending && len(mine) == len(calls) {
			return mine, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("the client went away: %w", ctx.Err())
		}
		woke, err := h.o.Runs.WaitToolCallAnswer(ctx, c.run.GetId(), c.step.Seq, h.o.HoldKeepalive)
		if err != nil && ctx.Err() == nil {
			h.o.Logger.LogAttrs(ctx, slog.LevelWarn, "tool call wait failed", slog.String("run", c.run.GetId()), slog.Any("error", err))
		}
		if !woke {
			keepalive()
		}
	}
}

func decisionSummary(calls []*gatewayv1.ToolCall) []map[string]string {
	out := make([]map[string]string, 0, len(calls))
	for _, tc := range calls {
		out = append(out, map[string]string{"id": tc.GetId(), "tool": tc.GetToolName(),
			"state": strings.ToLower(strings.TrimPrefix(tc.GetState().String(), "TOOL_CALL_STATE_"))})
	}
	return out
}

func denialText(denied []*gatewayv1.ToolCall, total int) string {
	var names []string
	for _, tc := range denied {
		names = append(names, fmt.Sprintf("%s (%s)", tc.GetToolName(), tc.GetId()))
	}
	text := "The tool call " + strings.Join(names, ", ") + " was denied by the user, so it did not run."
	if len(denied) > 1 {
		text = "The tool calls " + strings.Join(names, ", ") + " were denied by the user, so they did not run."
	}
	if total > len(denied) {
		text += " The other tool calls of the same answer did not run either."
	}
	return text + " Stopping here; send a new message to continue."
}

// parseEvents splits a whole SSE body into events.
func parseEvents(raw []byte, offsetMs int64) []*gatewayv1.SseEvent {
	var out []*gatewayv1.SseEvent
	var name string
	var data []string
	flush := func() {
		if name != "" || len(data) > 0 {
			out = append(out, &gatewayv1.SseEvent{Event: name, Data: strings.Join(data, "\n"), OffsetMs: offsetMs})
		}
		name, data = "", nil
	}
	for _, line := range strings.Split(strings.ReplaceAll(string(raw), "\r\n", "\n"), "\n") {
		switch {
		case line == "":
			flush()
		case strings.HasPrefix(line, "event:"):
			name = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	flush()
	return out
}

// encodeEvents writes events in SSE form.
func encodeEvents(evs []*gatewayv1.SseEvent) []byte {
	var b bytes.Buffer
	for _, ev := range evs {
		if ev.GetEvent() != "" {
			b.WriteString("event: " + ev.GetEvent() + "\n")
		}
		for _, line := range strings.Split(ev.GetData(), "\n") {
			b.WriteString("data: " + line + "\n")
		}
		b.WriteString("\n")
	}
	return b.Bytes()
}

// toolCalls returns the tool calls an answer carries.
func toolCalls(p gatewayv1.Provider, sr *gatewayv1.StepResponse) []*gatewayv1.ToolCall {
	var out []*gatewayv1.ToolCall
	add := func(id, name, input string) {
		if strings.TrimSpace(input) == "" {
			input = "{}"
		}
		out = append(out, &gatewayv1.ToolCall{Id: id, ToolName: name, InputJson: input})
	}
	if len(sr.GetEvents()) == 0 {
		switch p {
		case gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES:
			var m struct {
				Content []struct {
					Type  string          `json:"type"`
					ID    string          `json:"id"`
					Name  string          `json:"name"`
					Input json.RawMessage `json:"input"`
				} `json:"content"`
			}
			_ = json.Unmarshal(sr.GetBody(), &m)
			for _, b := range m.Content {
				if b.Type == "tool_use" {
					add(b.ID, b.Name, string(b.Input))
				}
			}
		case gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES:
			var m struct {
				Output []responsesItem `json:"output"`
			}
			_ = json.Unmarshal(sr.GetBody(), &m)
			for _, it := range m.Output {
				if it.isCall() {
					add(it.CallID, it.Name, it.Arguments)
				}
			}
		case gatewayv1.Provider_PROVIDER_OPENAI_CHAT_COMPLETIONS:
			var m struct {
				Choices []struct {
					Message struct {
						ToolCalls []chatToolCall `json:"tool_calls"`
					} `json:"message"`
				} `json:"choices"`
			}
			_ = json.Unmarshal(sr.GetBody(), &m)
			for _, ch := range m.Choices {
				for _, tc := range ch.Message.ToolCalls {
					add(tc.ID, tc.Function.Name, tc.Function.Arguments)
				}
			}
		}
		return out
	}
	switch p {
	case gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES:
		type block struct {
			id, name string
			input    strings.Builder
		}
		var blocks []*block
		byIndex := map[int]*block{}
		for _, ev := range sr.GetEvents() {
			var e struct {
				Type         string `json:"type"`
				Index        int    `json:"index"`
				ContentBlock struct {
					Type string `json:"type"`
					ID   string `json:"id"`
					Name string `json:"name"`
				} `json:"content_block"`
				Delta struct {
					Type        string `json:"type"`
					PartialJSON string `json:"partial_json"`
				} `json:"delta"`
			}
			if json.Unmarshal([]byte(ev.GetData()), &e) != nil {
				continue
			}
			switch {
			case e.Type == "content_block_start" && e.ContentBlock.Type == "tool_use":
				b := &block{id: e.ContentBlock.ID, name: e.ContentBlock.Name}
				blocks = append(blocks, b)
				byIndex[e.Index] = b
			case e.Type == "content_block_delta" && e.Delta.Type == "input_json_delta":
				if b := byIndex[e.Index]; b != nil {
					b.input.WriteString(e.Delta.PartialJSON)
				}
			}
		}
		for _, b := range blocks {
			add(b.id, b.name, b.input.String())
		}
	case gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES:
		for _, ev := range sr.GetEvents() {
			var e struct {
				Type string        `json:"type"`
				Item responsesItem `json:"item"`
			}
			if json.Unmarshal([]byte(ev.GetData()), &e) == nil && e.Type == "response.output_item.done" && e.Item.isCall() {
				add(e.Item.CallID, e.Item.Name, e.Item.Arguments)
			}
		}
	case gatewayv1.Provider_PROVIDER_OPENAI_CHAT_COMPLETIONS:
		type acc struct {
			id, name string
			args     strings.Builder
		}
		var order []*acc
		byIndex := map[int]*acc{}
		for _, ev := range sr.GetEvents() {
			var e struct {
				Choices []struct {
					Delta struct {
						ToolCalls []chatToolCall `json:"tool_calls"`
					} `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(ev.GetData()), &e) != nil {
				continue
			}
			for _, ch := range e.Choices {
				for _, tc := range ch.Delta.ToolCalls {
					a := byIndex[tc.Index]
					if a == nil {
						a = &acc{}
						byIndex[tc.Index] = a
						order = append(order, a)
					}
					if tc.ID != "" {
						a.id = tc.ID
					}
					if tc.Function.Name != "" {
						a.name = tc.Function.Name
					}
					a.args.WriteString(tc.Function.Arguments)
				}
			}
		}
		for _, a := range order {
			add(a.id, a.name, a.args.String())
		}
	}
	return out
}

type responsesItem struct {
	Type      string `json:"type"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Input     string `json:"input"`
}

func (it *responsesItem) isCall() bool {
	switch it.Type {
	case "function_call":
		return true
	case "custom_tool_call":
		it.Arguments = it.Input
		return true
	}
	return false
}

type chatToolCall struct {
	Index    int    `json:"index"`
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// denialAnswer is a text-only answer in the provider's shape, ending the
// turn (Anthropic stop_reason end_turn, Responses completed, Chat stop).
func denialAnswer(p gatewayv1.Provider, stream bool, model, text string, offsetMs int64) *gatewayv1.StepResponse {
	sr := &gatewayv1.StepResponse{Status: http.StatusOK, Headers: map[string]string{}}
	id := "hangar_denied_" + randomHex(8)
	ev := func(name string, v any) {
		b, _ := json.Marshal(v)
		sr.Events = append(sr.Events, &gatewayv1.SseEvent{Event: name, Data: string(b), OffsetMs: offsetMs})
	}
	switch p {
	case gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES:
		usage := map[string]any{"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
		if !stream {
			sr.Body, _ = json.Marshal(map[string]any{"id": "msg_" + id, "type": "message", "role": "assistant", "model": model,
				"content": []any{map[string]any{"type": "text", "text": text}}, "stop_reason": "end_turn", "stop_sequence": nil, "usage": usage})
			break
		}
		ev("message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": "msg_" + id, "type": "message",
			"role": "assistant", "model": model, "content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": usage}})
		ev("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
		ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": text}})
		ev("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
		ev("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil},
			"usage": map[string]any{"output_tokens": 0}})
		ev("message_stop", map[string]any{"type": "message_stop"})
	case gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES:
		item := map[string]any{"type": "message", "id": "msg_" + id, "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}
		usage := map[string]any{"input_tokens": 0, "input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens": 0,
			"output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": 0}
		respObj := func(status string, output []any, u any) map[string]any {
			return map[string]any{"id": "resp_" + id, "object": "response", "status": status, "model": model, "output": output, "usage": u}
		}
		if !stream {
			sr.Body, _ = json.Marshal(respObj("completed", []any{item}, usage))
			break
		}
		ev("response.created", map[string]any{"type": "response.created", "sequence_number": 0, "response": respObj("in_progress", []any{}, nil)})
		ev("response.output_item.added", map[string]any{"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
			"item": map[string]any{"type": "message", "id": "msg_" + id, "role": "assistant", "status": "in_progress", "content": []any{}}})
		ev("response.output_text.delta", map[string]any{"type": "response.output_text.delta", "sequence_number": 2, "item_id": "msg_" + id,
			"output_index": 0, "content_index": 0, "delta": text})
		ev("response.output_item.done", map[string]any{"type": "response.output_item.done", "sequence_number": 3, "output_index": 0, "item": item})
		ev("response.completed", map[string]any{"type": "response.completed", "sequence_number": 4, "response": respObj("completed", []any{item}, usage)})
	default:
		if !stream {
			sr.Body, _ = json.Marshal(map[string]any{"id": "chatcmpl-" + id, "object": "chat.completion", "model": model,
				"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text}, "finish_reason": "stop"}},
				"usage":   map[string]any{"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})
			break
		}
		chunk := func(delta map[string]any, finish any) map[string]any {
			return map[string]any{"id": "chatcmpl-" + id, "object": "chat.completion.chunk", "model": model,
				"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
		}
		ev("", chunk(map[string]any{"role": "assistant", "content": text}, nil))
		ev("", chunk(map[string]any{}, "stop"))
		sr.Events = append(sr.Events, &gatewayv1.SseEvent{Data: "[DONE]", OffsetMs: offsetMs})
	}
	if !stream {
		sr.Headers["content-type"] = "application/json"
	} else {
		sr.Headers["content-type"] = "text/event-stream"
	}
	return sr
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
