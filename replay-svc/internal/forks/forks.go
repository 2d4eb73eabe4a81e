// Package forks carries out forks at a step: it rebuilds a recorded run's
// state at step N in a fresh session whose first run the gateway answers
// from the run's tape (checking every request), then copies that session
// for the k live continuations (trials).
//
// The prefix is rebuilt once, in the prefix session <fork>-prefix: its first
// run is armed on the gateway before the session exists, so the harness's
// very first call is replayed; the gateway stops the run after checking the
// request that follows step N. The trials <fork>.<n> are session forks of
// the prefix session (<fork>-<n>: the same sandbox copy session forks use),
// each sent the continuation message with the fork's budget, live.
//
// A fork's progress is in its record: a restart finds the forks still
// replaying and the trials still live and carries on with them (every step
// is idempotent: the prefix session and the trial sessions have fixed
// names), so nothing stays replaying forever; a step that cannot be carried
// out ends the fork failed, saying why.
package forks

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/platform/fault"
)

// ContinueMessage is the first message of every trial: the trial's harness
// resumes the prefix's conversation (its tool results of step N included)
// and goes on live.
const ContinueMessage = "Continue from where you stopped."

// DefaultBudget is each continuation's budget when the request sets none.
const DefaultBudget = 5.0

// forkMaxPerCall is how many forks one ForkSession call may make
// (HANGAR_FORK_MAX's default).
const forkMaxPerCall = 8

type grpcCallOption = grpc.CallOption

// Store is where forks and trials are kept.
type Store interface {
	CreateFork(ctx context.Context, f *replayv1.Fork) error
	UpdateFork(ctx context.Context, f *replayv1.Fork) error
	UpdateTrial(ctx context.Context, t *replayv1.Trial) error
	GetFork(ctx context.Context, id string) (*replayv1.Fork, error)
	ListForks(ctx context.Context, run string, statuses []replayv1.ForkStatus, offset, limit int) ([]*replayv1.Fork, error)
	ListTrials(ctx context.Context, fork, forkOf string) ([]*replayv1.Trial, error)
	GetTrial(ctx context.Context, id string) (*replayv1.Trial, error)
	// TakeLease takes or renews holder's lease id until now+ttl; false
	// while another holder's lease has not expired.
	TakeLease(ctx context.Context, id, holder string, now time.Time, ttl time.Duration) (bool, error)
	ReleaseLease(ctx context.Context, id, holder string) error
}

// Gateway is the part of gateway-svc a fork uses.
type Gateway interface {
	GetRun(ctx context.Context, in *gatewayv1.GetRunRequest, opts ...grpcCallOption) (*gatewayv1.GetRunResponse, error)
	GetTape(ctx context.Context, in *gatewayv1.GetTapeRequest, opts ...grpcCallOption) (*gatewayv1.GetTapeResponse, error)
	SetReplay(ctx context.Context, in *gatewayv1.SetReplayRequest, opts ...grpcCallOption) (*gatewayv1.SetReplayResponse, error)
	GetDivergence(ctx context.Context, in *gatewayv1.GetDivergenceRequest, opts ...grpcCallOption) (*gatewayv1.GetDivergenceResponse, error)
}

// Sessions is the part of session-svc a fork uses.
type Sessions interface {
	GetSession(ctx context.Context, in *sessionv1.GetSessionRequest, opts ...grpcCallOption) (*sessionv1.GetSessionResponse, error)
	CreateSession(ctx context.Context, in *sessionv1.CreateSessionRequest, opts ...grpcCallOption) (*sessionv1.CreateSessionResponse, error)
	ForkSession(ctx context.Context, in *sessionv1.ForkSessionRequest, opts ...grpcCallOption) (*sessionv1.ForkSessionResponse, error)
	SuspendSession(ctx context.Context, in *sessionv1.SuspendSessionRequest, opts ...grpcCallOption) (*sessionv1.SuspendSessionResponse, error)
	SendMessage(ctx context.Context, in *sessionv1.SendMessageRequest, opts ...grpcCallOption) (*sessionv1.SendMessageResponse, error)
	GetTurn(ctx context.Context, in *sessionv1.GetTurnRequest, opts ...grpcCallOption) (*sessionv1.GetTurnResponse, error)
	WaitForTurn(ctx context.Context, in *sessionv1.WaitForTurnRequest, opts ...grpcCallOption) (sessionv1.SessionService_WaitForTurnClient, error)
	GetHarnessLock(ctx context.Context, in *sessionv1.GetHarnessLockRequest, opts ...grpcCallOption) (*sessionv1.GetHarnessLockResponse, error)
}

// Environments is the part of sandbox-svc a fork uses: the replay
// environment is derived from the run's.
type Environments interface {
	GetEnvironment(ctx context.Context, in *sandboxv1.GetEnvironmentRequest, opts ...grpcCallOption) (*sandboxv1.GetEnvironmentResponse, error)
	ApplyEnvironment(ctx context.Context, in *sandboxv1.ApplyEnvironmentRequest, opts ...grpcCallOption) (*sandboxv1.ApplyEnvironmentResponse, error)
}

// Jobs is the part of session-svc's job service A/A uses.
type Jobs interface {
	ListJobs(ctx context.Context, in *sessionv1.ListJobsRequest, opts ...grpcCallOption) (*sessionv1.ListJobsResponse, error)
}

// Checks runs a job's check (a shell command) in a session's sandbox and
// returns its exit code.
type Checks interface {
	Check(ctx context.Context, session, check string) (int, error)
}

// Options configures a Manager.
type Options struct {
	Store    Store
	Gateway  Gateway
	Sessions Sessions
	// Environments makes the sealed replay environments; nil replays in
	// the run's own environment (tests of the bookkeeping only).
	Environments Environments
	// Jobs finds the best-of-N job a forked run was an attempt of, and
	// Checks runs its check on a trial (A/A); either nil: no aa.
	Jobs   Jobs
	Checks Checks
	Logger *slog.Logger
	// MaxContinuations bounds continuations (at most 10).
	MaxContinuations int
	// Settle bounds how long a prefix or a trial is waited for before the
	// fork is marked failed (default 3 hours).
	Settle time.Duration
	// Retry is the pause between attempts at a call that failed for a
	// reason that passes (default 1s).
	Retry time.Duration
	Now   func() time.Time
	// Holder names this process in its leases (default: random). Every
	// replica on one database drives a fork or follows a trial only under
	// its lease, so one replica does it.
	Holder string
	// LeaseTTL is how long a lease outlives its holder's last renewal
	// (renewed every third of it): a replica killed outright leaves its
	// forks to the others this long after (default 30s).
	LeaseTTL time.Duration
	// Rescan is how often the forks still replaying and the trials still
	// live are looked for, to take over those whose lease has expired
	// (default LeaseTTL/2).
	Rescan time.Duration
}

// Manager forks runs.
type Manager struct {
	o     Options
	queue chan string
	// trialQueue are trials to watch until they end.
	trialQueue chan string

	mu      sync.Mutex
	settled map[string]chan struct{}
	// driving are the leases this process holds (fork:<id>, trial:<id>).
	driving map[string]bool
}

// New returns a Manager; Run carries the forks out.
func New(o Options) *Manager {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxContinuations <= 0 || o.MaxContinuations > 10 {
		o.MaxContinuations = 10
	}
	if o.Settle <= 0 {
		o.Settle = 3 * time.Hour
	}
	if o.Retry <= 0 {
		o.Retry = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Holder == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		o.Holder = hex.EncodeToString(b)
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 30 * time.Second
	}
	if o.Rescan <= 0 {
		o.Rescan = o.LeaseTTL / 2
	}
	return &Manager{o: o, queue: make(chan string, 256), trialQueue: make(chan string, 256), settled: map[string]chan struct{}{}, driving: map[string]bool{}}
}

// Fork is a validated ForkRun request.
type Fork struct {
	Run           string
	AtSeq         int32
	Continuations int32
	PinSet        string
	OnDivergence  replayv1.OnDivergence
	Budget        *replayv1.Budget
	Wait          time.Duration
}

// Validate checks a ForkRun request and fills in its defaults.
func (m *Manager) Validate(req *replayv1.ForkRunRequest) (Fork, error) {
	f := Fork{Run: req.GetRun(), AtSeq: req.GetAtSeq(), Continuations: 1, PinSet: req.GetPinSet(),
		OnDivergence: req.GetOnDivergence(), Budget: req.GetBudget(), Wait: time.Duration(req.GetWaitSeconds()) * time.Second}
	if f.Run == "" {
		return f, fault.InvalidArgument("run", "run is required: the run to fork (turns[0].run_id of a session)")
	}
	if f.AtSeq < 0 {
		return f, fault.InvalidArgument("at_seq", "at_seq must be 0 or more, got %d", f.AtSeq)
	}
	if req.Continuations != nil {
		f.Continuations = req.GetContinuations()
	}
	if f.Continuations < 0 || int(f.Continuations) > m.o.MaxContinuations {
		return f, fault.InvalidArgument("continuations", "continuations must be 0 to %d, got %d", m.o.MaxContinuations, f.Continuations)
	}
	if f.OnDivergence == replayv1.OnDivergence_ON_DIVERGENCE_UNSPECIFIED {
		f.OnDivergence = replayv1.OnDivergence_ON_DIVERGENCE_STOP
	}
	if _, ok := replayv1.OnDivergence_name[int32(f.OnDivergence)]; !ok {
		return f, fault.InvalidArgument("on_divergence", "on_divergence must be stop or live")
	}
	if b := f.Budget; b != nil && (b.GetMaxCostUsd() < 0 || b.GetMaxTokens() < 0 || b.GetMaxMinutes() < 0) {
		return f, fault.InvalidArgument("budget", "budget limits must not be negative")
	}
	if f.Budget == nil || proto.Equal(f.Budget, &replayv1.Budget{}) {
		f.Budget = &replayv1.Budget{MaxCostUsd: DefaultBudget}
	}
	if req.GetWaitSeconds() < 0 {
		return f, fault.InvalidArgument("wait_seconds", "wait_seconds must be 0 or more, got %d", req.GetWaitSeconds())
	}
	return f, nil
}

// replayable are the harnesses whose model traffic goes through the gateway.
var replayable = map[string]sessionv1.Harness{
	"claude": sessionv1.Harness_HARNESS_CLAUDE,
	"codex":  sessionv1.Harness_HARNESS_CODEX,
	"pi":     sessionv1.Harness_HARNESS_PI,
}

// Start records a fork of in.Run and queues its replay. It returns the fork
// once it settled or in.Wait passed.
func (m *Manager) Start(ctx context.Context, in Fork) (*replayv1.Fork, error) {
	run, err := m.o.Gateway.GetRun(ctx, &gatewayv1.GetRunRequest{Run: in.Run})
	if err != nil {
		if fault.Status(err).Code() == codes.NotFound {
			return nil, fault.NotFound("RUN_NOT_FOUND", "run %q not found", in.Run)
		}
		return nil, fmt.Errorf("get run %s: %w", in.Run, err)
	}
	r := run.GetRun()
	if r.GetTurn() > 1 {
		return nil, fault.FailedPrecondition("NOT_FIRST_RUN",
			"run %s is turn %d of session %s: only a session's first run can be forked (a later turn resumes a conversation a fresh sandbox does not have)", r.GetId(), r.GetTurn(), r.GetSession())
	}
	now := m.o.Now()
	f := &replayv1.Fork{
		Fork: newForkID(), Run: r.GetId(), Status: replayv1.ForkStatus_FORK_STATUS_REPLAYING, AtSeq: in.AtSeq,
		Continuations: in.Continuations, PinSet: in.PinSet, OnDivergence: in.OnDivergence, Budget: in.Budget,
		Tainted: r.GetTainted(), CreatedAt: timestamppb.New(now), Harness: r.GetHarness(),
	}
	if _, ok := replayable[r.GetHarness()]; !ok {
		f.Status = replayv1.ForkStatus_FORK_STATUS_UNREPLAYED
		f.StatusReason = fmt.Sprintf("the run's harness (%s) has no model gateway path: there is no tape to replay", r.GetHarness())
		if err := m.o.Store.CreateFork(ctx, f); err != nil {
			return nil, fmt.Errorf("record fork: %w", err)
		}
		return f, nil
	}
	tape, err := m.o.Gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: r.GetId()})
	if err != nil && fault.Status(err).Code() != codes.NotFound {
		return nil, fmt.Errorf("get tape of %s: %w", r.GetId(), err)
	}
	if err != nil || len(tape.GetSteps()) == 0 {
		return nil, fault.FailedPrecondition("TAPE_EXPIRED",
			"the tape of run %s is no longer kept (tapes are kept HANGAR_MODEL_TAPE_DAYS days): it cannot be replayed", r.GetId())
	}
	if int(in.AtSeq) > len(tape.GetSteps()) {
		return nil, fault.InvalidArgument("at_seq", "at_seq %d is past the end of run %s's tape (%d steps)", in.AtSeq, r.GetId(), len(tape.GetSteps()))
	}
	if Prompt(tape.GetSteps()[0]) == "" {
		return nil, fault.FailedPrecondition("TAPE_WITHOUT_PROMPT", "the first request on run %s's tape holds no user prompt to start the replay with", r.GetId())
	}
	if in.PinSet != "" {
		ref, err := m.checkPinSet(ctx, in.PinSet)
		if err != nil {
			return nil, err
		}
		f.PinSet = ref
	}
	if _, err := m.o.Sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: r.GetSession()}); err != nil {
		if fault.Status(err).Code() == codes.NotFound {
			return nil, fault.FailedPrecondition("SESSION_GONE", "run %s's session %s no longer exists: its base commit and environment are unknown", r.GetId(), r.GetSession())
		}
		return nil, fmt.Errorf("get session %s: %w", r.GetSession(), err)
	}
	f.PrefixSession = f.Fork + "-prefix"
	for i := 1; i <= int(in.Continuations); i++ {
		id := f.Fork + "." + strconv.Itoa(i)
		f.TrialIds = append(f.TrialIds, id)
		f.Trials = append(f.Trials, &replayv1.Trial{Id: id, Fork: f.Fork, Source: "experiment", ForkOf: r.GetId(),
			Status: replayv1.TrialStatus_TRIAL_STATUS_REPLAYING, Tainted: r.GetTainted(), CreatedAt: timestamppb.New(now), PinSet: f.PinSet})
	}
	settled := m.watch(f.Fork)
	if err := m.o.Store.CreateFork(ctx, f); err != nil {
		return nil, fmt.Errorf("record fork: %w", err)
	}
	m.queue <- f.Fork
	if in.Wait > 0 {
		m.waitSettled(ctx, f.Fork, settled, in.Wait)
	}
	return m.o.Store.GetFork(ctx, f.Fork)
}

// waitSettled waits up to d for fork to leave replaying: told by this
// process, or read from the store (another replica may drive it).
func (m *Manager) waitSettled(ctx context.Context, fork string, settled <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	poll := time.NewTicker(time.Second)
	defer poll.Stop()
	for {
		select {
		case <-settled:
			return
		case <-t.C:
			return
		case <-ctx.Done():
			return
		case <-poll.C:
			if f, err := m.o.Store.GetFork(ctx, fork); err == nil && f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_REPLAYING {
				return
			}
		}
	}
}

func newForkID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "job-" + hex.EncodeToString(b)
}

// watch returns a channel closed when fork leaves replaying.
func (m *Manager) watch(fork string) <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch, ok := m.settled[fork]
	if !ok {
		ch = make(chan struct{})
		m.settled[fork] = ch
	}
	return ch
}

func (m *Manager) settle(fork string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ch, ok := m.settled[fork]; ok {
		close(ch)
		delete(m.settled, fork)
	}
}

// Run carries out queued forks until ctx ends: first those a restart (or
// another replica that stopped) left replaying and the trials it left
// live, then each new one; every Rescan it looks again for those whose
// lease has expired. Each is driven under its lease (lead), so of the
// replicas on one database one drives it.
func (m *Manager) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	m.resume(ctx, &wg)
	rescan := time.NewTicker(m.o.Rescan)
	defer rescan.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-rescan.C:
			m.resume(ctx, &wg)
		case id := <-m.queue:
			wg.Go(func() { m.lead(ctx, "fork:"+id, func(ctx context.Context) { m.replay(ctx, id) }) })
		case id := <-m.trialQueue:
			wg.Go(func() { m.lead(ctx, "trial:"+id, func(ctx context.Context) { m.follow(ctx, id) }) })
		}
	}
}

// resume takes up the forks still replaying and the trials still live
// that no live process drives (no lease, or an expired one).
func (m *Manager) resume(ctx context.Context, wg *sync.WaitGroup) {
	if pending, err := m.o.Store.ListForks(ctx, "", []replayv1.ForkStatus{replayv1.ForkStatus_FORK_STATUS_REPLAYING}, 0, 0); err != nil {
		m.o.Logger.ErrorContext(ctx, "replaying forks not resumed", "error", err)
	} else {
		for _, f := range pending {
			id := f.GetFork()
			wg.Go(func() {
				m.lead(ctx, "fork:"+id, func(ctx context.Context) {
					m.o.Logger.InfoContext(ctx, "fork resumed: it was replaying with no replica driving it", "fork", id)
					m.replay(ctx, id)
				})
			})
		}
	}
	if trials, err := m.o.Store.ListTrials(ctx, "", ""); err != nil {
		m.o.Logger.ErrorContext(ctx, "live trials not resumed", "error", err)
	} else {
		for _, t := range trials {
			if t.GetStatus() == replayv1.TrialStatus_TRIAL_STATUS_LIVE {
				id := t.GetId()
				wg.Go(func() { m.lead(ctx, "trial:"+id, func(ctx context.Context) { m.follow(ctx, id) }) })
			}
		}
	}
}

// errLeaseLost ends work whose lease another replica took (this one could
// not renew it in time).
var errLeaseLost = errors.New("lease lost to another replica")

// lead runs work under the lease key, renewed every LeaseTTL/3 while it
// runs and released after; it does nothing when this process already
// drives key or another replica holds its lease. work's context ends when
// the lease could not be renewed within LeaseTTL (another replica may have
// it by then): work left part-done is carried on by the holder, every
// step being idempotent.
func (m *Manager) lead(ctx context.Context, key string, work func(context.Context)) {
	m.mu.Lock()
	if m.driving[key] {
		m.mu.Unlock()
		return
	}
	m.driving[key] = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.driving, key)
		m.mu.Unlock()
	}()
	ok, err := m.o.Store.TakeLease(ctx, key, m.o.Holder, m.o.Now(), m.o.LeaseTTL)
	if err != nil {
		m.o.Logger.WarnContext(ctx, "lease not taken", "lease", key, "error", err)
		return
	}
	if !ok {
		return
	}
	workCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		t := time.NewTicker(m.o.LeaseTTL / 3)
		defer t.Stop()
		last := m.o.Now()
		for {
			select {
			case <-workCtx.Done():
				return
			case <-t.C:
			}
			ok, err := m.o.Store.TakeLease(workCtx, key, m.o.Holder, m.o.Now(), m.o.LeaseTTL)
			switch {
			case err == nil && ok:
				last = m.o.Now()
			case err == nil || m.o.Now().Sub(last) >= m.o.LeaseTTL:
				if workCtx.Err() == nil {
					m.o.Logger.WarnContext(ctx, "lease lost: another replica carries on", "lease", key, "error", err)
				}
				cancel(errLeaseLost)
				return
			}
		}
	}()
	work(workCtx)
	cancel(nil)
	<-renewed
	if err := m.o.Store.ReleaseLease(context.WithoutCancel(ctx), key, m.o.Holder); err != nil {
		m.o.Logger.WarnContext(ctx, "lease not released", "lease", key, "error", err)
	}
}

// replay rebuilds fork's prefix and starts its trials.
func (m *Manager) replay(ctx context.Context, id string) {
	log := m.o.Logger.With("fork", id)
	f, err := m.o.Store.GetFork(ctx, id)
	if err != nil {
		log.ErrorContext(ctx, "fork not read", "error", err)
		return
	}
	if f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_REPLAYING {
		m.settle(id)
		return
	}
	if err := m.rebuild(ctx, f); err != nil {
		if ctx.Err() != nil {
			// Shutting down: the next start carries on.
			return
		}
		log.ErrorContext(ctx, "fork failed", "error", err)
		f.Status = replayv1.ForkStatus_FORK_STATUS_FAILED
		f.StatusReason = failureReason(err)
		for _, t := range f.GetTrials() {
			if t.GetStatus() == replayv1.TrialStatus_TRIAL_STATUS_REPLAYING {
				t.Status, t.EndedAt = replayv1.TrialStatus_TRIAL_STATUS_ENDED, timestamppb.New(m.o.Now())
				t.Outcome = replayv1.TrialOutcome_TRIAL_OUTCOME_FAILED
				m.saveTrial(ctx, t)
			}
		}
		m.saveFork(ctx, f)
	}
	m.settle(id)
}

// failureReason is what a user reads: a fault's own message, else a
// generic one (internal error text stays in the log).
func failureReason(err error) string {
	var ue userError
	if errors.As(err, &ue) {
		return string(ue)
	}
	what := "the replay could not be carried out"
	var se stageError
	if errors.As(err, &se) {
		what = "the replay failed while " + se.stage
	}
	// Another service's answer is for users (its interceptor keeps
	// internal text out); this service's own internal errors are not.
	if st := fault.Status(err); st.Code() != codes.Unknown && st.Code() != codes.Internal {
		return what + ": " + st.Message()
	}
	return what + " (see replay-svc's log)"
}

// stageError says which step of a replay failed.
type stageError struct {
	stage string
	err   error
}

func (e stageError) Error() string { return e.stage + ": " + e.err.Error() }
func (e stageError) Unwrap() error { return e.err }

func stage(what string, err error) error { return stageError{stage: what, err: err} }

// userError is a failure whose text is for the user.
type userError string

func (e userError) Error() string { return string(e) }

func (m *Manager) saveFork(ctx context.Context, f *replayv1.Fork) {
	if err := m.o.Store.UpdateFork(context.WithoutCancel(ctx), f); err != nil {
		m.o.Logger.ErrorContext(ctx, "fork not recorded", "fork", f.GetFork(), "error", err)
	}
}

func (m *Manager) saveTrial(ctx context.Context, t *replayv1.Trial) {
	if err := m.o.Store.UpdateTrial(context.WithoutCancel(ctx), t); err != nil {
		m.o.Logger.ErrorContext(ctx, "trial not recorded", "trial", t.GetId(), "error", err)
	}
}

func (m *Manager) rebuild(ctx context.Context, f *replayv1.Fork) error {
	run, err := m.o.Gateway.GetRun(ctx, &gatewayv1.GetRunRequest{Run: f.GetRun()})
	if err != nil {
		return stage("reading the run", err)
	}
	src, err := m.o.Sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: run.GetRun().GetSession()})
	if err != nil {
		return stage("reading the run's session", err)
	}
	prefix := f.GetPrefixSession()
	// The prefix's tree is checked at its end only (its replayed answers
	// wait for no tree hash); a tree divergence is localised after.
	if err := m.replaySession(ctx, f, src.GetSession(), run.GetRun(), prefix, &gatewayv1.Replay{
		TapeRun: f.GetRun(), AtSeq: f.GetAtSeq(), OnDivergence: gatewayv1.OnDivergence_ON_DIVERGENCE_STOP,
		AfterPrefix: gatewayv1.AfterPrefix_AFTER_PREFIX_STOP, TreeCheckAtEnd: true,
	}); err != nil {
		return err
	}
	turn, err := m.waitTurn(ctx, prefix, 1)
	if err != nil {
		return stage("waiting for the prefix session's turn", err)
	}
	if turn.GetRunId() == "" {
		return userError(fmt.Sprintf("the prefix session's turn ended before its model run started: %s", turn.GetOutcomeReason()))
	}
	div, err := m.o.Gateway.GetDivergence(ctx, &gatewayv1.GetDivergenceRequest{Run: turn.GetRunId()})
	if err != nil {
		return stage("reading the prefix run's divergence", err)
	}
	if div.GetDivergence() == nil && div.GetReplayedSteps() < f.GetAtSeq() {
		// Stopped half way without a divergence (a restart drained it,
		// the harness died): rebuild again in a fresh session, a few
		// times at most.
		attempt := prefixAttempt(f.GetFork(), prefix)
		if attempt >= maxPrefixAttempts {
			return userError(fmt.Sprintf("the prefix replay stopped short %d times (last after %d of %d steps, without a divergence): %s",
				attempt, div.GetReplayedSteps(), f.GetAtSeq(), strings.TrimSpace(turn.GetOutcomeReason())))
		}
		f.PrefixSession = fmt.Sprintf("%s-prefix-%d", f.GetFork(), attempt+1)
		m.saveFork(ctx, f)
		return m.rebuild(ctx, f)
	}
	if d := div.GetDivergence(); d.GetKind() == gatewayv1.DivergenceKind_DIVERGENCE_KIND_TREE && f.GetAtSeq() > 1 {
		loc, err := m.localiseTree(ctx, f, src.GetSession(), run.GetRun(), prefix, d)
		if err != nil {
			return err
		}
		div.Divergence = loc
	}
	f.ReplayedSteps = div.GetReplayedSteps()
	if d := div.GetDivergence(); d != nil {
		f.Divergence = &replayv1.Divergence{Seq: d.GetSeq(), Kind: replayv1.DivergenceKind(d.GetKind()), Detail: d.GetDetail(),
			Expected: d.GetExpected(), Actual: d.GetActual()}
		if len(f.GetTrialIds()) > 0 {
			f.Divergence.Trial = f.GetTrialIds()[0]
		}
	}
	if f.GetDivergence() != nil {
		f.Status = replayv1.ForkStatus_FORK_STATUS_DIVERGED
		f.StatusReason = fmt.Sprintf("the replay diverged at step %d", f.GetDivergence().GetSeq())
	}
	if f.GetContinuations() == 0 {
		if f.GetDivergence() == nil {
			f.Status = replayv1.ForkStatus_FORK_STATUS_VERIFIED
			f.StatusReason = fmt.Sprintf("steps 1-%d reproduced", f.GetAtSeq())
		}
		m.saveFork(ctx, f)
		return nil
	}
	if f.GetDivergence() != nil && f.GetOnDivergence() != replayv1.OnDivergence_ON_DIVERGENCE_LIVE {
		for _, t := range f.GetTrials() {
			t.Status, t.Divergence, t.EndedAt = replayv1.TrialStatus_TRIAL_STATUS_DIVERGED, f.GetDivergence(), timestamppb.New(m.o.Now())
			m.saveTrial(ctx, t)
		}
		m.saveFork(ctx, f)
		return nil
	}
	if err := m.startTrials(ctx, f); err != nil {
		return err
	}
	if f.GetDivergence() == nil {
		f.Status = replayv1.ForkStatus_FORK_STATUS_FORKED
		f.StatusReason = ""
	}
	m.saveFork(ctx, f)
	return nil
}

// replaySession starts (or finds started) the session prefix that
// replays f's run as rp says: armed on the gateway, created on the run's
// sealed replay environment at the run's base commit with the run's
// harness, model and prompt, its first turn sent. It is idempotent.
func (m *Manager) replaySession(ctx context.Context, f *replayv1.Fork, s *sessionv1.Session, run *gatewayv1.Run, prefix string, rp *gatewayv1.Replay) error {
	if _, err := m.o.Sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: prefix}); fault.Status(err).Code() == codes.NotFound {
		tape, err := m.o.Gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: f.GetRun()})
		if err != nil || len(tape.GetSteps()) == 0 {
			return userError(fmt.Sprintf("the tape of run %s could not be read: it may have expired", f.GetRun()))
		}
		// Arm the gateway first: the session's first run replays from
		// its first call, and stops after checking the request that
		// follows step N.
		if err := m.retryUnavailable(ctx, func() error {
			_, err := m.o.Gateway.SetReplay(ctx, &gatewayv1.SetReplayRequest{Session: prefix, Replay: rp})
			return err
		}); err != nil {
			return stage("arming the gateway for the prefix session", err)
		}
		req := &sessionv1.CreateSessionRequest{
			Name: prefix, Repo: s.GetRepo(), Harness: replayable[f.GetHarness()],
			BaseCommit: s.GetBaseCommit(), Message: Prompt(tape.GetSteps()[0]), Model: run.GetModel(),
			// The taped steps make no model call; the budget only
			// bounds what a broken replay could spend.
			Budget: &sessionv1.Budget{MaxCostUsd: f.GetBudget().GetMaxCostUsd()},
		}
		envName := s.GetEnvironment()
		if f.GetPinSet() != "" {
			lock, err := m.o.Sessions.GetHarnessLock(ctx, &sessionv1.GetHarnessLockRequest{Lock: f.GetPinSet()})
			if err != nil {
				return stage("reading the pin set", err)
			}
			// The pin set's environment, on the run's repository (the
			// base commit is there).
			envName = lock.GetLock().GetEnvironment()
			if req.Repo == "" {
				if req.Repo, err = m.environmentRepository(ctx, s.GetEnvironment()); err != nil {
					return stage("reading the run's environment", err)
				}
			}
			if lock.GetLock().GetHarness() != replayable[f.GetHarness()] {
				// Another harness: the tape replays only on the CLI that
				// made it, so the prefix runs the lock's harness and the
				// gateway finds its first request is not the tape's (a
				// divergence at step 1, kind model), by design.
				req.Harness, req.Model, req.HarnessLock = sessionv1.Harness_HARNESS_UNSPECIFIED, "", f.GetPinSet()
			}
		}
		env, err := m.replayEnvironment(ctx, envName)
		if err != nil {
			return stage("making the replay environment", err)
		}
		req.Environment = env
		if err := m.retryUnavailable(ctx, func() error {
			_, err := m.o.Sessions.CreateSession(ctx, req)
			if fault.Status(err).Code() == codes.AlreadyExists {
				return nil
			}
			return err
		}); err != nil {
			return stage("creating the prefix session", err)
		}
	} else if err != nil {
		return stage("reading the prefix session", err)
	}
	// A session made while session-svc was draining has no turn yet.
	if got, err := m.o.Sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: prefix}); err != nil {
		return stage("reading the prefix session", err)
	} else if len(got.GetSession().GetTurns()) == 0 {
		tape, err := m.o.Gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: f.GetRun()})
		if err != nil || len(tape.GetSteps()) == 0 {
			return userError(fmt.Sprintf("the tape of run %s could not be read: it may have expired", f.GetRun()))
		}
		if err := m.retryUnavailable(ctx, func() error {
			_, err := m.o.Sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: prefix, Message: Prompt(tape.GetSteps()[0]),
				Budget: &sessionv1.Budget{MaxCostUsd: f.GetBudget().GetMaxCostUsd()}})
			return err
		}); err != nil {
			return stage("starting the prefix session's turn", err)
		}
	}
	return nil
}

// localiseTree finds the step that left another work tree than the run
// recorded, for a tree divergence d the prefix saw at its end (its tree is
// hashed only at its last two requests, so d's step is where the
// difference was seen, not where it was made): a second replay, session
// <prefix>-tree, of steps 1..d.seq-1 hashes the tree at every step and
// stops at the first difference. Its divergence, when it has one at or
// before d's step (of any kind: it is the same replay), is the fork's;
// else d (a difference the second replay did not reproduce).
func (m *Manager) localiseTree(ctx context.Context, f *replayv1.Fork, s *sessionv1.Session, run *gatewayv1.Run, prefix string, d *gatewayv1.Divergence) (*gatewayv1.Divergence, error) {
	name := prefix + "-tree"
	if err := m.replaySession(ctx, f, s, run, name, &gatewayv1.Replay{
		TapeRun: f.GetRun(), AtSeq: d.GetSeq() - 1, OnDivergence: gatewayv1.OnDivergence_ON_DIVERGENCE_STOP,
		AfterPrefix: gatewayv1.AfterPrefix_AFTER_PREFIX_STOP,
	}); err != nil {
		return nil, err
	}
	turn, err := m.waitTurn(ctx, name, 1)
	if err != nil {
		return nil, stage("waiting for the tree divergence's second replay", err)
	}
	if turn.GetRunId() == "" {
		return d, nil
	}
	got, err := m.o.Gateway.GetDivergence(ctx, &gatewayv1.GetDivergenceRequest{Run: turn.GetRunId()})
	if err != nil {
		return nil, stage("reading the second replay's divergence", err)
	}
	if l := got.GetDivergence(); l != nil && l.GetSeq() <= d.GetSeq() {
		return l, nil
	}
	return d, nil
}

// maxPrefixAttempts bounds how often an interrupted prefix is rebuilt.
const maxPrefixAttempts = 3

// prefixAttempt is which attempt the prefix session name is: <fork>-prefix
// is 1, <fork>-prefix-<n> is n.
func prefixAttempt(fork, name string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(name, fork+"-prefix-"))
	if err != nil {
		return 1
	}
	return n
}

// ReplayEnvironment is the name of the sealed environment the replays of
// env's runs use.
func ReplayEnvironment(env string) string {
	const suffix = "-replay"
	if strings.HasSuffix(env, suffix) {
		return env
	}
	if len(env)+len(suffix) > 63 {
		env = strings.TrimRight(env[:63-len(suffix)], "-")
	}
	return env + suffix
}

// replayEnvironment applies the sealed copy of environment env and returns
// its name: the same repository, base, setup, image, driver and resources,
// egress none (the sandbox reaches the gateway through its relay and
// nothing else), none of env's variables (where its secrets are) and no
// warm pool.
func (m *Manager) replayEnvironment(ctx context.Context, env string) (string, error) {
	if m.o.Environments == nil {
		return env, nil
	}
	var src *sandboxv1.Environment
	if err := m.retryUnavailable(ctx, func() error {
		resp, err := m.o.Environments.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: env})
		src = resp.GetEnvironment()
		return err
	}); err != nil {
		return "", fmt.Errorf("get environment %s: %w", env, err)
	}
	if sealedEnvironment(src) {
		return env, nil
	}
	name := ReplayEnvironment(env)
	if name == env && len(env)+len("-replay") <= 63 {
		name = env + "-replay" // an open environment named like a sealed one
	}
	// Never overwrite an environment that is not sealed (a user's own
	// environment that happens to have the name): it would lose its
	// egress and its variables.
	var existing *sandboxv1.Environment
	if err := m.retryUnavailable(ctx, func() error {
		resp, err := m.o.Environments.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: name})
		if fault.Status(err).Code() == codes.NotFound {
			return nil
		}
		existing = resp.GetEnvironment()
		return err
	}); err != nil {
		return "", fmt.Errorf("get environment %s: %w", name, err)
	}
	if existing != nil && !sealedEnvironment(existing) {
		return "", userError(fmt.Sprintf("the replay environment of %s would be %s, an environment that is not sealed (egress, variables or a warm pool): rename it to fork this run", env, name))
	}
	sealed := &sandboxv1.Environment{
		Name: name, Repository: src.GetRepository(), BaseRef: src.GetBaseRef(), Setup: src.GetSetup(),
		Egress: sandboxv1.Egress_EGRESS_NONE, Resources: src.GetResources(), Driver: src.GetDriver(), Image: src.GetImage(),
		CacheTtl: src.GetCacheTtl(),
	}
	if err := m.retryUnavailable(ctx, func() error {
		_, err := m.o.Environments.ApplyEnvironment(ctx, &sandboxv1.ApplyEnvironmentRequest{Environment: sealed})
		return err
	}); err != nil {
		return "", fmt.Errorf("apply environment %s: %w", sealed.GetName(), err)
	}
	return sealed.GetName(), nil
}

// sealedEnvironment reports whether e is as a replay's environment must
// be: egress none, no variables, no warm pool.
func sealedEnvironment(e *sandboxv1.Environment) bool {
	return e.GetEgress() == sandboxv1.Egress_EGRESS_NONE && len(e.GetEnv()) == 0 && e.GetWarmPoolSize() == 0
}

// pinSetError is the answer to a pin_set whose lock cannot be read: the
// session service's refusal (NotFound, InvalidArgument, FailedPrecondition)
// with the field named, anything else as is.
func pinSetError(pinSet string, err error) error {
	st := fault.Status(err)
	msg := fmt.Sprintf("pin_set %q: %s", pinSet, st.Message())
	switch st.Code() {
	case codes.NotFound:
		return fault.NotFound("PIN_SET_NOT_FOUND", "%s", msg)
	case codes.InvalidArgument:
		return fault.InvalidArgument("pin_set", "%s", msg)
	case codes.FailedPrecondition:
		return fault.FailedPrecondition("PIN_SET_UNUSABLE", "%s", msg)
	}
	return fmt.Errorf("read harness lock %s: %w", pinSet, err)
}

// checkPinSet reads the pin set's harness lock and returns its exact
// revision (the trials are thawed from it even after a restart). A pin
// set is a lock with an environment, which must exist here, and whose CLI
// version the environment's sandboxes run (checked as a thaw checks it,
// before any sandbox work).
func (m *Manager) checkPinSet(ctx context.Context, pinSet string) (string, error) {
	resp, err := m.o.Sessions.GetHarnessLock(ctx, &sessionv1.GetHarnessLockRequest{Lock: pinSet})
	if err != nil {
		return "", pinSetError(pinSet, err)
	}
	lock := resp.GetLock()
	if lock.GetEnvironment() == "" {
		return "", fault.FailedPrecondition("PIN_SET_NO_ENVIRONMENT",
			"pin_set %q: harness lock %s pins no environment: a pin set is a lock with an environment (add `environment: ENV` to its record in harnesses.lock.yaml)", pinSet, lock.GetRef())
	}
	if m.o.Environments != nil {
		if _, err := m.o.Environments.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: lock.GetEnvironment()}); err != nil {
			if fault.Status(err).Code() == codes.NotFound {
				return "", fault.NotFound("PIN_SET_ENVIRONMENT_NOT_FOUND", "pin_set %q: environment %q of harness lock %s does not exist here: apply it (hangar env apply) or pin another", pinSet, lock.GetEnvironment(), lock.GetRef())
			}
			return "", fmt.Errorf("get environment %s: %w", lock.GetEnvironment(), err)
		}
	}
	if _, err := m.o.Sessions.GetHarnessLock(ctx, &sessionv1.GetHarnessLockRequest{Lock: lock.GetRef(), CheckCliEnvironment: lock.GetEnvironment()}); err != nil {
		return "", pinSetError(pinSet, err)
	}
	return lock.GetRef(), nil
}

// environmentRepository is the repository environment env's sessions work
// on.
func (m *Manager) environmentRepository(ctx context.Context, env string) (string, error) {
	if m.o.Environments == nil {
		return "", nil
	}
	var repo string
	err := m.retryUnavailable(ctx, func() error {
		resp, err := m.o.Environments.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: env})
		repo = resp.GetEnvironment().GetRepository()
		return err
	})
	return repo, err
}

// trialSession is the session trial n of fork runs in.
func trialSession(fork string, n int) string { return fork + "-" + strconv.Itoa(n) }

// startTrials copies the prefix session for every trial and sends each its
// continuation.
func (m *Manager) startTrials(ctx context.Context, f *replayv1.Fork) error {
	var missing []string
	for i := range f.GetTrials() {
		name := trialSession(f.GetFork(), i+1)
		if _, err := m.o.Sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: name}); fault.Status(err).Code() == codes.NotFound {
			missing = append(missing, name)
		} else if err != nil {
			return fmt.Errorf("get trial session %s: %w", name, err)
		}
	}
	if len(missing) > forkMaxPerCall {
		// More than one ForkSession call: each call of a parent whose
		// sandbox is up captures a checkpoint of it first (0.3-0.6 s,
		// even unchanged: k=10's second call of 2 forks took 0.6 s at
		// load 10). Suspended (one capture, and the sandbox stopped), the
		// prefix is forked from that checkpoint by every call.
		err := m.retry(ctx, func() error {
			_, err := m.o.Sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: f.GetPrefixSession()})
			return err
		})
		if err != nil {
			return stage("suspending the prefix session before its forks", err)
		}
	}
	for len(missing) > 0 {
		batch := missing[:min(len(missing), forkMaxPerCall)]
		err := m.retry(ctx, func() error {
			_, err := m.o.Sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: f.GetPrefixSession(), N: int32(len(batch)), Names: batch,
				HarnessLock: f.GetPinSet()})
			return err
		})
		if err != nil {
			return stage("forking the prefix session for the trials", err)
		}
		missing = missing[len(batch):]
	}
	// Each trial's arming and first message are independent of the
	// others': sent together, k trials start in about the time of one
	// (one after another, k=10 spent 0.5 s here at load 10, each send
	// slower as the trials before it booted their harnesses).
	g, gctx := errgroup.WithContext(ctx)
	for i, t := range f.GetTrials() {
		if t.GetStatus() != replayv1.TrialStatus_TRIAL_STATUS_REPLAYING {
			continue
		}
		t.Session = trialSession(f.GetFork(), i+1)
		t.Divergence = f.GetDivergence()
		g.Go(func() error { return m.startTrial(gctx, f, t) })
	}
	return g.Wait()
}

// startTrial arms the gateway for trial t's session and sends it its
// continuation.
func (m *Manager) startTrial(ctx context.Context, f *replayv1.Fork, t *replayv1.Trial) error {
	// The trial's conversation holds the replay's calls with outside
	// effects (MCP, web fetch), which failed in the sealed sandbox:
	// every run of the trial's session shows the model the tape's
	// outputs instead.
	if err := m.retryUnavailable(ctx, func() error {
		_, err := m.o.Gateway.SetReplay(ctx, &gatewayv1.SetReplayRequest{Session: t.GetSession(), Replay: &gatewayv1.Replay{
			TapeRun: f.GetRun(), AtSeq: f.GetAtSeq(), OutsideOnly: true,
		}})
		return err
	}); err != nil {
		return stage("arming the gateway for trial "+t.GetId(), err)
	}
	b := f.GetBudget()
	var turn *sessionv1.Turn
	err := m.retry(ctx, func() error {
		resp, err := m.o.Sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: t.GetSession(), Message: ContinueMessage,
			Budget: &sessionv1.Budget{MaxCostUsd: b.GetMaxCostUsd(), MaxTokens: b.GetMaxTokens(), MaxMinutes: b.GetMaxMinutes()}})
		turn = resp.GetTurn()
		return err
	})
	if err != nil {
		return stage("starting trial "+t.GetId(), err)
	}
	t.Run, t.Status = turn.GetRunId(), replayv1.TrialStatus_TRIAL_STATUS_LIVE
	m.saveTrial(ctx, t)
	m.trialQueue <- t.GetId()
	return nil
}

// retry runs call until it succeeds, fails for good, or Settle passes: a
// session that is still finishing its turn (FailedPrecondition) or a
// service that is restarting (Unavailable) is tried again.
func (m *Manager) retry(ctx context.Context, call func() error) error {
	deadline := m.o.Now().Add(m.o.Settle)
	for {
		err := call()
		switch fault.Status(err).Code() {
		case codes.OK:
			return nil
		case codes.FailedPrecondition, codes.Unavailable, codes.Aborted, codes.DeadlineExceeded:
			if m.o.Now().After(deadline) {
				return err
			}
		default:
			return err
		}
		t := time.NewTimer(m.o.Retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// retryUnavailable runs call until it succeeds, fails for a reason other
// than a service that is down or draining (Unavailable), or Settle passes.
// A shutdown cancels ctx: the fork stays replaying for the next start.
func (m *Manager) retryUnavailable(ctx context.Context, call func() error) error {
	deadline := m.o.Now().Add(m.o.Settle)
	for {
		err := call()
		if fault.Status(err).Code() != codes.Unavailable || m.o.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(m.o.Retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// waitTurn waits for turn n of session to end and returns it.
func (m *Manager) waitTurn(ctx context.Context, session string, n int32) (*sessionv1.Turn, error) {
	deadline := m.o.Now().Add(m.o.Settle)
	for {
		turn, err := m.waitOnce(ctx, session, n)
		if err == nil {
			return turn, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if c := fault.Status(err).Code(); c == codes.NotFound || c == codes.InvalidArgument {
			return nil, fmt.Errorf("wait for turn %d of %s: %w", n, session, err)
		}
		if m.o.Now().After(deadline) {
			return nil, userError(fmt.Sprintf("turn %d of session %s did not end within %s", n, session, m.o.Settle))
		}
		t := time.NewTimer(m.o.Retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func (m *Manager) waitOnce(ctx context.Context, session string, n int32) (*sessionv1.Turn, error) {
	stream, err := m.o.Sessions.WaitForTurn(ctx, &sessionv1.WaitForTurnRequest{Name: session, Turn: n})
	if err != nil {
		return nil, err
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, fault.Unavailable("STREAM_ENDED", "the turn's stream ended without a result")
		}
		if err != nil {
			return nil, err
		}
		if r := msg.GetResult(); r != nil {
			return r, nil
		}
	}
}

// follow waits for a live trial to end and records how.
func (m *Manager) follow(ctx context.Context, id string) {
	t, err := m.o.Store.GetTrial(ctx, id)
	if err != nil {
		m.o.Logger.ErrorContext(ctx, "trial not read", "trial", id, "error", err)
		return
	}
	if t.GetStatus() != replayv1.TrialStatus_TRIAL_STATUS_LIVE {
		// Ended meanwhile (by the replica that held its lease before).
		return
	}
	// The trial's own turn is its session's newest (a fork lists the
	// prefix's turn as inherited before it).
	var number int32 = 1
	if sess, err := m.o.Sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: t.GetSession()}); err == nil {
		if ts := sess.GetSession().GetTurns(); len(ts) > 0 {
			number = ts[len(ts)-1].GetNumber()
		}
	}
	turn, err := m.waitTurn(ctx, t.GetSession(), number)
	if ctx.Err() != nil {
		return
	}
	t.Status, t.EndedAt = replayv1.TrialStatus_TRIAL_STATUS_ENDED, timestamppb.New(m.o.Now())
	if err != nil {
		m.o.Logger.ErrorContext(ctx, "trial lost", "trial", id, "error", err)
		t.Outcome = replayv1.TrialOutcome_TRIAL_OUTCOME_FAILED
	} else {
		t.Outcome = replayv1.TrialOutcome(turn.GetOutcome())
		t.CostUsd = turn.GetUsage().GetCostUsd()
		if turn.GetRunId() != "" {
			t.Run = turn.GetRunId()
		}
		if aa, ok := m.aa(ctx, t); ok {
			t.Aa = proto.Bool(aa)
		}
	}
	m.saveTrial(ctx, t)
}

// aa is the A/A result of an ended trial: when its prefix was clean, it ran
// the run's own harness and the run was an attempt of a best-of-N job with
// a check, whether the job's check gives the same result (passes or fails)
// on the trial as it gave on the original attempt. A trial that did not
// complete fails the check. ok is false when no A/A applies or the check
// could not be run.
func (m *Manager) aa(ctx context.Context, t *replayv1.Trial) (aa, ok bool) {
	if m.o.Jobs == nil || m.o.Checks == nil || t.GetDivergence() != nil {
		return false, false
	}
	f, err := m.o.Store.GetFork(ctx, t.GetFork())
	if err != nil || f.GetDivergence() != nil {
		return false, false
	}
	if f.GetPinSet() != "" {
		lock, err := m.o.Sessions.GetHarnessLock(ctx, &sessionv1.GetHarnessLockRequest{Lock: f.GetPinSet()})
		if err != nil || lock.GetLock().GetHarness() != replayable[f.GetHarness()] {
			return false, false
		}
	}
	run, err := m.o.Gateway.GetRun(ctx, &gatewayv1.GetRunRequest{Run: f.GetRun()})
	if err != nil {
		return false, false
	}
	job, attempt := m.jobOf(ctx, run.GetRun().GetSession())
	if job == nil {
		return false, false
	}
	original := attempt.GetOutcome() == sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED && attempt.GetCheckExitCode() == 0
	passed := false
	if t.GetOutcome() == replayv1.TrialOutcome_TRIAL_OUTCOME_COMPLETED {
		code, err := m.o.Checks.Check(ctx, t.GetSession(), job.GetCheck())
		if err != nil {
			m.o.Logger.WarnContext(ctx, "A/A check not run", "trial", t.GetId(), "job", job.GetId(), "error", err)
			return false, false
		}
		passed = code == 0
	}
	return passed == original, true
}

// jobOf is the best-of-N job with a check that session was a checked
// attempt of, and that attempt (nil when none).
func (m *Manager) jobOf(ctx context.Context, session string) (*sessionv1.Job, *sessionv1.Attempt) {
	token := ""
	for range 100 {
		resp, err := m.o.Jobs.ListJobs(ctx, &sessionv1.ListJobsRequest{PageSize: 100, PageToken: token})
		if err != nil {
			return nil, nil
		}
		for _, j := range resp.GetJobs() {
			if j.GetStrategy() != sessionv1.JobStrategy_JOB_STRATEGY_BEST_OF_N || j.GetCheck() == "" {
				continue
			}
			for _, a := range j.GetAttempts() {
				if a.GetSession() == session && (a.GetCheckExitCode() >= 0 || a.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED) {
					return j, a
				}
			}
		}
		if token = resp.GetNextPageToken(); token == "" {
			return nil, nil
		}
	}
	return nil, nil
}
