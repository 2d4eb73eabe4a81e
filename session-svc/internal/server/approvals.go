package server

import (
	"context"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/session-svc/internal/sessions"
)

var approvalStates = map[string]sessionv1.ApprovalState{
	"pending": sessionv1.ApprovalState_APPROVAL_STATE_PENDING,
	"allowed": sessionv1.ApprovalState_APPROVAL_STATE_ALLOWED,
	"denied":  sessionv1.ApprovalState_APPROVAL_STATE_DENIED,
}

func approvalProto(a sessions.Approval) *sessionv1.Approval {
	return &sessionv1.Approval{
		Id: a.ID, Turn: int32(a.Turn), ToolName: a.ToolName, InputJson: a.InputJSON,
		State: approvalStates[a.State], RequestedAt: ts(a.RequestedAt),
	}
}

func approvalModeEnum(mode string) sessionv1.ApprovalMode {
	if mode == sessions.ApprovalsAsk {
		return sessionv1.ApprovalMode_APPROVAL_MODE_ASK
	}
	return sessionv1.ApprovalMode_APPROVAL_MODE_NEVER
}

// ListApprovals implements session approvals: the tool calls the running
// turn waits on (all: answered ones too).
func (s *Sessions) ListApprovals(ctx context.Context, req *sessionv1.ListApprovalsRequest) (*sessionv1.ListApprovalsResponse, error) {
	list, err := s.m.Approvals(ctx, req.GetName(), req.GetAll())
	if err != nil {
		return nil, err
	}
	resp := &sessionv1.ListApprovalsResponse{}
	for _, a := range list {
		resp.Approvals = append(resp.Approvals, approvalProto(a))
	}
	return resp, nil
}

// AnswerApproval implements session approvals --allow/--deny.
func (s *Sessions) AnswerApproval(ctx context.Context, req *sessionv1.AnswerApprovalRequest) (*sessionv1.AnswerApprovalResponse, error) {
	a, err := s.m.AnswerApproval(ctx, req.GetName(), req.GetApprovalId(), req.GetAllow())
	if err != nil {
		return nil, err
	}
	return &sessionv1.AnswerApprovalResponse{Approval: approvalProto(a)}, nil
}
