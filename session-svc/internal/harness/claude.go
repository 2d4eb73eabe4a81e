package harness

import (
	"encoding/json"
	"fmt"
	"path"
	"strings"
)

// DefaultClaudeModel is Claude Code's model when Gateway.Model is "".
const DefaultClaudeModel = "claude-sonnet-4-5"

type claudeAdapter struct{}

func (claudeAdapter) Name() Name    { return Claude }
func (claudeAdapter) CanFork() bool { return true }

func claudeConfigDir(sb Sandbox) string { return path.Join(sb.HomeDir, ".claude") }

// claudeProjectDir is where Claude Code keeps the conversations started in
// workDir: every non-alphanumeric character of the path becomes '-'.
func claudeProjectDir(sb Sandbox) string {
	var b strings.Builder
	for _, r := range sb.WorkDir {
		if r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	return path.Join(claudeConfigDir(sb), "projects", b.String())
}

// Invocation: `claude -p MSG --output-format stream-json --verbose
// --dangerously-skip-permissions --model M` plus `--session-id NEW` (first
// turn), `--resume ID` (later turns) or `--resume PARENT --fork-session
// --session-id NEW` (fork). As root, --dangerously-skip-permissions needs
// IS_SANDBOX=1.
func (claudeAdapter) Invocation(sb Sandbox, gw Gateway, turn Turn, opts Options) (Invocation, error) {
	if err := checkSandbox(sb, turn); err != nil {
		return Invocation{}, err
	}
	if gw.AnthropicBaseURL == "" || gw.Token == "" {
		return Invocation{}, fmt.Errorf("harness: claude needs the gateway's Anthropic base URL and a token")
	}
	argv := []string{orDefault(opts.ClaudeBin, "claude"), "-p", promptArg(turn.Message)}
	var id string
	switch {
	case turn.ForkFrom != "":
		id = orDefault(turn.NewConversationID, newUUID())
		argv = append(argv, "--resume", turn.ForkFrom, "--fork-session", "--session-id", id)
	case turn.ConversationID != "":
		id = turn.ConversationID
		argv = append(argv, "--resume", id)
	default:
		id = orDefault(turn.NewConversationID, newUUID())
		argv = append(argv, "--session-id", id)
	}
	argv = append(argv, "--output-format", "stream-json", "--verbose",
		"--dangerously-skip-permissions", "--model", orDefault(gw.Model, DefaultClaudeModel))
	return Invocation{
		Argv: argv,
		Env: map[string]string{
			"HOME":               sb.HomeDir,
			"CLAUDE_CONFIG_DIR":  claudeConfigDir(sb),
			"ANTHROPIC_BASE_URL": strings.TrimSuffix(gw.AnthropicBaseURL, "/"),
			"ANTHROPIC_API_KEY":  gw.Token,
			"IS_SANDBOX":         "1",
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
			"DISABLE_AUTOUPDATER":                      "1",
		},
		Cwd:            sb.WorkDir,
		ConversationID: id,
	}, nil
}

// ConversationPaths is the project directory of WorkDir: it holds the
// conversation's .jsonl (a fork's file carries its full history) and its
// side files. Resume only finds conversations there, so the work tree must be
// restored at the same path.
func (claudeAdapter) ConversationPaths(sb Sandbox, _ string) []string {
	return []string{claudeProjectDir(sb)}
}

func (claudeAdapter) ResumeCommand(id string) string {
	return "claude --resume " + shellQuote(id)
}

func (claudeAdapter) NewParser() Parser {
	return &claudeParser{tools: map[string]claudeTool{}, calls: map[string]bool{}}
}

type claudeTool struct {
	name  string
	input json.RawMessage
}

type claudeParser struct {
	res   Result
	tools map[string]claudeTool // tool_use id → call
	calls map[string]bool       // assistant message ids seen
	last  string                // last assistant text
	done  bool                  // a result line came
}

type claudeLine struct {
	Type      string `json:"type"`
	Subtype   string `json:"subtype"`
	SessionID string `json:"session_id"`
	Message   struct {
		ID      string          `json:"id"`
		Content json.RawMessage `json:"content"`
	} `json:"message"`
	// result
	Result       string   `json:"result"`
	IsError      bool     `json:"is_error"`
	NumTurns     int      `json:"num_turns"`
	TotalCostUSD float64  `json:"total_cost_usd"`
	Usage        *anthUse `json:"usage"`
	Errors       []string `json:"errors"`
	// SinceLast is this run's usage per model; total_cost_usd and
	// modelUsage add up every earlier run of a resumed conversation.
	SinceLast map[string]struct {
		CostUSD float64 `json:"costUSD"`
	} `json:"model_usage_since_last_result"`
}

type anthUse struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
}

type claudeBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

// Line: assistant text → message; tool_use → tool_call; a tool's result →
// command (Bash: the command, its output and exit code 1 on error, else 0)
// or file_change (Write, Edit, MultiEdit, NotebookEdit that succeeded);
// result → usage.
func (p *claudeParser) Line(line []byte) []Event {
	var l claudeLine
	if evs, ok := decode(line, &l); !ok {
		return evs
	}
	r := raw(line)
	if l.SessionID != "" {
		p.res.ConversationID = l.SessionID
	}
	var evs []Event
	switch l.Type {
	case "assistant":
		if l.Message.ID != "" {
			p.calls[l.Message.ID] = true
		}
		for _, b := range claudeBlocks(l.Message.Content) {
			switch b.Type {
			case "text":
				if strings.TrimSpace(b.Text) == "" {
					continue
				}
				p.last = b.Text
				evs = append(evs, Event{Kind: EventMessage, Text: b.Text, Raw: r})
			case "tool_use":
				p.tools[b.ID] = claudeTool{name: b.Name, input: b.Input}
				evs = append(evs, Event{Kind: EventToolCall, Text: b.Name, Raw: r})
			}
		}
	case "user":
		for _, b := range claudeBlocks(l.Message.Content) {
			if b.Type != "tool_result" {
				continue
			}
			if ev, ok := p.toolDone(b, r); ok {
				evs = append(evs, ev)
			}
		}
	case "result":
		p.done = true
		p.res.Text = l.Result
		p.res.IsError = l.IsError || (l.Subtype != "" && l.Subtype != "success")
		if p.res.IsError {
			p.res.ErrorText = orDefault(strings.Join(l.Errors, "; "), orDefault(l.Result, l.Subtype))
		}
		p.res.Turns = l.NumTurns
		u := Usage{CostUSD: l.TotalCostUSD, ModelCalls: len(p.calls)}
		if l.SinceLast != nil {
			u.CostUSD = 0
			for _, m := range l.SinceLast {
				u.CostUSD += m.CostUSD
			}
		}
		if l.Usage != nil {
			u.InputTokens = l.Usage.InputTokens
			u.OutputTokens = l.Usage.OutputTokens
			u.CacheReadTokens = l.Usage.CacheReadInputTokens
			u.CacheWriteTokens = l.Usage.CacheCreationInputTokens
		}
		p.res.Usage = u
		evs = append(evs, Event{Kind: EventUsage, Usage: &u, Raw: r})
		if p.res.IsError {
			evs = append(evs, Event{Kind: EventError, Text: p.res.ErrorText, Raw: r})
		}
	}
	return evs
}

func (p *claudeParser) toolDone(b claudeBlock, r json.RawMessage) (Event, bool) {
	call, ok := p.tools[b.ToolUseID]
	if !ok {
		return Event{}, false
	}
	delete(p.tools, b.ToolUseID)
	var in struct {
		Command      string `json:"command"`
		FilePath     string `json:"file_path"`
		NotebookPath string `json:"notebook_path"`
	}
	_ = json.Unmarshal(call.input, &in)
	switch call.name {
	case "Bash":
		code := 0
		if b.IsError {
			code = 1
		}
		return Event{Kind: EventCommand, Command: in.Command, ExitCode: code, Text: clip(claudeResultText(b.Content)), Raw: r}, true
	case "Write", "Edit", "MultiEdit", "NotebookEdit":
		if b.IsError {
			return Event{Kind: EventError, Text: call.name + " " + in.FilePath + ": " + clip(claudeResultText(b.Content)), Raw: r}, true
		}
		return Event{Kind: EventFileChange, Path: orDefault(in.FilePath, in.NotebookPath), Text: strings.ToLower(call.name), Raw: r}, true
	}
	return Event{}, false
}

func claudeBlocks(content json.RawMessage) []claudeBlock {
	var blocks []claudeBlock
	if json.Unmarshal(content, &blocks) == nil {
		return blocks
	}
	var s string
	if json.Unmarshal(content, &s) == nil {
		return []claudeBlock{{Type: "text", Text: s}}
	}
	return nil
}

func claudeResultText(content json.RawMessage) string {
	var parts []string
	for _, b := range claudeBlocks(content) {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func (p *claudeParser) Result() Result {
	res := p.res
	if res.Text == "" {
		res.Text = p.last
	}
	if !p.done && !res.IsError {
		res.IsError = true
		res.ErrorText = "the stream ended without a result"
	}
	return res
}
