package kubernetes

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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
