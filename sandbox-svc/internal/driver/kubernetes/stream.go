package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// chunk bounds each write to an exec's stdout/stderr (the driver
// contract: chunks of at most 32 KiB).
const chunk = 32 << 10

type streamOptions struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	tty            bool
	sizes          remotecommand.TerminalSizeQueue
}

// stream runs argv in the pod's sandbox container through the API
// server's exec subresource: WebSocket (v5 protocol, stdin close
// supported), SPDY when the server refuses the WebSocket upgrade. It
// returns when the command has exited and its output is delivered; writes
// to stdout/stderr block the stream (backpressure reaches the pod).
func (d *Driver) stream(ctx context.Context, pod string, argv []string, o streamOptions) error {
	if o.stdin == nil && o.stdout == nil && o.stderr == nil && !o.tty {
		// The API server refuses an exec with no stream at all ("you must
		// specify at least 1 of stdin, stdout, stderr"): the driver's
		// signal and kill execs take their stderr.
		o.stderr = &limitedBuffer{}
	}
	req := d.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(d.opts.Namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: container, Command: argv,
			Stdin: o.stdin != nil, Stdout: o.stdout != nil || o.tty, Stderr: o.stderr != nil && !o.tty, TTY: o.tty,
		}, scheme.ParameterCodec)
	cfg := *d.opts.Config
	cfg.Timeout = 0 // an exec runs as long as its command
	ws, err := remotecommand.NewWebSocketExecutor(&cfg, http.MethodGet, req.URL().String())
	if err != nil {
		return fmt.Errorf("exec in pod %s: %w", pod, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(&cfg, http.MethodPost, req.URL())
	if err != nil {
		return fmt.Errorf("exec in pod %s: %w", pod, err)
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return fmt.Errorf("exec in pod %s: %w", pod, err)
	}
	so := remotecommand.StreamOptions{Stdin: o.stdin, Tty: o.tty, TerminalSizeQueue: o.sizes}
	if o.stdout != nil {
		so.Stdout = &chunked{w: o.stdout}
	}
	if o.stderr != nil && !o.tty {
		so.Stderr = &chunked{w: o.stderr}
	}
	err = exec.StreamWithContext(ctx, so)
	var exit utilexec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return fmt.Errorf("exec in pod %s/%s: %w", d.opts.Namespace, pod, d.mapErr(err))
	}
	return err
}

// exitCode reads a stream's result: nil is 0, an ExitError its code.
func exitCode(err error) (int, error) {
	if err == nil {
		return 0, nil
	}
	var exit utilexec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitStatus(), nil
	}
	return 0, err
}

// chunked splits writes into chunks of at most 32 KiB.
type chunked struct{ w io.Writer }

func (c *chunked) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		m, err := c.w.Write(p[:min(len(p), chunk)])
		n += m
		if err != nil {
			return n, err
		}
		p = p[m:]
	}
	return n, nil
}

// Terminal starts a process on a pty in the pod.
func (sb *Sandbox) Terminal(ctx context.Context, req driver.TerminalRequest) (driver.Terminal, error) {
	if err := sb.begin(); err != nil {
		return nil, err
	}
	run := path.Join(RunDir, "term-"+randomHex(8))
	// The tool becomes the terminal's process (its pid, the session the
	// pty gives it, in the run file); no Argv: the user's login shell,
	// bash or else sh.
	env := append(sb.env(req.Env, nil), "TERM=xterm-256color")
	cmd := toolArgv(sandboxtool.CommandExec, sandboxtool.ExecRequest{RunFile: run, Dir: sb.Info().WorkDir, Env: env, Argv: req.Argv, Replace: true})
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	t := &terminal{sb: sb, in: inW, out: outR, sizes: make(chan remotecommand.TerminalSize, 4), done: make(chan struct{}), run: run}
	if req.Rows > 0 && req.Cols > 0 {
		t.sizes <- remotecommand.TerminalSize{Height: req.Rows, Width: req.Cols}
	}
	streamCtx, cancel := context.WithCancel(sb.d.ctx)
	t.cancel = cancel
	go func() {
		defer sb.end()
		defer cancel()
		t.err = sb.d.stream(streamCtx, sb.pod, cmd, streamOptions{stdin: inR, stdout: outW, tty: true, sizes: t})
		outW.Close()
		inR.Close()
		close(t.done)
	}()
	return t, nil
}

type terminal struct {
	sb     *Sandbox
	in     *io.PipeWriter
	out    *io.PipeReader
	sizes  chan remotecommand.TerminalSize
	done   chan struct{}
	run    string
	err    error
	cancel context.CancelFunc

	closeOnce sync.Once
}

func (t *terminal) Read(p []byte) (int, error)  { return t.out.Read(p) }
func (t *terminal) Write(p []byte) (int, error) { return t.in.Write(p) }

// Next is the TerminalSizeQueue: the next size, nil when the terminal ends.
func (t *terminal) Next() *remotecommand.TerminalSize {
	select {
	case s := <-t.sizes:
		return &s
	case <-t.done:
		return nil
	}
}

func (t *terminal) Resize(rows, cols uint16) error {
	select {
	case t.sizes <- remotecommand.TerminalSize{Height: rows, Width: cols}:
		return nil
	case <-t.done:
		return errors.New("terminal ended")
	}
}

func (t *terminal) Wait() (driver.ExitStatus, error) {
	<-t.done
	code, err := exitCode(t.err)
	if err != nil {
		if strings.Contains(err.Error(), "context canceled") {
			return driver.ExitStatus{Code: -1, Signal: "KILL"}, nil
		}
		return driver.ExitStatus{}, err
	}
	return driver.ExitStatus{Code: code}, nil
}

// Kill ends the terminal's process group and its stream.
func (t *terminal) Kill() error {
	t.closeOnce.Do(func() {
		select {
		case <-t.done:
		default:
			ctx, cancel := context.WithTimeout(t.sb.d.ctx, 0x1e*1e9)
			_ = t.sb.d.stream(ctx, t.sb.pod, signalArgv("KILL", t.run), streamOptions{})
			cancel()
		}
		t.in.Close()
		t.cancel()
		t.out.Close()
	})
	return nil
}
