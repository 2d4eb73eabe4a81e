package sessions

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strings"
	"time"

	"github.com/google/uuid"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/session-svc/internal/harness"
	"github.com/hangar-dev/hangar/session-svc/internal/holds"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// NewSession is what `session new` asks for.
type NewSession struct {
	Name, Environment, Repo, Harness, Branch string
	Model, CacheTTL, Approvals, HarnessLock  string
	// WorkingRepository is the repository the CLI runs in, used when
	// neither Environment nor Repo is given and this machine can read it.
	WorkingRepository string
	IdleMinutes       *int
	Budget            store.Budget
	// FromLocal is --from-local: applied on the session branch at its
	// first boot.
	FromLocal *LocalWork
	// BaseCommit, when set, is the commit the session starts from instead
	// of the repository's current one (a fork at a step rebuilds a run from
	// its base commit).
	BaseCommit string
	// First turn; none when Message is empty.
	Turn TurnInput
}

// TurnInput is one message to the agent.
type TurnInput struct {
	Message     string
	Attachments []Attachment
	// Harness switches the session to another agent (a handoff); "" keeps it.
	Harness string
	// Budget overrides the session's for this turn when set.
	Budget *store.Budget
	// OutputSchema is --schema: a JSON Schema the turn's final answer ends
	// with a JSON object for (the turn's structured result).
	OutputSchema string
}

// Attachment is context given with a message: a file the agent finds under
// ~/.hangar-agent/context, or text added to the prompt.
type Attachment struct {
	Name string
	File []byte
	Text string
}

// defaultEnvironment needs no configuration: the current git repository.
const defaultEnvironment = "local"

// Create makes a session and, given a message, starts its first turn.
func (m *Manager) Create(ctx context.Context, n NewSession) (*store.Session, *store.Turn, error) {
	if err := ValidName("name", n.Name); err != nil {
		return nil, nil, err
	}
	if n.HarnessLock != "" {
		// Before anything else: a lock on a CLI the sandboxes do not
		// run is refused before any sandbox work.
		if err := m.thaw(ctx, &n); err != nil {
			return nil, nil, err
		}
	}
	implicitRepo := false
	if n.Environment == "" && n.Repo == "" && n.WorkingRepository != "" {
		n.Repo, implicitRepo = n.WorkingRepository, true
	}
	if n.Environment == "" {
		n.Environment = defaultEnvironment
	}
	if n.Harness == "" {
		n.Harness = string(harness.Claude)
	}
	if _, err := harness.Lookup(harness.Name(n.Harness)); err != nil {
		return nil, nil, fault.InvalidArgument("harness", "harness %q is not one of claude, codex, pi, antigravity", n.Harness)
	}
	if n.Branch == "" {
		n.Branch = "hangar/session/" + n.Name
	}
	if n.IdleMinutes != nil && *n.IdleMinutes < 0 {
		return nil, nil, fault.InvalidArgument("idle_minutes", "idle minutes must be 0 (never) or more, got %d", *n.IdleMinutes)
	}
	if err := validBudget(n.Budget); err != nil {
		return nil, nil, err
	}
	if c := n.BaseCommit; c != "" && (len(c) != 40 && len(c) != 64 || commitRE.Replace(c) != "") {
		return nil, nil, fault.InvalidArgument("base_commit", "base commit %q is not a full commit id", c)
	}
	if n.FromLocal != nil {
		if err := n.FromLocal.validate(); err != nil {
			return nil, nil, err
		}
	}
	if err := validOutputSchema(n.Turn.OutputSchema); err != nil {
		return nil, nil, err
	}
	now := m.now()
	s := &store.Session{
		Name: n.Name, Environment: n.Environment, Harness: n.Harness, Branch: n.Branch,
		State: store.StateSuspended, StateReason: "created", StateChangedAt: now,
		IdleMinutes: n.IdleMinutes, CreatedAt: now, LastActiveAt: now,
		Budget: n.Budget, Approvals: n.Approvals, HarnessLock: n.HarnessLock, CacheTTL: n.CacheTTL, Model: n.Model,
	}
	base, err := m.resolveBase(ctx, &n, implicitRepo)
	if err != nil {
		return nil, nil, err
	}
	s.Repo, s.BaseCommit = n.Repo, base
	if n.BaseCommit != "" {
		s.BaseCommit = n.BaseCommit
	}
	if err := m.d.Store.CreateSession(ctx, s); err != nil {
		if errors.Is(err, store.ErrExists) {
			return nil, nil, fault.AlreadyExists("SESSION_EXISTS", "session %q already exists: send to it, or pick another name", n.Name)
		}
		return nil, nil, fmt.Errorf("create session %s: %w", n.Name, err)
	}
	if n.FromLocal != nil {
		if err := m.keepLocalWork(ctx, n.Name, n.FromLocal); err != nil {
			return nil, nil, err
		}
	}
	if n.Turn.Message == "" {
		return s, nil, nil
	}
	return m.Send(ctx, n.Name, n.Turn)
}

// resolveBase checks n's environment, and its repository override (--repo,
// or the CLI's own repository when implicit), and returns the commit the
// session starts from. An override that is the environment's own
// repository is dropped.
func (m *Manager) resolveBase(ctx context.Context, n *NewSession, implicit bool) (string, error) {
	own, err := m.d.Sandboxes.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: n.Environment})
	switch {
	case err == nil:
		if n.Repo == own.GetEnvironment().GetRepository() {
			n.Repo = ""
		}
	case n.Repo != "" && n.Environment == defaultEnvironment && fault.ReasonOf(err) == "ENVIRONMENT_NOT_FOUND":
		// hangar up runs outside a git repository: local has none of its
		// own, the session has one.
	default:
		return "", err
	}
	resp, err := m.d.Sandboxes.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: n.Environment, Repository: n.Repo, ResolveBase: true})
	if err != nil {
		if implicit && fault.ReasonOf(err) == "REPOSITORY_UNREACHABLE" {
			return "", fault.FailedPrecondition("REPOSITORY_UNREACHABLE",
				"hangar cannot read %s, the repository you ran this in (it runs on another machine or as another user): pass --repo with a git URL it can clone, or -e ENV", n.Repo)
		}
		return "", err
	}
	return resp.GetBaseCommit(), nil
}

// Repository is the repository s works on: its --repo, else its
// environment's.
func (m *Manager) Repository(ctx context.Context, s *store.Session) (string, error) {
	if s.Repo != "" {
		return s.Repo, nil
	}
	resp, err := m.d.Sandboxes.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: s.Environment})
	if err != nil {
		return "", err
	}
	return resp.GetEnvironment().GetRepository(), nil
}

func validBudget(b store.Budget) error {
	switch {
	case b.MaxCostUSD < 0:
		return fault.InvalidArgument("budget.max_cost_usd", "--max-cost must not be negative")
	case b.MaxTokens < 0:
		return fault.InvalidArgument("budget.max_tokens", "--max-tokens must not be negative")
	case b.MaxMinutes < 0:
		return fault.InvalidArgument("budget.max_minutes", "--max-minutes must not be negative")
	}
	return nil
}

// Send runs a turn: it resumes the session if suspended, then runs the agent
// with the message. It returns once the turn has started; WaitTurn follows
// it.
func (m *Manager) Send(ctx context.Context, name string, in TurnInput) (*store.Session, *store.Turn, error) {
	if err := ValidName("name", name); err != nil {
		return nil, nil, err
	}
	if strings.TrimSpace(in.Message) == "" {
		return nil, nil, fault.InvalidArgument("message", "the message is empty")
	}
	if in.Harness != "" {
		if _, err := harness.Lookup(harness.Name(in.Harness)); err != nil {
			return nil, nil, fault.InvalidArgument("harness", "harness %q is not one of claude, codex, pi, antigravity", in.Harness)
		}
	}
	if in.Budget != nil {
		if err := validBudget(*in.Budget); err != nil {
			return nil, nil, err
		}
	}
	if err := validOutputSchema(in.OutputSchema); err != nil {
		return nil, nil, err
	}
	if err := m.refuseWhileDraining(); err != nil {
		return nil, nil, err
	}
	cur, err := m.get(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	if err := refuseHarnessSwitch(cur, in.Harness); err != nil {
		return nil, nil, err
	}
	switch cur.State {
	case store.StateArchived:
		return nil, nil, fault.FailedPrecondition("SESSION_ARCHIVED", "session %q is archived: its checkpoints are gone; start a new session", name)
	case store.StateRunning, store.StateResuming:
		return nil, nil, fault.FailedPrecondition("TURN_RUNNING", "session %q is running a turn: wait for it, steer it, or interrupt it", name)
	case store.StateSuspending:
		return nil, nil, fault.FailedPrecondition("SESSION_SUSPENDING", "session %q is suspending: send again once it is suspended", name)
	}
	next := store.StateRunning
	if cur.SandboxID == "" {
		next = store.StateResuming
	}
	s, err := m.transition(ctx, name, next, "turn", store.StateIdle, store.StateSuspended, store.StateNeedsInput, store.StateFailed)
	if err != nil {
		return nil, nil, err
	}
	h := s.Harness
	if in.Harness != "" {
		h = in.Harness
	}
	budget := s.Budget
	if in.Budget != nil {
		budget = *in.Budget
	}
	turn := &store.Turn{Session: name, Message: in.Message, Harness: h, StartedAt: m.now(), Budget: budget}
	if err := m.d.Store.CreateTurn(ctx, turn); err != nil {
		_, _ = m.transition(context.WithoutCancel(ctx), name, cur.State, "turn could not start", next)
		return nil, nil, fmt.Errorf("record turn of %s: %w", name, err)
	}

	runCtx, cancel := context.WithCancelCause(m.background)
	at := &activeTurn{number: turn.Number, cancel: cancel, done: make(chan struct{})}
	m.mu.Lock()
	m.turns[name] = at
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(at.done)
		defer cancel(nil)
		defer logging.Recover(runCtx, m.log, "turn")
		m.runTurn(runCtx, name, turn.Number, in, at)
		m.mu.Lock()
		if m.turns[name] == at {
			delete(m.turns, name)
		}
		m.mu.Unlock()
		m.events.publish(name)
	}()
	return s, turn, nil
}

// overBudgetReason says which budget a turn crossed, in the user's terms:
// "turn stopped: over its budget of $0.50 (spent $0.62)". gateway is the
// gateway's own reason, used when no limit of the budget was reached.
func overBudgetReason(b store.Budget, u store.Usage, gateway string) string {
	tokens := u.InputTokens + u.OutputTokens + u.CacheReadTokens + u.CacheWriteTokens
	switch {
	case b.MaxCostUSD > 0 && u.CostUSD >= b.MaxCostUSD:
		return fmt.Sprintf("turn stopped: over its budget of $%.2f (spent $%.2f; --max-cost)", b.MaxCostUSD, u.CostUSD)
	case b.MaxTokens > 0 && tokens >= b.MaxTokens:
		return fmt.Sprintf("turn stopped: over its budget of %d tokens (used %d; --max-tokens)", b.MaxTokens, tokens)
	case gateway != "":
		return "turn stopped: over its budget: " + gateway
	}
	return "turn stopped: over its budget"
}

// turnResult is how a turn ended.
type turnResult struct {
	outcome, reason, text string
	usage                 store.Usage
	conversationID        string
	command               string
	question              *store.Question
	runID                 string
	warnings              []string
	// structured is the --schema result, JSON.
	structured string
	// drift is what a thawed session's turn 1 ran differently from its
	// lock; nil when the turn was not checked.
	drift []store.Drift
}

// runTurn runs one turn to its end: boot if needed, run the harness, read
// its events, then record the outcome, checkpoint and go idle. Whatever
// happens, the turn ends with an outcome and the session leaves running.
func (m *Manager) runTurn(ctx context.Context, name string, number int, in TurnInput, at *activeTurn) {
	log := m.log.With("session", name, "turn", number)
	hold, err := m.d.Holds.Acquire(ctx, name, fmt.Sprintf("turn/%d", number), "turn", "agent turn running", m.cfg.LeaseTTL)
	if err != nil {
		log.WarnContext(ctx, "turn hold not taken", "error", err)
	} else {
		stopHold := m.renewHold(ctx, hold)
		defer stopHold()
	}

	var runID string
	res := m.executeTurn(ctx, name, number, in, at, &runID)
	// Recording the end must happen even when the turn was cancelled.
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	// The gateway run ends while the turn's end is recorded (its
	// checkpoint needs no gateway), not before: one round trip fewer on
	// the turn's path. A turn that did not complete (the agent stopped
	// mid-step: its tool shells may still be running) ends it first, as
	// before, so nothing they send is answered. Either way it has ended
	// before the turn's end is written.
	runEnded := make(chan struct{})
	switch {
	case runID == "":
		close(runEnded)
	case res.outcome == store.OutcomeCompleted || res.outcome == store.OutcomeNeedsInput:
		go func() {
			defer close(runEnded)
			m.endRun(ctx, runID)
		}()
	default:
		m.endRun(ctx, runID)
		close(runEnded)
	}
	m.finishTurn(endCtx, log, name, number, res, runEnded)
}

// renewHold keeps a hold alive until the returned function is called, which
// also releases it. A hold that vanished before its expiry (a Redis
// restarted empty) is taken again.
func (m *Manager) renewHold(ctx context.Context, hold holds.Hold) func() {
	name, id := hold.Session, hold.ID
	stop := m.heartbeat(ctx, "hold renewal", func(ctx context.Context) {
		_, err := m.d.Holds.Renew(ctx, name, id, m.cfg.LeaseTTL)
		if errors.Is(err, holds.ErrNotFound) {
			var again holds.Hold
			if again, err = m.d.Holds.Acquire(ctx, name, hold.Owner, hold.Kind, hold.Description, m.cfg.LeaseTTL); err == nil {
				m.log.WarnContext(ctx, "hold taken again: it had vanished", "session", name, "kind", hold.Kind)
				id = again.ID
			}
		}
		if err != nil && ctx.Err() == nil {
			m.log.WarnContext(ctx, "hold renewal failed", "session", name, "hold", id, "error", err)
		}
	})
	return func() {
		stop()
		if err := m.d.Holds.Release(context.WithoutCancel(ctx), name, id); err != nil {
			m.log.WarnContext(ctx, "hold release failed", "session", name, "hold", id, "error", err)
		}
	}
}

// executeTurn does the turn's work and says how it went; it records nothing
// final (finishTurn does). The gateway run it creates is put in *runOut
// for the caller to end.
func (m *Manager) executeTurn(ctx context.Context, name string, number int, in TurnInput, at *activeTurn, runOut *string) turnResult {
	failed := func(reason string, err error) turnResult {
		switch {
		case errors.Is(context.Cause(ctx), errShutdown):
			// Stopped before the agent ran: a shutdown, not a failure.
			return turnResult{outcome: "interrupted", reason: reasonTurnShutdown}
		case errors.Is(context.Cause(ctx), errInterrupted):
			return turnResult{outcome: "interrupted", reason: "interrupted"}
		}
		m.log.WarnContext(ctx, "turn failed", "session", name, "turn", number, "reason", reason, "error", err)
		return turnResult{outcome: "failed", reason: reason}
	}
	s, err := m.get(ctx, name)
	if err != nil {
		return failed("session vanished", err)
	}
	if s.SandboxID == "" {
		// A brand-new session starts; one that ran before resumes.
		verb, done := "resume", "resumed"
		if number == 1 && s.ParentID == "" {
			verb, done = "start", "started"
		}
		if s, err = m.boot(ctx, s); err != nil {
			return failed("could not "+verb+": "+publicMessage(err), err)
		}
		if s, err = m.transition(ctx, name, store.StateRunning, done, store.StateResuming); err != nil {
			return failed("could not "+verb, err)
		}
	}
	// A sandbox another replica booted (or one this process did not
	// keep): this process renews its lease while its turn runs, so the
	// turn outlives the replica that booted it.
	m.ensureLease(s)
	sb, err := m.sandboxOf(ctx, s)
	if err != nil {
		return failed("sandbox unavailable", err)
	}
	turn, err := m.d.Store.GetTurn(ctx, name, number)
	if err != nil {
		return failed("turn vanished", err)
	}

	adapter, err := harness.Lookup(harness.Name(turn.Harness))
	if err != nil {
		return failed("unknown harness", err)
	}
	message := in.Message
	conversation := s.ConversationID
	if turn.Harness != s.Harness {
		// A switch of agent starts a new conversation with an account of
		// the turns so far.
		message = m.handoff(ctx, name, number, message)
		conversation = ""
	}
	// A conversation another session holds (a fork's first turn) is forked.
	message, conversation, forkFrom := m.conversationFor(ctx, s, adapter, number, message, conversation)
	message, err = m.placeAttachments(ctx, s, sb, in.Attachments, message)
	if err != nil {
		return failed("attachments could not be placed", err)
	}
	message = withOutputSchema(message, in.OutputSchema)

	limit := m.cfg.TurnTimeout
	limitReason := fmt.Sprintf("turn stopped: it ran longer than HANGAR_SESSION_TURN_TIMEOUT_MINUTES (%s)", limit)
	if turn.Budget.MaxMinutes > 0 {
		limit = time.Duration(turn.Budget.MaxMinutes) * time.Minute
		limitReason = fmt.Sprintf("turn stopped: over its budget of %d minutes (max_minutes)", turn.Budget.MaxMinutes)
	}
	cache := s.CacheTTL
	if cache == "" {
		cache = m.cfg.Cache
	}
	run, err := m.d.Gateway.CreateRun(ctx, &gatewayv1.CreateRunRequest{
		Session: name, Turn: int32(number), Harness: turn.Harness, Model: s.Model,
		Budget:     &gatewayv1.Budget{MaxCostUsd: turn.Budget.MaxCostUSD, MaxTokens: turn.Budget.MaxTokens},
		TtlSeconds: int32((limit + 5*time.Minute) / time.Second),
		CacheTtl:   cache,
		Approvals:  s.Approvals == ApprovalsAsk,
		// The gateway hashes this work tree as each step's request arrives.
		Sandbox: &gatewayv1.RunSandbox{Id: sb.GetId(), FencingToken: s.FencingToken, WorkDir: sb.GetWorkDir()},
	})
	if err != nil {
		return failed("gateway refused the run", err)
	}
	runID := run.GetRun().GetId()
	*runOut = runID
	m.mu.Lock()
	at.runID = runID
	m.mu.Unlock()

	hturn := harness.Turn{Message: message, ConversationID: conversation, ForkFrom: forkFrom}
	if conversation == "" || forkFrom != "" {
		hturn.NewConversationID = uuid.NewString()
	}
	inv, err := adapter.Invocation(
		harness.Sandbox{WorkDir: sb.GetWorkDir(), HomeDir: sb.GetHomeDir()},
		harness.Gateway{AnthropicBaseURL: run.GetRun().GetAnthropicBaseUrl(), OpenAIBaseURL: run.GetRun().GetOpenaiBaseUrl(), Token: run.GetToken(), Model: s.Model},
		hturn, m.cfg.Harnesses)
	if err != nil {
		return failed("harness command could not be built", err)
	}
	for _, f := range inv.Files {
		if _, err := m.d.Sandboxes.WriteFile(ctx, &sandboxv1.WriteFileRequest{
			SandboxId: sb.GetId(), FencingToken: s.FencingToken, Path: f.Path, Content: f.Content, Mode: f.Mode,
		}); err != nil {
			return failed("harness config could not be written", err)
		}
	}
	env := map[string]string{}
	for k, v := range inv.Env {
		env[k] = v
	}
	// The CLIs are found on the sandbox's own PATH (hangar up's, for the
	// local driver), after what the harness puts first; the driver puts
	// hangar-agent before all.
	pathPrepend := inv.PathPrepend
	command := strings.Join(inv.Argv, " ")
	drift, unchecked := m.startDriftCheck(ctx, s, number, sb.GetId(), inv, env)
	var preWarnings []string
	if unchecked != "" {
		preWarnings = append(preWarnings, unchecked)
	}
	if drift != nil && (m.cfg.HarnessDrift == "fail" || drift.inSandbox) {
		if d := drift.cliDrift(); len(d) > 0 {
			// The sandbox runs another CLI than the lock's: the agent
			// does not run, and the turn ends failed (recordDrift under
			// HANGAR_HARNESS_DRIFT=fail; always where the thaw could not
			// check it before).
			res := turnResult{command: command, runID: runID}
			m.recordDrift(ctx, s, number, driftOf(d), &res)
			res.outcome, res.reason, res.question = store.OutcomeFailed, reasonHarnessDrift, nil
			return res
		}
	}
	if _, err := m.d.Store.UpdateTurn(ctx, name, number, func(t *store.Turn) error {
		t.Command = command
		t.RunID = runID
		return nil
	}); err != nil {
		return failed("turn could not be recorded", err)
	}

	execCtx, cancelExec := context.WithTimeoutCause(ctx, limit, errors.New(limitReason))
	defer cancelExec()
	parser := adapter.NewParser()
	lines := &lineWriter{onLine: func(line []byte) {
		evs := parser.Line(line)
		if len(evs) == 0 {
			return
		}
		m.appendEvents(context.WithoutCancel(ctx), name, number, evs)
	}}
	stderr := &tailBuffer{max: 16 << 10}
	code, execErr := sandboxexec.New(m.d.Sandboxes).WithPathPrepend(pathPrepend...).Exec(execCtx, sb.GetId(), s.FencingToken, inv.Argv, env, inv.Cwd, nil, lines, stderr)
	lines.flush()
	result := parser.Result()

	res := turnResult{command: command, runID: runID, conversationID: result.ConversationID, text: result.Text, warnings: preWarnings}
	if in.OutputSchema != "" {
		var warning string
		res.structured, warning = structuredResult(result.Text, in.OutputSchema)
		if warning != "" {
			res.warnings = append(res.warnings, warning)
		}
	}
	// An id chosen in advance names a conversation only once the CLI ran
	// through: one that never started (the CLI missing, refused) has none
	// to resume.
	if res.conversationID == "" && execErr == nil && code == 0 {
		res.conversationID = inv.ConversationID
	}
	if res.conversationID == "" {
		res.conversationID = conversation
	}
	// The gateway's count is the authoritative usage.
	runNow, gerr := m.d.Gateway.GetRun(context.WithoutCancel(ctx), &gatewayv1.GetRunRequest{Run: runID})
	if gerr == nil {
		res.usage = usageFromGateway(runNow.GetRun().GetUsage())
	} else {
		res.usage = usageFromHarness(result.Usage)
	}
	question, qerr := m.takeQuestion(context.WithoutCancel(ctx), sb, s.FencingToken, number)
	if qerr != nil {
		res.warnings = append(res.warnings, "the agent's question could not be read")
	}
	res.question = question

	switch {
	case errors.Is(context.Cause(ctx), errInterrupted):
		res.outcome, res.reason = "interrupted", "interrupted"
	case errors.Is(context.Cause(ctx), errShutdown):
		res.outcome, res.reason = "interrupted", reasonTurnShutdown
	case errors.Is(execCtx.Err(), context.DeadlineExceeded):
		res.outcome, res.reason = "failed", limitReason
		if turn.Budget.MaxMinutes > 0 {
			res.outcome = "over_budget"
		}
	case gerr == nil && runNow.GetRun().GetState() == gatewayv1.RunState_RUN_STATE_OVER_BUDGET:
		res.outcome, res.reason = "over_budget", overBudgetReason(turn.Budget, res.usage, runNow.GetRun().GetStateReason())
		if result.IsError {
			// The CLI's own account of the refusal ("Failed to
			// authenticate. API Error: 403 ...") is no answer.
			res.text = ""
		}
	case question != nil:
		res.outcome, res.reason = "needs_input", "the agent asked a question"
	case execErr != nil:
		res.outcome, res.reason = "failed", execFailure(execErr)
	case code == 127 && strings.Contains(stderr.String(), inv.Argv[0]+": command not found"):
		res.outcome, res.reason = "failed", harness.MissingCLI(adapter.Name(), inv.Argv[0])
	case code != 0 || result.IsError:
		reason := result.ErrorText
		if reason == "" {
			reason = lastLines(stderr.String(), 3)
		}
		res.outcome, res.reason = "failed", fmt.Sprintf("the agent exited %d: %s", code, reason)
	default:
		res.outcome = "completed"
	}
	if drift != nil {
		d, err := m.finishDriftCheck(context.WithoutCancel(ctx), drift, s, turn, runID)
		if err != nil {
			res.warnings = append(res.warnings, "turn 1 was not checked against harness lock "+s.HarnessLock+": the gateway's record of the run could not be read")
			m.log.WarnContext(ctx, "drift check failed", "session", name, "error", err)
		} else {
			m.recordDrift(context.WithoutCancel(ctx), s, number, d, &res)
		}
	}
	if forkFrom != "" && res.outcome == "interrupted" {
		// A CLI stopped in the middle of forking a conversation has not
		// written the fork yet (Claude Code writes it at the end): the
		// next turn forks the parent's conversation again.
		res.conversationID = ""
	}
	if err := m.collectArtifacts(context.WithoutCancel(ctx), s, sb, number); err != nil {
		res.warnings = append(res.warnings, "artifacts could not be collected")
		m.log.WarnContext(ctx, "artifacts not collected", "session", name, "turn", number, "error", err)
	}
	return res
}

// finishTurn records a turn's end: its outcome and usage, a checkpoint, the
// conversation id, and the session's next state. runEnded is closed once
// the turn's gateway run has ended.
func (m *Manager) finishTurn(ctx context.Context, log *slog.Logger, name string, number int, res turnResult, runEnded <-chan struct{}) {
	// A database that is down (a restart, a failover) is waited for: the
	// turn's end is recorded once it is back, within ctx.
	var s *store.Session
	err := m.retryStore(ctx, log, func() (err error) {
		s, err = m.get(ctx, name)
		return err
	})
	if err != nil {
		log.WarnContext(ctx, "turn end not recorded", "error", err)
		return
	}
	// A failed update keeps the session as last read: s is never nil.
	if res.conversationID != "" && res.conversationID != s.ConversationID {
		updated, err := m.d.Store.UpdateSession(ctx, name, func(cur *store.Session) error {
			cur.ConversationID = res.conversationID
			return nil
		})
		if err != nil {
			log.WarnContext(ctx, "conversation id not recorded", "error", err)
		} else {
			s = updated
		}
	}
	turn, _ := m.d.Store.GetTurn(ctx, name, number)
	if turn != nil && turn.Harness != s.Harness {
		updated, err := m.d.Store.UpdateSession(ctx, name, func(cur *store.Session) error {
			cur.Harness = turn.Harness
			return nil
		})
		if err != nil {
			log.WarnContext(ctx, "harness switch not recorded", "error", err)
		} else {
			s = updated
		}
	}
	checkpointID := ""
	if s.SandboxID != "" {
		if res.outcome != store.OutcomeCompleted && res.outcome != store.OutcomeNeedsInput {
			// The agent was stopped mid-step: its tool shells (started
			// detached) may still be writing the tree.
			m.killProcesses(ctx, name, s.SandboxID, s.FencingToken)
		}
		cp, err := m.checkpoint(ctx, s, number, "after_turn", 0)
		if err != nil {
			res.warnings = append(res.warnings, "no checkpoint after this turn: "+publicMessage(err))
			log.WarnContext(ctx, "checkpoint after turn failed", "error", err)
		} else if cp != nil {
			checkpointID = cp.GetId()
		}
	}
	// The gateway run ends alongside the checkpoint (see runTurn); it has
	// ended before the session leaves running.
	<-runEnded
	u := res.usage
	m.appendStoreEvents(ctx, name, []store.Event{{Turn: number, Kind: "usage", Text: fmt.Sprintf("turn %d: %s", number, res.outcome), Usage: &u}})
	next := store.StateIdle
	if res.outcome == "needs_input" {
		next = store.StateNeedsInput
	}
	if _, err := m.d.Store.UpdateSession(ctx, name, func(cur *store.Session) error {
		cur.LastActiveAt = m.now()
		cur.Question = res.question
		return nil
	}); err != nil {
		log.WarnContext(ctx, "session activity not recorded", "error", err)
	}
	from := []string{store.StateRunning, store.StateResuming}
	if cur, err := m.d.Store.GetSession(ctx, name); err == nil && cur.SandboxID == "" {
		// The sandbox is gone (destroyed under the turn, or boot failed):
		// what the checkpoint kept is what there is.
		next = store.StateSuspended
	}
	if err := m.retryStore(ctx, log, func() error {
		_, err := m.transition(ctx, name, next, "turn "+res.outcome, from...)
		return err
	}); err != nil {
		log.WarnContext(ctx, "session state after turn not recorded", "error", err)
	}
	// The turn's end is recorded last: whoever waits for it finds the
	// session already out of running, and no longer running here (a fork
	// right after the wait must not see the parent mid-turn).
	m.mu.Lock()
	if at := m.turns[name]; at != nil && at.number == number {
		delete(m.turns, name)
	}
	m.mu.Unlock()
	err = m.retryStore(ctx, log, func() error {
		_, err := m.d.Store.UpdateTurn(ctx, name, number, m.endTurn(res, checkpointID))
		return err
	})
	if err != nil {
		log.WarnContext(ctx, "turn outcome not recorded", "error", err)
	}
}

// endTurn records res on a turn.
func (m *Manager) endTurn(res turnResult, checkpointID string) func(t *store.Turn) error {
	return func(t *store.Turn) error {
		t.Outcome, t.OutcomeReason, t.Result = res.outcome, res.reason, res.text
		t.StructuredResultJSON = res.structured
		t.Summary = summarize(res.text)
		t.Usage = res.usage
		t.CheckpointID = checkpointID
		t.Warnings = append(t.Warnings, res.warnings...)
		if res.drift != nil {
			t.Drift = res.drift
		}
		end := m.now()
		t.EndedAt = &end
		if res.command != "" {
			t.Command = res.command
		}
		return nil
	}
}

// retryStore runs f until it succeeds, fails for a reason other than the
// database being unreachable (a hangar error: not found, a state
// conflict), or ctx ends. It backs off up to 5 s between tries.
func (m *Manager) retryStore(ctx context.Context, log *slog.Logger, f func() error) error {
	delay := 100 * time.Millisecond
	warned := false
	for {
		err := f()
		var he *fault.Error
		if err == nil || errors.As(err, &he) || errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrConflict) || ctx.Err() != nil {
			return err
		}
		if m.d.Store.Ping(ctx) == nil {
			// The database answers: the error was f's own.
			return err
		}
		if !warned {
			log.WarnContext(ctx, "session database unreachable: waiting for it to record the turn's end", "error", err)
			warned = true
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// handoff is the prompt that starts a turn on a new agent: an account of
// the turns so far, then the message.
func (m *Manager) handoff(ctx context.Context, name string, number int, message string) string {
	turns, err := m.d.Store.ListTurns(ctx, name)
	if err != nil {
		return message
	}
	var summaries []harness.TurnSummary
	for _, t := range turns {
		if t.Number >= number {
			break
		}
		summaries = append(summaries, harness.TurnSummary{Number: t.Number, Harness: harness.Name(t.Harness), Message: t.Message, Result: t.Result})
	}
	return harness.Handoff(summaries, message)
}

// placeAttachments puts file attachments under ~/.hangar-agent/context and
// adds text attachments to the prompt.
func (m *Manager) placeAttachments(ctx context.Context, s *store.Session, sb *sandboxv1.Sandbox, atts []Attachment, message string) (string, error) {
	var files, texts []string
	for i, a := range atts {
		if a.Text != "" {
			texts = append(texts, a.Text)
			continue
		}
		name := path.Base(a.Name)
		if name == "." || name == "/" || name == "" {
			name = fmt.Sprintf("attachment-%d", i+1)
		}
		p := path.Join(agentDir(sb), "context", name)
		if _, err := m.d.Sandboxes.WriteFile(ctx, &sandboxv1.WriteFileRequest{SandboxId: sb.GetId(), FencingToken: s.FencingToken, Path: p, Content: a.File, Mode: 0o644}); err != nil {
			return "", fmt.Errorf("attachment %s: %w", name, err)
		}
		files = append(files, p)
	}
	var b strings.Builder
	b.WriteString(message)
	for _, t := range texts {
		b.WriteString("\n\n")
		b.WriteString(t)
	}
	if len(files) > 0 {
		b.WriteString("\n\nAttached files: ")
		b.WriteString(strings.Join(files, ", "))
	}
	return b.String(), nil
}

// takeQuestion reads (and clears) a question left by `hangar-agent ask`.
func (m *Manager) takeQuestion(ctx context.Context, sb *sandboxv1.Sandbox, token uint64, number int) (*store.Question, error) {
	p := path.Join(agentDir(sb), "question")
	resp, err := m.d.Sandboxes.ReadFile(ctx, &sandboxv1.ReadFileRequest{SandboxId: sb.GetId(), FencingToken: token, Path: p})
	if fault.ReasonOf(err) == "FILE_NOT_FOUND" {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := m.tool(ctx, sb.GetId(), token, sandboxtool.CommandRemove, sandboxtool.RemoveRequest{Path: p}, nil); err != nil {
		return nil, err
	}
	text := strings.TrimSpace(string(resp.GetContent()))
	if text == "" {
		return nil, nil
	}
	return &store.Question{ID: shortID(), Text: text, Turn: number, AskedAt: m.now()}, nil
}

func (m *Manager) appendEvents(ctx context.Context, name string, number int, evs []harness.Event) {
	out := make([]store.Event, 0, len(evs))
	for _, e := range evs {
		se := store.Event{Turn: number, Kind: string(e.Kind), Text: e.Text, ExitCode: e.ExitCode, Path: e.Path}
		if e.Kind == harness.EventKind("command") && e.Command != "" {
			se.Text = e.Command
		}
		if e.Usage != nil {
			u := usageFromHarness(*e.Usage)
			se.Usage = &u
		}
		if len(e.Raw) > 0 && json.Valid(e.Raw) {
			se.DataJSON = string(e.Raw)
		}
		out = append(out, se)
	}
	m.appendStoreEvents(ctx, name, out)
}

func usageFromGateway(u *gatewayv1.Usage) store.Usage {
	return store.Usage{
		InputTokens: u.GetInputTokens(), OutputTokens: u.GetOutputTokens(),
		CacheReadTokens: u.GetCacheReadTokens(), CacheWriteTokens: u.GetCacheWriteTokens(),
		CostUSD: u.GetCostUsd(), ModelCalls: int(u.GetModelCalls()),
	}
}

func usageFromHarness(u harness.Usage) store.Usage {
	return store.Usage{
		InputTokens: u.InputTokens, OutputTokens: u.OutputTokens,
		CacheReadTokens: u.CacheReadTokens, CacheWriteTokens: u.CacheWriteTokens,
		CostUSD: u.CostUSD, ModelCalls: u.ModelCalls,
	}
}

// summarize is a turn's one-line summary: the first line of the agent's
// answer, shortened.
func summarize(text string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(text), "\n")
	if r := []rune(line); len(r) > 200 {
		line = string(r[:199]) + "…"
	}
	return line
}

func shortID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

// lineWriter splits a stream into lines for a harness parser.
type lineWriter struct {
	buf    bytes.Buffer
	onLine func([]byte)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	for {
		i := bytes.IndexByte(w.buf.Bytes(), '\n')
		if i < 0 {
			break
		}
		line := w.buf.Next(i + 1)
		w.onLine(bytes.TrimRight(line, "\r\n"))
	}
	return len(p), nil
}

func (w *lineWriter) flush() {
	if w.buf.Len() > 0 {
		w.onLine(w.buf.Bytes())
		w.buf.Reset()
	}
}

// tailBuffer keeps the last max bytes written.
type tailBuffer struct {
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.buf) }

var _ io.Writer = (*lineWriter)(nil)
