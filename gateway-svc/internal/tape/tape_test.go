package tape_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/tape"
	"google.golang.org/protobuf/proto"
)

var errNotFound = errors.New("not found")

// memStore is a Store in memory that counts stored bytes.
type memStore struct {
	mu   sync.Mutex
	objs map[string][]byte
	gets int
}

func newMemStore() *memStore { return &memStore{objs: map[string][]byte{}} }

func (m *memStore) Put(_ context.Context, key string, r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.objs[key] = b
	m.mu.Unlock()
	return nil
}

func (m *memStore) Get(_ context.Context, key string) (io.ReadCloser, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gets++
	b, ok := m.objs[key]
	if !ok {
		return nil, errNotFound
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (m *memStore) Delete(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.objs[key]; !ok {
		return errNotFound
	}
	delete(m.objs, key)
	return nil
}

func (m *memStore) bytes() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, b := range m.objs {
		n += len(b)
	}
	return n
}

func step(seq int32, body string) *gatewayv1.Step {
	return &gatewayv1.Step{
		Seq:      seq,
		Provider: gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES,
		Request:  &gatewayv1.StepRequest{Method: "POST", Path: "/v1/messages", Headers: map[string]string{"anthropic-version": "2023-06-01"}, Body: []byte(body)},
		Response: &gatewayv1.StepResponse{Status: 200, Events: []*gatewayv1.SseEvent{{Event: "message_start", Data: fmt.Sprintf(`{"n":%d}`, seq), OffsetMs: 3}}},
		Usage:    &gatewayv1.Usage{InputTokens: int64(seq), OutputTokens: 1},
	}
}

func TestAppendReadRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newMemStore()
	tp := tape.New(st, "tapes/", errNotFound)
	bodies := []string{
		`{"messages":[{"role":"user","content":"hi"}],"tools":[1,2,3]}`,
		`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}],"tools":[1,2,3]}`,
		`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"user","content":"more"}],"tools":[1,2,3]}`,
		`{"totally":"different"}`,
		``,
		`{"messages":[]}`,
	}
	for i, b := range bodies {
		if err := tp.Append(ctx, "r1", step(int32(i+1), b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tp.SetTreeHash(ctx, "r1", 2, "abc123"); err != nil {
		t.Fatal(err)
	}
	// A fresh Tapes (another process) reads the same tape.
	got, err := tape.New(st, "tapes/", errNotFound).Read(ctx, "r1", int32(len(bodies)))
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range got {
		want := step(int32(i+1), bodies[i])
		if i == 1 {
			want.TreeHash = "abc123"
		}
		if !proto.Equal(s, want) {
			t.Errorf("step %d:\n got %v\nwant %v", i+1, s, want)
		}
	}
	one, err := tp.Step(ctx, "r1", 3)
	if err != nil || string(one.GetRequest().GetBody()) != bodies[2] {
		t.Errorf("Step(3) = %q, %v", one.GetRequest().GetBody(), err)
	}
	if _, err := tp.Step(ctx, "r1", 99); !errors.Is(err, tape.ErrNotFound) {
		t.Errorf("missing step: %v", err)
	}
	if _, err := tp.Step(ctx, "other", 1); !errors.Is(err, tape.ErrNotFound) {
		t.Errorf("other run: %v", err)
	}
}

// TestStepInOrderLoadsOneObject: a replay reads a tape's steps in order;
// each step's body is a delta on the one before, and the body Step
// rebuilt last is kept, so each Step loads its own object only (not the
// chain back to step 1), and what a caller does with a body it got does
// not change the next.
func TestStepInOrderLoadsOneObject(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ms := newMemStore()
	tp := tape.New(ms, "tapes/", errNotFound)
	var bodies []string
	conv := `{"messages":["hi"`
	for seq := int32(1); seq <= 6; seq++ {
		conv += fmt.Sprintf(`,"turn %d"`, seq)
		bodies = append(bodies, conv+"]}")
		if err := tp.Append(ctx, "r", step(seq, bodies[seq-1])); err != nil {
			t.Fatal(err)
		}
	}
	// Another process reads it (no delta base of its own).
	rd := tape.New(ms, "tapes/", errNotFound)
	ms.mu.Lock()
	ms.gets = 0
	ms.mu.Unlock()
	for seq := int32(1); seq <= 6; seq++ {
		s, err := rd.Step(ctx, "r", seq)
		if err != nil {
			t.Fatal(err)
		}
		if string(s.GetRequest().GetBody()) != bodies[seq-1] {
			t.Fatalf("step %d: %s, want %s", seq, s.GetRequest().GetBody(), bodies[seq-1])
		}
		for i := range s.Request.Body {
			s.Request.Body[i] = 'x'
		}
	}
	ms.mu.Lock()
	gets := ms.gets
	ms.mu.Unlock()
	if gets != 6 {
		t.Errorf("6 steps read in order loaded %d objects, want 6", gets)
	}
	// Out of order and again: still whole and right.
	for _, seq := range []int32{3, 6, 6, 1, 5} {
		s, err := rd.Step(ctx, "r", seq)
		if err != nil || string(s.GetRequest().GetBody()) != bodies[seq-1] {
			t.Fatalf("step %d: %s %v, want %s", seq, s.GetRequest().GetBody(), err, bodies[seq-1])
		}
	}
	// A deleted tape is gone, whatever was kept.
	if err := rd.Delete(ctx, "r", 6); err != nil {
		t.Fatal(err)
	}
	if _, err := rd.Step(ctx, "r", 6); !errors.Is(err, tape.ErrNotFound) {
		t.Errorf("step 6 after delete: %v, want ErrNotFound", err)
	}
}

func TestOutOfOrderAppend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newMemStore()
	tp := tape.New(st, "", errNotFound)
	for _, seq := range []int32{2, 1, 3} {
		if err := tp.Append(ctx, "r", step(seq, strings.Repeat("x", int(seq)*10))); err != nil {
			t.Fatal(err)
		}
	}
	got, err := tp.Read(ctx, "r", 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range got {
		if len(s.GetRequest().GetBody()) != (i+1)*10 {
			t.Errorf("step %d body %d bytes", i+1, len(s.GetRequest().GetBody()))
		}
	}
}

func TestCorruptStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newMemStore()
	tp := tape.New(st, "", errNotFound)
	_ = st.Put(ctx, "r/00000001.step", strings.NewReader("garbage"))
	if _, err := tp.Step(ctx, "r", 1); err == nil {
		t.Error("corrupt step read without error")
	}
}

// TestTapeGrowsWithConversation checks the delta encoding: 100 steps of a
// growing conversation cost about the final request, not 100 of them.
func TestTapeGrowsWithConversation(t *testing.T) {
	t.Parallel()
	st := newMemStore()
	tp := tape.New(st, "", errNotFound)
	final := conversation(t, tp, 100)
	ratio := float64(st.bytes()) / float64(len(final))
	t.Logf("tape %d bytes, final request %d bytes, ratio %.2f", st.bytes(), len(final), ratio)
	if ratio > 1.2 {
		t.Errorf("tape is %.2f× the final request, want ≤ 1.2×", ratio)
	}
}

// conversation appends n steps of a synthetic growing Anthropic conversation
// (tools first, messages growing, an answer per step) and returns the last
// request body.
func conversation(tb testing.TB, tp *tape.Tapes, n int) []byte {
	tb.Helper()
	tools := `"tools":[` + strings.Repeat(`{"name":"Bash","description":"Runs a shell command in the sandbox and returns its output.","input_schema":{"type":"object"}},`, 20) + `{"name":"Write"}]`
	var msgs []string
	msgs = append(msgs, `{"role":"user","content":[{"type":"text","text":"Please fix the failing tests in the repository."}]}`)
	var body []byte
	for i := 1; i <= n; i++ {
		body = []byte(`{"model":"claude-sonnet-4-5","max_tokens":32000,"system":[{"type":"text","text":"You are a coding agent."}],` + tools + `,"messages":[` + strings.Join(msgs, ",") + `],"stream":true}`)
		answer := fmt.Sprintf("Step %d: I will run command number %d to inspect file_%d.go and continue.", i, i, i)
		cmd := fmt.Sprintf(`go test ./pkg%d/...`, i)
		s := &gatewayv1.Step{
			Seq:     int32(i),
			Request: &gatewayv1.StepRequest{Method: "POST", Path: "/v1/messages", Body: body},
			Response: &gatewayv1.StepResponse{Status: 200, Events: []*gatewayv1.SseEvent{
				{Event: "message_start", Data: fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_%024d","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"usage":{"input_tokens":%d,"output_tokens":1}}}`, i, len(body)/4), OffsetMs: 1},
				{Event: "content_block_delta", Data: fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, answer), OffsetMs: 2},
				{Event: "content_block_delta", Data: fmt.Sprintf(`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":%q}}`, `{"command":"`+cmd+`"}`), OffsetMs: 3},
				{Event: "message_delta", Data: `{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":40}}`, OffsetMs: 4},
				{Event: "message_stop", Data: `{"type":"message_stop"}`, OffsetMs: 4},
			}},
			Usage:     &gatewayv1.Usage{InputTokens: int64(len(body) / 4), OutputTokens: 40},
			LatencyMs: 5,
			Time:      nil,
		}
		if err := tp.Append(context.Background(), "conv", s); err != nil {
			tb.Fatal(err)
		}
		msgs = append(msgs,
			fmt.Sprintf(`{"role":"assistant","content":[{"type":"text","text":%q},{"type":"tool_use","id":"toolu_%024d","name":"Bash","input":{"command":%q}}]}`, answer, i, cmd),
			fmt.Sprintf(`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_%024d","content":"ok  \tgithub.com/acme/pkg%d\t0.%03ds\n"}]}`, i, i, i))
	}
	return body
}

type fakeIndex struct {
	mu      sync.Mutex
	created map[string]time.Time
	steps   map[string]int32
}

func (f *fakeIndex) TapesBefore(_ context.Context, t time.Time) (map[string]int32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int32{}
	for run, c := range f.created {
		if c.Before(t) {
			out[run] = f.steps[run]
		}
	}
	return out, nil
}

func (f *fakeIndex) ForgetTape(_ context.Context, run string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.created, run)
	return nil
}

func TestSweeper(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := newMemStore()
	tp := tape.New(st, "", errNotFound)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	idx := &fakeIndex{created: map[string]time.Time{"old": start, "new": start.Add(20 * 24 * time.Hour)}, steps: map[string]int32{"old": 2, "new": 1}}
	for _, s := range []*gatewayv1.Step{step(1, "a"), step(2, "ab")} {
		_ = tp.Append(ctx, "old", s)
	}
	_ = tp.Append(ctx, "new", step(1, "x"))
	sw := &tape.Sweeper{Tapes: tp, Index: idx, Days: 30, Now: func() time.Time { return now }}

	now = start.Add(29 * 24 * time.Hour)
	if n, err := sw.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("day 29: swept %d, %v", n, err)
	}
	now = start.Add(31 * 24 * time.Hour)
	if n, err := sw.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("day 31: swept %d, %v", n, err)
	}
	if _, err := tp.Step(ctx, "old", 1); !errors.Is(err, tape.ErrNotFound) {
		t.Errorf("old tape still readable: %v", err)
	}
	if _, err := tp.Step(ctx, "new", 1); err != nil {
		t.Errorf("new tape gone: %v", err)
	}
}

func BenchmarkTapeBytes100Steps(b *testing.B) {
	for b.Loop() {
		st := newMemStore()
		tp := tape.New(st, "", errNotFound)
		final := conversation(b, tp, 100)
		b.ReportMetric(float64(st.bytes()), "tape-bytes")
		b.ReportMetric(float64(len(final)), "final-request-bytes")
		b.ReportMetric(float64(st.bytes())/float64(len(final)), "ratio")
	}
}
