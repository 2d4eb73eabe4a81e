package harnesslock

import (
	"reflect"
	"testing"
)

func TestCompare(t *testing.T) {
	lock := Lock{Name: "team-default", Revision: 14, Harness: "claude", Model: "claude-sonnet-4-5-20250929", Approvals: "never", CLIVersion: "2.1.332"}
	same := Observed{Harness: "claude", Approvals: "never", CLIVersions: []string{"2.1.332 (Claude Code)", "2.1.332"},
		Models: []string{"claude-sonnet-4-5-20250929", "claude-sonnet-4-5-20250929", "", "claude-sonnet-4-5-20250929"}}
	with := func(f func(o *Observed)) Observed {
		o := same
		o.CLIVersions = append([]string(nil), same.CLIVersions...)
		o.Models = append([]string(nil), same.Models...)
		f(&o)
		return o
	}
	for _, tc := range []struct {
		name string
		o    Observed
		want []Difference
	}{
		{"nothing differs", same, []Difference{}},
		{"no model calls", with(func(o *Observed) { o.Models = nil }), []Difference{}},
		{"another model served", with(func(o *Observed) {
			o.Models = append(o.Models, "claude-sonnet-4-5", "claude-haiku-4-5", "claude-haiku-4-5")
		}),
			[]Difference{{"model", lock.Model, "claude-sonnet-4-5"}, {"model", lock.Model, "claude-haiku-4-5"}}},
		{"another CLI version", with(func(o *Observed) { o.CLIVersions = []string{"2.1.300 (Claude Code)", "2.1.300", "2.1.332"} }),
			[]Difference{{"cli_version", "2.1.332", "2.1.300"}}},
		{"no CLI version given", with(func(o *Observed) { o.CLIVersions = []string{"", " "} }),
			[]Difference{{"cli_version", "2.1.332", "unknown"}}},
		{"a version line without a version", with(func(o *Observed) { o.CLIVersions = []string{"dev build"} }),
			[]Difference{{"cli_version", "2.1.332", "dev build"}}},
		{"another harness", with(func(o *Observed) { o.Harness = "codex" }),
			[]Difference{{"harness", "claude", "codex"}}},
		{"another approval mode", with(func(o *Observed) { o.Approvals = "ask" }),
			[]Difference{{"approvals", "never", "ask"}}},
		{"everything, in field order", Observed{Harness: "pi", Approvals: "ask", CLIVersions: []string{"1.6.0"}, Models: []string{"gpt-5.5"}},
			[]Difference{{"harness", "claude", "pi"}, {"cli_version", "2.1.332", "1.6.0"}, {"model", lock.Model, "gpt-5.5"}, {"approvals", "never", "ask"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Compare(lock, tc.o)
			if got == nil {
				t.Fatal("Compare returned nil, want a list ([] when nothing differs)")
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Compare = %+v\nwant      %+v", got, tc.want)
			}
		})
	}
}

func TestRequestCLIVersion(t *testing.T) {
	for _, tc := range []struct {
		harness string
		headers map[string]string
		want    string
	}{
		{"claude", map[string]string{"user-agent": "claude-cli/2.1.332 (external, cli)"}, "2.1.332"},
		{"claude", map[string]string{"User-Agent": "claude-cli/2.1.300 (external, sdk-cli)"}, "2.1.300"},
		{"claude", map[string]string{"user-agent": "Anthropic/JS 0.60.0"}, ""},
		{"codex", map[string]string{"version": "0.171.0", "user-agent": "codex_exec/0.170.0 (Debian 12)"}, "0.171.0"},
		{"codex", map[string]string{"user-agent": "codex_exec/0.171.0 (Debian 12; x86_64)"}, "0.171.0"},
		{"codex", map[string]string{}, ""},
		{"pi", map[string]string{"user-agent": "Anthropic/JS 0.60.0", "version": "9.9.9"}, ""},
	} {
		if got := RequestCLIVersion(tc.harness, tc.headers); got != tc.want {
			t.Errorf("RequestCLIVersion(%s, %v) = %q, want %q", tc.harness, tc.headers, got, tc.want)
		}
	}
}
