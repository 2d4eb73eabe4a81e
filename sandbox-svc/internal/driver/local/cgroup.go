package local

// A process leaves its process group with setsid (the agent CLIs start
// their tool shells detached), so killing a sandbox's process groups does
// not reach everything it started: a shell waiting for a file would loop
// on after its sandbox is gone. Where this process can make cgroups (cgroup
// v2: root, or a delegated subtree), each sandbox's processes are started
// in a cgroup of their own (clone3 into it, so none runs a moment outside)
// and teardown kills the cgroup (cgroup.kill): every process started in
// the sandbox and everything they started, whatever session they moved
// to. Elsewhere teardown kills the process groups only.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupTree is the driver's cgroup, holding one per sandbox.
type cgroupTree struct{ dir string }

// newCgroupTree makes the driver's cgroup under this process's own in the
// cgroup v2 hierarchy, named after its sandboxes directory; nil when there
// is none it may write. What an earlier process on that directory left in
// it (it crashed with sandboxes up) is killed: no one can reach those
// processes through this service any more.
func newCgroupTree(sandboxes string) *cgroupTree {
	all, err := mounts()
	if err != nil {
		return nil
	}
	mnt := ""
	for _, m := range all {
		if m.fstype == "cgroup2" {
			mnt = m.point
			break
		}
	}
	if mnt == "" {
		return nil
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	rel := ""
	for _, line := range strings.Split(string(own), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			rel = p
		}
	}
	if rel == "" {
		return nil
	}
	sum := sha256.Sum256([]byte(sandboxes))
	dir := filepath.Join(mnt, rel, "hangar-"+hex.EncodeToString(sum[:6]))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		_ = os.Remove(dir)
		return nil
	}
	if left, err := os.ReadDir(dir); err == nil {
		for _, ent := range left {
			if ent.IsDir() {
				_ = (&cgroup{dir: filepath.Join(dir, ent.Name()), fd: -1}).kill()
			}
		}
	}
	t := &cgroupTree{dir: dir}
	if !t.canStartIn() {
		t.close()
		return nil
	}
	return t
}

// canStartIn says whether a process can be started in a cgroup of t
// (clone3 may be refused, e.g. by a seccomp filter): a sandbox whose
// commands could not start would be worse than one without a cgroup.
func (t *cgroupTree) canStartIn() bool {
	cg, err := t.open("probe")
	if err != nil {
		return false
	}
	defer cg.kill()
	self, err := os.Executable()
	if err != nil {
		return false
	}
	// This binary, asked for nothing it can parse, exits at once; only
	// whether it started matters.
	cmd := exec.Command(self, "-hangar-cgroup-probe")
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cg.fd}
	if err := cmd.Start(); err != nil {
		return false
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	return true
}

// close removes the driver's cgroup (once every sandbox's is gone).
func (t *cgroupTree) close() {
	if t != nil {
		_ = os.Remove(t.dir)
	}
}

// cgroup is one sandbox's.
type cgroup struct {
	dir string
	fd  int // open on dir, for clone3 (SysProcAttr.CgroupFD)
}

// open makes the cgroup name under t.
func (t *cgroupTree) open(name string) (*cgroup, error) {
	dir := filepath.Join(t.dir, name)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = os.Remove(dir)
		return nil, err
	}
	return &cgroup{dir: dir, fd: fd}, nil
}

// killProcesses kills every process in the cgroup and waits (a while) for
// them to be gone; the cgroup stays, for the sandbox's next processes. It
// kills pid by pid, again until none is left (a process forking while it
// runs is caught on the next pass): cgroup.kill was seen here to kill the
// next processes started in the group too.
func (c *cgroup) killProcesses(ctx context.Context) error {
	deadline := time.Now().Add(5 * time.Second)
	for wait := time.Millisecond; ; wait = min(2*wait, 20*time.Millisecond) {
		procs, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs"))
		if err != nil {
			return fmt.Errorf("read cgroup %s: %w", c.dir, err)
		}
		pids := strings.Fields(string(procs))
		if len(pids) == 0 {
			return nil
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil && pid > 0 {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: processes still running after a kill", c.dir)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// kill kills every process in the cgroup, waits (a while) for them to be
// gone and removes it.
func (c *cgroup) kill() error {
	if c.fd >= 0 {
		defer unix.Close(c.fd)
	}
	if err := os.WriteFile(filepath.Join(c.dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		return fmt.Errorf("kill cgroup %s: %w", c.dir, err)
	}
	// Killed processes leave the cgroup as they exit; it can be removed
	// once it is empty.
	deadline := time.Now().Add(2 * time.Second)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		err := os.Remove(c.dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", c.dir, err)
		}
		time.Sleep(wait)
	}
}
