// Package drivertest is the conformance suite every sandbox driver must
// pass: create, exec (stdin, stdout, exit codes, missing binaries, large
// streams, cancellation), files, terminals, egress none and destroy hooks.
package drivertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// Run runs the suite. newDriver returns a fresh driver for one subtest.
func Run(t *testing.T, newDriver func(t *testing.T) driver.Driver) {
	t.Helper()
	RunOptions(t, newDriver, Options{})
}

// Options adapt the suite to a driver whose sandboxes are not processes on
// this machine (pods).
type Options struct {
	// HostIP is where a sandbox with egress full reaches this machine
	// (the EgressNone subtest's server listens there); 127.0.0.1 when empty.
	HostIP string
	// Skip names subtests this driver's environment cannot run, with why
	// (the skip message).
	Skip map[string]string
}

// RunOptions runs the suite with opts.
func RunOptions(t *testing.T, newDriver func(t *testing.T) driver.Driver, opts Options) {
	t.Helper()
	hostIP := opts.HostIP
	if hostIP == "" {
		hostIP = "127.0.0.1"
	}
	run := func(name string, f func(t *testing.T)) {
		t.Helper()
		t.Run(name, func(t *testing.T) {
			if why, ok := opts.Skip[name]; ok {
				t.Skip(why)
			}
			f(t)
		})
	}
	repo, commit := NewRepo(t, map[string]string{"README.md": "hello sandbox\n", "src/main.go": "package main\n"})

	create := func(t *testing.T, d driver.Driver, mod func(*driver.Spec)) driver.Sandbox {
		t.Helper()
		spec := driver.Spec{ID: fmt.Sprintf("sb-%d", idSeq.Add(1)), Environment: "test", Repository: repo}
		if mod != nil {
			mod(&spec)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		sb, err := d.Create(ctx, spec)
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
		return sb
	}

	run("Create", func(t *testing.T) {
		d := newDriver(t)
		sb := create(t, d, func(s *driver.Spec) {
			s.Setup = []string{"echo built > setup.txt", "mkdir -p $HOME/.cfg && echo $PWD > $HOME/.cfg/pwd"}
			s.Env = map[string]string{"FROM_SPEC": "yes"}
		})
		info := sb.Info()
		if info.BaseCommit != commit {
			t.Errorf("BaseCommit = %q, want %q", info.BaseCommit, commit)
		}
		out, _, st := Run1(t, sb, driver.ExecRequest{Argv: []string{"sh", "-c", `cat README.md setup.txt; echo "$HOME|$PWD|$FROM_SPEC"; git rev-parse HEAD; cat $HOME/.cfg/pwd`}})
		want := fmt.Sprintf("hello sandbox\nbuilt\n%s|%s|yes\n%s\n%s\n", info.HomeDir, info.WorkDir, commit, info.WorkDir)
		if st.Code != 0 || out != want {
			t.Errorf("exec = %q (%+v), want %q", out, st, want)
		}
	})

	run("WorkKeyReproducible", func(t *testing.T) {
		d := newDriver(t)
		sb := create(t, d, func(s *driver.Spec) { s.WorkKey = "session-one" })
		first := sb.Info().WorkDir
		if !strings.HasSuffix(first, "/session-one/work") {
			t.Errorf("WorkDir = %q, want it to end in /session-one/work", first)
		}
		if _, err := d.Create(context.Background(), driver.Spec{ID: "other", WorkKey: "session-one", Repository: repo}); !errors.Is(err, driver.ErrInUse) {
			t.Errorf("second Create with a live work key: %v, want ErrInUse", err)
		}
		if err := sb.Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
		again := create(t, d, func(s *driver.Spec) { s.WorkKey = "session-one" })
		if again.Info().WorkDir != first {
			t.Errorf("WorkDir after re-create = %q, want %q", again.Info().WorkDir, first)
		}
		warm := create(t, d, nil)
		if err := warm.Relocate(context.Background(), "session-two"); err != nil {
			t.Fatalf("Relocate: %v", err)
		}
		if !strings.HasSuffix(warm.Info().WorkDir, "/session-two/work") {
			t.Errorf("relocated WorkDir = %q", warm.Info().WorkDir)
		}
		out, _, _ := Run1(t, warm, driver.ExecRequest{Argv: []string{"sh", "-c", "cat README.md; pwd"}})
		if out != "hello sandbox\n"+warm.Info().WorkDir+"\n" {
			t.Errorf("after relocate: %q", out)
		}
	})

	run("CreateBadRef", func(t *testing.T) {
		d := newDriver(t)
		_, err := d.Create(context.Background(), driver.Spec{ID: "bad-ref", Repository: repo, BaseRef: "no-such-branch"})
		if err == nil {
			t.Fatal("Create with a missing base ref succeeded")
		}
		_, err = d.Create(context.Background(), driver.Spec{ID: "bad-setup", Repository: repo, Setup: []string{"echo nope >&2; exit 4"}})
		if err == nil || !strings.Contains(err.Error(), "nope") {
			t.Fatalf("Create with failing setup: %v, want the setup's stderr", err)
		}
	})

	run("Exec", func(t *testing.T) {
		d := newDriver(t)
		sb := create(t, d, nil)
		out, _, st := Run1(t, sb, driver.ExecRequest{Argv: []string{"cat"}, Stdin: strings.NewReader("from stdin")})
		if out != "from stdin" || st.Code != 0 {
			t.Errorf("cat = %q %+v", out, st)
		}
		out, errOut, st := Run1(t, sb, driver.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
		if out != "out\n" || errOut != "err\n" || st.Code != 3 {
			t.Errorf("got %q %q %+v", out, errOut, st)
		}
		if !isRemote(sb) {
			if err := os.MkdirAll(filepath.Join(sb.Info().WorkDir, "src"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		out, _, _ = Run1(t, sb, driver.ExecRequest{Argv: []string{"sh", "-c", "pwd; echo $X"}, Dir: "src", Env: map[string]string{"X": "y"}})
		if out != sb.Info().WorkDir+"/src\ny\n" {
			t.Errorf("cwd/env: %q", out)
		}
		if _, err := sb.Exec(context.Background(), driver.ExecRequest{Argv: []string{"true"}, Dir: "../../.."}); !errors.Is(err, driver.ErrOutsideSandbox) {
			t.Errorf("cwd outside: %v", err)
		}
	})

	run("MissingBinary", func(t *testing.T) {
		d := newDriver(t)
		sb := create(t, d, nil)
		_, errOut, st := Run1(t, sb, driver.ExecRequest{Argv: []string{"no-such-binary-xyz", "arg"}})
		if st.Code != 127 || !strings.Contains(errOut, "no-such-binary-xyz") {
			t.Errorf("missing binary: code %d stderr %q", st.Code, errOut)
		}
	})

	run("LargeStream", func(t *testing.T) {
		d := newDriver(t)
		sb := create(t, d, nil)
		const size = 300 << 20
		var before runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		cw := &countingWriter{}
		// stdin in and stdout out at once: cat must not deadlock and
		// nothing may be held in memory.
		_, st := RunWith(t, sb, driver.ExecRequest{Argv: []string{"cat"}, Stdin: io.LimitReader(zeroReader{}, size), Stdout: cw})
		if st.Code != 0 || cw.n.Load() != size {
			t.Fatalf("cat %d bytes: got %d, %+v", size, cw.n.Load(), st)
		}
		if max := cw.max.Load(); max > 64<<10 {
			t.Errorf("largest write %d bytes, want chunks of at most 64 KiB", max)
		}
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 32<<20 {
			t.Errorf("heap grew by %d MB streaming %d MB", grew>>20, size>>20)
		}
	})

	run("Cancel", func(t *testing.T) {
		d := newDriver(t)
		sb := create(t, d, nil)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		pr, pw := io.Pipe()
		p, err := sb.Exec(ctx, driver.ExecRequest{Argv: []string{"sh", "-c", "sleep 1000 & echo $!; wait"}, Stdout: pw})
		if err != nil {
			t.Fatal(err)
		}
		line, err := readLine(pr)
		if err != nil {
			t.Fatal(err)
		}
		go func() { _, _ = io.Copy(io.Discard, pr) }()
		child := strings.TrimSpace(line)
		cancel()
		st, _ := p.Wait()
		pw.Close()
		if st.Signal != "KILL" {
			t.Errorf("cancelled exec: %+v, want signal KILL", st)
		}
		WaitFor(t, 10*time.Second, "child sleep to be gone", func() bool {
			out, _, _ := Run1(t, sb, driver.ExecRequest{Argv: []string{"sh", "-c", "cat /proc/" + child + "/stat 2>/dev/null | awk '{print $3}'"}})
			return out == "" || strings.TrimSpace(out) == "Z"
		})

		p, err = sb.Exec(context.Background(), driver.ExecRequest{Argv: []string{"sleep", "1000"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if st, _ := p.Wait(); st.Signal != "TERM" {
			t.Errorf("signalled exec: %+v, want TERM", st)
		}
	})

	run("KillProcesses", func(t *testing.T) {
		d := newDriver(t)
		sb := create(t, d, nil)
		killer, ok := sb.(driver.ProcessKiller)
		if !ok {
			t.Skip("the driver cannot end a sandbox's processes")
		}
		// A detached writer (its own session, as the agent CLIs start
		// their tool shells) outlives the exec that started it.
		out, _, st := Run1(t, sb, driver.ExecRequest{Argv: []string{"sh", "-c",
			"setsid sh -c 'while :; do date +%s%N >> ticks; sleep 0.01; done' >/dev/null 2>&1 < /dev/null & echo $!"}})
		if st.Code != 0 {
			t.Fatalf("start the writer: %+v", st)
		}
		writer := strings.TrimSpace(out)
		// Found by its command line, not its pid: under a pid namespace a
		// later command may see another process at that number. The
		// pattern is split so the search does not find itself.
		alive := func() bool {
			out, _, _ := Run1(t, sb, driver.ExecRequest{Argv: []string{"sh", "-c",
				`for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null | grep -q ">> tick""s" && echo $p; done; true`}})
			return strings.TrimSpace(out) != ""
		}
		WaitFor(t, 10*time.Second, "the detached writer to run", alive)
		if err := killer.KillProcesses(context.Background()); err != nil {
			t.Fatalf("KillProcesses: %v", err)
		}
		if alive() {
			t.Errorf("the detached writer %s still runs after KillProcesses", writer)
		}
		// The sandbox is still usable.
		if out, _, st := Run1(t, sb, driver.ExecRequest{Argv: []string{"echo", "still here"}}); st.Code != 0 || out != "still here\n" {
			t.Errorf("exec after KillProcesses: %q %+v", out, st)
		}
	})

	run("Files", func(t *testing.T) {
		d := newDriver(t)
		sb := create(t, d, nil)
		ctx := context.Background()
		fi, err := sb.WriteFile(ctx, "dir/new.txt", []byte("content"), 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Path != "dir/new.txt" || fi.Size != 7 || fi.Mode.Perm() != 0o600 {
			t.Errorf("WriteFile info = %+v", fi)
		}
		data, _, err := sb.ReadFile(ctx, "dir/new.txt", 1<<20)
		if err != nil || string(data) != "content" {
			t.Errorf("ReadFile = %q, %v", data, err)
		}
		if _, _, err := sb.ReadFile(ctx, "dir/new.txt", 3); !errors.Is(err, driver.ErrTooLarge) {
			t.Errorf("ReadFile over limit: %v", err)
		}
		list, err := sb.List(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, f := range list {
			names = append(names, f.Path)
		}
		if got := strings.Join(names, ","); got != ".git,README.md,dir,src" {
			t.Errorf("List = %s", got)
		}
		if _, err := sb.Stat(ctx, "missing"); !errors.Is(err, driver.ErrFileNotFound) {
			t.Errorf("Stat missing: %v", err)
		}
		if _, err := sb.WriteFile(ctx, filepath.Join(sb.Info().HomeDir, ".rc"), []byte("x"), 0); err != nil {
			t.Errorf("write into HOME: %v", err)
		}
		Run1(t, sb, driver.ExecRequest{Argv: []string{"ln", "-s", "/etc", "etc-link"}})
		Run1(t, sb, driver.ExecRequest{Argv: []string{"ln", "-s", "README.md", "readme-link"}})
		st, err := sb.Stat(ctx, "etc-link")
		if err != nil || st.LinkTarget != "/etc" || st.Mode&os.ModeSymlink == 0 {
			t.Errorf("Stat symlink = %+v, %v", st, err)
		}
		if data, _, err := sb.ReadFile(ctx, "readme-link", 1<<20); err != nil || string(data) != "hello sandbox\n" {
			t.Errorf("read through an inside symlink: %q %v", data, err)
		}
		for _, p := range []string{"../../../../etc/passwd", "/etc/passwd", "etc-link/passwd", "../../x"} {
			if _, _, err := sb.ReadFile(ctx, p, 1<<20); !errors.Is(err, driver.ErrOutsideSandbox) {
				t.Errorf("ReadFile(%q) = %v, want ErrOutsideSandbox", p, err)
			}
		}
		for _, p := range []string{"etc-link/evil", "../../evil"} {
			if _, err := sb.WriteFile(ctx, p, []byte("x"), 0); !errors.Is(err, driver.ErrOutsideSandbox) {
				t.Errorf("WriteFile(%q) = %v, want ErrOutsideSandbox", p, err)
			}
		}
	})

	run("Terminal", func(t *testing.T) {
		d := newDriver(t)
		sb := create(t, d, nil)
		term, err := sb.Terminal(context.Background(), driver.TerminalRequest{Argv: []string{"sh"}, Rows: 24, Cols: 80})
		if err != nil {
			t.Fatal(err)
		}
		defer term.Kill()
		out := &syncBuffer{}
		go func() { _, _ = io.Copy(out, term) }()
		if _, err := io.WriteString(term, "echo hi-$((40+2))\n"); err != nil {
			t.Fatal(err)
		}
		WaitFor(t, 10*time.Second, "echo through the pty", func() bool { return strings.Contains(out.String(), "hi-42") })
		if err := term.Resize(40, 100); err != nil {
			t.Fatal(err)
		}
		// A resize reaches the pty on its own (through the API server, a
		// message beside the stream's data): ask again until it is seen.
		var asked time.Time
		WaitFor(t, 10*time.Second, "new size", func() bool {
			if strings.Contains(out.String(), "40 100") {
				return true
			}
			if time.Since(asked) > 500*time.Millisecond {
				io.WriteString(term, "stty size\n")
				asked = time.Now()
			}
			return false
		})
		io.WriteString(term, "exit 5\n")
		st, _ := term.Wait()
		if st.Code != 5 {
			t.Errorf("terminal exit = %+v, want 5", st)
		}
	})

	run("EgressNone", func(t *testing.T) {
		d := newDriver(t)
		host, err := net.Listen("tcp", net.JoinHostPort(hostIP, "0"))
		if err != nil {
			t.Fatal(err)
		}
		defer host.Close()
		go func() {
			for {
				c, err := host.Accept()
				if err != nil {
					return
				}
				io.WriteString(c, "host\n")
				c.Close()
			}
		}()
		hostPort := strconv.Itoa(host.Addr().(*net.TCPAddr).Port)
		probe := `exec 3<>/dev/tcp/` + hostIP + `/` + hostPort + ` && head -1 <&3`

		full := create(t, d, nil)
		if out, _, st := Run1(t, full, driver.ExecRequest{Argv: []string{"bash", "-c", probe}}); st.Code != 0 || out != "host\n" {
			t.Fatalf("egress full cannot reach the host's loopback: %q %+v", out, st)
		}

		sb := create(t, d, func(s *driver.Spec) { s.Egress = driver.EgressNone })
		for _, argv := range [][]string{
			{"curl", "-sS", "-m", "20", "http://10.255.255.1/"},
			{"git", "ls-remote", "http://10.255.255.1/repo.git"},
			{"bash", "-c", probe},
		} {
			start := time.Now()
			_, errOut, st := Run1(t, sb, driver.ExecRequest{Argv: argv})
			if st.Code == 0 {
				t.Errorf("%v succeeded under egress none", argv)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("%v took %v to fail, want fast (%s)", argv, el, errOut)
			}
		}
		if _, err := exec.LookPath("python3"); err != nil {
			t.Skip("python3 needed for the loopback server check")
		}
		pr, pw := io.Pipe()
		srv, err := sb.Exec(context.Background(), driver.ExecRequest{
			Argv: []string{"python3", "-c", `import socket
s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen()
print(s.getsockname()[1], flush=True)
c,_=s.accept(); c.sendall(b"pong"); c.close()`}, Stdout: pw})
		if err != nil {
			t.Fatal(err)
		}
		port, err := readLine(pr)
		if err != nil {
			t.Fatal(err)
		}
		out, _, st := Run1(t, sb, driver.ExecRequest{Argv: []string{"bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/" + strings.TrimSpace(port) + " && cat <&3"}})
		if out != "pong" || st.Code != 0 {
			t.Errorf("loopback server inside the sandbox: %q %+v", out, st)
		}
		srv.Wait()
		pw.Close()
	})

	run("DestroyHooks", func(t *testing.T) {
		d := newDriver(t)
		sb := create(t, d, nil)
		bg, err := sb.Exec(context.Background(), driver.ExecRequest{Argv: []string{"sleep", "1000"}})
		if err != nil {
			t.Fatal(err)
		}
		var order []string
		hook := func(name string) driver.DestroyHook {
			return func(ctx context.Context, s driver.Sandbox) error {
				out, _, _ := Run1(t, s, driver.ExecRequest{Argv: []string{"cat", "README.md"}})
				order = append(order, name+":"+out)
				return nil
			}
		}
		failing := func(ctx context.Context, s driver.Sandbox) error {
			order = append(order, "failing")
			return errors.New("hook failed")
		}
		err = sb.Destroy(context.Background(), hook("first"), failing, hook("last"))
		if err == nil || !strings.Contains(err.Error(), "hook failed") {
			t.Errorf("Destroy error = %v, want the hook's", err)
		}
		want := "first:hello sandbox\n|failing|last:hello sandbox\n"
		if got := strings.Join(order, "|"); got != want {
			t.Errorf("hook order = %q, want %q", got, want)
		}
		if st, _ := bg.Wait(); st.Signal != "KILL" {
			t.Errorf("background process after destroy: %+v", st)
		}
		if _, err := sb.Exec(context.Background(), driver.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, driver.ErrDestroyed) {
			t.Errorf("exec after destroy: %v", err)
		}
		if err := sb.Destroy(context.Background()); err != nil {
			t.Errorf("second Destroy: %v", err)
		}
	})
}

var idSeq atomic.Int64

func isRemote(sb driver.Sandbox) bool {
	_, err := os.Stat(sb.Info().WorkDir)
	return err != nil
}

// NewRepo makes a git repository with files committed on main and returns
// its path and the commit.
func NewRepo(t testing.TB, files map[string]string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	gitRun(t, dir, "init", "-q", "-b", "main")
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gitRun(t, dir, "add", "-A")
	gitRun(t, dir, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "init")
	return dir, strings.TrimSpace(gitRun(t, dir, "rev-parse", "HEAD"))
}

func gitRun(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// Run1 runs a command to completion and returns its output.
func Run1(t testing.TB, sb driver.Sandbox, req driver.ExecRequest) (string, string, driver.ExitStatus) {
	t.Helper()
	var out, errOut syncBuffer
	req.Stdout, req.Stderr = &out, &errOut
	_, st := RunWith(t, sb, req)
	return out.String(), errOut.String(), st
}

// RunWith runs req as given and waits for it.
func RunWith(t testing.TB, sb driver.Sandbox, req driver.ExecRequest) (driver.Process, driver.ExitStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := sb.Exec(ctx, req)
	if err != nil {
		t.Fatalf("Exec %v: %v", req.Argv, err)
	}
	st, err := p.Wait()
	if err != nil {
		t.Fatalf("Wait %v: %v", req.Argv, err)
	}
	return p, st
}

// WaitFor polls cond until it holds or the deadline passes.
func WaitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		runtime.Gosched()
		<-time.After(5 * time.Millisecond)
	}
}

func readLine(r io.Reader) (string, error) {
	var b []byte
	one := make([]byte, 1)
	for {
		n, err := r.Read(one)
		if n == 1 {
			if one[0] == '\n' {
				return string(b), nil
			}
			b = append(b, one[0])
		}
		if err != nil {
			return string(b), err
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// countingWriter counts bytes and keeps nothing.
type countingWriter struct{ n, max atomic.Int64 }

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	for {
		m := c.max.Load()
		if int64(len(p)) <= m || c.max.CompareAndSwap(m, int64(len(p))) {
			break
		}
	}
	return len(p), nil
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// MountPoint says whether p is a mount point in this process's namespace.
func MountPoint(t testing.TB, p string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == p {
			return true
		}
	}
	return false
}
