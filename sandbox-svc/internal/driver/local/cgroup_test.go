package local

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/drivertest"
)

// A process that left its process group (setsid, as the agent CLIs start
// their tool shells) dies with its sandbox where cgroups can be made.
func TestDestroyKillsEscapedProcesses(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	d, err := New(Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.cgroups == nil {
		t.Skip("no cgroup v2 this process may write: teardown kills process groups only")
	}
	ctx := context.Background()
	sb, err := d.Create(ctx, driver.Spec{ID: "sb-esc", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	// In the work tree: the sandbox sees nothing else of the host's.
	pidFile := filepath.Join(sb.Info().WorkDir, "pid")
	var stderr bytes.Buffer
	p, err := sb.Exec(ctx, driver.ExecRequest{Argv: []string{"sh", "-c",
		`setsid sh -c 'echo $$ > "$1"; while :; do sleep 0.05; done' sh "$1" </dev/null >/dev/null 2>&1 &`, "sh", pidFile}, Stderr: &stderr})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := p.Wait(); err != nil || st.Code != 0 {
		t.Fatalf("start the loop: %v %v %s", st, err, stderr.String())
	}
	pid := 0
	waitUntil(t, "the escaped shell's pid", func() bool {
		b, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	// The pid it wrote is its own pid namespace's.
	pid = hostPid(t, sb.(*Sandbox).cg.dir, pid)
	if !alive(pid) {
		t.Fatalf("the escaped shell %d is not running", pid)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	// Gone, or a zombie waiting for init to reap it.
	waitUntil(t, "the escaped shell to die", func() bool { return !alive(pid) })
}

// hostPid returns the pid, in this process's pid namespace, of the
// process in cgroup dir whose pid in its own namespace is nspid (itself
// without isolation).
func hostPid(t *testing.T, dir string, nspid int) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(b)) {
		status, err := os.ReadFile("/proc/" + f + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if ids, ok := strings.CutPrefix(line, "NSpid:"); ok {
				fs := strings.Fields(ids)
				if len(fs) > 0 && fs[len(fs)-1] == strconv.Itoa(nspid) {
					pid, _ := strconv.Atoi(f)
					return pid
				}
			}
		}
	}
	t.Fatalf("no process of pid %d in %s", nspid, dir)
	return 0
}

// alive says whether pid runs (exists and is not a zombie).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// A driver on the sandboxes directory of a process that crashed with a
// sandbox up kills what runs in it.
func TestRestartKillsLeftoverProcesses(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	root := t.TempDir()
	crashed, err := New(Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if crashed.cgroups == nil {
		crashed.Close()
		t.Skip("no cgroup v2 this process may write")
	}
	ctx := context.Background()
	sb, err := crashed.Create(ctx, driver.Spec{ID: "sb-left", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	p, err := sb.Exec(ctx, driver.ExecRequest{Argv: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	pid := p.(*process).cmd.Process.Pid
	crashed.Close()
	d, err := New(Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if st, err := p.Wait(); err != nil || st.Signal == "" {
		t.Errorf("the leftover's process: %+v %v, want killed", st, err)
	}
	if alive(pid) {
		t.Errorf("the leftover's process %d runs on", pid)
	}
}

// A group id the sandbox tracked that names another process's group by the
// time the sandbox goes (its members ended and the id was reused; pid_max
// is 32768 on some machines) is not killed, nor is the group of a holder
// that ended already: where the sandbox has a cgroup, only what is in it
// dies.
func TestTeardownSparesReusedGroupIDs(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	d, err := New(Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.cgroups == nil {
		t.Skip("no cgroup v2 this process may write: teardown kills process groups by id")
	}
	ctx := context.Background()
	sbi, err := d.Create(ctx, driver.Spec{ID: "sb-reuse", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	sb := sbi.(*Sandbox)
	p, err := sb.Exec(ctx, driver.ExecRequest{Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	// Another process's group, outside the sandbox, under ids the sandbox
	// holds as stale: a tracked group, and an ended holder's.
	other := exec.Command("sleep", "60")
	other.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	sb.trackGroup(other.Process.Pid)
	sb.stopHolder()
	ended := &holder{stdin: devNullFile(t), pgid: other.Process.Pid, done: make(chan struct{})}
	close(ended.done)
	sb.holdMu.Lock()
	sb.hold = ended
	sb.holdMu.Unlock()
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(other.Process.Pid) + "/stat"); err != nil || bytes.Contains(b, []byte(") Z ")) {
		t.Fatalf("a process group outside the sandbox was killed with it: %s %v", b, err)
	}
}

func devNullFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
