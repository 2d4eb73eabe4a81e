// Package server is the gateway service: the GatewayService control API
// (gRPC, and REST through grpc-gateway in the app wiring) and the HTTP data
// plane the harnesses talk to.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/dataplane"
	"github.com/hangar-dev/hangar/gateway-svc/internal/runs"
	"github.com/hangar-dev/hangar/gateway-svc/internal/tape"
	"github.com/hangar-dev/hangar/platform/blob"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/platform/redisconn"
	"github.com/redis/go-redis/v9"
)

// Upstreams are the real model APIs (HANGAR_ANTHROPIC_URL,
// HANGAR_ANTHROPIC_API_KEY, HANGAR_OPENAI_URL, HANGAR_OPENAI_API_KEY).
type Upstreams struct {
	// AnthropicURL is the base URL without /v1; default https://api.anthropic.com.
	AnthropicURL string
	AnthropicKey string
	// OpenAIURL is the base URL with /v1; default https://api.openai.com/v1.
	OpenAIURL string
	OpenAIKey string
}

// Price is USD per million tokens (input, output, cache read, cache write).
type Price = runs.Price

// DefaultPrices is the built-in price table, by model family.
func DefaultPrices() map[string]Price { return runs.DefaultPrices() }

// Deps are the server's dependencies and settings.
type Deps struct {
	Redis  *redis.Client
	Tapes  blob.Store
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// KeyPrefix prefixes every Redis key (e.g. "hangar:gateway:").
	KeyPrefix string
	Upstreams Upstreams
	// PublicURL is the base URL the harnesses are pointed at (the data
	// plane's listener), returned in Run.anthropic_base_url/openai_base_url.
	PublicURL string
	// TapeDays is how long tapes are kept (HANGAR_MODEL_TAPE_DAYS, 30).
	TapeDays int
	// CacheTTL is the default prompt-cache TTL (HANGAR_CACHE: auto, 5m, 1h, off).
	CacheTTL string
	// StaggerSeconds is the default fork stagger (HANGAR_CACHE_STAGGER_SECONDS, 15).
	StaggerSeconds int
	// Prices overrides or extends the default price table, by model-name
	// prefix ("claude-sonnet"); "" is the fallback.
	Prices map[string]Price
	// SweepInterval is how often expired tapes are deleted (default 1h; <0
	// disables the background sweeper, Sweep can still be called).
	SweepInterval time.Duration
	// HTTPClient calls the upstreams (default: no overall timeout).
	HTTPClient *http.Client
	// Trees hashes a run's work tree as each step's request arrives (nil:
	// the tape has no tree hashes).
	Trees dataplane.TreeHasher
}

// Server implements gatewayv1.GatewayServiceServer and serves the data plane.
type Server struct {
	gatewayv1.UnimplementedGatewayServiceServer

	deps    Deps
	runs    *runs.Store
	tapes   *tape.Tapes
	sweeper *tape.Sweeper
	data    *dataplane.Handler

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

var _ gatewayv1.GatewayServiceServer = (*Server)(nil)

// New builds the server and starts its tape sweeper (stopped by Close).
func New(ctx context.Context, deps Deps) (*Server, error) {
	if deps.Redis == nil {
		return nil, errors.New("gateway: Deps.Redis is required")
	}
	if deps.Tapes == nil {
		return nil, errors.New("gateway: Deps.Tapes is required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.TapeDays <= 0 {
		deps.TapeDays = 30
	}
	switch deps.CacheTTL {
	case "":
		deps.CacheTTL = "auto"
	case "auto", "5m", "1h", "off":
	default:
		return nil, fmt.Errorf("gateway: cache TTL %q: want auto, 5m, 1h or off", deps.CacheTTL)
	}
	if deps.StaggerSeconds < 0 {
		return nil, fmt.Errorf("gateway: stagger seconds %d < 0", deps.StaggerSeconds)
	}
	deps.PublicURL = strings.TrimRight(deps.PublicURL, "/")
	prices := runs.DefaultPrices()
	for k, v := range deps.Prices {
		prices[k] = v
	}
	keep := time.Duration(deps.TapeDays+1) * 24 * time.Hour
	s := &Server{deps: deps}
	// Runs are journalled next to the tapes, so they survive a Redis that
	// restarts empty.
	s.runs = runs.New(deps.Redis, runs.Options{Prefix: deps.KeyPrefix, Now: deps.Now, Prices: prices, Keep: keep,
		Journal: deps.Tapes, JournalNotFound: blob.ErrNotFound, JournalPrefix: "runs/", Logger: deps.Logger})
	s.tapes = tape.New(deps.Tapes, "tapes/", blob.ErrNotFound)
	s.sweeper = &tape.Sweeper{Tapes: s.tapes, Index: s.runs, Days: deps.TapeDays, Now: deps.Now, Logger: deps.Logger}
	s.data = dataplane.New(dataplane.Options{
		Runs: s.runs, Tapes: s.tapes, Logger: deps.Logger, Now: deps.Now, Client: deps.HTTPClient,
		Upstreams: dataplane.Upstreams(deps.Upstreams), CacheTTL: deps.CacheTTL, StaggerSeconds: deps.StaggerSeconds,
		Trees: deps.Trees,
	})
	if err := deps.Redis.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("gateway: redis: %w", err)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	if deps.SweepInterval >= 0 {
		interval := deps.SweepInterval
		if interval == 0 {
			interval = time.Hour
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.sweeper.Run(sctx, interval)
		}()
	}
	return s, nil
}

// DataPlane is the HTTP handler the harnesses talk to (/v1/messages,
// /v1/responses, /v1/chat/completions, HEAD /, and the run-scoped
// /runs/<run>/... forms).
func (s *Server) DataPlane() http.Handler { return s.data }

// Sweep deletes tapes older than TapeDays now and returns how many.
func (s *Server) Sweep(ctx context.Context) (int, error) { return s.sweeper.Sweep(ctx) }

// Close stops the background sweeper.
func (s *Server) Close(ctx context.Context) error {
	s.cancel()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Server) withURLs(run *gatewayv1.Run) *gatewayv1.Run {
	if s.deps.PublicURL != "" && run != nil {
		run.AnthropicBaseUrl = s.deps.PublicURL + "/runs/" + run.GetId()
		run.OpenaiBaseUrl = s.deps.PublicURL + "/runs/" + run.GetId() + "/v1"
	}
	return run
}

// internal is the answer to a failure of the gateway's stores: Unavailable
// (try again) when Redis could not be reached, else an internal error
// (masked, its cause logged under the id the client sees).
func (s *Server) internal(ctx context.Context, msg string, err error) error {
	if !redisconn.Unreachable(err) {
		return fmt.Errorf("%s: %w", msg, err)
	}
	s.deps.Logger.LogAttrs(ctx, slog.LevelError, msg, slog.Any("error", err))
	return fault.Wrap(fault.KindUnavailable, "GATEWAY_STORE_UNAVAILABLE", "the gateway's store is unavailable", err)
}

func (s *Server) getRun(ctx context.Context, id string) (*gatewayv1.Run, error) {
	if id == "" {
		return nil, fault.InvalidArgument("run", "run is required")
	}
	run, err := s.runs.Get(ctx, id)
	if errors.Is(err, runs.ErrNotFound) {
		return nil, fault.NotFound("RUN_NOT_FOUND", "run %q not found", id)
	}
	if err != nil {
		return nil, s.internal(ctx, "run lookup failed", err)
	}
	return s.withURLs(run), nil
}

// CreateRun issues a run and its token.
func (s *Server) CreateRun(ctx context.Context, req *gatewayv1.CreateRunRequest) (*gatewayv1.CreateRunResponse, error) {
	if req.GetSession() != "" && !runs.ValidSessionName(req.GetSession()) {
		return nil, fault.InvalidArgument("session", "session %q is not a valid name (lowercase letters, digits and '-')", req.GetSession())
	}
	if req.GetTtlSeconds() < 0 {
		return nil, fault.InvalidArgument("ttl_seconds", "ttl_seconds must not be negative")
	}
	if b := req.GetBudget(); b != nil && (b.GetMaxCostUsd() < 0 || b.GetMaxTokens() < 0) {
		return nil, fault.InvalidArgument("budget", "budget limits must not be negative")
	}
	switch req.GetCacheTtl() {
	case "", "auto", "5m", "1h", "off":
	default:
		return nil, fault.InvalidArgument("cache_ttl", "cache_ttl %q: want auto, 5m, 1h or off", req.GetCacheTtl())
	}
	if req.GetStaggerSeconds() < 0 {
		return nil, fault.InvalidArgument("stagger_seconds", "stagger_seconds must not be negative")
	}
	cache := req.GetCacheTtl()
	if cache == "" {
		cache = s.deps.CacheTTL
	}
	stagger := req.GetStaggerSeconds()
	if stagger == 0 && req.GetSiblingGroup() != "" {
		stagger = int32(s.deps.StaggerSeconds)
	}
	run, token, err := s.runs.Create(ctx, &gatewayv1.Run{
		Session: req.GetSession(), Turn: req.GetTurn(), Harness: req.GetHarness(), Model: req.GetModel(),
		Budget: req.GetBudget(), Tainted: req.GetTainted(), CacheTtl: cache, SiblingGroup: req.GetSiblingGroup(),
		StaggerSeconds: stagger, Sandbox: req.GetSandbox(),
	}, time.Duration(req.GetTtlSeconds())*time.Second)
	if err != nil {
		return nil, s.internal(ctx, "run create failed", err)
	}
	if req.GetSession() != "" {
		// A session armed for a replay (a fork's prefix) replays from its
		// first call; one armed outside_only (a fork's trial) has every
		// run's outside calls answered from the tape.
		rp, err := s.runs.ArmedReplay(ctx, req.GetSession())
		if err != nil {
			_, _ = s.runs.End(ctx, run.GetId(), "replay could not be read")
			return nil, s.internal(ctx, "run create failed", err)
		}
		if rp != nil && (req.GetTurn() <= 1 || rp.GetOutsideOnly()) {
			if run, err = s.runs.SetReplay(ctx, run.GetId(), rp); err != nil {
				_, _ = s.runs.End(ctx, run.GetId(), "replay could not be set")
				return nil, s.internal(ctx, "run create failed", err)
			}
		}
	}
	if req.GetApprovals() {
		if err := s.runs.EnableApprovals(ctx, run.GetId()); err != nil {
			_, _ = s.runs.End(ctx, run.GetId(), "approvals could not be enabled")
			return nil, s.internal(ctx, "run create failed", err)
		}
	}
	run.Usage = &gatewayv1.Usage{}
	return &gatewayv1.CreateRunResponse{Run: s.withURLs(run), Token: token}, nil
}

// EndRun ends a run; its token stops working.
func (s *Server) EndRun(ctx context.Context, req *gatewayv1.EndRunRequest) (*gatewayv1.EndRunResponse, error) {
	if _, err := s.getRun(ctx, req.GetRun()); err != nil {
		return nil, err
	}
	if _, err := s.runs.End(ctx, req.GetRun(), "ended"); err != nil {
		return nil, s.internal(ctx, "run end failed", err)
	}
	s.tapes.Forget(req.GetRun())
	run, err := s.getRun(ctx, req.GetRun())
	if err != nil {
		return nil, err
	}
	return &gatewayv1.EndRunResponse{Run: run}, nil
}

// GetRun returns a run with usage and state.
func (s *Server) GetRun(ctx context.Context, req *gatewayv1.GetRunRequest) (*gatewayv1.GetRunResponse, error) {
	run, err := s.getRun(ctx, req.GetRun())
	if err != nil {
		return nil, err
	}
	return &gatewayv1.GetRunResponse{Run: run}, nil
}

// ListRuns lists runs, newest first.
func (s *Server) ListRuns(ctx context.Context, req *gatewayv1.ListRunsRequest) (*gatewayv1.ListRunsResponse, error) {
	if req.GetPageSize() < 0 {
		return nil, fault.InvalidArgument("page_size", "page_size must not be negative")
	}
	list, next, err := s.runs.List(ctx, req.GetSession(), int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		if errors.Is(err, runs.ErrBadPageToken) {
			return nil, fault.InvalidArgument("page_token", "page_token is not one this server gave")
		}
		return nil, s.internal(ctx, "run list failed", err)
	}
	for _, r := range list {
		s.withURLs(r)
	}
	return &gatewayv1.ListRunsResponse{Runs: list, NextPageToken: next}, nil
}

func (s *Server) readTape(ctx context.Context, run *gatewayv1.Run) ([]*gatewayv1.Step, error) {
	steps, err := s.tapes.Read(ctx, run.GetId(), run.GetSteps())
	if errors.Is(err, tape.ErrNotFound) {
		return nil, fault.NotFound("TAPE_NOT_FOUND", "the tape of run %q is gone (deleted after %d days) or incomplete", run.GetId(), s.deps.TapeDays)
	}
	if err != nil {
		return nil, s.internal(ctx, "tape read failed", err)
	}
	return steps, nil
}

// GetTape returns every step of a run's tape.
func (s *Server) GetTape(ctx context.Context, req *gatewayv1.GetTapeRequest) (*gatewayv1.GetTapeResponse, error) {
	run, err := s.getRun(ctx, req.GetRun())
	if err != nil {
		return nil, err
	}
	steps, err := s.readTape(ctx, run)
	if err != nil {
		return nil, err
	}
	return &gatewayv1.GetTapeResponse{Run: run, Steps: steps}, nil
}

// ListSteps returns step summaries: no request or answer bodies.
func (s *Server) ListSteps(ctx context.Context, req *gatewayv1.ListStepsRequest) (*gatewayv1.ListStepsResponse, error) {
	run, err := s.getRun(ctx, req.GetRun())
	if err != nil {
		return nil, err
	}
	steps, err := s.readTape(ctx, run)
	if err != nil {
		return nil, err
	}
	for _, st := range steps {
		if st.Request != nil {
			st.Request.Body = nil
		}
		if st.Response != nil {
			st.Response.Body, st.Response.Events = nil, nil
		}
	}
	return &gatewayv1.ListStepsResponse{Steps: steps}, nil
}

// GetStep returns one step in full.
func (s *Server) GetStep(ctx context.Context, req *gatewayv1.GetStepRequest) (*gatewayv1.GetStepResponse, error) {
	run, err := s.getRun(ctx, req.GetRun())
	if err != nil {
		return nil, err
	}
	if req.GetSeq() <= 0 || req.GetSeq() > run.GetSteps() {
		return nil, fault.NotFound("STEP_NOT_FOUND", "run %q has no step %d (it has %d)", run.GetId(), req.GetSeq(), run.GetSteps())
	}
	st, err := s.tapes.Step(ctx, run.GetId(), req.GetSeq())
	if errors.Is(err, tape.ErrNotFound) {
		return nil, fault.NotFound("STEP_NOT_FOUND", "step %d of run %q is not on the tape", req.GetSeq(), run.GetId())
	}
	if err != nil {
		return nil, s.internal(ctx, "step read failed", err)
	}
	return &gatewayv1.GetStepResponse{Step: st}, nil
}

// ReportTreeHash records the caller's work tree hash at a step.
func (s *Server) ReportTreeHash(ctx context.Context, req *gatewayv1.ReportTreeHashRequest) (*gatewayv1.ReportTreeHashResponse, error) {
	if req.GetTreeHash() == "" {
		return nil, fault.InvalidArgument("tree_hash", "tree_hash is required")
	}
	run, err := s.getRun(ctx, req.GetRun())
	if err != nil {
		return nil, err
	}
	if req.GetSeq() <= 0 || req.GetSeq() > run.GetSteps() {
		return nil, fault.NotFound("STEP_NOT_FOUND", "run %q has no step %d (it has %d)", run.GetId(), req.GetSeq(), run.GetSteps())
	}
	err = s.tapes.SetTreeHash(ctx, run.GetId(), req.GetSeq(), req.GetTreeHash())
	if errors.Is(err, tape.ErrNotFound) {
		return nil, fault.NotFound("STEP_NOT_FOUND", "step %d of run %q is not on the tape yet", req.GetSeq(), run.GetId())
	}
	if err != nil {
		return nil, s.internal(ctx, "tree hash not recorded", err)
	}
	return &gatewayv1.ReportTreeHashResponse{}, nil
}

// SetReplay puts a run in replay mode against another run's tape.
func (s *Server) SetReplay(ctx context.Context, req *gatewayv1.SetReplayRequest) (*gatewayv1.SetReplayResponse, error) {
	rp := req.GetReplay()
	if rp == nil || rp.GetTapeRun() == "" {
		return nil, fault.InvalidArgument("replay.tape_run", "replay.tape_run is required")
	}
	if rp.GetAtSeq() < 0 {
		return nil, fault.InvalidArgument("replay.at_seq", "replay.at_seq must not be negative")
	}
	if req.GetRun() == "" && req.GetSession() != "" {
		return s.armReplay(ctx, req.GetSession(), rp)
	}
	run, err := s.getRun(ctx, req.GetRun())
	if err != nil {
		return nil, err
	}
	if run.GetSteps() > 0 {
		return nil, fault.FailedPrecondition("RUN_HAS_STEPS", "run %q already made %d model calls; replay must be set before the first", run.GetId(), run.GetSteps())
	}
	src, err := s.getRun(ctx, rp.GetTapeRun())
	if err != nil {
		return nil, err
	}
	if rp.GetAtSeq() > src.GetSteps() {
		return nil, fault.InvalidArgument("replay.at_seq", "replay.at_seq %d is past the end of %q's tape (%d steps)", rp.GetAtSeq(), src.GetId(), src.GetSteps())
	}
	updated, err := s.runs.SetReplay(ctx, run.GetId(), replayDefaults(rp))
	if err != nil {
		return nil, s.internal(ctx, "replay not set", err)
	}
	return &gatewayv1.SetReplayResponse{Run: s.withURLs(updated)}, nil
}

// replayDefaults copies rp with its unset choices filled in.
func replayDefaults(rp *gatewayv1.Replay) *gatewayv1.Replay {
	rp = &gatewayv1.Replay{TapeRun: rp.GetTapeRun(), AtSeq: rp.GetAtSeq(), OnDivergence: rp.GetOnDivergence(), AfterPrefix: rp.GetAfterPrefix(),
		OutsideOnly: rp.GetOutsideOnly(), TreeCheckAtEnd: rp.GetTreeCheckAtEnd()}
	if rp.OnDivergence == gatewayv1.OnDivergence_ON_DIVERGENCE_UNSPECIFIED {
		rp.OnDivergence = gatewayv1.OnDivergence_ON_DIVERGENCE_STOP
	}
	if rp.AfterPrefix == gatewayv1.AfterPrefix_AFTER_PREFIX_UNSPECIFIED {
		rp.AfterPrefix = gatewayv1.AfterPrefix_AFTER_PREFIX_LIVE
	}
	return rp
}

// armReplay keeps rp for session's first run: CreateRun of that session's
// turn 1 puts the new run in replay mode before it can make a call.
func (s *Server) armReplay(ctx context.Context, session string, rp *gatewayv1.Replay) (*gatewayv1.SetReplayResponse, error) {
	if !runs.ValidSessionName(session) {
		return nil, fault.InvalidArgument("session", "session %q is not a valid name (lowercase letters, digits and '-')", session)
	}
	src, err := s.getRun(ctx, rp.GetTapeRun())
	if err != nil {
		return nil, err
	}
	if rp.GetAtSeq() > src.GetSteps() {
		return nil, fault.InvalidArgument("replay.at_seq", "replay.at_seq %d is past the end of %q's tape (%d steps)", rp.GetAtSeq(), src.GetId(), src.GetSteps())
	}
	if err := s.runs.ArmReplay(ctx, session, replayDefaults(rp)); err != nil {
		return nil, s.internal(ctx, "replay not armed", err)
	}
	return &gatewayv1.SetReplayResponse{}, nil
}

// GetDivergence returns a replaying run's first divergence.
func (s *Server) GetDivergence(ctx context.Context, req *gatewayv1.GetDivergenceRequest) (*gatewayv1.GetDivergenceResponse, error) {
	if _, err := s.getRun(ctx, req.GetRun()); err != nil {
		return nil, err
	}
	d, n, err := s.runs.Divergence(ctx, req.GetRun())
	if err != nil {
		return nil, s.internal(ctx, "divergence read failed", err)
	}
	return &gatewayv1.GetDivergenceResponse{Divergence: d, ReplayedSteps: n}, nil
}

// SteerRun queues a message for the run's next model request.
func (s *Server) SteerRun(ctx context.Context, req *gatewayv1.SteerRunRequest) (*gatewayv1.SteerRunResponse, error) {
	if strings.TrimSpace(req.GetMessage()) == "" {
		return nil, fault.InvalidArgument("message", "message is required")
	}
	run, err := s.getRun(ctx, req.GetRun())
	if err != nil {
		return nil, err
	}
	if run.GetState() != gatewayv1.RunState_RUN_STATE_ACTIVE {
		return nil, fault.FailedPrecondition("RUN_NOT_ACTIVE", "run %q is %s; it takes no more model calls", run.GetId(), stateName(run.GetState()))
	}
	n, err := s.runs.Steer(ctx, run.GetId(), req.GetMessage())
	if err != nil {
		return nil, s.internal(ctx, "steer failed", err)
	}
	return &gatewayv1.SteerRunResponse{Queued: int32(n)}, nil
}

// ListToolCalls lists the tool calls a run with approvals held, pending
// and answered, in the order the model asked for them.
func (s *Server) ListToolCalls(ctx context.Context, req *gatewayv1.ListToolCallsRequest) (*gatewayv1.ListToolCallsResponse, error) {
	if _, err := s.getRun(ctx, req.GetRun()); err != nil {
		return nil, err
	}
	calls, err := s.runs.ToolCalls(ctx, req.GetRun())
	if err != nil {
		return nil, s.internal(ctx, "tool call list failed", err)
	}
	return &gatewayv1.ListToolCallsResponse{ToolCalls: calls}, nil
}

// AnswerToolCall allows or denies a held tool call; the held answer is
// released (allow) or replaced by a denial (deny) once every tool call of
// that answer is decided.
func (s *Server) AnswerToolCall(ctx context.Context, req *gatewayv1.AnswerToolCallRequest) (*gatewayv1.AnswerToolCallResponse, error) {
	if req.GetToolCallId() == "" {
		return nil, fault.InvalidArgument("tool_call_id", "tool_call_id is required")
	}
	if _, err := s.getRun(ctx, req.GetRun()); err != nil {
		return nil, err
	}
	tc, err := s.runs.AnswerToolCall(ctx, req.GetRun(), req.GetToolCallId(), req.GetAllow())
	switch {
	case errors.Is(err, runs.ErrToolCallNotFound):
		return nil, fault.NotFound("TOOL_CALL_NOT_FOUND", "run %q holds no tool call %q", req.GetRun(), req.GetToolCallId())
	case errors.Is(err, runs.ErrToolCallAnswered):
		return nil, fault.FailedPrecondition("TOOL_CALL_ANSWERED", "tool call %q was already answered the other way", req.GetToolCallId())
	case err != nil:
		return nil, s.internal(ctx, "tool call answer failed", err)
	}
	return &gatewayv1.AnswerToolCallResponse{ToolCall: tc}, nil
}

// GetUsage sums usage per run or per session (with a per-turn breakdown).
func (s *Server) GetUsage(ctx context.Context, req *gatewayv1.GetUsageRequest) (*gatewayv1.GetUsageResponse, error) {
	switch {
	case req.GetRun() != "":
		run, err := s.getRun(ctx, req.GetRun())
		if err != nil {
			return nil, err
		}
		return &gatewayv1.GetUsageResponse{Usage: run.GetUsage()}, nil
	case req.GetSession() != "":
		list, err := s.runs.SessionRuns(ctx, req.GetSession())
		if err != nil {
			return nil, s.internal(ctx, "usage read failed", err)
		}
		total := &gatewayv1.Usage{}
		turns := map[int32]*gatewayv1.Usage{}
		for _, r := range list {
			addUsage(total, r.GetUsage())
			t, ok := turns[r.GetTurn()]
			if !ok {
				t = &gatewayv1.Usage{}
				turns[r.GetTurn()] = t
			}
			addUsage(t, r.GetUsage())
		}
		return &gatewayv1.GetUsageResponse{Usage: total, Turns: turns}, nil
	}
	return nil, fault.InvalidArgument("session", "session or run is required")
}

func addUsage(dst, u *gatewayv1.Usage) {
	dst.InputTokens += u.GetInputTokens()
	dst.OutputTokens += u.GetOutputTokens()
	dst.CacheReadTokens += u.GetCacheReadTokens()
	dst.CacheWriteTokens += u.GetCacheWriteTokens()
	dst.CostUsd += u.GetCostUsd()
	dst.ModelCalls += u.GetModelCalls()
}

func stateName(st gatewayv1.RunState) string {
	return strings.ToLower(strings.TrimPrefix(st.String(), "RUN_STATE_"))
}
