// Package server implements hangar.session.v1 over the session lifecycle:
// it checks requests, calls sessions.Manager and turns records into the
// contract's messages.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/platform/redisconn"
	"github.com/hangar-dev/hangar/session-svc/internal/harness"
	"github.com/hangar-dev/hangar/session-svc/internal/holds"
	"github.com/hangar-dev/hangar/session-svc/internal/sessions"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// Sessions serves hangar.session.v1.SessionService.
type Sessions struct {
	sessionv1.UnimplementedSessionServiceServer
	m     *sessions.Manager
	store *store.Store
	holds *holds.Holds
}

// New returns the service over a lifecycle manager.
func New(m *sessions.Manager, st *store.Store, h *holds.Holds) *Sessions {
	return &Sessions{m: m, store: st, holds: h}
}

// Jobs serves hangar.session.v1.JobService (jobs.go).
type Jobs struct {
	sessionv1.UnimplementedJobServiceServer
	jobs *sessions.Jobs
}

var harnessNames = map[sessionv1.Harness]string{
	sessionv1.Harness_HARNESS_CLAUDE:      string(harness.Claude),
	sessionv1.Harness_HARNESS_CODEX:       string(harness.Codex),
	sessionv1.Harness_HARNESS_PI:          string(harness.Pi),
	sessionv1.Harness_HARNESS_ANTIGRAVITY: string(harness.Antigravity),
}

func harnessName(h sessionv1.Harness) string { return harnessNames[h] }

func harnessEnum(name string) sessionv1.Harness {
	for k, v := range harnessNames {
		if v == name {
			return k
		}
	}
	return sessionv1.Harness_HARNESS_UNSPECIFIED
}

func budgetFrom(b *sessionv1.Budget) store.Budget {
	return store.Budget{MaxCostUSD: b.GetMaxCostUsd(), MaxTokens: b.GetMaxTokens(), MaxMinutes: int(b.GetMaxMinutes())}
}

func attachmentsFrom(in []*sessionv1.Attachment) []sessions.Attachment {
	out := make([]sessions.Attachment, 0, len(in))
	for _, a := range in {
		out = append(out, sessions.Attachment{Name: a.GetName(), File: a.GetFile(), Text: a.GetText()})
	}
	return out
}

// CreateSession implements session new.
func (s *Sessions) CreateSession(ctx context.Context, req *sessionv1.CreateSessionRequest) (*sessionv1.CreateSessionResponse, error) {
	n := sessions.NewSession{
		Name: req.GetName(), Environment: req.GetEnvironment(), Repo: req.GetRepo(), WorkingRepository: req.GetWorkingRepository(),
		Harness: harnessName(req.GetHarness()), Branch: req.GetBranch(),
		Model: req.GetModel(), CacheTTL: req.GetCacheTtl(), HarnessLock: req.GetHarnessLock(),
		Budget: budgetFrom(req.GetBudget()),
		Turn: sessions.TurnInput{
			Message: req.GetMessage(), Attachments: attachmentsFrom(req.GetAttachments()), OutputSchema: req.GetOutputSchemaJson(),
		},
		FromLocal:  localWorkFrom(req.GetFromLocal()),
		BaseCommit: req.GetBaseCommit(),
	}
	if req.GetApprovals() == sessionv1.ApprovalMode_APPROVAL_MODE_ASK {
		n.Approvals = sessions.ApprovalsAsk
	}
	if req.IdleMinutes != nil {
		v := int(req.GetIdleMinutes())
		n.IdleMinutes = &v
	}
	sess, turn, err := s.m.Create(ctx, n)
	if err != nil {
		return nil, err
	}
	out, err := s.session(ctx, sess, false)
	if err != nil {
		return nil, err
	}
	repo, err := s.m.Repository(ctx, sess)
	if err != nil {
		return nil, err
	}
	return &sessionv1.CreateSessionResponse{Session: out, Turn: turnProto(turn), Repository: repo, BaseCommit: sess.BaseCommit}, nil
}

// ListSessions implements session list: most recently active first.
func (s *Sessions) ListSessions(ctx context.Context, req *sessionv1.ListSessionsRequest) (*sessionv1.ListSessionsResponse, error) {
	if req.GetPageSize() < 0 {
		return nil, fault.InvalidArgument("page_size", "page_size must not be negative")
	}
	var states []string
	for _, st := range req.GetStates() {
		states = append(states, stateName(st))
	}
	list, next, err := s.store.ListSessions(ctx, store.ListOptions{States: states, ParentID: req.GetParentId(), Limit: int(req.GetPageSize()), PageToken: req.GetPageToken()})
	if errors.Is(err, store.ErrBadPageToken) {
		return nil, fault.InvalidArgument("page_token", "page_token is not one this service gave out")
	}
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	resp := &sessionv1.ListSessionsResponse{NextPageToken: next}
	for _, sess := range list {
		// session adds the usage of the session's own turns.
		out, err := s.session(ctx, sess, false)
		if err != nil {
			return nil, err
		}
		resp.Sessions = append(resp.Sessions, out)
	}
	return resp, nil
}

// GetSession implements session get: turns, checkpoints, holds,
// resume_command, usage, and when it will suspend.
func (s *Sessions) GetSession(ctx context.Context, req *sessionv1.GetSessionRequest) (*sessionv1.GetSessionResponse, error) {
	sess, err := s.m.Get(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	out, err := s.session(ctx, sess, true)
	if err != nil {
		return nil, err
	}
	return &sessionv1.GetSessionResponse{Session: out}, nil
}

// session is the full view of a session; detail adds turns, checkpoints,
// holds and transitions.
func (s *Sessions) session(ctx context.Context, sess *store.Session, detail bool) (*sessionv1.Session, error) {
	out := sessionProto(sess)
	if a, err := harness.Lookup(harness.Name(sess.Harness)); err == nil && sess.ConversationID != "" {
		out.ResumeCommand = a.ResumeCommand(sess.ConversationID)
	}
	turns, err := s.store.ListTurns(ctx, sess.Name)
	if err != nil {
		return nil, fmt.Errorf("turns of %s: %w", sess.Name, err)
	}
	var total sessionv1.Usage
	for _, t := range turns {
		if !t.Inherited {
			addUsage(&total, t.Usage)
		}
		if detail {
			out.Turns = append(out.Turns, turnProto(t))
		}
	}
	out.Usage = &total
	out.TurnCount = int32(len(turns))
	if !detail {
		return out, nil
	}
	cps, err := s.m.SessionCheckpoints(ctx, sess)
	if err != nil {
		return nil, err
	}
	for _, c := range cps {
		sc := &sessionv1.SessionCheckpoint{
			Id: c.GetId(), CreatedAt: c.GetCreatedAt(), Reason: checkpointReasonName(c.GetReason().String()),
			Turn: c.GetTurn(), SizeBytes: c.GetSizeBytes(), Damaged: c.GetDamaged(),
		}
		for _, w := range c.GetWarnings() {
			sc.Warnings = append(sc.Warnings, w.GetMessage())
		}
		out.Checkpoints = append(out.Checkpoints, sc)
	}
	for _, h := range s.m.Holds(ctx, sess) {
		out.Holds = append(out.Holds, holdProto(h))
	}
	if at, err := s.m.SuspendAt(ctx, sess); err == nil && !at.IsZero() {
		out.SuspendAt = timestamppb.New(at)
	}
	transitions, err := s.store.ListTransitions(ctx, sess.Name, 20)
	if err != nil {
		return nil, fmt.Errorf("transitions of %s: %w", sess.Name, err)
	}
	for _, tr := range transitions {
		out.Transitions = append(out.Transitions, &sessionv1.StateTransition{
			From: stateEnum(tr.From), To: stateEnum(tr.To), Reason: tr.Reason, At: timestamppb.New(tr.At),
		})
	}
	return out, nil
}

// SendMessage implements session send.
func (s *Sessions) SendMessage(ctx context.Context, req *sessionv1.SendMessageRequest) (*sessionv1.SendMessageResponse, error) {
	in := sessions.TurnInput{
		Message: req.GetMessage(), Attachments: attachmentsFrom(req.GetAttachments()), Harness: harnessName(req.GetHarness()),
		OutputSchema: req.GetOutputSchemaJson(),
	}
	if req.GetBudget() != nil {
		b := budgetFrom(req.GetBudget())
		in.Budget = &b
	}
	sess, turn, err := s.m.Send(ctx, req.GetName(), in)
	if err != nil {
		return nil, err
	}
	return &sessionv1.SendMessageResponse{Session: sessionProto(sess), Turn: turnProto(turn)}, nil
}

// GetTurn returns one turn.
func (s *Sessions) GetTurn(ctx context.Context, req *sessionv1.GetTurnRequest) (*sessionv1.GetTurnResponse, error) {
	if _, err := s.m.Get(ctx, req.GetName()); err != nil {
		return nil, err
	}
	t, err := s.store.GetTurn(ctx, req.GetName(), int(req.GetTurn()))
	if errors.Is(err, store.ErrNotFound) {
		return nil, fault.NotFound("TURN_NOT_FOUND", "session %q has no turn %d", req.GetName(), req.GetTurn())
	}
	if err != nil {
		return nil, fmt.Errorf("turn %d of %s: %w", req.GetTurn(), req.GetName(), err)
	}
	return &sessionv1.GetTurnResponse{Turn: turnProto(t)}, nil
}

// WaitForTurn streams a turn's progress, then its result.
func (s *Sessions) WaitForTurn(req *sessionv1.WaitForTurnRequest, stream sessionv1.SessionService_WaitForTurnServer) error {
	t, err := s.m.WaitTurn(stream.Context(), req.GetName(), int(req.GetTurn()), func(e store.Event) error {
		return stream.Send(&sessionv1.WaitForTurnResponse{Update: &sessionv1.WaitForTurnResponse_Progress{Progress: eventProto(e)}})
	})
	if err != nil {
		return err
	}
	out := turnProto(t)
	if arts, err := s.store.ListArtifacts(stream.Context(), req.GetName(), t.Number); err == nil {
		for _, a := range arts {
			out.Artifacts = append(out.Artifacts, artifactProto(a))
		}
	}
	return stream.Send(&sessionv1.WaitForTurnResponse{Update: &sessionv1.WaitForTurnResponse_Result{Result: out}})
}

// OpenSession boots and restores without running the agent.
func (s *Sessions) OpenSession(ctx context.Context, req *sessionv1.OpenSessionRequest) (*sessionv1.OpenSessionResponse, error) {
	sess, err := s.m.Open(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	out, err := s.session(ctx, sess, false)
	if err != nil {
		return nil, err
	}
	return &sessionv1.OpenSessionResponse{Session: out}, nil
}

// StartInteractive implements the preparation of resume_command in an
// attached terminal.
func (s *Sessions) StartInteractive(ctx context.Context, req *sessionv1.StartInteractiveRequest) (*sessionv1.StartInteractiveResponse, error) {
	in, err := s.m.StartInteractive(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	return &sessionv1.StartInteractiveResponse{SandboxId: in.SandboxID, Command: in.Command, Env: in.Env, Run: in.Run, PathPrepend: in.PathPrepend}, nil
}

// EndInteractive ends an interactive run.
func (s *Sessions) EndInteractive(ctx context.Context, req *sessionv1.EndInteractiveRequest) (*sessionv1.EndInteractiveResponse, error) {
	if err := s.m.EndInteractive(ctx, req.GetName(), req.GetRun()); err != nil {
		return nil, err
	}
	return &sessionv1.EndInteractiveResponse{}, nil
}

// KeepSession sets the idle time.
func (s *Sessions) KeepSession(ctx context.Context, req *sessionv1.KeepSessionRequest) (*sessionv1.KeepSessionResponse, error) {
	sess, err := s.m.Keep(ctx, req.GetName(), int(req.GetIdleMinutes()))
	if err != nil {
		return nil, err
	}
	return &sessionv1.KeepSessionResponse{Session: sessionProto(sess)}, nil
}

// SuspendSession checkpoints and releases the sandbox now.
func (s *Sessions) SuspendSession(ctx context.Context, req *sessionv1.SuspendSessionRequest) (*sessionv1.SuspendSessionResponse, error) {
	sess, err := s.m.Suspend(ctx, req.GetName(), "suspended by request")
	if err != nil {
		return nil, err
	}
	return &sessionv1.SuspendSessionResponse{Session: sessionProto(sess)}, nil
}

// ArchiveSession drops the checkpoints; the record stays.
func (s *Sessions) ArchiveSession(ctx context.Context, req *sessionv1.ArchiveSessionRequest) (*sessionv1.ArchiveSessionResponse, error) {
	sess, err := s.m.Archive(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	return &sessionv1.ArchiveSessionResponse{Session: sessionProto(sess)}, nil
}

// ListEvents implements session events.
func (s *Sessions) ListEvents(ctx context.Context, req *sessionv1.ListEventsRequest) (*sessionv1.ListEventsResponse, error) {
	if _, err := s.m.Get(ctx, req.GetName()); err != nil {
		return nil, err
	}
	if err := s.turnExists(ctx, req.GetName(), int(req.GetTurn())); err != nil {
		return nil, err
	}
	evs, err := s.store.ListEvents(ctx, req.GetName(), req.GetAfterSeq(), int(req.GetTurn()), int(req.GetPageSize()))
	if err != nil {
		return nil, fmt.Errorf("events of %s: %w", req.GetName(), err)
	}
	resp := &sessionv1.ListEventsResponse{}
	for _, e := range evs {
		resp.Events = append(resp.Events, eventProto(e))
	}
	return resp, nil
}

// turnExists refuses a turn filter (--turn N, N > 0) naming a turn the
// session does not have.
func (s *Sessions) turnExists(ctx context.Context, name string, turn int) error {
	if turn <= 0 {
		return nil
	}
	turns, err := s.store.ListTurns(ctx, name)
	if err != nil {
		return fmt.Errorf("turns of %s: %w", name, err)
	}
	for _, t := range turns {
		if t.Number == turn {
			return nil
		}
	}
	switch len(turns) {
	case 0:
		return fault.NotFound("TURN_NOT_FOUND", "session %q has no turn %d: it has not run a turn yet", name, turn)
	case 1:
		return fault.NotFound("TURN_NOT_FOUND", "session %q has no turn %d: it has 1 turn", name, turn)
	}
	return fault.NotFound("TURN_NOT_FOUND", "session %q has no turn %d: its turns are 1 to %d", name, turn, len(turns))
}

// StreamEvents implements session events --follow.
func (s *Sessions) StreamEvents(req *sessionv1.StreamEventsRequest, stream sessionv1.SessionService_StreamEventsServer) error {
	return s.m.FollowEvents(stream.Context(), req.GetName(), req.GetAfterSeq(), func(e store.Event) error {
		return stream.Send(&sessionv1.StreamEventsResponse{Event: eventProto(e)})
	})
}

// ListArtifacts implements session artifacts.
func (s *Sessions) ListArtifacts(ctx context.Context, req *sessionv1.ListArtifactsRequest) (*sessionv1.ListArtifactsResponse, error) {
	if _, err := s.m.Get(ctx, req.GetName()); err != nil {
		return nil, err
	}
	if err := s.turnExists(ctx, req.GetName(), int(req.GetTurn())); err != nil {
		return nil, err
	}
	arts, err := s.store.ListArtifacts(ctx, req.GetName(), int(req.GetTurn()))
	if err != nil {
		return nil, fmt.Errorf("artifacts of %s: %w", req.GetName(), err)
	}
	resp := &sessionv1.ListArtifactsResponse{}
	for _, a := range arts {
		resp.Artifacts = append(resp.Artifacts, artifactProto(a))
	}
	return resp, nil
}

// GetArtifact implements session artifacts --get.
func (s *Sessions) GetArtifact(ctx context.Context, req *sessionv1.GetArtifactRequest) (*sessionv1.GetArtifactResponse, error) {
	p := path.Clean(strings.TrimPrefix(req.GetPath(), "/"))
	if p == "." || strings.HasPrefix(p, "../") {
		return nil, fault.InvalidArgument("path", "artifact path %q is not a path inside the session", req.GetPath())
	}
	a, content, err := s.m.Artifact(ctx, req.GetName(), p, int(req.GetTurn()))
	if err != nil {
		return nil, err
	}
	return &sessionv1.GetArtifactResponse{Artifact: artifactProto(a), Content: content}, nil
}

// GetSessionPatch implements session patch.
func (s *Sessions) GetSessionPatch(ctx context.Context, req *sessionv1.GetSessionPatchRequest) (*sessionv1.GetSessionPatchResponse, error) {
	patch, base, cp, err := s.m.Patch(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	return &sessionv1.GetSessionPatchResponse{Patch: patch, BaseCommit: base, CheckpointId: cp}, nil
}

// SteerTurn implements session steer (and interrupt with interrupt set).
func (s *Sessions) SteerTurn(ctx context.Context, req *sessionv1.SteerTurnRequest) (*sessionv1.SteerTurnResponse, error) {
	if req.GetInterrupt() {
		sess, turn, err := s.m.Interrupt(ctx, req.GetName(), req.GetMessage())
		if err != nil {
			return nil, err
		}
		return &sessionv1.SteerTurnResponse{Session: sessionProto(sess), Turn: turnProto(turn)}, nil
	}
	if err := s.m.Steer(ctx, req.GetName(), req.GetMessage()); err != nil {
		return nil, err
	}
	sess, err := s.m.Get(ctx, req.GetName())
	if err != nil {
		return nil, err
	}
	return &sessionv1.SteerTurnResponse{Session: sessionProto(sess)}, nil
}

// InterruptTurn implements session interrupt.
func (s *Sessions) InterruptTurn(ctx context.Context, req *sessionv1.InterruptTurnRequest) (*sessionv1.InterruptTurnResponse, error) {
	sess, turn, err := s.m.Interrupt(ctx, req.GetName(), req.GetMessage())
	if err != nil {
		return nil, err
	}
	return &sessionv1.InterruptTurnResponse{Session: sessionProto(sess), Turn: turnProto(turn)}, nil
}

// AcquireHold keeps a session up while a command, terminal or job uses it.
func (s *Sessions) AcquireHold(ctx context.Context, req *sessionv1.AcquireHoldRequest) (*sessionv1.AcquireHoldResponse, error) {
	if _, err := s.m.Get(ctx, req.GetName()); err != nil {
		return nil, err
	}
	if req.GetOwner() == "" {
		return nil, fault.InvalidArgument("owner", "a hold needs an owner")
	}
	kind, ok := holdKinds[req.GetKind()]
	if !ok {
		return nil, fault.InvalidArgument("kind", "hold kind must be one of turn, run_agent, terminal, command, job")
	}
	h, err := s.holds.Acquire(ctx, req.GetName(), req.GetOwner(), kind, req.GetDescription(), holdTTL(req.GetTtlSeconds()))
	if err != nil {
		return nil, holdStoreErr(fmt.Errorf("hold on %s: %w", req.GetName(), err))
	}
	return &sessionv1.AcquireHoldResponse{Hold: holdProto(h)}, nil
}

// RenewHold extends a hold.
func (s *Sessions) RenewHold(ctx context.Context, req *sessionv1.RenewHoldRequest) (*sessionv1.RenewHoldResponse, error) {
	h, err := s.holds.Renew(ctx, req.GetName(), req.GetHoldId(), holdTTL(req.GetTtlSeconds()))
	if errors.Is(err, holds.ErrNotFound) {
		return nil, fault.NotFound("HOLD_NOT_FOUND", "session %q has no live hold %q (released or expired)", req.GetName(), req.GetHoldId())
	}
	if err != nil {
		return nil, holdStoreErr(fmt.Errorf("renew hold %s of %s: %w", req.GetHoldId(), req.GetName(), err))
	}
	return &sessionv1.RenewHoldResponse{Hold: holdProto(h)}, nil
}

// ReleaseHold ends a hold.
func (s *Sessions) ReleaseHold(ctx context.Context, req *sessionv1.ReleaseHoldRequest) (*sessionv1.ReleaseHoldResponse, error) {
	if err := s.holds.Release(ctx, req.GetName(), req.GetHoldId()); err != nil {
		return nil, holdStoreErr(fmt.Errorf("release hold %s of %s: %w", req.GetHoldId(), req.GetName(), err))
	}
	return &sessionv1.ReleaseHoldResponse{ReleasedAt: timestamppb.Now()}, nil
}

func checkpointReasonName(enum string) string {
	return strings.ToLower(strings.TrimPrefix(enum, "CHECKPOINT_REASON_"))
}

func addUsage(total *sessionv1.Usage, u store.Usage) {
	total.InputTokens += u.InputTokens
	total.OutputTokens += u.OutputTokens
	total.CacheReadTokens += u.CacheReadTokens
	total.CacheWriteTokens += u.CacheWriteTokens
	total.CostUsd += u.CostUSD
	total.ModelCalls += int32(u.ModelCalls)
}

func structFromJSON(s string) *structpb.Struct {
	if s == "" {
		return nil
	}
	var m map[string]any
	if json.Unmarshal([]byte(s), &m) != nil {
		return nil
	}
	st, err := structpb.NewStruct(m)
	if err != nil {
		return nil
	}
	return st
}

// holdStoreErr says "unavailable, try again" when the hold store (Redis)
// cannot be reached; any other failure stays an internal error.
func holdStoreErr(err error) error {
	if redisconn.Unreachable(err) {
		return fault.Wrap(fault.KindUnavailable, "HOLD_STORE_UNAVAILABLE", "the hold store is unavailable; try again", err)
	}
	return err
}
