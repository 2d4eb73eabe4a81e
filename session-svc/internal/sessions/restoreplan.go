package sessions

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// ReasonCheckpointMissing: the checkpoint a session's record names as its
// newest is gone (or damaged), so it cannot be booted without losing work.
// The message names it and what can be restored. The checkpoint service
// answers a restore of a missing checkpoint with the same reason.
const ReasonCheckpointMissing = "CHECKPOINT_MISSING"

// noteCheckpoint records cp on its session's record (the store's
// checkpoints table): the newest recorded checkpoint is the one a boot
// restores, so a deleted or damaged newest manifest is noticed instead of
// an older checkpoint being restored in its place. Recording the same
// checkpoint again (a capture that found nothing changed) is a no-op. A
// failure is logged, not returned: the checkpoint exists, and restorePoint
// prefers an intact checkpoint newer than the recorded one.
//
// Call it after every checkpoint the service makes for a session: a
// capture (Manager.checkpoint) and a fork's ForkCheckpoint.
func (m *Manager) noteCheckpoint(ctx context.Context, name string, cp *checkpointv1.Checkpoint) {
	if cp.GetId() == "" {
		return
	}
	rec := &store.Checkpoint{
		ID: cp.GetId(), Session: name, CreatedAt: cp.GetCreatedAt().AsTime(),
		Reason: checkpointReasonName(cp.GetReason()), Turn: int(cp.GetTurn()), SizeBytes: cp.GetSizeBytes(),
	}
	for _, w := range cp.GetWarnings() {
		rec.Warnings = append(rec.Warnings, w.GetMessage())
	}
	if err := m.d.Store.AddCheckpoint(ctx, rec); err != nil && !errors.Is(err, store.ErrExists) {
		m.log.WarnContext(ctx, "checkpoint not recorded on the session", "session", name, "checkpoint", cp.GetId(), "error", err)
	}
}

func checkpointReasonName(r checkpointv1.CheckpointReason) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "CHECKPOINT_REASON_"))
}

// restorePoint is the checkpoint a boot of s restores (nil: s has never
// been checkpointed and starts at its base): the newest its record names,
// or one newer that the checkpoint service holds intact (a capture whose
// recording was lost). If the named one is missing or damaged it fails
// with ReasonCheckpointMissing naming it and what can be restored: an
// older checkpoint is never restored silently, and a session with work is
// never booted bare at its base.
//
// The boot (prepare) restores what this returns, by id; fork points and
// reads of a suspended session's work use it too.
func (m *Manager) restorePoint(ctx context.Context, s *store.Session) (*checkpointv1.Checkpoint, error) {
	named, err := m.namedCheckpoint(ctx, s)
	if err != nil {
		return nil, err
	}
	listed, err := m.Checkpoints(ctx, s.Name)
	if err != nil {
		return nil, err
	}
	return planRestore(s, named, listed)
}

// namedCheckpoint is the newest checkpoint s's record names: its recorded
// checkpoints, and (for sessions recorded before checkpoints were) the
// checkpoints its own turns ended with. "" when it names none.
func (m *Manager) namedCheckpoint(ctx context.Context, s *store.Session) (string, error) {
	recorded, err := m.d.Store.ListCheckpoints(ctx, s.Name)
	if err != nil {
		return "", fmt.Errorf("recorded checkpoints of %s: %w", s.Name, err)
	}
	turns, err := m.d.Store.ListTurns(ctx, s.Name)
	if err != nil {
		return "", fmt.Errorf("turns of %s: %w", s.Name, err)
	}
	var ids []string
	for _, c := range recorded {
		ids = append(ids, c.ID)
	}
	for _, t := range turns {
		if !t.Inherited {
			ids = append(ids, t.CheckpointID)
		}
	}
	return newestOf(s.Name, ids), nil
}

// checkpointStamp is the sortable part of a checkpoint id of session
// ("<session>~<stamp>-<random>"), or "" for an id of another session.
func checkpointStamp(session, id string) string {
	rest, ok := strings.CutPrefix(id, session+"~")
	if !ok || rest == "" {
		return ""
	}
	return rest
}

// newestOf is the newest of ids that belong to session ("" if none).
func newestOf(session string, ids []string) string {
	best := ""
	for _, id := range ids {
		if st := checkpointStamp(session, id); st != "" && st > checkpointStamp(session, best) {
			best = id
		}
	}
	return best
}

// planRestore decides what a boot of s restores from the checkpoint its
// record names (named, "" for none) and the checkpoint service's list
// (newest first, damaged ones flagged). Pure: see restorePoint.
func planRestore(s *store.Session, named string, listed []*checkpointv1.Checkpoint) (*checkpointv1.Checkpoint, error) {
	var namedEntry *checkpointv1.Checkpoint
	for _, cp := range listed {
		if cp.GetId() == named {
			namedEntry = cp
		}
	}
	// Newer than the named one (or any, when none is named): the newest
	// intact. A damaged entry newer than the named one is passed over only
	// when something is named; unnamed, the newest must be intact.
	for _, cp := range listed {
		newer := named == "" || checkpointStamp(s.Name, cp.GetId()) > checkpointStamp(s.Name, named)
		if !newer {
			break
		}
		if cp.GetDamaged() == "" {
			return cp, nil
		}
		if named == "" {
			return nil, notRestorable(s, cp.GetId(), "is damaged", listed)
		}
	}
	switch {
	case namedEntry != nil && namedEntry.GetDamaged() == "":
		return namedEntry, nil
	case namedEntry != nil:
		return nil, notRestorable(s, named, "is damaged", listed)
	case named != "":
		return nil, notRestorable(s, named, "is missing", listed)
	case s.ForkedFromCheckpoint != "":
		return nil, fault.NotFound(ReasonCheckpointMissing,
			"session %q is a fork of checkpoint %s but its own checkpoint is missing; it cannot be booted without losing its work", s.Name, s.ForkedFromCheckpoint)
	}
	return nil, nil
}

// notRestorable says the checkpoint id s must boot from cannot be used,
// and what can.
func notRestorable(s *store.Session, id, what string, listed []*checkpointv1.Checkpoint) error {
	var ok []string
	for _, cp := range listed {
		if cp.GetDamaged() == "" && cp.GetId() != id {
			ok = append(ok, fmt.Sprintf("%s (turn %d)", cp.GetId(), cp.GetTurn()))
		}
	}
	can := fmt.Sprintf("session %q has no other checkpoint that can be restored", s.Name)
	if len(ok) > 0 {
		can = "it can be restored from: " + strings.Join(ok, ", ")
	}
	return fault.NotFound(ReasonCheckpointMissing,
		"session %q's newest checkpoint %s %s, so it was not booted (an older checkpoint would lose work); %s", s.Name, id, what, can)
}

// SessionCheckpoints lists s's checkpoints for `get`, newest first: the
// checkpoint service's list (damaged ones flagged) and, when the checkpoint
// s's record names is not in it, that one too, flagged as missing, so `get`
// says why the session cannot be booted.
func (m *Manager) SessionCheckpoints(ctx context.Context, s *store.Session) ([]*checkpointv1.Checkpoint, error) {
	listed, err := m.Checkpoints(ctx, s.Name)
	if err != nil {
		return nil, err
	}
	named, err := m.namedCheckpoint(ctx, s)
	if err != nil || named == "" {
		return listed, err
	}
	for _, cp := range listed {
		if cp.GetId() == named {
			return listed, nil
		}
	}
	missing := &checkpointv1.Checkpoint{Id: named, Session: s.Name,
		Damaged: "missing: the session's record names it as its newest checkpoint, but the checkpoint service does not have it"}
	if recs, err := m.d.Store.ListCheckpoints(ctx, s.Name); err == nil {
		for _, r := range recs {
			if r.ID == named {
				missing.CreatedAt, missing.Turn = timestamppb.New(r.CreatedAt), int32(r.Turn)
				missing.Reason = checkpointv1.CheckpointReason(checkpointv1.CheckpointReason_value["CHECKPOINT_REASON_"+strings.ToUpper(r.Reason)])
			}
		}
	}
	out := make([]*checkpointv1.Checkpoint, 0, len(listed)+1)
	placed := false
	for _, cp := range listed {
		if !placed && checkpointStamp(s.Name, cp.GetId()) < checkpointStamp(s.Name, named) {
			out, placed = append(out, missing), true
		}
		out = append(out, cp)
	}
	if !placed {
		out = append(out, missing)
	}
	return out, nil
}
