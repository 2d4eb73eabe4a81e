package dataplane_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/dataplane"
	"github.com/hangar-dev/hangar/gateway-svc/internal/tape"
	"github.com/hangar-dev/hangar/platform/blob"
)

// heldStore is a directory blob store whose writes under one key prefix
// wait until they are let go, and which logs the tape objects read and
// written in order.
type heldStore struct {
	*blob.Dir
	mu      sync.Mutex
	hold    string        // key prefix whose Puts wait ("" none)
	holding chan string   // a held Put's key, as it starts waiting
	release chan struct{} // closed: held Puts go on
	log     []string
}

func (s *heldStore) note(ev string) {
	s.mu.Lock()
	s.log = append(s.log, ev)
	s.mu.Unlock()
}

func (s *heldStore) Put(ctx context.Context, key string, r io.Reader) error {
	s.mu.Lock()
	hold := s.hold != "" && strings.HasPrefix(key, s.hold)
	s.mu.Unlock()
	if hold {
		s.holding <- key
		<-s.release
	}
	err := s.Dir.Put(ctx, key, r)
	s.note("put " + key)
	return err
}

func (s *heldStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	s.note("get " + key)
	return s.Dir.Get(ctx, key)
}

// TestReplayedAnswerBeforeItsTaping: a replayed step's answer goes out
// whole, with its length, before the step is taped (the harness runs its
// tools meanwhile), and the run's next call, on another connection, waits
// until that step is on the tape before it is served.
func TestReplayedAnswerBeforeItsTaping(t *testing.T) {
	t.Parallel()
	dir, err := blob.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := &heldStore{Dir: dir, holding: make(chan string, 4), release: make(chan struct{})}
	tapes := tape.New(store, "tapes/", blob.ErrNotFound)
	e := newEnv(t, func(o *dataplane.Options) { o.Tapes = tapes })
	rec, tok := e.create(t, &gatewayv1.Run{Session: "ses-rec"})
	for i := 1; i <= 2; i++ {
		if ans := e.post(t, "/v1/messages", tok, msg("step "+strconv.Itoa(i))); ans.status != http.StatusOK {
			t.Fatalf("record %d: %d %s", i, ans.status, ans.body)
		}
	}
	rp, rtok := e.create(t, &gatewayv1.Run{Session: "ses-rp", Replay: &gatewayv1.Replay{TapeRun: rec.GetId(), AtSeq: 2,
		AfterPrefix: gatewayv1.AfterPrefix_AFTER_PREFIX_STOP, TreeCheckAtEnd: true}})
	store.mu.Lock()
	store.hold = "tapes/" + rp.GetId() + "/"
	store.mu.Unlock()

	// Step 1's answer arrives whole while its taping is held.
	first := e.postAsync(t, rtok, msg("step 1"))
	held := wait(t, store.holding, "step 1's taping")
	ans := wait(t, first, "step 1's answer")
	if ans.status != http.StatusOK || !strings.Contains(ans.body, "message_stop") || ans.header.Get("x-hangar-replayed") != "true" ||
		ans.header.Get("Content-Length") != strconv.Itoa(len(ans.body)) {
		t.Fatalf("step 1: %d %v %s", ans.status, ans.header, ans.body)
	}
	// Step 2 comes on a connection of its own and waits for the taping.
	other := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(other.CloseIdleConnections)
	second := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, e.data.URL+"/v1/messages", strings.NewReader(msg("step 2")))
		req.Header.Set("x-api-key", rtok)
		resp, err := other.Do(req)
		if err != nil {
			second <- answer{}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		second <- answer{resp.StatusCode, string(b), resp.Header}
	}()
	close(store.release)
	if ans := wait(t, second, "step 2's answer"); ans.status != http.StatusOK || !strings.Contains(ans.body, "message_stop") {
		t.Fatalf("step 2: %d %s", ans.status, ans.body)
	}
	// The request after the prefix matches; the run stops.
	if ans := e.post(t, "/v1/messages", rtok, msg("step 3")); ans.status != http.StatusForbidden {
		t.Fatalf("step 3: %d %s, want 403", ans.status, ans.body)
	}
	store.mu.Lock()
	log := append([]string(nil), store.log...)
	store.mu.Unlock()
	// Step 2 read its taped request only after step 1 was on the tape.
	taped1, read2 := -1, -1
	for i, ev := range log {
		switch {
		case ev == "put "+held:
			taped1 = i
		case read2 < 0 && strings.HasPrefix(ev, "get tapes/"+rec.GetId()+"/00000002"):
			read2 = i
		}
	}
	if taped1 < 0 || read2 < 0 || read2 < taped1 {
		t.Errorf("step 1 taped at %d, step 2's tape read at %d: the next call did not wait\n%s", taped1, read2, strings.Join(log, "\n"))
	}
	steps, err := tapes.Read(context.Background(), rp.GetId(), 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range steps[:2] {
		if !st.GetReplayed() || st.GetLatencyMs() < 0 {
			t.Errorf("step %d: replayed %v latency %d", i+1, st.GetReplayed(), st.GetLatencyMs())
		}
	}
}

// TestReplayPassesOverWebFetchSideCalls: Claude Code's WebFetch asks a
// small model about the page it fetched, a call of the run taped between
// the step that called WebFetch and the one carrying its output. A
// replay's sealed sandbox fetches nothing, so its CLI makes no such call:
// its next request is checked against the tape's after the side call
// (the WebFetch output answered from the tape), the side call counts as
// replayed, and the run's later steps are the tape's one further on. A
// replay that does make the side call matches it; a request that
// differs otherwise is a divergence at its own step.
func TestReplayPassesOverWebFetchSideCalls(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const tools = `"tools":[{"name":"WebFetch","input_schema":{"type":"object"}}]`
	main1 := func(prompt string) string {
		return `{"model":"claude-sonnet-4-5","stream":true,` + tools + `,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	}
	side := `{"model":"claude-haiku-4-5","stream":true,"messages":[{"role":"user","content":"page text\n\nwhat does it say"}]}`
	main2 := func(id, result string) string {
		return `{"model":"claude-sonnet-4-5","stream":true,` + tools + `,"messages":[{"role":"user","content":"fetch a page"},` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"` + id + `","name":"WebFetch","input":{"url":"https://10.0.0.1/p","prompt":"what does it say"}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"` + id + `",` + result + `}]}]}`
	}
	rec, tok := e.create(t, &gatewayv1.Run{Session: "ses-rec"})
	if ans := e.post(t, "/v1/messages", tok, main1("fetch a page")); ans.status != http.StatusOK || !strings.Contains(ans.body, "WebFetch") {
		t.Fatalf("step 1: %d %s", ans.status, ans.body)
	}
	id := regexp.MustCompile(`toolu_[0-9A-Za-z]+`).FindString(e.post(t, "/v1/messages", tok, side).body)
	step1, err := e.tapes.Step(context.Background(), rec.GetId(), 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range step1.GetResponse().GetEvents() {
		if m := regexp.MustCompile(`toolu_[0-9A-Za-z]+`).FindString(ev.GetData()); m != "" {
			id = m
		}
	}
	if ans := e.post(t, "/v1/messages", tok, main2(id, `"content":"hello there"`)); ans.status != http.StatusOK {
		t.Fatalf("step 3: %d %s", ans.status, ans.body)
	}
	replayRun := func(name string) (string, string) {
		r, rtok := e.create(t, &gatewayv1.Run{Session: name, Replay: &gatewayv1.Replay{TapeRun: rec.GetId(), AtSeq: 3,
			AfterPrefix: gatewayv1.AfterPrefix_AFTER_PREFIX_STOP, TreeCheckAtEnd: true}})
		return r.GetId(), rtok
	}
	state := func(run string) (*gatewayv1.Divergence, int32) {
		d, n, err := e.runs.Divergence(context.Background(), run)
		if err != nil {
			t.Fatal(err)
		}
		return d, n
	}

	// Sealed: the fetch failed, no side call.
	run, rtok := replayRun("ses-sealed")
	for i, body := range []string{main1("fetch a page"), main2(id, `"content":"fetch failed: connect ECONNREFUSED 10.0.0.1:443","is_error":true`)} {
		if ans := e.post(t, "/v1/messages", rtok, body); ans.status != http.StatusOK || ans.header.Get("x-hangar-replayed") != "true" {
			t.Fatalf("sealed replay, request %d: %d %s", i+1, ans.status, ans.body)
		}
	}
	if d, n := state(run); d != nil || n != 3 {
		t.Errorf("sealed replay: divergence %v, %d steps replayed, want none and 3", d, n)
	}
	// The request after the prefix is the tape's fourth (there is none:
	// the run ended), not its third.
	if ans := e.post(t, "/v1/messages", rtok, main2(id, `"content":"x"`)); !strings.Contains(ans.body, "step 4") {
		t.Errorf("sealed replay, the request after the prefix: %d %s, want a divergence at step 4", ans.status, ans.body)
	}

	// Not sealed: the CLI makes the side call, which is the tape's step 2.
	run, rtok = replayRun("ses-open")
	for i, body := range []string{main1("fetch a page"), side, main2(id, `"content":"hello there"`)} {
		if ans := e.post(t, "/v1/messages", rtok, body); ans.status != http.StatusOK || ans.header.Get("x-hangar-replayed") != "true" {
			t.Fatalf("open replay, request %d: %d %s", i+1, ans.status, ans.body)
		}
	}
	if d, n := state(run); d != nil || n != 3 {
		t.Errorf("open replay: divergence %v, %d steps replayed, want none and 3", d, n)
	}

	// A trial forked at the step that called WebFetch (its side call is
	// the tape's step 2): the model is shown the tape's WebFetch output,
	// from the request after the side call.
	before := e.gate.calls.Load()
	_, ttok := e.create(t, &gatewayv1.Run{Session: "ses-trial", Replay: &gatewayv1.Replay{TapeRun: rec.GetId(), AtSeq: 1, OutsideOnly: true}})
	if ans := e.post(t, "/v1/messages", ttok, main2(id, `"content":"fetch failed: connect ECONNREFUSED 10.0.0.1:443","is_error":true`)); ans.status != http.StatusOK {
		t.Fatalf("trial: %d %s", ans.status, ans.body)
	}
	if n := e.gate.calls.Load(); n != before+1 {
		t.Fatalf("the trial's call made %d upstream calls, want 1", n-before)
	}
	e.gate.mu.Lock()
	sent := e.gate.order[len(e.gate.order)-1]
	e.gate.mu.Unlock()
	if !strings.Contains(sent, "hello there") || strings.Contains(sent, "ECONNREFUSED") || strings.Contains(sent, "is_error") {
		t.Errorf("the upstream got %s: want the tape's WebFetch output", sent)
	}

	// Another request where the side call was: a divergence at step 2.
	run, rtok = replayRun("ses-other")
	e.post(t, "/v1/messages", rtok, main1("fetch a page"))
	if ans := e.post(t, "/v1/messages", rtok, main1("another prompt")); ans.status != http.StatusForbidden || !strings.Contains(ans.body, "step 2 (model)") {
		t.Errorf("another request: %d %s, want a model divergence at step 2", ans.status, ans.body)
	}
	if d, _ := state(run); d.GetSeq() != 2 {
		t.Errorf("another request: divergence %v, want at step 2", d)
	}
}
