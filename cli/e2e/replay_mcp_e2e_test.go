package e2e_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/client"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// countingMCP serves an MCP server on the host's loopback (streamable
// HTTP, /mcp) with one tool, count, which counts its calls and answers
// "counted-<n>". It returns the port and the count.
func countingMCP(t *testing.T) (int, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	srv := mcpsdk.NewServer(&mcpsdk.Implementation{Name: "counter", Version: "1"}, nil)
	mcpsdk.AddTool(srv, &mcpsdk.Tool{Name: "count", Description: "Counts a call."},
		func(context.Context, *mcpsdk.CallToolRequest, struct{}) (*mcpsdk.CallToolResult, any, error) {
			n := calls.Add(1)
			return &mcpsdk.CallToolResult{Content: []mcpsdk.Content{&mcpsdk.TextContent{Text: fmt.Sprintf("counted-%d", n)}}}, nil, nil
		})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpsdk.NewStreamableHTTPHandler(func(*http.Request) *mcpsdk.Server { return srv }, nil))
	hs := &http.Server{Handler: mux}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().(*net.TCPAddr).Port, &calls
}

// TestForkAtStepMCPAnsweredFromTape: a Claude Code run uses an MCP server
// of its repository's .mcp.json (an HTTP server on the host, which counts
// its calls; the recorded run's environment has egress), then a shell
// step. Replayed (verified at the last step, and forked before the shell
// step with a live trial), the MCP call is answered from the tape: the
// prefix is clean and the server is never called again.
func TestForkAtStepMCPAnsweredFromTape(t *testing.T) {
	port, calls := countingMCP(t)
	const mcpTool = "mcp__counter__count"
	script := scripted.Script{Rules: []scripted.Rule{
		{Name: "trial-done", Tool: "Bash", ToolResult: "trial-done", Answer: scripted.Answer{Text: "Trial done."}},
		{Name: "mcp-done", Tool: "Bash", ToolResult: "step-1-done", Answer: scripted.Answer{Text: "MCP task done."}},
		{Name: "after-count", Tool: "Bash", ToolResult: "counted-", Answer: scripted.Answer{Text: "Counted.", ToolCall: &scripted.ToolCall{Name: "Bash", Input: map[string]any{"command": replayStepCmd(1)}}}},
		{Name: "continue", Tool: "Bash", Prompt: "(?i)continue from where you stopped", Answer: scripted.Answer{ToolCall: &scripted.ToolCall{Name: "Bash", Input: map[string]any{"command": replayTrialCmd}}}},
		{Name: "count", Tool: mcpTool, Prompt: "(?i)mcp task", LastIsToolResult: scripted.Bool(false), Answer: scripted.Answer{Text: "Counting.", ToolCall: &scripted.ToolCall{Name: mcpTool, Input: map[string]any{}}}},
	}, Default: &scripted.Answer{Text: "OK."}}
	s := startStack(t, stackOptions{script: &script, vars: map[string]string{"HANGAR_CACHE_STAGGER_SECONDS": "0"}})
	repo := gitRepo(t, map[string]string{
		".mcp.json": fmt.Sprintf(`{"mcpServers": {"counter": {"type": "http", "url": "http://127.0.0.1:%d/mcp"}}}`, port),
		// Project servers are used without asking; MCP tools are offered
		// directly (not behind a tool search).
		".claude/settings.json": `{"enableAllProjectMcpServers": true, "env": {"ENABLE_TOOL_SEARCH": "false"}}`,
	})
	s.applyEnvironment(t, "e2e", repo, 0, sandboxv1.Egress_EGRESS_FULL)
	conn, err := client.Endpoint{URL: s.env["HANGAR_URL"], Token: s.env["HANGAR_TOKEN"]}.Dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	rs := &replayStack{stack: s, replay: replayv1.NewReplayServiceClient(conn)}

	run, steps := rs.record(t, "rec-mcp", sessionv1.Harness_HARNESS_CLAUDE, "Please do the mcp task.")
	if got := calls.Load(); got != 1 {
		t.Fatalf("the recorded run called the MCP server %d times, want 1", got)
	}
	// The request that carries the MCP call's output (the server's answer).
	after := int32(0)
	for _, st := range steps {
		if strings.Contains(string(st.GetRequest().GetBody()), "counted-1") {
			after = st.GetSeq()
			break
		}
	}
	if after == 0 || int(after) >= len(steps) {
		t.Fatalf("no request of %s but the last carries the MCP output (%d steps)", run, len(steps))
	}

	// The whole run replayed strictly: verified, the server not called.
	v := rs.fork(t, &replayv1.ForkRunRequest{Run: run, AtSeq: int32(len(steps)), Continuations: proto.Int32(0)})
	if v.GetStatus() != replayv1.ForkStatus_FORK_STATUS_VERIFIED || v.GetDivergence() != nil {
		t.Errorf("verify at %d: %v (%s), divergence %v", len(steps), v.GetStatus(), v.GetStatusReason(), v.GetDivergence())
	}
	// The replay's CLI made the call (its tape's request has the call's
	// result, whatever the sealed sandbox gave it) and the gateway
	// compared the tape's output in its place.
	if psteps := prefixTapeT(t, rs, v); len(psteps) < int(after) {
		t.Errorf("the prefix run taped %d steps, want at least %d", len(psteps), after)
	}

	// Forked at the MCP call's answer, one live trial: the prefix is clean
	// and the trial goes on live (its continuation runs a shell step).
	f := rs.fork(t, &replayv1.ForkRunRequest{Run: run, AtSeq: after - 1, Continuations: proto.Int32(1)})
	if f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_FORKED || f.GetDivergence() != nil {
		t.Errorf("fork at %d: %v (%s), divergence %v", after-1, f.GetStatus(), f.GetStatusReason(), f.GetDivergence())
	}
	// The live model was shown the tape's MCP output (its answer to
	// "counted-" is the shell step), not the replay's failed call (the
	// continuation's own task, trial.txt).
	trialsSawTapedOutput(t, rs, f, "MCP")
	if got := calls.Load(); got != 1 {
		t.Errorf("the MCP server was called %d times, want 1 (the recorded run's only): a replay ran the tool again", got)
	}
}

// prefixTapeT is the tape of the run that rebuilt f's prefix.
func prefixTapeT(t *testing.T, rs *replayStack, f *replayv1.Fork) []*gatewayv1.Step {
	t.Helper()
	ctx := context.Background()
	runs, err := rs.gateway.ListRuns(ctx, &gatewayv1.ListRunsRequest{Session: f.GetPrefixSession()})
	if err != nil || len(runs.GetRuns()) == 0 {
		t.Fatalf("runs of %s: %v %v", f.GetPrefixSession(), runs, err)
	}
	tape, err := rs.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: runs.GetRuns()[0].GetId()})
	if err != nil {
		t.Fatal(err)
	}
	return tape.GetSteps()
}

// trialsSawTapedOutput checks that each of fork f's trials completed and
// that its first live answer is the one to the tape's output of the call
// with outside effects (what, for messages): the scripted shell step that
// follows that output ("steps.txt"), not the continuation's own task that
// the replay's failed call would have led to; and that it was not
// replayed.
func trialsSawTapedOutput(t *testing.T, rs *replayStack, f *replayv1.Fork, what string) {
	t.Helper()
	for _, tr := range f.GetTrials() {
		if tr.GetOutcome() != replayv1.TrialOutcome_TRIAL_OUTCOME_COMPLETED {
			t.Errorf("trial %s: %v", tr.GetId(), tr)
			continue
		}
		tape, err := rs.gateway.GetTape(context.Background(), &gatewayv1.GetTapeRequest{Run: tr.GetRun()})
		if err != nil || len(tape.GetSteps()) == 0 {
			t.Fatalf("trial %s's run %s: %v", tr.GetId(), tr.GetRun(), err)
		}
		first := tape.GetSteps()[0]
		answer := ""
		for _, ev := range first.GetResponse().GetEvents() {
			answer += ev.GetData()
		}
		if first.GetReplayed() || !strings.Contains(answer, "steps.txt") {
			t.Errorf("trial %s's first live answer is not the one to the %s output (replayed %v): %s\nrequest: %.2000s", tr.GetId(), what, first.GetReplayed(), answer, first.GetRequest().GetBody())
		}
	}
}
