package e2e_test

// End-to-end forks and best-of-N: the real agent CLIs (Claude Code, Codex,
// pi) in real sandboxes, through the real gateway to the scripted upstream,
// with real checkpoints, all started by `hangar up`'s stack.

import (
	"context"
	"fmt"
	"github.com/hangar-dev/hangar/api/sandboxexec"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
	sessionapp "github.com/hangar-dev/hangar/session-svc/app"
)

// The parent's turn: a commit, an uncommitted edit, a staged file and an
// untracked one.
const forkFirstCmd = `printf 'one\n' > tracked.txt && git add tracked.txt && git commit -qm 'first commit' && printf 'edit\n' >> tracked.txt && printf 'staged\n' > staged.txt && git add staged.txt && printf 'new\n' > untracked.txt && echo first-done`

// A fork's turn writes its own session's name (the sandbox directory is
// named after the session; the work tree is its "work" folder), so each
// fork's answer differs.
const forkOwnCmd = `basename "$(dirname "$PWD")" > fork.txt && echo fork-done`

// forkScript answers each CLI with its own shell tool. The slow task waits
// until the file named by release exists.
// forkSlowCmd waits for release.flag in the work tree (the sandbox sees
// nothing of the test's files).
const forkSlowCmd = `while [ ! -e release.flag ]; do sleep 0.05; done; echo slow-done`

func forkScript() scripted.Script {
	slow := forkSlowCmd
	var rules []scripted.Rule
	rules = append(rules, scripted.Rule{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Done with the task."}})
	rules = append(rules, shellRules("first task", forkFirstCmd)...)
	rules = append(rules, shellRules("fork task", forkOwnCmd)...)
	rules = append(rules, shellRules("slow task", slow)...)
	return scripted.Script{Rules: rules, Default: &scripted.Answer{Text: "OK."}}
}

// releaseSlowTasks ends every slow task from now on: until stop or the
// test's end,
// release.flag is put in the work tree of every session running a turn (an
// isolated sandbox sees nothing of the test's own files, and a turn sent
// again after a restart starts its task later).
func releaseSlowTasks(t testing.TB, s *stack) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			// Only sessions running a turn: a sandbox being restored or
			// copied must not get a file its checkpoint lacks.
			if list, err := s.sessions.ListSessions(ctx, &sessionv1.ListSessionsRequest{States: []sessionv1.SessionState{sessionv1.SessionState_SESSION_STATE_RUNNING}, PageSize: 100}); err == nil {
				for _, sess := range list.GetSessions() {
					if sess.GetState() == sessionv1.SessionState_SESSION_STATE_RUNNING && sess.GetSandboxId() != "" {
						_, _ = sandboxexec.New(s.sandboxes).Exec(ctx, sess.GetSandboxId(), 0, []string{"touch", "release.flag"}, nil, "", nil, io.Discard, io.Discard)
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return stop
}

// forkStack is hangar with the scripted upstream and the real CLIs.
type forkStack struct {
	*stack
}

func forkStart(t testing.TB, vars map[string]string) *forkStack {
	t.Helper()
	script := forkScript()
	all := map[string]string{
		// Forks hold back for the first sibling's answer; no need here.
		"HANGAR_CACHE_STAGGER_SECONDS": "0",
	}
	for k, v := range vars {
		all[k] = v
	}
	s := startStack(t, stackOptions{script: &script, vars: all})
	s.applyEnvironment(t, "e2e", gitRepo(t, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	return &forkStack{stack: s}
}

// parent makes a session with one completed turn of edits.
func (s *forkStack) parent(t testing.TB, name string, h sessionv1.Harness) *sessionv1.Session {
	t.Helper()
	if _, err := s.sessions.CreateSession(context.Background(), &sessionv1.CreateSessionRequest{
		Name: name, Environment: "e2e", Harness: h, Message: "Please do the first task.",
	}); err != nil {
		t.Fatalf("new %s: %v", name, err)
	}
	if first := s.waitTurn(t, name, 1); first.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("turn 1 of %s: %v (%s)", name, first.GetOutcome(), first.GetOutcomeReason())
	}
	return s.get(t, name)
}

// forkTreeScript describes a work tree like sessionE2ETreeScript, with the
// fork's own file (fork.txt) left out and its content printed last.
const forkTreeScript = `git rev-parse --abbrev-ref HEAD
git log --format=%s
git ls-files -s
git status --porcelain=v1 -uall | grep -v ' fork.txt$'
git ls-files -co --exclude-standard -z | sort -z | xargs -0 sha256sum | grep -v ' fork.txt$'
[ -f fork.txt ] && echo "fork.txt $(cat fork.txt)"
true`

// forkTapeCarries says whether the first model request of a run carries
// the parent's conversation.
func (s *forkStack) forkTapeCarries(t testing.TB, run string) bool {
	t.Helper()
	tape, err := s.gateway.GetTape(context.Background(), &gatewayv1.GetTapeRequest{Run: run})
	if err != nil || len(tape.GetSteps()) == 0 {
		t.Fatalf("tape of %s: %v (%d steps)", run, err, len(tape.GetSteps()))
	}
	body := string(tape.GetSteps()[0].GetRequest().GetBody())
	return strings.Contains(body, "first task") && strings.Contains(body, "first-done") && strings.Contains(body, "fork task")
}

// TestForkSession: for each real CLI, a parent with one turn of edits is
// forked into 3 with a message; every fork's first model request carries
// the parent's conversation, its work tree is the parent's at the fork
// point plus its own turn, on <parent branch>-fork-<i>; the parent is
// unchanged.
func TestForkSession(t *testing.T) {
	s := forkStart(t, nil)
	for _, h := range agentCLIs {
		t.Run(h.name, func(t *testing.T) {
			s.forkAndCheck(t, "fork-"+h.name, h.harness, true)
		})
	}
}

// TestForkCopiesFiles: the same with HANGAR_SANDBOX_COPIES=files: the
// forks' sandboxes are copies of every file, each verified by its tree
// hash before it is handed out.
func TestForkCopiesFiles(t *testing.T) {
	s := forkStart(t, map[string]string{"HANGAR_SANDBOX_COPIES": "files"})
	s.forkAndCheck(t, "files", sessionv1.Harness_HARNESS_CLAUDE, false)
}

// forkAndCheck makes a parent named name with one turn of edits, forks it
// into 3 with a message, and checks each fork's first request, history,
// branch, conversation and work tree, and that the parent is unchanged.
// overlay says whether the forks' sandboxes may be overlay mounts (where
// this machine mounts them): with false none may be.
func (s *forkStack) forkAndCheck(t *testing.T, name string, h sessionv1.Harness, overlay bool) {
	t.Helper()
	ctx := context.Background()
	parent := s.parent(t, name, h)
	before := s.mustExec(t, parent.GetSandboxId(), forkTreeScript)

	resp, err := s.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: name, N: 3, Message: "Please do the fork task."})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	if len(resp.GetForks()) != 3 || resp.GetForkedFromCheckpoint() == "" {
		t.Fatalf("fork answered %d forks from checkpoint %q", len(resp.GetForks()), resp.GetForkedFromCheckpoint())
	}
	var firstWork string
	for i, f := range resp.GetForks() {
		fname := fmt.Sprintf("%s-fork-%d", name, i+1)
		branch := fmt.Sprintf("%s-fork-%d", parent.GetBranch(), i+1)
		if f.GetName() != fname || f.GetParentId() != name || f.GetForkedFromCheckpoint() != resp.GetForkedFromCheckpoint() {
			t.Errorf("fork %d: name %q, parent %q, checkpoint %q", i+1, f.GetName(), f.GetParentId(), f.GetForkedFromCheckpoint())
		}
		own := s.waitTurn(t, fname, 2)
		if own.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
			t.Fatalf("turn 2 of %s: %v (%s)", fname, own.GetOutcome(), own.GetOutcomeReason())
		}
		if !s.forkTapeCarries(t, own.GetRunId()) {
			t.Errorf("%s's first model request does not carry the parent's conversation", fname)
		}
		inherited, err := s.sessions.GetTurn(ctx, &sessionv1.GetTurnRequest{Name: fname, Turn: 1})
		if err != nil || !inherited.GetTurn().GetInherited() || inherited.GetTurn().GetUsage().GetModelCalls() != 0 || inherited.GetTurn().GetUsage().GetInputTokens() != 0 {
			t.Errorf("%s's turn 1 is not inherited without usage: %v %v", fname, err, inherited.GetTurn())
		}
		fs := s.get(t, fname)
		if fs.GetBranch() != branch {
			t.Errorf("%s is on branch %q, want %q", fname, fs.GetBranch(), branch)
		}
		if fs.GetConversationId() == "" || fs.GetConversationId() == parent.GetConversationId() {
			t.Errorf("%s continues conversation %q (parent's %q): want a fork of it", fname, fs.GetConversationId(), parent.GetConversationId())
		}
		got := s.mustExec(t, fs.GetSandboxId(), forkTreeScript)
		want := strings.Replace(before, parent.GetBranch(), branch, 1) + "fork.txt " + fname + "\n"
		if got != want {
			t.Errorf("%s's work tree:\n%s\nwant the parent's at the fork point plus fork.txt:\n%s", fname, got, want)
		}
		sb, err := s.sandboxes.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: fs.GetSandboxId()})
		if err != nil {
			t.Fatal(err)
		}
		switch mounted := mountPoint(t, filepath.Dir(sb.GetSandbox().GetWorkDir())); {
		case mounted && !overlay:
			t.Errorf("%s's sandbox is an overlay mount with HANGAR_SANDBOX_COPIES=files", fname)
		case !mounted && overlay && overlaySupported(t):
			t.Errorf("%s's sandbox is not an overlay mount, though this machine mounts them", fname)
		}
		// Copied, not booted on its own: a copy of files hard-links the
		// first fork's git objects, the pack its restore wrote among them.
		if work := sb.GetSandbox().GetWorkDir(); i == 0 {
			firstWork = work
		} else if !overlay && !sharesPacks(t, firstWork, work) {
			t.Errorf("%s's sandbox is not a copy of the first fork's", fname)
		}
	}
	// Each fork suspends and comes back with its work: the checkpoint taken
	// in its (copied) sandbox restores, and its siblings go on without it.
	for i := 1; i <= 3; i += 2 {
		fname := fmt.Sprintf("%s-fork-%d", name, i)
		was := s.mustExec(t, s.get(t, fname).GetSandboxId(), forkTreeScript)
		if _, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: fname}); err != nil {
			t.Fatalf("suspend %s: %v", fname, err)
		}
		opened, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: fname})
		if err != nil {
			t.Fatalf("open %s: %v", fname, err)
		}
		if got := s.mustExec(t, opened.GetSession().GetSandboxId(), forkTreeScript); got != was {
			t.Errorf("%s after suspend and open:\n%s\nwas:\n%s", fname, got, was)
		}
	}
	if got := s.mustExec(t, s.get(t, name+"-fork-2").GetSandboxId(), "cat fork.txt"); got != name+"-fork-2\n" {
		t.Errorf("%s-fork-2's fork.txt after its siblings came and went: %q", name, got)
	}
	after := s.get(t, name)
	if after.GetConversationId() != parent.GetConversationId() || after.GetSandboxId() != parent.GetSandboxId() {
		t.Errorf("parent changed: conversation %q -> %q", parent.GetConversationId(), after.GetConversationId())
	}
	if got := s.mustExec(t, parent.GetSandboxId(), forkTreeScript); got != before {
		t.Errorf("parent's work tree changed:\n%s\nwas:\n%s", got, before)
	}
}

// sharesPacks says whether work tree b's pack files are work tree a's
// (the same inodes) wherever both have one of a name: so for a copy of
// files (hard-linked objects), not for a sandbox restored on its own (the
// restore's pack is written again; only the packs a local clone links are
// shared).
func sharesPacks(t *testing.T, a, b string) bool {
	t.Helper()
	packs, err := filepath.Glob(filepath.Join(a, ".git", "objects", "pack", "*.pack"))
	if err != nil {
		t.Fatal(err)
	}
	both := 0
	for _, p := range packs {
		fa, errA := os.Stat(p)
		fb, errB := os.Stat(filepath.Join(b, ".git", "objects", "pack", filepath.Base(p)))
		if errA != nil || errB != nil {
			continue
		}
		if !os.SameFile(fa, fb) {
			return false
		}
		both++
	}
	return both > 0
}

// overlaySupported says whether this process can mount an overlay.
func overlaySupported(t *testing.T) bool {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"l", "u", "w", "m"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s/l,upperdir=%s/u,workdir=%s/w", dir, dir, dir)
	if err := syscall.Mount("overlay", filepath.Join(dir, "m"), "overlay", 0, opts); err != nil {
		return false
	}
	if err := syscall.Unmount(filepath.Join(dir, "m"), 0); err != nil {
		t.Fatal(err)
	}
	return true
}

// mountPoint says whether p is a mount point in this process's namespace.
func mountPoint(t *testing.T, p string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == p {
			return true
		}
	}
	return false
}

// TestForkRefusals: a parent mid-turn can't be forked; -n over
// HANGAR_FORK_MAX is InvalidArgument.
func TestForkRefusals(t *testing.T) {
	s := forkStart(t, nil)
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
		Name: "busy", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Please do the slow task.",
	}); err != nil {
		t.Fatalf("new: %v", err)
	}
	_, err := s.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: "busy", N: 2, Message: "Please do the fork task."})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "mid-turn") {
		t.Errorf("fork of a mid-turn parent: %v, want FailedPrecondition saying it is mid-turn", err)
	}
	// The slow task waits for release.flag in its work tree.
	sandboxID := ""
	for deadline := time.Now().Add(time.Minute); sandboxID == ""; <-time.After(20 * time.Millisecond) {
		busy, err := s.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: "busy"})
		if err != nil {
			t.Fatal(err)
		}
		if sandboxID = busy.GetSession().GetSandboxId(); sandboxID == "" && time.Now().After(deadline) {
			t.Fatal("the busy session never got a sandbox")
		}
	}
	s.mustExec(t, sandboxID, "touch release.flag")
	if turn := s.waitTurn(t, "busy", 1); turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("slow turn: %v (%s)", turn.GetOutcome(), turn.GetOutcomeReason())
	}
	_, err = s.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: "busy", N: 9})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("fork -n 9: %v, want InvalidArgument", err)
	}
	if _, err := s.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: "busy-fork-1"}); status.Code(err) != codes.NotFound {
		t.Errorf("a refused fork left busy-fork-1: %v", err)
	}
	// A fork name that is taken: refused, and none of the others made.
	_, err = s.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: "busy", N: 3, Names: []string{"busy-a", "busy", "busy-c"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("fork named after its parent: %v, want InvalidArgument", err)
	}
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "taken", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE}); err != nil {
		t.Fatal(err)
	}
	_, err = s.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: "busy", N: 3, Names: []string{"busy-a", "taken", "busy-c"}})
	if status.Code(err) != codes.AlreadyExists || !strings.Contains(status.Convert(err).Message(), `"taken"`) {
		t.Errorf("fork onto a taken name: %v, want AlreadyExists naming it", err)
	}
	for _, name := range []string{"busy-a", "busy-c"} {
		if _, err := s.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: name}); status.Code(err) != codes.NotFound {
			t.Errorf("a refused fork left %s: %v", name, err)
		}
	}
}

// TestForkConversationClaim: two sessions holding one conversation id (a
// fork booted without a message has its parent's); the older keeps it and
// the other forks it on its next turn.
func TestForkConversationClaim(t *testing.T) {
	s := forkStart(t, nil)
	ctx := context.Background()
	parent := s.parent(t, "claim", sessionv1.Harness_HARNESS_CLAUDE)
	resp, err := s.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: "claim", N: 1, Names: []string{"claim-b"}})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	f := resp.GetForks()[0]
	if f.GetConversationId() != parent.GetConversationId() || f.GetSandboxId() == "" {
		t.Fatalf("booted fork: conversation %q (parent %q), sandbox %q", f.GetConversationId(), parent.GetConversationId(), f.GetSandboxId())
	}
	// The younger session goes first: it must not continue the id.
	if _, err := s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: "claim-b", Message: "Please do the fork task."}); err != nil {
		t.Fatalf("send to the fork: %v", err)
	}
	own := s.waitTurn(t, "claim-b", 2)
	if own.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED || !s.forkTapeCarries(t, own.GetRunId()) {
		t.Fatalf("fork's turn: %v (%s), or its request lacks the parent's conversation", own.GetOutcome(), own.GetOutcomeReason())
	}
	if got := s.get(t, "claim-b").GetConversationId(); got == "" || got == parent.GetConversationId() {
		t.Errorf("the younger session continues %q (the parent's is %q)", got, parent.GetConversationId())
	}
	if _, err := s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: "claim", Message: "Please do the fork task."}); err != nil {
		t.Fatalf("send to the parent: %v", err)
	}
	if turn := s.waitTurn(t, "claim", 2); turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("parent's turn: %v (%s)", turn.GetOutcome(), turn.GetOutcomeReason())
	}
	if got := s.get(t, "claim").GetConversationId(); got != parent.GetConversationId() {
		t.Errorf("the older session lost its conversation: %q, was %q", got, parent.GetConversationId())
	}
}

// TestBestOfN: a check that passes in exactly one attempt delivers that one.
func TestBestOfN(t *testing.T) {
	s := forkStart(t, nil)
	ctx := context.Background()
	s.parent(t, "bon", sessionv1.Harness_HARNESS_CLAUDE)
	check := `case "$(cat fork.txt)" in *-2) echo "score 7";; *) echo "wrong attempt"; exit 1;; esac`
	created, err := s.jobs.CreateJob(ctx, &sessionv1.CreateJobRequest{
		Strategy: sessionv1.JobStrategy_JOB_STRATEGY_BEST_OF_N, Session: "bon", Message: "Please do the fork task.", N: 3, Check: check,
	})
	if err != nil {
		t.Fatalf("create job: %v", err)
	}
	job := forkWaitJob(t, s, created.GetJob().GetId())
	if job.GetState() != sessionv1.JobState_JOB_STATE_DELIVERED {
		t.Fatalf("job %s: %v (%s) attempts %v", job.GetId(), job.GetState(), job.GetError(), job.GetAttempts())
	}
	if len(job.GetAttempts()) != 3 || !strings.HasSuffix(job.GetWinner(), "-2") || job.GetBranch() != "hangar/session/bon-fork-2" {
		t.Errorf("delivered %q on %q from %d attempts", job.GetWinner(), job.GetBranch(), len(job.GetAttempts()))
	}
	if !strings.Contains(job.GetPatch(), "fork.txt") || !strings.Contains(job.GetPatch(), job.GetWinner()) {
		t.Errorf("delivered patch lacks the winner's fork.txt:\n%s", job.GetPatch())
	}
	for _, a := range job.GetAttempts() {
		passed := a.GetSession() == job.GetWinner()
		if passed != (a.GetCheckExitCode() == 0) || (passed && a.GetScore() != 7) {
			t.Errorf("attempt %s: exit %d score %v", a.GetSession(), a.GetCheckExitCode(), a.GetScore())
		}
	}
	list, err := s.jobs.ListJobs(ctx, &sessionv1.ListJobsRequest{})
	if err != nil || len(list.GetJobs()) != 1 {
		t.Errorf("list jobs: %v, %d", err, len(list.GetJobs()))
	}
}

// TestBestOfNRestart: a best-of-N job whose attempts are mid-turn when
// hangar stops is picked up by the next process, not failed: the attempts'
// turns (ended "interrupted" by the drain) are sent again, checked and the
// best delivered. While it runs the job holds the prepared session and
// every attempt; once it has ended it holds nothing.
func TestBestOfNRestart(t *testing.T) {
	s := forkStart(t, nil)
	ctx := context.Background()
	s.parent(t, "bonr", sessionv1.Harness_HARNESS_CLAUDE)
	check := `case "$(basename "$(dirname "$PWD")")" in *-2) echo "score 5";; *) echo "not this one"; exit 1;; esac`
	created, err := s.jobs.CreateJob(ctx, &sessionv1.CreateJobRequest{
		Strategy: sessionv1.JobStrategy_JOB_STRATEGY_BEST_OF_N, Session: "bonr", Message: "Please do the slow task.", N: 2, Check: check,
	})
	if err != nil {
		t.Fatalf("create job: %v", err)
	}
	id := created.GetJob().GetId()
	jobHeld := func(name string) bool {
		for _, h := range s.get(t, name).GetHolds() {
			if h.GetKind() == sessionv1.HoldKind_HOLD_KIND_JOB && h.GetOwner() == "job/"+id {
				return true
			}
		}
		return false
	}
	var attempts []string
	deadline := time.Now().Add(3 * time.Minute)
	for {
		job, err := s.jobs.GetJob(ctx, &sessionv1.GetJobRequest{Id: id})
		if err != nil {
			t.Fatal(err)
		}
		attempts = attempts[:0]
		running := 0
		for _, a := range job.GetJob().GetAttempts() {
			attempts = append(attempts, a.GetSession())
			if got, err := s.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: a.GetSession()}); err == nil &&
				got.GetSession().GetState() == sessionv1.SessionState_SESSION_STATE_RUNNING {
				running++
			}
		}
		if len(attempts) == 2 && running == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job's attempts are not both running: %v", job.GetJob())
		}
		<-time.After(100 * time.Millisecond)
	}
	for _, name := range append([]string{"bonr"}, attempts...) {
		if !jobHeld(name) {
			t.Errorf("%s is not held by job %s while it runs: %v", name, id, s.get(t, name).GetHolds())
		}
	}

	s.stack = s.restart(t)

	if job, err := s.jobs.GetJob(ctx, &sessionv1.GetJobRequest{Id: id}); err != nil || job.GetJob().GetEndedAt() != nil {
		t.Fatalf("job after a restart: %v, %v; want still running", job.GetJob(), err)
	}
	releaseSlowTasks(t, s.stack)
	job := forkWaitJob(t, s, id)
	if job.GetState() != sessionv1.JobState_JOB_STATE_DELIVERED {
		for _, name := range attempts {
			for _, turn := range s.get(t, name).GetTurns() {
				t.Logf("%s turn %d: %v (%s)", name, turn.GetNumber(), turn.GetOutcome(), turn.GetOutcomeReason())
			}
		}
		t.Fatalf("job %s after a restart: %v (%s) attempts %v", id, job.GetState(), job.GetError(), job.GetAttempts())
	}
	if !strings.HasSuffix(job.GetWinner(), "-2") || job.GetBranch() != "hangar/session/bonr-fork-2" {
		t.Errorf("delivered %q on %q", job.GetWinner(), job.GetBranch())
	}
	for _, name := range attempts {
		var outcomes []sessionv1.TurnOutcome
		var reasons []string
		for _, turn := range s.get(t, name).GetTurns() {
			if !turn.GetInherited() {
				outcomes = append(outcomes, turn.GetOutcome())
				reasons = append(reasons, turn.GetOutcomeReason())
			}
		}
		want := []sessionv1.TurnOutcome{sessionv1.TurnOutcome_TURN_OUTCOME_INTERRUPTED, sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED}
		if !slices.Equal(outcomes, want) {
			t.Errorf("%s's own turns ended %v %q, want %v (interrupted by the restart, then sent again)", name, outcomes, reasons, want)
		}
	}
	for _, name := range append([]string{"bonr"}, attempts...) {
		if jobHeld(name) {
			t.Errorf("%s is still held by job %s after it ended", name, id)
		}
	}
}

// TestJobHoldsSessions: with the injected clock, a job's prepared session
// idle past its idle time is not suspended while the job runs (the job
// holds it); once the job has delivered, the next idle time suspends it.
func TestJobHoldsSessions(t *testing.T) {
	clock := &sessionMoreClock{now: time.Now().UTC(), tick: make(chan time.Time)}
	script := forkScript()
	st := startStack(t, stackOptions{script: &script, clock: sessionapp.Clock{Now: clock.Now, Tick: clock.tick},
		vars: map[string]string{"HANGAR_CACHE_STAGGER_SECONDS": "0"}})
	st.applyEnvironment(t, "e2e", gitRepo(t, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	s := &forkStack{stack: st}
	ctx := context.Background()
	s.parent(t, "jobheld", sessionv1.Harness_HARNESS_CLAUDE)
	if _, err := s.sessions.KeepSession(ctx, &sessionv1.KeepSessionRequest{Name: "jobheld", IdleMinutes: 5}); err != nil {
		t.Fatal(err)
	}
	created, err := s.jobs.CreateJob(ctx, &sessionv1.CreateJobRequest{
		Strategy: sessionv1.JobStrategy_JOB_STRATEGY_BEST_OF_N, Session: "jobheld", Message: "Please do the slow task.", N: 1, Check: "echo 1",
	})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetJob().GetId()
	deadline := time.Now().Add(2 * time.Minute)
	for !slices.ContainsFunc(s.get(t, "jobheld").GetHolds(), func(h *sessionv1.Hold) bool { return h.GetKind() == sessionv1.HoldKind_HOLD_KIND_JOB }) {
		if time.Now().After(deadline) {
			t.Fatalf("job %s does not hold its session: %v", id, s.get(t, "jobheld").GetHolds())
		}
		<-time.After(50 * time.Millisecond)
	}
	clock.advance(10 * time.Minute)
	clock.sweep(t)
	if got := s.get(t, "jobheld"); got.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE || got.GetSandboxId() == "" || got.GetSuspendAt() != nil {
		t.Fatalf("a session held by a running job, idle 10 minutes of 5: %v (%s), suspend at %v", got.GetState(), got.GetStateReason(), got.GetSuspendAt())
	}
	releaseSlowTasks(t, s.stack)
	if job := forkWaitJob(t, s, id); job.GetState() != sessionv1.JobState_JOB_STATE_DELIVERED {
		t.Fatalf("job %s: %v (%s)", id, job.GetState(), job.GetError())
	}
	if h := s.get(t, "jobheld").GetHolds(); len(h) != 0 {
		t.Fatalf("holds after the job ended: %v", h)
	}
	clock.advance(6 * time.Minute)
	clock.sweep(t)
	if got := s.get(t, "jobheld"); got.GetState() != sessionv1.SessionState_SESSION_STATE_SUSPENDED {
		t.Fatalf("6 minutes after the job released it (idle 5): %v (%s), want suspended", got.GetState(), got.GetStateReason())
	}
}

// forkWaitJob polls a job until it ends (the contract has no wait for
// jobs), with a deadline.
func forkWaitJob(t testing.TB, s *forkStack, id string) *sessionv1.Job {
	t.Helper()
	deadline := time.After(5 * time.Minute)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := s.jobs.GetJob(context.Background(), &sessionv1.GetJobRequest{Id: id})
		if err != nil {
			t.Fatalf("get job %s: %v", id, err)
		}
		if resp.GetJob().GetEndedAt() != nil {
			return resp.GetJob()
		}
		select {
		case <-deadline:
			t.Fatalf("job %s still %v after 5 minutes", id, resp.GetJob().GetState())
		case <-tick.C:
		}
	}
}

// BenchmarkForkFanOut: time from the fork call to all N forks ready for
// their first turn (booted, restored) for N = 1, 2, 4, 8, the N=8 to N=1
// ratio, and stored bytes per fork. It measures the cold path: the
// environment has no warm pool, so the parent's sandbox (up) is checked
// for changes since its checkpoint, the first fork's sandbox is created
// (clone) and restored, and the other forks get copies of it. ns/op is
// the four forks together.
//
// It runs with the sandboxes isolated (bubblewrap) and not, to show what
// isolation costs.
func BenchmarkForkFanOut(b *testing.B) {
	for _, iso := range []string{"bwrap", "none"} {
		b.Run("isolation="+iso, func(b *testing.B) { benchmarkForkFanOut(b, iso) })
	}
}

func benchmarkForkFanOut(b *testing.B, isolation string) {
	s := forkStart(b, map[string]string{"HANGAR_SANDBOX_ISOLATION": isolation})
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "fan", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE}); err != nil {
		b.Fatal(err)
	}
	opened, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "fan"})
	if err != nil {
		b.Fatal(err)
	}
	s.mustExec(b, opened.GetSession().GetSandboxId(), `head -c 1048576 /dev/urandom > blob.bin && for i in $(seq 1 200); do echo "line $i" > "f$i.txt"; done && git add -A && git commit -qm work && echo edit >> f1.txt`)
	// The parent's checkpoint of that work is taken by the first fork, so
	// fork once before timing: every fork then measures the same thing.
	if _, err := s.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: "fan", N: 1, Names: []string{"fan-warm"}}); err != nil {
		b.Fatal(err)
	}
	if _, err := s.sessions.ArchiveSession(ctx, &sessionv1.ArchiveSessionRequest{Name: "fan-warm"}); err != nil {
		b.Fatal(err)
	}
	// Each iteration forks with every N, starting from a different one
	// each time: what drifts on the machine while it runs weighs on every
	// N alike. The forks are archived once the timing is done: deleting
	// sandboxes between forks would time the filesystem's recovery from
	// the deletes (on an ext4 without a journal, creating an inode scans
	// past every inode deleted in the last 30 s of its group).
	ns := []int{1, 2, 4, 8}
	took := make([]time.Duration, len(ns))
	var made []string
	round, iteration := 0, 0
	for b.Loop() {
		iteration++
		for k := range ns {
			at := (k + iteration) % len(ns)
			n := ns[at]
			round++
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprintf("fan-%d-%d", round, i+1)
			}
			t0 := time.Now()
			resp, err := s.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: "fan", N: int32(n), Names: names})
			if err != nil {
				b.Fatal(err)
			}
			took[at] += time.Since(t0)
			for _, f := range resp.GetForks() {
				if f.GetSandboxId() == "" {
					b.Fatalf("fork %s is not up", f.GetName())
				}
			}
			made = append(made, names...)
		}
	}
	b.StopTimer()
	var stored int64
	for _, name := range made {
		cps, err := s.checkpoints.ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: name})
		if err != nil {
			b.Fatal(err)
		}
		for _, cp := range cps.GetCheckpoints() {
			stored += cp.GetStoredBytes()
		}
		if _, err := s.sessions.ArchiveSession(ctx, &sessionv1.ArchiveSessionRequest{Name: name}); err != nil {
			b.Fatal(err)
		}
	}
	for i, n := range ns {
		b.ReportMetric(float64(took[i].Milliseconds())/float64(b.N), fmt.Sprintf("N=%d-ms", n))
	}
	b.ReportMetric(float64(took[3])/float64(took[0]), "N8/N1")
	b.ReportMetric(float64(stored)/float64(len(made)), "stored-B/fork")
}

// BenchmarkForkFanOutTurns (issue 16): `fork -n N` with a message, timed
// until every fork's first turn (the real Claude Code against the
// scripted upstream) has completed, for N=1 and N=8 alternately; reports
// each and N8/N1 (target <= 1.5). Beside them, in the same iterations, N
// bare Claude Code turns run by hand in parallel (each in its own clone
// and HOME, no hangar) against the same upstream: bare-N8/N1 is the
// machine's own floor for N8/N1 (8 CLI starts on its cores), bare-cpu-ms
// what one CLI turn costs its cores (N8 can't be under 8 x that / cores),
// and N=n-minus-bare the part of each that is hangar's.
func BenchmarkForkFanOutTurns(b *testing.B) {
	s := forkStart(b, nil)
	ctx := context.Background()
	claude := filepath.Join(os.Getenv("HANGAR_HARNESS_DIR"), harnessClaude)
	modelURL := s.ctl.vars["HANGAR_ANTHROPIC_URL"]
	bareRepo := gitRepo(b, nil)
	type bareDir struct{ work, home string }
	bares := make([]bareDir, 8)
	for i := range bares {
		bares[i] = bareDir{filepath.Join(b.TempDir(), "work"), b.TempDir()}
		if out, err := exec.Command("git", "clone", "-q", bareRepo, bares[i].work).CombinedOutput(); err != nil {
			b.Fatalf("clone: %v %s", err, out)
		}
	}
	bareTook := make([]time.Duration, 2)
	var bareCPU time.Duration
	bareRuns := 0
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "fant", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE}); err != nil {
		b.Fatal(err)
	}
	opened, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "fant"})
	if err != nil {
		b.Fatal(err)
	}
	s.mustExec(b, opened.GetSession().GetSandboxId(), `for i in $(seq 1 200); do echo "line $i" > "f$i.txt"; done && git add -A && git commit -qm work && echo edit >> f1.txt`)
	ns := []int{1, 8}
	took := make([]time.Duration, len(ns))
	round, iteration := 0, 0
	var made []string
	for b.Loop() {
		iteration++
		for k := range ns {
			at := (k + iteration) % len(ns)
			n := ns[at]
			round++
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprintf("fant-%d-%d", round, i+1)
			}
			t0 := time.Now()
			if _, err := s.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: "fant", N: int32(n), Names: names, Message: "Say OK."}); err != nil {
				b.Fatal(err)
			}
			var wg sync.WaitGroup
			for _, name := range names {
				wg.Go(func() {
					if got := s.waitTurn(b, name, 1); got.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
						b.Errorf("first turn of %s: %v (%s)", name, got.GetOutcome(), got.GetOutcomeReason())
					}
				})
			}
			wg.Wait()
			took[at] += time.Since(t0)
			made = append(made, names...)

			t0 = time.Now()
			var mu sync.Mutex
			for _, d := range bares[:n] {
				wg.Go(func() {
					_, cpu := bareClaude(b, claude, d.work, d.home, modelURL, "Say OK.")
					mu.Lock()
					bareCPU += cpu
					bareRuns++
					mu.Unlock()
				})
			}
			wg.Wait()
			bareTook[at] += time.Since(t0)
		}
	}
	b.StopTimer()
	for _, name := range made {
		if _, err := s.sessions.ArchiveSession(ctx, &sessionv1.ArchiveSessionRequest{Name: name}); err != nil {
			b.Fatal(err)
		}
	}
	perOp := func(d time.Duration) float64 { return float64(d.Milliseconds()) / float64(b.N) }
	for i, n := range ns {
		b.ReportMetric(perOp(took[i]), fmt.Sprintf("N=%d-ms", n))
		b.ReportMetric(perOp(bareTook[i]), fmt.Sprintf("bare-N=%d-ms", n))
		b.ReportMetric(perOp(took[i]-bareTook[i]), fmt.Sprintf("N=%d-minus-bare-ms", n))
	}
	b.ReportMetric(float64(took[1])/float64(took[0]), "N8/N1")
	b.ReportMetric(float64(bareTook[1])/float64(bareTook[0]), "bare-N8/N1")
	// What one CLI turn costs the machine's cores: N of them in parallel
	// can't end before N times this over the cores.
	b.ReportMetric(float64(bareCPU.Milliseconds())/float64(max(bareRuns, 1)), "bare-cpu-ms/CLI")
}
