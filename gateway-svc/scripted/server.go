package scripted

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Server is the scripted model server; it is an http.Handler.
type Server struct {
	mu     sync.RWMutex
	script Script

	requests atomic.Int64
	logMu    sync.Mutex
	log      []Logged
}

// Logged is one model request the server answered.
type Logged struct {
	Path string
	Rule string
	Request
}

// New returns a server answering from script. It compiles the script's
// regexps; a script built in Go with a bad regexp returns an error.
func New(script Script) (*Server, error) {
	if err := script.compile(); err != nil {
		return nil, err
	}
	return &Server{script: script}, nil
}

// MustNew is New that panics on a bad script, for tests.
func MustNew(script Script) *Server {
	s, err := New(script)
	if err != nil {
		panic(err)
	}
	return s
}

// SetScript replaces the script.
func (s *Server) SetScript(script Script) error {
	if err := script.compile(); err != nil {
		return err
	}
	s.mu.Lock()
	s.script = script
	s.mu.Unlock()
	return nil
}

// Requests is the number of model requests (POSTs to a model endpoint)
// received so far, answered or not.
func (s *Server) Requests() int64 { return s.requests.Load() }

// Log returns the model requests answered so far, in order.
func (s *Server) Log() []Logged {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	return append([]Logged(nil), s.log...)
}

// ServeHTTP answers POST /v1/messages (Anthropic; ?beta=true accepted),
// POST /v1/messages/count_tokens, POST /v1/responses, POST
// /v1/chat/completions and HEAD / (200). A base path before /v1 is ignored.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if i := strings.Index(path, "/v1/"); i >= 0 {
		path = path[i:]
	}
	if r.Method == http.MethodHead || (r.Method == http.MethodGet && (path == "/" || path == "")) {
		w.WriteHeader(http.StatusOK)
		return
	}
	if r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	var proto string
	var extract func([]byte) (Request, bool, error)
	switch path {
	case "/v1/messages":
		proto, extract = protoMessages, extractAnthropic
	case "/v1/messages/count_tokens":
		body, _ := io.ReadAll(r.Body)
		writeJSON(w, http.StatusOK, map[string]any{"input_tokens": max(1, len(body)/4)})
		return
	case "/v1/responses":
		proto, extract = protoResponses, extractResponses
	case "/v1/chat/completions":
		proto, extract = protoChat, extractChat
	default:
		http.NotFound(w, r)
		return
	}
	s.requests.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	req, stream, err := extract(body)
	if err != nil {
		writeError(w, proto, http.StatusBadRequest, "invalid_request_error", "scripted: malformed JSON body: "+err.Error())
		return
	}
	s.mu.RLock()
	ans, rule := s.script.Decide(req)
	served := s.script.Serves[req.Model]
	s.mu.RUnlock()
	ans = ans.expand(req)
	s.logMu.Lock()
	s.log = append(s.log, Logged{Path: path, Rule: rule, Request: req})
	s.logMu.Unlock()

	if ans.Error != nil {
		typ := ans.Error.Type
		if typ == "" {
			typ = "api_error"
		}
		writeError(w, proto, ans.Error.Status, typ, ans.Error.Message)
		return
	}
	usage := Usage{InputTokens: int64(max(1, req.Size/4)), OutputTokens: int64(max(1, answerSize(ans)/4))}
	if ans.Usage != nil {
		usage = *ans.Usage
	}
	model := req.Model
	if served != "" {
		model = served
	}
	if model == "" {
		model = "scripted"
	}
	a := answerer{ans: ans, usage: usage, model: model}
	if !stream {
		a.writeJSON(w, proto)
		return
	}
	sw := newSSE(w, ans.ResetAfterEvents)
	switch proto {
	case protoMessages:
		a.streamMessages(sw)
	case protoResponses:
		a.streamResponses(sw)
	case protoChat:
		a.streamChat(sw)
	}
}

func answerSize(a Answer) int {
	n := len(a.Text)
	if a.ToolCall != nil {
		b, _ := json.Marshal(a.ToolCall.Input)
		n += len(a.ToolCall.Name) + len(b)
	}
	return n
}

func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, proto string, status int, typ, msg string) {
	if status == 0 {
		status = http.StatusInternalServerError
	}
	if proto == protoMessages {
		writeJSON(w, status, map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}})
		return
	}
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": nil}})
}

// sse writes server-sent events, flushing each one, and can cut the
// connection after a number of events.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	resetAt int
	n       int
	dead    bool
}

func newSSE(w http.ResponseWriter, resetAt int) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &sse{w: w, rc: http.NewResponseController(w), resetAt: resetAt}
}

func (s *sse) event(name string, v any) {
	if s.dead {
		return
	}
	if s.resetAt > 0 && s.n >= s.resetAt {
		s.dead = true
		// Abort the connection without ending the chunked body: the client
		// sees an unexpected EOF, as with a reset upstream.
		_ = s.rc.Flush()
		panic(http.ErrAbortHandler)
	}
	var data []byte
	switch d := v.(type) {
	case string:
		data = []byte(d)
	default:
		data, _ = json.Marshal(v)
	}
	if name != "" {
		fmt.Fprintf(s.w, "event: %s\n", name)
	}
	fmt.Fprintf(s.w, "data: %s\n\n", data)
	_ = s.rc.Flush()
	s.n++
}

type answerer struct {
	ans   Answer
	usage Usage
	model string
}

func (a answerer) chunks() []string {
	n := a.ans.Chunks
	text := a.ans.Text
	if n <= 1 || len(text) < n {
		return []string{text}
	}
	var out []string
	size := (len(text) + n - 1) / n
	for len(text) > 0 {
		k := min(size, len(text))
		out = append(out, text[:k])
		text = text[k:]
	}
	return out
}

func (a answerer) inputJSON() string {
	if a.ans.ToolCall == nil {
		return "{}"
	}
	in := a.ans.ToolCall.Input
	if in == nil {
		in = map[string]any{}
	}
	b, _ := json.Marshal(in)
	return string(b)
}

func (a answerer) anthropicUsage() map[string]any {
	return map[string]any{
		"input_tokens":                a.usage.InputTokens,
		"output_tokens":               a.usage.OutputTokens,
		"cache_read_input_tokens":     a.usage.CacheReadTokens,
		"cache_creation_input_tokens": a.usage.CacheWriteTokens,
	}
}

func (a answerer) stopReason() string {
	if a.ans.ToolCall != nil {
		return "tool_use"
	}
	return "end_turn"
}

func (a answerer) streamMessages(s *sse) {
	id := newID("msg_")
	start := a.anthropicUsage()
	start["output_tokens"] = 1
	s.event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": id, "type": "message", "role": "assistant", "model": a.model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": start,
	}})
	idx := 0
	if a.ans.Text != "" || a.ans.ToolCall == nil {
		s.event("content_block_start", map[string]any{"type": "content_block_start", "index": idx,
			"content_block": map[string]any{"type": "text", "text": ""}})
		for _, c := range a.chunks() {
			s.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": idx,
				"delta": map[string]any{"type": "text_delta", "text": c}})
		}
		s.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": idx})
		idx++
	}
	if tc := a.ans.ToolCall; tc != nil {
		s.event("content_block_start", map[string]any{"type": "content_block_start", "index": idx,
			"content_block": map[string]any{"type": "tool_use", "id": newID("toolu_"), "name": tc.Name, "input": map[string]any{}}})
		s.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": idx,
			"delta": map[string]any{"type": "input_json_delta", "partial_json": a.inputJSON()}})
		s.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": idx})
	}
	s.event("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": a.stopReason(), "stop_sequence": nil},
		"usage": a.anthropicUsage()})
	s.event("message_stop", map[string]any{"type": "message_stop"})
}

func (a answerer) responsesOutput() []map[string]any {
	var out []map[string]any
	if a.ans.Text != "" || a.ans.ToolCall == nil {
		out = append(out, map[string]any{"type": "message", "id": newID("msg_"), "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": a.ans.Text, "annotations": []any{}}}})
	}
	if tc := a.ans.ToolCall; tc != nil {
		out = append(out, map[string]any{"type": "function_call", "id": newID("fc_"), "call_id": newID("call_"),
			"name": tc.Name, "arguments": a.inputJSON(), "status": "completed"})
	}
	return out
}

func (a answerer) responsesUsage() map[string]any {
	return map[string]any{
		"input_tokens":          a.usage.InputTokens + a.usage.CacheReadTokens,
		"input_tokens_details":  map[string]any{"cached_tokens": a.usage.CacheReadTokens},
		"output_tokens":         a.usage.OutputTokens,
		"output_tokens_details": map[string]any{"reasoning_tokens": 0},
		"total_tokens":          a.usage.InputTokens + a.usage.CacheReadTokens + a.usage.OutputTokens,
	}
}

func (a answerer) responseObject(id, status string, output []map[string]any, usage map[string]any) map[string]any {
	if output == nil {
		output = []map[string]any{}
	}
	return map[string]any{"id": id, "object": "response", "created_at": time.Now().Unix(), "status": status,
		"model": a.model, "output": output, "usage": usage}
}

func (a answerer) streamResponses(s *sse) {
	id := newID("resp_")
	seq := 0
	next := func() int { seq++; return seq - 1 }
	s.event("response.created", map[string]any{"type": "response.created", "sequence_number": next(),
		"response": a.responseObject(id, "in_progress", nil, nil)})
	output := a.responsesOutput()
	for i, item := range output {
		if item["type"] == "message" {
			added := map[string]any{"type": "message", "id": item["id"], "role": "assistant", "status": "in_progress", "content": []any{}}
			s.event("response.output_item.added", map[string]any{"type": "response.output_item.added", "sequence_number": next(), "output_index": i, "item": added})
			for _, c := range a.chunks() {
				s.event("response.output_text.delta", map[string]any{"type": "response.output_text.delta", "sequence_number": next(),
					"item_id": item["id"], "output_index": i, "content_index": 0, "delta": c})
			}
		}
		s.event("response.output_item.done", map[string]any{"type": "response.output_item.done", "sequence_number": next(), "output_index": i, "item": item})
	}
	s.event("response.completed", map[string]any{"type": "response.completed", "sequence_number": next(),
		"response": a.responseObject(id, "completed", output, a.responsesUsage())})
}

func (a answerer) streamChat(s *sse) {
	id := newID("chatcmpl-")
	created := time.Now().Unix()
	chunk := func(delta map[string]any, finish any) map[string]any {
		return map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": a.model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
	}
	s.event("", chunk(map[string]any{"role": "assistant", "content": ""}, nil))
	if a.ans.Text != "" {
		for _, c := range a.chunks() {
			s.event("", chunk(map[string]any{"content": c}, nil))
		}
	}
	finish := "stop"
	if tc := a.ans.ToolCall; tc != nil {
		finish = "tool_calls"
		s.event("", chunk(map[string]any{"tool_calls": []any{map[string]any{"index": 0, "id": newID("call_"), "type": "function",
			"function": map[string]any{"name": tc.Name, "arguments": a.inputJSON()}}}}, nil))
	}
	s.event("", chunk(map[string]any{}, finish))
	s.event("", map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": a.model, "choices": []any{},
		"usage": map[string]any{"prompt_tokens": a.usage.InputTokens + a.usage.CacheReadTokens, "completion_tokens": a.usage.OutputTokens,
			"total_tokens":          a.usage.InputTokens + a.usage.CacheReadTokens + a.usage.OutputTokens,
			"prompt_tokens_details": map[string]any{"cached_tokens": a.usage.CacheReadTokens}}})
	s.event("", "[DONE]")
}

func (a answerer) writeJSON(w http.ResponseWriter, proto string) {
	switch proto {
	case protoMessages:
		var content []any
		if a.ans.Text != "" || a.ans.ToolCall == nil {
			content = append(content, map[string]any{"type": "text", "text": a.ans.Text})
		}
		if tc := a.ans.ToolCall; tc != nil {
			var in any = tc.Input
			if tc.Input == nil {
				in = map[string]any{}
			}
			content = append(content, map[string]any{"type": "tool_use", "id": newID("toolu_"), "name": tc.Name, "input": in})
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": newID("msg_"), "type": "message", "role": "assistant", "model": a.model,
			"content": content, "stop_reason": a.stopReason(), "stop_sequence": nil, "usage": a.anthropicUsage()})
	case protoResponses:
		writeJSON(w, http.StatusOK, a.responseObject(newID("resp_"), "completed", a.responsesOutput(), a.responsesUsage()))
	case protoChat:
		msg := map[string]any{"role": "assistant", "content": a.ans.Text}
		finish := "stop"
		if tc := a.ans.ToolCall; tc != nil {
			finish = "tool_calls"
			msg["tool_calls"] = []any{map[string]any{"id": newID("call_"), "type": "function",
				"function": map[string]any{"name": tc.Name, "arguments": a.inputJSON()}}}
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": newID("chatcmpl-"), "object": "chat.completion", "created": time.Now().Unix(),
			"model": a.model, "choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": finish}},
			"usage": map[string]any{"prompt_tokens": a.usage.InputTokens + a.usage.CacheReadTokens, "completion_tokens": a.usage.OutputTokens,
				"total_tokens": a.usage.InputTokens + a.usage.CacheReadTokens + a.usage.OutputTokens}})
	}
}
