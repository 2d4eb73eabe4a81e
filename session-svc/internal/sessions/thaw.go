package sessions

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/harness"
	"github.com/hangar-dev/hangar/session-svc/internal/harnesslock"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// HarnessLocks reads harness locks ("team-default@r14").
type HarnessLocks interface {
	Get(ctx context.Context, ref string) (harnesslock.Lock, error)
	List(ctx context.Context) ([]harnesslock.Lock, string, error)
}

// CLIVersions says which version of a harness's CLI the sandboxes run,
// without a sandbox: the first line of its --version ("" when it is not
// installed) and where it was found.
type CLIVersions interface {
	Version(ctx context.Context, h harness.Name) (version, path string)
}

// HarnessLocks reads the harness locks sessions are thawed from; nil when
// HANGAR_HARNESS_REPO is unset.
func (m *Manager) HarnessLocks() HarnessLocks { return m.d.Locks }

// The outcome reason of a thawed session's turn 1 that differed from its
// lock under HANGAR_HARNESS_DRIFT=fail.
const reasonHarnessDrift = "harness_drift"

// thaw makes n a session thawed from its harness lock: the lock's harness,
// model and approval mode, on the CLI version it pins. It refuses, before
// any sandbox work, a lock whose CLI version is not the one the sandboxes
// run, and a harness, model or approval mode asked for besides the lock.
func (m *Manager) thaw(ctx context.Context, n *NewSession) error {
	if m.d.Locks == nil {
		return fault.FailedPrecondition("HARNESS_REPO_UNSET", "no harness locks here: set HANGAR_HARNESS_REPO to the git repository holding %s", harnesslock.FileName)
	}
	lock, err := m.d.Locks.Get(ctx, n.HarnessLock)
	if err != nil {
		return err
	}
	conflict := func(field, asked, locked string) error {
		return fault.InvalidArgument(field, "harness lock %s sets the %s (%s); %s was asked for: leave it out, or thaw another lock", lock.Ref(), field, locked, asked)
	}
	switch {
	case n.Harness != "" && n.Harness != lock.Harness:
		return conflict("harness", n.Harness, lock.Harness)
	case n.Model != "" && n.Model != lock.Model:
		return conflict("model", n.Model, lock.Model)
	case n.Approvals != "" && n.Approvals != lock.Approvals:
		return conflict("approvals", n.Approvals, lock.Approvals)
	}
	if err := m.checkCLIVersion(ctx, lock, n.Environment); err != nil {
		return err
	}
	n.Harness, n.Model, n.HarnessLock = lock.Harness, lock.Model, lock.Ref()
	n.Approvals = ""
	if lock.Approvals == ApprovalsAsk {
		n.Approvals = ApprovalsAsk
	}
	return nil
}

// forkLock reads the harness lock forks are thawed from and checks the
// CLI version it pins, as a thaw does.
func (m *Manager) forkLock(ctx context.Context, ref, environment string) (harnesslock.Lock, error) {
	if m.d.Locks == nil {
		return harnesslock.Lock{}, fault.FailedPrecondition("HARNESS_REPO_UNSET", "no harness locks here (harness_lock %s): set HANGAR_HARNESS_REPO to the git repository holding %s", ref, harnesslock.FileName)
	}
	lock, err := m.d.Locks.Get(ctx, ref)
	if err != nil {
		return harnesslock.Lock{}, err
	}
	if err := m.checkCLIVersion(ctx, lock, environment); err != nil {
		return harnesslock.Lock{}, err
	}
	return lock, nil
}

// CheckLockCLI refuses lock, as a thaw does, when environment's sandboxes
// run another version of its harness's CLI (GetHarnessLock's
// check_cli_environment: a fork at a step's pin set is checked before its
// prefix is rebuilt).
func (m *Manager) CheckLockCLI(ctx context.Context, lock harnesslock.Lock, environment string) error {
	return m.checkCLIVersion(ctx, lock, environment)
}

// checkCLIVersion refuses lock when the sandboxes' CLI of its harness is
// another version, saying which to install or which lock pins the one
// there. It asks this host's CLI, which is the sandboxes' own only under
// the local driver: pods (the kubernetes driver) have their image's, so
// for them the check is turn 1's, in the sandbox before the agent runs
// (driftCheck.inSandbox).
func (m *Manager) checkCLIVersion(ctx context.Context, lock harnesslock.Lock, environment string) error {
	if m.d.CLIs == nil || !m.sandboxesOnHost(ctx, environment) {
		return nil
	}
	line, path := m.d.CLIs.Version(ctx, harness.Name(lock.Harness))
	have := harnesslock.VersionOf(line)
	if have == lock.CLIVersion {
		return nil
	}
	in := harness.InstallOf(harness.Name(lock.Harness))
	install := fmt.Sprintf("install %s %s", in.Binary, lock.CLIVersion)
	if in.Package != "" {
		install = fmt.Sprintf("install it (npm install -g %s@%s", in.Package, lock.CLIVersion)
		if in.Setting != "" {
			install += ", or set " + in.Setting + " to its path"
		}
		install += ")"
	}
	if path == "" || have == "" {
		return fault.FailedPrecondition("HARNESS_CLI_VERSION", "harness lock %s pins %s %s, which the sandboxes do not have (%s): %s",
			lock.Ref(), lock.Harness, lock.CLIVersion, missingWhat(path, line), install)
	}
	other := "no lock there pins it"
	if locks, _, err := m.d.Locks.List(ctx); err == nil {
		var refs []string
		for _, l := range locks {
			if l.Harness == lock.Harness && l.CLIVersion == have {
				refs = append(refs, l.Ref())
			}
		}
		if len(refs) > 0 {
			other = strings.Join(refs, ", ") + " pins it"
		}
	}
	return fault.FailedPrecondition("HARNESS_CLI_VERSION", "harness lock %s pins %s %s, but the sandboxes run %s (%s): %s, or thaw a lock on %s (%s)",
		lock.Ref(), lock.Harness, lock.CLIVersion, have, path, install, have, other)
}

// sandboxesOnHost says whether environment's sandboxes see this host's
// files (the local driver), so this host's agent CLI is theirs. One that
// cannot be read counts as on the host: creating the session reports it.
func (m *Manager) sandboxesOnHost(ctx context.Context, environment string) bool {
	if environment == "" {
		environment = defaultEnvironment
	}
	if m.d.Sandboxes == nil {
		return true
	}
	resp, err := m.d.Sandboxes.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: environment})
	if err != nil {
		return true
	}
	d := resp.GetEnvironment().GetDriver()
	return d == "" || d == "local"
}

func missingWhat(path, line string) string {
	if path == "" {
		return "its CLI is not installed"
	}
	if line == "" {
		return path + " does not answer --version"
	}
	return fmt.Sprintf("%s answers %q", path, line)
}

// refuseHarnessSwitch refuses moving s (thawed from a lock) to another
// harness.
func refuseHarnessSwitch(s *store.Session, to string) error {
	if s.HarnessLock == "" || to == "" || to == s.Harness {
		return nil
	}
	return fault.FailedPrecondition("HARNESS_LOCKED",
		"session %q was thawed from harness lock %s and runs %s only: start another session for another lock (hangar harness thaw LOCK --env ENV MESSAGE)",
		s.Name, s.HarnessLock, s.Harness)
}

// driftCheck is turn 1 of a thawed session being compared with its lock.
type driftCheck struct {
	lock harnesslock.Lock
	// cliVersions: the CLI's --version in the sandbox, then each model
	// request's.
	cliVersions []string
	// inSandbox: the thaw could not check the CLI version on this host
	// (the sandboxes are pods), so a CLI version other than the lock's
	// fails turn 1 before the agent runs, whatever HANGAR_HARNESS_DRIFT.
	inSandbox bool
}

// startDriftCheck reads the lock of a thawed session's turn 1 and asks
// the sandbox's CLI for its version; nil when the turn is not checked. A
// lock that cannot be read is a warning: the turn runs unchecked.
func (m *Manager) startDriftCheck(ctx context.Context, s *store.Session, number int, sandboxID string, inv harness.Invocation, env map[string]string) (*driftCheck, string) {
	if s.HarnessLock == "" || number != 1 || m.d.Locks == nil {
		return nil, ""
	}
	lock, err := m.d.Locks.Get(ctx, s.HarnessLock)
	if err != nil {
		m.log.WarnContext(ctx, "harness lock not read for the drift check", "session", s.Name, "lock", s.HarnessLock, "error", err)
		return nil, "turn 1 was not checked against harness lock " + s.HarnessLock + ": " + publicMessage(err)
	}
	dc := &driftCheck{lock: lock, inSandbox: !m.sandboxesOnHost(ctx, s.Environment)}
	var out, errOut bytes.Buffer
	code, err := sandboxexec.New(m.d.Sandboxes).WithPathPrepend(inv.PathPrepend...).Exec(ctx, sandboxID, s.FencingToken,
		[]string{inv.Argv[0], "--version"}, env, inv.Cwd, nil, &out, &errOut)
	if err == nil && code == 0 {
		line, _, _ := strings.Cut(strings.TrimSpace(out.String()), "\n")
		dc.cliVersions = append(dc.cliVersions, strings.TrimSpace(line))
	} else {
		m.log.WarnContext(ctx, "agent CLI version not read in the sandbox", "session", s.Name, "code", code, "error", err)
	}
	return dc, ""
}

// cliDrift is the CLI version difference found before the agent ran.
func (dc *driftCheck) cliDrift() []harnesslock.Difference {
	var out []harnesslock.Difference
	for _, d := range harnesslock.Compare(dc.lock, harnesslock.Observed{Harness: dc.lock.Harness, Approvals: dc.lock.Approvals, CLIVersions: dc.cliVersions}) {
		if d.Field == "cli_version" {
			out = append(out, d)
		}
	}
	return out
}

// finish compares what turn 1 ran with the lock: its harness and approval
// mode, the CLI versions seen, and every model the gateway saw on the
// run's requests and answers.
func (m *Manager) finishDriftCheck(ctx context.Context, dc *driftCheck, s *store.Session, turn *store.Turn, runID string) ([]store.Drift, error) {
	o := harnesslock.Observed{Harness: turn.Harness, Approvals: "never", CLIVersions: dc.cliVersions}
	if s.Approvals == ApprovalsAsk {
		o.Approvals = ApprovalsAsk
	}
	steps, err := m.d.Gateway.ListSteps(ctx, &gatewayv1.ListStepsRequest{Run: runID})
	if err != nil {
		return nil, fmt.Errorf("steps of run %s: %w", runID, err)
	}
	for _, st := range steps.GetSteps() {
		o.Models = append(o.Models, st.GetModel(), st.GetServedModel())
		if v := harnesslock.RequestCLIVersion(turn.Harness, st.GetRequest().GetHeaders()); v != "" {
			o.CLIVersions = append(o.CLIVersions, v)
		}
	}
	return driftOf(harnesslock.Compare(dc.lock, o)), nil
}

func driftOf(diffs []harnesslock.Difference) []store.Drift {
	out := make([]store.Drift, 0, len(diffs))
	for _, d := range diffs {
		out = append(out, store.Drift{Field: d.Field, Locked: d.Locked, Actual: d.Actual})
	}
	return out
}

// driftText says what differed: "turn 1 differs from harness lock
// team-default@r14: model claude-x (locked claude-y)".
func driftText(lock string, drift []store.Drift) string {
	parts := make([]string, 0, len(drift))
	for _, d := range drift {
		parts = append(parts, fmt.Sprintf("%s %s (locked %s)", d.Field, d.Actual, d.Locked))
	}
	return "turn 1 differs from harness lock " + lock + ": " + strings.Join(parts, ", ")
}

// recordDrift puts a non-empty drift on the session's events and the
// turn's warnings, and under HANGAR_HARNESS_DRIFT=fail ends a turn that
// would have completed as failed, harness_drift.
func (m *Manager) recordDrift(ctx context.Context, s *store.Session, number int, drift []store.Drift, res *turnResult) {
	res.drift = drift
	if len(drift) == 0 {
		return
	}
	text := driftText(s.HarnessLock, drift)
	data, _ := json.Marshal(map[string]any{"lock": s.HarnessLock, "drift": drift})
	m.appendStoreEvents(ctx, s.Name, []store.Event{{Turn: number, Kind: store.EventHarnessDrift, Text: text, DataJSON: string(data)}})
	res.warnings = append(res.warnings, text)
	m.log.WarnContext(ctx, "harness drift", "session", s.Name, "lock", s.HarnessLock, "drift", text)
	if m.cfg.HarnessDrift == "fail" {
		switch res.outcome {
		case store.OutcomeCompleted, store.OutcomeNeedsInput, "":
			res.outcome, res.reason, res.question = store.OutcomeFailed, reasonHarnessDrift, nil
		}
	}
}
