package command_test

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/command"
)

// -update rewrites testdata/*.golden. Defined here unless another test file
// of the package already did (flag.Bool would panic on a second definition).
func init() {
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite testdata/*.golden from the current output")
	}
}

func sessionGoldenUpdating() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

// sessionGolden compares got with testdata/NAME.golden (or rewrites it with
// -update).
func sessionGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if sessionGoldenUpdating() {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to create it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test -update rewrites it)\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// sessionNow is the clock the golden files were made with.
var sessionNow = time.Date(2026, 11, 10, 15, 0, 0, 0, time.UTC)

func sessionAt(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(sessionNow.Add(d)) }

func sessionTurns() []*sessionv1.Turn {
	return []*sessionv1.Turn{
		{
			Number: 1, Message: "build the onboarding flow; start with the signup form", Harness: sessionv1.Harness_HARNESS_CLAUDE,
			Outcome: sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED, Summary: "Added a signup form with validation\nand a test.",
			Result:    "The signup form is in src/signup.tsx.",
			Usage:     &sessionv1.Usage{InputTokens: 45210, OutputTokens: 3120, CacheReadTokens: 120000, CacheWriteTokens: 8000, CostUsd: 0.4213, ModelCalls: 12},
			StartedAt: sessionAt(-50 * time.Hour), EndedAt: sessionAt(-50*time.Hour + 3*time.Minute + 12*time.Second), CheckpointId: "cp-0a1b2c3d",
		},
		{
			Number: 2, Message: "use the existing Button component", Harness: sessionv1.Harness_HARNESS_CODEX,
			Outcome: sessionv1.TurnOutcome_TURN_OUTCOME_OVER_BUDGET, OutcomeReason: "max_cost_usd 0.5 exceeded",
			Usage:     &sessionv1.Usage{InputTokens: 980, OutputTokens: 45, CostUsd: 0.0042, ModelCalls: 1},
			StartedAt: sessionAt(-40 * time.Minute), EndedAt: sessionAt(-40*time.Minute + 12*time.Second),
			Warnings: []string{"untracked file big.bin (120 MB) skipped"},
		},
		{
			Number: 3, Message: "now add the email verification step", Harness: sessionv1.Harness_HARNESS_CODEX,
			Outcome:   sessionv1.TurnOutcome_TURN_OUTCOME_NEEDS_INPUT,
			Question:  &sessionv1.Question{Id: "q-1", Text: "Which email provider should I use?", Turn: 3, AskedAt: sessionAt(-5 * time.Minute)},
			Usage:     &sessionv1.Usage{InputTokens: 2_400_000, OutputTokens: 1500, CostUsd: 1.5, ModelCalls: 3},
			StartedAt: sessionAt(-10 * time.Minute), EndedAt: sessionAt(-5 * time.Minute),
		},
	}
}

func sessionFull() *sessionv1.Session {
	return &sessionv1.Session{
		Name: "onboarding", Environment: "early-signal", Harness: sessionv1.Harness_HARNESS_CODEX, Branch: "hangar/session/onboarding", BaseCommit: "3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a",
		Model: "gpt-5-codex", State: sessionv1.SessionState_SESSION_STATE_NEEDS_INPUT, StateReason: "the agent asked a question",
		StateChangedAt: sessionAt(-5 * time.Minute), IdleMinutes: proto.Int32(240), ConversationId: "3f2a9c",
		CreatedAt: sessionAt(-50 * time.Hour), LastActiveAt: sessionAt(-5 * time.Minute),
		Turns: sessionTurns(),
		Checkpoints: []*sessionv1.SessionCheckpoint{
			{Id: "cp-9f8e7d6c", CreatedAt: sessionAt(-5 * time.Minute), Reason: "after_turn", Turn: 3, SizeBytes: 3 << 20},
			{Id: "cp-5e6f7a8b", CreatedAt: sessionAt(-30 * time.Hour), Damaged: "checkpoint cp-5e6f7a8b is damaged: its data was modified, truncated or lost"},
			{Id: "cp-0a1b2c3d", CreatedAt: sessionAt(-50*time.Hour + 3*time.Minute), Reason: "after_turn", Turn: 1, SizeBytes: 812, Warnings: []string{"node_modules skipped (ignored)"}},
		},
		ResumeCommand: "codex exec resume 3f2a9c",
		Holds: []*sessionv1.Hold{
			{Id: "h-1", Owner: "terminal t-77", Kind: sessionv1.HoldKind_HOLD_KIND_TERMINAL, Description: "hangar sb attach", AcquiredAt: sessionAt(-3 * time.Minute), ExpiresAt: sessionAt(45 * time.Second)},
		},
		Usage:     &sessionv1.Usage{InputTokens: 2_446_190, OutputTokens: 4665, CacheReadTokens: 120000, CacheWriteTokens: 8000, CostUsd: 1.9255, ModelCalls: 16},
		SandboxId: "sb-4c5d6e7f",
		Question:  &sessionv1.Question{Id: "q-1", Text: "Which email provider should I use?", Turn: 3, AskedAt: sessionAt(-5 * time.Minute)},
		Budget:    &sessionv1.Budget{MaxCostUsd: 0.5, MaxTokens: 200000, MaxMinutes: 30},
		Transitions: []*sessionv1.StateTransition{
			{From: sessionv1.SessionState_SESSION_STATE_SUSPENDED, To: sessionv1.SessionState_SESSION_STATE_RESUMING, Reason: "send", At: sessionAt(-10*time.Minute - 8*time.Second)},
			{From: sessionv1.SessionState_SESSION_STATE_RESUMING, To: sessionv1.SessionState_SESSION_STATE_RUNNING, Reason: "turn 3", At: sessionAt(-10 * time.Minute)},
			{From: sessionv1.SessionState_SESSION_STATE_RUNNING, To: sessionv1.SessionState_SESSION_STATE_NEEDS_INPUT, Reason: "the agent asked a question", At: sessionAt(-5 * time.Minute)},
		},
	}
}

func TestSessionGetGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    *sessionv1.Session
	}{
		{"session_get_full", sessionFull()},
		{"session_get_new", &sessionv1.Session{
			Name: "fresh", Environment: "local", Harness: sessionv1.Harness_HARNESS_CLAUDE, Branch: "hangar/session/fresh",
			State: sessionv1.SessionState_SESSION_STATE_SUSPENDED, StateReason: "created", StateChangedAt: sessionAt(-2 * time.Minute),
			CreatedAt: sessionAt(-2 * time.Minute), LastActiveAt: sessionAt(-2 * time.Minute), Usage: &sessionv1.Usage{},
			Budget: &sessionv1.Budget{},
		}},
		{"session_get_idle", &sessionv1.Session{
			Name: "api", Environment: "local", Harness: sessionv1.Harness_HARNESS_PI, Branch: "feature/api", Repo: "https://github.com/acme/api",
			State: sessionv1.SessionState_SESSION_STATE_IDLE, StateReason: "turn 1 completed", StateChangedAt: sessionAt(-time.Minute),
			CreatedAt: sessionAt(-400 * 24 * time.Hour), LastActiveAt: sessionAt(-time.Minute), SandboxId: "sb-1",
			SuspendAt: sessionAt(29 * time.Minute), ParentId: "onboarding", ForkedFromCheckpoint: "cp-9f8e7d6c",
			Turns: []*sessionv1.Turn{
				{Number: 1, Harness: sessionv1.Harness_HARNESS_CODEX, Inherited: true, Outcome: sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED, Message: "inherited work"},
				{Number: 2, Harness: sessionv1.Harness_HARNESS_PI, Message: "still going", StartedAt: sessionAt(-30 * time.Second), Usage: &sessionv1.Usage{}},
			},
			Usage: &sessionv1.Usage{},
		}},
		{"session_get_never_idle", &sessionv1.Session{
			Name: "night", Environment: "local", Harness: sessionv1.Harness_HARNESS_ANTIGRAVITY, Branch: "hangar/session/night",
			State: sessionv1.SessionState_SESSION_STATE_IDLE, IdleMinutes: proto.Int32(0), SandboxId: "sb-2",
			CreatedAt: sessionAt(-time.Hour), LastActiveAt: sessionAt(-time.Hour),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := command.SessionFormat(&b, tc.s, sessionNow); err != nil {
				t.Fatal(err)
			}
			sessionGolden(t, tc.name, b.String())
		})
	}
}

func TestSessionListGolden(t *testing.T) {
	list := []*sessionv1.Session{
		{Name: "onboarding", State: sessionv1.SessionState_SESSION_STATE_RUNNING, Harness: sessionv1.Harness_HARNESS_CLAUDE, Environment: "early-signal", LastActiveAt: sessionAt(-3 * time.Second),
			TurnCount: 3, Usage: &sessionv1.Usage{CostUsd: 1.9255}},
		{Name: "api", State: sessionv1.SessionState_SESSION_STATE_NEEDS_INPUT, Harness: sessionv1.Harness_HARNESS_CODEX, Environment: "local", LastActiveAt: sessionAt(-42 * time.Minute)},
		{Name: "old-experiment", State: sessionv1.SessionState_SESSION_STATE_SUSPENDED, Harness: sessionv1.Harness_HARNESS_PI, Environment: "local", LastActiveAt: sessionAt(-9 * 24 * time.Hour)},
		{Name: "never-active", State: sessionv1.SessionState_SESSION_STATE_ARCHIVED, Harness: sessionv1.Harness_HARNESS_ANTIGRAVITY, Environment: "local", CreatedAt: sessionAt(-3*time.Hour - 20*time.Minute)},
	}
	var b bytes.Buffer
	if err := command.SessionFormatList(&b, list, sessionNow); err != nil {
		t.Fatal(err)
	}
	if err := command.SessionFormatList(&b, nil, sessionNow); err != nil {
		t.Fatal(err)
	}
	sessionGolden(t, "session_list", b.String())
}

func TestSessionEventsGolden(t *testing.T) {
	data, err := structpb.NewStruct(map[string]any{"type": "raw"})
	if err != nil {
		t.Fatal(err)
	}
	events := []*sessionv1.Event{
		{Seq: 1, Turn: 1, Time: sessionAt(-26 * time.Hour), Kind: sessionv1.EventKind_EVENT_KIND_STATE_CHANGE, Text: "suspended → resuming"},
		{Seq: 2, Turn: 1, Time: sessionAt(-2 * time.Minute), Kind: sessionv1.EventKind_EVENT_KIND_MESSAGE, Text: "I'll look at the form first.\nThen write a test.\n", Data: data},
		{Seq: 3, Turn: 1, Time: sessionAt(-110 * time.Second), Kind: sessionv1.EventKind_EVENT_KIND_COMMAND, Text: "go test ./...", ExitCode: 1},
		{Seq: 4, Turn: 1, Time: sessionAt(-100 * time.Second), Kind: sessionv1.EventKind_EVENT_KIND_COMMAND, Text: "go vet ./..."},
		{Seq: 5, Turn: 1, Time: sessionAt(-90 * time.Second), Kind: sessionv1.EventKind_EVENT_KIND_FILE_CHANGE, Path: "src/signup.tsx", Text: "modified"},
		{Seq: 6, Turn: 1, Time: sessionAt(-89 * time.Second), Kind: sessionv1.EventKind_EVENT_KIND_FILE_CHANGE, Path: "src/new.tsx"},
		{Seq: 7, Turn: 1, Time: sessionAt(-80 * time.Second), Kind: sessionv1.EventKind_EVENT_KIND_USAGE, Usage: &sessionv1.Usage{InputTokens: 1234, OutputTokens: 56, CostUsd: 0.012, ModelCalls: 1}},
		{Seq: 8, Turn: 1, Time: sessionAt(-70 * time.Second), Kind: sessionv1.EventKind_EVENT_KIND_ERROR, Text: "rate limited; retrying"},
		{Seq: 9, Time: sessionAt(-60 * time.Second), Kind: sessionv1.EventKind_EVENT_KIND_CHECKPOINT, Text: "cp-1 (after_turn)"},
		{Seq: 10, Turn: 2, Time: sessionAt(-400 * 24 * time.Hour), Kind: sessionv1.EventKind_EVENT_KIND_HARNESS_DRIFT, Text: "model differs"},
		{Seq: 11, Turn: 2, Kind: sessionv1.EventKind_EVENT_KIND_UNSPECIFIED, Text: "no time"},
	}
	var b strings.Builder
	for _, e := range events {
		b.WriteString(command.SessionFormatEvent(e, sessionNow) + "\n")
	}
	sessionGolden(t, "session_events", b.String())
}

func TestSessionTurnEndGolden(t *testing.T) {
	turns := sessionTurns()
	turns[0].Artifacts = []*sessionv1.Artifact{{Path: "report.md", Turn: 1}, {Path: "shots/signup.png", Turn: 1}}
	sr, err := structpb.NewStruct(map[string]any{"ok": true, "files": 2})
	if err != nil {
		t.Fatal(err)
	}
	turns[0].StructuredResult = sr
	failed := &sessionv1.Turn{Number: 4, Outcome: sessionv1.TurnOutcome_TURN_OUTCOME_FAILED, OutcomeReason: "the claude CLI exited with code 1",
		StartedAt: sessionAt(0), EndedAt: sessionAt(75 * time.Minute)}
	interrupted := &sessionv1.Turn{Number: 5, Outcome: sessionv1.TurnOutcome_TURN_OUTCOME_INTERRUPTED, Result: "partial answer\n\n"}
	var b bytes.Buffer
	for _, tr := range append(turns, failed, interrupted) {
		command.SessionWriteTurnEnd(&b, "onboarding", tr)
		b.WriteString("----\n")
	}
	s := sessionFull()
	command.SessionWriteCreated(&b, &sessionv1.CreateSessionResponse{Session: s, Repository: "/home/me/shop", BaseCommit: "3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a"})
	s.State = sessionv1.SessionState_SESSION_STATE_RESUMING
	command.SessionWriteCreated(&b, &sessionv1.CreateSessionResponse{Session: s, Turn: &sessionv1.Turn{Number: 1, Harness: sessionv1.Harness_HARNESS_CLAUDE},
		Repository: "https://user:secret@example.com/shop.git", BaseCommit: "3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a"})
	command.SessionWriteTurnStarted(&b, s, &sessionv1.Turn{Number: 3, Harness: sessionv1.Harness_HARNESS_CODEX})
	sessionGolden(t, "session_turn_end", b.String())
}

func TestSessionOutcomeLine(t *testing.T) {
	got := command.SessionFormatOutcome(&sessionv1.Turn{Number: 2, Outcome: sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED,
		StartedAt: sessionAt(0), EndedAt: sessionAt(12 * time.Second), Usage: &sessionv1.Usage{ModelCalls: 3, CostUsd: 0.02}})
	if want := "turn 2 completed in 12s · 3 calls · $0.02"; got != want {
		t.Errorf("outcome line = %q, want %q", got, want)
	}
}

func TestSessionArtifactsAndApprovalsGolden(t *testing.T) {
	var b bytes.Buffer
	if err := command.SessionFormatArtifacts(&b, []*sessionv1.Artifact{
		{Path: "report.md", SizeBytes: 2300, Turn: 1, ContentType: "text/markdown", Sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
		{Path: "shots/signup.png", SizeBytes: 5 << 20, Turn: 2},
	}); err != nil {
		t.Fatal(err)
	}
	if err := command.SessionFormatArtifacts(&b, nil); err != nil {
		t.Fatal(err)
	}
	if err := command.SessionFormatApprovals(&b, []*sessionv1.Approval{
		{Id: "ap-1", Turn: 2, ToolName: "Bash", InputJson: `{"command":"rm -rf build && make release VERSION=1.2.3 CHANNEL=stable TARGETS=linux,darwin,windows"}`, State: sessionv1.ApprovalState_APPROVAL_STATE_PENDING, RequestedAt: sessionAt(-30 * time.Second)},
		{Id: "ap-0", Turn: 2, ToolName: "Write", InputJson: `{"path":"a.txt"}`, State: sessionv1.ApprovalState_APPROVAL_STATE_ALLOWED, RequestedAt: sessionAt(-5 * time.Minute)},
	}, sessionNow); err != nil {
		t.Fatal(err)
	}
	if err := command.SessionFormatApprovals(&b, nil, sessionNow); err != nil {
		t.Fatal(err)
	}
	sessionGolden(t, "session_artifacts_approvals", b.String())
}

func TestSessionTurnExit(t *testing.T) {
	for _, tc := range []struct {
		outcome sessionv1.TurnOutcome
		code    int
	}{
		{sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED, 0},
		{sessionv1.TurnOutcome_TURN_OUTCOME_NEEDS_INPUT, 0},
		{sessionv1.TurnOutcome_TURN_OUTCOME_FAILED, 1},
		{sessionv1.TurnOutcome_TURN_OUTCOME_OVER_BUDGET, 2},
		{sessionv1.TurnOutcome_TURN_OUTCOME_INTERRUPTED, 3},
	} {
		err := command.SessionTurnExit(&sessionv1.Turn{Outcome: tc.outcome})
		var exit *command.ExitError
		switch {
		case tc.code == 0 && err != nil:
			t.Errorf("%v: exit %v, want success", tc.outcome, err)
		case tc.code != 0 && (!errors.As(err, &exit) || exit.Code != tc.code):
			t.Errorf("%v: exit %v, want code %d", tc.outcome, err, tc.code)
		}
	}
}

// sessionLockedBuffer is a buffer the spinner goroutine and the test share.
type sessionLockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *sessionLockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *sessionLockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestSessionProgressSpinsOnlyOnATerminal(t *testing.T) {
	clock := func() time.Time { return sessionNow }

	var plain sessionLockedBuffer
	p := command.SessionNewTurnProgress(&plain, false, "turn 1 running", clock)
	p.Println("12:00:00  command       ls")
	p.Stop()
	p.Stop()
	if got, want := plain.String(), "12:00:00  command       ls\n"; got != want {
		t.Errorf("output off a terminal = %q, want the lines alone %q", got, want)
	}

	var tty sessionLockedBuffer
	p = command.SessionNewTurnProgress(&tty, true, "turn 1 running", clock)
	p.Println("event one")
	p.Stop()
	got := tty.String()
	if !strings.Contains(got, "event one\n") || strings.Contains(got, "running · 0sevent") {
		t.Errorf("on a terminal the event is not on a line of its own: %q", got)
	}
	if !strings.Contains(got, "turn 1 running · 0s") {
		t.Errorf("on a terminal no spinner line: %q", got)
	}
	if !strings.HasSuffix(got, "\r\x1b[K") {
		t.Errorf("the spinner line is not cleared at the end: %q", got)
	}
}
