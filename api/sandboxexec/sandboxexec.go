// Package sandboxexec is the client side of hangar.sandbox.v1's Exec stream:
// it runs a command in a sandbox with stdin streamed in and stdout/stderr
// streamed out, with backpressure and nothing buffered whole. It is the one
// way other services (and the CLI) run commands in a sandbox; it depends
// only on the generated client.
package sandboxexec

import (
	"context"
	"errors"
	"fmt"
	"io"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
)

// ChunkSize is the largest stdin chunk sent in one message. 32 KiB matches
// the chunks sandbox drivers emit for stdout.
const ChunkSize = 32 << 10

// Client runs commands over a SandboxServiceClient.
type Client struct {
	sandboxes   sandboxv1.SandboxServiceClient
	pathPrepend []string
}

// New returns a Client over c.
func New(c sandboxv1.SandboxServiceClient) *Client { return &Client{sandboxes: c} }

// WithPathPrepend returns a Client whose commands find programs in dirs
// first, then on the sandbox's own PATH.
func (c *Client) WithPathPrepend(dirs ...string) *Client {
	cp := *c
	cp.pathPrepend = append([]string(nil), dirs...)
	return &cp
}

// SignalError: the command ran and was killed by a signal.
type SignalError struct{ Signal string }

func (e *SignalError) Error() string { return "exec: command killed by signal " + e.Signal }

// NotStartedError: the command could not start (e.g. a bad working
// directory); a missing binary instead exits 127 with its stderr.
type NotStartedError struct{ Reason string }

func (e *NotStartedError) Error() string { return "exec: command did not start: " + e.Reason }

// ErrNoExit: the stream ended without an exit message.
var ErrNoExit = errors.New("exec stream ended without an exit status")

// Exec runs argv in the sandbox. stdin (nil for none) is streamed in chunks
// and closed at EOF; stdout and stderr chunks are written to the writers as
// they arrive (nil discards). A writer error cancels the command (its
// process group is killed) and is returned. A process killed by a signal
// or unable to start is an error; otherwise the exit code is returned.
func (c *Client) Exec(ctx context.Context, sandboxID string, fencingToken uint64, argv []string, env map[string]string, cwd string,
	stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.sandboxes.Exec(ctx)
	if err != nil {
		return -1, fmt.Errorf("exec: open stream: %w", err)
	}
	start := &sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Start{Start: &sandboxv1.ExecStart{
		SandboxId: sandboxID, FencingToken: fencingToken, Command: argv, Env: env, Cwd: cwd, PathPrepend: c.pathPrepend,
	}}}
	if err := stream.Send(start); err != nil {
		return -1, fmt.Errorf("exec: send start: %w", recvErr(stream, err))
	}

	stdinDone := make(chan error, 1)
	go func() { stdinDone <- sendStdin(stream, stdin) }()

	code, err := receive(stream, stdout, stderr)
	if err != nil {
		cancel()
	}
	// A failed stdin reader (e.g. a decryption error) matters more than
	// the killed command it caused.
	var ie inputError
	if serr := <-stdinDone; errors.As(serr, &ie) {
		return -1, ie.err
	}
	return code, err
}

type inputError struct{ err error }

func (e inputError) Error() string { return "exec stdin: " + e.err.Error() }

func sendStdin(stream sandboxv1.SandboxService_ExecClient, stdin io.Reader) error {
	defer stream.CloseSend()
	if stdin != nil {
		buf := make([]byte, ChunkSize)
		for {
			n, rerr := stdin.Read(buf)
			if n > 0 {
				msg := &sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Stdin{Stdin: buf[:n]}}
				if err := stream.Send(msg); err != nil {
					return err // the stream is gone; receive reports why
				}
			}
			if errors.Is(rerr, io.EOF) {
				break
			}
			if rerr != nil {
				// Kill the command: its input is bad.
				_ = stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Signal{Signal: "KILL"}})
				return inputError{rerr}
			}
		}
	}
	return stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_CloseStdin{CloseStdin: true}})
}

func receive(stream sandboxv1.SandboxService_ExecClient, stdout, stderr io.Writer) (int, error) {
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return -1, ErrNoExit
		}
		if err != nil {
			return -1, fmt.Errorf("exec: %w", err)
		}
		switch m := resp.Msg.(type) {
		case *sandboxv1.ExecResponse_Stdout:
			if stdout != nil {
				if _, err := stdout.Write(m.Stdout); err != nil {
					return -1, err
				}
			}
		case *sandboxv1.ExecResponse_Stderr:
			if stderr != nil {
				if _, err := stderr.Write(m.Stderr); err != nil {
					return -1, err
				}
			}
		case *sandboxv1.ExecResponse_Exit:
			x := m.Exit
			switch {
			case x.GetError() != "":
				return -1, &NotStartedError{Reason: x.GetError()}
			case x.GetSignal() != "":
				return -1, &SignalError{Signal: x.GetSignal()}
			}
			return int(x.GetExitCode()), nil
		}
	}
}

// recvErr returns the stream's status when a Send failed because the
// server already ended the call.
func recvErr(stream sandboxv1.SandboxService_ExecClient, sendErr error) error {
	if errors.Is(sendErr, io.EOF) {
		if _, err := stream.Recv(); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
	}
	return sendErr
}
