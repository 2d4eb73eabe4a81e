package command

import (
	"context"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/client"
	"github.com/hangar-dev/hangar/cli/mcp"
	"github.com/hangar-dev/hangar/platform/logging"
)

func mcpCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve hangar's session tools to an agent over MCP (stdio)",
		Long: `Serve hangar's session tools (new_session, wait_for_turn, get_session_patch,
fork_session, ...) to an MCP client on stdin and stdout. It finds hangar like
every other command: HANGAR_URL and HANGAR_TOKEN, or HANGAR_HOME. It runs
beside your checkout, so new_session's context.from_local and files given by
path are read here. Logs go to stderr.

hangar up also serves the same tools over streamable HTTP at /mcp on its front
door (Authorization: Bearer <token>).`,
		Example: `  claude mcp add hangar -- hangar mcp
  {"mcpServers": {"hangar": {"command": "hangar", "args": ["mcp"]}}}   # an --mcp-config file`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ep, err := client.Resolve(lookupEnv)
			if err != nil {
				return err
			}
			conn, err := ep.Dial()
			if err != nil {
				return err
			}
			defer conn.Close()
			dir := streams.Dir
			if dir == "" {
				if dir, err = os.Getwd(); err != nil {
					return err
				}
			}
			logger := logging.New(streams.Err, mcpLogLevel(lookupEnv), "text")
			return mcp.Serve(cmd.Context(), mcp.Options{
				Sessions: sessionv1.NewSessionServiceClient(conn),
				Replay:   replayv1.NewReplayServiceClient(conn),
				Local:    localCheckout{dir: dir},
				Version:  version(),
				Logger:   logger,
			}, streams.In, streams.Out)
		},
	}
}

// mcpLogLevel is HANGAR_LOG_LEVEL, warn by default: stderr is the client's
// log of the server.
func mcpLogLevel(lookupEnv func(string) (string, bool)) string {
	if v, ok := lookupEnv("HANGAR_LOG_LEVEL"); ok && v != "" {
		return v
	}
	return "warn"
}

// localCheckout is what `hangar mcp` reads beside it, the way the CLI's
// --from-local, --file and the repository you are in do.
type localCheckout struct{ dir string }

func (l localCheckout) Work(ctx context.Context, dir string) (*sessionv1.LocalWork, error) {
	return sessionLocalWork(ctx, dir)
}

func (l localCheckout) ReadFile(path string) ([]byte, error) {
	return os.ReadFile(filepath.Clean(path))
}

func (l localCheckout) Repository(ctx context.Context, dir string) string {
	top, _ := sessionGitTop(ctx, dir)
	return top
}

func (l localCheckout) Dir() string { return l.dir }
