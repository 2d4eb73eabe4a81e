package server

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/sessions"
)

// NewJobs returns the job service over a job runner.
func NewJobs(j *sessions.Jobs) *Jobs { return &Jobs{jobs: j} }

var jobStrategies = map[sessionv1.JobStrategy]string{
	sessionv1.JobStrategy_JOB_STRATEGY_SINGLE:    "single",
	sessionv1.JobStrategy_JOB_STRATEGY_BEST_OF_N: sessions.JobBestOfN,
}

var jobStates = map[string]sessionv1.JobState{
	sessions.JobPending:   sessionv1.JobState_JOB_STATE_PENDING,
	sessions.JobRunning:   sessionv1.JobState_JOB_STATE_RUNNING,
	sessions.JobDelivered: sessionv1.JobState_JOB_STATE_DELIVERED,
	sessions.JobFailed:    sessionv1.JobState_JOB_STATE_FAILED,
}

// CreateJob starts a job.
func (s *Jobs) CreateJob(ctx context.Context, req *sessionv1.CreateJobRequest) (*sessionv1.CreateJobResponse, error) {
	if s.jobs == nil {
		return nil, fault.Unimplemented("jobs are not available")
	}
	in := sessions.JobInput{
		Strategy: jobStrategies[req.GetStrategy()], Session: req.GetSession(), Message: req.GetMessage(),
		Check: req.GetCheck(), N: int(req.GetN()),
	}
	if req.GetBudget() != nil {
		b := budgetFrom(req.GetBudget())
		in.Budget = &b
	}
	j, err := s.jobs.Create(ctx, in)
	if err != nil {
		return nil, err
	}
	return &sessionv1.CreateJobResponse{Job: jobProto(j)}, nil
}

// GetJob returns a job.
func (s *Jobs) GetJob(ctx context.Context, req *sessionv1.GetJobRequest) (*sessionv1.GetJobResponse, error) {
	if s.jobs == nil {
		return nil, fault.Unimplemented("jobs are not available")
	}
	j, err := s.jobs.Get(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return &sessionv1.GetJobResponse{Job: jobProto(j)}, nil
}

// ListJobs lists jobs, newest first.
func (s *Jobs) ListJobs(ctx context.Context, req *sessionv1.ListJobsRequest) (*sessionv1.ListJobsResponse, error) {
	if s.jobs == nil {
		return nil, fault.Unimplemented("jobs are not available")
	}
	size := int(req.GetPageSize())
	if size <= 0 || size > 100 {
		size = 50
	}
	page, next, err := s.jobs.List(ctx, size, req.GetPageToken())
	if err != nil {
		return nil, err
	}
	out := &sessionv1.ListJobsResponse{NextPageToken: next}
	for _, j := range page {
		out.Jobs = append(out.Jobs, jobProto(j))
	}
	return out, nil
}

func jobProto(j *sessions.Job) *sessionv1.Job {
	out := &sessionv1.Job{
		Id: j.ID, State: jobStates[j.State], Session: j.Session, Message: j.Message, N: int32(j.N),
		Check: j.Check, Winner: j.Winner, Patch: j.Patch, Branch: j.Branch,
		CreatedAt: timestamppb.New(j.CreatedAt), Error: j.Error,
	}
	for k, v := range jobStrategies {
		if v == j.Strategy {
			out.Strategy = k
		}
	}
	if j.EndedAt != nil {
		out.EndedAt = timestamppb.New(*j.EndedAt)
	}
	for _, a := range j.Attempts {
		out.Attempts = append(out.Attempts, &sessionv1.Attempt{
			Session: a.Session, Branch: a.Branch, Outcome: outcomes[a.Outcome],
			CheckExitCode: int32(a.CheckExitCode), Score: a.Score, CheckOutput: a.CheckOutput, Usage: usageProto(a.Usage),
		})
	}
	return out
}
