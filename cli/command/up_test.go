package command_test

import (
	"bytes"
	"testing"

	"github.com/hangar-dev/hangar/cli/command"
	"github.com/hangar-dev/hangar/cli/up"
	sessionapp "github.com/hangar-dev/hangar/session-svc/app"
)

// The banner: where hangar answers, then each agent CLI with its version,
// or how to install it.
func TestUpBannerGolden(t *testing.T) {
	var b bytes.Buffer
	command.PrintStack(command.Streams{Out: &b}, &up.Stack{
		URL: "http://127.0.0.1:7400", Token: "0123abcd", Home: "/home/me/.hangar", TokenGenerated: true,
		OfflineModel: "http://127.0.0.1:41234",
		AgentCLIs: []sessionapp.AgentCLI{
			{Harness: "claude", Binary: "claude", Path: "/usr/local/bin/claude", Version: "2.1.332 (Claude Code)"},
			{Harness: "codex", Binary: "codex", Hint: "npm install -g @openai/codex, or set HANGAR_CODEX_BIN to its path"},
			{Harness: "pi", Binary: "pi", Path: "/usr/local/bin/pi", Note: "it needs Node >= 22.19 (HANGAR_PI_NODE_BIN_DIR)"},
			{Harness: "antigravity", Binary: "agy", Hint: "install the agy CLI and put it on hangar's PATH"},
		},
		Services: []up.Endpoint{{Name: "session-svc", Addr: "127.0.0.1:7401"}},
	})
	sessionGolden(t, "up_banner", b.String())
}
