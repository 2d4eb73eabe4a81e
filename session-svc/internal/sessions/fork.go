package sessions

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/harness"
	"github.com/hangar-dev/hangar/session-svc/internal/harnesslock"
	"github.com/hangar-dev/hangar/session-svc/internal/holds"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// ForkInput is what `session fork` asks for.
type ForkInput struct {
	Parent string
	// N forks; with Names, 0 means len(Names).
	N int
	// Message starts each fork's first turn; without one the forks only
	// boot (Boot) or are only created.
	Message string
	// Harness forks into another agent (a handoff); "" keeps the parent's.
	Harness string
	// Names of the forks; <parent>-fork-<i> when empty.
	Names []string
	// Branches of the forks, one per name; <parent branch>-fork-<i> when
	// empty (a job forking the attempts a restart cut off keeps their
	// numbers).
	Branches []string
	// Boot opens each fork (sandbox up, checkpoint restored) when there is
	// no message.
	Boot bool
	// Budget overrides the parent's for the forks' first turns when set.
	Budget *store.Budget
	// HarnessLock thaws the forks from a harness lock (NAME@rN or NAME):
	// the lock's harness, model and approval mode, the lock recorded. A
	// lock on another harness than the parent's starts the forks' own
	// conversation (there is none of that harness to fork). Not with
	// Harness.
	HarnessLock string
	lock        *harnesslock.Lock
}

// Fork is the result of a fork: the new sessions (as created; with a
// message their first turn has started) and the parent's checkpoint they
// started from.
type Fork struct {
	Sessions   []*store.Session
	Turns      []*store.Turn
	Checkpoint string
}

// Fork branches a session into N new sessions. Each fork has the parent's
// work (its checkpoint, shared rather than copied, restored onto the branch
// <parent branch>-fork-<i>), its turns as inherited history with their
// events and artifacts, its open question and its conversation, which the
// fork's first turn forks with the CLI's own fork. A parent that is mid-turn
// is refused.
func (m *Manager) Fork(ctx context.Context, in ForkInput) (*Fork, error) {
	if err := m.refuseWhileDraining(); err != nil {
		return nil, err
	}
	if err := ValidName("name", in.Parent); err != nil {
		return nil, err
	}
	n := in.N
	if n == 0 {
		n = len(in.Names)
	}
	max := m.cfg.ForkMax
	if max <= 0 {
		max = 8
	}
	switch {
	case n < 1:
		return nil, fault.InvalidArgument("n", "-n must be at least 1")
	case n > max:
		return nil, fault.InvalidArgument("n", "-n %d is more than HANGAR_FORK_MAX (%d) forks per call", n, max)
	case len(in.Names) > 0 && len(in.Names) != n:
		return nil, fault.InvalidArgument("names", "%d names for %d forks: give one --name per fork, or none", len(in.Names), n)
	case len(in.Branches) > 0 && len(in.Branches) != n:
		return nil, fault.InvalidArgument("branches", "%d branches for %d forks", len(in.Branches), n)
	}
	if in.Harness != "" {
		if _, err := harness.Lookup(harness.Name(in.Harness)); err != nil {
			return nil, fault.InvalidArgument("harness", "harness %q is not one of claude, codex, pi, antigravity", in.Harness)
		}
	}
	if in.Budget != nil {
		if err := validBudget(*in.Budget); err != nil {
			return nil, err
		}
	}
	if in.HarnessLock != "" {
		if in.Harness != "" {
			return nil, fault.InvalidArgument("harness_lock", "harness_lock %s sets the forks' harness: leave harness out", in.HarnessLock)
		}
	}
	parent, err := m.get(ctx, in.Parent)
	if err != nil {
		return nil, err
	}
	if in.HarnessLock != "" {
		lock, err := m.forkLock(ctx, in.HarnessLock, parent.Environment)
		if err != nil {
			return nil, err
		}
		in.lock = &lock
	}
	if err := refuseHarnessSwitch(parent, in.Harness); err != nil {
		return nil, err
	}
	// Forks are numbered on from the parent's earlier ones, so no call
	// reuses a name or a branch another made.
	first, err := m.nextForkIndex(ctx, parent)
	if err != nil {
		return nil, err
	}
	names := make([]string, n)
	seen := map[string]bool{}
	for i := range names {
		if len(in.Names) > 0 {
			names[i] = in.Names[i]
		} else {
			names[i] = fmt.Sprintf("%s-fork-%d", in.Parent, first+i)
		}
		if err := ValidName("names", names[i]); err != nil {
			return nil, err
		}
		if seen[names[i]] || names[i] == in.Parent {
			return nil, fault.InvalidArgument("names", "fork name %q is used twice", names[i])
		}
		seen[names[i]] = true
	}

	// A name taken is refused before anything is made.
	for _, name := range names {
		_, err := m.d.Store.GetSession(ctx, name)
		switch {
		case err == nil:
			return nil, fault.AlreadyExists("SESSION_EXISTS", "session %q already exists: pick other fork names with --name", name)
		case !errors.Is(err, store.ErrNotFound):
			return nil, fmt.Errorf("load session %s: %w", name, err)
		}
	}
	m.mu.Lock()
	_, turnHere := m.turns[in.Parent]
	m.mu.Unlock()
	switch {
	case turnHere || parent.State == store.StateRunning || parent.State == store.StateResuming:
		return nil, fault.FailedPrecondition("PARENT_MID_TURN", "session %q is mid-turn: a parent that is mid-turn can't be forked; wait for the turn to finish", in.Parent)
	case parent.State == store.StateArchived:
		return nil, fault.FailedPrecondition("SESSION_ARCHIVED", "session %q is archived: its checkpoints are gone, so it can't be forked", in.Parent)
	case parent.State == store.StateSuspending:
		return nil, fault.FailedPrecondition("SESSION_SUSPENDING", "session %q is suspending: fork it once it is suspended", in.Parent)
	}
	// Keep the parent from suspending under the fork.
	if hold, err := m.d.Holds.Acquire(ctx, in.Parent, "fork", holds.KindCommand, "forking", m.cfg.LeaseTTL); err == nil {
		defer func() {
			if err := m.d.Holds.Release(context.WithoutCancel(ctx), in.Parent, hold.ID); err != nil {
				m.log.WarnContext(ctx, "fork hold not released", "session", in.Parent, "error", err)
			}
		}()
	} else {
		m.log.WarnContext(ctx, "fork hold not taken", "session", in.Parent, "error", err)
	}

	cp, err := m.forkPoint(ctx, parent)
	if err != nil {
		return nil, err
	}
	if parent.ConversationID != "" && m.d.Claims != nil {
		// The parent is the oldest holder of its conversation: the forks
		// fork it rather than continue it.
		if _, err := m.d.Claims.Claim(ctx, parent.ConversationID, parent.Name); err != nil {
			m.log.WarnContext(ctx, "conversation claim not taken", "session", parent.Name, "error", err)
		}
	}

	out := &Fork{Checkpoint: cp.GetId()}
	created := make([]*store.Session, len(names))
	errs := make([]error, len(names))
	create := func(i int) {
		branch := fmt.Sprintf("%s-fork-%d", parent.Branch, first+i)
		if len(in.Branches) > 0 {
			branch = in.Branches[i]
		}
		created[i], errs[i] = m.createFork(ctx, parent, cp, names[i], branch, in)
	}
	// The records are independent: made together, they take about as long
	// as one. Forks booted together (one restore, copies of it) start
	// booting the first while the others' records are made.
	boot := in.Boot || (in.Message != "" && len(names) > 1)
	var opened []*store.Session
	var openErrs []error
	var wg sync.WaitGroup
	start := 0
	if boot {
		create(0)
		if errs[0] != nil {
			return out, errs[0]
		}
		start = 1
	}
	for i := start; i < len(names); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			create(i)
		}()
	}
	if boot {
		opened, openErrs = m.openForks(ctx, names, func() []error {
			wg.Wait()
			return errs
		})
	}
	wg.Wait()
	for i := range names {
		if errs[i] == nil {
			out.Sessions = append(out.Sessions, created[i])
		}
	}
	if err := errors.Join(errs...); err != nil {
		return out, err
	}
	for i, err := range openErrs {
		switch {
		case err != nil && in.Message != "":
			// It boots again on its own for its turn.
			m.log.WarnContext(ctx, "fork not opened before its turn", "session", names[i], "error", err)
		case opened[i] != nil:
			out.Sessions[i] = opened[i]
		}
	}
	switch {
	case in.Message != "":
		for i, s := range out.Sessions {
			_, t, err := m.Send(ctx, s.Name, TurnInput{Message: in.Message, Harness: in.Harness, Budget: in.Budget})
			if err != nil {
				return out, fmt.Errorf("first turn of fork %s: %w", s.Name, err)
			}
			out.Turns = append(out.Turns, t)
			if cur, err := m.get(ctx, s.Name); err == nil {
				out.Sessions[i] = cur
			}
		}
	case in.Boot:
		if err := errors.Join(openErrs...); err != nil {
			return out, err
		}
	}
	return out, nil
}

// forkPoint is the parent's checkpoint the forks start from: a fresh one
// when its sandbox is up (the checkpoint service reuses the newest when
// nothing changed), else its newest.
func (m *Manager) forkPoint(ctx context.Context, parent *store.Session) (*checkpointv1.Checkpoint, error) {
	if parent.SandboxID != "" {
		cp, err := m.checkpoint(ctx, parent, 0, "manual", 0)
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s before the fork: %w", parent.Name, err)
		}
		return cp, nil
	}
	cp, err := m.restorePoint(ctx, parent)
	if err != nil {
		return nil, err
	}
	if cp == nil {
		return nil, fault.FailedPrecondition("NOTHING_TO_FORK", "session %q has no checkpoint yet: run a turn or open it, then fork", parent.Name)
	}
	return cp, nil
}

// createFork records one fork: the session (suspended until its first
// turn or open), its checkpoint (sharing the parent's data) and the
// parent's history.
func (m *Manager) createFork(ctx context.Context, parent *store.Session, cp *checkpointv1.Checkpoint, name, branch string, in ForkInput) (*store.Session, error) {
	now := m.now()
	s := &store.Session{
		Name: name, Environment: parent.Environment, Repo: parent.Repo, Harness: parent.Harness, Branch: branch,
		State: store.StateSuspended, StateReason: "forked from " + parent.Name, StateChangedAt: now,
		IdleMinutes: parent.IdleMinutes, ParentID: parent.Name, ForkedFromCheckpoint: cp.GetId(),
		// The parent's conversation: claimed by the parent, so the fork's
		// first turn forks it.
		ConversationID: parent.ConversationID,
		CreatedAt:      now, LastActiveAt: now, BaseCommit: parent.BaseCommit,
		Budget: parent.Budget, Approvals: parent.Approvals, CacheTTL: parent.CacheTTL, Model: parent.Model,
		HarnessLock: parent.HarnessLock, Question: parent.Question,
	}
	if l := in.lock; l != nil {
		s.Model, s.HarnessLock, s.Approvals = l.Model, l.Ref(), ""
		if l.Approvals == ApprovalsAsk {
			s.Approvals = ApprovalsAsk
		}
		if l.Harness != parent.Harness {
			s.Harness, s.ConversationID = l.Harness, ""
		}
	}
	if in.Harness != "" && in.Harness != parent.Harness && in.Message == "" {
		// No turn to hand off in yet: the fork starts its own conversation.
		s.Harness, s.ConversationID = in.Harness, ""
	}
	// The fork's checkpoint first, then its record: a process killed in
	// between leaves a checkpoint no session names (harmless), never a
	// fork with no checkpoint to boot from (TestReplicas' kill mid-fork
	// found that order).
	forked, err := m.d.Checkpoints.ForkCheckpoint(ctx, &checkpointv1.ForkCheckpointRequest{
		CheckpointId: cp.GetId(), NewSession: name, Branch: branch,
	})
	if err != nil {
		return nil, fmt.Errorf("fork checkpoint %s for %s: %w", cp.GetId(), name, err)
	}
	if err := m.d.Store.CreateSession(ctx, s); err != nil {
		if errors.Is(err, store.ErrExists) {
			// Taken since the names were checked: the checkpoint just
			// made is not that session's.
			if _, derr := m.d.Checkpoints.DeleteCheckpoint(context.WithoutCancel(ctx), &checkpointv1.DeleteCheckpointRequest{CheckpointId: forked.GetCheckpoint().GetId()}); derr != nil {
				m.log.WarnContext(ctx, "checkpoint of a fork whose name was taken not deleted", "session", name, "checkpoint", forked.GetCheckpoint().GetId(), "error", derr)
			}
			return nil, fault.AlreadyExists("SESSION_EXISTS", "session %q already exists: pick other fork names with --name", name)
		}
		return nil, fmt.Errorf("create fork %s: %w", name, err)
	}
	m.noteCheckpoint(ctx, name, forked.GetCheckpoint())
	if err := m.d.Store.CopyHistory(ctx, parent.Name, name); err != nil {
		return nil, fmt.Errorf("copy history of %s to %s: %w", parent.Name, name, err)
	}
	m.appendStoreEvents(ctx, name, []store.Event{{Kind: "fork", Text: fmt.Sprintf("forked from %s at checkpoint %s", parent.Name, cp.GetId())}})
	m.events.publish(name)
	return m.get(ctx, name)
}

// conversationFor decides how a turn continues conversation: resume it when
// this session holds it, else fork it (the CLI's own fork), or, for a CLI
// that can't fork, start a new conversation with a handoff. It returns the
// message, the conversation to resume and the one to fork.
func (m *Manager) conversationFor(ctx context.Context, s *store.Session, adapter harness.Adapter, number int, message, conversation string) (string, string, string) {
	if conversation == "" || m.ownsConversation(ctx, s, conversation) {
		return message, conversation, ""
	}
	if !adapter.CanFork() {
		return m.handoff(ctx, s.Name, number, message), "", ""
	}
	m.appendStoreEvents(ctx, s.Name, []store.Event{{Turn: number, Kind: "fork", Text: "forking conversation " + conversation}})
	return message, "", conversation
}

// relocation maps a checkpoint's conversation paths to where this sandbox's
// harness looks for them (a fork's sandbox is not its parent's), for the
// restore to put them there directly: the captured sandbox's own files are
// never written.
func relocation(sb *sandboxv1.Sandbox, cp *checkpointv1.Checkpoint) []*checkpointv1.PathRewrite {
	from := cp.GetConversationPaths()
	if len(from) == 0 {
		return nil
	}
	adapter, err := harness.Lookup(harness.Name(cp.GetHarness()))
	if err != nil {
		return nil
	}
	to := adapter.ConversationPaths(harness.Sandbox{WorkDir: sb.GetWorkDir(), HomeDir: sb.GetHomeDir()}, cp.GetConversationId())
	if len(to) != len(from) {
		return nil
	}
	var out []*checkpointv1.PathRewrite
	for i := range from {
		if from[i] != to[i] {
			out = append(out, &checkpointv1.PathRewrite{From: from[i], To: to[i]})
		}
	}
	return out
}

// forkNames is for callers naming forks after a prefix (jobs).
// nextForkIndex is the number the parent's next fork gets: one past the
// highest its earlier forks' names (<parent>-fork-<i>) or branches
// (<parent branch>-fork-<i>) carry, 1 for the first.
func (m *Manager) nextForkIndex(ctx context.Context, parent *store.Session) (int, error) {
	forks, _, err := m.d.Store.ListSessions(ctx, store.ListOptions{ParentID: parent.Name})
	if err != nil {
		return 0, fmt.Errorf("forks of %s: %w", parent.Name, err)
	}
	highest := 0
	for _, f := range forks {
		for _, pair := range [][2]string{{f.Name, parent.Name + "-fork-"}, {f.Branch, parent.Branch + "-fork-"}} {
			if rest, ok := strings.CutPrefix(pair[0], pair[1]); ok {
				if i, err := strconv.Atoi(rest); err == nil && i > highest {
					highest = i
				}
			}
		}
	}
	return highest + 1, nil
}

func forkNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i+1)
	}
	return out
}
