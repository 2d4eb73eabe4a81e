package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/server"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
	"github.com/hangar-dev/hangar/platform/fault"
	"google.golang.org/grpc/codes"
)

func basicScript() scripted.Script {
	return scripted.Script{Rules: []scripted.Rule{
		{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "finished"}},
		{Name: "reset", Prompt: "reset", Answer: scripted.Answer{Text: "abcdefghij", Chunks: 5, ResetAfterEvents: 3}},
		{Name: "tool", Prompt: "use a tool", ToolsOffered: scripted.Bool(true),
			Answer: scripted.Answer{ToolCall: &scripted.ToolCall{Name: "Bash", Input: map[string]any{"command": "echo hi"}}}},
	}, Default: &scripted.Answer{Text: "hello there", Chunks: 3, Usage: &scripted.Usage{InputTokens: 100, OutputTokens: 20}}}
}

const (
	anthBody = `{"model":"claude-sonnet-4-5","stream":true,"max_tokens":100,"system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"system","content":"extra"},{"role":"user","content":"hi"}]}`
	respBody = `{"model":"gpt-5.5","stream":true,"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}]}`
	chatBody = `{"model":"gpt-5.5","stream":true,"messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}]}`
)

func TestThreeProtocolsThroughGateway(t *testing.T) {
	t.Parallel()
	e := newEnv(t, basicScript())
	tests := []struct {
		name, path, auth, body, want string
		provider                     gatewayv1.Provider
	}{
		{"messages", "/v1/messages?beta=true", "x-api-key", anthBody, `"text":"hell"`, gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES},
		{"responses", "/v1/responses", "bearer", respBody, `"response.completed"`, gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES},
		{"chat", "/v1/chat/completions", "bearer", chatBody, `[DONE]`, gatewayv1.Provider_PROVIDER_OPENAI_CHAT_COMPLETIONS},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run, tok := e.createRun(t, &gatewayv1.CreateRunRequest{Session: "ses-1", Turn: 1, Harness: "claude"})
			if !strings.HasPrefix(run.AnthropicBaseUrl, e.data.URL+"/runs/") || !strings.HasSuffix(run.OpenaiBaseUrl, "/v1") {
				t.Errorf("base URLs %q %q", run.AnthropicBaseUrl, run.OpenaiBaseUrl)
			}
			// Both the plain and the run-scoped path work.
			for _, prefix := range []string{"", "/runs/" + run.Id} {
				resp := e.do(t, prefix+tc.path, tc.auth, tok, tc.body)
				got := readAll(t, resp.Body)
				if resp.StatusCode != 200 || !strings.Contains(got, tc.want) || !strings.Contains(resp.Header.Get("Content-Type"), "event-stream") {
					t.Fatalf("status %d %q:\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), got)
				}
			}
			steps := e.tape(t, run.Id)
			if len(steps) != 2 {
				t.Fatalf("tape has %d steps", len(steps))
			}
			s := steps[0]
			if s.Seq != 1 || s.Provider != tc.provider || string(s.Request.Body) != tc.body || len(s.Response.Events) < 3 || s.Usage.GetInputTokens() == 0 || s.Usage.GetCostUsd() <= 0 {
				t.Errorf("step: %v", s)
			}
			for k := range s.Request.Headers {
				if k == "x-api-key" || k == "authorization" {
					t.Errorf("credential %s on the tape", k)
				}
			}
			got := e.getRun(t, run.Id)
			if got.Steps != 2 || got.Usage.ModelCalls != 2 || got.Usage.InputTokens != 2*s.Usage.InputTokens {
				t.Errorf("run usage %v steps %d", got.Usage, got.Steps)
			}
		})
	}
	// The real key went upstream, never the run token.
	for _, l := range e.upstream.Log() {
		_ = l
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, basicScript())
	run, tok := e.createRun(t, &gatewayv1.CreateRunRequest{})
	other, otherTok := e.createRun(t, &gatewayv1.CreateRunRequest{})
	before := e.upstream.Requests()

	resp := e.do(t, "/v1/messages", "x-api-key", "hgr_unknown", anthBody)
	if b := readAll(t, resp.Body); resp.StatusCode != 401 || !strings.Contains(b, `"authentication_error"`) || !strings.Contains(b, `"type":"error"`) {
		t.Errorf("unknown token: %d %s", resp.StatusCode, b)
	}
	resp = e.do(t, "/v1/responses", "bearer", "", respBody)
	if b := readAll(t, resp.Body); resp.StatusCode != 401 || !strings.Contains(b, `"invalid_api_key"`) {
		t.Errorf("no token: %d %s", resp.StatusCode, b)
	}
	resp = e.do(t, "/v1/messages", "x-api-key", tok, `{"model":`)
	if b := readAll(t, resp.Body); resp.StatusCode != 400 || !strings.Contains(b, `"invalid_request_error"`) {
		t.Errorf("malformed: %d %s", resp.StatusCode, b)
	}
	resp = e.do(t, "/v1/chat/completions", "bearer", tok, `nope`)
	if b := readAll(t, resp.Body); resp.StatusCode != 400 || !strings.Contains(b, `"error":{`) {
		t.Errorf("malformed chat: %d %s", resp.StatusCode, b)
	}
	// Another run's token on this run's paths.
	resp = e.do(t, "/runs/"+run.Id+"/v1/messages", "x-api-key", otherTok, anthBody)
	if b := readAll(t, resp.Body); resp.StatusCode != 403 || !strings.Contains(b, "permission_error") {
		t.Errorf("cross-run call: %d %s", resp.StatusCode, b)
	}
	req, _ := http.NewRequest(http.MethodGet, e.data.URL+"/runs/"+run.Id+"/tape", nil)
	req.Header.Set("x-api-key", otherTok)
	tr, err := http.DefaultClient.Do(req)
	if err != nil || tr.StatusCode != 403 {
		t.Errorf("cross-run tape read: %v %v", tr.StatusCode, err)
	}
	tr.Body.Close()
	// HEAD / preconnect.
	hr, err := http.Head(e.data.URL + "/")
	if err != nil || hr.StatusCode != 200 {
		t.Errorf("HEAD /: %v %v", hr, err)
	}
	if n := e.upstream.Requests() - before; n != 0 {
		t.Errorf("refused calls reached upstream %d times", n)
	}
	if got := e.getRun(t, run.Id); got.Steps != 0 {
		t.Errorf("refused calls recorded %d steps", got.Steps)
	}
	_ = other
}

func TestBodyTooLarge(t *testing.T) {
	t.Parallel()
	e := newEnv(t, basicScript())
	_, tok := e.createRun(t, &gatewayv1.CreateRunRequest{})
	// 100 MB + a bit, streamed without a Content-Length.
	pr, pw := ioPipe()
	go func() {
		chunk := []byte(strings.Repeat("a", 1<<20))
		_, _ = pw.Write([]byte(`{"model":"x","messages":[{"role":"user","content":"`))
		for range 101 {
			if _, err := pw.Write(chunk); err != nil {
				break
			}
		}
		_ = pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, e.data.URL+"/v1/messages", pr)
	req.Header.Set("x-api-key", tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b := readAll(t, resp.Body); resp.StatusCode != 413 || !strings.Contains(b, "request_too_large") {
		t.Errorf("100 MB: %d %s", resp.StatusCode, b)
	}
	if e.upstream.Requests() != 0 {
		t.Error("oversized body reached upstream")
	}
}

func TestUpstreamResetMidStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t, basicScript())
	for _, tc := range []struct{ path, auth, body, want string }{
		{"/v1/messages", "x-api-key", strings.Replace(anthBody, `"hi"`, `"reset"`, 1), `"type":"error"`},
		{"/v1/responses", "bearer", strings.Replace(respBody, `"hi"`, `"reset"`, 1), `"response.failed"`},
		{"/v1/chat/completions", "bearer", strings.Replace(chatBody, `"hi"`, `"reset"`, 1), `"server_error"`},
	} {
		run, tok := e.createRun(t, &gatewayv1.CreateRunRequest{})
		resp := e.do(t, tc.path, tc.auth, tok, tc.body)
		data := sseData(resp.Body)
		if len(data) != 4 || !strings.Contains(data[3], tc.want) {
			t.Errorf("%s: events %q", tc.path, data)
		}
		steps := e.tape(t, run.Id)
		if len(steps) != 1 || !strings.Contains(steps[0].GetFailure(), "upstream stream failed") || len(steps[0].Response.Events) != 4 {
			t.Errorf("%s: failure not taped: %v", tc.path, steps)
		}
	}
	// The gateway still works.
	_, tok := e.createRun(t, &gatewayv1.CreateRunRequest{})
	if resp := e.do(t, "/v1/messages", "x-api-key", tok, anthBody); resp.StatusCode != 200 {
		t.Errorf("after reset: %d", resp.StatusCode)
	}
}

func TestBudgetEndsRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, basicScript())
	run, tok := e.createRun(t, &gatewayv1.CreateRunRequest{Budget: &gatewayv1.Budget{MaxTokens: 1}})
	if resp := e.do(t, "/v1/messages", "x-api-key", tok, anthBody); resp.StatusCode != 200 {
		t.Fatalf("first call: %d", resp.StatusCode)
	}
	got := e.getRun(t, run.Id)
	if got.State != gatewayv1.RunState_RUN_STATE_OVER_BUDGET || !strings.Contains(got.StateReason, "max_tokens 1 exceeded") {
		t.Fatalf("run %v %q", got.State, got.StateReason)
	}
	n := e.upstream.Requests()
	resp := e.do(t, "/v1/messages", "x-api-key", tok, anthBody)
	if b := readAll(t, resp.Body); resp.StatusCode != 403 || !strings.Contains(b, "over budget") || !strings.Contains(b, `"permission_error"`) {
		t.Errorf("second call: %d %s", resp.StatusCode, b)
	}
	if e.upstream.Requests() != n {
		t.Error("over-budget call reached upstream")
	}
}

func TestSteering(t *testing.T) {
	t.Parallel()
	e := newEnv(t, basicScript())
	ctx := context.Background()
	run, tok := e.createRun(t, &gatewayv1.CreateRunRequest{})
	if r, err := e.srv.SteerRun(ctx, &gatewayv1.SteerRunRequest{Run: run.Id, Message: "please also add tests"}); err != nil || r.Queued != 1 {
		t.Fatalf("SteerRun: %v %v", r, err)
	}
	e.do(t, "/v1/messages", "x-api-key", tok, anthBody)
	e.do(t, "/v1/messages", "x-api-key", tok, anthBody)
	log := e.upstream.Log()
	if len(log) != 2 || !strings.Contains(log[0].Prompt, "please also add tests") || strings.Contains(log[1].Prompt, "please also") {
		t.Errorf("upstream prompts: %+v", log)
	}
	steps := e.tape(t, run.Id)
	if steps[0].Injected != "please also add tests" || string(steps[0].Request.Body) != anthBody || steps[1].Injected != "" {
		t.Errorf("tape: injected %q %q", steps[0].Injected, steps[1].Injected)
	}
}

func TestControlAPIErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, basicScript())
	ctx := context.Background()
	code := func(err error) codes.Code { return fault.Status(err).Code() }
	if _, err := e.srv.GetRun(ctx, &gatewayv1.GetRunRequest{Run: "nope"}); code(err) != codes.NotFound {
		t.Errorf("GetRun unknown: %v", err)
	}
	if _, err := e.srv.CreateRun(ctx, &gatewayv1.CreateRunRequest{Session: "Bad Name"}); code(err) != codes.InvalidArgument {
		t.Errorf("bad session: %v", err)
	}
	if _, err := e.srv.CreateRun(ctx, &gatewayv1.CreateRunRequest{CacheTtl: "2h"}); code(err) != codes.InvalidArgument {
		t.Errorf("bad cache ttl: %v", err)
	}
	run, tok := e.createRun(t, &gatewayv1.CreateRunRequest{Session: "s1", Turn: 3})
	e.do(t, "/v1/messages", "x-api-key", tok, anthBody)
	if _, err := e.srv.GetStep(ctx, &gatewayv1.GetStepRequest{Run: run.Id, Seq: 5}); code(err) != codes.NotFound {
		t.Errorf("GetStep 5: %v", err)
	}
	st, err := e.srv.GetStep(ctx, &gatewayv1.GetStepRequest{Run: run.Id, Seq: 1})
	if err != nil || string(st.Step.Request.Body) != anthBody {
		t.Errorf("GetStep 1: %v", err)
	}
	if _, err := e.srv.ReportTreeHash(ctx, &gatewayv1.ReportTreeHashRequest{Run: run.Id, Seq: 1, TreeHash: "deadbeef"}); err != nil {
		t.Fatal(err)
	}
	ls, err := e.srv.ListSteps(ctx, &gatewayv1.ListStepsRequest{Run: run.Id})
	if err != nil || len(ls.Steps) != 1 || ls.Steps[0].TreeHash != "deadbeef" || ls.Steps[0].Request.Body != nil {
		t.Errorf("ListSteps: %v %v", ls, err)
	}
	u, err := e.srv.GetUsage(ctx, &gatewayv1.GetUsageRequest{Session: "s1"})
	if err != nil || u.Usage.ModelCalls != 1 || u.Turns[3].GetModelCalls() != 1 {
		t.Errorf("GetUsage: %v %v", u, err)
	}
	lr, err := e.srv.ListRuns(ctx, &gatewayv1.ListRunsRequest{Session: "s1"})
	if err != nil || len(lr.Runs) != 1 {
		t.Errorf("ListRuns: %v %v", lr, err)
	}
	if _, err := e.srv.EndRun(ctx, &gatewayv1.EndRunRequest{Run: run.Id}); err != nil {
		t.Fatal(err)
	}
	resp := e.do(t, "/v1/messages", "x-api-key", tok, anthBody)
	if resp.StatusCode != 401 {
		t.Errorf("ended run's token: %d", resp.StatusCode)
	}
	if _, err := e.srv.SteerRun(ctx, &gatewayv1.SteerRunRequest{Run: run.Id, Message: "x"}); code(err) != codes.FailedPrecondition {
		t.Errorf("steer ended: %v", err)
	}
	if l, err := e.srv.ListToolCalls(ctx, &gatewayv1.ListToolCallsRequest{Run: run.Id}); err != nil || len(l.ToolCalls) != 0 {
		t.Errorf("ListToolCalls without approvals: %v %v", l, err)
	}
	if _, err := e.srv.AnswerToolCall(ctx, &gatewayv1.AnswerToolCallRequest{Run: run.Id, ToolCallId: "toolu_x", Allow: true}); code(err) != codes.NotFound {
		t.Errorf("AnswerToolCall unknown: %v", err)
	}
}

func TestTapeSweep(t *testing.T) {
	t.Parallel()
	now := time.Now()
	clock := &now
	e := newEnv(t, basicScript(), func(d *server.Deps) { d.Now = func() time.Time { return *clock }; d.TapeDays = 30 })
	ctx := context.Background()
	run, tok := e.createRun(t, &gatewayv1.CreateRunRequest{TtlSeconds: 3600})
	e.do(t, "/v1/messages", "x-api-key", tok, anthBody)
	if n, err := e.srv.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("sweep now: %d %v", n, err)
	}
	later := now.Add(31 * 24 * time.Hour)
	clock = &later
	if n, err := e.srv.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep day 31: %d %v", n, err)
	}
	if _, err := e.srv.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: run.Id}); fault.Status(err).Code() != codes.NotFound {
		t.Errorf("swept tape: %v", err)
	}
}

func TestCacheTTL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ ttl, want, notWant string }{
		{"1h", `"ttl":"1h"`, ""},
		{"5m", `"ttl":"5m"`, ""},
		{"off", "", "cache_control"},
		{"auto", `"cache_control":{"type":"ephemeral"}`, "ttl"},
	} {
		e := newEnv(t, basicScript())
		var seen string
		e.up.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var m map[string]json.RawMessage
			b := readAll(t, r.Body)
			_ = json.Unmarshal([]byte(b), &m)
			seen = string(m["system"])
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"type":"message","content":[],"usage":{"input_tokens":1,"output_tokens":1}}`))
		})
		_, tok := e.createRun(t, &gatewayv1.CreateRunRequest{CacheTtl: tc.ttl})
		e.do(t, "/v1/messages", "x-api-key", tok, anthBody)
		if (tc.want != "" && !strings.Contains(seen, tc.want)) || (tc.notWant != "" && strings.Contains(seen, tc.notWant)) {
			t.Errorf("cache %s: upstream system %s", tc.ttl, seen)
		}
	}
}

// TestStoreDownIsUnavailable: a Redis that cannot be reached is
// "unavailable, try again"; the answer never claims the run is gone.
func TestStoreDownIsUnavailable(t *testing.T) {
	t.Parallel()
	var client *redis.Client
	e := newEnv(t, basicScript(), func(d *server.Deps) {
		client = redis.NewClient(&redis.Options{Addr: d.Redis.Options().Addr})
		d.Redis = client
	})
	run, _ := e.createRun(t, &gatewayv1.CreateRunRequest{Session: "s1", Turn: 1})
	client.Close()
	_, err := e.srv.GetRun(context.Background(), &gatewayv1.GetRunRequest{Run: run.Id})
	if st := fault.Status(err); st.Code() != codes.Unavailable || fault.Reason(st) != "GATEWAY_STORE_UNAVAILABLE" {
		t.Fatalf("GetRun with Redis down: %v %s (%v)", st.Code(), fault.Reason(st), err)
	}
}

// TestArmedOutsideOnlyTakesEveryTurn: a replay armed for a session is
// taken by its first turn's run only, but one armed outside_only (a
// fork's trial, whose every turn continues the replayed conversation) by
// every turn's run.
func TestArmedOutsideOnlyTakesEveryTurn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, basicScript())
	ctx := context.Background()
	rec, _ := e.createRun(t, &gatewayv1.CreateRunRequest{Session: "ses-rec", Turn: 1, Harness: "claude"})
	for _, c := range []struct {
		session     string
		outsideOnly bool
	}{{"ses-prefix", false}, {"ses-trial", true}} {
		if _, err := e.srv.SetReplay(ctx, &gatewayv1.SetReplayRequest{Session: c.session, Replay: &gatewayv1.Replay{TapeRun: rec.GetId(), OutsideOnly: c.outsideOnly}}); err != nil {
			t.Fatal(err)
		}
		for turn := int32(1); turn <= 3; turn++ {
			run, _ := e.createRun(t, &gatewayv1.CreateRunRequest{Session: c.session, Turn: turn, Harness: "claude"})
			want := turn == 1 || c.outsideOnly
			if got := run.GetReplay().GetTapeRun() == rec.GetId(); got != want || run.GetReplay().GetOutsideOnly() != (want && c.outsideOnly) {
				t.Errorf("%s turn %d: replay %v, want armed %v", c.session, turn, run.GetReplay(), want)
			}
		}
	}
}
