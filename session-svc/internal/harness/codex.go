package harness

import (
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
)

// DefaultCodexModel is Codex's model when Gateway.Model is "".
const DefaultCodexModel = "gpt-5.5"

// codexTokenEnv carries the run token; config.toml's provider names it.
const codexTokenEnv = "HANGAR_RUN_TOKEN"

type codexAdapter struct{}

func (codexAdapter) Name() Name    { return Codex }
func (codexAdapter) CanFork() bool { return true }

func codexHome(sb Sandbox) string { return path.Join(sb.HomeDir, ".codex") }

// codexConfig is $CODEX_HOME/config.toml: the gateway as the model provider
// (OPENAI_BASE_URL is ignored by Codex 0.171), no approvals and no Codex
// sandbox (hangar's sandbox is the boundary; Codex's own one cannot start in
// a container), no update check, analytics or plugin traffic. It passes
// --strict-config.
func codexConfig(gw Gateway) string {
	return `model = ` + strconv.Quote(orDefault(gw.Model, DefaultCodexModel)) + `
model_provider = "hangar"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
apps = false
remote_plugin = false
plugins = false
tool_suggest = false

[model_providers.hangar]
name = "hangar gateway"
base_url = ` + strconv.Quote(gw.OpenAIBaseURL) + `
wire_api = "responses"
env_key = "` + codexTokenEnv + `"
request_max_retries = 0
stream_max_retries = 0
`
}

// Invocation: `codex exec --json --skip-git-repo-check MSG`, `... resume ID
// MSG` or `... fork PARENT MSG`; the new thread's id comes from the stream
// (thread.started).
func (codexAdapter) Invocation(sb Sandbox, gw Gateway, turn Turn, opts Options) (Invocation, error) {
	if err := checkSandbox(sb, turn); err != nil {
		return Invocation{}, err
	}
	if gw.OpenAIBaseURL == "" || gw.Token == "" {
		return Invocation{}, fmt.Errorf("harness: codex needs the gateway's OpenAI base URL and a token")
	}
	if strings.ContainsAny(gw.OpenAIBaseURL, "\n\r") || strings.ContainsAny(gw.Model, "\n\r") {
		return Invocation{}, fmt.Errorf("harness: codex: newline in base URL or model")
	}
	argv := []string{orDefault(opts.CodexBin, "codex"), "exec", "--json", "--skip-git-repo-check"}
	id := ""
	switch {
	case turn.ForkFrom != "":
		argv = append(argv, "fork", turn.ForkFrom)
	case turn.ConversationID != "":
		id = turn.ConversationID
		argv = append(argv, "resume", id)
	}
	argv = append(argv, promptArg(turn.Message))
	home := codexHome(sb)
	return Invocation{
		Argv: argv,
		Env: map[string]string{
			"HOME":        sb.HomeDir,
			"CODEX_HOME":  home,
			codexTokenEnv: gw.Token,
		},
		Files:          []File{{Path: path.Join(home, "config.toml"), Content: []byte(codexConfig(gw)), Mode: 0o600}},
		Cwd:            sb.WorkDir,
		ConversationID: id,
	}, nil
}

// ConversationPaths is $CODEX_HOME/sessions: all rollouts, since a fork's
// rollout refers to its parent's (forked_from_id) and resuming it needs
// every ancestor.
func (codexAdapter) ConversationPaths(sb Sandbox, _ string) []string {
	return []string{path.Join(codexHome(sb), "sessions")}
}

func (codexAdapter) ResumeCommand(id string) string {
	return "codex resume " + shellQuote(id)
}

func (codexAdapter) NewParser() Parser { return &codexParser{} }

type codexParser struct {
	res       Result
	completed bool
	failed    bool
}

type codexLine struct {
	Type     string    `json:"type"`
	ThreadID string    `json:"thread_id"`
	Message  string    `json:"message"`
	Item     codexItem `json:"item"`
	Usage    *struct {
		InputTokens       int64 `json:"input_tokens"`
		CachedInputTokens int64 `json:"cached_input_tokens"`
		CacheWriteTokens  int64 `json:"cache_write_input_tokens"`
		OutputTokens      int64 `json:"output_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

type codexItem struct {
	ID               string `json:"id"`
	Type             string `json:"type"`
	Text             string `json:"text"`
	Message          string `json:"message"`
	Command          string `json:"command"`
	AggregatedOutput string `json:"aggregated_output"`
	ExitCode         *int   `json:"exit_code"`
	Status           string `json:"status"`
	Changes          []struct {
		Path string `json:"path"`
		Kind string `json:"kind"`
	} `json:"changes"`
	Server string `json:"server"`
	Tool   string `json:"tool"`
	Query  string `json:"query"`
}

// Line: thread.started → the conversation id; item.completed
// command_execution → command, agent_message → message, file_change →
// file_change per path, mcp_tool_call/web_search → tool_call, error → error;
// turn.completed → usage; turn.failed and error → error.
func (p *codexParser) Line(line []byte) []Event {
	var l codexLine
	if evs, ok := decode(line, &l); !ok {
		return evs
	}
	r := raw(line)
	switch l.Type {
	case "thread.started":
		p.res.ConversationID = l.ThreadID
	case "item.completed":
		return p.item(l.Item, r)
	case "turn.completed":
		p.completed = true
		p.res.Turns++
		if l.Usage == nil {
			return nil
		}
		// Codex counts cached tokens inside input_tokens, and reports the
		// thread's totals so far (Result.UsageCumulative); the last
		// turn.completed holds the totals. No usage event: a thread's
		// running total is not this turn's usage, which the gateway counts
		// (the turn's own usage event).
		p.res.Usage = Usage{
			InputTokens:      l.Usage.InputTokens - l.Usage.CachedInputTokens,
			CacheReadTokens:  l.Usage.CachedInputTokens,
			CacheWriteTokens: l.Usage.CacheWriteTokens,
			OutputTokens:     l.Usage.OutputTokens,
		}
		return nil
	case "turn.failed":
		p.failed = true
		msg := "turn failed"
		if l.Error != nil && l.Error.Message != "" {
			msg = l.Error.Message
		}
		p.res.ErrorText = msg
		return []Event{{Kind: EventError, Text: msg, Raw: r}}
	case "error":
		p.res.ErrorText = l.Message
		return []Event{{Kind: EventError, Text: l.Message, Raw: r}}
	}
	return nil
}

func (p *codexParser) item(it codexItem, r json.RawMessage) []Event {
	switch it.Type {
	case "agent_message":
		if strings.TrimSpace(it.Text) == "" {
			return nil
		}
		p.res.Text = it.Text
		return []Event{{Kind: EventMessage, Text: it.Text, Raw: r}}
	case "command_execution":
		code := 0
		if it.ExitCode != nil {
			code = *it.ExitCode
		} else if it.Status == "failed" || it.Status == "declined" {
			code = -1
		}
		return []Event{{Kind: EventCommand, Command: it.Command, ExitCode: code, Text: clip(it.AggregatedOutput), Raw: r}}
	case "file_change":
		var evs []Event
		for _, c := range it.Changes {
			evs = append(evs, Event{Kind: EventFileChange, Path: c.Path, Text: c.Kind, Raw: r})
		}
		return evs
	case "mcp_tool_call":
		return []Event{{Kind: EventToolCall, Text: it.Server + "." + it.Tool, Raw: r}}
	case "web_search":
		return []Event{{Kind: EventToolCall, Text: "web_search " + it.Query, Raw: r}}
	case "error":
		return []Event{{Kind: EventError, Text: orDefault(it.Message, it.Text), Raw: r}}
	}
	return nil
}

func (p *codexParser) Result() Result {
	res := p.res
	res.UsageCumulative = true
	switch {
	case p.failed:
		res.IsError = true
	case !p.completed:
		res.IsError = true
		res.ErrorText = orDefault(res.ErrorText, "the stream ended without turn.completed")
	}
	return res
}
