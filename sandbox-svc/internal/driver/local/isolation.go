package local

// Isolation. Every process a sandbox runs (setup, exec, terminal) starts
// through bubblewrap (bwrap), which gives it:
//   - a mount namespace holding the read-only system (/usr, /bin, /lib*,
//     /etc with its files that are not world-readable masked), the agent
//     CLIs' install directories and any other configured read-only paths,
//     a fresh /proc and /dev, a private /tmp (a directory of the sandbox's
//     own, kept across its execs), and its work tree and home read-write at
//     their own paths (the harnesses key conversations by directory). Of
//     HANGAR_HOME and other sandboxes it holds nothing;
//   - the sandbox's user and pid namespaces, made once by its holder: it
//     sees only the sandbox's processes, as uid sandboxUID, with no
//     capabilities, no_new_privs and no further user namespaces;
//   - ipc, uts and cgroup namespaces of its own: the cgroup it was started
//     in (clone3 into the sandbox's, cgroup.go) is the root of its cgroup
//     view; no cgroupfs is mounted;
//   - the network namespace it is started in: the host's (egress full) or
//     the sandbox's own, whose only way out is the gateway relay (netns.go);
//   - an environment built from nothing (Sandbox.env), never hangar's.
// bwrap is used rather than an OCI runtime (crun, runc) because it needs no
// bundle, no state directory and no daemon: one exec per process, and it
// joins the network namespace and cgroup the driver already made. The
// mounts are all made here: the system's in newJail, a sandbox's own in
// jail.args; one place to add a bind.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// Isolation says how the local driver isolates a sandbox's processes.
type Isolation int

const (
	// IsolationBwrap runs every process under bubblewrap; where it cannot
	// run, sandboxes are not created (driver.ErrIsolationUnavailable).
	IsolationBwrap Isolation = iota
	// IsolationNone runs processes as the service's user in its namespaces
	// (the operator's explicit choice: HANGAR_SANDBOX_ISOLATION=none).
	IsolationNone
)

// sandboxUID is the uid (and gid) of a sandbox's processes inside their
// user namespace; it maps to the service's own uid outside, so files the
// sandbox writes are the service's.
const sandboxUID = 1000

// tmpsDir under the sandboxes directory holds each sandbox's /tmp, by id;
// not a valid work key.
const tmpsDir = ".tmp"

// systemDirs are bound read-only at their own paths (a symlink, as on
// merged-/usr systems, is recreated as the same symlink).
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"}

// jail builds the bwrap command lines.
type jail struct {
	bwrap string
	// setsid (util-linux) makes a terminal's process the leader of a
	// session whose controlling terminal is its pty, inside the sandbox.
	setsid string
	sh     string
	// system are the mounts every sandbox process gets: the system, masks,
	// the read-only paths.
	system []string
	// tools are bound read-only after /tmp (they may lie under it, as in
	// tests): the directory holding hangar-sandbox and hangar-agent.
	tools []string
}

// newJail finds bwrap, works out the system mounts and checks that a
// process can be started with them here (user namespaces may be
// disabled). root is hidden from sandboxes even when it lies under a
// read-only path; readOnly are more host paths to bind read-only.
func newJail(root string, readOnly []string) (*jail, error) {
	bin, err := exec.LookPath("bwrap")
	if err != nil {
		return nil, fmt.Errorf("bubblewrap (bwrap) not found: %w", err)
	}
	var args, bound []string
	for _, p := range systemDirs {
		st, err := os.Lstat(p)
		switch {
		case err != nil:
			continue
		case st.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return nil, err
			}
			args = append(args, "--symlink", target, p)
		case st.IsDir():
			args = append(args, "--ro-bind", p, p)
			bound = append(bound, p)
		}
	}
	args = append(args, maskUnreadable("/etc")...)
	// A file in /etc may be a link to one elsewhere (resolv.conf to
	// /run/systemd/resolve/...): that file is bound too, alone.
	for _, target := range etcLinksOutside(bound) {
		args = append(args, "--ro-bind-try", target, target)
	}
	for _, p := range cleanPaths(readOnly) {
		if under(p, bound) {
			continue
		}
		args = append(args, "--ro-bind-try", p, p)
		bound = append(bound, p)
	}
	if under(root, bound) {
		args = append(args, "--tmpfs", root, "--remount-ro", root)
	}
	args = append(args, "--proc", "/proc", "--dev", "/dev")
	setsid, err := exec.LookPath("setsid")
	if err != nil {
		return nil, fmt.Errorf("setsid (util-linux) not found: %w", err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		return nil, err
	}
	j := &jail{bwrap: bin, setsid: setsid, sh: sh, system: args}
	// A probe killed by a signal says nothing about the machine (the fault
	// suite saw one SIGKILLed while a crashed predecessor's processes were
	// being cleaned up): try again before saying isolation can't run.
	for try := 0; try < 3; try++ {
		if err = j.probe(); err == nil {
			return j, nil
		}
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != -1 && exit.ExitCode() < 128 {
			break
		}
	}
	return nil, err
}

// closeInheritedOnExec marks every descriptor of this process close-on-exec.
// Go opens its own so; one this process inherited open (a pipe of the
// shell or supervisor that started it) would otherwise pass into every
// child, sandboxes included. A child still gets its stdio and ExtraFiles.
func closeInheritedOnExec() {
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, ent := range ents {
		var fd int
		if _, err := fmt.Sscan(ent.Name(), &fd); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
}

// probe starts a holder and runs `true` in its namespaces.
func (j *jail) probe() error {
	truePath, err := exec.LookPath("true")
	if err != nil {
		return err
	}
	h, err := j.startHolder(nil)
	if err != nil {
		return fmt.Errorf("bubblewrap cannot start a sandbox here (user namespaces disabled?): %w", err)
	}
	defer h.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, j.bwrap, append(j.args(mountSet{}, "/", false), "--", truePath)...)
	cmd.Env = []string{}
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer devNull.Close()
	cmd.ExtraFiles = []*os.File{h.owner, h.pidns, h.userns, devNull}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("bubblewrap cannot start a sandbox here (user namespaces disabled?): %w: %s", err, strings.TrimSpace(tail(errb.String(), 512)))
	}
	return nil
}

// holder holds a sandbox's user and pid namespaces: a process (bwrap's
// init, pid 1 there, and cat reading a pipe only this driver writes)
// that every process of the sandbox joins, so they see one another as
// before isolation, and what one leaves running lives on until the
// sandbox is destroyed. When it ends every process in the pid namespace
// ends with it.
type holder struct {
	cmd   *exec.Cmd
	stdin *os.File // closing it ends the holder
	// pidns is its pid namespace; owner the user namespace owning it (where
	// bwrap sets up), userns the one its processes are in (a child of
	// owner, where uid sandboxUID has no capabilities and no further user
	// namespace can be made: --disable-userns).
	pidns, owner, userns *os.File
	pgid                 int
	done                 chan struct{} // closed when it has ended
}

// startHolder starts a holder, in the cgroup attr puts it in (nil: none).
func (j *jail) startHolder(attr *syscall.SysProcAttr) (*holder, error) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		return nil, err
	}
	args := []string{
		"--unshare-user", "--uid", fmt.Sprint(sandboxUID), "--gid", fmt.Sprint(sandboxUID),
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup",
		"--disable-userns", "--cap-drop", "ALL", "--die-with-parent",
	}
	args = append(args, j.system...)
	// The shell says it runs (bwrap has set the namespaces up: they can be
	// joined) and becomes cat, reading until the driver closes its stdin.
	args = append(args, "--tmpfs", "/tmp", "--chdir", "/", "--new-session", "--info-fd", "3", "--", sh, "-c", "echo; exec cat")
	cmd := exec.Command(j.bwrap, args...)
	cmd.Env = []string{}
	if attr == nil {
		attr = &syscall.SysProcAttr{}
	}
	attr.Setpgid = true
	cmd.SysProcAttr = attr
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	infoR, infoW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll([]*os.File{inR, inW, infoR, infoW})
		return nil, err
	}
	// Bounded: the sandbox can write to its holder's stderr.
	var errb limitedBuffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr, cmd.ExtraFiles = inR, outW, &errb, []*os.File{infoW}
	err = cmd.Start()
	closeAll([]*os.File{inR, infoW, outW})
	if err != nil {
		closeAll([]*os.File{inW, infoR, outR})
		return nil, err
	}
	h := &holder{cmd: cmd, stdin: inW, pgid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(h.done)
	}()
	child := readChildPid(infoR)
	infoR.Close()
	ready := make([]byte, 1)
	_, readyErr := io.ReadFull(outR, ready)
	outR.Close()
	if readyErr != nil {
		child = 0
	}
	if child > 0 {
		h.pidns, err = os.Open(fmt.Sprintf("/proc/%d/ns/pid", child))
		if err == nil {
			h.userns, err = os.Open(fmt.Sprintf("/proc/%d/ns/user", child))
		}
		if err == nil {
			var fd int
			fd, err = unix.IoctlRetInt(int(h.pidns.Fd()), unix.NS_GET_USERNS)
			if err == nil {
				unix.CloseOnExec(fd)
				h.owner = os.NewFile(uintptr(fd), "userns-owner")
			}
		}
	}
	if child <= 0 || err != nil {
		h.stop()
		return nil, fmt.Errorf("sandbox namespaces: %v %s", err, strings.TrimSpace(tail(errb.String(), 512)))
	}
	return h, nil
}

// stop ends the holder, and with it every process in its pid namespace.
func (h *holder) stop() {
	h.stdin.Close()
	select {
	case <-h.done:
		// It ended and was reaped already: its pgid may be another
		// process's group by now (pids are reused, after a few minutes
		// where pid_max is 32768), which must not be killed.
	default:
		_ = syscall.Kill(-h.pgid, syscall.SIGKILL)
	}
	<-h.done
	for _, f := range []*os.File{h.userns, h.pidns, h.owner} {
		if f != nil {
			f.Close()
		}
	}
}

// mountSet is what one sandbox's processes see beyond the system.
type mountSet struct {
	// writable are bound read-write at their own paths (work tree, home).
	writable []string
	// tmp is bound at /tmp; a fresh tmpfs when empty.
	tmp string
}

// closeNamespaceFDs is the script a jailed command runs through (as sh -c
// closeNamespaceFDs path args...).
const closeNamespaceFDs = `exec 3<&- 4<&- 5<&-; exec "$0" "$@"`

// The descriptors a jailed process is started with (cmd.ExtraFiles).
const (
	ownerFD  = 3 // the user namespace owning the holder's pid namespace
	pidnsFD  = 4 // the holder's pid namespace
	usernsFD = 5 // the holder's processes' user namespace
	infoFD   = 6 // bwrap's report (child-pid)
)

// args returns bwrap's arguments (without the command) for a process
// running in dir, joining the holder's namespaces; bwrap reports the
// process it starts on infoFD. newSession puts it in a session of its own
// (execs: its process group is then apart from bwrap's, see process).
//
// No --die-with-parent here. Joining a pid namespace, bwrap forks twice:
// an intermediate process forks the sandbox's process into the namespace
// and exits; with --die-with-parent that process sets a parent-death
// SIGKILL while its parent may still be the intermediate, and where the
// intermediate's exit comes late (a loaded machine) the command is killed
// just after it starts: a kernel signal trace of the soak's "killed by
// KILL" showed exactly that, the intermediate's exit_group signalling the
// sandbox's fresh sh. Nothing is lost without it: the process is in the
// holder's pid namespace, which ends with the holder (whose bwrap has
// --die-with-parent, without that race: it makes the namespace, pid 1 is
// its own child), and in the sandbox's cgroup.
func (j *jail) args(m mountSet, dir string, newSession bool) []string {
	args := []string{
		"--userns", fmt.Sprint(ownerFD), "--pidns", fmt.Sprint(pidnsFD), "--userns2", fmt.Sprint(usernsFD),
		"--unshare-ipc", "--unshare-uts", "--unshare-cgroup",
		"--assert-userns-disabled", "--cap-drop", "ALL",
	}
	args = append(args, j.system...)
	if m.tmp != "" {
		args = append(args, "--bind", m.tmp, "/tmp")
	} else {
		args = append(args, "--tmpfs", "/tmp")
	}
	for _, p := range m.writable {
		args = append(args, "--bind", p, p)
	}
	for _, p := range j.tools {
		args = append(args, "--ro-bind", p, p)
	}
	args = append(args, "--chdir", dir, "--info-fd", fmt.Sprint(infoFD))
	if newSession {
		args = append(args, "--new-session")
	}
	return args
}

// maskUnreadable returns the bwrap arguments hiding what under dir is not
// world-readable (/etc/shadow, /etc/ssl/private): a sandbox's uid maps to
// the service's, which may own them.
func maskUnreadable(dir string) []string {
	var args []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		perm := info.Mode().Perm()
		switch {
		case d.IsDir() && perm&0o005 != 0o005:
			args = append(args, "--tmpfs", p, "--remount-ro", p)
			return fs.SkipDir
		case info.Mode().IsRegular() && perm&0o004 == 0:
			args = append(args, "--ro-bind", "/dev/null", p)
		}
		return nil
	})
	return args
}

// etcLinksOutside returns the files that symlinks directly in /etc lead
// to outside the bound directories (world-readable regular files only).
func etcLinksOutside(bound []string) []string {
	ents, err := os.ReadDir("/etc")
	if err != nil {
		return nil
	}
	var out []string
	for _, ent := range ents {
		if ent.Type()&fs.ModeSymlink == 0 {
			continue
		}
		target, err := filepath.EvalSymlinks(filepath.Join("/etc", ent.Name()))
		if err != nil || under(target, bound) || strings.HasPrefix(target, "/proc/") {
			continue
		}
		if st, err := os.Stat(target); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o004 != 0 {
			out = append(out, target)
		}
	}
	return out
}

// cleanPaths returns the absolute paths of ps, without duplicates or
// paths inside another of them.
func cleanPaths(ps []string) []string {
	var abs []string
	for _, p := range ps {
		if p == "" || !filepath.IsAbs(p) {
			continue
		}
		abs = append(abs, filepath.Clean(p))
	}
	sort.Strings(abs)
	var out []string
	for _, p := range abs {
		if !under(p, out) {
			out = append(out, p)
		}
	}
	return out
}

// under says whether p is one of dirs or inside one.
func under(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}

// InstallDirs returns the directories a sandbox must see (read-only) to
// run the given programs and directories: for a program inside an npm
// tree (…/prefix/node_modules/.bin/claude), the prefix holding
// node_modules, both for the path given and the one its symlinks lead to;
// else the program's directory. A bare name is looked up on path (the
// sandbox's PATH); names not found are skipped.
// FoundDirs are the directories of path where the programs named without a
// directory are found (the first match of each), for a sandbox's PATH.
func FoundDirs(path string, programs ...string) []string {
	var dirs []string
	for _, prog := range programs {
		if prog == "" || strings.Contains(prog, "/") {
			continue
		}
		for _, d := range filepath.SplitList(path) {
			if st, err := os.Stat(filepath.Join(d, prog)); err == nil && !st.IsDir() {
				dirs = append(dirs, d)
				break
			}
		}
	}
	return cleanPaths(dirs)
}

func InstallDirs(path string, programs ...string) []string {
	var dirs []string
	for _, prog := range programs {
		if prog == "" {
			continue
		}
		p := prog
		if !strings.Contains(p, "/") {
			found := ""
			for _, d := range filepath.SplitList(path) {
				if st, err := os.Stat(filepath.Join(d, p)); err == nil && !st.IsDir() {
					found = filepath.Join(d, p)
					break
				}
			}
			if found == "" {
				continue
			}
			p = found
		}
		p, err := filepath.Abs(p)
		if err != nil {
			continue
		}
		cands := []string{p}
		if real, err := filepath.EvalSymlinks(p); err == nil && real != p {
			cands = append(cands, real)
		}
		for _, c := range cands {
			if i := strings.Index(c, "/node_modules/"); i > 0 {
				dirs = append(dirs, c[:i])
				continue
			}
			if st, err := os.Stat(c); err == nil && st.IsDir() {
				dirs = append(dirs, c)
			} else {
				dirs = append(dirs, filepath.Dir(c))
			}
		}
	}
	return cleanPaths(dirs)
}

// tmpDir is the host directory bound at the sandbox's /tmp.
func (sb *Sandbox) tmpDir() string {
	name := sb.spec.ID
	if !driver.ValidKey(name) {
		sum := sha256.Sum256([]byte(name))
		name = hex.EncodeToString(sum[:8])
	}
	return filepath.Join(sb.d.dir, tmpsDir, name)
}

// mounts is what sb's processes see beyond the system.
func (sb *Sandbox) mounts() (mountSet, error) {
	tmp := sb.tmpDir()
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return mountSet{}, fmt.Errorf("sandbox tmp: %w", err)
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return mountSet{writable: []string{sb.workDir(), sb.homeDir()}, tmp: tmp}, nil
}

// jailed turns a command line into one run under bwrap for sb, in dir,
// in the sandbox's namespaces (its holder is started with the first).
// info (the read side of cmd.ExtraFiles' infoFD) yields bwrap's report,
// for readChildPid. The caller closes cmd.ExtraFiles after the start, and
// info.
func (sb *Sandbox) jailed(path string, args []string, dir string, newSession bool) (cmd *exec.Cmd, info *os.File, err error) {
	m, err := sb.mounts()
	if err != nil {
		return nil, nil, err
	}
	nsFiles, err := sb.namespaceFiles()
	if err != nil {
		return nil, nil, err
	}
	j := sb.d.jail
	// bwrap leaves the namespace descriptors open: the shell closes them
	// before it becomes the command.
	full := append(j.args(m, dir, newSession), "--", j.sh, "-c", closeNamespaceFDs, path)
	cmd = exec.Command(j.bwrap, append(full, args...)...)
	// Duplicates: the holder's stay open for the next process.
	cmd.ExtraFiles = nsFiles
	r, w, err := os.Pipe()
	if err != nil {
		closeAll(cmd.ExtraFiles)
		return nil, nil, err
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, w)
	return cmd, r, nil
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// namespaces returns the sandbox's holder, starting it with the first
// process.
func (sb *Sandbox) namespaces() (*holder, error) {
	sb.holdMu.Lock()
	defer sb.holdMu.Unlock()
	return sb.namespacesLocked()
}

// namespacesLocked is namespaces, with holdMu held by the caller.
func (sb *Sandbox) namespacesLocked() (*holder, error) {
	if sb.hold != nil {
		select {
		case <-sb.hold.done:
			// Something in the sandbox killed it (and with it everything
			// else there): the next process gets new namespaces.
			sb.hold.stop()
			sb.hold = nil
		default:
			return sb.hold, nil
		}
	}
	if sb.isDestroyed() {
		return nil, driver.ErrDestroyed
	}
	var h *holder
	start := func() error {
		var err error
		h, err = sb.d.jail.startHolder(sb.inCgroup(&syscall.SysProcAttr{}))
		return err
	}
	// In the sandbox's network namespace (egress none), so that not even
	// its pid 1 is in the host's.
	var err error
	if sb.ns != nil {
		err = sb.ns.Do(start)
	} else {
		err = start()
	}
	if err != nil {
		return nil, err
	}
	sb.hold = h
	return h, nil
}

// namespaceFiles returns duplicates of the holder's namespace descriptors
// (owner, pid, user: ownerFD, pidnsFD, usernsFD), starting the holder with
// the first process. They are taken under holdMu, which stopHolder holds
// while it closes the holder's own: a process starting while the sandbox's
// processes are killed joins either the old namespaces before they end or
// the next ones, never descriptors being closed under it.
func (sb *Sandbox) namespaceFiles() ([]*os.File, error) {
	sb.holdMu.Lock()
	defer sb.holdMu.Unlock()
	h, err := sb.namespacesLocked()
	if err != nil {
		return nil, err
	}
	var out []*os.File
	for _, f := range []*os.File{h.owner, h.pidns, h.userns} {
		dup, err := dupFile(f)
		if err != nil {
			closeAll(out)
			return nil, err
		}
		out = append(out, dup)
	}
	return out, nil
}

// stopHolder ends the sandbox's holder (teardown, KillProcesses).
func (sb *Sandbox) stopHolder() {
	sb.holdMu.Lock()
	defer sb.holdMu.Unlock()
	h := sb.hold
	sb.hold = nil
	if h != nil {
		h.stop()
	}
}

// readChildPid reads bwrap's info (fd 3) and returns the host pid of the
// sandbox's first process, the leader of its session and process group; 0
// when bwrap ended before making it.
func readChildPid(r io.Reader) int {
	var info struct {
		ChildPid int `json:"child-pid"`
	}
	if err := json.NewDecoder(bufio.NewReader(r)).Decode(&info); err != nil {
		return 0
	}
	return info.ChildPid
}

// errIsolation is returned by Create when the driver should isolate but
// cannot.
func (d *Driver) errIsolation() error {
	return fmt.Errorf("%w: %v (set HANGAR_SANDBOX_ISOLATION=none to run sandboxes without isolation)", driver.ErrIsolationUnavailable, d.jailErr)
}
