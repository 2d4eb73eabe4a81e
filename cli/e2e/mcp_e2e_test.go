package e2e_test

// The MCP façade end to end: every tool through the official Go SDK's own
// client, over stdio (the real `hangar mcp` binary) and over streamable
// HTTP (/mcp on the front door), against `hangar up`'s stack with real
// Claude Code turns on the scripted upstream; the token on /mcp; and Claude
// Code itself as the MCP client, driving hangar.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/mcp"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// Tool commands of the scripted agent inside the sessions.
const (
	mcpArtifactCmd = `printf 'the report\n' > report.txt && hangar-agent artifact report.txt && echo artifact-done`
	mcpLongCmd     = `touch waiting.flag; while [ ! -f release.flag ]; do sleep 0.05; done; echo released`
	mcpQuickCmd    = `echo quick-done`
)

// mcpSpecTools are the spec's MCP tools.
var mcpSpecTools = []string{
	"answer_approval", "fork_run", "fork_session", "get_artifact", "get_events", "get_fork", "get_session", "get_session_patch",
	"keep_session", "list_sessions", "new_session", "open_session", "send_to_session", "steer_turn",
	"suspend_session", "wait_for_turn",
}

// mcpStart is a stack with environment e2e on a fresh repository, which
// it returns too.
func mcpStart(t *testing.T) (*stack, string) {
	t.Helper()
	script := scripted.Script{
		Rules: append([]scripted.Rule{
			{Name: "done", LastIsToolResult: scripted.Bool(true), Answer: scripted.Answer{Text: "Finished the task."}},
		}, slices.Concat(
			shellRules("artifact task", mcpArtifactCmd),
			shellRules("long task", mcpLongCmd),
			shellRules("quick task", mcpQuickCmd),
		)...),
		Default: &scripted.Answer{Text: "OK."},
	}
	s := startStack(t, stackOptions{script: &script})
	repo := gitRepo(t, map[string]string{"README.md": "# e2e\n"})
	s.applyEnvironment(t, "e2e", repo, 0, sandboxv1.Egress_EGRESS_FULL)
	return s, repo
}

// mcpClient is one MCP client session and the progress notifications it
// got, by token.
type mcpClient struct {
	cs       *mcpsdk.ClientSession
	mu       sync.Mutex
	progress map[any][]*mcpsdk.ProgressNotificationParams
	notified chan struct{}
}

func newMCPClient() (*mcpsdk.Client, *mcpClient) {
	c := &mcpClient{progress: map[any][]*mcpsdk.ProgressNotificationParams{}, notified: make(chan struct{}, 1000)}
	client := mcpsdk.NewClient(&mcpsdk.Implementation{Name: "hangar-e2e", Version: "1"}, &mcpsdk.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcpsdk.ProgressNotificationClientRequest) {
			c.mu.Lock()
			c.progress[req.Params.ProgressToken] = append(c.progress[req.Params.ProgressToken], req.Params)
			c.mu.Unlock()
			select {
			case c.notified <- struct{}{}:
			default:
			}
		},
	})
	return client, c
}

func (c *mcpClient) progressOf(token string) []*mcpsdk.ProgressNotificationParams {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.progress[token])
}

// connectStdio starts the real `hangar mcp` in dir, pointed at the stack.
func connectStdio(t *testing.T, s *stack, bin, dir string) *mcpClient {
	t.Helper()
	client, c := newMCPClient()
	cmd := exec.Command(bin, "mcp")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HANGAR_URL="+s.env["HANGAR_URL"], "HANGAR_TOKEN="+s.env["HANGAR_TOKEN"], "HANGAR_HOME="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cs, err := client.Connect(context.Background(), &mcpsdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to hangar mcp: %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() {
		if err := cs.Close(); err != nil {
			t.Logf("closing hangar mcp: %v (stderr: %s)", err, stderr.String())
		}
	})
	c.cs = cs
	return c
}

// bearer adds the token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// connectHTTP connects to /mcp on the front door with the API token.
func connectHTTP(t *testing.T, s *stack) *mcpClient {
	t.Helper()
	client, c := newMCPClient()
	cs, err := client.Connect(context.Background(), &mcpsdk.StreamableClientTransport{
		Endpoint:             s.env["HANGAR_URL"] + "/mcp",
		HTTPClient:           &http.Client{Transport: bearer{token: s.env["HANGAR_TOKEN"], next: http.DefaultTransport}},
		DisableStandaloneSSE: true,
		MaxRetries:           -1,
	}, nil)
	if err != nil {
		t.Fatalf("connect to /mcp: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	c.cs = cs
	return c
}

// call calls a tool that must succeed and returns its structured output.
func (c *mcpClient) call(t *testing.T, tool string, args map[string]any) map[string]any {
	t.Helper()
	return c.callToken(t, context.Background(), tool, args, "")
}

func (c *mcpClient) callToken(t *testing.T, ctx context.Context, tool string, args map[string]any, token string) map[string]any {
	t.Helper()
	params := &mcpsdk.CallToolParams{Name: tool, Arguments: args}
	if token != "" {
		params.SetProgressToken(token)
	}
	res, err := c.cs.CallTool(ctx, params)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if res.IsError {
		t.Fatalf("%s(%v): tool error %s", tool, args, mcpText(res))
	}
	var out map[string]any
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil || out == nil {
		t.Fatalf("%s: structured content %s: %v", tool, b, err)
	}
	return out
}

// callFails calls a tool that must answer with a tool error (not a
// protocol failure) and returns its text.
func (c *mcpClient) callFails(t *testing.T, tool string, args map[string]any) (string, map[string]any) {
	t.Helper()
	res, err := c.cs.CallTool(context.Background(), &mcpsdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: a protocol failure, want a tool error: %v", tool, err)
	}
	if !res.IsError {
		t.Fatalf("%s(%v) succeeded, want a tool error", tool, args)
	}
	parts, _ := res.Meta[mcp.ErrorMetaKey].(map[string]any)
	return mcpText(res), parts
}

func mcpText(res *mcpsdk.CallToolResult) string {
	var texts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcpsdk.TextContent); ok {
			texts = append(texts, tc.Text)
		}
	}
	return strings.Join(texts, "\n")
}

// enumIs says whether v is the enum value full (TURN_OUTCOME_COMPLETED)
// by the short name the REST API and the MCP tools write (completed).
func enumIs(v any, full string) bool {
	s, _ := v.(string)
	for _, prefix := range []string{"TURN_OUTCOME_", "SESSION_STATE_", "APPROVAL_STATE_", "FORK_STATUS_"} {
		if short, ok := strings.CutPrefix(full, prefix); ok {
			return s == strings.ToLower(short) // the REST API's short name only
		}
	}
	return s == full
}

// asList is v as a JSON array; nil when it is not one.
func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// at reads a path of keys (and list indexes as ints) in a JSON value.
func at(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// TestMCPToolsOverStdioAndHTTP runs every tool, over both transports,
// against real sessions: a turn that hands back an artifact (with context
// and, on stdio, the local checkout), a long turn followed with progress,
// left by a cancelled wait, steered and interrupted into a quick one, a
// turn held for approval, suspend, open, fork, and errors.
func TestMCPToolsOverStdioAndHTTP(t *testing.T) {
	s, repo := mcpStart(t)
	bin := buildHangar(t)

	// A clone of the environment's repository with an untracked file: the
	// stdio server runs in it, so context.from_local "." carries it.
	local := filepath.Join(t.TempDir(), "local")
	if out, err := exec.Command("git", "clone", "-q", repo, local).CombinedOutput(); err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(local, "local.txt"), []byte("from my checkout\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, transport := range []string{"stdio", "http"} {
		t.Run(transport, func(t *testing.T) {
			var c *mcpClient
			if transport == "stdio" {
				c = connectStdio(t, s, bin, local)
			} else {
				c = connectHTTP(t, s)
			}
			mcpRunEveryTool(t, s, c, "mcp-"+transport, transport == "stdio")
		})
	}
}

func mcpRunEveryTool(t *testing.T, s *stack, c *mcpClient, name string, stdio bool) {
	ctx := context.Background()
	tools, err := c.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
		if tool.OutputSchema == nil || tool.InputSchema == nil || tool.Description == "" {
			t.Errorf("%s: input schema, output schema and description are required", tool.Name)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, mcpSpecTools) {
		t.Errorf("tools %v, want %v", names, mcpSpecTools)
	}

	// new_session with context (text and a file given by content), a budget
	// and, on stdio, the local checkout.
	newArgs := map[string]any{
		"name": name, "environment": "e2e", "message": "Please do the artifact task.",
		"budget":  map[string]any{"max_tokens": 10_000_000},
		"context": map[string]any{"text": []string{"the context note"}, "files": []any{map[string]any{"name": "notes.txt", "content": "some notes\n"}}},
	}
	if stdio {
		newArgs["context"].(map[string]any)["from_local"] = "."
	} else {
		text, parts := c.callFails(t, "new_session", map[string]any{"name": name, "environment": "e2e", "message": "hi", "context": map[string]any{"from_local": "."}})
		if !strings.HasPrefix(text, "INVALID_ARGUMENT: ") || !strings.Contains(text, "hangar mcp") || parts["field"] != "context.from_local" {
			t.Errorf("from_local over HTTP: %q %v, want INVALID_ARGUMENT naming the field and `hangar mcp`", text, parts)
		}
	}
	created := c.call(t, "new_session", newArgs)
	if at(created, "session", "name") != name || at(created, "turn", "number") != 1.0 || at(created, "base_commit") == nil || at(created, "base_commit") == "" {
		t.Fatalf("new_session: %v", created)
	}

	// wait_for_turn, with progress notifications.
	turn := c.callToken(t, ctx, "wait_for_turn", map[string]any{"session": name}, "turn-1")
	if !enumIs(turn["outcome"], "TURN_OUTCOME_COMPLETED") || turn["number"] != 1.0 || at(turn, "artifacts", 0, "path") != "report.txt" || turn["result"] == nil {
		t.Fatalf("wait_for_turn: %v", turn)
	}
	progress := c.progressOf("turn-1")
	if len(progress) == 0 {
		t.Fatal("wait_for_turn sent no progress notifications")
	}
	for i, p := range progress {
		if p.Progress != float64(i+1) || !strings.HasPrefix(p.Message, "turn 1 ") {
			t.Errorf("progress notification %d: %v %q", i, p.Progress, p.Message)
		}
	}

	sess := c.call(t, "get_session", map[string]any{"session": name})
	if !enumIs(at(sess, "session", "state"), "SESSION_STATE_IDLE") || len(at(sess, "session", "turns").([]any)) != 1 {
		t.Fatalf("get_session: %v", sess)
	}
	// fork_run / get_fork on the first turn's run: the replay service
	// answers through the façade (its fidelity is replay's own e2e).
	run, _ := turn["run_id"].(string)
	if run == "" {
		t.Fatalf("wait_for_turn: no run_id: %v", turn)
	}
	if _, parts := c.callFails(t, "fork_run", map[string]any{"run": run, "at_seq": 100000}); parts["field"] != "at_seq" || parts["code"] != "INVALID_ARGUMENT" {
		t.Errorf("fork_run past the tape's end: %v, want INVALID_ARGUMENT naming at_seq", parts)
	}
	if _, parts := c.callFails(t, "fork_run", map[string]any{"run": run, "at_seq": 0, "pin_set": "Not A Lock!"}); parts["field"] != "pin_set" || parts["code"] != "INVALID_ARGUMENT" {
		t.Errorf("fork_run with a malformed pin_set: %v, want INVALID_ARGUMENT naming pin_set", parts)
	}
	if _, parts := c.callFails(t, "get_fork", map[string]any{"fork": "no-such-fork"}); parts["code"] != "NOT_FOUND" {
		t.Errorf("get_fork of an unknown fork: %v, want NOT_FOUND", parts)
	}
	forkedRun := c.call(t, "fork_run", map[string]any{"run": run, "at_seq": 0, "continuations": 0, "wait_seconds": 300})
	forkID, _ := forkedRun["fork"].(string)
	status := fmt.Sprint(forkedRun["status"])
	if forkID == "" || !(enumIs(status, "FORK_STATUS_VERIFIED") || enumIs(status, "FORK_STATUS_DIVERGED")) {
		t.Errorf("fork_run at 0, verify only: %v, want a fork that settled (verified or diverged)", forkedRun)
	}
	if got := c.call(t, "get_fork", map[string]any{"fork": forkID}); at(got, "fork", "fork") != forkID || fmt.Sprint(at(got, "fork", "status")) != status || at(got, "fork", "run") != run {
		t.Errorf("get_fork %s: %v, want the fork fork_run made (status %s, run %s)", forkID, got, status, run)
	}

	listed := c.call(t, "list_sessions", map[string]any{"states": []string{"idle"}})
	found := false
	for _, x := range at(listed, "sessions").([]any) {
		found = found || at(x, "name") == name
	}
	if !found {
		t.Errorf("list_sessions idle lacks %s: %v", name, listed)
	}

	events := at(c.call(t, "get_events", map[string]any{"session": name}), "events").([]any)
	if len(events) == 0 {
		t.Fatal("get_events: none")
	}
	// A 64-bit number, as the REST API writes it: a JSON number.
	seqNum, ok := at(events[len(events)-1], "seq").(float64)
	if !ok || seqNum == 0 {
		t.Fatalf("seq %v: want a JSON number", at(events[len(events)-1], "seq"))
	}
	last := int64(seqNum)
	if after, _ := at(c.call(t, "get_events", map[string]any{"session": name, "after_seq": last}), "events").([]any); len(after) != 0 {
		t.Errorf("get_events after the last seq: %v", after)
	}

	if a := c.call(t, "get_artifact", map[string]any{"session": name}); at(a, "artifacts", 0, "path") != "report.txt" {
		t.Errorf("get_artifact list: %v", a)
	}
	if a := c.call(t, "get_artifact", map[string]any{"session": name, "path": "report.txt"}); a["text"] != "the report\n" || at(a, "artifact", "path") != "report.txt" {
		t.Errorf("get_artifact report.txt: %v", a)
	}
	patch := c.call(t, "get_session_patch", map[string]any{"session": name})
	if p, _ := patch["patch"].(string); !strings.Contains(p, "report.txt") || (stdio && !strings.Contains(p, "from my checkout")) {
		t.Errorf("get_session_patch (stdio %v): %v", stdio, patch)
	}
	if k := c.call(t, "keep_session", map[string]any{"session": name, "idle_minutes": 240}); at(k, "session", "idle_minutes") != 240.0 {
		t.Errorf("keep_session: %v", k)
	}

	// A long turn: a wait cancelled mid-turn leaves it running; steer it,
	// then interrupt it into a quick turn.
	sent := c.call(t, "send_to_session", map[string]any{"session": name, "message": "Now the long task."})
	if at(sent, "turn", "number") != 2.0 {
		t.Fatalf("send_to_session: %v", sent)
	}
	controlWaitRunning(t, s, name)
	waitCtx, cancelWait := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := c.cs.CallTool(waitCtx, func() *mcpsdk.CallToolParams {
			p := &mcpsdk.CallToolParams{Name: "wait_for_turn", Arguments: map[string]any{"session": name, "turn": 2}}
			p.SetProgressToken("turn-2")
			return p
		}())
		waited <- err
	}()
	deadline := time.After(2 * time.Minute)
	for len(c.progressOf("turn-2")) == 0 {
		select {
		case <-c.notified:
		case <-deadline:
			t.Fatal("no progress notification for the running turn 2")
		}
	}
	cancelWait()
	if err := <-waited; err == nil {
		t.Error("the cancelled wait_for_turn returned no error")
	}
	if st := at(c.call(t, "get_session", map[string]any{"session": name}), "session", "state"); !enumIs(st, "SESSION_STATE_RUNNING") {
		t.Fatalf("after the cancelled wait the session is %v, want its turn still running", st)
	}
	if st := c.call(t, "steer_turn", map[string]any{"session": name, "message": "Also mention purple."}); at(st, "session", "name") != name {
		t.Errorf("steer_turn: %v", st)
	}
	interrupted := c.call(t, "steer_turn", map[string]any{"session": name, "interrupt": true, "message": "Now the quick task."})
	if at(interrupted, "turn", "number") != 3.0 {
		t.Fatalf("steer_turn interrupt: %v", interrupted)
	}
	if t2 := c.call(t, "wait_for_turn", map[string]any{"session": name, "turn": 2}); !enumIs(t2["outcome"], "TURN_OUTCOME_INTERRUPTED") {
		t.Errorf("turn 2: %v", t2)
	}
	if t3 := c.call(t, "wait_for_turn", map[string]any{"session": name}); !enumIs(t3["outcome"], "TURN_OUTCOME_COMPLETED") || t3["number"] != 3.0 {
		t.Errorf("turn 3: %v", t3)
	}
	if text, parts := c.callFails(t, "steer_turn", map[string]any{"session": name, "message": "late"}); parts["code"] != "FAILED_PRECONDITION" || !strings.HasPrefix(text, "FAILED_PRECONDITION") {
		t.Errorf("steer without a running turn: %q %v", text, parts)
	}

	// answer_approval: a turn under approvals ask waits for it.
	if a := c.call(t, "answer_approval", map[string]any{"session": name}); len(asList(at(a, "approvals"))) != 0 {
		t.Errorf("answer_approval list of a session that never asks: %v", a)
	}
	asked := name + "-ask"
	c.call(t, "new_session", map[string]any{"name": asked, "environment": "e2e", "approvals": "ask", "message": "Please do the quick task."})
	var approvalID string
	for wait := time.Now().Add(2 * time.Minute); approvalID == "" && time.Now().Before(wait); {
		if id, ok := at(c.call(t, "answer_approval", map[string]any{"session": asked}), "approvals", 0, "id").(string); ok {
			approvalID = id
		} else {
			<-time.After(50 * time.Millisecond)
		}
	}
	if approvalID == "" {
		t.Fatal("no approval waited under approvals ask")
	}
	if _, parts := c.callFails(t, "answer_approval", map[string]any{"session": asked, "approval_id": approvalID}); parts["field"] != "allow" {
		t.Errorf("answer_approval without allow: %v", parts)
	}
	if a := c.call(t, "answer_approval", map[string]any{"session": asked, "approval_id": approvalID, "allow": true}); !enumIs(at(a, "approval", "state"), "APPROVAL_STATE_ALLOWED") {
		t.Errorf("answer_approval allow: %v", a)
	}
	if tr := c.call(t, "wait_for_turn", map[string]any{"session": asked}); !enumIs(tr["outcome"], "TURN_OUTCOME_COMPLETED") {
		t.Errorf("the approved turn: %v", tr)
	}

	// suspend, open, fork.
	if sp := c.call(t, "suspend_session", map[string]any{"session": name}); !enumIs(at(sp, "session", "state"), "SESSION_STATE_SUSPENDED") {
		t.Errorf("suspend_session: %v", sp)
	}
	if op := c.call(t, "open_session", map[string]any{"session": name}); !enumIs(at(op, "session", "state"), "SESSION_STATE_IDLE") || at(op, "session", "sandbox_id") == nil || at(op, "session", "sandbox_id") == "" {
		t.Errorf("open_session: %v", op)
	}
	forked := c.call(t, "fork_session", map[string]any{"session": name, "n": 1, "names": []string{name + "-fork"}})
	if at(forked, "forks", 0, "name") != name+"-fork" || at(forked, "forked_from_checkpoint") == nil {
		t.Errorf("fork_session: %v", forked)
	}
	if f := s.get(t, name+"-fork"); f.GetParentId() == "" {
		t.Errorf("the fork has no parent: %v", f)
	}

	// Errors are tool errors with hangar's code, reason and message.
	text, parts := c.callFails(t, "get_session", map[string]any{"session": "no-such-session"})
	if parts["code"] != "NOT_FOUND" || parts["reason"] == "" || !strings.HasPrefix(text, "NOT_FOUND "+parts["reason"].(string)+": ") || !strings.Contains(text, "no-such-session") {
		t.Errorf("get_session of an unknown session: %q %v", text, parts)
	}
	if text, _ := c.callFails(t, "new_session", map[string]any{"name": name + "-x", "harness": "vim"}); !strings.Contains(text, "harness") {
		t.Errorf("new_session with an unknown harness: %q", text)
	}
	if text, parts := c.callFails(t, "new_session", map[string]any{"name": "Bad Name", "environment": "e2e"}); parts["code"] != "INVALID_ARGUMENT" {
		t.Errorf("new_session with a bad name: %q %v", text, parts)
	}
}

// TestMCPEndpointNeedsTheToken: /mcp answers 401 without the token or
// with a wrong one, before looking at the request; with it, MCP.
func TestMCPEndpointNeedsTheToken(t *testing.T) {
	s := startStack(t, stackOptions{})
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	for _, tc := range []struct {
		name, auth string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"wrong token", "Bearer wrong", http.StatusUnauthorized},
		{"the token", "Bearer " + s.env["HANGAR_TOKEN"], http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, s.env["HANGAR_URL"]+"/mcp", strings.NewReader(initialize))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := new(bytes.Buffer)
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.want, body)
			}
			if tc.want == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") == "" {
				t.Error("401 without a WWW-Authenticate challenge")
			}
			if tc.want == http.StatusOK && !strings.Contains(body.String(), `"serverInfo"`) {
				t.Errorf("initialize answered %s", body)
			}
		})
	}
	// The SDK's client without the token fails to connect (no tool runs).
	client, _ := newMCPClient()
	if cs, err := client.Connect(context.Background(), &mcpsdk.StreamableClientTransport{Endpoint: s.env["HANGAR_URL"] + "/mcp", MaxRetries: -1, DisableStandaloneSSE: true}, nil); err == nil {
		cs.Close()
		t.Error("an MCP client without the token connected")
	}
}

// TestClaudeCodeDrivesHangarOverMCP: Claude Code itself is the MCP client.
// Configured with `hangar mcp` (--mcp-config) and driven by a scripted
// model, it starts a real session with new_session, waits for its turn
// with wait_for_turn and gets its work back with get_session_patch.
func TestClaudeCodeDrivesHangarOverMCP(t *testing.T) {
	s, _ := mcpStart(t)
	bin := buildHangar(t)
	claude := filepath.Join(os.Getenv("HANGAR_HARNESS_DIR"), harnessClaude)
	const name = "driven-by-claude"

	// The driving Claude's own model: call new_session, then wait_for_turn,
	// then get_session_patch, each after the previous one's result.
	call := func(tool string, input map[string]any) *scripted.ToolCall {
		return &scripted.ToolCall{Name: "mcp__hangar__" + tool, Input: input}
	}
	driver, err := scripted.New(scripted.Script{Rules: []scripted.Rule{
		{Name: "patch back", LastIsToolResult: scripted.Bool(true), ToolResult: `diff --git`, Answer: scripted.Answer{Text: "The session's patch is back."}},
		{Name: "get the patch", LastIsToolResult: scripted.Bool(true), ToolResult: `TURN_OUTCOME_COMPLETED|"outcome":"completed"`, Answer: scripted.Answer{ToolCall: call("get_session_patch", map[string]any{"session": name})}},
		{Name: "wait", LastIsToolResult: scripted.Bool(true), ToolResult: `base_commit`, Answer: scripted.Answer{ToolCall: call("wait_for_turn", map[string]any{"session": name})}},
		{Name: "start", Tool: "mcp__hangar__new_session", LastIsToolResult: scripted.Bool(false), Prompt: `(?i)hangar session`,
			Answer: scripted.Answer{Text: "Starting it.", ToolCall: call("new_session", map[string]any{"name": name, "environment": "e2e", "message": "Please do the artifact task."})}},
	}, Default: &scripted.Answer{Text: "OK."}})
	if err != nil {
		t.Fatal(err)
	}
	model := httptest.NewServer(driver)
	t.Cleanup(model.Close)

	home := t.TempDir()
	config := filepath.Join(home, "mcp.json")
	cfg, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"hangar": map[string]any{
		"type": "stdio", "command": bin, "args": []string{"mcp"},
		"env": map[string]string{"HANGAR_URL": s.env["HANGAR_URL"], "HANGAR_TOKEN": s.env["HANGAR_TOKEN"], "HANGAR_HOME": home},
	}}})
	if err := os.WriteFile(config, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, claude, "-p", "Start a hangar session that writes the report, and bring back its patch.",
		"--mcp-config", config, "--strict-mcp-config", "--output-format", "stream-json", "--verbose",
		"--allowedTools", "mcp__hangar__new_session,mcp__hangar__wait_for_turn,mcp__hangar__get_session_patch")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(),
		"CLAUDE_CONFIG_DIR="+filepath.Join(home, ".claude"), "HOME="+home,
		"ANTHROPIC_BASE_URL="+model.URL, "ANTHROPIC_API_KEY=driver-key",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "ENABLE_TOOL_SEARCH=false", "MCP_TIMEOUT=60000", "MCP_TOOL_TIMEOUT=300000")
	var stderr bytes.Buffer
	cmd.Stdin, cmd.Stderr = nil, &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("claude: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}

	// The tool results Claude Code got, in order, from its stream-json.
	var results []string
	var final string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var line struct {
			Type    string `json:"type"`
			Result  string `json:"result"`
			Message struct {
				Content []struct {
					Type    string          `json:"type"`
					Content json.RawMessage `json:"content"`
				} `json:"content"`
			} `json:"message"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		switch line.Type {
		case "user":
			for _, c := range line.Message.Content {
				if c.Type == "tool_result" {
					results = append(results, toolResultText(c.Content))
				}
			}
		case "result":
			final = line.Result
		}
	}
	if len(results) != 3 {
		t.Fatalf("Claude Code got %d tool results, want 3 (new_session, wait_for_turn, get_session_patch):\n%s", len(results), out)
	}
	for i, want := range []string{`base_commit`, `TURN_OUTCOME_COMPLETED|"outcome":"completed"`, `report.txt`} {
		if !regexp.MustCompile(want).MatchString(results[i]) {
			t.Errorf("tool result %d lacks %s: %s", i+1, want, results[i])
		}
	}
	if !strings.Contains(results[2], "diff --git") {
		t.Errorf("get_session_patch's result is not the patch: %s", results[2])
	}
	if final != "The session's patch is back." {
		t.Errorf("Claude Code's final answer: %q", final)
	}

	// The session it started is real: its turn ran and its patch is the one
	// Claude Code got.
	sess := s.get(t, name)
	if len(sess.GetTurns()) != 1 || sess.GetTurns()[0].GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("the session Claude Code started: %v", sess)
	}
	patch, err := s.sessions.GetSessionPatch(ctx, &sessionv1.GetSessionPatchRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Patch string `json:"patch"`
	}
	if err := json.Unmarshal([]byte(results[2]), &got); err != nil || got.Patch != patch.GetPatch() {
		t.Errorf("the patch Claude Code got is not the session's (%v):\n%s\nwant\n%s", err, results[2], patch.GetPatch())
	}
}

// toolResultText is the text of a tool_result's content: a string, or
// text blocks.
func toolResultText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &blocks)
	var texts []string
	for _, b := range blocks {
		texts = append(texts, b.Text)
	}
	return strings.Join(texts, "\n")
}
