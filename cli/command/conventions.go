package command

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// version is hangar's version: the module version `go install` records, or
// the commit a checkout was built at.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := info.Main.Version
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+modified"
			}
		}
	}
	if (v == "" || v == "(devel)") && rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		return "devel " + rev + modified
	}
	if v == "" {
		return "(devel)"
	}
	return v
}

func versionCommand(streams Streams) *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print hangar's version",
		Example: "  hangar version\n  hangar --version",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(streams.Out, "hangar %s\n", version())
			return err
		},
	}
}

// applyConventions walks the tree: a group command (one that only holds
// subcommands) prints its help when called alone and fails on an unknown
// subcommand (with suggestions) instead of printing help and exiting 0;
// NAME arguments of session commands and -e/--harness flags complete.
func applyConventions(cmd *cobra.Command, lookupEnv func(string) (string, bool)) {
	if ex, ok := examples[cmd.CommandPath()]; ok && cmd.Example == "" {
		cmd.Example = ex
	}
	if cmd.HasSubCommands() && cmd.Run == nil && cmd.RunE == nil {
		cmd.Args = func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
			if c.SuggestionsMinimumDistance <= 0 {
				c.SuggestionsMinimumDistance = 2
			}
			if s := c.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return fmt.Errorf("%s (see %s --help)", msg, c.CommandPath())
		}
		cmd.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
	}
	if p := cmd.Parent(); p != nil && p.Name() == "session" && strings.Contains(cmd.Use, "NAME") && cmd.ValidArgsFunction == nil {
		cmd.ValidArgsFunction = func(c *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return completeSessions(c, lookupEnv), cobra.ShellCompDirectiveNoFileComp
		}
	}
	if cmd.Flags().Lookup("environment") != nil {
		_ = cmd.RegisterFlagCompletionFunc("environment", func(c *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
			return completeEnvironments(c, lookupEnv), cobra.ShellCompDirectiveNoFileComp
		})
	}
	if cmd.Flags().Lookup("harness") != nil {
		var names []string
		for _, h := range sessionHarnesses {
			names = append(names, h.name)
		}
		_ = cmd.RegisterFlagCompletionFunc("harness", cobra.FixedCompletions(names, cobra.ShellCompDirectiveNoFileComp))
	}
	for _, sub := range cmd.Commands() {
		applyConventions(sub, lookupEnv)
	}
}

func completeSessions(c *cobra.Command, lookupEnv func(string) (string, bool)) []string {
	sc, done, err := dialSession(lookupEnv)
	if err != nil {
		return nil
	}
	defer done()
	resp, err := sc.ListSessions(c.Context(), &sessionv1.ListSessionsRequest{PageSize: 500})
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range resp.GetSessions() {
		out = append(out, s.GetName()+"\t"+sessionStateLabel(s.GetState()))
	}
	return out
}

func completeEnvironments(c *cobra.Command, lookupEnv func(string) (string, bool)) []string {
	sb, done, err := dialSandbox(lookupEnv)
	if err != nil {
		return nil
	}
	defer done()
	resp, err := sb.ListEnvironments(c.Context(), &sandboxv1.ListEnvironmentsRequest{})
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range resp.GetEnvironments() {
		out = append(out, e.GetName()+"\t"+e.GetRepository())
	}
	return out
}
