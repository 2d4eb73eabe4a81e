// Package tape records every model call of a run as a step, in a blob store.
//
// Consecutive requests of a run repeat the whole conversation so far, so each
// step's request body is stored as a delta on the body of the step appended
// before it: the length of their common prefix, the length of their common
// suffix, and the bytes in between. A tape then grows with the conversation,
// not with steps × conversation. Each step is one object,
// "<prefix><run>/<seq>.step", holding a version byte, the delta and the rest
// of the step as a gatewayv1.Step (body left out), flate-compressed.
//
// Reading a step rebuilds its body by following its chain of bases back to a
// step stored whole; Read rebuilds a whole tape in one pass.
package tape

import (
	"bytes"
	"compress/flate"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"google.golang.org/protobuf/proto"
)

// Store is the blob store tapes live in; platform/blob's Store satisfies it
// (through a small adapter if its signatures differ).
type Store interface {
	Put(ctx context.Context, key string, r io.Reader) error
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	Delete(ctx context.Context, key string) error
}

// ErrNotFound is returned for a step that is not on the tape.
var ErrNotFound = errors.New("tape: step not found")

// recordVersion 1: flate with dictionary below. Changing the dictionary
// needs a new version (old tapes must stay readable).
const recordVersion = 1

// dictionary primes the compressor of each step with the strings every
// answer repeats (SSE event JSON of the three protocols), so that small steps
// compress well on their own.
var dictionary = []byte(`POST/v1/messages/v1/responses/v1/chat/completionsanthropic-versionanthropic-beta2023-06-01text/event-streamcontent-type` +
	`{"type":"message_start","message":{"id":"msg_","type":"message","role":"assistant","model":"claude-","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":` +
	`,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}` +
	`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` +
	`{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_","name":"","input":{}}}` +
	`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` +
	`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"` +
	`{"type":"content_block_stop","index":0}{"type":"content_block_stop","index":1}` +
	`{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":` +
	`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":` +
	`{"type":"message_stop"}message_startcontent_block_startcontent_block_deltacontent_block_stopmessage_deltamessage_stop` +
	`{"type":"response.created","sequence_number":0,"response":{"id":"resp_","object":"response","created_at":,"status":"in_progress","model":"gpt-","output":[]}}` +
	`{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"type":"message","id":"msg_","role":"assistant","status":"in_progress","content":[]}}` +
	`{"type":"response.output_text.delta","sequence_number":2,"item_id":"msg_","output_index":0,"content_index":0,"delta":"` +
	`{"type":"response.output_item.done","sequence_number":3,"output_index":0,"item":{"type":"function_call","id":"fc_","call_id":"call_","name":"exec_command","arguments":"{\"cmd\":\"` +
	`{"type":"message","id":"msg_","role":"assistant","status":"completed","content":[{"type":"output_text","text":"","annotations":[]}]}` +
	`{"type":"response.completed","sequence_number":4,"response":{"id":"resp_","object":"response","status":"completed","output":[` +
	`"usage":{"input_tokens":,"input_tokens_details":{"cached_tokens":0},"output_tokens":,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":}}}` +
	`{"id":"chatcmpl-","object":"chat.completion.chunk","created":,"model":"","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` +
	`{"tool_calls":[{"index":0,"id":"call_","type":"function","function":{"name":"bash","arguments":"{\"command\":\"` +
	`"finish_reason":"tool_calls""finish_reason":"stop""choices":[],"usage":{"prompt_tokens":,"completion_tokens":,"total_tokens":,"prompt_tokens_details":{"cached_tokens":0}}}[DONE]`)

// Tapes appends and reads tapes.
type Tapes struct {
	store    Store
	prefix   string
	notFound error

	mu   sync.Mutex
	runs map[string]*runState
	// bodies keeps, for a few runs, the last request body Step rebuilt:
	// a replay reads a tape's steps in order, and each step's body is a
	// delta on the one before, so the next Step loads one object instead
	// of the whole chain back to a body stored whole (seq objects at step
	// seq). A rebuilt body never changes (SetTreeHash keeps the delta).
	bodies map[string]cachedBody
}

// cachedBody is a rebuilt request body of a run's step.
type cachedBody struct {
	seq  int32
	body []byte
}

// maxCachedBodies bounds Tapes.bodies (one body, about 100 kB for a
// Claude Code run, per run being replayed).
const maxCachedBodies = 64

// runState is the last body appended to a run's tape in this process, the
// base of the next step's delta. Appends of one run are serialised by mu.
type runState struct {
	mu       sync.Mutex
	lastSeq  int32
	lastBody []byte
}

// New returns Tapes over store with object keys under prefix (e.g.
// "tapes/"). storeNotFound is the store's not-found error (blob.ErrNotFound),
// matched with errors.Is.
func New(store Store, prefix string, storeNotFound error) *Tapes {
	return &Tapes{store: store, prefix: prefix, notFound: storeNotFound, runs: map[string]*runState{}, bodies: map[string]cachedBody{}}
}

func (t *Tapes) key(run string, seq int32) string {
	return fmt.Sprintf("%s%s/%08d.step", t.prefix, run, seq)
}

func (t *Tapes) state(run string) *runState {
	t.mu.Lock()
	defer t.mu.Unlock()
	rs, ok := t.runs[run]
	if !ok {
		rs = &runState{}
		t.runs[run] = rs
	}
	return rs
}

// Forget drops the in-memory delta base of run (call when a run ends). The
// next append of run, if any, is stored whole.
func (t *Tapes) Forget(run string) {
	t.mu.Lock()
	delete(t.runs, run)
	delete(t.bodies, run)
	t.mu.Unlock()
}

// cached returns the body of run's step seq if it is the one kept.
func (t *Tapes) cached(run string, seq int32) ([]byte, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.bodies[run]
	if !ok || c.seq != seq {
		return nil, false
	}
	return c.body, true
}

// keep makes body (not modified after) the kept body of run.
func (t *Tapes) keep(run string, seq int32, body []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.bodies[run]; !ok && len(t.bodies) >= maxCachedBodies {
		for k := range t.bodies {
			delete(t.bodies, k)
			break
		}
	}
	t.bodies[run] = cachedBody{seq: seq, body: body}
}

// Append stores step (its Seq set) on run's tape. step is not modified.
func (t *Tapes) Append(ctx context.Context, run string, step *gatewayv1.Step) error {
	if step.GetSeq() <= 0 {
		return fmt.Errorf("tape: append: seq %d", step.GetSeq())
	}
	body := step.GetRequest().GetBody()
	rs := t.state(run)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var d delta
	if rs.lastSeq > 0 {
		d = diff(rs.lastBody, body)
		d.base = rs.lastSeq
	} else {
		d = delta{mid: body}
	}
	rec, err := encode(step, d)
	if err != nil {
		return err
	}
	if err := t.store.Put(ctx, t.key(run, step.GetSeq()), bytes.NewReader(rec)); err != nil {
		return fmt.Errorf("tape: put step %d of %s: %w", step.GetSeq(), run, err)
	}
	rs.lastSeq = step.GetSeq()
	rs.lastBody = append(rs.lastBody[:0], body...)
	return nil
}

// delta is a body as prefix of the base + mid + suffix of the base.
type delta struct {
	base           int32 // 0: no base, mid is the whole body
	prefix, suffix int
	mid            []byte
}

func diff(prev, cur []byte) delta {
	n := min(len(prev), len(cur))
	p := 0
	for p < n && prev[p] == cur[p] {
		p++
	}
	s := 0
	for s < n-p && prev[len(prev)-1-s] == cur[len(cur)-1-s] {
		s++
	}
	return delta{prefix: p, suffix: s, mid: cur[p : len(cur)-s]}
}

func (d delta) apply(base []byte) ([]byte, error) {
	if d.prefix+d.suffix > len(base) {
		return nil, fmt.Errorf("tape: delta %d+%d exceeds base of %d bytes", d.prefix, d.suffix, len(base))
	}
	out := make([]byte, 0, d.prefix+len(d.mid)+d.suffix)
	out = append(out, base[:d.prefix]...)
	out = append(out, d.mid...)
	return append(out, base[len(base)-d.suffix:]...), nil
}

func encode(step *gatewayv1.Step, d delta) ([]byte, error) {
	s := proto.Clone(step).(*gatewayv1.Step)
	if s.Request != nil {
		s.Request.Body = nil
	}
	meta, err := proto.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("tape: encode step: %w", err)
	}
	var raw []byte
	raw = append(raw, recordVersion)
	raw = binary.AppendUvarint(raw, uint64(d.base))
	raw = binary.AppendUvarint(raw, uint64(d.prefix))
	raw = binary.AppendUvarint(raw, uint64(d.suffix))
	raw = binary.AppendUvarint(raw, uint64(len(d.mid)))
	raw = append(raw, d.mid...)
	raw = append(raw, meta...)

	var buf bytes.Buffer
	zw, _ := flate.NewWriterDict(&buf, flate.BestCompression, dictionary)
	if _, err := zw.Write(raw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// record is a decoded step object: the step without its body, and the delta.
type record struct {
	step *gatewayv1.Step
	d    delta
}

func decode(data []byte) (record, error) {
	raw, err := io.ReadAll(flate.NewReaderDict(bytes.NewReader(data), dictionary))
	if err != nil {
		return record{}, fmt.Errorf("tape: corrupt step: %w", err)
	}
	if len(raw) == 0 || raw[0] != recordVersion {
		return record{}, errors.New("tape: corrupt step: unknown version")
	}
	r := bytes.NewReader(raw[1:])
	var vals [4]uint64
	for i := range vals {
		if vals[i], err = binary.ReadUvarint(r); err != nil {
			return record{}, fmt.Errorf("tape: corrupt step: %w", err)
		}
	}
	if vals[3] > uint64(r.Len()) {
		return record{}, errors.New("tape: corrupt step: truncated")
	}
	mid := make([]byte, vals[3])
	_, _ = io.ReadFull(r, mid)
	rest, _ := io.ReadAll(r)
	s := &gatewayv1.Step{}
	if err := proto.Unmarshal(rest, s); err != nil {
		return record{}, fmt.Errorf("tape: corrupt step: %w", err)
	}
	return record{step: s, d: delta{base: int32(vals[0]), prefix: int(vals[1]), suffix: int(vals[2]), mid: mid}}, nil
}

func (t *Tapes) load(ctx context.Context, run string, seq int32) (record, error) {
	rc, err := t.store.Get(ctx, t.key(run, seq))
	if err != nil {
		if t.notFound != nil && errors.Is(err, t.notFound) {
			return record{}, fmt.Errorf("%w: %s step %d", ErrNotFound, run, seq)
		}
		return record{}, fmt.Errorf("tape: get step %d of %s: %w", seq, run, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return record{}, fmt.Errorf("tape: read step %d of %s: %w", seq, run, err)
	}
	return decode(data)
}

// resolver rebuilds bodies, loading each record once.
type resolver struct {
	t      *Tapes
	ctx    context.Context
	run    string
	recs   map[int32]record
	bodies map[int32][]byte
}

func (r *resolver) record(seq int32) (record, error) {
	if rec, ok := r.recs[seq]; ok {
		return rec, nil
	}
	rec, err := r.t.load(r.ctx, r.run, seq)
	if err != nil {
		return record{}, err
	}
	r.recs[seq] = rec
	return rec, nil
}

func (r *resolver) body(seq int32) ([]byte, error) {
	// Walk the chain back to a whole body, then apply deltas forward.
	var chain []int32
	cur := seq
	for {
		if _, ok := r.bodies[cur]; ok {
			break
		}
		if cur != seq {
			if b, ok := r.t.cached(r.run, cur); ok {
				r.bodies[cur] = b
				break
			}
		}
		rec, err := r.record(cur)
		if err != nil {
			return nil, err
		}
		chain = append(chain, cur)
		if rec.d.base == 0 {
			break
		}
		if len(chain) > 1<<20 {
			return nil, errors.New("tape: corrupt step: base chain loops")
		}
		cur = rec.d.base
	}
	for i := len(chain) - 1; i >= 0; i-- {
		rec := r.recs[chain[i]]
		var b []byte
		if rec.d.base == 0 {
			b = rec.d.mid
		} else {
			var err error
			if b, err = rec.d.apply(r.bodies[rec.d.base]); err != nil {
				return nil, err
			}
		}
		r.bodies[chain[i]] = b
	}
	return r.bodies[seq], nil
}

func (r *resolver) step(seq int32) (*gatewayv1.Step, error) {
	rec, err := r.record(seq)
	if err != nil {
		return nil, err
	}
	body, err := r.body(seq)
	if err != nil {
		return nil, err
	}
	s := proto.Clone(rec.step).(*gatewayv1.Step)
	if s.Request == nil {
		s.Request = &gatewayv1.StepRequest{}
	}
	s.Request.Body = body
	return s, nil
}

func (t *Tapes) resolver(ctx context.Context, run string) *resolver {
	return &resolver{t: t, ctx: ctx, run: run, recs: map[int32]record{}, bodies: map[int32][]byte{}}
}

// Read returns steps 1..n of run's tape, rebuilt in full.
func (t *Tapes) Read(ctx context.Context, run string, n int32) ([]*gatewayv1.Step, error) {
	r := t.resolver(ctx, run)
	out := make([]*gatewayv1.Step, 0, n)
	for seq := int32(1); seq <= n; seq++ {
		s, err := r.step(seq)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// Step returns one step rebuilt in full. Its body is kept as the base of
// the next step's (the one after it is a delta on it, when one process
// recorded both).
func (t *Tapes) Step(ctx context.Context, run string, seq int32) (*gatewayv1.Step, error) {
	s, err := t.resolver(ctx, run).step(seq)
	if err != nil {
		return nil, err
	}
	t.keep(run, seq, s.Request.Body)
	s.Request.Body = bytes.Clone(s.Request.Body)
	return s, nil
}

// SetTreeHash records the work tree hash reported for step seq.
func (t *Tapes) SetTreeHash(ctx context.Context, run string, seq int32, hash string) error {
	rs := t.state(run)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rec, err := t.load(ctx, run, seq)
	if err != nil {
		return err
	}
	rec.step.TreeHash = hash
	data, err := encode(rec.step, rec.d)
	if err != nil {
		return err
	}
	if err := t.store.Put(ctx, t.key(run, seq), bytes.NewReader(data)); err != nil {
		return fmt.Errorf("tape: put step %d of %s: %w", seq, run, err)
	}
	return nil
}

// Delete removes steps 1..n of run's tape; missing steps are skipped.
func (t *Tapes) Delete(ctx context.Context, run string, n int32) error {
	t.Forget(run)
	for seq := int32(1); seq <= n; seq++ {
		if err := t.store.Delete(ctx, t.key(run, seq)); err != nil && (t.notFound == nil || !errors.Is(err, t.notFound)) {
			return fmt.Errorf("tape: delete step %d of %s: %w", seq, run, err)
		}
	}
	return nil
}
