package server

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/session-svc/internal/holds"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

var states = map[string]sessionv1.SessionState{
	store.StateRunning:    sessionv1.SessionState_SESSION_STATE_RUNNING,
	store.StateIdle:       sessionv1.SessionState_SESSION_STATE_IDLE,
	store.StateSuspending: sessionv1.SessionState_SESSION_STATE_SUSPENDING,
	store.StateSuspended:  sessionv1.SessionState_SESSION_STATE_SUSPENDED,
	store.StateResuming:   sessionv1.SessionState_SESSION_STATE_RESUMING,
	store.StateNeedsInput: sessionv1.SessionState_SESSION_STATE_NEEDS_INPUT,
	store.StateArchived:   sessionv1.SessionState_SESSION_STATE_ARCHIVED,
	store.StateFailed:     sessionv1.SessionState_SESSION_STATE_FAILED,
}

func stateEnum(s string) sessionv1.SessionState { return states[s] }

func stateName(e sessionv1.SessionState) string {
	for k, v := range states {
		if v == e {
			return k
		}
	}
	return ""
}

var outcomes = map[string]sessionv1.TurnOutcome{
	"completed":   sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED,
	"failed":      sessionv1.TurnOutcome_TURN_OUTCOME_FAILED,
	"over_budget": sessionv1.TurnOutcome_TURN_OUTCOME_OVER_BUDGET,
	"needs_input": sessionv1.TurnOutcome_TURN_OUTCOME_NEEDS_INPUT,
	"interrupted": sessionv1.TurnOutcome_TURN_OUTCOME_INTERRUPTED,
}

var eventKinds = map[string]sessionv1.EventKind{
	"message":       sessionv1.EventKind_EVENT_KIND_MESSAGE,
	"command":       sessionv1.EventKind_EVENT_KIND_COMMAND,
	"file_change":   sessionv1.EventKind_EVENT_KIND_FILE_CHANGE,
	"error":         sessionv1.EventKind_EVENT_KIND_ERROR,
	"usage":         sessionv1.EventKind_EVENT_KIND_USAGE,
	"tool_call":     sessionv1.EventKind_EVENT_KIND_TOOL_CALL,
	"state_change":  sessionv1.EventKind_EVENT_KIND_STATE_CHANGE,
	"question":      sessionv1.EventKind_EVENT_KIND_QUESTION,
	"checkpoint":    sessionv1.EventKind_EVENT_KIND_CHECKPOINT,
	"harness_drift": sessionv1.EventKind_EVENT_KIND_HARNESS_DRIFT,
	"steer":         sessionv1.EventKind_EVENT_KIND_STEER,
	"approval":      sessionv1.EventKind_EVENT_KIND_APPROVAL,
}

var holdKinds = map[sessionv1.HoldKind]string{
	sessionv1.HoldKind_HOLD_KIND_TURN:      "turn",
	sessionv1.HoldKind_HOLD_KIND_RUN_AGENT: "run_agent",
	sessionv1.HoldKind_HOLD_KIND_TERMINAL:  "terminal",
	sessionv1.HoldKind_HOLD_KIND_COMMAND:   "command",
	sessionv1.HoldKind_HOLD_KIND_JOB:       "job",
}

func holdKindEnum(kind string) sessionv1.HoldKind {
	for k, v := range holdKinds {
		if v == kind {
			return k
		}
	}
	return sessionv1.HoldKind_HOLD_KIND_UNSPECIFIED
}

// holdTTL is a hold's lifetime without renewal: 60 s unless asked, at most
// an hour.
func holdTTL(seconds int32) time.Duration {
	switch {
	case seconds <= 0:
		return time.Minute
	case seconds > 3600:
		return time.Hour
	}
	return time.Duration(seconds) * time.Second
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func sessionProto(s *store.Session) *sessionv1.Session {
	if s == nil {
		return nil
	}
	out := &sessionv1.Session{
		Name: s.Name, Environment: s.Environment, Repo: s.Repo, Harness: harnessEnum(s.Harness),
		Branch: s.Branch, State: stateEnum(s.State), StateReason: s.StateReason, StateChangedAt: ts(s.StateChangedAt),
		ParentId: s.ParentID, ForkedFromCheckpoint: s.ForkedFromCheckpoint, ConversationId: s.ConversationID,
		CreatedAt: ts(s.CreatedAt), LastActiveAt: ts(s.LastActiveAt), SandboxId: s.SandboxID,
		Budget:      &sessionv1.Budget{MaxCostUsd: s.Budget.MaxCostUSD, MaxTokens: s.Budget.MaxTokens, MaxMinutes: int32(s.Budget.MaxMinutes)},
		HarnessLock: s.HarnessLock, CacheTtl: s.CacheTTL, Model: s.Model,
		Approvals: approvalModeEnum(s.Approvals), BaseCommit: s.BaseCommit,
	}
	if s.IdleMinutes != nil {
		v := int32(*s.IdleMinutes)
		out.IdleMinutes = &v
	}
	if s.Question != nil {
		out.Question = &sessionv1.Question{Id: s.Question.ID, Text: s.Question.Text, Turn: int32(s.Question.Turn), AskedAt: ts(s.Question.AskedAt)}
	}
	return out
}

func usageProto(u store.Usage) *sessionv1.Usage {
	return &sessionv1.Usage{
		InputTokens: u.InputTokens, OutputTokens: u.OutputTokens,
		CacheReadTokens: u.CacheReadTokens, CacheWriteTokens: u.CacheWriteTokens,
		CostUsd: u.CostUSD, ModelCalls: int32(u.ModelCalls),
	}
}

func turnProto(t *store.Turn) *sessionv1.Turn {
	if t == nil {
		return nil
	}
	out := &sessionv1.Turn{
		Number: int32(t.Number), Message: t.Message, Harness: harnessEnum(t.Harness), Command: t.Command,
		Outcome: outcomes[t.Outcome], OutcomeReason: t.OutcomeReason, Summary: t.Summary, Result: t.Result,
		StructuredResult: structFromJSON(t.StructuredResultJSON), Usage: usageProto(t.Usage),
		CheckpointId: t.CheckpointID, StartedAt: ts(t.StartedAt), Warnings: t.Warnings,
		Inherited: t.Inherited, RunId: t.RunID,
		Budget: &sessionv1.Budget{MaxCostUsd: t.Budget.MaxCostUSD, MaxTokens: t.Budget.MaxTokens, MaxMinutes: int32(t.Budget.MaxMinutes)},
	}
	if t.EndedAt != nil {
		out.EndedAt = ts(*t.EndedAt)
	}
	for _, d := range t.Drift {
		out.Drift = append(out.Drift, &sessionv1.DriftItem{Field: d.Field, Locked: d.Locked, Actual: d.Actual})
	}
	return out
}

func eventProto(e store.Event) *sessionv1.Event {
	out := &sessionv1.Event{
		Seq: e.Seq, Turn: int32(e.Turn), Time: ts(e.Time), Kind: eventKinds[e.Kind],
		Text: e.Text, ExitCode: int32(e.ExitCode), Path: e.Path, Data: structFromJSON(e.DataJSON),
	}
	if e.Usage != nil {
		out.Usage = usageProto(*e.Usage)
	}
	return out
}

func artifactProto(a *store.Artifact) *sessionv1.Artifact {
	return &sessionv1.Artifact{Path: a.Path, SizeBytes: a.SizeBytes, Turn: int32(a.Turn), ContentType: a.ContentType, Sha256: a.SHA256}
}

func holdProto(h holds.Hold) *sessionv1.Hold {
	return &sessionv1.Hold{
		Id: h.ID, Owner: h.Owner, Kind: holdKindEnum(h.Kind), Description: h.Description,
		AcquiredAt: ts(h.AcquiredAt), ExpiresAt: ts(h.ExpiresAt),
	}
}
