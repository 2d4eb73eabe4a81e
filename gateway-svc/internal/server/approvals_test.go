package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/dataplane"
	"github.com/hangar-dev/hangar/platform/fault"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
)

// pendingCalls waits for the run to hold n pending tool calls.
func pendingCalls(t *testing.T, e *env, run string, n int) []*gatewayv1.ToolCall {
	t.Helper()
	var got []*gatewayv1.ToolCall
	ok := eventually(t, 2*time.Minute, func() bool {
		l, err := e.srv.ListToolCalls(context.Background(), &gatewayv1.ListToolCallsRequest{Run: run})
		if err != nil {
			t.Fatal(err)
		}
		got = nil
		for _, tc := range l.ToolCalls {
			if tc.State == gatewayv1.ToolCallState_TOOL_CALL_STATE_PENDING {
				got = append(got, tc)
			}
		}
		return len(got) >= n
	})
	if !ok {
		t.Fatalf("run %s: no %d pending tool calls (have %v)", run, n, got)
	}
	return got
}

// TestApprovalsWire holds a tool call in each protocol and checks what the
// client gets on allow and on deny, and what the tape keeps.
func TestApprovalsWire(t *testing.T) {
	t.Parallel()
	e := newEnv(t, basicScript())
	ctx := context.Background()
	tools := map[string]string{
		"messages":  `{"model":"claude-sonnet-4-5","stream":true,"max_tokens":100,"tools":[{"name":"Bash","input_schema":{}}],"messages":[{"role":"user","content":"use a tool"}]}`,
		"plain":     `{"model":"claude-sonnet-4-5","max_tokens":100,"tools":[{"name":"Bash","input_schema":{}}],"messages":[{"role":"user","content":"use a tool"}]}`,
		"responses": `{"model":"gpt-5.5","stream":true,"tools":[{"type":"function","name":"Bash"}],"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"use a tool"}]}]}`,
		"chat":      `{"model":"gpt-5.5","stream":true,"tools":[{"type":"function","function":{"name":"Bash"}}],"messages":[{"role":"user","content":"use a tool"}]}`,
	}
	paths := map[string]string{"messages": "/v1/messages", "plain": "/v1/messages", "responses": "/v1/responses", "chat": "/v1/chat/completions"}
	for _, name := range []string{"messages", "plain", "responses", "chat"} {
		for _, allow := range []bool{true, false} {
			t.Run(name+map[bool]string{true: "/allow", false: "/deny"}[allow], func(t *testing.T) {
				run, tok := e.createRun(t, &gatewayv1.CreateRunRequest{Harness: "claude", Approvals: true})
				done := make(chan *http.Response, 1)
				go func() { done <- e.do(t, paths[name], "bearer", tok, tools[name]) }()
				calls := pendingCalls(t, e, run.Id, 1)
				select {
				case resp := <-done:
					t.Fatalf("answer released before a decision: %d %s", resp.StatusCode, readAll(t, resp.Body))
				default:
				}
				tc := calls[0]
				if tc.ToolName != "Bash" || !json.Valid([]byte(tc.InputJson)) || !strings.Contains(tc.InputJson, "echo hi") || tc.Seq != 1 || tc.Id == "" {
					t.Fatalf("tool call %v", tc)
				}
				ans, err := e.srv.AnswerToolCall(ctx, &gatewayv1.AnswerToolCallRequest{Run: run.Id, ToolCallId: tc.Id, Allow: allow})
				if err != nil {
					t.Fatal(err)
				}
				want := gatewayv1.ToolCallState_TOOL_CALL_STATE_DENIED
				if allow {
					want = gatewayv1.ToolCallState_TOOL_CALL_STATE_ALLOWED
				}
				if ans.ToolCall.State != want {
					t.Errorf("answered state %v", ans.ToolCall.State)
				}
				// The same answer again is a no-op; the other one is refused.
				if _, err := e.srv.AnswerToolCall(ctx, &gatewayv1.AnswerToolCallRequest{Run: run.Id, ToolCallId: tc.Id, Allow: allow}); err != nil {
					t.Errorf("repeat answer: %v", err)
				}
				if _, err := e.srv.AnswerToolCall(ctx, &gatewayv1.AnswerToolCallRequest{Run: run.Id, ToolCallId: tc.Id, Allow: !allow}); fault.Status(err).Code() != codes.FailedPrecondition {
					t.Errorf("opposite answer: %v", err)
				}
				resp := <-done
				body := readAll(t, resp.Body)
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, body)
				}
				hasCall := strings.Contains(body, "echo hi")
				if allow != hasCall {
					t.Errorf("allow=%v but the answer has the call=%v:\n%s", allow, hasCall, body)
				}
				if !allow {
					if !strings.Contains(body, "was denied by the user") {
						t.Errorf("denial text missing:\n%s", body)
					}
					if name == "messages" || name == "plain" {
						if !strings.Contains(body, `"stop_reason":"end_turn"`) {
							t.Errorf("denial does not end the turn:\n%s", body)
						}
					}
				}
				steps := e.tape(t, run.Id)
				if len(steps) != 1 {
					t.Fatalf("tape has %d steps", len(steps))
				}
				st := steps[0]
				h := st.Response.GetHeaders()
				if !strings.Contains(h[dataplane.HeaderToolCalls], tc.Id) {
					t.Errorf("tape lacks the decision: %v", h)
				}
				upstream := h[dataplane.HeaderUpstreamAnswer]
				if allow && upstream != "" {
					t.Errorf("allowed answer has a separate upstream record")
				}
				var up gatewayv1.StepResponse
				if !allow && (protojson.Unmarshal([]byte(upstream), &up) != nil || !strings.Contains(string(up.Body)+fmt.Sprint(up.Events), "echo hi")) {
					t.Errorf("denied step lacks the upstream's answer: %q", upstream)
				}
				if st.Usage.GetOutputTokens() == 0 {
					t.Errorf("held step usage %v", st.Usage)
				}
				l, _ := e.srv.ListToolCalls(ctx, &gatewayv1.ListToolCallsRequest{Run: run.Id})
				if len(l.ToolCalls) != 1 || l.ToolCalls[0].State != want {
					t.Errorf("ListToolCalls after: %v", l)
				}
			})
		}
	}
	// An answer without a tool call is not held.
	run, tok := e.createRun(t, &gatewayv1.CreateRunRequest{Approvals: true})
	if resp := e.do(t, "/v1/messages", "x-api-key", tok, anthBody); resp.StatusCode != 200 || !strings.Contains(readAll(t, resp.Body), "hell") {
		t.Errorf("text answer under approvals: %d", resp.StatusCode)
	}
	if l, _ := e.srv.ListToolCalls(ctx, &gatewayv1.ListToolCallsRequest{Run: run.Id}); len(l.ToolCalls) != 0 {
		t.Errorf("text answer held: %v", l)
	}
}

// TestApprovalsClaude runs the real Claude Code through a run with
// approvals: allowed, its Write runs; denied, nothing is written and the
// denial is its final text.
func TestApprovalsClaude(t *testing.T) {
	var claude harness
	for _, h := range harnesses(t) {
		if h.name == "claude" {
			claude = h
		}
	}
	if _, err := os.Stat(claude.bin); err != nil {
		t.Fatalf("claude is not installed at %s: %v", claude.bin, err)
	}
	work := t.TempDir()
	e := newEnv(t, claude.script(work))
	ctx := context.Background()
	for _, allow := range []bool{true, false} {
		_ = os.Remove(filepath.Join(work, "hello.txt"))
		run, tok := e.createRun(t, &gatewayv1.CreateRunRequest{Session: "ses-approve", Turn: 1, Harness: "claude", Approvals: true})
		type result struct {
			out string
			err error
		}
		done := make(chan result, 1)
		go func() {
			out, err := claude.runCLI(t, run, tok, work, "Please create hello.txt")
			done <- result{out, err}
		}()
		calls := pendingCalls(t, e, run.Id, 1)
		if calls[0].ToolName != "Write" || !strings.Contains(calls[0].InputJson, "hello.txt") {
			t.Fatalf("held call %v", calls[0])
		}
		if _, err := os.Stat(filepath.Join(work, "hello.txt")); err == nil {
			t.Fatal("the tool ran before it was allowed")
		}
		if _, err := e.srv.AnswerToolCall(ctx, &gatewayv1.AnswerToolCallRequest{Run: run.Id, ToolCallId: calls[0].Id, Allow: allow}); err != nil {
			t.Fatal(err)
		}
		res := <-done
		if res.err != nil {
			t.Fatalf("allow=%v: claude: %v\n%s", allow, res.err, res.out)
		}
		_, statErr := os.Stat(filepath.Join(work, "hello.txt"))
		if allow {
			if statErr != nil || !strings.Contains(res.out, "hello.txt is written") {
				t.Errorf("allowed: file %v; output:\n%s", statErr, res.out)
			}
		} else {
			if statErr == nil {
				t.Errorf("denied, yet hello.txt exists")
			}
			if !strings.Contains(res.out, "was denied by the user") {
				t.Errorf("denied: the agent's final text lacks the denial:\n%s", res.out)
			}
		}
		steps := e.tape(t, run.Id)
		held := 0
		for _, st := range steps {
			if st.Response.GetHeaders()[dataplane.HeaderToolCalls] != "" {
				held++
				if !allow && st.Response.GetHeaders()[dataplane.HeaderUpstreamAnswer] == "" {
					t.Errorf("denied step %d lacks the upstream answer", st.Seq)
				}
			}
		}
		if held != 1 {
			t.Errorf("allow=%v: %d held steps on a tape of %d", allow, held, len(steps))
		}
	}
}
