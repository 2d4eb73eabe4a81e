package harness

import (
	"encoding/json"
	"fmt"
	"path"
)

// InteractivePreparer is an adapter whose CLI, started by a person at a
// terminal (resume_command under hangar sb attach or the dashboard's "talk
// to the agent here"), asks first-run questions that headless turns never
// see. InteractiveFiles answers them ahead: given what the sandbox already
// has at a path (nil when nothing), it returns the files to write.
type InteractivePreparer interface {
	InteractiveFiles(sb Sandbox, gw Gateway, existing func(path string) ([]byte, error)) ([]File, error)
}

// claudeKeyTail is how much of a custom API key Claude Code remembers when
// it is approved (customApiKeyResponses).
const claudeKeyTail = 20

// InteractiveFiles: Claude Code started interactively first runs its
// onboarding, which checks that api.anthropic.com answers (it does not
// here: the gateway is the only way out), then asks whether to trust the
// work tree and whether to use the API key from the environment (the run
// token). Its user config ($CLAUDE_CONFIG_DIR/.claude.json) records those
// answers: onboarding done, the work tree trusted, the token's tail
// approved. What the file already holds (the user id, other projects) is
// kept.
func (claudeAdapter) InteractiveFiles(sb Sandbox, gw Gateway, existing func(string) ([]byte, error)) ([]File, error) {
	p := path.Join(claudeConfigDir(sb), ".claude.json")
	old, err := existing(p)
	if err != nil {
		return nil, err
	}
	cfg := map[string]any{}
	if len(old) > 0 {
		if err := json.Unmarshal(old, &cfg); err != nil {
			// A file Claude Code could not read either: start over.
			cfg = map[string]any{}
		}
	}
	cfg["hasCompletedOnboarding"] = true
	projects, _ := cfg["projects"].(map[string]any)
	if projects == nil {
		projects = map[string]any{}
	}
	project, _ := projects[sb.WorkDir].(map[string]any)
	if project == nil {
		project = map[string]any{}
	}
	project["hasTrustDialogAccepted"] = true
	projects[sb.WorkDir] = project
	cfg["projects"] = projects
	if gw.Token != "" {
		tail := gw.Token
		if len(tail) > claudeKeyTail {
			tail = tail[len(tail)-claudeKeyTail:]
		}
		responses, _ := cfg["customApiKeyResponses"].(map[string]any)
		if responses == nil {
			responses = map[string]any{}
		}
		approved, _ := responses["approved"].([]any)
		seen := false
		for _, a := range approved {
			seen = seen || a == tail
		}
		if !seen {
			approved = append(approved, tail)
		}
		responses["approved"] = approved
		if _, ok := responses["rejected"]; !ok {
			responses["rejected"] = []any{}
		}
		cfg["customApiKeyResponses"] = responses
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("harness: claude config: %w", err)
	}
	return []File{{Path: p, Content: append(b, '\n'), Mode: 0o600}}, nil
}
