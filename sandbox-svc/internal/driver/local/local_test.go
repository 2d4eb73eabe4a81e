package local_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/drivertest"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
)

func newDriver(t *testing.T, gw local.Gateway) *local.Driver {
	t.Helper()
	return newDriverOpts(t, local.Options{Gateway: gw})
}

func newDriverOpts(t *testing.T, opts local.Options) *local.Driver {
	t.Helper()
	opts.Root = t.TempDir()
	d, err := local.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) driver.Driver { return newDriver(t, local.Gateway{}) })
}

func TestDestroyRemovesDirectory(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	d := newDriver(t, local.Gateway{})
	sb, err := d.Create(context.Background(), driver.Spec{ID: "x1", WorkKey: "sess", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(sb.Info().WorkDir)
	if dir != filepath.Join(d.Dir(), "sess") {
		t.Errorf("sandbox dir = %s", dir)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("sandbox dir after destroy: %v", err)
	}
}

// The gateway stays reachable from an egress-none sandbox through the
// relay, over TCP and over a unix socket, while other host ports are not.
func TestGatewayRelay(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "gateway:"+r.URL.Path) })

	tcpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "gw.sock")
	unixLn, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	for _, ln := range []net.Listener{tcpLn, unixLn} {
		srv := &http.Server{Handler: handler}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
	}
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()

	cases := []struct {
		name string
		gw   local.Gateway
	}{
		{"tcp", local.ParseGateway(tcpLn.Addr().String())},
		{"unix", local.Gateway{Listen: freeAddr, Target: "unix:" + sock}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriver(t, tc.gw)
			sb, err := d.Create(context.Background(), driver.Spec{ID: "relay-" + tc.name, Repository: repo, Egress: driver.EgressNone})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Destroy(context.Background())
			out, errOut, st := drivertest.Run1(t, sb, driver.ExecRequest{Argv: []string{"sh", "-c", `curl -sS -m 10 "http://$HANGAR_GATEWAY_ADDR/v1/messages"`}})
			if st.Code != 0 || out != "gateway:/v1/messages" {
				t.Errorf("through the relay: %q %q %+v", out, errOut, st)
			}
			_, _, st = drivertest.Run1(t, sb, driver.ExecRequest{Argv: []string{"curl", "-sS", "-m", "10", "http://" + other.Addr().String() + "/"}})
			if st.Code == 0 {
				t.Errorf("a non-gateway host port is reachable under egress none")
			}
		})
	}
}

func TestParseGateway(t *testing.T) {
	if g := local.ParseGateway("127.0.0.1:8080"); g.Listen != "127.0.0.1:8080" || g.Target != "127.0.0.1:8080" {
		t.Errorf("tcp: %+v", g)
	}
	if g := local.ParseGateway("unix:/run/gw.sock"); g.Listen != local.DefaultRelayListen || g.Target != "unix:/run/gw.sock" {
		t.Errorf("unix: %+v", g)
	}
}

// A sandbox process's environment is the fixed base, the spec's declared
// variables and the request's, and nothing of this process's, isolated or
// not.
func TestEnvironmentFromNothing(t *testing.T) {
	t.Setenv("HANGAR_ANTHROPIC_API_KEY", "sk-must-not-leak")
	t.Setenv("SOME_HOST_VAR", "must-not-leak")
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	for _, iso := range []local.Isolation{local.IsolationBwrap, local.IsolationNone} {
		d := newDriverOpts(t, local.Options{Isolation: iso})
		sb, err := d.Create(context.Background(), driver.Spec{ID: "env", Repository: repo, Env: map[string]string{"DECLARED": "1"}})
		if err != nil {
			t.Fatal(err)
		}
		out, _, st := drivertest.Run1(t, sb, driver.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"HANGAR_RUN_TOKEN": "rt"}})
		if st.Code != 0 {
			t.Fatalf("env: %+v", st)
		}
		var names []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			// bwrap sets PWD (to the working directory).
			if name, _, _ := strings.Cut(line, "="); name != "PWD" {
				names = append(names, name)
			}
		}
		sort.Strings(names)
		want := "DECLARED,GIT_TERMINAL_PROMPT,HANGAR_RUN_TOKEN,HANGAR_SANDBOX_ID,HANGAR_WORK_DIR,HOME,LANG,LOGNAME,PATH,SHELL,TMPDIR,USER"
		if got := strings.Join(names, ","); got != want {
			t.Errorf("isolation %d: environment %s, want %s", iso, got, want)
		}
		if strings.Contains(out, "must-not-leak") {
			t.Errorf("isolation %d: this process's environment leaked: %q", iso, out)
		}
		if err := sb.Destroy(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// Where bubblewrap cannot run, no sandbox is created unless isolation is
// turned off.
func TestIsolationUnavailable(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	gitPath, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	// A PATH with git and sh but no bwrap.
	bin := t.TempDir()
	for _, name := range []string{"git", "sh", "cat", "true"} {
		p, err := exec.LookPath(name)
		if err != nil {
			t.Fatal(err)
		}
		if name == "git" {
			p = gitPath
		}
		if err := os.Symlink(p, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin)
	d := newDriverOpts(t, local.Options{})
	if got := d.Isolation(); got != "unavailable" {
		t.Fatalf("Isolation() = %q, want unavailable", got)
	}
	if _, err := d.Create(context.Background(), driver.Spec{ID: "refused", Repository: repo}); !errors.Is(err, driver.ErrIsolationUnavailable) {
		t.Fatalf("Create without bwrap: %v, want ErrIsolationUnavailable", err)
	}
	open := newDriverOpts(t, local.Options{Isolation: local.IsolationNone})
	if got := open.Isolation(); got != "none" {
		t.Fatalf("Isolation() = %q, want none", got)
	}
	sb, err := open.Create(context.Background(), driver.Spec{ID: "unisolated", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
}

// The install directory of an npm-installed CLI is its prefix, whether the
// binary is named by its .bin link or found on PATH.
func TestInstallDirs(t *testing.T) {
	prefix := t.TempDir()
	pkg := filepath.Join(prefix, "node_modules", "@scope", "cli")
	if err := os.MkdirAll(filepath.Join(prefix, "node_modules", ".bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pkg, "cli.js"), []byte("#!/usr/bin/env node\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(prefix, "node_modules", ".bin", "agent")
	if err := os.Symlink("../@scope/cli/cli.js", link); err != nil {
		t.Fatal(err)
	}
	native := t.TempDir()
	if err := os.WriteFile(filepath.Join(native, "agent2"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	got := local.InstallDirs(native, link, "agent2", "not-installed", filepath.Join(prefix, "node_modules", ".bin"))
	want := []string{prefix, native}
	sort.Strings(want)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("InstallDirs = %v, want %v", got, want)
	}
}

// A sandbox that kills the process holding its namespaces (and with it all
// its processes) gets new ones with its next command.
func TestSandboxOutlivesItsHolder(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	d := newDriver(t, local.Gateway{})
	sb, err := d.Create(context.Background(), driver.Spec{ID: "holder", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	// The holder's cat is pid 2 (bwrap's init is 1).
	if out, _, _ := drivertest.Run1(t, sb, driver.ExecRequest{Argv: []string{"sh", "-c", "cat /proc/2/comm; kill -9 2"}}); out != "cat\n" {
		t.Fatalf("pid 2 is %q, want the holder's cat", out)
	}
	drivertest.WaitFor(t, 10*time.Second, "a command to run after the holder died", func() bool {
		out, _, st := drivertest.Run1(t, sb, driver.ExecRequest{Argv: []string{"cat", "a"}})
		return st.Code == 0 && out == "b"
	})
}

// A sandbox's command carries no parent-death signal. Joining the holder's
// pid namespace, bubblewrap starts it from an intermediate process that
// exits at once; with a parent-death SIGKILL set while that process was
// still its parent (bwrap --die-with-parent), a late exit of the
// intermediate (a loaded machine) killed the command just after it started:
// the soak's rare "killed by KILL". It ends with the sandbox all the same
// (TestDestroyRemovesDirectory, the conformance suite).
func TestSandboxCommandHasNoParentDeathSignal(t *testing.T) {
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skip("needs python3 to ask prctl(PR_GET_PDEATHSIG)")
	}
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	d := newDriverOpts(t, local.Options{Isolation: local.IsolationBwrap})
	sb, err := d.Create(context.Background(), driver.Spec{ID: "pdeath", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	const script = "import ctypes; s = ctypes.c_int(-1); ctypes.CDLL(None).prctl(2, ctypes.byref(s)); print(s.value)"
	out, errOut, st := drivertest.Run1(t, sb, driver.ExecRequest{Argv: []string{python, "-c", script}})
	if st.Code != 0 {
		t.Fatalf("python3: %+v %s", st, errOut)
	}
	if got := strings.TrimSpace(out); got != "0" {
		t.Errorf("the sandbox's command has parent-death signal %s, want none (0)", got)
	}
}
