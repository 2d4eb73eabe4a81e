package sessions

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// Job states.
const (
	JobPending   = store.JobPending
	JobRunning   = store.JobRunning
	JobDelivered = store.JobDelivered
	JobFailed    = store.JobFailed
)

// JobBestOfN is the strategy that forks a prepared session into attempts.
const JobBestOfN = "best_of_n"

// Job is a best-of-N job: a prepared session forked into N attempts, each
// scored by a check command run in its sandbox, the best delivered.
type Job = store.Job

// Attempt is one fork of a job and its check result.
type Attempt = store.Attempt

// ReasonJobInterrupted is the Error of a job whose process stopped while it
// was pending or running.
const ReasonJobInterrupted = "interrupted by a control-plane restart"

// jobWriteTimeout bounds a job record write made after the job's context
// ended (the process is stopping), so the record still says how it ended.
const jobWriteTimeout = 10 * time.Second

// Jobs runs jobs. Their records are in the store (they survive a restart);
// a job runs in the process that created it, and waiters in this process
// are woken through the Manager's broadcaster on every write.
//
// A job does not survive its process: one that was pending or running when
// the process stopped is failed with ReasonJobInterrupted, at start
// (FailInterrupted) rather than when next read, so a read never writes and
// a list never shows a job as running that nothing runs. This assumes one
// session-svc per database: replicas sharing a PostgreSQL database would
// fail each other's running jobs when one of them starts.
type Jobs struct {
	m *Manager
}

// NewJobs returns the job runner over m. Call FailInterrupted before
// serving.
func NewJobs(m *Manager) *Jobs { return &Jobs{m: m} }

// FailInterrupted fails the jobs an earlier process left pending or running
// (ReasonJobInterrupted). Call it once at start, before any job is created.
func (js *Jobs) FailInterrupted(ctx context.Context) error {
	ids, err := js.m.d.Store.FailUnfinishedJobs(ctx, ReasonJobInterrupted)
	if err != nil {
		return fmt.Errorf("fail interrupted jobs: %w", err)
	}
	for _, id := range ids {
		js.m.log.WarnContext(ctx, "job failed: interrupted by a restart", "job", id)
		js.m.events.publish(jobTopic(id))
	}
	return nil
}

// JobInput is what CreateJob asks for.
type JobInput struct {
	Strategy, Session, Message, Check string
	N                                 int
	Budget                            *store.Budget
}

// Create records a job and returns it pending; it runs in the background.
func (js *Jobs) Create(ctx context.Context, in JobInput) (*Job, error) {
	switch in.Strategy {
	case JobBestOfN:
	case "single":
		return nil, fault.Unimplemented("jobs with strategy single are not supported yet: use best_of_n")
	default:
		return nil, fault.InvalidArgument("strategy", "strategy must be best_of_n")
	}
	if err := ValidName("session", in.Session); err != nil {
		return nil, err
	}
	if strings.TrimSpace(in.Message) == "" {
		return nil, fault.InvalidArgument("message", "the message is empty")
	}
	if strings.TrimSpace(in.Check) == "" {
		return nil, fault.InvalidArgument("check", "best_of_n needs a check command to score the attempts")
	}
	max := js.m.cfg.ForkMax
	if max <= 0 {
		max = 8
	}
	if in.N < 1 || in.N > max {
		return nil, fault.InvalidArgument("n", "n must be between 1 and HANGAR_FORK_MAX (%d), got %d", max, in.N)
	}
	if _, err := js.m.get(ctx, in.Session); err != nil {
		return nil, err
	}
	job := &Job{
		ID: "job-" + shortID()[:8], Strategy: in.Strategy, State: JobPending, Session: in.Session,
		Message: in.Message, N: in.N, Check: in.Check, Budget: in.Budget, CreatedAt: js.m.now(),
	}
	if err := js.m.d.Store.CreateJob(ctx, job); err != nil {
		return nil, fmt.Errorf("record job: %w", err)
	}
	run := *job
	js.m.wg.Add(1)
	go func() {
		defer js.m.wg.Done()
		defer logging.Recover(js.m.background, js.m.log, "job")
		js.run(js.m.background, &run)
	}()
	return job, nil
}

// Get returns a job.
func (js *Jobs) Get(ctx context.Context, id string) (*Job, error) {
	j, err := js.m.d.Store.GetJob(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fault.NotFound("JOB_NOT_FOUND", "job %q does not exist", id)
	}
	if err != nil {
		return nil, fmt.Errorf("load job %s: %w", id, err)
	}
	return j, nil
}

// List returns a page of at most limit jobs (all when limit <= 0), newest
// first, and the token of the next page ("" on the last).
func (js *Jobs) List(ctx context.Context, limit int, pageToken string) ([]*Job, string, error) {
	out, next, err := js.m.d.Store.ListJobs(ctx, limit, pageToken)
	if errors.Is(err, store.ErrBadPageToken) {
		return nil, "", fault.InvalidArgument("page_token", "the page token is not one this service issued")
	}
	if err != nil {
		return nil, "", fmt.Errorf("list jobs: %w", err)
	}
	return out, next, nil
}

// Wait blocks until the job has ended or ctx ends.
func (js *Jobs) Wait(ctx context.Context, id string) (*Job, error) {
	for {
		j, err := js.Get(ctx, id)
		if err != nil || j.EndedAt != nil {
			return j, err
		}
		wake, stop := js.m.events.subscribe(jobTopic(id))
		if j, err = js.Get(ctx, id); err != nil || j.EndedAt != nil {
			stop()
			return j, err
		}
		select {
		case <-wake:
			stop()
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		}
	}
}

func jobTopic(id string) string { return "job/" + id }

// update writes a change to a running job and wakes its waiters. It writes
// even after ctx has ended (the process is stopping), within
// jobWriteTimeout; a write that fails leaves the job unfinished in the
// store, for FailInterrupted at the next start.
func (js *Jobs) update(ctx context.Context, id string, f func(j *Job)) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), jobWriteTimeout)
	defer cancel()
	_, err := js.m.d.Store.UpdateJob(wctx, id, func(j *Job) error {
		f(j)
		return nil
	})
	if err != nil {
		js.m.log.WarnContext(ctx, "job record not written", "job", id, "error", err)
		return
	}
	js.m.events.publish(jobTopic(id))
}

// run forks, waits for every attempt's turn, checks each and delivers the
// best.
func (js *Jobs) run(ctx context.Context, j *Job) {
	id := j.ID
	fail := func(msg string, err error) {
		if ctx.Err() != nil {
			// The process is stopping: whatever went wrong came from that.
			msg = ReasonJobInterrupted
		}
		js.m.log.WarnContext(ctx, "job failed", "job", id, "reason", msg, "error", err)
		js.update(ctx, id, func(j *Job) {
			j.State, j.Error = JobFailed, msg
			end := js.m.now()
			j.EndedAt = &end
		})
	}
	js.update(ctx, id, func(j *Job) { j.State = JobRunning })
	prefix := j.Session
	suffix := strings.TrimPrefix(j.ID, "job-")
	if len(prefix) > 63-len(suffix)-4 {
		prefix = strings.TrimRight(prefix[:63-len(suffix)-4], "-")
	}
	names := forkNames(prefix+"-"+suffix, j.N)
	fork, err := js.m.Fork(ctx, ForkInput{Parent: j.Session, N: j.N, Message: j.Message, Names: names, Budget: j.Budget})
	if err != nil {
		fail("the session could not be forked: "+publicMessage(err), err)
		return
	}
	attempts := make([]Attempt, len(fork.Sessions))
	var wg sync.WaitGroup
	for i, s := range fork.Sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer logging.Recover(ctx, js.m.log, "job attempt")
			attempts[i] = js.attempt(ctx, j.Check, s.Name, fork.Turns[i].Number)
		}()
	}
	wg.Wait()
	best := -1
	for i, a := range attempts {
		if a.Outcome != "completed" || a.CheckExitCode != 0 {
			continue
		}
		if best < 0 || scoreOf(a) > scoreOf(attempts[best]) {
			best = i
		}
	}
	js.update(ctx, id, func(j *Job) { j.Attempts = attempts })
	if best < 0 {
		fail("no attempt passed the check", nil)
		return
	}
	patch, _, _, err := js.m.Patch(ctx, attempts[best].Session)
	if err != nil {
		fail("the best attempt's patch could not be read", err)
		return
	}
	js.update(ctx, id, func(j *Job) {
		j.State, j.Winner, j.Patch, j.Branch = JobDelivered, attempts[best].Session, patch, attempts[best].Branch
		end := js.m.now()
		j.EndedAt = &end
	})
}

func scoreOf(a Attempt) float64 {
	if a.Score == nil {
		return 0
	}
	return *a.Score
}

// attempt waits for a fork's turn and runs the check in its sandbox.
func (js *Jobs) attempt(ctx context.Context, check, name string, turn int) Attempt {
	a := Attempt{Session: name, CheckExitCode: -1}
	t, err := js.m.WaitTurn(ctx, name, turn, nil)
	if err != nil {
		a.Outcome = "failed"
		return a
	}
	a.Outcome, a.Usage = t.Outcome, t.Usage
	s, err := js.m.get(ctx, name)
	if err != nil {
		return a
	}
	a.Branch = s.Branch
	if t.Outcome != "completed" || s.SandboxID == "" {
		return a
	}
	var out bytes.Buffer
	code, err := sandboxexec.New(js.m.d.Sandboxes).Exec(ctx, s.SandboxID, s.FencingToken, []string{"sh", "-c", check}, nil, "", nil, &out, &out)
	if err != nil {
		a.CheckOutput = "the check could not run: " + publicMessage(err)
		return a
	}
	a.CheckExitCode = code
	text := out.String()
	if len(text) > 4096 {
		text = text[len(text)-4096:]
	}
	a.CheckOutput = text
	a.Score = lastNumber(text)
	return a
}

var numberRE = regexp.MustCompile(`-?[0-9]+(\.[0-9]+)?`)

// lastNumber is the last number printed, the attempt's score.
func lastNumber(s string) *float64 {
	all := numberRE.FindAllString(s, -1)
	if len(all) == 0 {
		return nil
	}
	v, err := strconv.ParseFloat(all[len(all)-1], 64)
	if err != nil {
		return nil
	}
	return &v
}
