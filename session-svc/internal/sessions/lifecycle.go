package sessions

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/harness"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// checkpointReasons maps the schedule's reasons to the contract's.
var checkpointReasons = map[string]checkpointv1.CheckpointReason{
	"after_turn":     checkpointv1.CheckpointReason_CHECKPOINT_REASON_AFTER_TURN,
	"periodic":       checkpointv1.CheckpointReason_CHECKPOINT_REASON_PERIODIC,
	"suspend":        checkpointv1.CheckpointReason_CHECKPOINT_REASON_SUSPEND,
	"before_destroy": checkpointv1.CheckpointReason_CHECKPOINT_REASON_BEFORE_DESTROY,
	"manual":         checkpointv1.CheckpointReason_CHECKPOINT_REASON_MANUAL,
}

// checkpoint captures s's sandbox. token overrides the session's fencing
// token (a destroy notice carries its own). When nothing changed since the
// previous checkpoint, the checkpoint service reuses it and that one is
// returned.
func (m *Manager) checkpoint(ctx context.Context, s *store.Session, turn int, reason string, token uint64) (*checkpointv1.Checkpoint, error) {
	return m.checkpointWith(ctx, s, turn, reason, token, false)
}

// checkpointWith is checkpoint; settled asks the checkpoint service to
// drop a capture during which the tree changed (the agent is working).
func (m *Manager) checkpointWith(ctx context.Context, s *store.Session, turn int, reason string, token uint64, settled bool) (*checkpointv1.Checkpoint, error) {
	sb, err := m.sandboxOf(ctx, s)
	if err != nil {
		return nil, err
	}
	if token == 0 {
		token = s.FencingToken
	}
	var conversation []string
	if s.ConversationID != "" {
		if adapter, err := harness.Lookup(harness.Name(s.Harness)); err == nil {
			conversation = adapter.ConversationPaths(harness.Sandbox{WorkDir: sb.GetWorkDir(), HomeDir: sb.GetHomeDir()}, s.ConversationID)
		}
	}
	if turn == 0 {
		if turns, err := m.d.Store.ListTurns(ctx, s.Name); err == nil && len(turns) > 0 {
			turn = turns[len(turns)-1].Number
		}
	}
	resp, err := m.d.Checkpoints.CaptureCheckpoint(ctx, &checkpointv1.CaptureCheckpointRequest{
		SandboxId: s.SandboxID, FencingToken: token, Session: s.Name,
		Reason: checkpointReasons[reason], WorkDir: sb.GetWorkDir(), Branch: s.Branch,
		BaseCommit: s.BaseCommit, Harness: s.Harness, ConversationId: s.ConversationID,
		Turn: int32(turn), ConversationPaths: conversation, VerifySettled: settled,
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s (%s): %w", s.Name, reason, err)
	}
	cp := resp.GetCheckpoint()
	m.noteCheckpoint(ctx, s.Name, cp)
	text := fmt.Sprintf("checkpoint %s (%s)", cp.GetId(), reason)
	if !resp.GetCreated() {
		text = fmt.Sprintf("checkpoint %s unchanged (%s)", cp.GetId(), reason)
	}
	m.appendStoreEvents(ctx, s.Name, []store.Event{{Turn: turn, Kind: "checkpoint", Text: text}})
	return cp, nil
}

// Checkpoints lists a session's checkpoints, newest first.
func (m *Manager) Checkpoints(ctx context.Context, name string) ([]*checkpointv1.Checkpoint, error) {
	resp, err := m.d.Checkpoints.ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: name})
	if err != nil {
		return nil, fmt.Errorf("checkpoints of %s: %w", name, err)
	}
	return resp.GetCheckpoints(), nil
}

// Suspend checkpoints a session and releases its sandbox. A session running
// a turn is refused (wait for it or interrupt it).
func (m *Manager) Suspend(ctx context.Context, name, reason string) (*store.Session, error) {
	if err := ValidName("name", name); err != nil {
		return nil, err
	}
	cur, err := m.get(ctx, name)
	if err != nil {
		return nil, err
	}
	switch cur.State {
	case store.StateSuspended, store.StateArchived:
		return cur, nil
	case store.StateRunning, store.StateResuming:
		return nil, fault.FailedPrecondition("TURN_RUNNING", "session %q is running a turn: wait for it to end or interrupt it, then suspend", name)
	}
	s, err := m.transition(ctx, name, store.StateSuspending, reason, store.StateIdle, store.StateNeedsInput, store.StateFailed)
	if err != nil {
		return nil, err
	}
	// Once suspending, the suspend finishes even if its caller goes away
	// (a client that quit, a stopping process): half done, it would leave
	// the work to a later retry at best.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), suspendTimeout)
	defer cancel()
	if s.SandboxID != "" {
		// The sandbox is going: nothing may write its tree while it is
		// captured (a background process would make the checkpoint
		// disagree with itself).
		m.killProcesses(ctx, s.Name, s.SandboxID, s.FencingToken)
		cp, err := m.checkpoint(ctx, s, 0, "suspend", 0)
		if err != nil {
			// Keep the sandbox: releasing it now would lose work.
			_, _ = m.transition(context.WithoutCancel(ctx), name, cur.State, "suspend failed: no checkpoint", store.StateSuspending)
			return nil, err
		}
		sandboxID, token := s.SandboxID, s.FencingToken
		if s, err = m.clearSandbox(ctx, name); err != nil {
			return nil, err
		}
		// The sandbox holds cp (nothing runs in it): it may be kept for
		// the resume, which checks it against cp before use.
		m.releaseSandbox(ctx, name, sandboxID, token, cp.GetId())
	}
	return m.transition(ctx, name, store.StateSuspended, reason, store.StateSuspending)
}

// suspendTimeout bounds a suspend its caller no longer waits for: a
// checkpoint of a large tree and the release.
const suspendTimeout = 15 * time.Minute

// clearSandbox forgets a session's sandbox (before it is released, so the
// destroy notice it causes is recognised as ours).
func (m *Manager) clearSandbox(ctx context.Context, name string) (*store.Session, error) {
	s, err := m.d.Store.UpdateSession(ctx, name, func(cur *store.Session) error {
		cur.SandboxID, cur.FencingToken = "", 0
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("forget sandbox of %s: %w", name, err)
	}
	return s, nil
}

// Open boots and restores a session without running the agent.
func (m *Manager) Open(ctx context.Context, name string) (*store.Session, error) {
	s, up, err := m.beginOpen(ctx, name)
	if err != nil || up {
		return s, err
	}
	b, err := m.prepare(ctx, s)
	return m.finishOpen(ctx, s, b, err)
}

// beginOpen moves a session that has no sandbox to resuming; up says it
// has one already (s is then as it is).
func (m *Manager) beginOpen(ctx context.Context, name string) (s *store.Session, up bool, err error) {
	if err := ValidName("name", name); err != nil {
		return nil, false, err
	}
	cur, err := m.get(ctx, name)
	if err != nil {
		return nil, false, err
	}
	if cur.State == store.StateArchived {
		return nil, false, fault.FailedPrecondition("SESSION_ARCHIVED", "session %q is archived: its checkpoints are gone", name)
	}
	if cur.SandboxID != "" {
		return cur, true, nil
	}
	if err := m.refuseWhileDraining(); err != nil {
		return nil, false, err
	}
	s, err = m.transition(ctx, name, store.StateResuming, "open", store.StateSuspended, store.StateFailed)
	return s, false, err
}

// finishOpen records the sandbox prepared for s (prepareErr is how that
// went) and moves it out of resuming.
func (m *Manager) finishOpen(ctx context.Context, s *store.Session, b *booted, prepareErr error) (*store.Session, error) {
	name := s.Name
	err := prepareErr
	if err == nil {
		s, err = m.record(ctx, s, b, true)
	}
	if err != nil {
		_, _ = m.transition(context.WithoutCancel(ctx), name, store.StateSuspended, "open failed", store.StateResuming)
		return nil, err
	}
	next := store.StateIdle
	if s.Question != nil {
		next = store.StateNeedsInput
	}
	return m.transition(ctx, name, next, "opened", store.StateResuming)
}

// Keep sets a session's idle time (0 = never suspend).
func (m *Manager) Keep(ctx context.Context, name string, minutes int) (*store.Session, error) {
	if err := ValidName("name", name); err != nil {
		return nil, err
	}
	if minutes < 0 {
		return nil, fault.InvalidArgument("idle_minutes", "--idle must be 0 (never) or more minutes, got %d", minutes)
	}
	s, err := m.d.Store.UpdateSession(ctx, name, func(cur *store.Session) error {
		cur.IdleMinutes = &minutes
		return nil
	})
	if errors.Is(err, store.ErrNotFound) {
		return nil, fault.NotFound("SESSION_NOT_FOUND", "session %q does not exist", name)
	}
	if err != nil {
		return nil, fmt.Errorf("keep %s: %w", name, err)
	}
	m.events.publish(name)
	return s, nil
}

// Archive drops a session's checkpoints; the record stays.
func (m *Manager) Archive(ctx context.Context, name string) (*store.Session, error) {
	s, err := m.Suspend(ctx, name, "archive")
	if err != nil {
		return nil, err
	}
	if s.State == store.StateArchived {
		return s, nil
	}
	if _, err := m.d.Checkpoints.ArchiveSessionCheckpoints(ctx, &checkpointv1.ArchiveSessionCheckpointsRequest{Session: name}); err != nil {
		return nil, fmt.Errorf("drop checkpoints of %s: %w", name, err)
	}
	archived, err := m.transition(ctx, name, store.StateArchived, "archived", store.StateSuspended)
	if err != nil {
		return nil, err
	}
	if archived.ConversationID != "" && m.d.Claims != nil {
		// Its conversation is free for a session that holds it too (a
		// fork booted without a turn) to continue.
		if err := m.d.Claims.Release(ctx, archived.ConversationID, name); err != nil {
			m.log.WarnContext(ctx, "conversation claim not released", "session", name, "error", err)
		}
	}
	return archived, nil
}

// Interrupt stops the running turn (it ends interrupted, checkpointed) and,
// given a message, starts the next turn with it.
func (m *Manager) Interrupt(ctx context.Context, name, message string) (*store.Session, *store.Turn, error) {
	if err := ValidName("name", name); err != nil {
		return nil, nil, err
	}
	m.mu.Lock()
	at := m.turns[name]
	m.mu.Unlock()
	if at == nil {
		s, err := m.get(ctx, name)
		if err != nil {
			return nil, nil, err
		}
		if m.d.Replicas != nil && (s.State == store.StateRunning || s.State == store.StateResuming) {
			// A turn another replica runs: that replica stops it.
			if t, err := m.turn(ctx, name, 0); err == nil && t.EndedAt == nil {
				if err := m.interruptElsewhere(ctx, name, t.Number); err != nil {
					return nil, nil, fmt.Errorf("interrupt %s: %w", name, err)
				}
				if message == "" {
					s, err := m.get(ctx, name)
					return s, nil, err
				}
				return m.Send(ctx, name, TurnInput{Message: message})
			}
		}
		if message == "" {
			return nil, nil, fault.FailedPrecondition("NO_TURN_RUNNING", "session %q has no running turn to interrupt", name)
		}
		return m.Send(ctx, name, TurnInput{Message: message})
	}
	at.cancel(errInterrupted)
	select {
	case <-at.done:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	if message == "" {
		s, err := m.get(ctx, name)
		return s, nil, err
	}
	return m.Send(ctx, name, TurnInput{Message: message})
}

// Steer queues a message the running agent reads at its next step.
func (m *Manager) Steer(ctx context.Context, name, message string) error {
	if err := ValidName("name", name); err != nil {
		return err
	}
	if strings.TrimSpace(message) == "" {
		return fault.InvalidArgument("message", "the message is empty")
	}
	m.mu.Lock()
	at := m.turns[name]
	runID := ""
	if at != nil {
		runID = at.runID
	}
	m.mu.Unlock()
	number := 0
	if at != nil {
		number = at.number
	}
	if runID == "" {
		// A turn another replica runs: its run is on the turn's record,
		// and the gateway (any replica: steering is queued in Redis)
		// hands the message to the agent.
		s, err := m.get(ctx, name)
		if err != nil {
			return err
		}
		if s.State == store.StateRunning {
			if t, err := m.turn(ctx, name, 0); err == nil && t.EndedAt == nil && t.RunID != "" {
				runID, number = t.RunID, t.Number
			}
		}
		if runID == "" {
			return fault.FailedPrecondition("NO_TURN_RUNNING", "session %q has no running turn to steer: use send", name)
		}
	}
	if _, err := m.d.Gateway.SteerRun(ctx, &gatewayv1.SteerRunRequest{Run: runID, Message: message}); err != nil {
		return fmt.Errorf("steer %s: %w", name, err)
	}
	m.appendStoreEvents(ctx, name, []store.Event{{Turn: number, Kind: "steer", Text: message}})
	return nil
}

// WaitTurn blocks until turn (0 = the newest) of a session has ended and
// returns it. progress, when set, gets each event of the turn as it
// happens.
func (m *Manager) WaitTurn(ctx context.Context, name string, number int, progress func(store.Event) error) (*store.Turn, error) {
	if _, err := m.get(ctx, name); err != nil {
		return nil, err
	}
	wake, stop := m.events.subscribe(name)
	defer stop()
	var after int64
	for {
		t, err := m.turn(ctx, name, number)
		if err != nil {
			return nil, err
		}
		number = t.Number
		if progress != nil {
			evs, err := m.d.Store.ListEvents(ctx, name, after, number, 0)
			if err != nil {
				return nil, fmt.Errorf("events of %s: %w", name, err)
			}
			for _, e := range evs {
				after = e.Seq
				if err := progress(e); err != nil {
					return nil, err
				}
			}
		}
		if t.EndedAt != nil {
			return t, nil
		}
		select {
		case <-wake:
		case <-m.peerPoll():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (m *Manager) turn(ctx context.Context, name string, number int) (*store.Turn, error) {
	if number <= 0 {
		turns, err := m.d.Store.ListTurns(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("turns of %s: %w", name, err)
		}
		if len(turns) == 0 {
			return nil, fault.NotFound("TURN_NOT_FOUND", "session %q has no turns yet", name)
		}
		return turns[len(turns)-1], nil
	}
	t, err := m.d.Store.GetTurn(ctx, name, number)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fault.NotFound("TURN_NOT_FOUND", "session %q has no turn %d", name, number)
	}
	if err != nil {
		return nil, fmt.Errorf("turn %d of %s: %w", number, name, err)
	}
	return t, nil
}

// FollowEvents sends a session's events after afterSeq, then live ones,
// until ctx ends.
func (m *Manager) FollowEvents(ctx context.Context, name string, afterSeq int64, send func(store.Event) error) error {
	if _, err := m.get(ctx, name); err != nil {
		return err
	}
	wake, stop := m.events.subscribe(name)
	defer stop()
	for {
		evs, err := m.d.Store.ListEvents(ctx, name, afterSeq, 0, 0)
		if err != nil {
			return fmt.Errorf("events of %s: %w", name, err)
		}
		for _, e := range evs {
			afterSeq = e.Seq
			if err := send(e); err != nil {
				return err
			}
		}
		select {
		case <-wake:
		case <-m.peerPoll():
		case <-ctx.Done():
			return nil
		}
	}
}

// Patch is the session's work as one patch against its base: from the
// sandbox when it is up, else from the newest checkpoint.
func (m *Manager) Patch(ctx context.Context, name string) (patch, base, checkpointID string, err error) {
	s, err := m.Get(ctx, name)
	if err != nil {
		return "", "", "", err
	}
	if s.State == store.StateArchived {
		return "", "", "", fault.FailedPrecondition("SESSION_ARCHIVED", "session %q is archived: its checkpoints, and so its work, are gone", name)
	}
	if s.SandboxID != "" && s.State != store.StateRunning {
		sb, err := m.sandboxOf(ctx, s)
		if err == nil {
			var out bytes.Buffer
			err := m.tool(ctx, sb.GetId(), s.FencingToken, sandboxtool.CommandWorkDiff, sandboxtool.WorkDiffRequest{WorkDir: sb.GetWorkDir(), Against: s.BaseCommit}, &out)
			if err == nil {
				return out.String(), s.BaseCommit, "", nil
			}
		}
	}
	cp, err := m.restorePoint(ctx, s)
	if err != nil {
		return "", "", "", err
	}
	if cp == nil {
		return "", s.BaseCommit, "", nil
	}
	resp, err := m.d.Checkpoints.GetCheckpointPatch(ctx, &checkpointv1.GetCheckpointPatchRequest{CheckpointId: cp.GetId()})
	if err != nil {
		return "", "", "", fmt.Errorf("patch of %s: %w", name, err)
	}
	return resp.GetPatch(), resp.GetBaseCommit(), cp.GetId(), nil
}

// collectArtifacts moves files handed back with `hangar-agent artifact`
// from the sandbox into the artifact store.
func (m *Manager) collectArtifacts(ctx context.Context, s *store.Session, sb *sandboxv1.Sandbox, turn int) error {
	root := path.Join(agentDir(sb), "artifacts")
	var files []string
	var walk func(dir string) error
	walk = func(dir string) error {
		resp, err := m.d.Sandboxes.ListFiles(ctx, &sandboxv1.ListFilesRequest{SandboxId: sb.GetId(), FencingToken: s.FencingToken, Path: dir})
		if fault.ReasonOf(err) == "FILE_NOT_FOUND" {
			return nil
		}
		if err != nil {
			return err
		}
		for _, f := range resp.GetFiles() {
			p := f.GetPath()
			if !path.IsAbs(p) {
				p = path.Join(dir, path.Base(p))
			}
			switch f.GetType() {
			case sandboxv1.FileType_FILE_TYPE_DIRECTORY:
				if err := walk(p); err != nil {
					return err
				}
			case sandboxv1.FileType_FILE_TYPE_REGULAR:
				files = append(files, p)
			}
		}
		return nil
	}
	if err := walk(root); err != nil {
		return err
	}
	sort.Strings(files)
	for _, p := range files {
		resp, err := m.d.Sandboxes.ReadFile(ctx, &sandboxv1.ReadFileRequest{SandboxId: sb.GetId(), FencingToken: s.FencingToken, Path: p})
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p, root), "/")
		key := fmt.Sprintf("%s/%d/%s", s.Name, turn, rel)
		if err := m.d.Artifacts.Put(ctx, key, bytes.NewReader(resp.GetContent())); err != nil {
			return fmt.Errorf("store artifact %s: %w", rel, err)
		}
		if err := m.d.Store.AddArtifact(ctx, &store.Artifact{
			Session: s.Name, Turn: turn, Path: rel, SizeBytes: int64(len(resp.GetContent())),
			ContentType: contentType(rel, resp.GetContent()), SHA256: sha256Hex(resp.GetContent()), BlobKey: key,
		}); err != nil {
			return fmt.Errorf("record artifact %s: %w", rel, err)
		}
		m.appendStoreEvents(ctx, s.Name, []store.Event{{Turn: turn, Kind: "file_change", Path: rel, Text: "artifact " + rel}})
	}
	if len(files) > 0 {
		return m.tool(ctx, sb.GetId(), s.FencingToken, sandboxtool.CommandRemove, sandboxtool.RemoveRequest{Path: root}, nil)
	}
	return nil
}

// Artifact returns a handed-back file's record and content.
func (m *Manager) Artifact(ctx context.Context, name, p string, turn int) (*store.Artifact, []byte, error) {
	if _, err := m.Get(ctx, name); err != nil {
		return nil, nil, err
	}
	a, err := m.d.Store.GetArtifact(ctx, name, p, turn)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, fault.NotFound("ARTIFACT_NOT_FOUND", "session %q has no artifact %q", name, p)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("artifact %s of %s: %w", p, name, err)
	}
	r, err := m.d.Artifacts.Get(ctx, a.BlobKey)
	if err != nil {
		return nil, nil, fmt.Errorf("artifact %s of %s: %w", p, name, err)
	}
	defer r.Close()
	content, err := io.ReadAll(r)
	if err != nil {
		return nil, nil, fmt.Errorf("artifact %s of %s: %w", p, name, err)
	}
	return a, content, nil
}

// publicMessage is what a client may see of an error: what the RPC edge
// would answer for it (a domain error's message, another service's status
// only when it carries hangar's reason, else "internal error").
func publicMessage(err error) string {
	return fault.PublicMessage(err)
}
