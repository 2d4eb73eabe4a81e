package command_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/hangar-dev/hangar/cli/command"
)

// TestHelpGolden: every command's -h, checked against
// testdata/help_<path>.golden (-update rewrites them). Every runnable
// command has examples.
func TestHelpGolden(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	var paths [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		if c.Hidden || c.Name() == "completion" || c.Name() == "help" {
			return
		}
		if c.Example == "" {
			t.Errorf("%s has no examples", c.CommandPath())
		}
		paths = append(paths, path)
		for _, sub := range c.Commands() {
			walk(sub, append(append([]string(nil), path...), sub.Name()))
		}
	}
	walk(command.Root(command.Streams{}, none), nil)
	if len(paths) < 30 {
		t.Fatalf("only %d commands found", len(paths))
	}
	for _, path := range paths {
		var out, errOut bytes.Buffer
		err := command.Execute(context.Background(), command.Streams{Out: &out, Err: &errOut}, append(path, "-h"), none)
		if err != nil || errOut.Len() > 0 {
			t.Errorf("hangar %s -h: %v %s", strings.Join(path, " "), err, errOut.String())
			continue
		}
		name := "help_hangar"
		if len(path) > 0 {
			name += "_" + strings.Join(path, "_")
		}
		sessionGolden(t, name, out.String())
	}
}

// Typos and unknown subcommands fail, with suggestions; a group alone
// prints its help; version answers both ways.
func TestUnknownCommandsFail(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := command.Execute(context.Background(), command.Streams{Out: &out, Err: &out}, args, none)
		return out.String(), err
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sesion", "list"}, `unknown command "sesion" for "hangar"; did you mean session`},
		{[]string{"session", "lst"}, `unknown command "lst" for "hangar session"; did you mean get or list?`},
		{[]string{"sb", "nope"}, `unknown command "nope" for "hangar sb"`},
		{[]string{"session", "list", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"session", "list", "-o", "xml"}, `-o "xml": want table, json or yaml`},
	} {
		if _, err := run(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("hangar %s: %v, want an error containing %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
	if out, err := run("session"); err != nil || !strings.Contains(out, "Available Commands:") {
		t.Errorf("hangar session alone: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		if out, err := run(args...); err != nil || !strings.HasPrefix(out, "hangar ") {
			t.Errorf("hangar %s: %v %q", strings.Join(args, " "), err, out)
		}
	}
}
