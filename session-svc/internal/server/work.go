package server

import (
	"context"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/session-svc/internal/sessions"
)

// GetSessionWork implements session pull: the session branch's commits as a
// git bundle (or, from a checkpoint, a chain of them, for a caller that
// accepts one) and its uncommitted changes as a binary diff.
func (s *Sessions) GetSessionWork(ctx context.Context, req *sessionv1.GetSessionWorkRequest) (*sessionv1.GetSessionWorkResponse, error) {
	w, err := s.m.Work(ctx, req.GetName(), req.GetAcceptBundleChain())
	if err != nil {
		return nil, err
	}
	resp := &sessionv1.GetSessionWorkResponse{
		Branch: w.Branch, BaseCommit: w.BaseCommit, HeadCommit: w.HeadCommit, Diff: w.Diff,
	}
	switch len(w.Bundles) {
	case 0:
	case 1:
		resp.GitBundle = w.Bundles[0]
	default:
		resp.GitBundles = w.Bundles
	}
	return resp, nil
}

// localWorkFrom is --from-local's payload, nil when absent.
func localWorkFrom(lw *sessionv1.LocalWork) *sessions.LocalWork {
	if lw == nil {
		return nil
	}
	return &sessions.LocalWork{
		BaseCommit: lw.GetBaseCommit(), Branch: lw.GetBranch(),
		Bundle: lw.GetGitBundle(), Diff: lw.GetDiff(), Untracked: lw.GetUntrackedTar(),
	}
}
