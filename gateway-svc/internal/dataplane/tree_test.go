package dataplane_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/dataplane"
)

// fakeTrees is a TreeHasher whose hashes come from a function.
type fakeTrees struct {
	mu    sync.Mutex
	hash  func(ctx context.Context, sb *gatewayv1.RunSandbox) (string, error)
	calls int
}

func (f *fakeTrees) TreeHash(ctx context.Context, sb *gatewayv1.RunSandbox) (string, error) {
	f.mu.Lock()
	f.calls++
	hash := f.hash
	f.mu.Unlock()
	return hash(ctx, sb)
}

func (f *fakeTrees) set(hash func(ctx context.Context, sb *gatewayv1.RunSandbox) (string, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hash = hash
}

// TestTreeHashRunsWithTheUpstreamCall: the work tree hash is taken while
// the call goes upstream (the upstream has the request before the hash
// returns), the answer's first byte waits for the hash (the harness could
// change the tree once it has any of the answer), and the tape holds the
// hash as before.
func TestTreeHashRunsWithTheUpstreamCall(t *testing.T) {
	t.Parallel()
	trees := &fakeTrees{}
	treeWait := make(chan string, 1)
	e := newEnv(t, func(o *dataplane.Options) {
		o.Trees = trees
		o.OnTreeWait = func(run string) { treeWait <- run }
	})
	firstByte := make(chan struct{})
	var (
		mu     sync.Mutex
		checks []string
	)
	check := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		checks = append(checks, s)
	}
	trees.set(func(ctx context.Context, sb *gatewayv1.RunSandbox) (string, error) {
		if sb.GetId() != "sb-1" || sb.GetWorkDir() != "/s/work" {
			check("sandbox " + sb.String())
		}
		// The upstream has the call while the hash is being taken.
		select {
		case <-e.gate.arrived:
		case <-time.After(30 * time.Second):
			return "", errors.New("the upstream call waited for the tree hash")
		}
		e.openGate()
		// The upstream answers; the gateway holds the answer's first byte.
		select {
		case <-treeWait:
		case <-time.After(30 * time.Second):
			return "", errors.New("the answer did not wait for the tree hash")
		}
		select {
		case <-firstByte:
			check("the client had the answer's first byte before the tree hash")
		default:
		}
		return "tree-1", nil
	})
	run, tok := e.create(t, &gatewayv1.Run{Sandbox: &gatewayv1.RunSandbox{Id: "sb-1", WorkDir: "/s/work"}})

	req, _ := http.NewRequest(http.MethodPost, e.data.URL+"/v1/messages", strings.NewReader(msg("HOLD hi")))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-api-key", tok)
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.Peek(1); err != nil {
		t.Fatal(err)
	}
	close(firstByte)
	var body strings.Builder
	if _, err := br.WriteTo(&body); err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(body.String(), "message_stop") {
		t.Fatalf("answer: %d %v\n%s", resp.StatusCode, err, body.String())
	}
	mu.Lock()
	for _, c := range checks {
		t.Error(c)
	}
	mu.Unlock()
	st, err := e.tapes.Step(context.Background(), run.GetId(), 1)
	if err != nil || st.GetTreeHash() != "tree-1" {
		t.Errorf("step 1: tree hash %q (err %v), want tree-1", st.GetTreeHash(), err)
	}
}

// TestTreeHashFailureLeavesItOut: a hash that cannot be taken leaves the
// step without one; the call is answered as usual.
func TestTreeHashFailureLeavesItOut(t *testing.T) {
	t.Parallel()
	trees := &fakeTrees{}
	trees.set(func(context.Context, *gatewayv1.RunSandbox) (string, error) { return "", errors.New("no sandbox") })
	e := newEnv(t, func(o *dataplane.Options) { o.Trees = trees })
	run, tok := e.create(t, &gatewayv1.Run{Sandbox: &gatewayv1.RunSandbox{Id: "sb-1", WorkDir: "/s/work"}})
	if ans := e.post(t, "/v1/messages", tok, msg("hi")); ans.status != http.StatusOK {
		t.Fatalf("%d %s", ans.status, ans.body)
	}
	st, err := e.tapes.Step(context.Background(), run.GetId(), 1)
	if err != nil || st.GetTreeHash() != "" || st.GetResponse() == nil {
		t.Errorf("step 1: %v %v", st, err)
	}
	// A run without a sandbox takes no hash.
	_, tok = e.create(t, &gatewayv1.Run{})
	trees.mu.Lock()
	before := trees.calls
	trees.mu.Unlock()
	e.post(t, "/v1/messages", tok, msg("hi"))
	trees.mu.Lock()
	defer trees.mu.Unlock()
	if trees.calls != before {
		t.Errorf("a run without a sandbox took %d tree hashes", trees.calls-before)
	}
}

// TestReplayComparesTheTreeHash: a replayed step's tree hash, taken while
// the request is checked against the tape, is compared with the taped one:
// the same tree is answered from the tape, another is a tree divergence.
func TestReplayComparesTheTreeHash(t *testing.T) {
	t.Parallel()
	trees := &fakeTrees{}
	tree := func(h string) func(context.Context, *gatewayv1.RunSandbox) (string, error) {
		return func(context.Context, *gatewayv1.RunSandbox) (string, error) { return h, nil }
	}
	trees.set(tree("tree-1"))
	e := newEnv(t, func(o *dataplane.Options) { o.Trees = trees })
	sb := &gatewayv1.RunSandbox{Id: "sb-1", WorkDir: "/s/work"}
	rec, tok := e.create(t, &gatewayv1.Run{Session: "ses-rec", Sandbox: sb})
	if ans := e.post(t, "/v1/messages", tok, msg("hi")); ans.status != http.StatusOK {
		t.Fatalf("record: %d %s", ans.status, ans.body)
	}
	upstreamCalls := e.gate.calls.Load()
	for _, c := range []struct {
		tree     string
		replayed bool
	}{{"tree-1", true}, {"tree-2", false}} {
		trees.set(tree(c.tree))
		_, rtok := e.create(t, &gatewayv1.Run{Session: "ses-rp", Sandbox: sb, Replay: &gatewayv1.Replay{TapeRun: rec.GetId(), AtSeq: 1}})
		ans := e.post(t, "/v1/messages", rtok, msg("hi"))
		switch {
		case c.replayed && (ans.status != http.StatusOK || ans.header.Get("x-hangar-replayed") != "true"):
			t.Errorf("same tree: %d %s", ans.status, ans.body)
		case !c.replayed && (ans.status != http.StatusForbidden || !strings.Contains(ans.body, "diverged at step 1 (tree)")):
			t.Errorf("another tree: %d %s", ans.status, ans.body)
		}
	}
	if n := e.gate.calls.Load(); n != upstreamCalls {
		t.Errorf("the replays made %d upstream calls", n-upstreamCalls)
	}
}

// TestOutsideOnlyRunSendsTheTapesOutputs: a run armed outside_only (a
// fork's trial, continuing a replayed prefix) is live from its first call
// (upstream, nothing compared, no divergence), and the output of an MCP
// call its conversation holds, which failed in the replay's sealed
// sandbox, reaches the upstream as the tape's (content and is_error); a
// Bash output is sent as it is.
func TestOutsideOnlyRunSendsTheTapesOutputs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	conv := func(mcpResult, bash string) string {
		return `{"model":"claude-sonnet-4-5","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"go"},` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"mcp__counter__count","input":{}},{"type":"tool_use","id":"t2","name":"Bash","input":{}}]},` +
			`{"role":"user","content":[` + mcpResult + `,{"type":"tool_result","tool_use_id":"t2","content":"` + bash + `"}]}]}`
	}
	rec, tok := e.create(t, &gatewayv1.Run{Session: "ses-rec"})
	if ans := e.post(t, "/v1/messages", tok, conv(`{"type":"tool_result","tool_use_id":"t1","content":"counted-1"}`, "bash-1")); ans.status != http.StatusOK {
		t.Fatalf("record: %d %s", ans.status, ans.body)
	}
	before := e.gate.calls.Load()
	run, rtok := e.create(t, &gatewayv1.Run{Session: "ses-trial", Replay: &gatewayv1.Replay{TapeRun: rec.GetId(), AtSeq: 0, OutsideOnly: true}})
	failed := `{"type":"tool_result","tool_use_id":"t1","is_error":true,"content":"No such tool available: mcp__counter__count"}`
	ans := e.post(t, "/v1/messages", rtok, conv(failed, "bash-2")+"\n")
	if ans.status != http.StatusOK || ans.header.Get("x-hangar-replayed") != "" {
		t.Fatalf("trial call: %d %s (replayed %q)", ans.status, ans.body, ans.header.Get("x-hangar-replayed"))
	}
	if n := e.gate.calls.Load(); n != before+1 {
		t.Fatalf("the trial's call made %d upstream calls, want 1", n-before)
	}
	e.gate.mu.Lock()
	sent := e.gate.order[len(e.gate.order)-1]
	e.gate.mu.Unlock()
	if !strings.Contains(sent, "counted-1") || strings.Contains(sent, "No such tool") || strings.Contains(sent, "is_error") || !strings.Contains(sent, "bash-2") {
		t.Errorf("the upstream got %s: want the tape's MCP output and the trial's own Bash output", sent)
	}
	if d, _, err := e.runs.Divergence(context.Background(), run.GetId()); err != nil || d != nil {
		t.Errorf("divergence %v %v, want none", d, err)
	}
}

// TestReplayTreeCheckAtEnd: a replay with tree_check_at_end hashes the
// work tree only at the prefix's last two requests (at_seq and at_seq+1),
// so its earlier replayed answers wait for no hash; a tree that differs
// from the start is then a tree divergence seen at at_seq (every step
// hashed: at step 1).
func TestReplayTreeCheckAtEnd(t *testing.T) {
	t.Parallel()
	trees := &fakeTrees{}
	tree := func(h string) func(context.Context, *gatewayv1.RunSandbox) (string, error) {
		return func(context.Context, *gatewayv1.RunSandbox) (string, error) { return h, nil }
	}
	e := newEnv(t, func(o *dataplane.Options) { o.Trees = trees })
	sb := &gatewayv1.RunSandbox{Id: "sb-1", WorkDir: "/s/work"}
	rec, tok := e.create(t, &gatewayv1.Run{Session: "ses-rec", Sandbox: sb})
	const steps = 4
	for i := 1; i <= steps; i++ {
		trees.set(tree(fmt.Sprintf("tree-%d", i)))
		if ans := e.post(t, "/v1/messages", tok, msg(fmt.Sprintf("step %d", i))); ans.status != http.StatusOK {
			t.Fatalf("record %d: %d %s", i, ans.status, ans.body)
		}
	}
	for _, c := range []struct {
		name      string
		atEnd     bool
		trees     func(seq int) string
		wantSeq   int // the divergence's step (0: clean)
		wantCalls int
	}{
		{"clean at end", true, func(seq int) string { return fmt.Sprintf("tree-%d", seq) }, 0, 2},
		{"another tree at end", true, func(int) string { return "other" }, 3, 1},
		{"another tree every step", false, func(int) string { return "other" }, 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			seq := 0
			calls := 0
			var mu sync.Mutex
			trees.set(func(context.Context, *gatewayv1.RunSandbox) (string, error) {
				mu.Lock()
				defer mu.Unlock()
				calls++
				return c.trees(seq), nil
			})
			_, rtok := e.create(t, &gatewayv1.Run{Session: "ses-rp", Sandbox: sb, Replay: &gatewayv1.Replay{TapeRun: rec.GetId(), AtSeq: steps - 1,
				AfterPrefix: gatewayv1.AfterPrefix_AFTER_PREFIX_STOP, TreeCheckAtEnd: c.atEnd}})
			for i := 1; i <= steps; i++ {
				mu.Lock()
				seq = i
				mu.Unlock()
				ans := e.post(t, "/v1/messages", rtok, msg(fmt.Sprintf("step %d", i)))
				diverged := strings.Contains(ans.body, fmt.Sprintf("diverged at step %d (tree)", i))
				if diverged != (i == c.wantSeq) {
					t.Fatalf("step %d: %d %s, want a tree divergence at %d", i, ans.status, ans.body, c.wantSeq)
				}
				if diverged || i == steps {
					break
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if calls != c.wantCalls {
				t.Errorf("%d tree hashes, want %d", calls, c.wantCalls)
			}
		})
	}
}
