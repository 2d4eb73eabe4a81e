package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/api/sandboxtool/tooltest"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/drivertest"
	"github.com/hangar-dev/hangar/sandbox-svc/kubetest"
)

const realNode = "real-node"

var (
	nodeOnce sync.Once
	nodeErr  error
)

// needNode starts (once) a real node: kubelet, containerd, runc and the
// bridge CNI plugin, with the sandbox image imported.
func needNode(t testing.TB) *kubetest.Cluster {
	t.Helper()
	c := needCluster(t)
	if skip := kubetest.NodeSkip(assetsDir); skip != "" {
		t.Skip(skip)
	}
	nodeOnce.Do(func() { nodeErr = c.StartNode(context.Background(), assetsDir, realNode) })
	if nodeErr != nil {
		t.Fatalf("real node: %v\nkubelet log tail:\n%s", nodeErr, tail(c.Log("kubelet-"+realNode), 4000))
	}
	return c
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// realNodeOpts places pods on the real node with the imported image.
func realNodeOpts(o *Options) {
	image := os.Getenv(kubetest.ImageEnv)
	o.NodeName, o.Image, o.ToolImage, o.ReadyTimeout = realNode, image, image, 3*time.Minute
	o.Gateway = "10.244.0.1:7404"
	o.DeleteGrace = 5 * time.Second
}

func realNodeDriver(t testing.TB, c *kubetest.Cluster, ns string) *Driver {
	return newDriver(t, c, ns, realNodeOpts)
}

// TestConformanceOnRealNode runs the driver suite on pods of a real
// kubelet: exec, files and terminals through the API server.
func TestConformanceOnRealNode(t *testing.T) {
	c := needNode(t)
	ns := newNamespace(t, c)
	drivertest.RunOptions(t, func(t *testing.T) driver.Driver { return realNodeDriver(t, c, ns) }, drivertest.Options{
		// The pods' bridge reaches this machine at its gateway address.
		HostIP: "10.244.0.1",
		Skip: map[string]string{
			"EgressNone": "the bridge CNI plugin here does not enforce NetworkPolicies (the policy itself is tested in TestEgressNoneNetworkPolicy)",
		},
	})
}

// TestBadImageOnRealNode: the kubelet's own pull failure of an image no
// registry serves (none is reachable here, and the image was not
// imported): Create fails with ErrPodFailed carrying the kubelet's reason
// and its Warning event, and the pod is deleted.
func TestBadImageOnRealNode(t *testing.T) {
	c := needNode(t)
	ns := newNamespace(t, c)
	d := realNodeDriver(t, c, ns)
	_, err := d.Create(context.Background(), driver.Spec{ID: "sb-pull", Environment: "broken", Image: unpullable, Repository: "/nowhere"})
	if !errors.Is(err, ErrPodFailed) || !strings.Contains(err.Error(), unpullable) ||
		!(strings.Contains(err.Error(), "ErrImagePull") || strings.Contains(err.Error(), "ImagePullBackOff")) ||
		!eventsInclude(err.Error(), "Failed: Failed to pull image") {
		t.Fatalf("Create with an unpullable image: %v, want ErrPodFailed with the kubelet's pull error and its event", err)
	}
	t.Logf("error: %v", err)
	waitFor(t, time.Minute, "the failed pod to be deleted", func() bool { _, ok := getPod(t, d, podName("sb-pull")); return !ok })
	assertNothingLive(t, d)
}

// eventsInclude: the "events: " part of a start failure names want (other
// Warning events, such as the kubelet's MissingClusterDNS on a node
// without cluster DNS, may come before it).
func eventsInclude(msg, want string) bool {
	_, events, ok := strings.Cut(msg, "events: ")
	return ok && strings.Contains(events, want)
}

// TestNeverReadyOnRealNode: a pod the kubelet never gets ready (its
// image's registry accepts the connection and never answers, so the pull
// hangs): Create fails with ErrPodFailed after the ready timeout, saying
// what the pod was doing (its last event: the pull), and the pod is
// deleted; the work key is free again.
func TestNeverReadyOnRealNode(t *testing.T) {
	c := needNode(t)
	ns := newNamespace(t, c)
	// containerd (on this machine's network) pulls from here.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, conn)
			mu.Unlock()
		}
	}()
	stuck := l.Addr().String() + "/hangar/stuck:1"
	d := newDriver(t, c, ns, func(o *Options) { realNodeOpts(o); o.ReadyTimeout = 30 * time.Second })
	_, err = d.Create(context.Background(), driver.Spec{ID: "sb-never", WorkKey: "session-never", Environment: "stuck", Image: stuck, Repository: "/nowhere"})
	if !errors.Is(err, ErrPodFailed) || !strings.Contains(err.Error(), "not ready within 30s") || !strings.Contains(err.Error(), `last event: Pulling: Pulling image "`+stuck+`"`) {
		t.Fatalf("Create of a pod whose pull hangs: %v, want ErrPodFailed, not ready, with the pull as its last event", err)
	}
	t.Logf("error: %v", err)
	waitFor(t, time.Minute, "the unready pod to be deleted", func() bool { _, ok := getPod(t, d, podName("sb-never")); return !ok })
	assertNothingLive(t, d)
}

// TestAPIServerGoesAwayOnRealNode: with a sandbox running on the real
// node, the API server becomes unreachable (its only route, a forwarder,
// closed): an exec in the running pod and a new Create fail with
// ErrBackendUnavailable naming the API server, and the failed Create
// leaves nothing behind, there or in the cluster once it is back.
func TestAPIServerGoesAwayOnRealNode(t *testing.T) {
	c := needNode(t)
	ns := newNamespace(t, c)
	fw := forward(t, strings.TrimPrefix(c.Host(), "https://"))
	addr := fw.Addr().String()
	cfg := rest.CopyConfig(c.Config)
	cfg.Host, cfg.Timeout = "https://"+addr, 10*time.Second
	d := newDriver(t, c, ns, func(o *Options) { realNodeOpts(o); o.Config = cfg })
	repo, _ := drivertest.NewRepo(t, map[string]string{"README.md": "hi\n"})
	sb, err := d.Create(context.Background(), driver.Spec{ID: "sb-up", WorkKey: "session-up", Environment: "e", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	fw.Close()
	p, err := sb.Exec(context.Background(), driver.ExecRequest{Argv: []string{"true"}})
	if err == nil {
		_, err = p.Wait()
	}
	if !errors.Is(err, driver.ErrBackendUnavailable) || !strings.Contains(err.Error(), cfg.Host) {
		t.Errorf("exec with the API server gone: %v, want ErrBackendUnavailable naming %s", err, cfg.Host)
	}
	_, err = d.Create(context.Background(), driver.Spec{ID: "sb-down", WorkKey: "session-down", Environment: "e", Repository: repo})
	if !errors.Is(err, driver.ErrBackendUnavailable) || !strings.Contains(err.Error(), cfg.Host) {
		t.Fatalf("Create with the API server gone: %v, want ErrBackendUnavailable naming %s", err, cfg.Host)
	}
	d.mu.Lock()
	_, keyLeft := d.keys["session-down"]
	_, podLeft := d.live[podName("sb-down")]
	d.mu.Unlock()
	if keyLeft || podLeft {
		t.Errorf("the failed create left its work key (%v) or its sandbox (%v)", keyLeft, podLeft)
	}
	// The API server back on the same address: the pod that was running
	// still is and answers, and the failed create made no pod.
	back := forwardOn(t, addr, strings.TrimPrefix(c.Host(), "https://"))
	defer back.Close()
	if _, ok := getPod(t, d, podName("sb-down")); ok {
		t.Error("the create that failed left a pod")
	}
	out, _, code, err := sb.(*Sandbox).run1(context.Background(), []string{"cat", "README.md"}, nil, sb.Info().WorkDir)
	if err != nil || code != 0 || out != "hi\n" {
		t.Errorf("the running sandbox after the API server came back: %q %d %v", out, code, err)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	assertNothingLive(t, d)
}

func assertNothingLive(t *testing.T, d *Driver) {
	t.Helper()
	d.mu.Lock()
	live, keys := len(d.live), len(d.keys)
	d.mu.Unlock()
	if live != 0 || keys != 0 {
		t.Errorf("%d live sandboxes, %d work keys left", live, keys)
	}
}

// TestGitOnlyImageOnRealNode runs a sandbox on an image holding nothing
// but git and hangar-sandbox (no shell, no coreutils): the clone, execs,
// signals, files, a terminal, the tool's own commands and KillProcesses
// all work, because the driver's steps in the pod are the tool's.
func TestGitOnlyImageOnRealNode(t *testing.T) {
	c := needNode(t)
	archive, image, err := kubetest.GitOnlyImage(t.TempDir(), tooltest.Path(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := c.ImportImage(ctx, archive); err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, c)
	d := newDriver(t, c, ns, func(o *Options) {
		realNodeOpts(o)
		o.Image, o.ToolImage, o.ToolPath = image, image, "/usr/local/bin/hangar-sandbox"
	})
	repo, commit := drivertest.NewRepo(t, map[string]string{"README.md": "hello git-only\n"})
	sb, err := d.Create(ctx, driver.Spec{ID: "sb-git-only", Environment: "git-only", Repository: repo})
	if err != nil {
		t.Fatalf("Create on a git-only image: %v", err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	if got := sb.Info().BaseCommit; got != commit {
		t.Errorf("base commit %q, want %q", got, commit)
	}
	if sb.Info().ToolVersion != sandboxtool.Version {
		t.Errorf("tool version %d", sb.Info().ToolVersion)
	}
	if _, _, st := drivertest.Run1(t, sb, driver.ExecRequest{Argv: []string{"sh", "-c", "true"}}); st.Code != 127 {
		t.Errorf("sh on a git-only image: exit %d, want 127 (the image has a shell?)", st.Code)
	}
	out, errOut, st := drivertest.Run1(t, sb, driver.ExecRequest{Argv: []string{"git", "log", "--format=%H", "-1"}})
	if st.Code != 0 || strings.TrimSpace(out) != commit {
		t.Fatalf("git log: %d %q %q", st.Code, out, errOut)
	}
	if _, err := sb.WriteFile(ctx, "dir/new.txt", []byte("written\n"), 0o600); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	data, fi, err := sb.ReadFile(ctx, "dir/new.txt", 1<<20)
	if err != nil || string(data) != "written\n" || fi.Mode.Perm() != 0o600 {
		t.Errorf("ReadFile: %q %+v %v", data, fi, err)
	}
	list, err := sb.List(ctx, ".")
	if err != nil || len(list) < 3 {
		t.Errorf("List: %+v %v", list, err)
	}
	if _, err := sb.Stat(ctx, "../../../etc/passwd"); err == nil {
		t.Error("Stat outside the sandbox answered")
	}
	// The tool's protocol commands, as checkpoint-svc runs them.
	line, _ := sandboxtool.Request(sandboxtool.TreeHashRequest{WorkDir: sb.Info().WorkDir})
	out, errOut, st = drivertest.Run1(t, sb, driver.ExecRequest{Argv: sandboxtool.Argv(sandboxtool.CommandTreeHash), Stdin: bytes.NewReader(line)})
	if st.Code != 0 || !strings.Contains(out, `"tree"`) {
		t.Errorf("tree-hash: %d %q %q", st.Code, out, errOut)
	}
	// A command that waits on its stdin, ended by a signal.
	pr, pw := io.Pipe()
	defer pw.Close()
	var sink bytes.Buffer
	p, err := sb.Exec(ctx, driver.ExecRequest{Argv: []string{"git", "cat-file", "--batch"}, Stdin: pr, Stdout: &sink})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if st, err := p.Wait(); err != nil || st.Signal != "TERM" {
		t.Errorf("after TERM: %+v %v", st, err)
	}
	term, err := sb.Terminal(ctx, driver.TerminalRequest{Argv: []string{"git", "--version"}, Rows: 24, Cols: 80})
	if err != nil {
		t.Fatalf("Terminal: %v", err)
	}
	got, _ := io.ReadAll(term)
	if !strings.Contains(string(got), "git version") {
		t.Errorf("terminal said %q", got)
	}
	if st, err := term.Wait(); err != nil || st.Code != 0 {
		t.Errorf("terminal ended %+v %v", st, err)
	}
	if err := sb.(driver.ProcessKiller).KillProcesses(ctx); err != nil {
		t.Errorf("KillProcesses: %v", err)
	}
	if _, _, st := drivertest.Run1(t, sb, driver.ExecRequest{Argv: []string{"git", "status", "--short"}}); st.Code != 0 {
		t.Errorf("exec after KillProcesses: %+v", st)
	}
}
