package e2e_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// privatePostgres is a PostgreSQL cluster of the test's own (Debian's
// initdb and pg_ctl, run as the postgres user, on a free port), so the
// test can stop and start it; the machine's shared PostgreSQL is never
// touched.
type privatePostgres struct {
	bin, dir, port string
}

func startPrivatePostgres(t *testing.T) *privatePostgres {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	runuser, err := exec.LookPath("runuser")
	if len(bins) == 0 || err != nil {
		t.Skip("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin) or runuser: apt-get install postgresql")
	}
	if os.Geteuid() != 0 {
		t.Skip("a private PostgreSQL cluster is run as the postgres user, which needs root")
	}
	dir, err := os.MkdirTemp("", "hangar-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if out, err := exec.Command("chown", "postgres", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot give %s to the postgres user: %v %s", dir, err, out)
	}
	_, port, _ := net.SplitHostPort(freeAddr(t))
	p := &privatePostgres{bin: filepath.Dir(bins[0]), dir: dir, port: port}
	p.run(t, runuser, "initdb", "-D", p.data(), "-A", "trust", "-U", "postgres", "--no-sync")
	p.start(t)
	t.Cleanup(func() { _ = p.ctl("stop", "-m", "immediate") })
	return p
}

func (p *privatePostgres) data() string { return filepath.Join(p.dir, "data") }

func (p *privatePostgres) url() string {
	return "postgres://postgres@127.0.0.1:" + p.port + "/postgres?sslmode=disable"
}

func (p *privatePostgres) run(t *testing.T, runuser, tool string, args ...string) {
	t.Helper()
	cmd := exec.Command(runuser, append([]string{"-u", "postgres", "--", filepath.Join(p.bin, tool)}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", tool, args, err, out)
	}
}

func (p *privatePostgres) ctl(args ...string) error {
	all := append([]string{"-u", "postgres", "--", filepath.Join(p.bin, "pg_ctl"), "-D", p.data(), "-w"}, args...)
	return exec.Command("runuser", all...).Run()
}

func (p *privatePostgres) start(t *testing.T) {
	t.Helper()
	opts := "-p " + p.port + " -k " + p.dir + " -c listen_addresses=127.0.0.1 -c fsync=off"
	if err := p.ctl("-l", filepath.Join(p.dir, "log"), "-o", opts, "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(p.dir, "log"))
		t.Fatalf("pg_ctl start: %v\n%s", err, log)
	}
}

// stop stops it the way a crash does (immediate: no checkpoint, clients
// cut off); the next start recovers from the WAL.
func (p *privatePostgres) stop(t *testing.T) {
	t.Helper()
	if err := p.ctl("stop", "-m", "immediate"); err != nil {
		t.Fatalf("pg_ctl stop: %v", err)
	}
}

// TestPostgresRestartMidTurn: the session database (HANGAR_DATABASE_URL)
// crashes and comes back while a turn runs, and is down when the turn
// ends: the turn ends recorded (completed, with its usage) once the
// database is back, the events the agent produced while it was down (its
// last answer, the turn's usage) are in the session's log, and the
// session takes its next turn.
func TestPostgresRestartMidTurn(t *testing.T) {
	pg := startPrivatePostgres(t)
	script := scripted.Script{
		Rules: append([]scripted.Rule{
			{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Finished."}},
		}, append(shellRules("long task", controlWaitCmd), shellRules("quick task", "echo quick")...)...),
		Default: &scripted.Answer{Text: "OK."},
	}
	s := startStack(t, stackOptions{script: &script, vars: map[string]string{"HANGAR_DATABASE_URL": pg.url()}})
	s.applyEnvironment(t, "e2e", gitRepo(t, nil), 0, sandboxv1.Egress_EGRESS_FULL)
	ctx := context.Background()
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
		Name: "pg-turn", Environment: "e2e", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Do the long task.",
	}); err != nil {
		t.Fatal(err)
	}
	sandbox := controlWaitRunning(t, s, "pg-turn")
	run := s.get(t, "pg-turn").GetTurns()[0].GetRunId()
	pg.stop(t)
	pg.start(t)
	// Down again while the turn ends: its end is written once it is back.
	pg.stop(t)
	s.mustExec(t, sandbox, "touch release.flag")
	// The agent's last model call (after its tool call) is the end of
	// the turn.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, err := s.gateway.GetRun(ctx, &gatewayv1.GetRunRequest{Run: run})
		if err == nil && got.GetRun().GetUsage().GetModelCalls() >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's last model call did not come: %v, %v", got.GetRun(), err)
		}
		<-time.After(50 * time.Millisecond)
	}
	// The rest of the outage (the fault's length, not a wait for
	// something): the turn ends while the database is down.
	<-time.After(2 * time.Second)
	pg.start(t)
	turn := s.waitTurn(t, "pg-turn", 1)
	if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED || turn.GetUsage().GetModelCalls() < 2 {
		t.Fatalf("turn after PostgreSQL restarts: %v (%s), usage %v", turn.GetOutcome(), turn.GetOutcomeReason(), turn.GetUsage())
	}
	// The events are written by then or soon after (kept in order while
	// the database was down).
	var texts []string
	for deadline := time.Now().Add(time.Minute); ; <-time.After(50 * time.Millisecond) {
		evs, err := s.sessions.ListEvents(ctx, &sessionv1.ListEventsRequest{Name: "pg-turn", Turn: 1})
		if err != nil {
			t.Fatal(err)
		}
		texts = nil
		finished, usage := false, false
		for _, e := range evs.GetEvents() {
			texts = append(texts, e.GetKind().String()+": "+e.GetText())
			finished = finished || strings.Contains(e.GetText(), "Finished.")
			usage = usage || e.GetKind() == sessionv1.EventKind_EVENT_KIND_USAGE
		}
		if finished && usage {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("turn 1's events lack what the agent did while the database was down (its last answer, the usage):\n%s", strings.Join(texts, "\n"))
		}
	}
	if _, err := s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: "pg-turn", Message: "Now the quick task."}); err != nil {
		t.Fatalf("send after the restarts: %v", err)
	}
	if second := s.waitTurn(t, "pg-turn", 2); second.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("turn 2: %v (%s)", second.GetOutcome(), second.GetOutcomeReason())
	}
}
