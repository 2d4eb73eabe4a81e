// Package scripted is a model server for tests and the offline quick start.
//
// It speaks the providers' own wire protocols as the real agent CLIs use them
// (Anthropic Messages, OpenAI Responses, OpenAI Chat Completions; streaming
// SSE and, for Messages, plain JSON) and answers from a Script: an ordered
// list of rules decided from the request content (is the last input a tool
// result? is a tool offered? does the latest user prompt match?), never from
// a request count, because CLIs send side requests.
//
// A Script is built in Go or loaded from YAML or JSON:
//
//	rules:
//	  - name: write the file
//	    tool: Write                # offered by the request
//	    prompt: "(?i)create hello" # matches the latest user text
//	    last_is_tool_result: false
//	    answer:
//	      tool_call: {name: Write, input: {file_path: hello.txt, content: "hi\n"}}
//	  - name: done
//	    last_is_tool_result: true
//	    answer: {text: "Done."}
//	default: {text: "OK."}
package scripted

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Script is an ordered list of rules; the first rule whose conditions all
// hold answers. Default answers when no rule matches (a short text if nil).
type Script struct {
	Rules   []Rule  `json:"rules" yaml:"rules"`
	Default *Answer `json:"default,omitempty" yaml:"default,omitempty"`
	// Serves maps a requested model name to the concrete model the
	// answers say served it, as a provider resolves an alias
	// ("claude-sonnet-4-5" answered by "claude-sonnet-4-5-20250929"). A
	// model not in it is answered as requested.
	Serves map[string]string `json:"serves,omitempty" yaml:"serves,omitempty"`
}

// Rule is a set of conditions and the answer given when they all hold. An
// unset condition holds for every request.
type Rule struct {
	Name string `json:"name,omitempty" yaml:"name,omitempty"`
	// LastIsToolResult: the last input is (true) or is not (false) a tool
	// result (Anthropic tool_result block, Responses function_call_output,
	// Chat role "tool").
	LastIsToolResult *bool `json:"last_is_tool_result,omitempty" yaml:"last_is_tool_result,omitempty"`
	// ToolsOffered: the request offers (true) or does not offer (false) tools.
	ToolsOffered *bool `json:"tools_offered,omitempty" yaml:"tools_offered,omitempty"`
	// Tool: the request offers a tool of this name.
	Tool string `json:"tool,omitempty" yaml:"tool,omitempty"`
	// Prompt is a regexp matched against the latest user text (tool results
	// excluded).
	Prompt string `json:"prompt,omitempty" yaml:"prompt,omitempty"`
	// ToolResult is a regexp matched against the last tool result's text.
	ToolResult string `json:"tool_result,omitempty" yaml:"tool_result,omitempty"`
	// Model is a regexp matched against the request's model name.
	Model string `json:"model,omitempty" yaml:"model,omitempty"`

	Answer Answer `json:"answer" yaml:"answer"`

	prompt, toolResult, model *regexp.Regexp
}

// Answer is what the model says: text, a tool call, or both (text first).
type Answer struct {
	Text     string    `json:"text,omitempty" yaml:"text,omitempty"`
	ToolCall *ToolCall `json:"tool_call,omitempty" yaml:"tool_call,omitempty"`
	// Usage overrides the reported token counts; by default input tokens are
	// the request size / 4 and output tokens the answer size / 4 (at least 1).
	Usage *Usage `json:"usage,omitempty" yaml:"usage,omitempty"`
	// Error answers with the provider's error shape and this HTTP status.
	Error *ErrorAnswer `json:"error,omitempty" yaml:"error,omitempty"`
	// ResetAfterEvents > 0 closes the connection abruptly after that many SSE
	// events (an upstream reset mid-stream).
	ResetAfterEvents int `json:"reset_after_events,omitempty" yaml:"reset_after_events,omitempty"`
	// Chunks splits the text into this many deltas (default 1).
	Chunks int `json:"chunks,omitempty" yaml:"chunks,omitempty"`
}

// ToolCall is a call of the tool Name with Input as its JSON arguments.
type ToolCall struct {
	Name  string         `json:"name" yaml:"name"`
	Input map[string]any `json:"input" yaml:"input"`
}

// Usage is the token counts reported with an answer.
type Usage struct {
	InputTokens      int64 `json:"input_tokens" yaml:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens" yaml:"output_tokens"`
	CacheReadTokens  int64 `json:"cache_read_tokens,omitempty" yaml:"cache_read_tokens,omitempty"`
	CacheWriteTokens int64 `json:"cache_write_tokens,omitempty" yaml:"cache_write_tokens,omitempty"`
}

// ErrorAnswer is an error answer in the provider's shape.
type ErrorAnswer struct {
	Status  int    `json:"status" yaml:"status"`
	Type    string `json:"type,omitempty" yaml:"type,omitempty"`
	Message string `json:"message" yaml:"message"`
}

// Bool returns a pointer to b, for the optional conditions of a Rule.
func Bool(b bool) *bool { return &b }

// Parse reads a Script from YAML or JSON (JSON is YAML).
func Parse(data []byte) (Script, error) {
	var s Script
	if err := yaml.Unmarshal(data, &s); err != nil {
		return Script{}, fmt.Errorf("scripted: parse script: %w", err)
	}
	// YAML decodes nested maps as map[string]any already; normalise through
	// JSON so tool inputs hold JSON types only.
	for i := range s.Rules {
		if tc := s.Rules[i].Answer.ToolCall; tc != nil {
			b, err := json.Marshal(tc.Input)
			if err != nil {
				return Script{}, fmt.Errorf("scripted: rule %d: tool input: %w", i, err)
			}
			tc.Input = nil
			if err := json.Unmarshal(b, &tc.Input); err != nil {
				return Script{}, fmt.Errorf("scripted: rule %d: tool input: %w", i, err)
			}
		}
	}
	if err := s.compile(); err != nil {
		return Script{}, err
	}
	return s, nil
}

// Load reads a Script from a YAML or JSON file.
func Load(path string) (Script, error) {
	data, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return Script{}, fmt.Errorf("scripted: %w", err)
	}
	return Parse(data)
}

func (s *Script) compile() error {
	for i := range s.Rules {
		r := &s.Rules[i]
		var err error
		if r.prompt, err = compileOpt(r.Prompt); err != nil {
			return fmt.Errorf("scripted: rule %d (%s): prompt: %w", i, r.Name, err)
		}
		if r.toolResult, err = compileOpt(r.ToolResult); err != nil {
			return fmt.Errorf("scripted: rule %d (%s): tool_result: %w", i, r.Name, err)
		}
		if r.model, err = compileOpt(r.Model); err != nil {
			return fmt.Errorf("scripted: rule %d (%s): model: %w", i, r.Name, err)
		}
	}
	return nil
}

func compileOpt(expr string) (*regexp.Regexp, error) {
	if expr == "" {
		return nil, nil
	}
	return regexp.Compile(expr)
}

// Request is what the rules look at, extracted from any of the protocols.
type Request struct {
	Model            string
	LastIsToolResult bool
	Tools            []string
	// Prompt is the latest user text (tool results excluded).
	Prompt string
	// ToolResult is the text of the last tool result, if any.
	ToolResult string
	// Size is the request body's length in bytes.
	Size int
}

func (r Rule) matches(req Request) bool {
	if r.LastIsToolResult != nil && *r.LastIsToolResult != req.LastIsToolResult {
		return false
	}
	if r.ToolsOffered != nil && *r.ToolsOffered != (len(req.Tools) > 0) {
		return false
	}
	if r.Tool != "" && !contains(req.Tools, r.Tool) {
		return false
	}
	if r.prompt != nil && !r.prompt.MatchString(req.Prompt) {
		return false
	}
	if r.toolResult != nil && !r.toolResult.MatchString(req.ToolResult) {
		return false
	}
	if r.model != nil && !r.model.MatchString(req.Model) {
		return false
	}
	return true
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Decide returns the answer for req and the name of the rule that gave it
// ("default" when none matched).
func (s *Script) Decide(req Request) (Answer, string) {
	for _, r := range s.Rules {
		if r.matches(req) {
			name := r.Name
			if name == "" {
				name = "rule"
			}
			return r.Answer, name
		}
	}
	if s.Default != nil {
		return *s.Default, "default"
	}
	return Answer{Text: "OK."}, "default"
}

func joinText(parts []string) string {
	return strings.TrimSpace(strings.Join(parts, "\n"))
}
