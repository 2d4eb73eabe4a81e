package forks

import (
	"encoding/json"
	"strings"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
)

// contextPrefixes open the text parts a CLI adds to the user's first
// message on its own (Claude Code's reminders, Codex's environment and
// instructions): they are not the prompt.
var contextPrefixes = []string{"<system-reminder>", "<environment_context>", "<user_instructions>", "# AGENTS.md", "<permissions", "<collaboration_mode>"}

// Prompt is the user's prompt in a tape's first step: the last text of the
// request's user messages that the CLI did not add itself. The replay starts
// the harness with it, so its first request is the original's.
func Prompt(step *gatewayv1.Step) string {
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Input json.RawMessage `json:"input"`
	}
	if json.Unmarshal(step.GetRequest().GetBody(), &req) != nil {
		return ""
	}
	var texts []string
	for _, m := range req.Messages {
		if m.Role == "user" {
			texts = append(texts, contentTexts(m.Content)...)
		}
	}
	// Responses: input is a string or a list of items.
	var s string
	if json.Unmarshal(req.Input, &s) == nil && s != "" {
		texts = append(texts, s)
	}
	var items []struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(req.Input, &items) == nil {
		for _, it := range items {
			if it.Role == "user" && (it.Type == "" || it.Type == "message") {
				texts = append(texts, contentTexts(it.Content)...)
			}
		}
	}
	for i := len(texts) - 1; i >= 0; i-- {
		t := texts[i]
		if strings.TrimSpace(t) == "" || addedByCLI(t) {
			continue
		}
		return t
	}
	return ""
}

func addedByCLI(t string) bool {
	t = strings.TrimSpace(t)
	for _, p := range contextPrefixes {
		if strings.HasPrefix(t, p) {
			return true
		}
	}
	return false
}

// contentTexts returns the text parts of a string or an array of parts
// (Messages "text", Responses "input_text", Chat "text").
func contentTexts(raw json.RawMessage) []string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return nil
	}
	var out []string
	for _, p := range parts {
		if p.Type == "text" || p.Type == "input_text" {
			out = append(out, p.Text)
		}
	}
	return out
}
