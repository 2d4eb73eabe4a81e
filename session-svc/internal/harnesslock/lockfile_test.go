package harnesslock

import (
	"errors"
	"strings"
	"testing"
)

const goodFile = `# the team's harnesses
locks:
  team-default:
    revision: 14
    harness: claude
    model: claude-sonnet-4-5-20250929
    approvals: never
    cli_version: 2.1.332
  codex-ci:
    revision: 3
    harness: codex
    model: gpt-5.5
    approvals: ask
    cli_version: 0.171.0
    environment: python
`

func TestParse(t *testing.T) {
	locks, err := Parse([]byte(goodFile))
	if err != nil {
		t.Fatal(err)
	}
	want := []Lock{
		{Name: "codex-ci", Revision: 3, Harness: "codex", Model: "gpt-5.5", Approvals: "ask", CLIVersion: "0.171.0", Environment: "python"},
		{Name: "team-default", Revision: 14, Harness: "claude", Model: "claude-sonnet-4-5-20250929", Approvals: "never", CLIVersion: "2.1.332"},
	}
	if len(locks) != len(want) {
		t.Fatalf("got %d locks, want %d: %+v", len(locks), len(want), locks)
	}
	for i := range want {
		if locks[i] != want[i] {
			t.Errorf("lock %d = %+v, want %+v", i, locks[i], want[i])
		}
	}
	if got := locks[1].Ref(); got != "team-default@r14" {
		t.Errorf("Ref = %q", got)
	}
}

func TestParseRefusesWhatIsNotALock(t *testing.T) {
	record := func(fields string) string { return "locks:\n  team:\n" + fields }
	all := "    revision: 1\n    harness: claude\n    model: m\n    approvals: never\n    cli_version: 2.1.332\n"
	for _, tc := range []struct {
		name, file string
		line       int
		want       string
	}{
		{"empty", "", 0, "empty"},
		{"not yaml", "locks: [", 0, "did not find expected"},
		{"a list at the top", "- a\n", 1, `want a mapping with "locks"`},
		{"no locks", "other: 1\n", 1, `unknown key "other"`},
		{"locks not a mapping", "locks: [a]\n", 1, `"locks" must map`},
		{"bad name", "locks:\n  Team_X!:\n" + all, 2, `lock name "Team_X!"`},
		{"twice", "locks:\n  team:\n" + all + "  team:\n" + all, 8, `lock "team" is defined twice`},
		{"record not a mapping", "locks:\n  team: 14\n", 2, "want a mapping"},
		{"missing cli_version", record("    revision: 1\n    harness: claude\n    model: m\n    approvals: never\n"), 3, "cli_version is missing"},
		{"revision zero", record(strings.Replace(all, "revision: 1", "revision: 0", 1)), 3, `revision "0"`},
		{"revision text", record(strings.Replace(all, "revision: 1", "revision: r14", 1)), 3, `revision "r14"`},
		{"unknown harness", record(strings.Replace(all, "harness: claude", "harness: claud", 1)), 4, `harness "claud" is not one of claude, codex, pi, antigravity`},
		{"model with space", record(strings.Replace(all, "model: m", "model: a b", 1)), 5, `model "a b"`},
		{"bad approvals", record(strings.Replace(all, "approvals: never", "approvals: sometimes", 1)), 6, `approvals "sometimes"`},
		{"bad version", record(strings.Replace(all, "cli_version: 2.1.332", "cli_version: latest", 1)), 7, `cli_version "latest"`},
		{"unknown field", record(all + "    modle: x\n"), 8, `unknown field "modle"`},
		{"field a list", record(strings.Replace(all, "model: m", "model: [a]", 1)), 5, "model must be a single value"},
		{"bad environment", record(all + "    environment: Py_3\n"), 8, `environment "Py_3"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.file))
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("Parse = %v, want a ParseError", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			if tc.line != 0 && pe.Line != tc.line {
				t.Errorf("error %q: line %d, want %d", err, pe.Line, tc.line)
			}
		})
	}
}

func TestParseRef(t *testing.T) {
	for _, tc := range []struct {
		ref  string
		name string
		rev  int
		bad  bool
	}{
		{"team-default@r14", "team-default", 14, false},
		{"team-default", "team-default", 0, false},
		{" codex-ci@r3 ", "codex-ci", 3, false},
		{"team-default@14", "", 0, true},
		{"team-default@r0", "", 0, true},
		{"team-default@rx", "", 0, true},
		{"Team@r1", "", 0, true},
		{"", "", 0, true},
		{"a@r1@r2", "", 0, true},
	} {
		name, rev, err := ParseRef(tc.ref)
		if (err != nil) != tc.bad || name != tc.name || rev != tc.rev {
			t.Errorf("ParseRef(%q) = %q, %d, %v; want %q, %d, error %v", tc.ref, name, rev, err, tc.name, tc.rev, tc.bad)
		}
	}
}

func TestVersionOf(t *testing.T) {
	for in, want := range map[string]string{
		"2.1.332 (Claude Code)": "2.1.332",
		"codex-cli 0.171.0":     "0.171.0",
		"1.6.0":                 "1.6.0",
		"pi 1.6.0-beta.1":       "1.6.0-beta.1",
		"no version":            "",
	} {
		if got := VersionOf(in); got != want {
			t.Errorf("VersionOf(%q) = %q, want %q", in, got, want)
		}
	}
}
