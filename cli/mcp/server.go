// Package mcp is hangar's MCP façade: the spec's session commands as MCP
// tools for agents that drive hangar (new_session, wait_for_turn,
// fork_session, ...), on the official Go SDK. It is a client of the API
// like the CLI: every tool is one or two calls of the session service (the
// replay service for fork_run and get_fork), and its structured output is
// the API's answer as the REST API writes it (platform/apijson: "state":
// "idle", 64-bit integers as numbers). `hangar mcp` serves it on stdio
// (Serve); `hangar up` mounts HTTPHandler at /mcp on its front door
// (streamable HTTP, behind the API token).
package mcp

import (
	"context"
	"io"
	"log/slog"
	"net/http"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/platform/auth"
)

// Local reads what lives beside the MCP server: a checkout to continue in
// the cloud (new_session's context.from_local) and files to attach by
// path. `hangar mcp` runs on the caller's machine and has it; the /mcp
// endpoint runs inside hangar, where the caller's files are not, and has
// none (those inputs are refused there, with what to do instead).
type Local interface {
	// Work is --from-local for the checkout holding dir: its unpushed
	// commits, uncommitted changes and untracked files.
	Work(ctx context.Context, dir string) (*sessionv1.LocalWork, error)
	// ReadFile reads a file to attach.
	ReadFile(path string) ([]byte, error)
	// Repository is the top level of the git repository holding dir, ""
	// when there is none: a session started without environment or repo
	// works on the repository the server runs in, as the CLI's does.
	Repository(ctx context.Context, dir string) string
	// Dir is the directory relative paths resolve against.
	Dir() string
}

// Options are what the façade needs.
type Options struct {
	// Sessions is the session service, dialled like any other client.
	Sessions sessionv1.SessionServiceClient
	// Replay is the replay service (fork_run, get_fork), on the same
	// connection.
	Replay replayv1.ReplayServiceClient
	// Local is nil when the server cannot see the caller's files.
	Local Local
	// Version is hangar's version, announced to clients.
	Version string
	Logger  *slog.Logger
}

// NewServer is the MCP server with every session tool.
func NewServer(opts Options) *mcpsdk.Server {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	version := opts.Version
	if version == "" {
		version = "(devel)"
	}
	srv := mcpsdk.NewServer(&mcpsdk.Implementation{Name: "hangar", Title: "hangar", Version: version}, &mcpsdk.ServerOptions{
		Instructions: instructions,
		Logger:       logger,
	})
	t := &tools{sessions: opts.Sessions, replay: opts.Replay, local: opts.Local, logger: logger}
	t.register(srv)
	return srv
}

// instructions is what a client tells its model about the server as a whole.
const instructions = `hangar runs coding agents (Claude Code, Codex, pi) in sandboxes as sessions: named streams of work that keep the agent's conversation and the repository state, suspend when idle and resume on the next message. ` +
	`Typical use: new_session (with a message, to start a first turn), then wait_for_turn until it ends, then get_session_patch for the work as a patch; send_to_session continues a session, fork_session branches it into N. ` +
	`Errors come back as tool errors: "CODE REASON: message".`

// Serve runs the server on one connection (stdio: in and out) until the
// client goes away or ctx ends.
func Serve(ctx context.Context, opts Options, in io.Reader, out io.Writer) error {
	return NewServer(opts).Run(ctx, &mcpsdk.IOTransport{Reader: io.NopCloser(in), Writer: nopWriteCloser{out}})
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// HTTPOptions configure the streamable HTTP endpoint.
type HTTPOptions struct {
	// Token is the API token every request must carry (Authorization:
	// Bearer); others are answered 401 before their body is read.
	Token string
	// MaxRequestBytes caps a request's body (the SDK's 4 MiB when zero).
	MaxRequestBytes int64
}

// HTTPHandler serves the tools over MCP's streamable HTTP transport,
// stateless (any replica of a front door answers any request; progress
// notifications go out on the response stream of the call they belong to).
func HTTPHandler(opts Options, httpOpts HTTPOptions) http.Handler {
	srv := NewServer(opts)
	h := mcpsdk.NewStreamableHTTPHandler(func(*http.Request) *mcpsdk.Server { return srv }, &mcpsdk.StreamableHTTPOptions{
		Stateless:           true,
		Logger:              opts.Logger,
		MaxRequestBodyBytes: httpOpts.MaxRequestBytes,
	})
	return auth.HTTPMiddleware(httpOpts.Token, h)
}
