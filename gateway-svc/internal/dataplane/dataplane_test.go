package dataplane_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/dataplane"
	"github.com/hangar-dev/hangar/gateway-svc/internal/redistest"
	"github.com/hangar-dev/hangar/gateway-svc/internal/runs"
	"github.com/hangar-dev/hangar/gateway-svc/internal/tape"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
	"github.com/hangar-dev/hangar/platform/blob"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeAfter is an injected timer source: timers fire only when the test
// says so.
type fakeAfter struct {
	mu     sync.Mutex
	timers []fakeTimer
}

type fakeTimer struct {
	d  time.Duration
	ch chan time.Time
}

func (f *fakeAfter) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan time.Time, 1)
	f.timers = append(f.timers, fakeTimer{d, ch})
	return ch
}

// fire fires every timer of duration d and returns how many.
func (f *fakeAfter) fire(d time.Duration) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, t := range f.timers {
		if t.d == d {
			select {
			case t.ch <- time.Now():
				n++
			default:
			}
		}
	}
	return n
}

// gate sits in front of the scripted upstream and holds requests whose body
// contains "HOLD" until released.
type gate struct {
	next    http.Handler
	release chan struct{}
	arrived chan string
	calls   atomic.Int64
	mu      sync.Mutex
	order   []string
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	g.calls.Add(1)
	g.mu.Lock()
	g.order = append(g.order, string(body))
	g.mu.Unlock()
	if bytes.Contains(body, []byte("HOLD")) {
		g.arrived <- string(body)
		select {
		case <-g.release:
		case <-r.Context().Done():
			return
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	g.next.ServeHTTP(w, r)
}

type env struct {
	h        *dataplane.Handler
	runs     *runs.Store
	tapes    *tape.Tapes
	gate     *gate
	up       *httptest.Server
	data     *httptest.Server
	client   *http.Client
	clock    *fakeAfter
	waiting  chan string
	upstream *scripted.Server
}

func newEnv(t *testing.T, tweak func(*dataplane.Options)) *env {
	t.Helper()
	rdb, prefix := redistest.New(t)
	store, err := blob.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := &env{clock: &fakeAfter{}, waiting: make(chan string, 8), client: &http.Client{}}
	e.upstream = scripted.MustNew(scripted.Script{Rules: []scripted.Rule{
		{Name: "tool", Prompt: "use a tool", ToolsOffered: scripted.Bool(true),
			Answer: scripted.Answer{ToolCall: &scripted.ToolCall{Name: "Bash", Input: map[string]any{"command": "echo hi"}}}},
		{Name: "fetch", Prompt: "fetch a page", ToolsOffered: scripted.Bool(true), LastIsToolResult: scripted.Bool(false),
			Answer: scripted.Answer{ToolCall: &scripted.ToolCall{Name: "WebFetch", Input: map[string]any{"url": "https://10.0.0.1/p", "prompt": "what does it say"}}}},
	}, Default: &scripted.Answer{Text: "hello there", Usage: &scripted.Usage{InputTokens: 10, OutputTokens: 5}}})
	e.gate = &gate{next: e.upstream, release: make(chan struct{}), arrived: make(chan string, 8)}
	e.up = httptest.NewServer(e.gate)
	e.runs = runs.New(rdb, runs.Options{Prefix: prefix})
	e.tapes = tape.New(store, "tapes/", blob.ErrNotFound)
	upClient := &http.Client{Transport: &http.Transport{}}
	o := dataplane.Options{
		Runs: e.runs, Tapes: e.tapes, Client: upClient,
		Upstreams:     dataplane.Upstreams{AnthropicURL: e.up.URL, AnthropicKey: "sk-real", OpenAIURL: e.up.URL + "/v1", OpenAIKey: "sk-real"},
		After:         e.clock.After,
		OnStaggerWait: func(run string) { e.waiting <- run },
	}
	if tweak != nil {
		tweak(&o)
	}
	e.h = dataplane.New(o)
	e.data = httptest.NewServer(e.h)
	t.Cleanup(func() {
		e.openGate()
		e.data.Close()
		e.up.Close()
		upClient.CloseIdleConnections()
		e.client.CloseIdleConnections()
	})
	return e
}

var gateOnce sync.Map

func (e *env) openGate() {
	if _, loaded := gateOnce.LoadOrStore(e.gate, true); !loaded {
		close(e.gate.release)
	}
}

func (e *env) create(t *testing.T, run *gatewayv1.Run) (*gatewayv1.Run, string) {
	t.Helper()
	r, tok, err := e.runs.Create(context.Background(), run, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return r, tok
}

type answer struct {
	status int
	body   string
	header http.Header
}

func (e *env) post(t *testing.T, path, token, body string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.data.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-api-key", token)
	resp, err := e.client.Do(req)
	if err != nil {
		t.Error(err)
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, string(b), resp.Header}
}

func (e *env) postAsync(t *testing.T, token, body string) <-chan answer {
	ch := make(chan answer, 1)
	go func() { ch <- e.post(t, "/v1/messages", token, body) }()
	return ch
}

func msg(text string) string {
	return `{"model":"claude-sonnet-4-5","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"` + text + `"}]}`
}

func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestStaggerWaitsForFirstSibling(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	_, tokA := e.create(t, &gatewayv1.Run{SiblingGroup: "g1", StaggerSeconds: 15})
	runB, tokB := e.create(t, &gatewayv1.Run{SiblingGroup: "g1", StaggerSeconds: 15})

	a := e.postAsync(t, tokA, msg("HOLD first sibling"))
	wait(t, e.gate.arrived, "the first sibling's call upstream")
	b := e.postAsync(t, tokB, msg("second sibling"))
	if got := wait(t, e.waiting, "the second sibling to wait"); got != runB.GetId() {
		t.Fatalf("waiting run %q, want %q", got, runB.GetId())
	}
	if n := e.gate.calls.Load(); n != 1 {
		t.Fatalf("upstream saw %d calls while the second sibling should wait", n)
	}
	select {
	case ans := <-b:
		t.Fatalf("second sibling answered before the first: %d", ans.status)
	default:
	}
	e.openGate()
	if ans := wait(t, a, "first answer"); ans.status != 200 {
		t.Fatalf("first: %d %s", ans.status, ans.body)
	}
	if ans := wait(t, b, "second answer"); ans.status != 200 || !strings.Contains(ans.body, "message_stop") {
		t.Fatalf("second: %d %s", ans.status, ans.body)
	}
	e.gate.mu.Lock()
	order := append([]string(nil), e.gate.order...)
	e.gate.mu.Unlock()
	if len(order) != 2 || !strings.Contains(order[0], "first sibling") || !strings.Contains(order[1], "second sibling") {
		t.Errorf("upstream order %q", order)
	}
	// A second call of the same run does not wait again.
	if ans := e.post(t, "/v1/messages", tokB, msg("again")); ans.status != 200 {
		t.Errorf("second call: %d", ans.status)
	}
	select {
	case r := <-e.waiting:
		t.Errorf("%s waited on a later call", r)
	default:
	}
}

func TestStaggerZeroDoesNotWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil) // default StaggerSeconds 0
	_, tokA := e.create(t, &gatewayv1.Run{SiblingGroup: "g0"})
	_, tokB := e.create(t, &gatewayv1.Run{SiblingGroup: "g0"})
	a := e.postAsync(t, tokA, msg("HOLD first"))
	wait(t, e.gate.arrived, "the first sibling's call upstream")
	// The first sibling is still held upstream; the second goes through.
	if ans := e.post(t, "/v1/messages", tokB, msg("second")); ans.status != 200 {
		t.Fatalf("second: %d %s", ans.status, ans.body)
	}
	select {
	case r := <-e.waiting:
		t.Errorf("%s waited with stagger 0", r)
	default:
	}
	e.openGate()
	wait(t, a, "first answer")
}

func TestStaggerSilentSiblingProceedsAfterStagger(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(o *dataplane.Options) { o.StaggerSeconds = 7 })
	_, tokA := e.create(t, &gatewayv1.Run{SiblingGroup: "g2"})
	runB, tokB := e.create(t, &gatewayv1.Run{SiblingGroup: "g2"})
	a := e.postAsync(t, tokA, msg("HOLD silent"))
	wait(t, e.gate.arrived, "the first sibling's call upstream")
	b := e.postAsync(t, tokB, msg("second"))
	if got := wait(t, e.waiting, "the second sibling to wait"); got != runB.GetId() {
		t.Fatalf("waiting %q", got)
	}
	select {
	case ans := <-b:
		t.Fatalf("answered before the stagger ended: %d", ans.status)
	default:
	}
	if n := e.clock.fire(7 * time.Second); n != 1 {
		t.Fatalf("fired %d stagger deadlines, want 1", n)
	}
	if ans := wait(t, b, "second answer after the stagger"); ans.status != 200 {
		t.Fatalf("second: %d %s", ans.status, ans.body)
	}
	select {
	case <-a:
		t.Fatal("the silent sibling answered")
	default:
	}
	e.openGate()
	wait(t, a, "first answer")
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(o *dataplane.Options) { o.MaxBodyBytes = 1 << 10 })
	run, tok := e.create(t, &gatewayv1.Run{})
	other, _ := e.create(t, &gatewayv1.Run{})
	big := msg(strings.Repeat("x", 2<<10))
	tests := []struct {
		name, method, path, token, body string
		status                          int
		want                            string
	}{
		{"unknown token", "POST", "/v1/messages", "hgr_nope", msg("hi"), 401, `"authentication_error"`},
		{"no token", "POST", "/v1/responses", "", msg("hi"), 401, `"invalid_api_key"`},
		{"other run's path", "POST", "/runs/" + other.GetId() + "/v1/messages", tok, msg("hi"), 403, `"permission_error"`},
		{"malformed JSON", "POST", "/v1/messages", tok, `{"model":`, 400, "not valid JSON"},
		{"too large", "POST", "/v1/messages", tok, big, 413, "request_too_large"},
		{"unknown endpoint", "POST", "/v1/engines", tok, msg("hi"), 404, "not_found_error"},
		{"GET a model endpoint", "GET", "/v1/messages", tok, "", 405, "takes POST"},
		{"HEAD /", "HEAD", "/", "", "", 200, ""},
		{"run-scoped ok", "POST", "/runs/" + run.GetId() + "/v1/messages", tok, msg("hi"), 200, "message_stop"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, e.data.URL+tc.path, strings.NewReader(tc.body))
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := e.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.want) {
				t.Errorf("%d %s; want %d with %q", resp.StatusCode, b, tc.status, tc.want)
			}
		})
	}
	// Only the good call reached upstream and the tape.
	if n := e.gate.calls.Load(); n != 1 {
		t.Errorf("upstream saw %d calls", n)
	}
	steps, err := e.tapes.Read(context.Background(), run.GetId(), 1)
	if err != nil || len(steps) != 1 || steps[0].GetUsage().GetInputTokens() != 10 {
		t.Errorf("tape %v %v", steps, err)
	}
}

func TestSteeringAndTape(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	run, tok := e.create(t, &gatewayv1.Run{Budget: &gatewayv1.Budget{MaxTokens: 20}})
	if _, err := e.runs.Steer(ctx, run.GetId(), "also add tests"); err != nil {
		t.Fatal(err)
	}
	if ans := e.post(t, "/v1/messages", tok, msg("hi")); ans.status != 200 {
		t.Fatalf("%d %s", ans.status, ans.body)
	}
	e.gate.mu.Lock()
	sent := e.gate.order[0]
	e.gate.mu.Unlock()
	if !strings.Contains(sent, "also add tests") {
		t.Errorf("steering not sent upstream: %s", sent)
	}
	st, err := e.tapes.Step(ctx, run.GetId(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetInjected() != "also add tests" || strings.Contains(string(st.GetRequest().GetBody()), "also add tests") || len(st.GetResponse().GetEvents()) < 5 {
		t.Errorf("step: injected %q, body %s, %d events", st.GetInjected(), st.GetRequest().GetBody(), len(st.GetResponse().GetEvents()))
	}
	// 15 tokens used of 20: a second call crosses the budget, a third is refused.
	e.post(t, "/v1/messages", tok, msg("hi"))
	ans := e.post(t, "/v1/messages", tok, msg("hi"))
	if ans.status != 403 || !strings.Contains(ans.body, "over budget") {
		t.Errorf("over budget: %d %s", ans.status, ans.body)
	}
	r, _ := e.runs.Get(ctx, run.GetId())
	if r.GetState() != gatewayv1.RunState_RUN_STATE_OVER_BUDGET || r.GetSteps() != 2 {
		t.Errorf("run %v steps %d", r.GetState(), r.GetSteps())
	}
}

// TestTapeRecordsServedModel: a step keeps the model the request asked
// for and the one the answer says served it (an alias answered by a
// concrete model), for Messages and Responses.
func TestTapeRecordsServedModel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	if err := e.upstream.SetScript(scripted.Script{Default: &scripted.Answer{Text: "hi"},
		Serves: map[string]string{"claude-sonnet-4-5": "claude-sonnet-4-5-20250929", "gpt-5.5": "gpt-5.5-2026-01-01"}}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	run, tok := e.create(t, &gatewayv1.Run{})
	if ans := e.post(t, "/v1/messages", tok, msg("hi")); ans.status != 200 {
		t.Fatalf("%d %s", ans.status, ans.body)
	}
	if ans := e.post(t, "/v1/responses", tok, `{"model":"gpt-5.5","stream":true,"input":"hi"}`); ans.status != 200 {
		t.Fatalf("%d %s", ans.status, ans.body)
	}
	if ans := e.post(t, "/v1/messages", tok, `{"model":"claude-opus-4","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`); ans.status != 200 {
		t.Fatalf("%d %s", ans.status, ans.body)
	}
	for seq, want := range map[int32][2]string{1: {"claude-sonnet-4-5", "claude-sonnet-4-5-20250929"}, 2: {"gpt-5.5", "gpt-5.5-2026-01-01"}, 3: {"claude-opus-4", "claude-opus-4"}} {
		st, err := e.tapes.Step(ctx, run.GetId(), seq)
		if err != nil {
			t.Fatal(err)
		}
		if st.GetModel() != want[0] || st.GetServedModel() != want[1] {
			t.Errorf("step %d: model %q served %q, want %q served %q", seq, st.GetModel(), st.GetServedModel(), want[0], want[1])
		}
	}
}
