// Package tool is hangar-sandbox: each command reads its request (see
// api/sandboxtool), does its work with git run directly (no shell) and
// writes its result. It runs inside a sandbox, so it depends on nothing
// but the standard library, git and the protocol package.
package tool

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/hangar-dev/hangar/api/sandboxtool"
)

// failure is an error with the exit code it ends the command with.
type failure struct {
	code int
	err  error
}

func (f *failure) Error() string { return f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

func fail(code int, format string, args ...any) error {
	return &failure{code: code, err: fmt.Errorf(format, args...)}
}

// command runs one command: in is stdin after the request line.
type command struct {
	// args is a pointer to the command's request type; nil: no request.
	args func() any
	run  func(ctx context.Context, args any, in io.Reader, out io.Writer) error
}

func commands() map[string]command {
	return map[string]command{
		sandboxtool.CommandVersion: {run: func(_ context.Context, _ any, _ io.Reader, out io.Writer) error {
			return writeJSON(out, sandboxtool.VersionResponse{Protocol: sandboxtool.Version})
		}},
		sandboxtool.CommandProbe:        typed(probe),
		sandboxtool.CommandTreeHash:     typed(treeHashCommand),
		sandboxtool.CommandBundle:       typed(bundle),
		sandboxtool.CommandDiff:         typed(diff),
		sandboxtool.CommandUntracked:    typed(untracked),
		sandboxtool.CommandArchive:      typed(archive),
		sandboxtool.CommandStage:        typed(stage),
		sandboxtool.CommandRemove:       typed(remove),
		sandboxtool.CommandRestoreProbe: typed(restoreProbe),
		sandboxtool.CommandRestore:      typed(restore),
		sandboxtool.CommandInitWork:     typed(initWork),
		sandboxtool.CommandHead:         typed(head),
		sandboxtool.CommandWorkBundle:   typed(workBundle),
		sandboxtool.CommandWorkDiff:     typed(workDiff),
		sandboxtool.CommandCopyPrepare:  typed(copyPrepare),
		sandboxtool.CommandFromLocal:    typed(fromLocal),
		sandboxtool.CommandClone:        typed(cloneCommand),
		sandboxtool.CommandFile:         typed(fileCommand),
	}
}

// typed adapts a command taking its request type.
func typed[T any](run func(ctx context.Context, req *T, in io.Reader, out io.Writer) error) command {
	return command{
		args: func() any { return new(T) },
		run: func(ctx context.Context, args any, in io.Reader, out io.Writer) error {
			return run(ctx, args.(*T), in, out)
		},
	}
}

// Main runs the command args name and returns the exit code.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if filepath.Base(args[0]) == sandboxtool.AgentBinary {
		return agentMain(ctx, args[1:], stdin, stdout, stderr)
	}
	if len(args) < 2 {
		return report(stderr, fail(sandboxtool.ExitUsage, "usage: %s COMMAND (the request on stdin); %s ask|artifact ...", sandboxtool.Binary, sandboxtool.AgentBinary))
	}
	if args[1] == "agent" {
		return agentMain(ctx, args[2:], stdin, stdout, stderr)
	}
	if cmd, ok := argvCommands()[args[1]]; ok {
		return runArgv(ctx, cmd, args, stdin, stdout, stderr)
	}
	cmd, ok := commands()[args[1]]
	if !ok {
		return report(stderr, fail(sandboxtool.ExitUsage, "%s: no command %q", sandboxtool.Binary, args[1]))
	}
	in := bufio.NewReaderSize(stdin, 64<<10)
	var req any
	if cmd.args != nil {
		req = cmd.args()
		if err := sandboxtool.ReadRequest(in, req); err != nil {
			code := sandboxtool.ExitUsage
			if _, ok := errors.AsType[*sandboxtool.VersionError](err); ok {
				code = sandboxtool.ExitVersion
			}
			return report(stderr, &failure{code: code, err: err})
		}
	}
	out := bufio.NewWriterSize(stdout, 64<<10)
	err := cmd.run(ctx, req, in, out)
	if ferr := out.Flush(); err == nil && ferr != nil {
		err = ferr
	}
	return report(stderr, err)
}

// report writes err as the protocol's failure line and returns its code.
func report(stderr io.Writer, err error) int {
	if err == nil {
		return sandboxtool.ExitOK
	}
	code := sandboxtool.ExitFailed
	var f *failure
	if errors.As(err, &f) {
		code = f.code
	}
	b, _ := json.Marshal(sandboxtool.Failure{Error: err.Error()})
	fmt.Fprintf(stderr, "%s\n", b)
	return code
}

func writeJSON(out io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = out.Write(append(b, '\n'))
	return err
}

// gitEnv keeps git from writing the index as a side effect of reading,
// from prompting, and makes its messages stable.
var gitEnv = []string{"LC_ALL=C", "GIT_OPTIONAL_LOCKS=0", "GIT_TERMINAL_PROMPT=0"}

// repo runs git in a work tree.
type repo struct {
	dir string
}

// gitCmd is one git command line.
type gitCmd struct {
	args  []string
	env   []string
	stdin io.Reader
	// stdout receives the output as it comes (nil: collected and returned).
	stdout io.Writer
	// ok are exit codes that are not errors.
	ok []int
}

// run runs c and returns its output (unless streamed), its exit code and
// an error for an exit code not in c.ok (carrying the end of stderr).
func (r repo) run(ctx context.Context, c gitCmd) ([]byte, int, error) {
	cmd := exec.CommandContext(ctx, "git", c.args...)
	cmd.Dir = r.dir
	cmd.Env = append(append(os.Environ(), gitEnv...), c.env...)
	cmd.Stdin = c.stdin
	var out, errOut bytes.Buffer
	cmd.Stdout = &out
	if c.stdout != nil {
		cmd.Stdout = c.stdout
	}
	cmd.Stderr = &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := errors.AsType[*exec.ExitError](err); ok && ee.Exited() {
		code = ee.ExitCode()
		for _, k := range c.ok {
			if k == code {
				return out.Bytes(), code, nil
			}
		}
	}
	if err != nil {
		name := "git"
		if len(c.args) > 0 {
			name += " " + c.args[0]
		}
		return out.Bytes(), code, fmt.Errorf("%s: %w: %s", name, err, tail(errOut.String(), 2048))
	}
	return out.Bytes(), 0, nil
}

// git runs args and returns the output with surrounding space trimmed.
func (r repo) git(ctx context.Context, args ...string) (string, error) {
	out, _, err := r.run(ctx, gitCmd{args: args})
	return strings.TrimSpace(string(out)), err
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}

// splitNUL splits NUL-terminated records.
func splitNUL(b []byte) []string {
	var out []string
	for len(b) > 0 {
		rec, rest, _ := bytes.Cut(b, []byte{0})
		if len(rec) > 0 {
			out = append(out, string(rec))
		}
		b = rest
	}
	return out
}
