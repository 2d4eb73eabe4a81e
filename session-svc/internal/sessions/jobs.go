package sessions

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/session-svc/internal/holds"
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

// jobHoldTTL is how long a job's holds outlive their last renewal: long
// enough that a job's sessions stay held across a control-plane restart
// until the job is picked up again, short enough that a job nobody picks
// up stops pinning its sessions.
const jobHoldTTL = 15 * time.Minute

// maxResends bounds how often an attempt's turn is sent again because the
// control plane stopped while it ran.
const maxResends = 2

// jobWriteTimeout bounds a job record write made after the job's context
// ended (the process is stopping), so the record still says how it ended.
const jobWriteTimeout = 10 * time.Second

// errJobClaimLost is the cause a job is stopped with when another runner
// holds its claim.
var errJobClaimLost = errors.New("another runner claimed the job")

// Jobs runs jobs. Their records are in the store and say which step each
// reached, so a job outlives its process:
//
//   - Steps. A job records its attempts' session names (derived from the
//     job id) before it forks; each attempt is marked Checked once its
//     turn has ended and, if it completed, its check has run. A job
//     picked up again forks only the attempts whose session does not
//     exist, sends the message to an attempt whose session has no turn of
//     its own, waits for the newest own turn of the others, and checks
//     only the unchecked.
//   - Restarts. An attempt whose turn ended interrupted because the
//     control plane stopped (a drain, or recovery after a crash) is sent
//     the job's message again, at most maxResends times: the turn resumes
//     the attempt's conversation from its last checkpoint. A turn
//     interrupted by a user, or one interrupted more often, counts as the
//     attempt failing.
//   - Stopping. A job whose process stops (Drain, Close) or loses its
//     claim records nothing: it stays running in the store and is picked
//     up at the next start, or by another replica's sweep.
//   - Holds. A job holds (KindJob, owner job/<id>) the prepared session
//     and each attempt through its check and the delivery, renewed with
//     the claim; a stopping job leaves them to lapse after jobHoldTTL, and
//     the job picked up again renews them.
//   - Replicas. A runner claims a job in Redis (JobClaims) before running
//     it, and renews the claim while it runs: two replicas do not run one
//     job at once (after a Redis restarted empty, for at most one renewal
//     period; see JobClaims).
//
// Waiters in this process are woken through the Manager's broadcaster on
// every write.
type Jobs struct {
	m *Manager
	// claims is nil when this is the only runner (tests).
	claims *JobClaims

	mu sync.Mutex
	// running are the jobs this process runs.
	running map[string]bool
}

// NewJobs returns the job runner over m. The Manager picks unfinished jobs
// up at start (after recovery) and in every sweep.
func NewJobs(m *Manager, claims *JobClaims) *Jobs {
	js := &Jobs{m: m, claims: claims, running: map[string]bool{}}
	m.mu.Lock()
	m.jobs = js
	m.mu.Unlock()
	return js
}

// Adopt picks up the unfinished jobs no runner holds: at start those an
// earlier process left, later those of a replica that stopped.
func (js *Jobs) Adopt(ctx context.Context) {
	if js.m.draining.Load() {
		return
	}
	jobs, err := js.m.d.Store.ListUnfinishedJobs(ctx)
	if err != nil {
		js.m.log.WarnContext(ctx, "unfinished jobs not listed", "error", err)
		return
	}
	for _, j := range jobs {
		if js.start(j) {
			js.m.log.InfoContext(ctx, "job picked up", "job", j.ID, "state", j.State)
		}
	}
}

// claimTTL is how long a claim outlives its runner's last renewal.
func (js *Jobs) claimTTL() time.Duration { return js.m.cfg.LeaseTTL }

// start claims j and runs it in the background; false when it runs
// already, here or elsewhere, or the process is stopping.
func (js *Jobs) start(j *Job) bool {
	if js.m.draining.Load() || js.m.background.Err() != nil {
		return false
	}
	js.mu.Lock()
	if js.running[j.ID] {
		js.mu.Unlock()
		return false
	}
	js.running[j.ID] = true
	js.mu.Unlock()
	done := func() {
		js.mu.Lock()
		delete(js.running, j.ID)
		js.mu.Unlock()
	}
	if js.claims != nil {
		ok, err := js.claims.Claim(js.m.background, j.ID, js.claimTTL())
		if err != nil || !ok {
			if err != nil {
				js.m.log.WarnContext(js.m.background, "job not claimed", "job", j.ID, "error", err)
			}
			done()
			return false
		}
	}
	ctx, cancel := context.WithCancelCause(js.m.background)
	r := &jobRun{js: js, id: j.ID, ctx: ctx, holds: map[string]string{}}
	js.m.wg.Add(1)
	go func() {
		defer js.m.wg.Done()
		defer done()
		defer cancel(nil)
		defer logging.Recover(ctx, js.m.log, "job")
		stop := r.keepAlive(cancel)
		defer stop()
		r.run(j)
	}()
	return true
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
	// Not started (another replica claimed it first, or Redis is down):
	// a sweep picks it up.
	js.start(&run)
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
		case <-js.m.peerPoll():
			stop()
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		}
	}
}

func jobTopic(id string) string { return "job/" + id }

// update writes a change to a job and wakes its waiters. It writes even
// after ctx has ended (the process is stopping), within jobWriteTimeout.
func (js *Jobs) update(ctx context.Context, id string, f func(j *Job)) (*Job, error) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), jobWriteTimeout)
	defer cancel()
	j, err := js.m.d.Store.UpdateJob(wctx, id, func(j *Job) error {
		f(j)
		return nil
	})
	if err != nil {
		js.m.log.WarnContext(ctx, "job record not written", "job", id, "error", err)
		return nil, err
	}
	js.m.events.publish(jobTopic(id))
	return j, nil
}

// jobRun is one run of a job in this process.
type jobRun struct {
	js  *Jobs
	id  string
	ctx context.Context

	mu sync.Mutex
	// holds are the job's holds, by session.
	holds map[string]string
}

// stopped says the run must end without recording an outcome: the process
// is stopping or another runner claimed the job.
func (r *jobRun) stopped() bool {
	return r.ctx.Err() != nil || r.js.m.draining.Load()
}

func (r *jobRun) owner() string { return "job/" + r.id }

// keepAlive renews the claim and the holds until the returned function is
// called; a lost claim stops the run.
func (r *jobRun) keepAlive(cancel context.CancelCauseFunc) func() {
	m := r.js.m
	// A lost claim cancels the run, whose context ends the heartbeat.
	return m.heartbeat(r.ctx, "job renewal", func(ctx context.Context) {
		if c := r.js.claims; c != nil {
			ok, err := c.Claim(ctx, r.id, r.js.claimTTL())
			switch {
			case err != nil && ctx.Err() == nil:
				m.log.WarnContext(ctx, "job claim not renewed", "job", r.id, "error", err)
			case err == nil && !ok:
				m.log.WarnContext(ctx, "job claimed by another runner: stopping here", "job", r.id)
				cancel(errJobClaimLost)
				return
			}
		}
		r.mu.Lock()
		held := maps.Clone(r.holds)
		r.mu.Unlock()
		for session, id := range held {
			if _, err := m.d.Holds.Renew(ctx, session, id, jobHoldTTL); errors.Is(err, holds.ErrNotFound) {
				// It lapsed (a Redis restarted empty): take it again.
				r.hold(ctx, session)
			} else if err != nil && ctx.Err() == nil {
				m.log.WarnContext(ctx, "job hold not renewed", "job", r.id, "session", session, "error", err)
			}
		}
	})
}

// hold holds session for the job: the job's hold from an earlier run when
// it is still live, else a new one.
func (r *jobRun) hold(ctx context.Context, session string) {
	m := r.js.m
	live, err := m.d.Holds.List(ctx, session)
	if err == nil {
		for _, h := range live {
			if h.Owner == r.owner() && h.Kind == holds.KindJob {
				if _, err := m.d.Holds.Renew(ctx, session, h.ID, jobHoldTTL); err == nil {
					r.mu.Lock()
					r.holds[session] = h.ID
					r.mu.Unlock()
					return
				}
			}
		}
	}
	h, err := m.d.Holds.Acquire(ctx, session, r.owner(), holds.KindJob, "job "+r.id, jobHoldTTL)
	if err != nil {
		m.log.WarnContext(ctx, "job hold not taken", "job", r.id, "session", session, "error", err)
		return
	}
	r.mu.Lock()
	r.holds[session] = h.ID
	r.mu.Unlock()
}

// release ends the job's holds and gives its claim up: the job has ended.
func (r *jobRun) release() {
	m := r.js.m
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), jobWriteTimeout)
	defer cancel()
	r.mu.Lock()
	held := maps.Clone(r.holds)
	r.holds = map[string]string{}
	r.mu.Unlock()
	for session, id := range held {
		if err := m.d.Holds.Release(ctx, session, id); err != nil {
			m.log.WarnContext(ctx, "job hold not released", "job", r.id, "session", session, "error", err)
		}
	}
	r.dropClaim()
}

// dropClaim gives the claim up (a drain: another replica may pick the job
// up at once).
func (r *jobRun) dropClaim() {
	if r.js.claims == nil || errors.Is(context.Cause(r.ctx), errJobClaimLost) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), jobWriteTimeout)
	defer cancel()
	if err := r.js.claims.Drop(ctx, r.id); err != nil {
		r.js.m.log.WarnContext(ctx, "job claim not dropped", "job", r.id, "error", err)
	}
}

// pause ends this run without an outcome; the job is picked up again.
func (r *jobRun) pause(step string, err error) {
	r.js.m.log.InfoContext(r.ctx, "job stopped; it is picked up again at the next start", "job", r.id, "step", step, "error", err)
	r.dropClaim()
}

// fail records the job failed, unless the run is stopping (then whatever
// went wrong came from that: it pauses).
func (r *jobRun) fail(msg string, err error) {
	if r.stopped() {
		r.pause("failing: "+msg, err)
		return
	}
	r.js.m.log.WarnContext(r.ctx, "job failed", "job", r.id, "reason", msg, "error", err)
	r.js.update(r.ctx, r.id, func(j *Job) {
		j.State, j.Error = JobFailed, msg
		end := r.js.m.now()
		j.EndedAt = &end
	})
	r.release()
}

// attemptNames are the sessions of a job's attempts.
func attemptNames(j *Job) []string {
	prefix := j.Session
	suffix := strings.TrimPrefix(j.ID, "job-")
	if len(prefix) > 63-len(suffix)-4 {
		prefix = strings.TrimRight(prefix[:63-len(suffix)-4], "-")
	}
	return forkNames(prefix+"-"+suffix, j.N)
}

// run takes the job from the step its record says it reached to its end:
// fork (the attempts not forked yet), wait for each attempt's turn, check
// it, deliver the best.
func (r *jobRun) run(j *Job) {
	m := r.js.m
	ctx := r.ctx
	if len(j.Attempts) == 0 || j.State == JobPending {
		names := attemptNames(j)
		var err error
		j, err = r.js.update(ctx, r.id, func(cur *Job) {
			cur.State = JobRunning
			if len(cur.Attempts) == 0 {
				for _, name := range names {
					cur.Attempts = append(cur.Attempts, Attempt{Session: name, CheckExitCode: -1})
				}
			}
		})
		if err != nil {
			r.pause("start", err)
			return
		}
	}
	r.hold(ctx, j.Session)
	parent, err := m.get(ctx, j.Session)
	if err != nil {
		r.fail("the session could not be read: "+publicMessage(err), err)
		return
	}
	var missing, branches []string
	for i, a := range j.Attempts {
		if a.Checked {
			continue
		}
		r.hold(ctx, a.Session)
		_, err := m.d.Store.GetSession(ctx, a.Session)
		switch {
		case errors.Is(err, store.ErrNotFound):
			missing = append(missing, a.Session)
			branches = append(branches, fmt.Sprintf("%s-fork-%d", parent.Branch, i+1))
		case err != nil:
			r.fail("the attempts could not be read", err)
			return
		}
	}
	if len(missing) > 0 {
		if _, err := m.Fork(ctx, ForkInput{Parent: j.Session, Names: missing, Branches: branches, Message: j.Message, Budget: j.Budget}); err != nil {
			r.fail("the session could not be forked: "+publicMessage(err), err)
			return
		}
	}
	var wg sync.WaitGroup
	for i, a := range j.Attempts {
		if a.Checked {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer logging.Recover(ctx, m.log, "job attempt")
			r.attempt(j, i, a)
		}()
	}
	wg.Wait()
	if r.stopped() {
		r.pause("attempts", context.Cause(ctx))
		return
	}
	if j, err = r.js.Get(ctx, r.id); err != nil {
		r.fail("the job record could not be read", err)
		return
	}
	best := -1
	for i, a := range j.Attempts {
		if !a.Checked || a.Outcome != "completed" || a.CheckExitCode != 0 {
			continue
		}
		if best < 0 || scoreOf(a) > scoreOf(j.Attempts[best]) {
			best = i
		}
	}
	if best < 0 {
		r.fail("no attempt passed the check", nil)
		return
	}
	winner := j.Attempts[best]
	patch, _, _, err := m.Patch(ctx, winner.Session)
	if err != nil {
		r.fail("the best attempt's patch could not be read", err)
		return
	}
	if r.stopped() {
		r.pause("delivery", context.Cause(ctx))
		return
	}
	r.js.update(ctx, r.id, func(j *Job) {
		j.State, j.Winner, j.Patch, j.Branch = JobDelivered, winner.Session, patch, winner.Branch
		end := m.now()
		j.EndedAt = &end
	})
	r.release()
}

func scoreOf(a Attempt) float64 {
	if a.Score == nil {
		return 0
	}
	return *a.Score
}

// restartReason says a turn ended because the control plane stopped.
func restartReason(t *store.Turn) bool {
	return t.Outcome == store.OutcomeInterrupted && (t.OutcomeReason == reasonTurnShutdown || t.OutcomeReason == reasonTurnOrphaned)
}

// ownTurns are the session's turns that are not inherited from its parent.
func (r *jobRun) ownTurns(name string) ([]*store.Turn, error) {
	turns, err := r.js.m.d.Store.ListTurns(r.ctx, name)
	if err != nil {
		return nil, err
	}
	var own []*store.Turn
	for _, t := range turns {
		if !t.Inherited {
			own = append(own, t)
		}
	}
	return own, nil
}

// attempt takes attempt i (a) through its turn and its check and records
// it; a stopping run records nothing more.
func (r *jobRun) attempt(j *Job, i int, a Attempt) {
	m := r.js.m
	ctx := r.ctx
	done := func(a Attempt) {
		a.Checked = true
		if r.stopped() {
			return
		}
		r.js.update(ctx, r.id, func(cur *Job) {
			if i < len(cur.Attempts) {
				cur.Attempts[i] = a
			}
		})
	}
	name := a.Session
	var t *store.Turn
	for {
		own, err := r.ownTurns(name)
		if err != nil {
			if !r.stopped() {
				a.Outcome = "failed"
				done(a)
			}
			return
		}
		if len(own) == 0 {
			_, t, err = m.Send(ctx, name, TurnInput{Message: j.Message, Budget: j.Budget})
			if err != nil {
				if !r.stopped() {
					m.log.WarnContext(ctx, "job attempt not sent", "job", r.id, "session", name, "error", err)
					a.Outcome = "failed"
					done(a)
				}
				return
			}
		} else {
			t = own[len(own)-1]
		}
		if t, err = m.WaitTurn(ctx, name, t.Number, nil); err != nil {
			if !r.stopped() {
				a.Outcome = "failed"
				done(a)
			}
			return
		}
		if !restartReason(t) {
			break
		}
		if r.stopped() {
			return
		}
		if a.Resends >= maxResends {
			break
		}
		// The control plane stopped during the turn: send it again (the
		// turn resumes the attempt's conversation from its checkpoint).
		a.Resends++
		r.js.update(ctx, r.id, func(cur *Job) {
			if i < len(cur.Attempts) {
				cur.Attempts[i].Resends = a.Resends
			}
		})
		m.log.InfoContext(ctx, "job attempt sent again after a restart", "job", r.id, "session", name, "turn", t.Number)
		if _, _, err := m.Send(ctx, name, TurnInput{Message: j.Message, Budget: j.Budget}); err != nil {
			if !r.stopped() {
				a.Outcome = "failed"
				done(a)
			}
			return
		}
	}
	a.Outcome, a.Usage = t.Outcome, store.Usage{}
	if own, err := r.ownTurns(name); err == nil {
		for _, ot := range own {
			a.Usage = addUsage(a.Usage, ot.Usage)
		}
	}
	s, err := m.get(ctx, name)
	if err != nil {
		done(a)
		return
	}
	a.Branch = s.Branch
	if t.Outcome != "completed" {
		done(a)
		return
	}
	if s.SandboxID == "" {
		// Suspended since its turn (a restart): open it for the check.
		if s, err = m.Open(ctx, name); err != nil {
			if !r.stopped() {
				a.CheckOutput = "the attempt could not be opened for the check: " + publicMessage(err)
				done(a)
			}
			return
		}
	}
	var out bytes.Buffer
	code, err := sandboxexec.New(m.d.Sandboxes).Exec(ctx, s.SandboxID, s.FencingToken, []string{"sh", "-c", j.Check}, nil, "", nil, &out, &out)
	if err != nil {
		if !r.stopped() {
			a.CheckOutput = "the check could not run: " + publicMessage(err)
			done(a)
		}
		return
	}
	a.CheckExitCode = code
	text := out.String()
	if len(text) > 4096 {
		text = text[len(text)-4096:]
	}
	a.CheckOutput = text
	a.Score = lastNumber(text)
	done(a)
}

// addUsage is the sum of two usages.
func addUsage(a, b store.Usage) store.Usage {
	a.InputTokens += b.InputTokens
	a.OutputTokens += b.OutputTokens
	a.CacheReadTokens += b.CacheReadTokens
	a.CacheWriteTokens += b.CacheWriteTokens
	a.CostUSD += b.CostUSD
	a.ModelCalls += b.ModelCalls
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
