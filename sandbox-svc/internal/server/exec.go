package server

import (
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"context"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// streamWriter sends each write as one message; Send blocks when the
// client is slow (gRPC flow control), which blocks the pipe and so the
// process: backpressure, no buffering. Writes come from exec's copy
// goroutines in chunks of at most 32 KiB.
type streamWriter struct {
	mu     *sync.Mutex
	stream sandboxv1.SandboxService_ExecServer
	stderr bool
}

func (w streamWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += ExecChunk {
		chunk := p[off:min(off+ExecChunk, len(p))]
		var msg *sandboxv1.ExecResponse
		if w.stderr {
			msg = &sandboxv1.ExecResponse{Msg: &sandboxv1.ExecResponse_Stderr{Stderr: chunk}}
		} else {
			msg = &sandboxv1.ExecResponse{Msg: &sandboxv1.ExecResponse_Stdout{Stdout: chunk}}
		}
		w.mu.Lock()
		err := w.stream.Send(msg)
		w.mu.Unlock()
		if err != nil {
			return off, err
		}
	}
	return len(p), nil
}

// Exec runs a command: the first message is start, then stdin chunks,
// close_stdin and signals; stdout/stderr stream back and exit ends it.
// Cancelling the stream kills the process group.
func (s *Server) Exec(stream sandboxv1.SandboxService_ExecServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return fault.InvalidArgument("start", "the first exec message must be start")
		}
		return err
	}
	start := first.GetStart()
	if start == nil {
		return fault.InvalidArgument("start", "the first exec message must be start")
	}
	if len(start.GetCommand()) == 0 || start.GetCommand()[0] == "" {
		return fault.InvalidArgument("start.command", "start.command is required")
	}
	if start.GetTimeoutSeconds() < 0 {
		return fault.InvalidArgument("start.timeout_seconds", "timeout_seconds must not be negative")
	}
	e, err := s.use(ctx, start.GetSandboxId(), start.GetFencingToken())
	if err != nil {
		return err
	}
	defer trackUse(ctx, e, useExec, commandLine(start.GetCommand()))()
	if t := start.GetTimeoutSeconds(); t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(t)*time.Second)
		defer cancel()
	}
	env := map[string]string{}
	for k, v := range e.extraEnv {
		env[k] = v
	}
	for k, v := range start.GetEnv() {
		env[k] = v
	}
	stdinR, stdinW := io.Pipe()
	defer stdinR.Close()
	var sendMu sync.Mutex
	proc, err := e.sb.Exec(ctx, driver.ExecRequest{
		Argv: start.GetCommand(), Env: env, PathPrepend: start.GetPathPrepend(), Dir: start.GetCwd(), Stdin: stdinR,
		Stdout: streamWriter{mu: &sendMu, stream: stream},
		Stderr: streamWriter{mu: &sendMu, stream: stream, stderr: true},
	})
	if err != nil {
		stdinW.Close()
		return fileErr(e.id, start.GetCwd(), err)
	}
	// Requests: stdin is written into the pipe, which blocks until the
	// process reads it, so Recv stops and gRPC flow control pushes back.
	go func() {
		defer stdinW.Close()
		for {
			msg, err := stream.Recv()
			if err != nil {
				return
			}
			switch m := msg.GetMsg().(type) {
			case *sandboxv1.ExecRequest_Stdin:
				if _, err := stdinW.Write(m.Stdin); err != nil {
					// The process closed its stdin; keep serving signals.
					continue
				}
			case *sandboxv1.ExecRequest_CloseStdin:
				stdinW.Close()
			case *sandboxv1.ExecRequest_Signal:
				if sig, err := driver.ParseSignal(m.Signal); err == nil {
					_ = proc.Signal(sig)
				}
			}
		}
	}()
	st, err := proc.Wait()
	stdinR.CloseWithError(io.ErrClosedPipe)
	if ctx.Err() != nil && stream.Context().Err() != nil {
		return stream.Context().Err()
	}
	exit := &sandboxv1.ExecExit{ExitCode: int32(st.Code), Signal: st.Signal}
	if st.Signal != "" {
		// A hangar service's own command (a capture, a restore) is not
		// expected to die of a signal.
		level := slog.LevelInfo
		if sandboxexec.IsServiceCall(ctx) {
			level = slog.LevelWarn
		}
		s.log.Log(ctx, level, "sandbox command killed by a signal", "sandbox", e.id, "command", commandLine(start.GetCommand()),
			"signal", st.Signal, "canceled", ctx.Err() != nil)
	}
	if err != nil {
		exit.Error = "the command could not be waited for"
		s.log.Warn("exec wait failed", "sandbox", e.id, "error", err)
	}
	if ctx.Err() != nil && exit.Error == "" {
		exit.Error = "timed out after " + (time.Duration(start.GetTimeoutSeconds()) * time.Second).String()
	}
	sendMu.Lock()
	defer sendMu.Unlock()
	return stream.Send(&sandboxv1.ExecResponse{Msg: &sandboxv1.ExecResponse_Exit{Exit: exit}})
}
