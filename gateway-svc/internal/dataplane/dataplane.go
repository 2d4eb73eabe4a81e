// Package dataplane is the gateway's HTTP data plane: the providers' own
// endpoints (POST /v1/messages, /v1/responses, /v1/chat/completions),
// authenticated by run tokens, forwarded to the real upstream with the real
// key, streamed back event by event, and recorded on the run's tape.
//
// Paths may carry the run: /runs/<run>/v1/messages is the same endpoint, and
// the token must then belong to <run>. GET /runs/<run>/tape returns the tape
// to that run's token, and POST /runs/<run>/steps/<seq>/tree records a work
// tree hash (for a hook inside the sandbox).
package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/runs"
	"github.com/hangar-dev/hangar/gateway-svc/internal/tape"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// MaxBodyBytes is the largest request body accepted (100 MB); larger ones get
// a 413.
const MaxBodyBytes = 100 << 20

// Upstreams are the real model APIs and their keys.
type Upstreams struct {
	// AnthropicURL is the base URL without /v1 (https://api.anthropic.com).
	AnthropicURL string
	AnthropicKey string
	// OpenAIURL is the base URL with /v1 (https://api.openai.com/v1).
	OpenAIURL string
	OpenAIKey string
}

// Options configures a Handler.
type Options struct {
	Runs      *runs.Store
	Tapes     *tape.Tapes
	Upstreams Upstreams
	// Client calls upstream; nil means a client with no overall timeout.
	Client *http.Client
	Logger *slog.Logger
	Now    func() time.Time
	// CacheTTL is the default prompt-cache TTL (auto, 5m, 1h, off) for runs
	// that set none.
	CacheTTL string
	// StaggerSeconds is the default fork stagger for runs in a sibling group
	// that set none.
	StaggerSeconds int
	// StaggerPoll is how often a held first call checks Redis for an answer
	// of a sibling served by another replica (default 250ms; siblings in
	// this process wake it at once).
	StaggerPoll time.Duration
	// After is the timer source of the stagger (default time.After).
	After func(time.Duration) <-chan time.Time
	// OnStaggerWait, when set, is called as a run's first call starts
	// waiting for its sibling (tests).
	OnStaggerWait func(run string)
	// HoldKeepalive is how often a held answer (approvals) sends an SSE
	// comment while it waits for a decision (default 10s).
	HoldKeepalive time.Duration
	// MaxBodyBytes overrides MaxBodyBytes (tests).
	MaxBodyBytes int64
	// Trees takes the work tree hash of a run's sandbox when a step's
	// request arrives (nil: no tree hashes are taped).
	Trees TreeHasher
	// OnTreeWait, when set, is called as a call's answer starts waiting for
	// its work tree hash (the first byte of the answer is held; tests).
	OnTreeWait func(run string)
}

// TreeHasher hashes the work tree of the sandbox a run's harness runs in.
type TreeHasher interface {
	TreeHash(ctx context.Context, sb *gatewayv1.RunSandbox) (string, error)
}

// Handler is the data plane.
type Handler struct {
	o      Options
	groups groups
	// taping holds, by run, a channel closed once the run's last
	// replayed step is taped (its answer went out first; recording).
	taping sync.Map
	// tapeSessions caches the session of each taped run a replay read
	// (tapeSession).
	tapeSessions sync.Map
	// outputSteps caches outputsStep by tape run and at_seq.
	outputSteps sync.Map
}

// New returns the data plane handler.
func New(o Options) *Handler {
	if o.Client == nil {
		o.Client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = MaxBodyBytes
	}
	if o.HoldKeepalive <= 0 {
		o.HoldKeepalive = 10 * time.Second
	}
	if o.StaggerPoll <= 0 {
		o.StaggerPoll = 250 * time.Millisecond
	}
	if o.After == nil {
		o.After = time.After
	}
	if o.Upstreams.AnthropicURL == "" {
		o.Upstreams.AnthropicURL = "https://api.anthropic.com"
	}
	if o.Upstreams.OpenAIURL == "" {
		o.Upstreams.OpenAIURL = "https://api.openai.com/v1"
	}
	o.Upstreams.AnthropicURL = strings.TrimRight(o.Upstreams.AnthropicURL, "/")
	o.Upstreams.OpenAIURL = strings.TrimRight(o.Upstreams.OpenAIURL, "/")
	return &Handler{o: o}
}

// ServeHTTP routes a data-plane request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			h.o.Logger.LogAttrs(r.Context(), slog.LevelError, "data plane panic", slog.Any("panic", v), slog.String("path", r.URL.Path))
			writeError(w, gatewayv1.Provider_PROVIDER_UNSPECIFIED, http.StatusInternalServerError, errAPI, "hangar gateway: internal error")
		}
	}()
	path := r.URL.Path
	scope := ""
	if rest, ok := strings.CutPrefix(path, "/runs/"); ok {
		var sub string
		scope, sub, _ = strings.Cut(rest, "/")
		path = "/" + sub
		switch {
		case r.Method == http.MethodGet && path == "/tape":
			h.serveTape(w, r, scope)
			return
		case r.Method == http.MethodPost && strings.HasPrefix(path, "/steps/") && strings.HasSuffix(path, "/tree"):
			h.serveTree(w, r, scope, strings.TrimSuffix(strings.TrimPrefix(path, "/steps/"), "/tree"))
			return
		}
	}
	if path == "/" || path == "" {
		if r.Method == http.MethodHead || r.Method == http.MethodGet {
			w.WriteHeader(http.StatusOK)
			return
		}
	}
	p := protocolFor(path)
	if p == gatewayv1.Provider_PROVIDER_UNSPECIFIED {
		writeError(w, p, http.StatusNotFound, "not_found_error", "hangar gateway: no endpoint "+r.Method+" "+path)
		return
	}
	if r.Method != http.MethodPost {
		writeError(w, p, http.StatusMethodNotAllowed, errInvalid, "hangar gateway: "+path+" takes POST")
		return
	}
	h.serveModel(w, r, p, path, scope)
}

// token returns the credential the client sent as its API key.
func token(r *http.Request) string {
	if k := r.Header.Get("x-api-key"); k != "" {
		return k
	}
	if a := r.Header.Get("Authorization"); a != "" {
		if t, ok := strings.CutPrefix(a, "Bearer "); ok {
			return strings.TrimSpace(t)
		}
	}
	return ""
}

// authenticate returns the run of the request's token; it writes the error
// answer and returns nil when the token is unknown or scoped to another run.
func (h *Handler) authenticate(w http.ResponseWriter, r *http.Request, p gatewayv1.Provider, scope string) *gatewayv1.Run {
	var run *gatewayv1.Run
	err := rideOut(r.Context(), func() (err error) {
		run, err = h.o.Runs.Authenticate(r.Context(), token(r))
		return err
	})
	if errors.Is(err, runs.ErrUnknownToken) {
		writeError(w, p, http.StatusUnauthorized, errAuth, "hangar gateway: invalid run token (unknown, ended or expired)")
		return nil
	}
	if err != nil {
		h.o.Logger.LogAttrs(r.Context(), slog.LevelError, "token check failed", slog.Any("error", err))
		writeError(w, p, http.StatusServiceUnavailable, errAPI, "hangar gateway: run store unavailable")
		return nil
	}
	if scope != "" && scope != run.GetId() {
		writeError(w, p, http.StatusForbidden, errPermission, "hangar gateway: this run token is not valid for run "+scope)
		return nil
	}
	return run
}

func (h *Handler) serveTape(w http.ResponseWriter, r *http.Request, scope string) {
	run := h.authenticate(w, r, gatewayv1.Provider_PROVIDER_UNSPECIFIED, scope)
	if run == nil {
		return
	}
	steps, err := h.o.Tapes.Read(r.Context(), run.GetId(), run.GetSteps())
	if err != nil {
		h.o.Logger.LogAttrs(r.Context(), slog.LevelError, "tape read failed", slog.String("run", run.GetId()), slog.Any("error", err))
		writeError(w, gatewayv1.Provider_PROVIDER_UNSPECIFIED, http.StatusInternalServerError, errAPI, "hangar gateway: tape unreadable")
		return
	}
	b, _ := protojson.Marshal(&gatewayv1.GetTapeResponse{Run: run, Steps: steps})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func (h *Handler) serveTree(w http.ResponseWriter, r *http.Request, scope, seqStr string) {
	run := h.authenticate(w, r, gatewayv1.Provider_PROVIDER_UNSPECIFIED, scope)
	if run == nil {
		return
	}
	seq, err := strconv.Atoi(seqStr)
	var req struct {
		TreeHash string `json:"tree_hash"`
	}
	if err != nil || seq <= 0 || json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req) != nil || req.TreeHash == "" {
		writeError(w, gatewayv1.Provider_PROVIDER_UNSPECIFIED, http.StatusBadRequest, errInvalid, `hangar gateway: want POST /runs/<run>/steps/<seq>/tree {"tree_hash": "..."}`)
		return
	}
	if err := h.o.Tapes.SetTreeHash(r.Context(), run.GetId(), int32(seq), req.TreeHash); err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, tape.ErrNotFound) {
			status = http.StatusNotFound
		}
		writeError(w, gatewayv1.Provider_PROVIDER_UNSPECIFIED, status, errInvalid, fmt.Sprintf("hangar gateway: step %d not recorded", seq))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// recordedHeaders are the request headers kept on the tape (never
// credentials).
var recordedHeaders = []string{"anthropic-version", "anthropic-beta", "content-type", "user-agent", "openai-beta", "x-stainless-lang", "originator", "session_id", "version"}

// forwardedSkip are request headers not forwarded upstream.
var forwardedSkip = map[string]bool{
	"x-api-key": true, "authorization": true, "host": true, "content-length": true, "accept-encoding": true,
	"connection": true, "keep-alive": true, "proxy-authorization": true, "te": true, "trailer": true,
	"transfer-encoding": true, "upgrade": true, "cookie": true,
}

// responseSkip are upstream response headers not passed to the client.
var responseSkip = map[string]bool{
	"content-length": true, "content-encoding": true, "connection": true, "keep-alive": true,
	"transfer-encoding": true, "trailer": true, "upgrade": true, "set-cookie": true,
}

// call is one model call in progress.
type call struct {
	run     *gatewayv1.Run
	p       gatewayv1.Provider
	path    string
	start   time.Time
	step    *gatewayv1.Step
	usage   usageOf
	failure string
	// done: the step is recorded (finish ran).
	done bool
	// tapeSeq is the step of the replayed tape this call stands for (its
	// own seq but in a replay that passed over taped steps: SkipTape).
	tapeSeq int32
	// answered is when the harness had the whole answer, for a step taped
	// after it (a replayed one); zero: the step is taped before its end.
	answered time.Time
	// tree is the work tree hash being taken (nil: none is taken).
	tree *pendingTree
}

func (h *Handler) serveModel(w http.ResponseWriter, r *http.Request, p gatewayv1.Provider, path, scope string) {
	ctx := r.Context()
	start := h.o.Now()
	if r.ContentLength > h.o.MaxBodyBytes {
		writeError(w, p, http.StatusRequestEntityTooLarge, errTooLarge, fmt.Sprintf("hangar gateway: request body over %d MB", h.o.MaxBodyBytes>>20))
		return
	}
	run := h.authenticate(w, r, p, scope)
	if run == nil {
		return
	}
	h.awaitRecorded(ctx, run.GetId())
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.o.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, p, http.StatusRequestEntityTooLarge, errTooLarge, fmt.Sprintf("hangar gateway: request body over %d MB", h.o.MaxBodyBytes>>20))
			return
		}
		writeError(w, p, http.StatusBadRequest, errInvalid, "hangar gateway: could not read the request body")
		return
	}
	if !json.Valid(body) {
		writeError(w, p, http.StatusBadRequest, errInvalid, "hangar gateway: the request body is not valid JSON")
		return
	}
	if path == "/v1/messages/count_tokens" {
		// A side request: forwarded, not taped, not billed.
		h.forwardPlain(w, r, p, path, body)
		return
	}
	switch run.GetState() {
	case gatewayv1.RunState_RUN_STATE_ACTIVE:
	case gatewayv1.RunState_RUN_STATE_OVER_BUDGET:
		writeError(w, p, http.StatusForbidden, errPermission, "hangar gateway: run "+run.GetId()+" is over budget: "+run.GetStateReason())
		return
	case gatewayv1.RunState_RUN_STATE_STOPPED:
		writeError(w, p, http.StatusForbidden, errPermission, "hangar gateway: run "+run.GetId()+" is stopped: "+run.GetStateReason())
		return
	default:
		writeError(w, p, http.StatusUnauthorized, errAuth, "hangar gateway: run "+run.GetId()+" has ended")
		return
	}

	var seq int32
	err = rideOut(ctx, func() (err error) {
		seq, err = h.o.Runs.NextSeq(ctx, run.GetId())
		return err
	})
	if err != nil {
		h.o.Logger.LogAttrs(ctx, slog.LevelError, "step allocation failed", slog.Any("error", err))
		writeError(w, p, http.StatusServiceUnavailable, errAPI, "hangar gateway: run store unavailable")
		return
	}
	c := &call{run: run, p: p, path: path, start: start, step: &gatewayv1.Step{
		Seq: seq, Time: timestamppb.New(start), Provider: p, Model: modelOf(body),
		Request: &gatewayv1.StepRequest{Method: r.Method, Path: path, Headers: pickHeaders(r.Header), Body: body},
	}}
	defer h.finish(c)
	// The work tree hash is taken while the call goes on (the tape is
	// read, the upstream answers); the answer's first byte waits for it
	// (hashAt: when it is taken).
	c.tapeSeq = seq
	rp := run.GetReplay()
	replaying := rp != nil && rp.GetTapeRun() != "" && !rp.GetOutsideOnly()
	var prior *gatewayv1.Divergence
	if replaying {
		// The taped step this call stands for: the tape's steps the
		// replay passed over come before it (SkipTape).
		d, _, skipped, err := h.o.Runs.ReplayState(ctx, run.GetId())
		if err == nil {
			prior, c.tapeSeq = d, seq+skipped
		}
	}
	if h.hashAt(rp, c) {
		h.startTree(ctx, c)
	}
	w = &treeGate{ResponseWriter: w, wait: func() { h.awaitTree(c) }}

	if replaying {
		if done := h.replayStep(w, r, c, rp, prior); done {
			return
		}
	}

	upBody := body
	if rp := run.GetReplay(); rp != nil && rp.GetTapeRun() != "" {
		// Live after a replayed prefix (or a trial continuing one): the
		// calls with outside effects the prefix made are shown to the
		// model with the tape's outputs.
		upBody = h.answerFromTape(ctx, c, rp, upBody)
	}
	if msgs, err := h.o.Runs.TakeSteering(ctx, run.GetId()); err == nil && len(msgs) > 0 {
		if b, err := injectSteering(p, upBody, msgs); err == nil {
			upBody = b
			c.step.Injected = strings.Join(msgs, "\n\n")
		} else {
			h.o.Logger.LogAttrs(ctx, slog.LevelWarn, "steering not injected", slog.String("run", run.GetId()), slog.Any("error", err))
		}
	}
	if p == gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES {
		ttl := run.GetCacheTtl()
		if ttl == "" {
			ttl = h.o.CacheTTL
		}
		if b, err := applyCacheTTL(upBody, ttl); err == nil {
			upBody = b
		}
	}
	held, err := h.o.Runs.Approvals(ctx, run.GetId())
	if err != nil {
		h.o.Logger.LogAttrs(ctx, slog.LevelError, "approvals lookup failed", slog.Any("error", err))
		c.failure = "run store unavailable"
		writeError(w, p, http.StatusServiceUnavailable, errAPI, "hangar gateway: run store unavailable")
		return
	}
	leader := h.stagger(ctx, c)
	if held {
		h.forwardHeld(w, r, c, upBody, leader)
		return
	}
	h.forward(w, r, c, upBody, leader)
}

// hashAt reports whether call c's work tree is hashed: at every step,
// but in a replay checked at its end (tree_check_at_end), only at the
// prefix's last two requests, at_seq and at_seq+1 (of the tape): its
// replayed answers before them wait for no hash.
func (h *Handler) hashAt(rp *gatewayv1.Replay, c *call) bool {
	return !rp.GetTreeCheckAtEnd() || rp.GetOutsideOnly() || c.tapeSeq >= rp.GetAtSeq()
}

// treeHashTimeout bounds the hash of a work tree (a git add into a copy of
// the index).
const treeHashTimeout = 30 * time.Second

// pendingTree is a work tree hash being taken.
type pendingTree struct {
	done chan struct{}
	hash string
	err  error
	// taken: awaitTree has put the result on the step.
	taken bool
}

// startTree starts taking the hash of the run's work tree as the request
// arrives: the harness waits for this answer, so the tree is the one the
// tools of the steps before left, and stays so until the harness gets the
// answer's first byte (treeGate holds it until the hash is taken). The
// hash is taken concurrently with the rest of the call: the replay's tape
// read and request check, the upstream call.
func (h *Handler) startTree(ctx context.Context, c *call) {
	sb := c.run.GetSandbox()
	if h.o.Trees == nil || sb.GetId() == "" {
		return
	}
	pt := &pendingTree{done: make(chan struct{})}
	c.tree = pt
	go func() {
		defer close(pt.done)
		ctx, cancel := context.WithTimeout(ctx, treeHashTimeout)
		defer cancel()
		pt.hash, pt.err = h.o.Trees.TreeHash(ctx, sb)
	}()
}

// awaitTree waits for the hash startTree started and records it on the
// call's step. A hash that cannot be taken is left out (the step is not
// checked for tree divergence). It runs on the call's goroutine, before
// the answer's first byte, the replay's tree check and the taping of the
// step, whichever comes first.
func (h *Handler) awaitTree(c *call) {
	pt := c.tree
	if pt == nil || pt.taken {
		return
	}
	pt.taken = true
	select {
	case <-pt.done:
	default:
		if h.o.OnTreeWait != nil {
			h.o.OnTreeWait(c.run.GetId())
		}
		<-pt.done
	}
	if pt.err != nil {
		h.o.Logger.LogAttrs(context.Background(), slog.LevelWarn, "work tree hash not taken", slog.String("run", c.run.GetId()), slog.Int("seq", int(c.step.Seq)), slog.Any("error", pt.err))
		return
	}
	c.step.TreeHash = pt.hash
}

// treeGate holds the first byte of a call's answer until the call's work
// tree hash is taken: once the harness has any of the answer it may run
// the answer's tools, which change the tree. Headers pass (they carry no
// tool call).
type treeGate struct {
	http.ResponseWriter
	wait func()
}

func (g *treeGate) Write(b []byte) (int, error) {
	g.wait()
	return g.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the server's writer (Flush).
func (g *treeGate) Unwrap() http.ResponseWriter { return g.ResponseWriter }

func pickHeaders(hd http.Header) map[string]string {
	out := map[string]string{}
	for _, k := range recordedHeaders {
		if v := hd.Get(k); v != "" {
			out[k] = v
		}
	}
	return out
}

// upstreamURL is where a call goes.
func (h *Handler) upstreamURL(p gatewayv1.Provider, path, rawQuery string) string {
	var u string
	if p == gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES {
		u = h.o.Upstreams.AnthropicURL + path
	} else {
		u = h.o.Upstreams.OpenAIURL + strings.TrimPrefix(path, "/v1")
	}
	if rawQuery != "" {
		u += "?" + rawQuery
	}
	return u
}

func (h *Handler) upstreamRequest(r *http.Request, p gatewayv1.Provider, path string, body []byte) (*http.Request, error) {
	up, err := http.NewRequestWithContext(r.Context(), http.MethodPost, h.upstreamURL(p, path, r.URL.RawQuery), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, vs := range r.Header {
		if forwardedSkip[strings.ToLower(k)] {
			continue
		}
		up.Header[k] = vs
	}
	if p == gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES {
		if h.o.Upstreams.AnthropicKey != "" {
			up.Header.Set("x-api-key", h.o.Upstreams.AnthropicKey)
		}
	} else if h.o.Upstreams.OpenAIKey != "" {
		up.Header.Set("Authorization", "Bearer "+h.o.Upstreams.OpenAIKey)
	}
	return up, nil
}

func (h *Handler) forwardPlain(w http.ResponseWriter, r *http.Request, p gatewayv1.Provider, path string, body []byte) {
	up, err := h.upstreamRequest(r, p, path, body)
	if err != nil {
		writeError(w, p, http.StatusBadGateway, errAPI, "hangar gateway: bad upstream URL")
		return
	}
	resp, err := h.o.Client.Do(up)
	if err != nil {
		writeError(w, p, http.StatusBadGateway, errAPI, "hangar gateway: upstream unreachable")
		return
	}
	defer resp.Body.Close()
	copyHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func copyHeaders(dst, src http.Header) {
	for k, vs := range src {
		if responseSkip[strings.ToLower(k)] {
			continue
		}
		dst[k] = vs
	}
}

// send sends the call upstream. On failure it records the failure on the
// call, answers the harness (unless it went away) and returns nil.
func (h *Handler) send(w http.ResponseWriter, r *http.Request, c *call, body []byte) *http.Response {
	up, err := h.upstreamRequest(r, c.p, c.path, body)
	if err != nil {
		c.failure = "bad upstream URL"
		writeError(w, c.p, http.StatusBadGateway, errAPI, "hangar gateway: bad upstream URL")
		return nil
	}
	resp, err := h.o.Client.Do(up)
	if err != nil {
		c.failure = "upstream unreachable: " + err.Error()
		c.step.Response = &gatewayv1.StepResponse{Status: http.StatusBadGateway, Body: errorBody(c.p, errAPI, "hangar gateway: upstream unreachable")}
		if r.Context().Err() == nil {
			writeError(w, c.p, http.StatusBadGateway, errAPI, "hangar gateway: upstream unreachable")
		}
		return nil
	}
	return resp
}

// forward sends the call upstream and streams the answer back.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, c *call, body []byte, leader func()) {
	ctx := r.Context()
	resp := h.send(w, r, c, body)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	sr := &gatewayv1.StepResponse{Status: int32(resp.StatusCode), Headers: map[string]string{}}
	c.step.Response = sr
	for _, k := range []string{"content-type", "request-id", "x-request-id", "anthropic-ratelimit-requests-remaining"} {
		if v := resp.Header.Get(k); v != "" {
			sr.Headers[k] = v
		}
	}
	copyHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	if leader != nil {
		defer leader()
	}

	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, err := io.ReadAll(io.LimitReader(resp.Body, h.o.MaxBodyBytes))
		sr.Body = b
		if err != nil {
			c.failure = "upstream body: " + err.Error()
		}
		if resp.StatusCode == http.StatusOK {
			c.usage.body(c.p, b)
		} else if c.failure == "" {
			c.failure = fmt.Sprintf("upstream status %d", resp.StatusCode)
		}
		// Record before answering, so the tape and the budget are current
		// once the client has the answer.
		h.finish(c)
		_, _ = w.Write(b)
		return
	}

	// SSE: pass each event through as soon as its blank line arrives.
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var raw bytes.Buffer
	var evName string
	var data []string
	first := true
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A long line: collect it whole.
			rest, err2 := br.ReadBytes('\n')
			line = append(append([]byte(nil), line...), rest...)
			err = err2
		}
		if len(line) > 0 {
			raw.Write(line)
			s := strings.TrimRight(string(line), "\r\n")
			switch {
			case s == "":
				if raw.Len() > 0 {
					if evName != "" || len(data) > 0 {
						d := strings.Join(data, "\n")
						sr.Events = append(sr.Events, &gatewayv1.SseEvent{Event: evName, Data: d, OffsetMs: h.o.Now().Sub(c.start).Milliseconds()})
						c.usage.event(c.p, d)
						if first && leader != nil {
							leader()
							leader = nil
						}
						first = false
						if terminated(c.p, sr.Events) {
							// Record the step before the client sees the end of
							// the answer: its next request then finds the tape
							// and the budget current.
							h.finish(c)
						}
					}
					if _, werr := w.Write(raw.Bytes()); werr == nil {
						_ = rc.Flush()
					}
				}
				raw.Reset()
				evName, data = "", nil
			case strings.HasPrefix(s, "event:"):
				evName = strings.TrimSpace(strings.TrimPrefix(s, "event:"))
			case strings.HasPrefix(s, "data:"):
				d := strings.TrimPrefix(s, "data:")
				data = append(data, strings.TrimPrefix(d, " "))
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && raw.Len() == 0 {
				break
			}
			// The upstream went away mid-event or mid-stream.
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			if ctx.Err() != nil {
				c.failure = "client went away"
				return
			}
			c.failure = "upstream stream failed: " + err.Error()
			name, d := errorEvent(c.p, "hangar gateway: upstream connection lost mid-stream")
			var eb strings.Builder
			if name != "" {
				eb.WriteString("event: " + name + "\n")
			}
			eb.WriteString("data: " + d + "\n\n")
			if _, werr := io.WriteString(w, eb.String()); werr == nil {
				_ = rc.Flush()
			}
			sr.Events = append(sr.Events, &gatewayv1.SseEvent{Event: name, Data: d, OffsetMs: h.o.Now().Sub(c.start).Milliseconds()})
			return
		}
	}
	if !c.usage.seen && c.failure == "" && !terminated(c.p, sr.Events) {
		c.failure = "upstream stream ended without its final event"
	}
}

// terminated reports whether a stream ended with the protocol's last event.
func terminated(p gatewayv1.Provider, evs []*gatewayv1.SseEvent) bool {
	if len(evs) == 0 {
		return false
	}
	last := evs[len(evs)-1]
	switch p {
	case gatewayv1.Provider_PROVIDER_ANTHROPIC_MESSAGES:
		return last.Event == "message_stop"
	case gatewayv1.Provider_PROVIDER_OPENAI_RESPONSES:
		switch last.Event {
		case "response.completed", "response.failed", "response.incomplete", "error":
			return true
		}
		return false
	default:
		return last.Data == "[DONE]"
	}
}

// finish records the step: usage, cost and budget on the run, the step on
// the tape. It runs even when the client went away.
func (h *Handler) finish(c *call) {
	if c.done {
		return
	}
	c.done = true
	h.awaitTree(c)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(context.Background()), 30*time.Second+storeOutageWait)
	defer cancel()
	end := c.answered
	if end.IsZero() {
		end = h.o.Now()
	}
	c.step.LatencyMs = end.Sub(c.start).Milliseconds()
	if c.step.Response == nil {
		c.step.Response = &gatewayv1.StepResponse{}
	}
	c.step.Failure = c.failure
	if !c.step.Replayed {
		// What the upstream says served the call: a request for an alias
		// is answered by a concrete model (harness locks compare it).
		c.step.ServedModel = c.usage.model
	}
	model := c.usage.model
	if model == "" {
		model = c.step.Model
	}
	if c.step.Replayed {
		// Answered from the tape: the usage is the taped one, not billed
		// again. The step count (and the run's journal, an fsynced write)
		// goes alongside the taping below, which needs nothing from it.
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.o.Runs.Touch(ctx, c.run.GetId(), c.step.Seq); err != nil {
				h.o.Logger.LogAttrs(ctx, slog.LevelError, "step count failed", slog.Any("error", err))
			}
		}()
		defer wg.Wait()
	} else {
		var (
			u      *gatewayv1.Usage
			state  gatewayv1.RunState
			reason string
		)
		// A store that is down now counts the call once it is back.
		err := rideOut(ctx, func() (err error) {
			u, state, reason, err = h.o.Runs.AddUsage(ctx, c.run, c.step.Seq, runs.StepUsage{Model: model, Input: c.usage.u.Input,
				Output: c.usage.u.Output, CacheRead: c.usage.u.CacheRead, CacheWrite: c.usage.u.CacheWrite})
			return err
		})
		if err != nil {
			h.o.Logger.LogAttrs(ctx, slog.LevelError, "usage not recorded", slog.String("run", c.run.GetId()), slog.Any("error", err))
		}
		c.step.Usage = u
		if state == gatewayv1.RunState_RUN_STATE_OVER_BUDGET && c.run.GetState() == gatewayv1.RunState_RUN_STATE_ACTIVE {
			h.o.Logger.LogAttrs(ctx, slog.LevelInfo, "run over budget", slog.String("run", c.run.GetId()), slog.String("reason", reason))
		}
	}
	if err := h.o.Runs.IndexTape(ctx, c.run); err != nil {
		h.o.Logger.LogAttrs(ctx, slog.LevelError, "tape index failed", slog.Any("error", err))
	}
	if err := h.o.Tapes.Append(ctx, c.run.GetId(), c.step); err != nil {
		h.o.Logger.LogAttrs(ctx, slog.LevelError, "tape append failed", slog.String("run", c.run.GetId()), slog.Int("seq", int(c.step.Seq)), slog.Any("error", err))
	}
}
