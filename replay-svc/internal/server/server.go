// Package server implements hangar.replay.v1: fork at a step.
package server

import (
	"context"
	"errors"
	"strconv"

	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/replay-svc/internal/forks"
	"github.com/hangar-dev/hangar/replay-svc/internal/store"
)

// Replays serves hangar.replay.v1.ReplayService.
type Replays struct {
	replayv1.UnimplementedReplayServiceServer
	forks *forks.Manager
	store forks.Store
}

// New serves m's forks, read from st.
func New(m *forks.Manager, st forks.Store) *Replays { return &Replays{forks: m, store: st} }

// ForkRun forks a recorded run at a step.
func (s *Replays) ForkRun(ctx context.Context, req *replayv1.ForkRunRequest) (*replayv1.ForkRunResponse, error) {
	in, err := s.forks.Validate(req)
	if err != nil {
		return nil, err
	}
	f, err := s.forks.Start(ctx, in)
	if err != nil {
		return nil, err
	}
	return &replayv1.ForkRunResponse{Fork: f.GetFork(), Status: f.GetStatus(), Divergence: f.GetDivergence(),
		TrialIds: f.GetTrialIds(), Trials: f.GetTrials(), Tainted: f.GetTainted()}, nil
}

// GetFork returns a fork and its trials.
func (s *Replays) GetFork(ctx context.Context, req *replayv1.GetForkRequest) (*replayv1.GetForkResponse, error) {
	if req.GetFork() == "" {
		return nil, fault.InvalidArgument("fork", "fork is required")
	}
	f, err := s.store.GetFork(ctx, req.GetFork())
	if errors.Is(err, store.ErrNotFound) {
		return nil, fault.NotFound("FORK_NOT_FOUND", "fork %q not found", req.GetFork())
	}
	if err != nil {
		return nil, err
	}
	return &replayv1.GetForkResponse{Fork: f}, nil
}

const defaultPageSize, maxPageSize = 50, 500

// ListForks lists forks, newest first, optionally of one run.
func (s *Replays) ListForks(ctx context.Context, req *replayv1.ListForksRequest) (*replayv1.ListForksResponse, error) {
	size := int(req.GetPageSize())
	if size < 0 {
		return nil, fault.InvalidArgument("page_size", "page_size must not be negative")
	}
	if size == 0 || size > maxPageSize {
		size = defaultPageSize
	}
	offset := 0
	if t := req.GetPageToken(); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 0 {
			return nil, fault.InvalidArgument("page_token", "page_token %q is not one this service gave", t)
		}
		offset = n
	}
	fs, err := s.store.ListForks(ctx, req.GetRun(), nil, offset, size+1)
	if err != nil {
		return nil, err
	}
	resp := &replayv1.ListForksResponse{Forks: fs}
	if len(fs) > size {
		resp.Forks = fs[:size]
		resp.NextPageToken = strconv.Itoa(offset + size)
	}
	return resp, nil
}

// ListTrials lists trials of a fork or of forks of a run.
func (s *Replays) ListTrials(ctx context.Context, req *replayv1.ListTrialsRequest) (*replayv1.ListTrialsResponse, error) {
	ts, err := s.store.ListTrials(ctx, req.GetFork(), req.GetForkOf())
	if err != nil {
		return nil, err
	}
	return &replayv1.ListTrialsResponse{Trials: ts}, nil
}

// GetTrial returns one trial.
func (s *Replays) GetTrial(ctx context.Context, req *replayv1.GetTrialRequest) (*replayv1.GetTrialResponse, error) {
	if req.GetTrial() == "" {
		return nil, fault.InvalidArgument("trial", "trial is required")
	}
	t, err := s.store.GetTrial(ctx, req.GetTrial())
	if errors.Is(err, store.ErrNotFound) {
		return nil, fault.NotFound("TRIAL_NOT_FOUND", "trial %q not found", req.GetTrial())
	}
	if err != nil {
		return nil, err
	}
	return &replayv1.GetTrialResponse{Trial: t}, nil
}
