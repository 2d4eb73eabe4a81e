// Package sessions is the session lifecycle: it creates sessions, runs their
// turns in sandboxes through the sandbox service, points the agent CLI at
// the gateway with a run token, checkpoints through the checkpoint service,
// suspends idle sessions and resumes them on the next message.
//
// Every state change goes through store.Transition with the states it may
// come from, so two callers (a send and the idle reaper, or two replicas)
// can't both act on one session: the loser gets a FailedPrecondition.
package sessions

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/platform/blob"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/session-svc/internal/harness"
	"github.com/hangar-dev/hangar/session-svc/internal/holds"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// Config holds the lifecycle's settings (spec: the settings table).
type Config struct {
	// IdleMinutes is the default idle time before suspending (0 = never).
	IdleMinutes int
	// CheckpointMinutes is the period of checkpoints while something changes.
	CheckpointMinutes int
	// TurnTimeout bounds a turn without its own --max-minutes.
	TurnTimeout time.Duration
	// Cache is the default prompt-cache TTL (auto, 5m, 1h, off).
	Cache string
	// Harnesses says where the agent CLIs are inside a sandbox.
	Harnesses harness.Options
	// ReapInterval is how often idle sessions are looked for (default 30s).
	ReapInterval time.Duration
	// LeaseTTL is the sandbox lease's TTL; it is renewed at a third of it.
	LeaseTTL time.Duration
	// ForkMax is the most forks one Fork call makes (HANGAR_FORK_MAX).
	ForkMax int
	// SoleReplica says no other session-svc shares the records (hangar up,
	// with its embedded Redis): a session found resuming or suspending at
	// start was left so by this service's previous process.
	SoleReplica bool
	// HarnessDrift is what a thawed session's turn 1 does when it differs
	// from its lock: warn (the default) or fail (HANGAR_HARNESS_DRIFT).
	HarnessDrift string
}

// Deps are the lifecycle's collaborators.
type Deps struct {
	Store       *store.Store
	Holds       *holds.Holds
	Sandboxes   sandboxv1.SandboxServiceClient
	Checkpoints checkpointv1.CheckpointServiceClient
	Gateway     gatewayv1.GatewayServiceClient
	// Artifacts keeps the files agents hand back.
	Artifacts blob.Store
	Logger    *slog.Logger
	Now       func() time.Time
	Config    Config
	// Claims keeps one session per conversation id; nil claims nothing
	// (forks still fork their parent's conversation on their first turn).
	Claims *Claims
	// Locks reads harness locks (HANGAR_HARNESS_REPO); nil thaws nothing.
	Locks HarnessLocks
	// CLIs says which version of each agent CLI the sandboxes run; nil
	// skips the check a thaw makes before any sandbox work.
	CLIs CLIVersions
	// Replicas is what this replica knows of the others (heartbeats,
	// session owners, sweep leases); nil: one process.
	Replicas *Replicas
}

// Manager runs sessions.
type Manager struct {
	d   Deps
	cfg Config
	log *slog.Logger
	now func() time.Time

	events *broadcaster

	mu sync.Mutex
	// turns are the turns running in this process, by session.
	turns map[string]*activeTurn
	// leases renew the sandboxes this process holds, by session.
	leases map[string]*leaseKeeper
	// sandboxes caches the paths of sandboxes this process acquired.
	sandboxes map[string]*sandboxv1.Sandbox
	// recovering are the sessions being recovered now (recoverOnce), each
	// closed when its recovery ends.
	recovering map[string]chan struct{}

	// backlog keeps the events of a database outage (eventbacklog.go).
	backlog eventBacklog

	// holdGraceUntil: no idle suspends before it (the hold table was
	// lost; holders are taking their holds again).
	holdGraceUntil time.Time

	// startedAt is when this Manager was made: a session that changed
	// state since was changed by this process.
	startedAt time.Time

	// jobs is the job runner over this Manager, if any: it picks
	// unfinished jobs up after recovery at start and in every sweep.
	jobs *Jobs

	// draining is set by Drain: new work is refused.
	draining atomic.Bool

	wg sync.WaitGroup
	// background is the context turns run in: it outlives the request that
	// started them and ends with Close.
	background context.Context
	stop       context.CancelFunc
}

// activeTurn is a running turn's handle, for interrupt and steer.
type activeTurn struct {
	number int
	runID  string
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// errInterrupted is the cause a turn is cancelled with by interrupt.
var errInterrupted = errors.New("interrupted")

// New returns a Manager. Call Run to start its background loops and Close to
// stop it.
func New(d Deps) *Manager {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	cfg := d.Config
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = 30 * time.Second
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 60 * time.Second
	}
	if cfg.TurnTimeout <= 0 {
		cfg.TurnTimeout = 120 * time.Minute
	}
	if cfg.CheckpointMinutes <= 0 {
		cfg.CheckpointMinutes = 10
	}
	ctx, stop := context.WithCancel(context.Background())
	return &Manager{
		d: d, cfg: cfg, log: d.Logger, now: d.Now,
		events:     newBroadcaster(),
		turns:      map[string]*activeTurn{},
		leases:     map[string]*leaseKeeper{},
		sandboxes:  map[string]*sandboxv1.Sandbox{},
		recovering: map[string]chan struct{}{},
		background: ctx, stop: stop,
		startedAt: d.Now(),
	}
}

// Close stops background work and waits for running turns to end (they are
// cancelled and end as interrupted, checkpointed).
func (m *Manager) Close(ctx context.Context) error {
	m.stop()
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// nameRE is a DNS label: what a session name must be.
var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidName checks a session name.
func ValidName(field, name string) error {
	if !nameRE.MatchString(name) {
		return fault.InvalidArgument(field, "session name %q must be a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters", name)
	}
	return nil
}

// get loads a session or says it does not exist. A session a stopped
// process left on a sandbox the sandbox service revived is recovered first
// (settleLeftBehind), so no call acts on it as it was.
func (m *Manager) get(ctx context.Context, name string) (*store.Session, error) {
	s, err := m.load(ctx, name)
	if err != nil {
		return nil, err
	}
	return m.settleLeftBehind(ctx, s), nil
}

// load loads a session or says it does not exist.
func (m *Manager) load(ctx context.Context, name string) (*store.Session, error) {
	s, err := m.d.Store.GetSession(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fault.NotFound("SESSION_NOT_FOUND", "session %q does not exist", name)
	}
	if err != nil {
		return nil, fmt.Errorf("load session %s: %w", name, err)
	}
	return s, nil
}

// Get returns a session.
func (m *Manager) Get(ctx context.Context, name string) (*store.Session, error) {
	if err := ValidName("name", name); err != nil {
		return nil, err
	}
	return m.get(ctx, name)
}

// transition moves a session between states or says why it can't.
func (m *Manager) transition(ctx context.Context, name, to, reason string, from ...string) (*store.Session, error) {
	s, err := m.d.Store.Transition(ctx, name, to, reason, from...)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, fault.NotFound("SESSION_NOT_FOUND", "session %q does not exist", name)
	case errors.Is(err, store.ErrConflict):
		cur, gerr := m.d.Store.GetSession(ctx, name)
		state := "another state"
		if gerr == nil {
			state = cur.State
		}
		return nil, fault.FailedPrecondition("SESSION_STATE", "session %q is %s: it can't go to %s now", name, state, to)
	case err != nil:
		return nil, fmt.Errorf("session %s to %s: %w", name, to, err)
	}
	if to == store.StateRunning || to == store.StateResuming || to == store.StateSuspending {
		m.markOwner(ctx, name)
	}
	m.events.publish(name)
	return s, nil
}

// idleMinutes is the session's idle time.
func (m *Manager) idleMinutes(s *store.Session) int {
	if s.IdleMinutes != nil {
		return *s.IdleMinutes
	}
	return m.cfg.IdleMinutes
}

// SuspendAt says when the idle clock will suspend s if nothing holds it:
// zero when it never will or it is not up.
func (m *Manager) SuspendAt(ctx context.Context, s *store.Session) (time.Time, error) {
	idle := m.idleMinutes(s)
	if idle == 0 || s.SandboxID == "" || (s.State != store.StateIdle && s.State != store.StateNeedsInput) {
		return time.Time{}, nil
	}
	live, err := m.d.Holds.List(ctx, s.Name)
	if err != nil {
		return time.Time{}, fmt.Errorf("holds of %s: %w", s.Name, err)
	}
	if len(live) > 0 {
		return time.Time{}, nil
	}
	uses, lastUse, err := m.sandboxUses(ctx, s)
	if err != nil {
		return time.Time{}, err
	}
	if len(uses) > 0 {
		return time.Time{}, nil
	}
	since := s.LastActiveAt
	if t, ok, err := m.d.Holds.IdleSince(ctx, s.Name); err != nil {
		return time.Time{}, fmt.Errorf("idle clock of %s: %w", s.Name, err)
	} else if ok && t.After(since) {
		since = t
	}
	if lastUse.After(since) {
		since = lastUse
	}
	return since.Add(time.Duration(idle) * time.Minute), nil
}

// sandboxUses are the calls using s's sandbox right now that no hangar
// service made for itself (an API, MCP or CLI caller's command, terminal,
// file read or write straight on the sandbox API), and when the last one
// ended: they hold the session open like holds do. A sandbox that is gone
// has none.
func (m *Manager) sandboxUses(ctx context.Context, s *store.Session) ([]*sandboxv1.SandboxUse, time.Time, error) {
	if s.SandboxID == "" {
		return nil, time.Time{}, nil
	}
	resp, err := m.d.Sandboxes.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: s.SandboxID})
	if status.Code(err) == codes.NotFound {
		return nil, time.Time{}, nil
	}
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("uses of the sandbox of %s: %w", s.Name, err)
	}
	sb := resp.GetSandbox()
	if sb.GetLease().GetHolder() != holder(s.Name) {
		return nil, time.Time{}, nil
	}
	var last time.Time
	if sb.GetLastUsedAt() != nil {
		last = sb.GetLastUsedAt().AsTime()
	}
	return sb.GetUses(), last, nil
}

// Holds are what holds s open now: its holds, and the calls using its
// sandbox straight on the sandbox API (owner sandbox/<kind>, no expiry:
// they last as long as the call). What can't be read (Redis down) is
// logged and left out: a session's record is still shown.
func (m *Manager) Holds(ctx context.Context, s *store.Session) []holds.Hold {
	live, err := m.d.Holds.List(ctx, s.Name)
	if err != nil {
		m.log.WarnContext(ctx, "holds unreadable", "session", s.Name, "error", err)
	}
	uses, _, err := m.sandboxUses(ctx, s)
	if err != nil {
		m.log.WarnContext(ctx, "sandbox uses unreadable", "session", s.Name, "error", err)
	}
	for i, u := range uses {
		kind := holds.KindCommand
		if u.GetKind() == "terminal" {
			kind = holds.KindTerminal
		}
		live = append(live, holds.Hold{
			ID: fmt.Sprintf("sandbox-use-%d", i+1), Session: s.Name, Owner: "sandbox/" + u.GetKind(), Kind: kind,
			Description: u.GetDescription(), AcquiredAt: u.GetStartedAt().AsTime(),
		})
	}
	return live
}

// heartbeat calls beat every LeaseTTL/3 on a goroutine of its own (a panic
// in it is logged) until ctx ends or the returned stop is called; stop
// waits for the goroutine. Leases, holds and job claims all renew this way.
func (m *Manager) heartbeat(ctx context.Context, what string, beat func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer logging.Recover(ctx, m.log, what)
		ticker := time.NewTicker(m.cfg.LeaseTTL / 3)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				beat(ctx)
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
