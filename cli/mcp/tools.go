package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/proto"

	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/platform/fault"
)

// tools holds what the tool handlers share. Each handler turns its input
// into one API request (two for the tools that also list), calls the
// session service and returns its answer: no state of its own.
type tools struct {
	sessions sessionv1.SessionServiceClient
	replay   replayv1.ReplayServiceClient
	local    Local
	logger   *slog.Logger
}

// Inputs. Field descriptions are written for the model calling the tool.

type budgetIn struct {
	MaxCostUSD float64 `json:"max_cost_usd,omitempty" jsonschema:"stop the turn (outcome over_budget) once it has cost this many USD"`
	MaxTokens  int64   `json:"max_tokens,omitempty" jsonschema:"stop the turn (outcome over_budget) once it has used this many tokens"`
	MaxMinutes int32   `json:"max_minutes,omitempty" jsonschema:"stop the turn (outcome over_budget) once it has run this many minutes"`
}

type fileIn struct {
	Path    string `json:"path,omitempty" jsonschema:"a file on the machine running the MCP server (hangar mcp), read and attached; relative to its working directory"`
	Name    string `json:"name,omitempty" jsonschema:"the file's name as the agent sees it (default: the path's base name)"`
	Content string `json:"content,omitempty" jsonschema:"the file's content as text, instead of a path"`
}

type sendContextIn struct {
	Files []fileIn `json:"files,omitempty" jsonschema:"files the agent finds under ~/.hangar-agent/context in its sandbox"`
	Text  []string `json:"text,omitempty" jsonschema:"texts added to the prompt as context"`
}

type newContextIn struct {
	FromLocal string   `json:"from_local,omitempty" jsonschema:"continue a local git checkout in the cloud: the path of a checkout on the machine running hangar mcp ('.' for its working directory); its unpushed commits, uncommitted changes and untracked files go with the first turn"`
	Files     []fileIn `json:"files,omitempty" jsonschema:"files the agent finds under ~/.hangar-agent/context in its sandbox"`
	Text      []string `json:"text,omitempty" jsonschema:"texts added to the prompt as context"`
}

type newSessionIn struct {
	Name         string         `json:"name" jsonschema:"the new session's name: lowercase letters, digits and '-', at most 63 characters, unique"`
	Message      string         `json:"message,omitempty" jsonschema:"the first turn's message to the agent; without one the session is only created and no turn runs"`
	Environment  string         `json:"environment,omitempty" jsonschema:"the environment that builds the sandbox (repository, base ref, setup); default: the repository hangar mcp runs in, else the default environment"`
	Repo         string         `json:"repo,omitempty" jsonschema:"a repository URL (or a local path, for hangar mcp) overriding the environment's"`
	Harness      string         `json:"harness,omitempty" jsonschema:"the agent CLI that runs the turns (default claude)"`
	Branch       string         `json:"branch,omitempty" jsonschema:"the session's branch (default hangar/session/<name>)"`
	Model        string         `json:"model,omitempty" jsonschema:"the model the agent runs (default: the harness's)"`
	Approvals    string         `json:"approvals,omitempty" jsonschema:"ask: every tool call of the agent waits for answer_approval; never (default): they run"`
	IdleMinutes  *int32         `json:"idle_minutes,omitempty" jsonschema:"minutes idle before the session suspends (0 = never; default 30)"`
	Budget       *budgetIn      `json:"budget,omitempty" jsonschema:"a per-turn budget; a turn that crosses it ends with outcome over_budget"`
	Context      *newContextIn  `json:"context,omitempty" jsonschema:"context for the first turn: a local checkout, files and texts"`
	OutputSchema map[string]any `json:"output_schema,omitempty" jsonschema:"a JSON Schema (as a JSON object): the turn also returns a structured_result matching it"`
	CacheTTL     string         `json:"cache_ttl,omitempty" jsonschema:"prompt-cache TTL: auto, 5m, 1h or off"`
	HarnessLock  string         `json:"harness_lock,omitempty" jsonschema:"start from a harness lock (NAME@REV): its harness, model and approval mode"`
}

type sessionIn struct {
	Session string `json:"session" jsonschema:"the session's name"`
}

type listSessionsIn struct {
	States    []string `json:"states,omitempty" jsonschema:"only sessions in these states (all when empty)"`
	Parent    string   `json:"parent,omitempty" jsonschema:"only forks of this session"`
	PageSize  int32    `json:"page_size,omitempty" jsonschema:"at most this many sessions"`
	PageToken string   `json:"page_token,omitempty" jsonschema:"next_page_token of an earlier call, for the next page"`
}

type sendIn struct {
	Session      string         `json:"session" jsonschema:"the session's name"`
	Message      string         `json:"message" jsonschema:"the message to the agent; answers its question when the session needs input"`
	Context      *sendContextIn `json:"context,omitempty" jsonschema:"context for this turn: files and texts"`
	OutputSchema map[string]any `json:"output_schema,omitempty" jsonschema:"a JSON Schema (as a JSON object): the turn also returns a structured_result matching it"`
	Budget       *budgetIn      `json:"budget,omitempty" jsonschema:"this turn's budget, instead of the session's"`
	Harness      string         `json:"harness,omitempty" jsonschema:"switch the session to another agent CLI; its first turn starts with a short account of the earlier ones"`
}

type keepIn struct {
	Session     string `json:"session" jsonschema:"the session's name"`
	IdleMinutes int32  `json:"idle_minutes" jsonschema:"minutes idle before the session suspends; 0 = stay up until suspended"`
}

type eventsIn struct {
	Session  string `json:"session" jsonschema:"the session's name"`
	AfterSeq int64  `json:"after_seq,omitempty" jsonschema:"only events after this seq (the last seq an earlier call returned), to read on"`
	Turn     int32  `json:"turn,omitempty" jsonschema:"only this turn's events (default: every turn's)"`
	PageSize int32  `json:"page_size,omitempty" jsonschema:"at most this many events"`
}

type waitIn struct {
	Session string `json:"session" jsonschema:"the session's name"`
	Turn    int32  `json:"turn,omitempty" jsonschema:"the turn's number (default: the newest turn)"`
}

type artifactIn struct {
	Session string `json:"session" jsonschema:"the session's name"`
	Path    string `json:"path,omitempty" jsonschema:"the artifact's path; without one, the session's artifacts are listed"`
	Turn    int32  `json:"turn,omitempty" jsonschema:"the turn (default: the newest turn that has the path; for a list, every turn)"`
}

type forkIn struct {
	Session string   `json:"session" jsonschema:"the session to fork (not while a turn runs)"`
	N       int32    `json:"n" jsonschema:"how many forks (at most HANGAR_FORK_MAX, 8 by default)"`
	Message string   `json:"message,omitempty" jsonschema:"each fork's first message; without one the forks only boot"`
	Harness string   `json:"harness,omitempty" jsonschema:"fork into another agent CLI (starts with a short account of the earlier turns)"`
	Names   []string `json:"names,omitempty" jsonschema:"the forks' names, one per fork (default <session>-fork-<i>)"`
}

type forkRunIn struct {
	Run           string    `json:"run" jsonschema:"the recorded run to fork: a session's first turn's run_id (get_session: turns[0].run_id)"`
	AtSeq         int32     `json:"at_seq" jsonschema:"the step to fork at: steps 1..at_seq are replayed from the run's model tape (tools run for real, no model call), then the trials go live; 0 goes live at once"`
	Continuations *int32    `json:"continuations,omitempty" jsonschema:"how many live continuations (trials), each its own session (default 1, at most 10); 0 only verifies that the prefix replays cleanly"`
	OnDivergence  string    `json:"on_divergence,omitempty" jsonschema:"what a trial does when its replay diverges from the tape: stop (default, it ends there) or live (it goes live from there)"`
	Budget        *budgetIn `json:"budget,omitempty" jsonschema:"each continuation's budget (default max_cost_usd 5)"`
	WaitSeconds   int32     `json:"wait_seconds,omitempty" jsonschema:"answer once every prefix has settled, or after this many seconds (0: at once, status replaying; follow with get_fork)"`
	PinSet        string    `json:"pin_set,omitempty" jsonschema:"continue with this pin set instead of the run's own harness and model: a harness lock with an environment (NAME@rN); one on another harness than the run's diverges at step 1"`
}

type getForkIn struct {
	Fork string `json:"fork" jsonschema:"the fork's id, as fork_run returned it"`
}

type steerIn struct {
	Session   string `json:"session" jsonschema:"the session's name"`
	Message   string `json:"message,omitempty" jsonschema:"what to tell the running agent; with interrupt, the message a new turn carries on with"`
	Interrupt bool   `json:"interrupt,omitempty" jsonschema:"stop the running turn (outcome interrupted); with a message, start a new turn with it"`
}

type approvalIn struct {
	Session    string `json:"session" jsonschema:"the session's name"`
	ApprovalID string `json:"approval_id,omitempty" jsonschema:"the tool call to answer; without one, the calls waiting are listed"`
	Allow      *bool  `json:"allow,omitempty" jsonschema:"with approval_id: true lets the call run, false denies it (the agent is told it was denied)"`
	All        bool   `json:"all,omitempty" jsonschema:"when listing: answered calls too"`
}

var (
	harnessNames  = []any{"claude", "codex", "pi", "antigravity"}
	approvalNames = []any{"never", "ask"}
	stateNames    = []any{"running", "idle", "suspending", "suspended", "resuming", "needs_input", "archived", "failed"}
)

// inputSchema is In's schema (from its fields and their descriptions),
// with enums set on the named properties ("context.files" reaches into
// nested objects, "states[]" into an array's items).
func inputSchema[In any](enums map[string][]any) *jsonschema.Schema {
	s, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("mcp: input schema of %T: %v", *new(In), err))
	}
	for path, values := range enums {
		p := s
		for _, part := range strings.Split(path, ".") {
			items := strings.HasSuffix(part, "[]")
			p = p.Properties[strings.TrimSuffix(part, "[]")]
			if p == nil {
				panic(fmt.Sprintf("mcp: input schema of %T has no %s", *new(In), path))
			}
			if items {
				p = p.Items
			}
		}
		p.Enum = values
	}
	return s
}

var harnessEnum = map[string][]any{"harness": harnessNames}

func (t *tools) register(s *mcpsdk.Server) {
	readOnly := &mcpsdk.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true}
	notDestructive := false

	add(s, &mcpsdk.Tool{
		Name:  "new_session",
		Title: "Start a session",
		Description: "Start a hangar session: a named stream of work in which a coding agent (Claude Code by default) works on a repository in a sandbox. " +
			"Given a message, the first turn starts at once and this returns while it runs: follow it with wait_for_turn. Without a message the session is only created. " +
			"Use context.from_local to continue a local checkout (its unpushed commits and uncommitted changes), context.files / context.text for attachments, output_schema for a structured result, budget to cap each turn. " +
			"Returns the session, the first turn (when a message was given), the repository and the base commit.",
		InputSchema:  inputSchema[newSessionIn](map[string][]any{"harness": harnessNames, "approvals": approvalNames}),
		OutputSchema: outputSchema(&sessionv1.CreateSessionResponse{}, "the new session, its first turn, its repository and base commit"),
		Annotations:  &mcpsdk.ToolAnnotations{DestructiveHint: &notDestructive},
	}, t.newSession)

	add(s, &mcpsdk.Tool{
		Name:  "list_sessions",
		Title: "List sessions",
		Description: "List hangar sessions, most recently active first, optionally only those in some states or only the forks of one session. " +
			"Use it to find a session to continue or inspect. Returns each session's name, state, harness, branch and turn count (get_session has the turns).",
		InputSchema:  inputSchema[listSessionsIn](map[string][]any{"states[]": stateNames}),
		OutputSchema: outputSchema(&sessionv1.ListSessionsResponse{}, "sessions, most recently active first, and the token of the next page"),
		Annotations:  readOnly,
	}, t.listSessions)

	add(s, &mcpsdk.Tool{
		Name:  "send_to_session",
		Title: "Send a message",
		Description: "Continue a session: send the agent a message and start a turn. A suspended session is resumed first (a sandbox boots and its newest checkpoint is restored, so the agent continues its own conversation). " +
			"When the session needs input, the message answers the agent's question. Returns at once with the new turn: follow it with wait_for_turn. " +
			"To talk to a turn that is still running use steer_turn instead.",
		InputSchema:  inputSchema[sendIn](harnessEnum),
		OutputSchema: outputSchema(&sessionv1.SendMessageResponse{}, "the session and the new turn"),
		Annotations:  &mcpsdk.ToolAnnotations{DestructiveHint: &notDestructive},
	}, t.send)

	add(s, &mcpsdk.Tool{
		Name:  "open_session",
		Title: "Open a session",
		Description: "Boot a session's sandbox and restore its newest checkpoint without running the agent, to work in the sandbox directly. " +
			"Returns the session, with sandbox_id and resume_command (the command that continues the agent's own conversation in the sandbox).",
		InputSchema:  inputSchema[sessionIn](nil),
		OutputSchema: outputSchema(&sessionv1.OpenSessionResponse{}, "the open session"),
		Annotations:  &mcpsdk.ToolAnnotations{DestructiveHint: &notDestructive, IdempotentHint: true},
	}, t.open)

	add(s, &mcpsdk.Tool{
		Name:  "keep_session",
		Title: "Set idle time",
		Description: "Set how long a session may stay idle before hangar checkpoints it and releases its sandbox: idle_minutes, 0 = stay up until suspended. " +
			"Returns the session with its idle_minutes and suspend_at.",
		InputSchema:  inputSchema[keepIn](nil),
		OutputSchema: outputSchema(&sessionv1.KeepSessionResponse{}, "the session"),
		Annotations:  &mcpsdk.ToolAnnotations{DestructiveHint: &notDestructive, IdempotentHint: true},
	}, t.keep)

	add(s, &mcpsdk.Tool{
		Name:  "suspend_session",
		Title: "Suspend a session",
		Description: "Checkpoint a session now and release its sandbox (it then costs storage only). Nothing is lost: the next send_to_session or open_session resumes it. " +
			"Returns the suspended session.",
		InputSchema:  inputSchema[sessionIn](nil),
		OutputSchema: outputSchema(&sessionv1.SuspendSessionResponse{}, "the suspended session"),
		Annotations:  &mcpsdk.ToolAnnotations{DestructiveHint: &notDestructive, IdempotentHint: true},
	}, t.suspend)

	add(s, &mcpsdk.Tool{
		Name:  "get_session",
		Title: "Get a session",
		Description: "Everything about one session: its state (and why), its turns with their outcomes, summaries, results and usage, its checkpoints, what holds it open, its open question, and resume_command. " +
			"Use it to see where a session stands.",
		InputSchema:  inputSchema[sessionIn](nil),
		OutputSchema: outputSchema(&sessionv1.GetSessionResponse{}, "the session"),
		Annotations:  readOnly,
	}, t.get)

	add(s, &mcpsdk.Tool{
		Name:  "get_events",
		Title: "Get events",
		Description: "What the agent did in a session, in order: its messages, commands (with exit codes), file changes, tool calls, errors and usage. " +
			"Read on from where an earlier call stopped with after_seq (the last seq it returned); narrow to one turn with turn. Returns the events.",
		InputSchema:  inputSchema[eventsIn](nil),
		OutputSchema: outputSchema(&sessionv1.ListEventsResponse{}, "the events, oldest first"),
		Annotations:  readOnly,
	}, t.events)

	add(s, &mcpsdk.Tool{
		Name:  "wait_for_turn",
		Title: "Wait for a turn",
		Description: "Block until a session's turn ends (the newest turn unless turn is given), sending a progress notification for each thing the agent does meanwhile. " +
			"Returns the finished turn: outcome (completed, failed, over_budget, needs_input, interrupted), result (the agent's final answer), structured_result (with output_schema), question (when it needs input: answer with send_to_session), artifacts, summary and usage. " +
			"Cancelling the call stops the wait only: the turn goes on.",
		InputSchema:  inputSchema[waitIn](nil),
		OutputSchema: outputSchema(&sessionv1.Turn{}, "the finished turn"),
		Annotations:  readOnly,
	}, t.wait)

	add(s, &mcpsdk.Tool{
		Name:  "get_artifact",
		Title: "Get an artifact",
		Description: "Files the agent handed back. Without path: the list of a session's artifacts (path, size, turn). With path: that artifact, its content base64 in content and, when it is text, as text. " +
			"Use get_session_patch for the agent's changes to the repository.",
		InputSchema: inputSchema[artifactIn](nil),
		OutputSchema: mergedSchema("the artifacts (without path) or one artifact and its content",
			outputSchema(&sessionv1.ListArtifactsResponse{}, ""), outputSchema(&sessionv1.GetArtifactResponse{}, ""),
			&jsonschema.Schema{Properties: map[string]*jsonschema.Schema{"text": {Type: "string", Description: "the content, when it is UTF-8 text"}}}),
		Annotations: readOnly,
	}, t.artifact)

	add(s, &mcpsdk.Tool{
		Name:  "get_session_patch",
		Title: "Get the session's patch",
		Description: "The session's work as one git patch against its base commit: its commits and uncommitted changes (from the live sandbox, or from the newest checkpoint when it is suspended). " +
			"Apply it with git apply, or read it to review the work. Returns patch, base_commit and, when it came from a checkpoint, checkpoint_id.",
		InputSchema:  inputSchema[sessionIn](nil),
		OutputSchema: outputSchema(&sessionv1.GetSessionPatchResponse{}, "the patch and what it is against"),
		Annotations:  readOnly,
	}, t.patch)

	add(s, &mcpsdk.Tool{
		Name:  "fork_session",
		Title: "Fork a session",
		Description: "Branch a session into n new sessions (forks) from its newest checkpoint, each with the whole conversation and repository state so far; with a message, each fork starts a turn with it (best-of-N: compare them with get_session_patch). " +
			"Not while the session runs a turn. Returns the forks and the checkpoint they started from.",
		InputSchema:  inputSchema[forkIn](harnessEnum),
		OutputSchema: outputSchema(&sessionv1.ForkSessionResponse{}, "the forks"),
		Annotations:  &mcpsdk.ToolAnnotations{DestructiveHint: &notDestructive},
	}, t.fork)

	add(s, &mcpsdk.Tool{
		Name:  "fork_run",
		Title: "Fork a recorded run at a step",
		Description: "Re-execute a recorded run (a session's first turn) up to step at_seq against its model tape, in a fresh sandbox: every tool runs again for real while the model's answers come from the tape, and each request is checked against the taped one. " +
			"A clean prefix then goes live as k trials, each its own session you can continue like any other (send_to_session, get_session_patch). " +
			"Use it to try other continuations from a point of a run, or (continuations: 0) to check that a run replays. " +
			"Returns the fork: its id, status (replaying, forked, verified, diverged, unreplayed, failed), the earliest divergence (seq, kind: model, tool, network or tree) and the trials.",
		InputSchema:  inputSchema[forkRunIn](map[string][]any{"on_divergence": {"stop", "live"}}),
		OutputSchema: outputSchema(&replayv1.ForkRunResponse{}, "the fork"),
		Annotations:  &mcpsdk.ToolAnnotations{DestructiveHint: &notDestructive},
	}, t.forkRun)

	add(s, &mcpsdk.Tool{
		Name:  "get_fork",
		Title: "Show a fork at a step",
		Description: "The state of a fork made by fork_run: its status, divergence, how many steps were replayed, and its trials with their sessions and statuses. " +
			"Call it to follow a fork that was still replaying when fork_run answered.",
		InputSchema:  inputSchema[getForkIn](nil),
		OutputSchema: outputSchema(&replayv1.GetForkResponse{}, "the fork"),
		Annotations:  &mcpsdk.ToolAnnotations{ReadOnlyHint: true},
	}, t.getFork)

	add(s, &mcpsdk.Tool{
		Name:  "steer_turn",
		Title: "Steer a running turn",
		Description: "Tell the agent of a running turn something: it reads the message at its next step, without the turn stopping. " +
			"With interrupt: true the turn is stopped instead (outcome interrupted), and with a message a new turn starts with it. " +
			"Returns the session and, for an interrupt with a message, the new turn.",
		InputSchema:  inputSchema[steerIn](nil),
		OutputSchema: outputSchema(&sessionv1.SteerTurnResponse{}, "the session and the new turn, if one started"),
		Annotations:  &mcpsdk.ToolAnnotations{DestructiveHint: &notDestructive},
	}, t.steer)

	add(s, &mcpsdk.Tool{
		Name:  "answer_approval",
		Title: "Answer a tool-call approval",
		Description: "Under approvals: ask, each tool call of the agent waits for a person. Without approval_id: lists the calls waiting (id, tool, input). " +
			"With approval_id and allow: true lets that call run, allow: false denies it (the agent is told it was denied). Returns the approvals, or the answered one.",
		InputSchema: inputSchema[approvalIn](nil),
		OutputSchema: mergedSchema("the approvals waiting (without approval_id) or the answered one",
			outputSchema(&sessionv1.ListApprovalsResponse{}, ""), outputSchema(&sessionv1.AnswerApprovalResponse{}, "")),
		Annotations: &mcpsdk.ToolAnnotations{DestructiveHint: &notDestructive},
	}, t.approval)
}

// add registers a tool whose handler returns the structured output: an
// error becomes a tool error (IsError, with hangar's code, reason and
// message), never a protocol failure.
func add[In any](s *mcpsdk.Server, tool *mcpsdk.Tool, call func(ctx context.Context, req *mcpsdk.CallToolRequest, in In) (json.RawMessage, error)) {
	mcpsdk.AddTool(s, tool, func(ctx context.Context, req *mcpsdk.CallToolRequest, in In) (*mcpsdk.CallToolResult, any, error) {
		out, err := call(ctx, req, in)
		if err != nil {
			return toolError(err), nil, nil
		}
		return nil, out, nil
	})
}

// result is a response as structured output.
func result(m proto.Message, err error) (json.RawMessage, error) {
	if err != nil {
		return nil, err
	}
	return toJSON(m)
}

func (t *tools) newSession(ctx context.Context, _ *mcpsdk.CallToolRequest, in newSessionIn) (json.RawMessage, error) {
	req := &sessionv1.CreateSessionRequest{
		Name: in.Name, Message: in.Message, Environment: in.Environment, Repo: in.Repo, Branch: in.Branch,
		Model: in.Model, IdleMinutes: in.IdleMinutes, CacheTtl: in.CacheTTL, HarnessLock: in.HarnessLock,
	}
	if strings.TrimSpace(in.Message) == "" {
		switch {
		case in.Message != "":
			return nil, fault.InvalidArgument("message", "message is empty: leave it out to only create the session")
		case in.Context != nil:
			return nil, fault.InvalidArgument("context", "context goes with a first turn: give a message")
		case in.OutputSchema != nil:
			return nil, fault.InvalidArgument("output_schema", "output_schema goes with a first turn: give a message")
		}
	}
	var err error
	if req.Harness, err = parseHarness(in.Harness); err != nil {
		return nil, err
	}
	switch in.Approvals {
	case "":
	case "never":
		req.Approvals = sessionv1.ApprovalMode_APPROVAL_MODE_NEVER
	case "ask":
		req.Approvals = sessionv1.ApprovalMode_APPROVAL_MODE_ASK
	default:
		return nil, fault.InvalidArgument("approvals", "approvals %q: want never or ask", in.Approvals)
	}
	req.Budget = in.Budget.proto()
	if req.OutputSchemaJson, err = schemaJSON(in.OutputSchema); err != nil {
		return nil, err
	}
	if c := in.Context; c != nil {
		if req.Attachments, err = t.attachments(c.Files, c.Text); err != nil {
			return nil, err
		}
		if c.FromLocal != "" {
			if t.local == nil {
				return nil, fault.InvalidArgument("context.from_local", "context.from_local reads a checkout beside the MCP server, and this one runs inside hangar, where your checkout is not: run `hangar mcp` (stdio) on the machine that has it")
			}
			if req.FromLocal, err = t.local.Work(ctx, t.localPath(c.FromLocal)); err != nil {
				return nil, fault.InvalidArgument("context.from_local", "context.from_local %s: %s", c.FromLocal, strings.TrimPrefix(err.Error(), "--from-local: "))
			}
		}
	}
	if t.local != nil {
		switch {
		case in.Repo != "":
			// A local directory is sent as its repository's top level.
			if p := t.localPath(in.Repo); isDir(p) {
				req.Repo = p
				if top := t.local.Repository(ctx, p); top != "" {
					req.Repo = top
				}
			}
		case in.Environment == "":
			req.WorkingRepository = t.local.Repository(ctx, t.local.Dir())
		}
	}
	return result(t.sessions.CreateSession(ctx, req))
}

func (t *tools) listSessions(ctx context.Context, _ *mcpsdk.CallToolRequest, in listSessionsIn) (json.RawMessage, error) {
	req := &sessionv1.ListSessionsRequest{PageSize: in.PageSize, PageToken: in.PageToken, ParentId: in.Parent}
	for i, s := range in.States {
		v, ok := sessionv1.SessionState_value["SESSION_STATE_"+strings.ToUpper(s)]
		if !ok || v == 0 {
			return nil, fault.InvalidArgument(fmt.Sprintf("states[%d]", i), "states[%d] %q: want one of running, idle, suspending, suspended, resuming, needs_input, archived, failed", i, s)
		}
		req.States = append(req.States, sessionv1.SessionState(v))
	}
	return result(t.sessions.ListSessions(ctx, req))
}

func (t *tools) send(ctx context.Context, _ *mcpsdk.CallToolRequest, in sendIn) (json.RawMessage, error) {
	req := &sessionv1.SendMessageRequest{Name: in.Session, Message: in.Message, Budget: in.Budget.proto()}
	var err error
	if req.Harness, err = parseHarness(in.Harness); err != nil {
		return nil, err
	}
	if req.OutputSchemaJson, err = schemaJSON(in.OutputSchema); err != nil {
		return nil, err
	}
	if c := in.Context; c != nil {
		if req.Attachments, err = t.attachments(c.Files, c.Text); err != nil {
			return nil, err
		}
	}
	return result(t.sessions.SendMessage(ctx, req))
}

func (t *tools) open(ctx context.Context, _ *mcpsdk.CallToolRequest, in sessionIn) (json.RawMessage, error) {
	return result(t.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: in.Session}))
}

func (t *tools) keep(ctx context.Context, _ *mcpsdk.CallToolRequest, in keepIn) (json.RawMessage, error) {
	return result(t.sessions.KeepSession(ctx, &sessionv1.KeepSessionRequest{Name: in.Session, IdleMinutes: in.IdleMinutes}))
}

func (t *tools) suspend(ctx context.Context, _ *mcpsdk.CallToolRequest, in sessionIn) (json.RawMessage, error) {
	return result(t.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: in.Session}))
}

func (t *tools) get(ctx context.Context, _ *mcpsdk.CallToolRequest, in sessionIn) (json.RawMessage, error) {
	return result(t.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: in.Session}))
}

func (t *tools) events(ctx context.Context, _ *mcpsdk.CallToolRequest, in eventsIn) (json.RawMessage, error) {
	return result(t.sessions.ListEvents(ctx, &sessionv1.ListEventsRequest{Name: in.Session, AfterSeq: in.AfterSeq, Turn: in.Turn, PageSize: in.PageSize}))
}

// wait follows the turn's stream: each event is a progress notification
// (when the client asked for them with a progress token), the end is the
// result. The stream only reads: ending it, as a cancelled call does,
// leaves the turn running.
func (t *tools) wait(ctx context.Context, req *mcpsdk.CallToolRequest, in waitIn) (json.RawMessage, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := t.sessions.WaitForTurn(ctx, &sessionv1.WaitForTurnRequest{Name: in.Session, Turn: in.Turn})
	if err != nil {
		return nil, err
	}
	token := req.Params.GetProgressToken()
	progress := 0
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, fault.Unavailable("TURN_STREAM_ENDED", "hangar stopped sending the turn's updates before it ended: call wait_for_turn again, or get_session to see where it stands")
		}
		if err != nil {
			return nil, err
		}
		switch u := resp.GetUpdate().(type) {
		case *sessionv1.WaitForTurnResponse_Progress:
			if token == nil {
				continue
			}
			progress++
			if err := req.Session.NotifyProgress(ctx, &mcpsdk.ProgressNotificationParams{
				ProgressToken: token, Progress: float64(progress), Message: eventLine(u.Progress),
			}); err != nil {
				t.logger.Debug("mcp progress notification not sent", "err", err)
			}
		case *sessionv1.WaitForTurnResponse_Result:
			return toJSON(u.Result)
		}
	}
}

func (t *tools) artifact(ctx context.Context, _ *mcpsdk.CallToolRequest, in artifactIn) (json.RawMessage, error) {
	if in.Path == "" {
		return result(t.sessions.ListArtifacts(ctx, &sessionv1.ListArtifactsRequest{Name: in.Session, Turn: in.Turn}))
	}
	resp, err := t.sessions.GetArtifact(ctx, &sessionv1.GetArtifactRequest{Name: in.Session, Path: in.Path, Turn: in.Turn})
	if err != nil {
		return nil, err
	}
	out, err := toJSON(resp)
	if err != nil || !utf8.Valid(resp.GetContent()) {
		return out, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(out, &fields); err != nil {
		return nil, err
	}
	text, err := json.Marshal(string(resp.GetContent()))
	if err != nil {
		return nil, err
	}
	fields["text"] = text
	return json.Marshal(fields)
}

func (t *tools) patch(ctx context.Context, _ *mcpsdk.CallToolRequest, in sessionIn) (json.RawMessage, error) {
	return result(t.sessions.GetSessionPatch(ctx, &sessionv1.GetSessionPatchRequest{Name: in.Session}))
}

func (t *tools) fork(ctx context.Context, _ *mcpsdk.CallToolRequest, in forkIn) (json.RawMessage, error) {
	req := &sessionv1.ForkSessionRequest{Name: in.Session, N: in.N, Message: in.Message, Names: in.Names}
	var err error
	if req.Harness, err = parseHarness(in.Harness); err != nil {
		return nil, err
	}
	return result(t.sessions.ForkSession(ctx, req))
}

func (t *tools) forkRun(ctx context.Context, _ *mcpsdk.CallToolRequest, in forkRunIn) (json.RawMessage, error) {
	req := &replayv1.ForkRunRequest{Run: in.Run, AtSeq: in.AtSeq, Continuations: in.Continuations, WaitSeconds: in.WaitSeconds, PinSet: in.PinSet}
	switch in.OnDivergence {
	case "":
	case "stop":
		req.OnDivergence = replayv1.OnDivergence_ON_DIVERGENCE_STOP
	case "live":
		req.OnDivergence = replayv1.OnDivergence_ON_DIVERGENCE_LIVE
	default:
		return nil, fault.InvalidArgument("on_divergence", "on_divergence %q: want stop or live", in.OnDivergence)
	}
	if b := in.Budget; b != nil {
		req.Budget = &replayv1.Budget{MaxCostUsd: b.MaxCostUSD, MaxTokens: b.MaxTokens, MaxMinutes: b.MaxMinutes}
	}
	return result(t.replay.ForkRun(ctx, req))
}

func (t *tools) getFork(ctx context.Context, _ *mcpsdk.CallToolRequest, in getForkIn) (json.RawMessage, error) {
	return result(t.replay.GetFork(ctx, &replayv1.GetForkRequest{Fork: in.Fork}))
}

func (t *tools) steer(ctx context.Context, _ *mcpsdk.CallToolRequest, in steerIn) (json.RawMessage, error) {
	return result(t.sessions.SteerTurn(ctx, &sessionv1.SteerTurnRequest{Name: in.Session, Message: in.Message, Interrupt: in.Interrupt}))
}

func (t *tools) approval(ctx context.Context, _ *mcpsdk.CallToolRequest, in approvalIn) (json.RawMessage, error) {
	if in.ApprovalID == "" {
		if in.Allow != nil {
			return nil, fault.InvalidArgument("approval_id", "allow needs approval_id: the call to answer (call without either to list them)")
		}
		return result(t.sessions.ListApprovals(ctx, &sessionv1.ListApprovalsRequest{Name: in.Session, All: in.All}))
	}
	if in.Allow == nil {
		return nil, fault.InvalidArgument("allow", "allow is missing: true lets call %s run, false denies it", in.ApprovalID)
	}
	return result(t.sessions.AnswerApproval(ctx, &sessionv1.AnswerApprovalRequest{Name: in.Session, ApprovalId: in.ApprovalID, Allow: *in.Allow}))
}

// attachments are context.files then context.text, as the CLI's --file
// and --text.
func (t *tools) attachments(files []fileIn, texts []string) ([]*sessionv1.Attachment, error) {
	var out []*sessionv1.Attachment
	for i, f := range files {
		field := fmt.Sprintf("context.files[%d]", i)
		switch {
		case f.Path != "" && f.Content != "":
			return nil, fault.InvalidArgument(field, "%s: give path or content, not both", field)
		case f.Path != "":
			if t.local == nil {
				return nil, fault.InvalidArgument(field+".path", "%s.path reads a file beside the MCP server, and this one runs inside hangar, where your files are not: give the file's content instead, or run `hangar mcp` (stdio)", field)
			}
			b, err := t.local.ReadFile(t.localPath(f.Path))
			if err != nil {
				var pe *os.PathError
				if errors.As(err, &pe) {
					err = pe.Err
				}
				return nil, fault.InvalidArgument(field+".path", "%s.path %s: %v", field, f.Path, err)
			}
			name := f.Name
			if name == "" {
				name = filepath.Base(f.Path)
			}
			out = append(out, &sessionv1.Attachment{Name: name, Content: &sessionv1.Attachment_File{File: b}})
		case f.Name == "":
			return nil, fault.InvalidArgument(field+".name", "%s: content needs a name", field)
		default:
			out = append(out, &sessionv1.Attachment{Name: f.Name, Content: &sessionv1.Attachment_File{File: []byte(f.Content)}})
		}
	}
	for i, text := range texts {
		if strings.TrimSpace(text) == "" {
			return nil, fault.InvalidArgument(fmt.Sprintf("context.text[%d]", i), "context.text[%d] is empty", i)
		}
		out = append(out, &sessionv1.Attachment{Name: fmt.Sprintf("text-%d", i+1), Content: &sessionv1.Attachment_Text{Text: text}})
	}
	return out, nil
}

// localPath is p against the local directory.
func (t *tools) localPath(p string) string {
	if filepath.IsAbs(p) || t.local == nil {
		return p
	}
	return filepath.Join(t.local.Dir(), p)
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

func (b *budgetIn) proto() *sessionv1.Budget {
	if b == nil {
		return nil
	}
	return &sessionv1.Budget{MaxCostUsd: b.MaxCostUSD, MaxTokens: b.MaxTokens, MaxMinutes: b.MaxMinutes}
}

func parseHarness(s string) (sessionv1.Harness, error) {
	if s == "" {
		return sessionv1.Harness_HARNESS_UNSPECIFIED, nil
	}
	if v, ok := sessionv1.Harness_value["HARNESS_"+strings.ToUpper(s)]; ok && v != 0 {
		return sessionv1.Harness(v), nil
	}
	return 0, fault.InvalidArgument("harness", "harness %q: want claude, codex, pi or antigravity", s)
}

// schemaJSON is output_schema as the API takes it.
func schemaJSON(schema map[string]any) (string, error) {
	if schema == nil {
		return "", nil
	}
	b, err := json.Marshal(schema)
	if err != nil {
		return "", fault.InvalidArgument("output_schema", "output_schema: %v", err)
	}
	return string(b), nil
}

// eventLine is an event as one progress message: "turn 2 command: go test ./... (exit 1)".
func eventLine(e *sessionv1.Event) string {
	kind := strings.ToLower(strings.TrimPrefix(e.GetKind().String(), "EVENT_KIND_"))
	text := strings.Join(strings.Fields(e.GetText()), " ")
	if text == "" {
		text = e.GetPath()
	}
	if r := []rune(text); len(r) > 200 {
		text = string(r[:200]) + "…"
	}
	line := fmt.Sprintf("turn %d %s: %s", e.GetTurn(), kind, text)
	if e.GetKind() == sessionv1.EventKind_EVENT_KIND_COMMAND && e.GetExitCode() != 0 {
		line += fmt.Sprintf(" (exit %d)", e.GetExitCode())
	}
	return line
}
