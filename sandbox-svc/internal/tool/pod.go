package tool

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hangar-dev/hangar/api/sandboxtool"
)

// The commands a driver with no host access to the sandbox (the
// Kubernetes driver's pods) runs its own steps with: starting and
// signalling commands, pid 1, the clone and file access. With them a pod
// needs git and this tool, no shell or coreutils.

// argvCommand runs a command whose request is its third argument.
type argvCommand struct {
	args func() any
	run  func(ctx context.Context, args any, stdin io.Reader, stdout, stderr io.Writer) int
}

func argvCommands() map[string]argvCommand {
	return map[string]argvCommand{
		sandboxtool.CommandExec:    argvTyped(execCommand),
		sandboxtool.CommandSignal:  argvTyped(signalCommand),
		sandboxtool.CommandHold:    argvTyped(holdCommand),
		sandboxtool.CommandInstall: argvTyped(installCommand),
		sandboxtool.CommandKillAll: {run: func(_ context.Context, _ any, _ io.Reader, _, stderr io.Writer) int {
			// kill(-1) signals every process this one may, save pid 1 and
			// itself. ESRCH: there were none.
			if err := syscall.Kill(-1, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return report(stderr, fmt.Errorf("kill every process: %w", err))
			}
			return sandboxtool.ExitOK
		}},
	}
}

func argvTyped[T any](run func(ctx context.Context, req *T, stdin io.Reader, stdout, stderr io.Writer) int) argvCommand {
	return argvCommand{
		args: func() any { return new(T) },
		run: func(ctx context.Context, args any, stdin io.Reader, stdout, stderr io.Writer) int {
			return run(ctx, args.(*T), stdin, stdout, stderr)
		},
	}
}

// runArgv runs an argv command: args[2] is its request line.
func runArgv(ctx context.Context, cmd argvCommand, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var req any
	if cmd.args != nil {
		if len(args) < 3 {
			return report(stderr, fail(sandboxtool.ExitUsage, "%s %s: the request is the third argument", sandboxtool.Binary, args[1]))
		}
		req = cmd.args()
		if err := sandboxtool.ReadRequest(bufio.NewReader(strings.NewReader(args[2]+"\n")), req); err != nil {
			code := sandboxtool.ExitUsage
			if _, ok := errors.AsType[*sandboxtool.VersionError](err); ok {
				code = sandboxtool.ExitVersion
			}
			return report(stderr, &failure{code: code, err: err})
		}
	}
	return cmd.run(ctx, req, stdin, stdout, stderr)
}

// Exit codes of CommandExec that are not the command's own, as a shell
// gives them.
const (
	exitNoDir     = 126
	exitNotFound  = 127
	exitSignalled = 128
)

// lookPath finds file as a shell would with the PATH of env, relative
// names against dir.
func lookPath(file, dir string, env []string) (string, error) {
	executable := func(p string) bool {
		st, err := os.Stat(p)
		return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
	}
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if executable(p) {
			return p, nil
		}
		return "", fs.ErrNotExist
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		if p := filepath.Join(d, file); executable(p) {
			return p, nil
		}
	}
	return "", fs.ErrNotExist
}

// execCommand starts req.Argv in a session of its own (its process
// group is what CommandSignal signals), records its pid in the run file
// and exits with its status; with Replace it becomes the command.
func execCommand(_ context.Context, req *sandboxtool.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(req.Argv) == 0 && req.Replace {
		// A terminal with no command: the login shell, bash or else sh.
		req.Argv = []string{"sh", "-l"}
		if _, err := lookPath("bash", "/", req.Env); err == nil {
			req.Argv[0] = "bash"
		}
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		fmt.Fprintln(stderr, "hangar: empty command")
		return exitNotFound
	}
	dirOK := true
	if st, err := os.Stat(req.Dir); err != nil || !st.IsDir() {
		dirOK = false
		if !req.Replace {
			fmt.Fprintf(stderr, "hangar: %s: no such directory\n", req.Dir)
			return exitNoDir
		}
	}
	at := req.Dir
	if !dirOK {
		at = "/"
	}
	bin, err := lookPath(req.Argv[0], at, req.Env)
	if err != nil {
		fmt.Fprintf(stderr, "hangar: %s: command not found\n", req.Argv[0])
		return exitNotFound
	}
	if req.Replace {
		if err := os.WriteFile(req.RunFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
			fmt.Fprintf(stderr, "hangar: run file: %v\n", err)
			return sandboxtool.ExitFailed
		}
		if dirOK {
			_ = os.Chdir(req.Dir)
		}
		err := syscall.Exec(bin, req.Argv, req.Env)
		_ = os.Remove(req.RunFile)
		fmt.Fprintf(stderr, "hangar: %s: %v\n", req.Argv[0], err)
		return exitNoDir
	}
	cmd := &exec.Cmd{Path: bin, Args: req.Argv, Env: req.Env, Dir: req.Dir,
		Stdin: stdin, Stdout: stdout, Stderr: stderr,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "hangar: %s: %v\n", req.Argv[0], err)
		return exitNoDir
	}
	if err := os.WriteFile(req.RunFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		fmt.Fprintf(stderr, "hangar: run file: %v\n", err)
		return sandboxtool.ExitFailed
	}
	err = cmd.Wait()
	_ = os.Remove(req.RunFile)
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitSignalled + int(ws.Signal())
	}
	if cmd.ProcessState != nil {
		return cmd.ProcessState.ExitCode()
	}
	fmt.Fprintf(stderr, "hangar: %s: %v\n", req.Argv[0], err)
	return sandboxtool.ExitFailed
}

// signals are the names CommandSignal takes.
var signals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "KILL": syscall.SIGKILL,
	"USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "TERM": syscall.SIGTERM, "CONT": syscall.SIGCONT,
	"STOP": syscall.SIGSTOP, "TSTP": syscall.SIGTSTP, "WINCH": syscall.SIGWINCH, "ALRM": syscall.SIGALRM,
}

// runFileWait is how long CommandSignal waits for the run file (the exec
// may not have written it yet), and how often it looks.
const (
	runFileWait = 5 * time.Second
	runFileLook = 20 * time.Millisecond
)

func signalCommand(ctx context.Context, req *sandboxtool.SignalRequest, _ io.Reader, _, stderr io.Writer) int {
	sig, ok := signals[strings.TrimPrefix(req.Signal, "SIG")]
	if !ok {
		return report(stderr, fail(sandboxtool.ExitUsage, "unknown signal %q", req.Signal))
	}
	deadline := time.Now().Add(runFileWait)
	for {
		b, err := os.ReadFile(req.RunFile)
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && pid > 1 {
			// Gone already: nothing to signal.
			if err := syscall.Kill(-pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
				return report(stderr, fmt.Errorf("signal process group %d: %w", pid, err))
			}
			return sandboxtool.ExitOK
		}
		if time.Now().After(deadline) {
			return sandboxtool.ExitOK
		}
		select {
		case <-ctx.Done():
			return sandboxtool.ExitOK
		case <-time.After(runFileLook):
		}
	}
}

// ignoreTerm keeps TERM from ending this process.
func ignoreTerm() { signal.Ignore(syscall.SIGTERM) }

// holdCommand is a pod's pid 1.
func holdCommand(_ context.Context, req *sandboxtool.HoldRequest, _ io.Reader, _, stderr io.Writer) int {
	ignoreTerm()
	if err := os.MkdirAll(req.RunDir, 0o755); err != nil {
		return report(stderr, fmt.Errorf("make the run directory: %w", err))
	}
	for {
		time.Sleep(time.Hour)
	}
}

// installCommand copies this program into req.Dir as the tool, with the
// agent's name linked to it.
func installCommand(_ context.Context, req *sandboxtool.InstallRequest, _ io.Reader, _, stderr io.Writer) int {
	self, err := os.Executable()
	if err != nil {
		return report(stderr, fmt.Errorf("find the tool: %w", err))
	}
	if err := install(self, req.Dir); err != nil {
		return report(stderr, err)
	}
	return sandboxtool.ExitOK
}

func install(self, dir string) error {
	in, err := os.Open(self)
	if err != nil {
		return fmt.Errorf("open the tool: %w", err)
	}
	defer in.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("install the tool: %w", err)
	}
	dst := filepath.Join(dir, sandboxtool.Binary)
	tmp := dst + ".new"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return fmt.Errorf("install the tool: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("install the tool: %w", err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("install the tool: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("install the tool: %w", err)
	}
	agent := filepath.Join(dir, sandboxtool.AgentBinary)
	_ = os.Remove(agent)
	if err := os.Symlink(sandboxtool.Binary, agent); err != nil {
		return fmt.Errorf("install the agent's tool: %w", err)
	}
	return nil
}

// cloneCommand clones the repository into the work tree and checks out
// the ref detached.
func cloneCommand(ctx context.Context, req *sandboxtool.CloneRequest, in io.Reader, out io.Writer) error {
	if req.Repository == "" || req.WorkDir == "" {
		return fail(sandboxtool.ExitUsage, "clone: repository and work_dir are required")
	}
	for _, d := range []string{req.WorkDir, req.HomeDir} {
		if d == "" {
			continue
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("make %s: %w", d, err)
		}
	}
	ref := req.Ref
	if ref == "" {
		ref = "HEAD"
	}
	fresh := req.WorkDir + ".new"
	_ = os.RemoveAll(fresh)
	top := repo{dir: "/"}
	if req.Bundled {
		b, err := os.CreateTemp("", "hangar-clone.")
		if err != nil {
			return fmt.Errorf("clone: %w", err)
		}
		defer os.Remove(b.Name())
		if _, err := io.Copy(b, in); err != nil {
			b.Close()
			return fmt.Errorf("clone: receive the bundle: %w", err)
		}
		if err := b.Close(); err != nil {
			return fmt.Errorf("clone: receive the bundle: %w", err)
		}
		if _, _, err := top.run(ctx, gitCmd{args: []string{"clone", "--quiet", "--no-checkout", "--", b.Name(), fresh}}); err != nil {
			return err
		}
		if _, _, err := top.run(ctx, gitCmd{args: []string{"-C", fresh, "remote", "set-url", "origin", req.Repository}}); err != nil {
			return err
		}
	} else if _, _, err := top.run(ctx, gitCmd{args: []string{"clone", "--quiet", "--no-checkout", "--", req.Repository, fresh}}); err != nil {
		return err
	}
	if err := os.Remove(req.WorkDir); err != nil {
		return fmt.Errorf("clone: the work tree %s is not empty: %w", req.WorkDir, err)
	}
	if err := os.Rename(fresh, req.WorkDir); err != nil {
		return fmt.Errorf("clone: %w", err)
	}
	r := repo{dir: req.WorkDir}
	commit := ""
	for _, c := range []string{ref, "origin/" + ref} {
		if got, code, err := r.run(ctx, gitCmd{args: []string{"rev-parse", "--verify", "--quiet", c + "^{commit}"}, ok: []int{1, 128}}); err == nil && code == 0 {
			commit = strings.TrimSpace(string(got))
			break
		}
	}
	if commit == "" {
		if _, code, err := r.run(ctx, gitCmd{args: []string{"fetch", "--quiet", "origin", ref}, ok: []int{1, 128}}); err == nil && code == 0 {
			if got, code, err := r.run(ctx, gitCmd{args: []string{"rev-parse", "--verify", "--quiet", "FETCH_HEAD^{commit}"}, ok: []int{1, 128}}); err == nil && code == 0 {
				commit = strings.TrimSpace(string(got))
			}
		}
	}
	if commit == "" {
		return fail(sandboxtool.ExitBaseMissing, "base ref %s not found in %s", ref, req.Repository)
	}
	if _, _, err := r.run(ctx, gitCmd{args: []string{"checkout", "--quiet", "--detach", commit}}); err != nil {
		return err
	}
	return writeJSON(out, sandboxtool.CloneResponse{Commit: commit})
}
