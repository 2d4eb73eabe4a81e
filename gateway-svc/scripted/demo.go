package scripted

import (
	"regexp"
	"strings"
)

// Placeholders expanded in an answer's text and in every string of a tool
// call's input: {{prompt}} is the latest user text (Claude Code's
// <system-reminder> blocks removed), {{prompt_sh}} the same as one
// single-quoted shell word.
const (
	placeholderPrompt   = "{{prompt}}"
	placeholderPromptSh = "{{prompt_sh}}"
)

var reminder = regexp.MustCompile(`(?s)<system-reminder>.*?</system-reminder>`)

// expand fills the placeholders of a from req.
func (a Answer) expand(req Request) Answer {
	prompt := strings.TrimSpace(reminder.ReplaceAllString(req.Prompt, ""))
	sh := "'" + strings.ReplaceAll(prompt, "'", `'\''`) + "'"
	r := strings.NewReplacer(placeholderPromptSh, sh, placeholderPrompt, prompt)
	a.Text = r.Replace(a.Text)
	if a.ToolCall != nil {
		tc := *a.ToolCall
		tc.Input, _ = expandValue(tc.Input, r).(map[string]any)
		a.ToolCall = &tc
	}
	return a
}

func expandValue(v any, r *strings.Replacer) any {
	switch x := v.(type) {
	case string:
		return r.Replace(x)
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, c := range x {
			out[k] = expandValue(c, r)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, c := range x {
			out[i] = expandValue(c, r)
		}
		return out
	}
	return v
}

// demoCommand writes the prompt into NOTES.md in the agent's working
// directory and commits nothing.
const demoCommand = `printf '%s\n' {{prompt_sh}} > NOTES.md && echo 'wrote NOTES.md'`

// Demo is the script of the offline quick start (`hangar up` with no model
// credentials, `hangar fake-model`): offered a shell tool, the "model" runs a
// command that writes the prompt into NOTES.md; given the tool's result, it
// answers with a short summary. It knows the shell tools of Claude Code
// (Bash), Codex (exec_command, shell) and pi (bash).
func Demo() Script {
	return Script{
		Rules: []Rule{
			{Name: "summary", LastIsToolResult: Bool(true), Answer: Answer{
				Text: "I wrote your prompt into NOTES.md in the work tree (nothing is committed). " +
					"This answer comes from hangar's offline demo model; set HANGAR_ANTHROPIC_API_KEY or HANGAR_OPENAI_API_KEY to use a real one.",
			}},
			{Name: "claude-bash", Tool: "Bash", Answer: Answer{Text: "Writing your prompt to NOTES.md.",
				ToolCall: &ToolCall{Name: "Bash", Input: map[string]any{"command": demoCommand, "description": "Write the prompt to NOTES.md"}}}},
			{Name: "codex-exec", Tool: "exec_command", Answer: Answer{
				ToolCall: &ToolCall{Name: "exec_command", Input: map[string]any{"cmd": demoCommand}}}},
			{Name: "codex-shell", Tool: "shell", Answer: Answer{
				ToolCall: &ToolCall{Name: "shell", Input: map[string]any{"command": []any{"bash", "-lc", demoCommand}}}}},
			{Name: "pi-bash", Tool: "bash", Answer: Answer{
				ToolCall: &ToolCall{Name: "bash", Input: map[string]any{"command": demoCommand}}}},
		},
		Default: &Answer{Text: "hangar offline demo model: offer me a shell tool and I write your prompt into NOTES.md."},
	}
}
