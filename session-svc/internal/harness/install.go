package harness

import (
	"fmt"
	"path/filepath"
)

// Install says where a harness's CLI comes from and which setting points
// hangar at it: what a person needs when the CLI is missing.
type Install struct {
	Harness Name
	// Binary is the CLI's default name on PATH.
	Binary string
	// Package is its npm package ("" when it has none).
	Package string
	// Setting is the HANGAR_* variable naming the binary ("" when none).
	Setting string
	// Note is extra advice (pi's Node version).
	Note string
}

// Installs lists every harness's Install, in Names' order. The packages
// are the ones ../shared/HARNESSES.md and .ci/install-harnesses pin.
func Installs() []Install {
	return []Install{
		{Harness: Claude, Binary: "claude", Package: "@anthropic-ai/claude-code", Setting: "HANGAR_CLAUDE_BIN"},
		{Harness: Codex, Binary: "codex", Package: "@openai/codex", Setting: "HANGAR_CODEX_BIN"},
		{Harness: Pi, Binary: "pi", Package: "@earendil-works/pi-coding-agent", Setting: "HANGAR_PI_BIN",
			Note: "it needs Node >= 22.19 (HANGAR_PI_NODE_BIN_DIR)"},
		{Harness: Antigravity, Binary: "agy"},
	}
}

// InstallOf returns name's Install.
func InstallOf(name Name) Install {
	for _, in := range Installs() {
		if in.Harness == name {
			return in
		}
	}
	return Install{Harness: name, Binary: string(name)}
}

// Hint is what to run to get the CLI: "npm install -g PKG, or set VAR to
// its path".
func (in Install) Hint() string {
	var h string
	switch {
	case in.Package != "" && in.Setting != "":
		h = fmt.Sprintf("npm install -g %s, or set %s to its path", in.Package, in.Setting)
	case in.Package != "":
		h = "npm install -g " + in.Package
	default:
		h = fmt.Sprintf("install the %s CLI and put it on hangar's PATH", in.Binary)
	}
	if in.Note != "" {
		h += "; " + in.Note
	}
	return h
}

// MissingCLI is a turn's failure reason when bin (the configured binary)
// was not found where the sandbox looks.
func MissingCLI(name Name, bin string) string {
	in := InstallOf(name)
	what := bin
	if what == "" || filepath.Base(what) == what {
		what = fmt.Sprintf("%q on the PATH hangar up runs with", orDefault(bin, in.Binary))
	}
	return fmt.Sprintf("the %s CLI is not installed: %s was not found. Install it (%s), then restart hangar up", name, what, in.Hint())
}
