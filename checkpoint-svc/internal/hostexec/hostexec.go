// Package hostexec runs commands on this machine, standing in for a
// sandbox in tests: Executor runs them directly, SandboxServer serves them
// as sandbox-svc's Exec stream so the gRPC client is exercised for real.
// It is never wired into the service.
package hostexec

import (
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
)

// Executor runs commands on the host. A relative cwd is taken relative to
// Root (the "work tree"); the sandbox id and fencing token are ignored.
type Executor struct {
	Root string
	// Env is added to every command's environment.
	Env map[string]string
}

// Exec runs argv and waits for it. A writer error kills the process group.
func (e *Executor) Exec(ctx context.Context, _ string, _ uint64, argv []string, env map[string]string, cwd string,
	stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if len(argv) == 0 {
		return -1, errors.New("hostexec: empty argv")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	all := maps.Clone(e.Env)
	if all == nil {
		all = map[string]string{}
	}
	maps.Copy(all, env)
	// A command is looked up on the PATH it runs with (as in a sandbox),
	// not this process's.
	name := argv[0]
	if p, ok := all["PATH"]; ok && !strings.Contains(name, "/") {
		name = lookPath(name, p)
	}
	cmd := exec.CommandContext(ctx, name, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Dir = e.Root
	if filepath.IsAbs(cwd) {
		cmd.Dir = cwd
	} else if cwd != "" {
		cmd.Dir = filepath.Join(e.Root, cwd)
	}
	cmd.Env = os.Environ()
	for k, v := range all {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var werr writeErr
	cmd.Stdin = stdin
	if stdout != nil {
		cmd.Stdout = &failWriter{w: stdout, cancel: cancel, err: &werr}
	}
	if stderr != nil {
		cmd.Stderr = &failWriter{w: stderr, cancel: cancel, err: &werr}
	}
	err := cmd.Run()
	if first := werr.get(); first != nil {
		return -1, first
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.Exited() {
		return ee.ExitCode(), nil
	}
	if err != nil {
		return -1, err
	}
	return 0, nil
}

// lookPath finds name in the directories of path; name itself (a
// command not found: exit 127 from the start) when it is in none.
func lookPath(name, path string) string {
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return name
}

type writeErr struct {
	mu  sync.Mutex
	err error
}

func (w *writeErr) set(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

func (w *writeErr) get() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

type failWriter struct {
	w      io.Writer
	cancel func()
	err    *writeErr
}

func (f *failWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err != nil {
		f.err.set(err)
		f.cancel()
	}
	return n, err
}

// SandboxServer serves sandbox-svc's Exec on the host (every other RPC is
// unimplemented). Stdout is sent in chunks of at most 32 KiB, as drivers do.
type SandboxServer struct {
	sandboxv1.UnimplementedSandboxServiceServer
	Exec_ *Executor
}

// Exec implements the Exec stream.
func (s *SandboxServer) Exec(stream sandboxv1.SandboxService_ExecServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return errors.New("first message must be start")
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	pr, pw := io.Pipe()
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				pw.CloseWithError(err)
				return
			}
			switch m := req.Msg.(type) {
			case *sandboxv1.ExecRequest_Stdin:
				if _, err := pw.Write(m.Stdin); err != nil {
					return
				}
			case *sandboxv1.ExecRequest_CloseStdin:
				pw.Close()
			case *sandboxv1.ExecRequest_Signal:
				pw.CloseWithError(errors.New("killed"))
				cancel()
			}
		}
	}()
	var mu sync.Mutex
	send := func(r *sandboxv1.ExecResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(r)
	}
	out := chunker{send: func(b []byte) error {
		return send(&sandboxv1.ExecResponse{Msg: &sandboxv1.ExecResponse_Stdout{Stdout: b}})
	}}
	errOut := chunker{send: func(b []byte) error {
		return send(&sandboxv1.ExecResponse{Msg: &sandboxv1.ExecResponse_Stderr{Stderr: b}})
	}}
	code, err := s.Exec_.Exec(ctx, start.GetSandboxId(), start.GetFencingToken(), start.GetCommand(), start.GetEnv(), start.GetCwd(), pr, &out, &errOut)
	pr.Close()
	exit := &sandboxv1.ExecExit{ExitCode: int32(code)}
	if err != nil {
		if ctx.Err() != nil {
			exit.Signal = "KILL"
		} else {
			exit.Error = err.Error()
		}
	}
	return send(&sandboxv1.ExecResponse{Msg: &sandboxv1.ExecResponse_Exit{Exit: exit}})
}

type chunker struct{ send func([]byte) error }

func (c *chunker) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), 32<<10)
		if err := c.send(append([]byte(nil), p[:k]...)); err != nil {
			return n, err
		}
		p, n = p[k:], n+k
	}
	return n, nil
}
