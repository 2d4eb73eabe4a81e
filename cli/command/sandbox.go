package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"
	"google.golang.org/grpc/status"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/client"
)

// ExitError is a remote command's failure: `hangar` exits with Code and
// prints nothing more (the command's own stderr said why).
type ExitError struct {
	Code int
	// Signal names the signal that ended the command ("KILL"), if any.
	Signal string
}

func (e *ExitError) Error() string {
	if e.Signal != "" {
		return fmt.Sprintf("the command was killed by SIG%s", e.Signal)
	}
	return fmt.Sprintf("the command exited with code %d", e.Code)
}

// exitOf turns a remote exit into nil (success) or an *ExitError; a signal
// exits 128+n as a shell would.
func exitOf(x *sandboxv1.ExecExit) error {
	if x.GetSignal() != "" {
		code := 128 + 9
		if n := unix.SignalNum("SIG" + x.GetSignal()); n != 0 {
			code = 128 + int(n)
		}
		return &ExitError{Code: code, Signal: x.GetSignal()}
	}
	if x.GetExitCode() != 0 {
		return &ExitError{Code: int(x.GetExitCode())}
	}
	return nil
}

// sandboxCallErr makes a failed call one line: the status message names
// what was not found or what was wrong.
func sandboxCallErr(err error) error {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok {
		return errors.New(strings.ReplaceAll(st.Message(), "\n", " "))
	}
	return err
}

// dialSandbox connects to the sandbox service through the endpoint.
func dialSandbox(lookupEnv func(string) (string, bool)) (sandboxv1.SandboxServiceClient, func(), error) {
	sb, _, done, err := dialSandboxAndSessions(lookupEnv)
	return sb, done, err
}

// dialSandboxAndSessions also gives the session service, for holds.
func dialSandboxAndSessions(lookupEnv func(string) (string, bool)) (sandboxv1.SandboxServiceClient, sessionv1.SessionServiceClient, func(), error) {
	ep, err := client.Resolve(lookupEnv)
	if err != nil {
		return nil, nil, nil, err
	}
	conn, err := ep.Dial()
	if err != nil {
		return nil, nil, nil, err
	}
	return sandboxv1.NewSandboxServiceClient(conn), sessionv1.NewSessionServiceClient(conn), func() { _ = conn.Close() }, nil
}

func sandboxCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "sb",
		Aliases: []string{"sandbox"},
		Short:   "List sandboxes, run commands in them, attach terminals",
	}
	cmd.AddCommand(sandboxListCommand(streams, lookupEnv), sandboxExecCommand(streams, lookupEnv), sandboxAttachCommand(streams, lookupEnv))
	return cmd
}

func sandboxListCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var (
		env    string
		output *outputFormat
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List leased and warm sandboxes",
		Example: `  hangar sb list
  hangar sb list -e local -o json`,
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
			resp, err := sb.ListSandboxes(cmd.Context(), &sandboxv1.ListSandboxesRequest{Environment: env})
			if err != nil {
				return sandboxCallErr(err)
			}
			if !output.table() {
				return writeMessage(streams.Out, output.value, resp)
			}
			tw := tabwriter.NewWriter(streams.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tENVIRONMENT\tSTATE\tHOLDER\tLEASE EXPIRES\tWORK DIR")
			for _, s := range resp.GetSandboxes() {
				holder, expires := "-", "-"
				if l := s.GetLease(); l != nil {
					holder = l.GetHolder()
					if l.GetExpiresAt() != nil {
						expires = l.GetExpiresAt().AsTime().Local().Format(time.RFC3339)
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.GetId(), s.GetEnvironment(), sandboxStateName(s.GetState()), holder, expires, s.GetWorkDir())
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&env, "environment", "e", "", "only this environment's sandboxes")
	output = addOutputFlag(cmd)
	return cmd
}

func sandboxStateName(st sandboxv1.SandboxState) string {
	return strings.ToLower(strings.TrimPrefix(st.String(), "SANDBOX_STATE_"))
}

func sandboxExecCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var (
		cwd     string
		envs    []string
		token   uint64
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "exec SANDBOX_ID -- COMMAND [ARGS...]",
		Short: "Run a command in a sandbox, streaming stdin, stdout and stderr; exit with its code",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return errors.New("usage: hangar sb exec SANDBOX_ID -- COMMAND [ARGS...]")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			timeoutSeconds, err := int32Seconds("timeout", timeout)
			if err != nil {
				return err
			}
			start := &sandboxv1.ExecStart{SandboxId: args[0], FencingToken: token, Command: args[1:], Cwd: cwd,
				TimeoutSeconds: timeoutSeconds}
			if len(envs) > 0 {
				start.Env = map[string]string{}
				for _, kv := range envs {
					k, v, ok := strings.Cut(kv, "=")
					if !ok || k == "" {
						return fmt.Errorf("--env %q: want KEY=VALUE", kv)
					}
					start.Env[k] = v
				}
			}
			sb, sessions, done, err := dialSandboxAndSessions(lookupEnv)
			if err != nil {
				return err
			}
			defer done()
			release := holdSandboxSession(cmd.Context(), sb, sessions, args[0], sessionv1.HoldKind_HOLD_KIND_COMMAND, "hangar sb exec "+strings.Join(args[1:], " "))
			defer release()
			return sandboxExec(cmd.Context(), sb, start, streams)
		},
	}
	cmd.Flags().StringVar(&cwd, "cwd", "", "working directory, relative to the work tree")
	cmd.Flags().StringArrayVar(&envs, "env", nil, "KEY=VALUE for the command (repeatable)")
	cmd.Flags().Uint64Var(&token, "token", 0, "the lease's fencing token (0: any live lease)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "kill the command after this long (0: no limit)")
	return cmd
}

// sandboxChunk is how much stdin or terminal input one message carries.
const sandboxChunk = 32 << 10

// sandboxExec runs one command over the Exec stream: stdin flows in as it
// is read (and is closed at EOF), stdout and stderr flow out; the result is
// the command's exit.
func sandboxExec(ctx context.Context, sb sandboxv1.SandboxServiceClient, start *sandboxv1.ExecStart, streams Streams) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := sb.Exec(ctx)
	if err != nil {
		return sandboxCallErr(err)
	}
	if err := stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Start{Start: start}}); err != nil {
		return sandboxExecRecvErr(stream.RecvMsg(new(sandboxv1.ExecResponse)), err)
	}
	if streams.In != nil {
		go func() {
			buf := make([]byte, sandboxChunk)
			for {
				n, err := streams.In.Read(buf)
				if n > 0 {
					if stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Stdin{Stdin: append([]byte(nil), buf[:n]...)}}) != nil {
						return
					}
				}
				if err != nil {
					_ = stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_CloseStdin{CloseStdin: true}})
					return
				}
			}
		}()
	} else {
		_ = stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_CloseStdin{CloseStdin: true}})
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			return sandboxExecRecvErr(err, nil)
		}
		switch m := msg.GetMsg().(type) {
		case *sandboxv1.ExecResponse_Stdout:
			if _, err := streams.Out.Write(m.Stdout); err != nil {
				return fmt.Errorf("write stdout: %w", err)
			}
		case *sandboxv1.ExecResponse_Stderr:
			if _, err := streams.Err.Write(m.Stderr); err != nil {
				return fmt.Errorf("write stderr: %w", err)
			}
		case *sandboxv1.ExecResponse_Exit:
			if e := m.Exit.GetError(); e != "" {
				fmt.Fprintln(streams.Err, "hangar:", e)
			}
			return exitOf(m.Exit)
		}
	}
}

// sandboxExecRecvErr is the error of a stream that ended without an exit.
func sandboxExecRecvErr(recvErr, sendErr error) error {
	if recvErr != nil && !errors.Is(recvErr, io.EOF) {
		return sandboxCallErr(recvErr)
	}
	if sendErr != nil {
		return sandboxCallErr(sendErr)
	}
	return errors.New("the exec stream ended without an exit status")
}

// sandboxDetachKey is Ctrl-]: typed on an attached terminal, it detaches.
const sandboxDetachKey = 0x1d

// sandboxEOT is Ctrl-D, the terminal's end of file.
const sandboxEOT = 0x04

func sandboxAttachCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var (
		token       uint64
		terminalID  string
		detachOnEOF bool
	)
	cmd := &cobra.Command{
		Use:   "attach SANDBOX_ID [-- COMMAND [ARGS...]]",
		Short: "Attach a terminal to a sandbox (Ctrl-] detaches)",
		Long: `Attach a terminal (a pty running the sandbox's shell, or COMMAND) to a sandbox.

On a terminal, input is raw and Ctrl-] detaches, leaving the shell running:
re-attach with --terminal ID. With piped input, the input is typed into the
pty and its end is sent as Ctrl-D (so a shell exits) unless --detach-on-eof;
hangar exits with the shell's exit code.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			open := &sandboxv1.TerminalOpen{SandboxId: args[0], FencingToken: token, Command: args[1:], TerminalId: terminalID}
			sb, sessions, done, err := dialSandboxAndSessions(lookupEnv)
			if err != nil {
				return err
			}
			defer done()
			release := holdSandboxSession(cmd.Context(), sb, sessions, args[0], sessionv1.HoldKind_HOLD_KIND_TERMINAL, "hangar sb attach")
			defer release()
			// A new terminal on a session's sandbox gets what the agent's
			// resume_command needs (a gateway run of its own, its URLs and
			// token), for as long as it is attached.
			if terminalID == "" {
				if name := sandboxSessionName(cmd.Context(), sb, args[0]); name != "" {
					if in, err := sessions.StartInteractive(cmd.Context(), &sessionv1.StartInteractiveRequest{Name: name}); err == nil {
						open.Env, open.PathPrepend = in.GetEnv(), in.GetPathPrepend()
						fmt.Fprintf(streams.Err, "session %s: continue the agent's conversation here with: %s\n", name, in.GetCommand())
						defer func() {
							_, _ = sessions.EndInteractive(context.WithoutCancel(cmd.Context()), &sessionv1.EndInteractiveRequest{Name: name, Run: in.GetRun()})
						}()
					}
				}
			}
			return sandboxAttach(cmd.Context(), sb, open, streams, detachOnEOF)
		},
	}
	cmd.Flags().Uint64Var(&token, "token", 0, "the lease's fencing token (0: any live lease)")
	cmd.Flags().StringVar(&terminalID, "terminal", "", "re-attach to this detached terminal")
	cmd.Flags().BoolVar(&detachOnEOF, "detach-on-eof", false, "with piped input, detach at its end instead of sending Ctrl-D")
	return cmd
}

// sandboxTTY is stdin when it is a terminal.
type sandboxTTY struct {
	in  *os.File
	out int // a descriptor to read the size from
}

func sandboxTerminalOf(streams Streams) *sandboxTTY {
	f, ok := streams.In.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	t := &sandboxTTY{in: f, out: int(f.Fd())}
	if o, ok := streams.Out.(*os.File); ok && term.IsTerminal(int(o.Fd())) {
		t.out = int(o.Fd())
	}
	return t
}

func (t *sandboxTTY) size() *sandboxv1.TerminalSize {
	cols, rows, err := term.GetSize(t.out)
	if err != nil || rows <= 0 || cols <= 0 {
		return nil
	}
	return &sandboxv1.TerminalSize{Rows: uint32(rows), Cols: uint32(cols)}
}

// sandboxAttach runs one terminal attach until the process exits (its exit
// code is the result), the user detaches or the context ends.
func sandboxAttach(ctx context.Context, sb sandboxv1.SandboxServiceClient, open *sandboxv1.TerminalOpen, streams Streams, detachOnEOF bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tty := sandboxTerminalOf(streams)
	if tty != nil {
		open.Size = tty.size()
		old, err := term.MakeRaw(int(tty.in.Fd()))
		if err != nil {
			return fmt.Errorf("raw mode: %w", err)
		}
		defer func() { _ = term.Restore(int(tty.in.Fd()), old) }()
	}
	stream, err := sb.AttachTerminal(ctx)
	if err != nil {
		return sandboxCallErr(err)
	}
	var sendMu sync.Mutex
	send := func(m *sandboxv1.AttachTerminalRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	if err := send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Open{Open: open}}); err != nil {
		return sandboxExecRecvErr(stream.RecvMsg(new(sandboxv1.AttachTerminalResponse)), err)
	}
	first, err := stream.Recv()
	if err != nil {
		return sandboxExecRecvErr(err, nil)
	}
	termID := first.GetTerminalId()

	detached := make(chan struct{})
	var detachOnce sync.Once
	detach := func() {
		detachOnce.Do(func() {
			_ = send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Detach{Detach: true}})
			close(detached)
		})
	}
	if tty != nil {
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, unix.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-winch:
					if sz := tty.size(); sz != nil {
						_ = send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Resize{Resize: sz}})
					}
				}
			}
		}()
	}
	go func() {
		buf := make([]byte, sandboxChunk)
		for {
			n, err := streams.In.Read(buf)
			chunk := buf[:n]
			if tty != nil {
				if i := strings.IndexByte(string(chunk), sandboxDetachKey); i >= 0 {
					if i > 0 {
						_ = send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Input{Input: append([]byte(nil), chunk[:i]...)}})
					}
					detach()
					return
				}
			}
			if n > 0 {
				if send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Input{Input: append([]byte(nil), chunk...)}}) != nil {
					return
				}
			}
			if err != nil {
				if tty != nil || detachOnEOF {
					detach()
				} else {
					_ = send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Input{Input: []byte{sandboxEOT}}})
				}
				return
			}
		}
	}()
	for {
		msg, err := stream.Recv()
		if err != nil {
			select {
			case <-detached:
				fmt.Fprintf(streams.Err, "\r\nhangar: detached from %s (re-attach: hangar sb attach %s --terminal %s)\r\n", termID, open.GetSandboxId(), termID)
				return nil
			default:
			}
			return sandboxExecRecvErr(err, nil)
		}
		switch m := msg.GetMsg().(type) {
		case *sandboxv1.AttachTerminalResponse_Output:
			if _, err := streams.Out.Write(m.Output); err != nil {
				return fmt.Errorf("write output: %w", err)
			}
		case *sandboxv1.AttachTerminalResponse_Exit:
			return exitOf(m.Exit)
		}
	}
}
