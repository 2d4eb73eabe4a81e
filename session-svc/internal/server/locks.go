package server

import (
	"context"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/harnesslock"
)

// ListHarnessLocks implements harness lock list: the newest revision of
// every lock.
func (s *Sessions) ListHarnessLocks(ctx context.Context, _ *sessionv1.ListHarnessLocksRequest) (*sessionv1.ListHarnessLocksResponse, error) {
	locks := s.m.HarnessLocks()
	if locks == nil {
		return nil, errNoHarnessRepo()
	}
	list, commit, err := locks.List(ctx)
	if err != nil {
		return nil, err
	}
	out := &sessionv1.ListHarnessLocksResponse{Commit: commit}
	if src, ok := locks.(interface{ Source() string }); ok {
		out.Repository = src.Source()
	}
	for _, l := range list {
		out.Locks = append(out.Locks, harnessLockProto(l))
	}
	return out, nil
}

// GetHarnessLock implements harness lock get NAME[@rREV].
func (s *Sessions) GetHarnessLock(ctx context.Context, req *sessionv1.GetHarnessLockRequest) (*sessionv1.GetHarnessLockResponse, error) {
	if req.GetLock() == "" {
		return nil, fault.InvalidArgument("lock", "name a harness lock: NAME@rREVISION, e.g. team-default@r14")
	}
	if _, _, err := harnesslock.ParseRef(req.GetLock()); err != nil {
		return nil, fault.InvalidArgument("lock", "%s", err.Error())
	}
	locks := s.m.HarnessLocks()
	if locks == nil {
		return nil, errNoHarnessRepo()
	}
	l, err := locks.Get(ctx, req.GetLock())
	if err != nil {
		return nil, err
	}
	if env := req.GetCheckCliEnvironment(); env != "" {
		if err := s.m.CheckLockCLI(ctx, l, env); err != nil {
			return nil, err
		}
	}
	return &sessionv1.GetHarnessLockResponse{Lock: harnessLockProto(l)}, nil
}

func errNoHarnessRepo() error {
	return fault.FailedPrecondition("HARNESS_REPO_UNSET", "no harness locks here: set HANGAR_HARNESS_REPO to the git repository (path or URL) holding %s", harnesslock.FileName)
}

func harnessLockProto(l harnesslock.Lock) *sessionv1.HarnessLock {
	return &sessionv1.HarnessLock{
		Name: l.Name, Revision: int32(l.Revision), Ref: l.Ref(), Harness: harnessEnum(l.Harness), Model: l.Model,
		Approvals: approvalModeEnum(l.Approvals), CliVersion: l.CLIVersion, Commit: l.Commit,
		Environment: l.Environment,
	}
}
