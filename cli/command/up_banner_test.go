package command

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hangar-dev/hangar/cli/up"
)

// The banner warns when sandboxes run unisolated or cannot start, and
// says nothing of isolation when it is on.
func TestBannerSandboxIsolation(t *testing.T) {
	for iso, want := range map[string]string{
		"bwrap":       "",
		"none":        "sandbox isolation OFF (HANGAR_SANDBOX_ISOLATION=none)",
		"unavailable": "sandbox isolation UNAVAILABLE",
	} {
		var out bytes.Buffer
		printStack(Streams{Out: &out}, &up.Stack{URL: "http://127.0.0.1:1", Token: "t", Home: "/h", SandboxIsolation: iso})
		got := out.String()
		if want == "" && strings.Contains(got, "isolation") {
			t.Errorf("isolation %s: banner mentions isolation:\n%s", iso, got)
		}
		if want != "" && !strings.Contains(got, want) {
			t.Errorf("isolation %s: banner lacks %q:\n%s", iso, want, got)
		}
	}
}
