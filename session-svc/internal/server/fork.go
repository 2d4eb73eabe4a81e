package server

import (
	"context"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/session-svc/internal/sessions"
)

// ForkSession implements session fork / fork_session.
func (s *Sessions) ForkSession(ctx context.Context, req *sessionv1.ForkSessionRequest) (*sessionv1.ForkSessionResponse, error) {
	fork, err := s.m.Fork(ctx, sessions.ForkInput{
		Parent: req.GetName(), N: int(req.GetN()), Message: req.GetMessage(),
		Harness: harnessName(req.GetHarness()), Names: req.GetNames(), HarnessLock: req.GetHarnessLock(),
		// No message: just boot them (spec).
		Boot: req.GetMessage() == "",
	})
	if err != nil {
		return nil, err
	}
	out := &sessionv1.ForkSessionResponse{ForkedFromCheckpoint: fork.Checkpoint}
	for _, f := range fork.Sessions {
		p, err := s.session(ctx, f, false)
		if err != nil {
			return nil, err
		}
		out.Forks = append(out.Forks, p)
	}
	return out, nil
}
