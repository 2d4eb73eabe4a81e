package harness

import (
	"encoding/json"
	"fmt"
	"path"
	"strings"
)

// DefaultPiModel is pi's model when Gateway.Model is "".
const DefaultPiModel = "gpt-5.5"

// piProvider is the provider models.json declares for the gateway.
const piProvider = "hangar"

type piAdapter struct{}

func (piAdapter) Name() Name    { return Pi }
func (piAdapter) CanFork() bool { return true }

func piAgentDir(sb Sandbox) string { return path.Join(sb.HomeDir, ".pi") }

// piSessionDir is where pi keeps the sessions started in WorkDir:
// "--" + the path without its leading '/', with '/', '\' and ':' as '-', + "--".
func piSessionDir(sb Sandbox) string {
	safe := strings.NewReplacer("/", "-", `\`, "-", ":", "-").Replace(strings.TrimPrefix(sb.WorkDir, "/"))
	return path.Join(piAgentDir(sb), "sessions", "--"+safe+"--")
}

// piModels is $PI_CODING_AGENT_DIR/models.json: the gateway as an OpenAI
// Chat Completions provider. The key is read from HANGAR_RUN_TOKEN (pi
// expands "${VAR}"), so no token is written to disk.
func piModels(gw Gateway) ([]byte, error) {
	cfg := map[string]any{"providers": map[string]any{piProvider: map[string]any{
		"baseUrl": gw.OpenAIBaseURL,
		"api":     "openai-completions",
		"apiKey":  "${" + codexTokenEnv + "}",
		"models":  []any{map[string]any{"id": orDefault(gw.Model, DefaultPiModel)}},
	}}}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("harness: pi models.json: %w", err)
	}
	return append(b, '\n'), nil
}

// Invocation: `pi -p --model hangar/M --mode json --session-id ID MSG`
// (creates the session, or resumes it when it exists) or `... --fork PARENT
// --session-id NEW MSG`. pi 1.6 needs node >= 22.19: Options.PiNodeBinDir
// goes first on PATH.
func (piAdapter) Invocation(sb Sandbox, gw Gateway, turn Turn, opts Options) (Invocation, error) {
	if err := checkSandbox(sb, turn); err != nil {
		return Invocation{}, err
	}
	if gw.OpenAIBaseURL == "" || gw.Token == "" {
		return Invocation{}, fmt.Errorf("harness: pi needs the gateway's OpenAI base URL and a token")
	}
	models, err := piModels(gw)
	if err != nil {
		return Invocation{}, err
	}
	argv := []string{orDefault(opts.PiBin, "pi"), "-p", "--model", piProvider + "/" + orDefault(gw.Model, DefaultPiModel), "--mode", "json"}
	var id string
	switch {
	case turn.ForkFrom != "":
		id = orDefault(turn.NewConversationID, newUUID())
		argv = append(argv, "--fork", turn.ForkFrom, "--session-id", id)
	case turn.ConversationID != "":
		id = turn.ConversationID
		argv = append(argv, "--session-id", id)
	default:
		id = orDefault(turn.NewConversationID, newUUID())
		argv = append(argv, "--session-id", id)
	}
	argv = append(argv, promptArg(turn.Message))
	dir := piAgentDir(sb)
	env := map[string]string{
		"HOME":                sb.HomeDir,
		"PI_CODING_AGENT_DIR": dir,
		"PI_OFFLINE":          "1",
		codexTokenEnv:         gw.Token,
	}
	var pathPrepend []string
	if opts.PiNodeBinDir != "" {
		pathPrepend = []string{opts.PiNodeBinDir}
	}
	return Invocation{
		Argv:           argv,
		Env:            env,
		PathPrepend:    pathPrepend,
		Files:          []File{{Path: path.Join(dir, "models.json"), Content: models, Mode: 0o600}},
		Cwd:            sb.WorkDir,
		ConversationID: id,
	}, nil
}

// ConversationPaths is pi's session directory for WorkDir (a fork's file
// copies the history and names its parentSession there).
func (piAdapter) ConversationPaths(sb Sandbox, _ string) []string {
	return []string{piSessionDir(sb)}
}

func (piAdapter) ResumeCommand(id string) string {
	return "pi --session-id " + shellQuote(id)
}

func (piAdapter) NewParser() Parser { return &piParser{} }

type piParser struct {
	res     Result
	args    map[string]json.RawMessage // tool call id → arguments
	settled bool
	failed  bool
}

type piLine struct {
	Type       string          `json:"type"`
	ID         string          `json:"id"`
	Message    piMessage       `json:"message"`
	ToolCallID string          `json:"toolCallId"`
	ToolName   string          `json:"toolName"`
	Args       json.RawMessage `json:"args"`
	Result     struct {
		Content           json.RawMessage `json:"content"`
		StructuredContent struct {
			ExitCode *int `json:"exit_code"`
		} `json:"structuredContent"`
	} `json:"result"`
	IsError bool `json:"isError"`
	Aborted bool `json:"aborted"`
}

type piMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Usage   *struct {
		Input      int64 `json:"input"`
		Output     int64 `json:"output"`
		CacheRead  int64 `json:"cacheRead"`
		CacheWrite int64 `json:"cacheWrite"`
		Cost       struct {
			Total float64 `json:"total"`
		} `json:"cost"`
	} `json:"usage"`
	StopReason   string `json:"stopReason"`
	ErrorMessage string `json:"errorMessage"`
}

type piBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// Line: session → the conversation id; an assistant message_end → message
// (its text), tool_call (each tool call) and usage; tool_execution_end →
// command (bash: the command, output and exit code) or file_change (write,
// edit that succeeded); an assistant message that stopped on an error →
// error.
func (p *piParser) Line(line []byte) []Event {
	var l piLine
	if evs, ok := decode(line, &l); !ok {
		return evs
	}
	r := raw(line)
	switch l.Type {
	case "session":
		p.res.ConversationID = l.ID
	case "message_end":
		if l.Message.Role == "assistant" {
			return p.assistant(l.Message, r)
		}
	case "tool_execution_start":
		if p.args == nil {
			p.args = map[string]json.RawMessage{}
		}
		p.args[l.ToolCallID] = l.Args
	case "tool_execution_end":
		return p.toolDone(l, r)
	case "turn_end":
		p.res.Turns++
	case "agent_end", "agent_settled":
		p.settled = true
		if l.Aborted {
			p.failed = true
			p.res.ErrorText = orDefault(p.res.ErrorText, "aborted")
		}
	}
	return nil
}

func (p *piParser) assistant(m piMessage, r json.RawMessage) []Event {
	var evs []Event
	var blocks []piBlock
	_ = json.Unmarshal(m.Content, &blocks)
	var text []string
	for _, b := range blocks {
		switch b.Type {
		case "text":
			if strings.TrimSpace(b.Text) != "" {
				text = append(text, b.Text)
			}
		case "toolCall":
			evs = append(evs, Event{Kind: EventToolCall, Text: b.Name, Raw: r})
		}
	}
	if len(text) > 0 {
		t := strings.Join(text, "\n")
		p.res.Text = t
		// The message comes before its tool calls.
		evs = append([]Event{{Kind: EventMessage, Text: t, Raw: r}}, evs...)
	}
	if m.Usage != nil {
		u := Usage{InputTokens: m.Usage.Input, OutputTokens: m.Usage.Output, CacheReadTokens: m.Usage.CacheRead,
			CacheWriteTokens: m.Usage.CacheWrite, CostUSD: m.Usage.Cost.Total, ModelCalls: 1}
		p.res.Usage.Add(u)
		evs = append(evs, Event{Kind: EventUsage, Usage: &u, Raw: r})
	}
	p.failed = m.StopReason == "error" || m.StopReason == "aborted"
	if p.failed {
		p.res.ErrorText = orDefault(m.ErrorMessage, m.StopReason)
		evs = append(evs, Event{Kind: EventError, Text: p.res.ErrorText, Raw: r})
	}
	return evs
}

func (p *piParser) toolDone(l piLine, r json.RawMessage) []Event {
	args := l.Args
	if len(args) == 0 {
		args = p.args[l.ToolCallID]
	}
	delete(p.args, l.ToolCallID)
	var in struct {
		Command string `json:"command"`
		Path    string `json:"path"`
	}
	_ = json.Unmarshal(args, &in)
	var out []string
	var blocks []piBlock
	_ = json.Unmarshal(l.Result.Content, &blocks)
	for _, b := range blocks {
		if b.Type == "text" {
			out = append(out, b.Text)
		}
	}
	output := strings.Join(out, "\n")
	switch l.ToolName {
	case "bash":
		code := 0
		if l.Result.StructuredContent.ExitCode != nil {
			code = *l.Result.StructuredContent.ExitCode
		} else if l.IsError {
			code = 1
		}
		return []Event{{Kind: EventCommand, Command: in.Command, ExitCode: code, Text: clip(output), Raw: r}}
	case "write", "edit":
		if l.IsError {
			return []Event{{Kind: EventError, Text: l.ToolName + " " + in.Path + ": " + clip(output), Raw: r}}
		}
		return []Event{{Kind: EventFileChange, Path: in.Path, Text: l.ToolName, Raw: r}}
	}
	return nil
}

func (p *piParser) Result() Result {
	res := p.res
	switch {
	case p.failed:
		res.IsError = true
	case !p.settled:
		res.IsError = true
		res.ErrorText = "the stream ended before the agent settled"
	}
	return res
}
