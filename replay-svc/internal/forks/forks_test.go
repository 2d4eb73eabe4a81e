package forks_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/replay-svc/internal/forks"
	"github.com/hangar-dev/hangar/replay-svc/internal/store"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	m := forks.New(forks.Options{})
	f, err := m.Validate(&replayv1.ForkRunRequest{Run: "ses-a.run-1", AtSeq: 3})
	if err != nil {
		t.Fatal(err)
	}
	if f.Continuations != 1 || f.OnDivergence != replayv1.OnDivergence_ON_DIVERGENCE_STOP || f.Budget.GetMaxCostUsd() != forks.DefaultBudget {
		t.Errorf("defaults: %+v", f)
	}
	if f, _ := m.Validate(&replayv1.ForkRunRequest{Run: "r", Continuations: proto.Int32(0)}); f.Continuations != 0 {
		t.Errorf("continuations 0 kept as %d", f.Continuations)
	}
	bad := []struct {
		req   *replayv1.ForkRunRequest
		code  codes.Code
		field string
	}{
		{&replayv1.ForkRunRequest{}, codes.InvalidArgument, "run"},
		{&replayv1.ForkRunRequest{Run: "r", AtSeq: -1}, codes.InvalidArgument, "at_seq"},
		{&replayv1.ForkRunRequest{Run: "r", Continuations: proto.Int32(11)}, codes.InvalidArgument, "continuations"},
		{&replayv1.ForkRunRequest{Run: "r", Continuations: proto.Int32(-1)}, codes.InvalidArgument, "continuations"},
		{&replayv1.ForkRunRequest{Run: "r", OnDivergence: 9}, codes.InvalidArgument, "on_divergence"},
		{&replayv1.ForkRunRequest{Run: "r", Budget: &replayv1.Budget{MaxCostUsd: -1}}, codes.InvalidArgument, "budget"},
		{&replayv1.ForkRunRequest{Run: "r", WaitSeconds: -1}, codes.InvalidArgument, "wait_seconds"},
	}
	for _, b := range bad {
		_, err := m.Validate(b.req)
		st := fault.Status(err)
		if st.Code() != b.code || !strings.Contains(st.Message(), b.field) {
			t.Errorf("%v: %v %q, want %v naming %s", b.req, st.Code(), st.Message(), b.code, b.field)
		}
	}
}

func TestPrompt(t *testing.T) {
	t.Parallel()
	step := func(body string) *gatewayv1.Step {
		return &gatewayv1.Step{Request: &gatewayv1.StepRequest{Body: []byte(body)}}
	}
	tests := []struct{ name, body, want string }{
		{"claude with reminders", `{"messages":[{"role":"user","content":[{"type":"text","text":"<system-reminder>\nctx\n</system-reminder>"},{"type":"text","text":"Please do it."},{"type":"text","text":"<system-reminder>git</system-reminder>"}]}]}`, "Please do it."},
		{"anthropic string", `{"messages":[{"role":"user","content":"Fix the test"}]}`, "Fix the test"},
		{"codex items", `{"input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"<permissions instructions>"}]},{"type":"message","role":"user","content":[{"type":"input_text","text":"# AGENTS.md instructions"}]},{"type":"message","role":"user","content":[{"type":"input_text","text":"<environment_context>cwd</environment_context>"}]},{"type":"message","role":"user","content":[{"type":"input_text","text":"Do the task"}]}]}`, "Do the task"},
		{"chat", `{"messages":[{"role":"system","content":"sys"},{"role":"user","content":[{"type":"text","text":"Hello pi"}]}]}`, "Hello pi"},
		{"responses string", `{"input":"Just this"}`, "Just this"},
		{"none", `{"messages":[{"role":"assistant","content":"x"}]}`, ""},
		{"not json", `{`, ""},
	}
	for _, tc := range tests {
		if got := forks.Prompt(step(tc.body)); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// taintedGateway serves one tainted run of session "src" and its tape.
type taintedGateway struct{ forks.Gateway }

func (taintedGateway) GetRun(_ context.Context, in *gatewayv1.GetRunRequest, _ ...grpc.CallOption) (*gatewayv1.GetRunResponse, error) {
	if in.GetRun() != "src.run-1" {
		return nil, status.Error(codes.NotFound, "no such run")
	}
	return &gatewayv1.GetRunResponse{Run: &gatewayv1.Run{Id: "src.run-1", Session: "src", Turn: 1, Harness: "claude", Tainted: true}}, nil
}

func (taintedGateway) GetTape(context.Context, *gatewayv1.GetTapeRequest, ...grpc.CallOption) (*gatewayv1.GetTapeResponse, error) {
	step := &gatewayv1.Step{Seq: 1, Request: &gatewayv1.StepRequest{Body: []byte(`{"messages":[{"role":"user","content":"Fix it"}]}`)}}
	return &gatewayv1.GetTapeResponse{Steps: []*gatewayv1.Step{step, {Seq: 2}}}, nil
}

type srcSessions struct{ forks.Sessions }

func (srcSessions) GetSession(context.Context, *sessionv1.GetSessionRequest, ...grpc.CallOption) (*sessionv1.GetSessionResponse, error) {
	return &sessionv1.GetSessionResponse{Session: &sessionv1.Session{Name: "src"}}, nil
}

// TestTaintedFork: a fork of a run whose tape is tainted, and each of its
// trials, say tainted, in the answer and in the record.
func TestTaintedFork(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, f := startFork(t, taintedGateway{}, 3)
	check := func(where string, f *replayv1.Fork) {
		if !f.GetTainted() || len(f.GetTrials()) != 3 {
			t.Errorf("%s: fork tainted %v, %d trials", where, f.GetTainted(), len(f.GetTrials()))
		}
		for _, tr := range f.GetTrials() {
			if !tr.GetTainted() {
				t.Errorf("%s: trial %s not tainted", where, tr.GetId())
			}
		}
	}
	check("answer", f)
	got, err := st.GetFork(ctx, f.GetFork())
	if err != nil {
		t.Fatal(err)
	}
	check("record", got)
	tr, err := st.GetTrial(ctx, f.GetTrialIds()[1])
	if err != nil || !tr.GetTainted() {
		t.Errorf("trial record: %v %v", tr, err)
	}
}

// antigravityGateway serves one run of session "src" whose harness has no
// model gateway path (Antigravity): it has no tape.
type antigravityGateway struct{ forks.Gateway }

func (antigravityGateway) GetRun(_ context.Context, in *gatewayv1.GetRunRequest, _ ...grpc.CallOption) (*gatewayv1.GetRunResponse, error) {
	if in.GetRun() != "src.run-1" {
		return nil, status.Error(codes.NotFound, "no such run")
	}
	return &gatewayv1.GetRunResponse{Run: &gatewayv1.Run{Id: "src.run-1", Session: "src", Turn: 1, Harness: "antigravity"}}, nil
}

// TestUnreplayedFork: a run whose harness has no gateway path is forked
// to `unreplayed` at once, saying why, with no trial and no tape read, and
// the record says so too.
func TestUnreplayedFork(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, f := startFork(t, antigravityGateway{}, 2)
	check := func(where string, f *replayv1.Fork) {
		if f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_UNREPLAYED || !strings.Contains(f.GetStatusReason(), "antigravity") || len(f.GetTrials()) != 0 || f.GetDivergence() != nil {
			t.Errorf("%s: %v (%q), %d trials, divergence %v", where, f.GetStatus(), f.GetStatusReason(), len(f.GetTrials()), f.GetDivergence())
		}
	}
	check("answer", f)
	got, err := st.GetFork(ctx, f.GetFork())
	if err != nil {
		t.Fatal(err)
	}
	check("record", got)
}

// startFork forks run src.run-1 of gw at step 1 into continuations trials
// on a store of its own, and returns the store and the answer.
func startFork(t *testing.T, gw forks.Gateway, continuations int32) (*store.Store, *replayv1.Fork) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, store.Options{SQLitePath: filepath.Join(t.TempDir(), "replay.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	m := forks.New(forks.Options{Store: st, Gateway: gw, Sessions: srcSessions{}})
	in, err := m.Validate(&replayv1.ForkRunRequest{Run: "src.run-1", AtSeq: 1, Continuations: proto.Int32(continuations)})
	if err != nil {
		t.Fatal(err)
	}
	f, err := m.Start(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	return st, f
}
