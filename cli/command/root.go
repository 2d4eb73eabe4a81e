// Package command is the `hangar` command line.
package command

import (
	"context"
	"io"

	"github.com/spf13/cobra"
)

// Streams are where a command reads and writes.
type Streams struct {
	In  io.Reader
	Out io.Writer
	Err io.Writer
	// Dir is the working directory commands resolve paths and the current
	// git repository against; "" is the process's.
	Dir string
}

// Root builds the `hangar` command tree. lookupEnv reads the environment
// (os.LookupEnv outside tests).
func Root(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	root := &cobra.Command{
		Use:           "hangar",
		Short:         "Run coding agents in sandboxes, as sessions you can come back to",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.Err)
	root.AddCommand(upCommand(streams, lookupEnv), statusCommand(streams, lookupEnv))
	root.AddCommand(fakeModelCommand(streams))
	root.AddCommand(sandboxCommand(streams, lookupEnv), environmentCommand(streams, lookupEnv))
	root.AddCommand(sessionCommand(streams, lookupEnv))
	root.AddCommand(harnessCommand(streams, lookupEnv))
	root.AddCommand(checkpointCommand(streams, lookupEnv))
	root.AddCommand(jobCommand(streams, lookupEnv))
	root.AddCommand(mcpCommand(streams, lookupEnv))
	root.AddCommand(runCommand(streams, lookupEnv), forkCommand(streams, lookupEnv), trialCommand(streams, lookupEnv))
	root.AddCommand(versionCommand(streams))
	root.Version = version()
	root.SetVersionTemplate("hangar {{.Version}}\n")
	applyConventions(root, lookupEnv)
	return root
}

// Execute runs the command line; the error is what to print.
func Execute(ctx context.Context, streams Streams, args []string, lookupEnv func(string) (string, bool)) error {
	root := Root(streams, lookupEnv)
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}
