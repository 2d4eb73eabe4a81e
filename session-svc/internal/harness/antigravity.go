package harness

import (
	"encoding/json"
	"fmt"
	"path"
	"strings"
)

// Antigravity's CLI (agy) is not installed here: its command follows the
// spec (`agy --conversation <id>` continues a conversation) and its parser
// is best effort, reading the fields common to agent JSON streams. It has
// no fork: the orchestrator starts a new conversation with a Handoff.

type antigravityAdapter struct{}

func (antigravityAdapter) Name() Name    { return Antigravity }
func (antigravityAdapter) CanFork() bool { return false }

func agyHome(sb Sandbox) string { return path.Join(sb.HomeDir, ".antigravity") }

// Invocation: `agy -p MSG --output-format json [--conversation ID]`. The
// gateway goes in HANGAR_* variables and the Anthropic/OpenAI base URL
// variables. A fork is refused: the orchestrator uses a handoff.
func (antigravityAdapter) Invocation(sb Sandbox, gw Gateway, turn Turn, opts Options) (Invocation, error) {
	if err := checkSandbox(sb, turn); err != nil {
		return Invocation{}, err
	}
	if turn.ForkFrom != "" {
		return Invocation{}, fmt.Errorf("harness: antigravity cannot fork conversation %q: start a new one with a handoff", turn.ForkFrom)
	}
	argv := []string{orDefault(opts.AgyBin, "agy"), "-p", promptArg(turn.Message), "--output-format", "json"}
	if turn.ConversationID != "" {
		argv = append(argv, "--conversation", turn.ConversationID)
	}
	if gw.Model != "" {
		argv = append(argv, "--model", gw.Model)
	}
	env := map[string]string{
		"HOME":             sb.HomeDir,
		"IS_SANDBOX":       "1",
		codexTokenEnv:      gw.Token,
		"ANTIGRAVITY_HOME": agyHome(sb),
	}
	if gw.AnthropicBaseURL != "" {
		env["ANTHROPIC_BASE_URL"] = gw.AnthropicBaseURL
		env["ANTHROPIC_API_KEY"] = gw.Token
	}
	if gw.OpenAIBaseURL != "" {
		env["OPENAI_BASE_URL"] = gw.OpenAIBaseURL
		env["OPENAI_API_KEY"] = gw.Token
	}
	return Invocation{Argv: argv, Env: env, Cwd: sb.WorkDir, ConversationID: turn.ConversationID}, nil
}

// ConversationPaths is Antigravity's home under HomeDir.
func (antigravityAdapter) ConversationPaths(sb Sandbox, _ string) []string {
	return []string{agyHome(sb)}
}

func (antigravityAdapter) ResumeCommand(id string) string {
	return "agy --conversation " + shellQuote(id)
}

func (antigravityAdapter) NewParser() Parser { return &genericParser{} }

// genericParser reads the fields agent JSON streams commonly carry: a
// conversation id (session_id, conversation_id, conversationId, thread_id),
// text (assistant messages, result), tool calls, usage and errors.
type genericParser struct {
	res  Result
	done bool
}

type genericLine struct {
	Type           string          `json:"type"`
	Role           string          `json:"role"`
	SessionID      string          `json:"session_id"`
	ConversationID string          `json:"conversation_id"`
	ConversationId string          `json:"conversationId"` //nolint:revive // the wire name
	ThreadID       string          `json:"thread_id"`
	Text           string          `json:"text"`
	Content        json.RawMessage `json:"content"`
	Result         *string         `json:"result"`
	Name           string          `json:"name"`
	Command        string          `json:"command"`
	ExitCode       *int            `json:"exit_code"`
	Path           string          `json:"path"`
	Error          json.RawMessage `json:"error"`
	IsError        bool            `json:"is_error"`
	Usage          *struct {
		InputTokens  int64   `json:"input_tokens"`
		OutputTokens int64   `json:"output_tokens"`
		CostUSD      float64 `json:"cost_usd"`
	} `json:"usage"`
}

func (p *genericParser) Line(line []byte) []Event {
	var l genericLine
	if evs, ok := decode(line, &l); !ok {
		return evs
	}
	r := raw(line)
	if id := orDefault(l.ConversationID, orDefault(l.ConversationId, orDefault(l.SessionID, l.ThreadID))); id != "" {
		p.res.ConversationID = id
	}
	var evs []Event
	text := l.Text
	if text == "" {
		var s string
		if json.Unmarshal(l.Content, &s) == nil {
			text = s
		}
	}
	switch {
	case l.Command != "":
		code := 0
		if l.ExitCode != nil {
			code = *l.ExitCode
		}
		evs = append(evs, Event{Kind: EventCommand, Command: l.Command, ExitCode: code, Text: clip(text), Raw: r})
	case l.Path != "" && strings.Contains(l.Type, "file"):
		evs = append(evs, Event{Kind: EventFileChange, Path: l.Path, Raw: r})
	case strings.Contains(l.Type, "tool") && l.Name != "":
		evs = append(evs, Event{Kind: EventToolCall, Text: l.Name, Raw: r})
	case l.Result != nil:
		p.done = true
		p.res.Text = *l.Result
	case text != "" && (l.Role == "assistant" || l.Type == "message" || l.Type == "assistant"):
		p.res.Text = text
		evs = append(evs, Event{Kind: EventMessage, Text: text, Raw: r})
	}
	if l.Type == "result" || l.Type == "done" || l.Type == "end" {
		p.done = true
	}
	if msg := errorText(l.Error); msg != "" || l.IsError || l.Type == "error" {
		msg = orDefault(msg, orDefault(text, "error"))
		p.res.IsError, p.res.ErrorText = true, msg
		evs = append(evs, Event{Kind: EventError, Text: msg, Raw: r})
	}
	if l.Usage != nil {
		u := Usage{InputTokens: l.Usage.InputTokens, OutputTokens: l.Usage.OutputTokens, CostUSD: l.Usage.CostUSD}
		p.res.Usage.Add(u)
		evs = append(evs, Event{Kind: EventUsage, Usage: &u, Raw: r})
	}
	return evs
}

func errorText(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &o) == nil && o.Message != "" {
		return o.Message
	}
	return string(raw)
}

func (p *genericParser) Result() Result {
	res := p.res
	if !p.done && !res.IsError && res.Text == "" {
		res.IsError = true
		res.ErrorText = "the stream ended without an answer"
	}
	return res
}
