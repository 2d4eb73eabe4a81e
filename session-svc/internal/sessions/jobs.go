package sessions

import (
	"bytes"
	"context"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// Job states.
const (
	JobPending   = "pending"
	JobRunning   = "running"
	JobDelivered = "delivered"
	JobFailed    = "failed"
)

// JobBestOfN is the strategy that forks a prepared session into attempts.
const JobBestOfN = "best_of_n"

// Job is a best-of-N job: a prepared session forked into N attempts, each
// scored by a check command run in its sandbox, the best delivered.
type Job struct {
	ID, Strategy, State   string
	Session, Message      string
	N                     int
	Check                 string
	Budget                *store.Budget
	Attempts              []Attempt
	Winner, Patch, Branch string
	CreatedAt             time.Time
	EndedAt               *time.Time
	Error                 string
}

// Attempt is one fork of a job and its check result.
type Attempt struct {
	Session, Branch, Outcome string
	CheckExitCode            int
	Score                    *float64
	CheckOutput              string
	Usage                    store.Usage
}

func (j *Job) clone() *Job {
	c := *j
	c.Attempts = slices.Clone(j.Attempts)
	return &c
}

// Jobs runs jobs. Their records are kept in memory: a restart of the
// service forgets them (the attempts are sessions and stay).
type Jobs struct {
	m    *Manager
	mu   sync.Mutex
	jobs map[string]*Job
	// order is creation order, for listing newest first.
	order []string
}

// NewJobs returns the job runner over m.
func NewJobs(m *Manager) *Jobs { return &Jobs{m: m, jobs: map[string]*Job{}} }

// JobInput is what CreateJob asks for.
type JobInput struct {
	Strategy, Session, Message, Check string
	N                                 int
	Budget                            *store.Budget
}

// Create starts a job and returns it pending; it runs in the background.
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
	js.mu.Lock()
	js.jobs[job.ID] = job
	js.order = append(js.order, job.ID)
	out := job.clone()
	js.mu.Unlock()
	js.m.wg.Add(1)
	go func() {
		defer js.m.wg.Done()
		js.run(js.m.background, job.ID)
	}()
	return out, nil
}

// Get returns a job.
func (js *Jobs) Get(id string) (*Job, error) {
	js.mu.Lock()
	defer js.mu.Unlock()
	j := js.jobs[id]
	if j == nil {
		return nil, fault.NotFound("JOB_NOT_FOUND", "job %q does not exist", id)
	}
	return j.clone(), nil
}

// List returns the jobs, newest first.
func (js *Jobs) List() []*Job {
	js.mu.Lock()
	defer js.mu.Unlock()
	out := make([]*Job, 0, len(js.order))
	for i := len(js.order) - 1; i >= 0; i-- {
		out = append(out, js.jobs[js.order[i]].clone())
	}
	return out
}

// Wait blocks until the job has ended or ctx ends.
func (js *Jobs) Wait(ctx context.Context, id string) (*Job, error) {
	for {
		j, err := js.Get(id)
		if err != nil || j.EndedAt != nil {
			return j, err
		}
		wake, stop := js.m.events.subscribe(jobTopic(id))
		if j, err = js.Get(id); err != nil || j.EndedAt != nil {
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

func (js *Jobs) update(id string, f func(j *Job)) {
	js.mu.Lock()
	f(js.jobs[id])
	js.mu.Unlock()
	js.m.events.publish(jobTopic(id))
}

// run forks, waits for every attempt's turn, checks each and delivers the
// best.
func (js *Jobs) run(ctx context.Context, id string) {
	j, _ := js.Get(id)
	fail := func(msg string, err error) {
		js.m.log.WarnContext(ctx, "job failed", "job", id, "reason", msg, "error", err)
		js.update(id, func(j *Job) {
			j.State, j.Error = JobFailed, msg
			end := js.m.now()
			j.EndedAt = &end
		})
	}
	js.update(id, func(j *Job) { j.State = JobRunning })
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
	js.update(id, func(j *Job) { j.Attempts = attempts })
	if best < 0 {
		fail("no attempt passed the check", nil)
		return
	}
	patch, _, _, err := js.m.Patch(ctx, attempts[best].Session)
	if err != nil {
		fail("the best attempt's patch could not be read", err)
		return
	}
	js.update(id, func(j *Job) {
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
