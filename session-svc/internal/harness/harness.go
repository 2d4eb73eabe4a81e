// Package harness adapts the agent CLIs hangar runs in sandboxes (Claude
// Code, Codex, pi, Antigravity): the command line and environment of a turn
// (first turn, resume, fork), the parsing of each CLI's JSON event stream
// into hangar events and usage, the conversation files to checkpoint, and
// the handoff that starts a prompt when a session switches harness.
//
// Adapters build commands; they run nothing. The orchestrator writes the
// Invocation's Files, runs Argv with Env in Cwd through the sandbox service's
// exec stream with stdin closed, and feeds each stdout line to a Parser.
package harness

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strings"
)

// Name names a harness.
type Name string

// The harnesses.
const (
	Claude      Name = "claude"
	Codex       Name = "codex"
	Pi          Name = "pi"
	Antigravity Name = "antigravity"
)

// Names lists every harness, in a stable order.
func Names() []Name { return []Name{Claude, Codex, Pi, Antigravity} }

// Lookup returns the adapter of the harness name.
func Lookup(name Name) (Adapter, error) {
	switch name {
	case Claude:
		return claudeAdapter{}, nil
	case Codex:
		return codexAdapter{}, nil
	case Pi:
		return piAdapter{}, nil
	case Antigravity:
		return antigravityAdapter{}, nil
	}
	return nil, fmt.Errorf("harness: unknown harness %q (known: claude, codex, pi, antigravity)", string(name))
}

// Sandbox is where a turn runs: absolute paths inside the sandbox.
// The CLI runs with HOME=HomeDir and its config home under it.
type Sandbox struct{ WorkDir, HomeDir string }

// Gateway is the run-scoped model gateway a turn talks to.
type Gateway struct {
	// AnthropicBaseURL is the run's base URL without /v1 (ANTHROPIC_BASE_URL).
	AnthropicBaseURL string
	// OpenAIBaseURL is the run's base URL with /v1 (Codex's provider
	// base_url, pi's provider baseUrl).
	OpenAIBaseURL string
	// Token is the run token, sent as the API key.
	Token string
	// Model is the model name; "" means the adapter's default.
	Model string
}

// Turn is one agent turn of a session.
type Turn struct {
	Message string
	// ConversationID resumes this conversation; "" on the first turn.
	ConversationID string
	// ForkFrom forks this conversation on this turn (the first turn of a
	// fork); "" otherwise. It wins over ConversationID.
	ForkFrom string
	// NewConversationID is the id to create on a first turn or a fork
	// (Claude Code, pi; a UUID is generated when ""). Codex picks its own
	// id (thread.started) and ignores it.
	NewConversationID string
}

// File is a file the orchestrator writes before running the command.
type File struct {
	Path    string // absolute
	Content []byte
	Mode    uint32
}

// Invocation is the command of one turn.
type Invocation struct {
	Argv []string
	// Env holds the complete additions to the sandbox's environment; it
	// never sets PATH (the CLIs are found on the sandbox's own).
	Env map[string]string
	// PathPrepend are directories put in front of the sandbox's PATH.
	PathPrepend []string
	// Files are written first (config files).
	Files []File
	// Cwd is the work tree.
	Cwd string
	// ConversationID is the id this run uses when known in advance (Claude
	// Code, pi); "" for Codex, whose id comes from its stream.
	ConversationID string
}

// Options locates the CLIs inside the sandbox.
type Options struct {
	ClaudeBin, CodexBin, PiBin string // default "claude", "codex", "pi"
	// AgyBin is Antigravity's CLI; default "agy".
	AgyBin string
	// PiNodeBinDir is a directory holding node >= 22.19, put first on pi's
	// PATH; "" leaves PATH alone.
	PiNodeBinDir string
}

// Adapter drives one harness.
type Adapter interface {
	Name() Name
	// Invocation builds the command of a turn.
	Invocation(sb Sandbox, gw Gateway, turn Turn, opts Options) (Invocation, error)
	// NewParser returns a parser for one run's stdout.
	NewParser() Parser
	// ConversationPaths lists the files and directories to checkpoint so
	// the conversation resumes later, absolute in the sandbox.
	ConversationPaths(sb Sandbox, conversationID string) []string
	// ResumeCommand is what a person runs in the sandbox to continue the
	// conversation.
	ResumeCommand(conversationID string) string
	// CanFork reports whether the CLI forks conversations itself; when not,
	// the orchestrator starts a new conversation with a Handoff.
	CanFork() bool
}

// Parser turns a CLI's stdout, one line at a time, into events. A Parser is
// used by one goroutine.
type Parser interface {
	// Line parses one stdout line. Lines that are not JSON become nothing
	// (blank) or an error event; Line never panics.
	Line(line []byte) []Event
	// Result is the outcome of the run, after the stream ended.
	Result() Result
}

// EventKind is the kind of an Event.
type EventKind string

// Event kinds.
const (
	EventMessage    EventKind = "message"     // the agent said Text
	EventCommand    EventKind = "command"     // Command ran (ExitCode, output in Text)
	EventFileChange EventKind = "file_change" // Path was written or edited (Text: what)
	EventError      EventKind = "error"       // Text
	EventUsage      EventKind = "usage"       // Usage
	EventToolCall   EventKind = "tool_call"   // the agent called the tool Text (input in Raw)
)

// Event is something the agent did.
type Event struct {
	Kind     EventKind
	Text     string
	Command  string
	ExitCode int
	Path     string
	Usage    *Usage
	// Raw is the stream line the event came from.
	Raw json.RawMessage
}

// Usage is model usage.
type Usage struct {
	InputTokens, OutputTokens, CacheReadTokens, CacheWriteTokens int64
	CostUSD                                                      float64
	ModelCalls                                                   int
}

// Add adds u2 to u.
func (u *Usage) Add(u2 Usage) {
	u.InputTokens += u2.InputTokens
	u.OutputTokens += u2.OutputTokens
	u.CacheReadTokens += u2.CacheReadTokens
	u.CacheWriteTokens += u2.CacheWriteTokens
	u.CostUSD += u2.CostUSD
	u.ModelCalls += u2.ModelCalls
}

// Result is the outcome of a run as the CLI reported it.
type Result struct {
	ConversationID string
	// Text is the agent's final answer.
	Text      string
	Usage     Usage
	IsError   bool
	ErrorText string
	// Turns is the CLI's count of agent turns (Claude Code: num_turns;
	// Codex: turn.completed events; pi: turn_end events, one per model call).
	Turns int
	// UsageCumulative says Usage adds up every run of the conversation so
	// far, not this run alone (Codex reports thread totals, a fork's
	// including its parent's): subtract the total after the previous run
	// (Usage.Sub).
	UsageCumulative bool
}

// Sub returns u minus prev, never below zero (a cumulative total after
// this run minus the one after the previous run).
func (u Usage) Sub(prev Usage) Usage {
	pos := func(a, b int64) int64 { return max(a-b, 0) }
	return Usage{
		InputTokens:      pos(u.InputTokens, prev.InputTokens),
		OutputTokens:     pos(u.OutputTokens, prev.OutputTokens),
		CacheReadTokens:  pos(u.CacheReadTokens, prev.CacheReadTokens),
		CacheWriteTokens: pos(u.CacheWriteTokens, prev.CacheWriteTokens),
		CostUSD:          max(u.CostUSD-prev.CostUSD, 0),
		ModelCalls:       max(u.ModelCalls-prev.ModelCalls, 0),
	}
}

// maxOutput bounds the command output kept in an event's Text.
const maxOutput = 8 << 10

func clip(s string) string {
	if len(s) <= maxOutput {
		return s
	}
	return s[:maxOutput] + "\n…(truncated)"
}

// newUUID returns a random version 4 UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// checkSandbox validates the paths and message shared by every harness.
func checkSandbox(sb Sandbox, turn Turn) error {
	if !path.IsAbs(sb.WorkDir) || !path.IsAbs(sb.HomeDir) {
		return fmt.Errorf("harness: sandbox paths must be absolute: work dir %q, home %q", sb.WorkDir, sb.HomeDir)
	}
	if strings.TrimSpace(turn.Message) == "" {
		return fmt.Errorf("harness: empty message")
	}
	return nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// shellQuote quotes s for a POSIX shell when needed.
// ShellQuote quotes s for sh when it needs it.
func ShellQuote(s string) string { return shellQuote(s) }

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:@,+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// EnvList renders env as sorted KEY=VALUE pairs (for exec APIs taking a list).
func EnvList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// decode unmarshals a stream line into v; a line that isn't a JSON object
// yields an error event (blank lines yield nothing).
func decode(line []byte, v any) ([]Event, bool) {
	trimmed := strings.TrimSpace(string(line))
	if trimmed == "" {
		return nil, false
	}
	if err := json.Unmarshal([]byte(trimmed), v); err != nil {
		return []Event{{Kind: EventError, Text: "unparsed output: " + clip(trimmed)}}, false
	}
	return nil, true
}

// raw copies line (the caller's buffer may be reused).
func raw(line []byte) json.RawMessage {
	trimmed := strings.TrimSpace(string(line))
	return json.RawMessage(trimmed)
}

// promptArg keeps a message that starts with '-' from being read as a flag
// by the CLIs' option parsers: it gets a leading space.
func promptArg(msg string) string {
	if strings.HasPrefix(msg, "-") {
		return " " + msg
	}
	return msg
}
