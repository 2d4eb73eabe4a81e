package e2e_test

import (
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/proto"

	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/client"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// countingPage serves a page over HTTPS on the host's loopback (WebFetch
// upgrades http to https) that counts its hits, and returns its URL, the
// certificate as PEM (for NODE_EXTRA_CA_CERTS) and the count.
func countingPage(t *testing.T) (string, []byte, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := hits.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "page-hit-%d\n", n)
	}))
	t.Cleanup(srv.Close)
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return srv.URL + "/page", cert, &hits
}

// TestForkAtStepWebFetchAnsweredFromTape: a Claude Code run fetches a page
// of a server on the host with WebFetch (which counts its hits; the
// recorded run's environment has egress), then runs a shell step. What
// the CLI needs to fetch offline, all in the repository's
// .claude/settings.json: skipWebFetchPreflight (else it asks
// api.anthropic.com/api/web/domain_info about the host first and gives
// up when that fails), the page's certificate in NODE_EXTRA_CA_CERTS
// (http is upgraded to https), ENABLE_TOOL_SEARCH false (else WebFetch is
// a deferred tool behind ToolSearch), and a host with a dot (an IP
// address does). WebFetch then asks a small model about the page: a model
// call of the run's own, taped between the step that called WebFetch and
// the request that carries its output. Replayed (verified at the last
// step, and forked before the shell step with a live trial), the sealed
// sandbox fetches nothing and its CLI makes no side call: the gateway
// passes over the taped side call, answers the WebFetch output from the
// tape, and the trial goes live on the taped answer. The page is hit once
// in all (the recorded run's).
func TestForkAtStepWebFetchAnsweredFromTape(t *testing.T) {
	url, cert, hits := countingPage(t)
	const summary = "The page says fetched-page."
	script := scripted.Script{Rules: []scripted.Rule{
		{Name: "trial-done", Tool: "Bash", ToolResult: "trial-done", Answer: scripted.Answer{Text: "Trial done."}},
		{Name: "fetch-done", Tool: "Bash", ToolResult: "step-1-done", Answer: scripted.Answer{Text: "WebFetch task done."}},
		{Name: "after-fetch", Tool: "Bash", ToolResult: "fetched-page", Answer: scripted.Answer{Text: "Fetched.", ToolCall: &scripted.ToolCall{Name: "Bash", Input: map[string]any{"command": replayStepCmd(1)}}}},
		{Name: "continue", Tool: "Bash", Prompt: "(?i)continue from where you stopped", Answer: scripted.Answer{ToolCall: &scripted.ToolCall{Name: "Bash", Input: map[string]any{"command": replayTrialCmd}}}},
		{Name: "fetch", Tool: "WebFetch", Prompt: "(?i)webfetch task", LastIsToolResult: scripted.Bool(false), Answer: scripted.Answer{Text: "Fetching.",
			ToolCall: &scripted.ToolCall{Name: "WebFetch", Input: map[string]any{"url": url, "prompt": "What does the page say?"}}}},
	}, Default: &scripted.Answer{Text: summary}} // WebFetch's small-model call about the page (no tools)
	s := startStack(t, stackOptions{script: &script, vars: map[string]string{"HANGAR_CACHE_STAGGER_SECONDS": "0"}})
	repo := gitRepo(t, map[string]string{
		"page-ca.pem":           string(cert),
		".claude/settings.json": `{"skipWebFetchPreflight": true, "env": {"ENABLE_TOOL_SEARCH": "false", "NODE_EXTRA_CA_CERTS": "page-ca.pem"}}`,
	})
	s.applyEnvironment(t, "e2e", repo, 0, sandboxv1.Egress_EGRESS_FULL)
	conn, err := client.Endpoint{URL: s.env["HANGAR_URL"], Token: s.env["HANGAR_TOKEN"]}.Dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	rs := &replayStack{stack: s, replay: replayv1.NewReplayServiceClient(conn)}

	run, steps := rs.record(t, "rec-webfetch", sessionv1.Harness_HARNESS_CLAUDE, "Please do the webfetch task.")
	if got := hits.Load(); got != 1 {
		t.Fatalf("the recorded run fetched the page %d times, want 1", got)
	}
	// The request that carries WebFetch's output, and the side call
	// before it (no tools offered).
	after := int32(0)
	for _, st := range steps {
		b := string(st.GetRequest().GetBody())
		if strings.Contains(b, "tool_result") && strings.Contains(b, "fetched-page") {
			after = st.GetSeq()
			break
		}
	}
	if after < 3 || int(after) >= len(steps) {
		t.Fatalf("no request of %s but the last carries the WebFetch output after its side call (%d steps, at %d)", run, len(steps), after)
	}
	if side := string(steps[after-2].GetRequest().GetBody()); !strings.Contains(side, "page-hit-1") {
		t.Fatalf("step %d is not WebFetch's side call about the page: %.300s", after-1, side)
	}

	// The whole run replayed strictly: verified, the page not fetched.
	v := rs.fork(t, &replayv1.ForkRunRequest{Run: run, AtSeq: int32(len(steps)), Continuations: proto.Int32(0)})
	if v.GetStatus() != replayv1.ForkStatus_FORK_STATUS_VERIFIED || v.GetDivergence() != nil {
		t.Errorf("verify at %d: %v (%s), divergence %v", len(steps), v.GetStatus(), v.GetStatusReason(), v.GetDivergence())
	}
	// The replay made no side call: its run taped one step fewer.
	if psteps := prefixTapeT(t, rs, v); len(psteps) >= len(steps) {
		t.Errorf("the prefix run taped %d steps, want fewer than the recording's %d (no side call)", len(psteps), len(steps))
	}

	// Forked at the side call, one live trial: the prefix is clean and the
	// trial goes on live from the taped WebFetch output.
	f := rs.fork(t, &replayv1.ForkRunRequest{Run: run, AtSeq: after - 1, Continuations: proto.Int32(1)})
	if f.GetStatus() != replayv1.ForkStatus_FORK_STATUS_FORKED || f.GetDivergence() != nil {
		t.Errorf("fork at %d: %v (%s), divergence %v", after-1, f.GetStatus(), f.GetStatusReason(), f.GetDivergence())
	}
	// The live model was shown the tape's WebFetch output (its answer to
	// "fetched-page" is the shell step), not the replay's failed fetch.
	trialsSawTapedOutput(t, rs, f, "WebFetch")
	if got := hits.Load(); got != 1 {
		t.Errorf("the page was fetched %d times, want 1 (the recorded run's only): a replay fetched it again", got)
	}
}
