package command

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
)

func environmentCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "env",
		Aliases: []string{"environment"},
		Short:   "List, show and apply environments (what a sandbox is built from)",
	}
	cmd.AddCommand(environmentListCommand(streams, lookupEnv), environmentGetCommand(streams, lookupEnv), environmentApplyCommand(streams, lookupEnv))
	return cmd
}

func environmentListCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var output *outputFormat
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List environments",
		Example: `  hangar env list
  hangar env list -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := output.check(); err != nil {
				return err
			}
			sb, done, err := dialSandbox(lookupEnv)
			if err != nil {
				return err
			}
			defer done()
			resp, err := sb.ListEnvironments(cmd.Context(), &sandboxv1.ListEnvironmentsRequest{})
			if err != nil {
				return sandboxCallErr(err)
			}
			if !output.table() {
				return writeMessage(streams.Out, output.value, resp)
			}
			tw := tabwriter.NewWriter(streams.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tREPOSITORY\tBASE REF\tEGRESS\tWARM POOL\tDRIVER")
			for _, e := range resp.GetEnvironments() {
				ref := e.GetBaseRef()
				if ref == "" {
					ref = "HEAD"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", e.GetName(), e.GetRepository(), ref, environmentEgressName(e.GetEgress()), e.GetWarmPoolSize(), e.GetDriver())
			}
			return tw.Flush()
		},
	}
	output = addOutputFlag(cmd)
	return cmd
}

func environmentGetCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show an environment (YAML, the format `env apply -f` reads)",
		Example: `  hangar env get local
  hangar env get web -o json > web.json && hangar env apply -f web.json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output == "table" {
				output = "yaml"
			}
			if output != "yaml" && output != "json" {
				return fmt.Errorf("-o %q: want yaml (the default; also table) or json", output)
			}
			sb, done, err := dialSandbox(lookupEnv)
			if err != nil {
				return err
			}
			defer done()
			resp, err := sb.GetEnvironment(cmd.Context(), &sandboxv1.GetEnvironmentRequest{Name: args[0], ResolveBase: true})
			if err != nil {
				return sandboxCallErr(err)
			}
			b, err := environmentEncode(resp.GetEnvironment(), output)
			if err != nil {
				return err
			}
			// Where the next session starts: a comment, so the YAML is
			// still what env apply reads (on stderr beside JSON).
			note := streams.Out
			if output == "json" {
				note = streams.Err
			}
			repo, base := resp.GetEnvironment().GetRepository(), resp.GetBaseCommit()
			dir := streams.Dir
			if dir == "" {
				dir = "."
			}
			if top, err := sessionGitTop(cmd.Context(), dir); err == nil && args[0] == "local" && top != repo {
				// session new without -e uses the repository it runs in.
				if here, err := sb.GetEnvironment(cmd.Context(), &sandboxv1.GetEnvironmentRequest{Name: args[0], Repository: top}); err == nil {
					repo, base = top, here.GetBaseCommit()
				}
			}
			if base != "" {
				fmt.Fprintf(note, "# the next session started here starts at %s of %s\n", sessionShortCommit(base), repo)
			}
			_, err = streams.Out.Write(b)
			return err
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "yaml", "yaml (the format env apply reads; also table) or json")
	return cmd
}

func environmentApplyCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create or replace an environment from a YAML or JSON file ('-' reads stdin)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return fmt.Errorf("-f FILE is required")
			}
			var raw []byte
			var err error
			if file == "-" {
				raw, err = io.ReadAll(streams.In)
			} else {
				raw, err = os.ReadFile(file)
			}
			if err != nil {
				return fmt.Errorf("read %s: %w", file, err)
			}
			env, err := environmentDecode(raw)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			sb, done, err := dialSandbox(lookupEnv)
			if err != nil {
				return err
			}
			defer done()
			resp, err := sb.ApplyEnvironment(cmd.Context(), &sandboxv1.ApplyEnvironmentRequest{Environment: env})
			if err != nil {
				return sandboxCallErr(err)
			}
			verb := "updated"
			if resp.GetCreated() {
				verb = "created"
			}
			fmt.Fprintf(streams.Out, "environment %s %s\n", resp.GetEnvironment().GetName(), verb)
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "the environment, YAML or JSON")
	return cmd
}

// environmentEgressName is how files and tables spell an egress policy:
// the same words as the environment files under HANGAR_HOME.
func environmentEgressName(e sandboxv1.Egress) string {
	switch e {
	case sandboxv1.Egress_EGRESS_NONE:
		return "none"
	case sandboxv1.Egress_EGRESS_FULL:
		return "full"
	}
	return "full"
}

// environmentDecode reads an Environment from YAML or JSON with the proto
// field names (base_ref, warm_pool_size; lowerCamel works too) and egress
// spelled full or none. Unknown fields are errors, so a typo is not
// silently dropped.
func environmentDecode(raw []byte) (*sandboxv1.Environment, error) {
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("not YAML or JSON: %w", err)
	}
	var fields map[string]any
	if err := json.Unmarshal(js, &fields); err != nil || fields == nil {
		return nil, fmt.Errorf("want an object with the environment's fields")
	}
	if eg, ok := fields["egress"].(string); ok {
		switch strings.ToLower(eg) {
		case "none":
			fields["egress"] = "EGRESS_NONE"
		case "full":
			fields["egress"] = "EGRESS_FULL"
		}
	}
	if js, err = json.Marshal(fields); err != nil {
		return nil, err
	}
	env := &sandboxv1.Environment{}
	if err := protojson.Unmarshal(js, env); err != nil {
		return nil, fmt.Errorf("not an environment: %s", strings.ReplaceAll(err.Error(), "\u00a0", " "))
	}
	return env, nil
}

// environmentEncode writes an Environment as YAML or JSON that
// environmentDecode reads back.
func environmentEncode(env *sandboxv1.Environment, format string) ([]byte, error) {
	js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(env)
	if err != nil {
		return nil, err
	}
	var fields map[string]any
	if err := json.Unmarshal(js, &fields); err != nil {
		return nil, err
	}
	if _, ok := fields["egress"]; ok {
		fields["egress"] = environmentEgressName(env.GetEgress())
	}
	if format == "json" {
		b, err := json.MarshalIndent(fields, "", "  ")
		return append(b, '\n'), err
	}
	return yaml.Marshal(fields)
}
