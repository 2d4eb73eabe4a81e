package sessions

import (
	"context"
	"errors"
	"fmt"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// ApprovalsAsk is --approvals ask: the session's runs hold every tool call
// until a person allows or denies it (the gateway holds the model's
// answer).
const ApprovalsAsk = "ask"

// Approval is a tool call a turn's run holds or held. Its id is the
// gateway's tool call id.
type Approval struct {
	ID, ToolName, InputJSON string
	Turn                    int
	// State is pending, allowed or denied.
	State       string
	RequestedAt time.Time
}

var approvalStates = map[gatewayv1.ToolCallState]string{
	gatewayv1.ToolCallState_TOOL_CALL_STATE_PENDING: "pending",
	gatewayv1.ToolCallState_TOOL_CALL_STATE_ALLOWED: "allowed",
	gatewayv1.ToolCallState_TOOL_CALL_STATE_DENIED:  "denied",
}

// approvalRun is the gateway run whose tool calls the session's approvals
// are: the running turn's, else (when ended is true) the newest turn's.
func (m *Manager) approvalRun(ctx context.Context, name string, ended bool) (runID string, turn int, err error) {
	if _, err := m.Get(ctx, name); err != nil {
		return "", 0, err
	}
	m.mu.Lock()
	if at := m.turns[name]; at != nil && at.runID != "" {
		runID, turn = at.runID, at.number
	}
	m.mu.Unlock()
	if runID != "" {
		return runID, turn, nil
	}
	// A turn run by another replica, or one that has ended.
	t, err := m.turn(ctx, name, 0)
	if err != nil {
		if fe := (*fault.Error)(nil); errors.As(err, &fe) && fe.Kind == fault.KindNotFound {
			return "", 0, nil
		}
		return "", 0, err
	}
	if t.RunID == "" || (t.EndedAt != nil && !ended) {
		return "", 0, nil
	}
	return t.RunID, t.Number, nil
}

// Approvals lists the tool calls the session's running turn waits on;
// all adds the answered ones (and, with no turn running, the newest
// turn's).
func (m *Manager) Approvals(ctx context.Context, name string, all bool) ([]Approval, error) {
	runID, turn, err := m.approvalRun(ctx, name, all)
	if err != nil || runID == "" {
		return nil, err
	}
	resp, err := m.d.Gateway.ListToolCalls(ctx, &gatewayv1.ListToolCallsRequest{Run: runID})
	if fault.ReasonOf(err) == "RUN_NOT_FOUND" {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("tool calls of run %s: %w", runID, err)
	}
	var out []Approval
	for _, c := range resp.GetToolCalls() {
		a := approvalOf(c, turn)
		if !all && a.State != "pending" {
			continue
		}
		out = append(out, a)
	}
	return out, nil
}

// AnswerApproval allows or denies a tool call the running turn waits on.
func (m *Manager) AnswerApproval(ctx context.Context, name, id string, allow bool) (Approval, error) {
	if id == "" {
		return Approval{}, fault.InvalidArgument("approval_id", "give the approval's id (hangar session approvals NAME lists them)")
	}
	runID, turn, err := m.approvalRun(ctx, name, false)
	if err != nil {
		return Approval{}, err
	}
	if runID == "" {
		return Approval{}, fault.FailedPrecondition("NO_TURN_RUNNING", "session %q has no running turn waiting on approval %q", name, id)
	}
	resp, err := m.d.Gateway.AnswerToolCall(ctx, &gatewayv1.AnswerToolCallRequest{Run: runID, ToolCallId: id, Allow: allow})
	switch {
	case err == nil:
	case fault.ReasonOf(err) == "TOOL_CALL_NOT_FOUND", fault.ReasonOf(err) == "RUN_NOT_FOUND":
		return Approval{}, fault.NotFound("APPROVAL_NOT_FOUND", "session %q's running turn waits on no approval %q", name, id)
	case fault.ReasonOf(err) == "TOOL_CALL_ANSWERED":
		return Approval{}, fault.FailedPrecondition("APPROVAL_ANSWERED", "approval %q was already answered the other way", id)
	default:
		return Approval{}, fmt.Errorf("answer tool call %s of run %s: %w", id, runID, err)
	}
	verb := "denied"
	if allow {
		verb = "allowed"
	}
	a := approvalOf(resp.GetToolCall(), turn)
	m.appendStoreEvents(ctx, name, []store.Event{{Turn: turn, Kind: "approval", Text: fmt.Sprintf("%s %s (%s)", verb, a.ToolName, id)}})
	return a, nil
}

func approvalOf(c *gatewayv1.ToolCall, turn int) Approval {
	a := Approval{ID: c.GetId(), ToolName: c.GetToolName(), InputJSON: c.GetInputJson(), Turn: turn, State: approvalStates[c.GetState()]}
	if c.GetRequestedAt() != nil {
		a.RequestedAt = c.GetRequestedAt().AsTime()
	}
	return a
}
