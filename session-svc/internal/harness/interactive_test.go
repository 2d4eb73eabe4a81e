package harness

import (
	"encoding/json"
	"testing"
)

// TestClaudeInteractiveFiles: the config answers Claude Code's first-run
// questions (onboarding, trusting the work tree, the run token as API key)
// and keeps what the file held.
func TestClaudeInteractiveFiles(t *testing.T) {
	sb := Sandbox{WorkDir: "/sb/work", HomeDir: "/sb/home"}
	token := "run-token-0123456789abcdefghijklmnop"
	old := `{"userID":"u1","projects":{"/other":{"hasTrustDialogAccepted":false},"/sb/work":{"allowedTools":["Bash"]}},"customApiKeyResponses":{"approved":["older"],"rejected":["bad"]}}`
	var asked string
	files, err := claudeAdapter{}.InteractiveFiles(sb, Gateway{Token: token}, func(p string) ([]byte, error) {
		asked = p
		return []byte(old), nil
	})
	if err != nil || len(files) != 1 {
		t.Fatalf("InteractiveFiles: %v, %v", files, err)
	}
	if asked != "/sb/home/.claude/.claude.json" || files[0].Path != asked || files[0].Mode != 0o600 {
		t.Errorf("read %q, wrote %q mode %o; want the config dir's .claude.json, 0600", asked, files[0].Path, files[0].Mode)
	}
	var cfg struct {
		UserID                 string `json:"userID"`
		HasCompletedOnboarding bool   `json:"hasCompletedOnboarding"`
		Projects               map[string]struct {
			HasTrustDialogAccepted bool     `json:"hasTrustDialogAccepted"`
			AllowedTools           []string `json:"allowedTools"`
		} `json:"projects"`
		CustomAPIKeyResponses struct {
			Approved []string `json:"approved"`
			Rejected []string `json:"rejected"`
		} `json:"customApiKeyResponses"`
	}
	if err := json.Unmarshal(files[0].Content, &cfg); err != nil {
		t.Fatal(err)
	}
	work := cfg.Projects["/sb/work"]
	if !cfg.HasCompletedOnboarding || !work.HasTrustDialogAccepted || len(work.AllowedTools) != 1 || cfg.UserID != "u1" || cfg.Projects["/other"].HasTrustDialogAccepted {
		t.Errorf("config: %s", files[0].Content)
	}
	if a := cfg.CustomAPIKeyResponses.Approved; len(a) != 2 || a[0] != "older" || a[1] != token[len(token)-20:] || cfg.CustomAPIKeyResponses.Rejected[0] != "bad" {
		t.Errorf("api key responses: %+v", cfg.CustomAPIKeyResponses)
	}

	// Nothing there yet; asked twice, the tail is approved once.
	files, err = claudeAdapter{}.InteractiveFiles(sb, Gateway{Token: token}, func(string) ([]byte, error) { return nil, nil })
	if err != nil {
		t.Fatal(err)
	}
	again, err := claudeAdapter{}.InteractiveFiles(sb, Gateway{Token: token}, func(string) ([]byte, error) { return files[0].Content, nil })
	if err != nil {
		t.Fatal(err)
	}
	cfg.CustomAPIKeyResponses.Approved = nil
	if err := json.Unmarshal(again[0].Content, &cfg); err != nil || len(cfg.CustomAPIKeyResponses.Approved) != 1 {
		t.Errorf("approved twice: %s (%v)", again[0].Content, err)
	}
}
