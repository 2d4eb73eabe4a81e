package dataplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/replay"
	"github.com/hangar-dev/hangar/gateway-svc/internal/tape"
	"google.golang.org/protobuf/proto"
)

// replayStep answers a call of a replaying run from the tape when its step
// is in the replayed prefix. It reports whether it answered (or refused);
// false means: go live. prior is the run's divergence so far.
func (h *Handler) replayStep(w http.ResponseWriter, r *http.Request, c *call, rp *gatewayv1.Replay, prior *gatewayv1.Divergence) bool {
	ctx := r.Context()
	if prior != nil {
		// Diverged earlier and still running: the run went live.
		return false
	}
	if seq := c.tapeSeq; seq > rp.GetAtSeq()+1 || seq == rp.GetAtSeq()+1 && rp.GetAfterPrefix() != gatewayv1.AfterPrefix_AFTER_PREFIX_STOP {
		// Past the prefix and its checked request: live. (A live run's
		// request after the prefix was checked by the clause below only
		// when it stops; going live, it is compared here first.)
		if seq == rp.GetAtSeq()+1 {
			if taped, d, failed := h.checkAligned(ctx, w, c, rp); failed {
				return true
			} else if d != nil && taped != nil {
				return h.diverged(ctx, w, c, rp, d)
			}
		}
		return false
	}
	taped, d, failed := h.checkAligned(ctx, w, c, rp)
	if failed {
		return true
	}
	if d != nil {
		return h.diverged(ctx, w, c, rp, d)
	}
	if c.tapeSeq > rp.GetAtSeq() {
		// The request after the prefix matched; a strict check stops here.
		reason := fmt.Sprintf("replay of %s ended after step %d", rp.GetTapeRun(), rp.GetAtSeq())
		h.stop(ctx, c, reason)
		writeError(w, c.p, http.StatusForbidden, errPermission, "hangar gateway: "+reason)
		return true
	}

	// Answer from the tape. The answer is whole in hand, so it goes out
	// in one write with its length: the harness has all of it (and runs
	// its tools) once the last byte arrives, not when the handler
	// returns. The step is taped after that, while the tools run (two
	// fsynced writes, the run's journal and the tape: 6-20 ms that every
	// replayed step waited for before its answer); the run's next call
	// waits for it (recording), so it still finds the tape current.
	resp := proto.Clone(taped.GetResponse()).(*gatewayv1.StepResponse)
	c.step.Replayed = true
	c.step.Response = resp
	c.step.Usage = taped.GetUsage()
	// The progress is counted before the answer: a replay-svc that reads
	// it once the harness is done sees every answered step.
	if err := h.o.Runs.ReplayProgress(ctx, c.run.GetId()); err != nil {
		h.o.Logger.LogAttrs(ctx, slog.LevelError, "replay progress not recorded", slog.Any("error", err))
	}
	body := replayedBody(resp)
	done := h.recording(c.run.GetId())
	defer done()
	defer h.finish(c)
	for k, v := range resp.GetHeaders() {
		if k == "content-type" {
			w.Header().Set("Content-Type", v)
		}
	}
	w.Header().Set("x-hangar-replayed", "true")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	status := int(resp.GetStatus())
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
	_ = http.NewResponseController(w).Flush()
	c.answered = h.o.Now()
	return true
}

// replayedBody is a taped answer as the harness gets it: the body, or the
// SSE events.
func replayedBody(resp *gatewayv1.StepResponse) []byte {
	if len(resp.GetEvents()) == 0 {
		return resp.GetBody()
	}
	var sb strings.Builder
	for _, ev := range resp.GetEvents() {
		if ev.GetEvent() != "" {
			sb.WriteString("event: " + ev.GetEvent() + "\n")
		}
		for _, line := range strings.Split(ev.GetData(), "\n") {
			sb.WriteString("data: " + line + "\n")
		}
		sb.WriteString("\n")
	}
	return []byte(sb.String())
}

// recording marks a step of run as being taped after its answer; the
// returned function ends it. awaitRecorded waits for it.
func (h *Handler) recording(run string) func() {
	ch := make(chan struct{})
	h.taping.Store(run, ch)
	return func() {
		h.taping.CompareAndDelete(run, ch)
		close(ch)
	}
}

// awaitRecorded waits until the run's previous step, answered before it
// was taped (a replayed step), is on the tape, so every call finds its
// run's tape and counters current, as when steps were taped before their
// answer. A harness's next call comes after its tools ran, so this
// rarely waits. (It covers this process: a call that reaches another
// replica within those milliseconds does not wait.)
func (h *Handler) awaitRecorded(ctx context.Context, run string) {
	v, ok := h.taping.Load(run)
	if !ok {
		return
	}
	select {
	case <-v.(chan struct{}):
	case <-ctx.Done():
	}
}

// maxSideCalls bounds how many taped steps in a row a replay passes over
// as the side calls of one call with outside effects.
const maxSideCalls = 4

// checkAligned is checkStep at the call's step of the tape, passing over
// the taped side calls of a call with outside effects (sideCall) that
// the replay's harness does not make: Claude Code's WebFetch asks a
// small model about the page it fetched, a model call of the run's own,
// taped between the step that called WebFetch and the one that carries
// its output; a replay's sealed sandbox fetches nothing, so its CLI makes
// no such call, and its next request is the tape's after the side call.
// When the request matches a taped step after such side calls, the run
// records the passed-over steps (SkipTape) and the call stands for that
// step; otherwise the divergence is the one at the call's own step.
func (h *Handler) checkAligned(ctx context.Context, w http.ResponseWriter, c *call, rp *gatewayv1.Replay) (*gatewayv1.Step, *gatewayv1.Divergence, bool) {
	taped, d, failed := h.checkStep(ctx, w, c, rp, c.tapeSeq)
	if failed || d == nil || taped == nil || d.GetKind() != gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL {
		return taped, d, failed
	}
	for skip := int32(1); skip <= maxSideCalls && h.sideCall(ctx, rp, c.tapeSeq+skip-1); skip++ {
		t := c.tapeSeq + skip
		probe := *c
		probe.tapeSeq = t
		if c.tree == nil && h.hashAt(rp, &probe) {
			// The step this call stands for is hashed (the end of a
			// prefix checked at its end).
			h.startTree(ctx, c)
		}
		taped2, d2, failed2 := h.checkStep(ctx, w, c, rp, t)
		if failed2 {
			return nil, nil, true
		}
		if taped2 == nil {
			break
		}
		if d2 == nil || d2.GetKind() != gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL {
			if err := h.o.Runs.SkipTape(ctx, c.run.GetId(), skip); err != nil {
				h.o.Logger.LogAttrs(ctx, slog.LevelError, "taped side calls not passed over", slog.Any("error", err))
				return taped, d, false
			}
			c.tapeSeq = t
			return taped2, d2, false
		}
	}
	return taped, d, false
}

// sideCall reports whether taped step t is a side call of a call with
// outside effects (replay.OutsideCall): an earlier step's answer made the
// call, and neither step t's request nor any request between carries its
// output (the tool, still running, made the request itself).
func (h *Handler) sideCall(ctx context.Context, rp *gatewayv1.Replay, t int32) bool {
	cur, err := h.o.Tapes.Step(ctx, rp.GetTapeRun(), t)
	if err != nil {
		return false
	}
	carries := func(st *gatewayv1.Step, id string) bool {
		return bytes.Contains(st.GetRequest().GetBody(), []byte(`"`+id+`"`))
	}
	between := []*gatewayv1.Step{cur}
	for j := t - 1; j >= max(1, t-maxSideCalls); j-- {
		st, err := h.o.Tapes.Step(ctx, rp.GetTapeRun(), j)
		if err != nil {
			return false
		}
		for _, tc := range toolCalls(st.GetProvider(), st.GetResponse()) {
			if tc.GetId() == "" || !replay.OutsideCall(tc.GetToolName(), tc.GetInputJson()) {
				continue
			}
			pending := true
			for _, b := range between {
				if carries(b, tc.GetId()) {
					pending = false
				}
			}
			if pending {
				return true
			}
		}
		between = append(between, st)
	}
	return false
}

// checkStep compares the call's request with step seq of the tape. It
// returns the taped step (nil when the tape has none), the divergence (nil
// when clean) and whether it answered the call itself (the tape was
// unreadable).
func (h *Handler) checkStep(ctx context.Context, w http.ResponseWriter, c *call, rp *gatewayv1.Replay, seq int32) (*gatewayv1.Step, *gatewayv1.Divergence, bool) {
	taped, err := h.o.Tapes.Step(ctx, rp.GetTapeRun(), seq)
	switch {
	case errors.Is(err, tape.ErrNotFound):
		return nil, &gatewayv1.Divergence{Kind: gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL,
			Detail: fmt.Sprintf("the tape of %s has no step %d: the run made no call there", rp.GetTapeRun(), seq)}, false
	case err != nil:
		h.o.Logger.LogAttrs(ctx, slog.LevelError, "tape read failed", slog.String("tape", rp.GetTapeRun()), slog.Any("error", err))
		c.failure = "tape unreadable"
		writeError(w, c.p, http.StatusServiceUnavailable, errAPI, "hangar gateway: the replayed tape is unreadable")
		return nil, nil, true
	case taped.GetRequest().GetPath() != c.path:
		return taped, &gatewayv1.Divergence{Kind: gatewayv1.DivergenceKind_DIVERGENCE_KIND_MODEL, Detail: "request endpoint differs",
			Expected: taped.GetRequest().GetPath(), Actual: c.path}, false
	}
	canon := replay.Canon{TapeSession: h.tapeSession(ctx, rp.GetTapeRun()), Session: c.run.GetSession()}
	if d := replay.CompareCanon(c.p, canon, taped.GetRequest().GetBody(), c.step.Request.Body); d != nil {
		return taped, d, false
	}
	// The request matches; the work tree the tools left must too.
	h.awaitTree(c)
	return taped, replay.CompareTree(taped.GetTreeHash(), c.step.TreeHash), false
}

// answerFromTape returns body with the outputs of the prefix's tool calls
// with outside effects (replay.OutsideEffect) replaced by the tape's: the
// taped request after the prefix holds every output of the prefix. A run
// that only continues a prefix (outside_only: a trial, its own steps
// counted from 1) reads that request whatever its step.
func (h *Handler) answerFromTape(ctx context.Context, c *call, rp *gatewayv1.Replay, body []byte) []byte {
	seq := c.tapeSeq
	if rp.GetOutsideOnly() {
		seq = rp.GetAtSeq() + 1
	}
	first := min(seq, rp.GetAtSeq()+1)
	if first == rp.GetAtSeq()+1 {
		first = h.outputsStep(ctx, rp)
	}
	for _, n := range []int32{first, min(seq, rp.GetAtSeq())} {
		if n <= 0 {
			continue
		}
		taped, err := h.o.Tapes.Step(ctx, rp.GetTapeRun(), n)
		if err != nil {
			continue
		}
		out, _ := replay.AnswerFromTape(c.p, taped.GetRequest().GetBody(), body)
		return out
	}
	return body
}

// outputsStep is the taped step whose request carries the outputs of the
// prefix's calls: at_seq+1, or the step after the side calls taped there
// (a fork at the step that called WebFetch: its side call is at_seq+1,
// its output in the request after). A tape that is forked no longer
// changes: it is found once per process.
func (h *Handler) outputsStep(ctx context.Context, rp *gatewayv1.Replay) int32 {
	key := rp.GetTapeRun() + "@" + strconv.Itoa(int(rp.GetAtSeq()))
	if v, ok := h.outputSteps.Load(key); ok {
		return v.(int32)
	}
	n := rp.GetAtSeq() + 1
	for i := 0; i < maxSideCalls && h.sideCall(ctx, rp, n); i++ {
		n++
	}
	h.outputSteps.Store(key, n)
	return n
}

// tapeSession is the session the taped run belonged to ("" when unknown).
// A run's session never changes: it is read once per process.
func (h *Handler) tapeSession(ctx context.Context, run string) string {
	if s, ok := h.tapeSessions.Load(run); ok {
		return s.(string)
	}
	src, err := h.o.Runs.Get(ctx, run)
	if err != nil {
		return ""
	}
	h.tapeSessions.Store(run, src.GetSession())
	return src.GetSession()
}

// diverged records d on the run and, unless the replay goes live at a
// divergence, stops the run and refuses the call. It reports whether it
// answered the call.
func (h *Handler) diverged(ctx context.Context, w http.ResponseWriter, c *call, rp *gatewayv1.Replay, d *gatewayv1.Divergence) bool {
	// The tape's step: the fork's divergence names the recorded run's.
	d.Seq = c.tapeSeq
	c.step.Divergence = d
	if _, err := h.o.Runs.SetDivergence(ctx, c.run.GetId(), d); err != nil {
		h.o.Logger.LogAttrs(ctx, slog.LevelError, "divergence not recorded", slog.Any("error", err))
	}
	if rp.GetOnDivergence() == gatewayv1.OnDivergence_ON_DIVERGENCE_LIVE {
		return false
	}
	kind := strings.ToLower(strings.TrimPrefix(d.GetKind().String(), "DIVERGENCE_KIND_"))
	reason := fmt.Sprintf("replay diverged at step %d (%s): %s", d.Seq, kind, d.GetDetail())
	h.stop(ctx, c, reason)
	writeError(w, c.p, http.StatusForbidden, errPermission, "hangar gateway: "+reason)
	return true
}

func (h *Handler) stop(ctx context.Context, c *call, reason string) {
	c.failure = reason
	if _, err := h.o.Runs.SetState(context.WithoutCancel(ctx), c.run.GetId(), gatewayv1.RunState_RUN_STATE_STOPPED, reason); err != nil {
		h.o.Logger.LogAttrs(ctx, slog.LevelError, "run not stopped", slog.Any("error", err))
	}
}

// stagger holds the first call of a run in a sibling group until the
// group's first sibling got its first answer, or the stagger ends, so the
// siblings read the prompt cache the first one wrote. It returns, for the
// group's first sibling, the function to call when its first answer arrives.
//
// Waiting is event-driven in this process (the leader's answer closes the
// group's channel) and polls Redis every StaggerPoll for a leader served by
// another replica. Timers come from Options.After, so tests drive the
// deadline without sleeping.
func (h *Handler) stagger(ctx context.Context, c *call) func() {
	group := c.run.GetSiblingGroup()
	secs := int(c.run.GetStaggerSeconds())
	if secs == 0 {
		secs = h.o.StaggerSeconds
	}
	if group == "" || secs <= 0 || c.step.Seq != 1 {
		return nil
	}
	first, err := h.o.Runs.GroupClaimFirst(ctx, group, c.run.GetId())
	if err != nil {
		h.o.Logger.LogAttrs(ctx, slog.LevelWarn, "stagger skipped", slog.Any("error", err))
		return nil
	}
	if first {
		var once sync.Once
		return func() {
			once.Do(func() {
				if err := h.o.Runs.GroupAnswered(context.WithoutCancel(ctx), group); err != nil {
					h.o.Logger.LogAttrs(ctx, slog.LevelWarn, "stagger release failed", slog.Any("error", err))
				}
				h.groups.release(group)
			})
		}
	}
	// Take the group's channel before reading Redis: a release between the
	// two is then seen by one or the other.
	answered, leave := h.groups.join(group)
	defer leave()
	deadline := h.o.After(time.Duration(secs) * time.Second)
	if h.o.OnStaggerWait != nil {
		h.o.OnStaggerWait(c.run.GetId())
	}
	for {
		if ok, err := h.o.Runs.IsGroupAnswered(ctx, group); err != nil || ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-deadline:
			h.o.Logger.LogAttrs(ctx, slog.LevelInfo, "stagger ended without a sibling answer", slog.String("run", c.run.GetId()), slog.String("group", group))
			return nil
		case <-answered:
			return nil
		case <-h.o.After(h.o.StaggerPoll):
		}
	}
}

// groups are the sibling groups with first calls waiting in this process.
type groups struct {
	mu sync.Mutex
	m  map[string]*groupWait
}

type groupWait struct {
	ch      chan struct{}
	waiters int
}

// join returns a channel closed when the group's leader answers in this
// process, and the function to call when the caller stops waiting.
func (g *groups) join(group string) (<-chan struct{}, func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil {
		g.m = map[string]*groupWait{}
	}
	w, ok := g.m[group]
	if !ok {
		w = &groupWait{ch: make(chan struct{})}
		g.m[group] = w
	}
	w.waiters++
	return w.ch, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		w.waiters--
		if w.waiters == 0 && g.m[group] == w {
			delete(g.m, group)
		}
	}
}

// release wakes the group's waiters.
func (g *groups) release(group string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if w, ok := g.m[group]; ok {
		close(w.ch)
		delete(g.m, group)
	}
}
