package harnesslock

import (
	"regexp"
	"strings"
)

// Observed is what a thawed session's turn 1 ran, as the sandbox and the
// gateway saw it.
type Observed struct {
	// Harness is the harness the turn ran.
	Harness string
	// Approvals is the approval mode the turn ran under (never, ask).
	Approvals string
	// CLIVersions are the versions the CLI gave: its --version in the
	// sandbox, and the one each model request named, in order. A value
	// with no release version in it counts as what it says.
	CLIVersions []string
	// Models are the models the gateway saw: each request's and each
	// answer's, in order.
	Models []string
}

// Difference is one field of a lock that differed from what ran.
type Difference struct {
	Field, Locked, Actual string
}

// Compare lists what differed between lock l and what ran: the harness,
// each CLI version and each model other than the locked one (once each,
// in the order seen), and the approval mode. A CLI that gave no version
// at all is a difference ("unknown"): nothing showed it was the pinned
// one. No models (a turn that made no model call) is none.
func Compare(l Lock, o Observed) []Difference {
	out := []Difference{}
	if o.Harness != l.Harness {
		out = append(out, Difference{Field: "harness", Locked: l.Harness, Actual: o.Harness})
	}
	seen := map[string]bool{}
	anyVersion := false
	for _, v := range o.CLIVersions {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		anyVersion = true
		actual := VersionOf(v)
		if actual == "" {
			actual = v
		}
		if actual != l.CLIVersion && !seen["cli:"+actual] {
			seen["cli:"+actual] = true
			out = append(out, Difference{Field: "cli_version", Locked: l.CLIVersion, Actual: actual})
		}
	}
	if !anyVersion {
		out = append(out, Difference{Field: "cli_version", Locked: l.CLIVersion, Actual: "unknown"})
	}
	for _, m := range o.Models {
		if m == "" || m == l.Model || seen["model:"+m] {
			continue
		}
		seen["model:"+m] = true
		out = append(out, Difference{Field: "model", Locked: l.Model, Actual: m})
	}
	if o.Approvals != l.Approvals {
		out = append(out, Difference{Field: "approvals", Locked: l.Approvals, Actual: o.Approvals})
	}
	return out
}

var (
	claudeAgent = regexp.MustCompile(`\bclaude-cli/([0-9][^ ;()]*)`)
	codexAgent  = regexp.MustCompile(`^codex[a-z_]*/([0-9][^ ;()]*)`)
)

// RequestCLIVersion is the CLI version a model request names, from its
// recorded headers: Claude Code's user agent (claude-cli/2.1.332), Codex's
// version header or user agent (codex_exec/0.171.0). "" when the request
// names none (pi sends its SDK's user agent).
func RequestCLIVersion(harness string, headers map[string]string) string {
	get := func(name string) string {
		for k, v := range headers {
			if strings.EqualFold(k, name) {
				return v
			}
		}
		return ""
	}
	switch harness {
	case "claude":
		if m := claudeAgent.FindStringSubmatch(get("user-agent")); m != nil {
			return m[1]
		}
	case "codex":
		if v := strings.TrimSpace(get("version")); v != "" {
			return v
		}
		if m := codexAgent.FindStringSubmatch(get("user-agent")); m != nil {
			return m[1]
		}
	}
	return ""
}
