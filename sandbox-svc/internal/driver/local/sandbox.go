package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// Sandbox is a local sandbox.
type Sandbox struct {
	d          *Driver
	cg         *cgroup // nil where cgroups can't be made (cgroup.go)
	spec       driver.Spec
	ns         *netNS // nil with egress full
	relay      *relay
	baseCommit string
	createdAt  time.Time
	// revived: a leftover of an earlier process made live again
	// (leftover.go); its teardown also removes what a leftover's removal
	// does (its upper directory, unused layers).
	revived bool

	// holdMu guards hold: the process holding the sandbox's namespaces
	// (isolation.go); nil until its first process, or without isolation.
	holdMu sync.Mutex
	hold   *holder

	// layerMu guards layer: the read-only layer this sandbox's work tree
	// and home are overlays of (overlay.go); nil for plain directories.
	layerMu sync.Mutex
	layer   *layer

	mu        sync.Mutex
	thawed    *sync.Cond // on mu: signalled when copying drops to 0
	key       string
	dir       string
	procs     map[int]struct{} // process groups started here
	running   int
	copying   int // copies of this sandbox in progress: new commands wait
	destroyed bool
}

func newSandbox(d *Driver, spec driver.Spec) *Sandbox {
	sb := &Sandbox{d: d, spec: spec, procs: map[int]struct{}{}}
	sb.thawed = sync.NewCond(&sb.mu)
	return sb
}

// freeze holds new commands back while the sandbox is copied; it fails
// when a command runs.
func (sb *Sandbox) freeze() error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	switch {
	case sb.destroyed:
		return driver.ErrDestroyed
	case sb.running > 0:
		return fmt.Errorf("%w: %d commands running", driver.ErrBusy, sb.running)
	}
	sb.copying++
	return nil
}

// thaw ends a freeze.
func (sb *Sandbox) thaw() {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.copying--; sb.copying == 0 {
		sb.thawed.Broadcast()
	}
}

// waitDelay bounds how long Wait waits for output pipes held open by
// children the command left running after it exited.
const waitDelay = 2 * time.Second

func (sb *Sandbox) workDir() string { return filepath.Join(sb.dir, "work") }
func (sb *Sandbox) homeDir() string { return filepath.Join(sb.dir, "home") }

// Info describes the sandbox.
func (sb *Sandbox) Info() driver.Info {
	sb.layerMu.Lock()
	layered := sb.layer != nil
	sb.layerMu.Unlock()
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return driver.Info{
		ID: sb.spec.ID, WorkKey: sb.key, WorkDir: sb.workDir(), HomeDir: sb.homeDir(),
		BaseCommit: sb.baseCommit, Egress: sb.spec.Egress, CreatedAt: sb.createdAt, Layered: layered,
		ToolVersion: sb.d.toolProto,
	}
}

// SandboxPath is a sandbox's PATH under isolation: the system's
// directories (the only ones it sees besides its own and the agent CLIs',
// which come by full path or on the exec's PATH).
const SandboxPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// env is a process's whole environment, built from nothing: a fixed base,
// the sandbox's (its environment's declared variables) and extra (the exec
// request's, e.g. the run token). Nothing of this service's environment
// enters a sandbox, isolated or not, save its PATH without isolation.
func (sb *Sandbox) env(extra map[string]string, pathPrepend ...string) []string {
	m := map[string]string{
		"PATH":                SandboxPath,
		"HOME":                sb.homeDir(),
		"USER":                "hangar",
		"LOGNAME":             "hangar",
		"SHELL":               "/bin/sh",
		"LANG":                "C.UTF-8",
		"TMPDIR":              "/tmp",
		"HANGAR_SANDBOX_ID":   sb.spec.ID,
		"HANGAR_WORK_DIR":     sb.workDir(),
		"GIT_TERMINAL_PROMPT": "0",
	}
	if len(sb.d.opts.SearchPath) > 0 {
		m["PATH"] = strings.Join(append(slices.Clone(sb.d.opts.SearchPath), SandboxPath), string(filepath.ListSeparator))
	}
	if sb.d.jail == nil {
		m["TMPDIR"] = os.TempDir()
		if p := os.Getenv("PATH"); p != "" {
			m["PATH"] = p
		}
	}
	if _, err := os.Stat("/bin/bash"); err == nil {
		m["SHELL"] = "/bin/bash"
	}
	if sb.relay != nil {
		m["HANGAR_GATEWAY_ADDR"] = sb.d.opts.Gateway.Listen
	}
	for k, v := range sb.spec.Env {
		m[k] = v
	}
	for k, v := range extra {
		m[k] = v
	}
	if len(pathPrepend) > 0 {
		m["PATH"] = strings.Join(append(slices.Clone(pathPrepend), m["PATH"]), string(filepath.ListSeparator))
	}
	if sb.d.toolDir != "" {
		m["PATH"] = sb.d.toolDir + string(os.PathListSeparator) + m["PATH"]
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func lookPath(argv0, dir string, env []string) (string, error) {
	if strings.Contains(argv0, "/") {
		p := argv0
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		st, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		if st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s: permission denied", argv0)
		}
		return p, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		p := filepath.Join(d, argv0)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

// Exec starts a command in the sandbox.
func (sb *Sandbox) Exec(ctx context.Context, req driver.ExecRequest) (driver.Process, error) {
	return sb.start(ctx, req, true, true)
}

func (sb *Sandbox) begin() error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	for sb.copying > 0 && !sb.destroyed {
		sb.thawed.Wait()
	}
	if sb.destroyed {
		return driver.ErrDestroyed
	}
	sb.running++
	return nil
}

func (sb *Sandbox) isDestroyed() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.destroyed
}

func (sb *Sandbox) end() {
	sb.mu.Lock()
	sb.running--
	sb.mu.Unlock()
}

func (sb *Sandbox) trackGroup(pgid int) {
	sb.mu.Lock()
	sb.procs[pgid] = struct{}{}
	sb.mu.Unlock()
}

// KillProcesses ends every process running in the sandbox: the whole
// cgroup where it has one (detached processes too), else every process
// group started here. The sandbox stays usable.
func (sb *Sandbox) KillProcesses(ctx context.Context) error {
	// Under isolation the namespace holder goes first, and with it every
	// process in the sandbox's pid namespace; waiting for it means the
	// next command makes new namespaces rather than trying to join the
	// dead ones (bwrap: "Can't fork for --pidns").
	sb.stopHolder()
	if sb.cg != nil {
		return sb.cg.killProcesses(ctx)
	}
	sb.mu.Lock()
	groups := make([]int, 0, len(sb.procs))
	for pgid := range sb.procs {
		groups = append(groups, pgid)
	}
	sb.mu.Unlock()
	for _, pgid := range groups {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	return nil
}

// untrackGroupIfEmpty forgets a group with no members left (a pid is not
// reused while it names a live group, so tracked groups are safe to kill).
func (sb *Sandbox) untrackGroupIfEmpty(pgid int) {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		sb.mu.Lock()
		delete(sb.procs, pgid)
		sb.mu.Unlock()
	}
}

func (sb *Sandbox) start(ctx context.Context, req driver.ExecRequest, useNS, guard bool) (driver.Process, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, errors.New("empty command")
	}
	if guard {
		if err := sb.begin(); err != nil {
			return nil, err
		}
	}
	done := func() {
		if guard {
			sb.end()
		}
	}
	dir, err := sb.resolveDir(req.Dir)
	if err != nil {
		done()
		return nil, err
	}
	env := sb.env(req.Env, req.PathPrepend...)
	path, err := lookPath(req.Argv[0], dir, env)
	if err != nil {
		done()
		msg := fmt.Sprintf("hangar: %s: command not found\n", req.Argv[0])
		code := 127
		if !errors.Is(err, exec.ErrNotFound) && !errors.Is(err, fs.ErrNotExist) {
			msg, code = fmt.Sprintf("hangar: %s: cannot execute: %v\n", req.Argv[0], err), 126
		}
		if req.Stderr != nil {
			_, _ = io.WriteString(req.Stderr, msg)
		}
		return exited{driver.ExitStatus{Code: code}}, nil
	}
	var cmd *exec.Cmd
	var infoR *os.File // bwrap's report of the sandbox's process group
	if sb.d.jail != nil {
		if cmd, infoR, err = sb.jailed(path, req.Argv[1:], dir, true); err != nil {
			done()
			return nil, err
		}
	} else {
		cmd = exec.Command(path, req.Argv[1:]...)
		cmd.Args[0] = req.Argv[0]
		cmd.Dir = dir
	}
	cmd.Env = env
	cmd.SysProcAttr = sb.inCgroup(&syscall.SysProcAttr{Setpgid: true})
	cmd.Stdout, cmd.Stderr = req.Stdout, req.Stderr
	cmd.WaitDelay = waitDelay
	var stdinW *os.File
	if req.Stdin != nil {
		r, w, err := os.Pipe()
		if err != nil {
			done()
			return nil, err
		}
		cmd.Stdin, stdinW = r, w
	}
	startFn := cmd.Start
	if useNS && sb.ns != nil {
		startFn = func() error { return sb.ns.Do(cmd.Start) }
	}
	err = startFn()
	if f, ok := cmd.Stdin.(*os.File); ok {
		f.Close()
	}
	for _, f := range cmd.ExtraFiles {
		f.Close()
	}
	if err != nil {
		if stdinW != nil {
			stdinW.Close()
		}
		if infoR != nil {
			infoR.Close()
		}
		done()
		return nil, fmt.Errorf("start %s: %w", req.Argv[0], err)
	}
	// groups are killed on cancel: bwrap's, and under bwrap the sandbox
	// process's own session, which signals go to (bwrap itself would die
	// of them at once, before the process it runs).
	pgid := cmd.Process.Pid
	groups := []int{pgid}
	sb.trackGroup(pgid)
	if infoR != nil {
		if child := readChildPid(infoR); child > 0 {
			pgid = child
			groups = append(groups, child)
			sb.trackGroup(child)
		}
		infoR.Close()
	}
	if stdinW != nil {
		go func() {
			_, _ = io.Copy(stdinW, req.Stdin)
			stdinW.Close()
		}()
	}
	p := &process{cmd: cmd, pgid: pgid, jailed: infoR != nil, waited: make(chan struct{})}
	go func() {
		select {
		case <-ctx.Done():
			select {
			case <-p.waited:
				// Reaped: its groups' ids may be reused already.
			default:
				sb.d.opts.Logger.Info("sandbox command canceled: its process groups killed", "sandbox", sb.spec.ID,
					"command", req.Argv[0], "cause", context.Cause(ctx))
				for _, g := range groups {
					_ = syscall.Kill(-g, syscall.SIGKILL)
				}
			}
		case <-p.waited:
		}
	}()
	go func() {
		p.err = cmd.Wait()
		for _, g := range groups {
			sb.untrackGroupIfEmpty(g)
		}
		if stdinW != nil {
			stdinW.Close()
		}
		done()
		close(p.waited)
	}()
	return p, nil
}

// awaitSession waits (a while) until pid leads its own process group, as
// bwrap makes it (--new-session) once the sandbox is set up and just
// before it runs the command (till then it is in bwrap's group, which
// cancel kills too): a signal to the group reaches it from then on.
func awaitSession(pid int) {
	deadline := time.Now().Add(5 * time.Second)
	for wait := 50 * time.Microsecond; time.Now().Before(deadline); wait = min(2*wait, time.Millisecond) {
		pgid, err := syscall.Getpgid(pid)
		if err != nil || pgid == pid {
			return
		}
		time.Sleep(wait)
	}
}

type exited struct{ st driver.ExitStatus }

func (e exited) Signal(os.Signal) error           { return nil }
func (e exited) Wait() (driver.ExitStatus, error) { return e.st, nil }

type process struct {
	cmd  *exec.Cmd
	pgid int
	// jailed: the process ran under bwrap, which reports a death by signal
	// N as exit code 128+N.
	jailed bool
	waited chan struct{}
	err    error
}

func (p *process) Signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("unsupported signal %v", sig)
	}
	err := syscall.Kill(-p.pgid, s)
	if errors.Is(err, syscall.ESRCH) && p.jailed {
		// Its session may not be made yet (bwrap sets the sandbox up
		// first).
		awaitSession(p.pgid)
		err = syscall.Kill(-p.pgid, s)
	}
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

func (p *process) Wait() (driver.ExitStatus, error) {
	<-p.waited
	return exitStatus(p.cmd.ProcessState, p.err, p.jailed)
}

// exitStatus describes how ps ended. jailed: it is bwrap's, which exits
// 128+N when the process it ran died of signal N; that is taken for the
// signal (as a shell would: a process that exits 130 itself reads as INT).
func exitStatus(ps *os.ProcessState, waitErr error, jailed bool) (driver.ExitStatus, error) {
	if ps == nil {
		return driver.ExitStatus{}, waitErr
	}
	ws, _ := ps.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return driver.ExitStatus{Code: 128 + int(ws.Signal()), Signal: driver.SignalName(ws.Signal())}, nil
	}
	if code := ps.ExitCode(); jailed && code > 128 && code < 128+65 {
		if name := driver.SignalName(syscall.Signal(code - 128)); name != "" {
			return driver.ExitStatus{Code: code, Signal: name}, nil
		}
	}
	// An ExitError or ErrWaitDelay after the process exited is not a
	// failure of the exec itself.
	return driver.ExitStatus{Code: ps.ExitCode()}, nil
}

// Terminal starts a process on a new pty in its own session.
func (sb *Sandbox) Terminal(ctx context.Context, req driver.TerminalRequest) (driver.Terminal, error) {
	if err := sb.begin(); err != nil {
		return nil, err
	}
	argv := req.Argv
	env := sb.env(req.Env, req.PathPrepend...)
	hasTerm := false
	for _, kv := range env {
		hasTerm = hasTerm || strings.HasPrefix(kv, "TERM=")
	}
	if !hasTerm {
		env = append(env, "TERM=xterm-256color")
	}
	if len(argv) == 0 {
		sh := "/bin/sh"
		if _, err := os.Stat("/bin/bash"); err == nil {
			sh = "/bin/bash"
		}
		argv = []string{sh, "-i"}
	}
	path, err := lookPath(argv[0], sb.workDir(), env)
	if err != nil {
		sb.end()
		return nil, fmt.Errorf("terminal %s: %w", argv[0], err)
	}
	var cmd *exec.Cmd
	var infoR *os.File
	attr := &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if j := sb.d.jail; j != nil {
		// The session, and the pty as its controlling terminal, are made
		// inside (setsid -c): a shell there sets the terminal's process
		// group to its own, which must be visible in its pid namespace.
		if cmd, infoR, err = sb.jailed(j.setsid, append([]string{"-c", "--", path}, argv[1:]...), sb.workDir(), false); err != nil {
			sb.end()
			return nil, err
		}
		attr = &syscall.SysProcAttr{Setpgid: true}
	} else {
		cmd = exec.Command(path, argv[1:]...)
		cmd.Args[0] = argv[0]
		cmd.Dir = sb.workDir()
	}
	cmd.Env = env
	size := &pty.Winsize{Rows: req.Rows, Cols: req.Cols}
	if size.Rows == 0 || size.Cols == 0 {
		size.Rows, size.Cols = 24, 80
	}
	var ptmx *os.File
	startFn := func() error {
		var err error
		ptmx, err = pty.StartWithAttrs(cmd, size, sb.inCgroup(attr))
		return err
	}
	if sb.ns != nil {
		err = sb.ns.Do(startFn)
	} else {
		err = startFn()
	}
	for _, f := range cmd.ExtraFiles {
		f.Close()
	}
	if err != nil {
		if infoR != nil {
			infoR.Close()
		}
		sb.end()
		return nil, fmt.Errorf("terminal start: %w", err)
	}
	groups := []int{cmd.Process.Pid}
	if infoR != nil {
		if child := readChildPid(infoR); child > 0 {
			groups = append(groups, child)
		}
		infoR.Close()
	}
	for _, g := range groups {
		sb.trackGroup(g)
	}
	t := &terminal{ptmx: ptmx, cmd: cmd, groups: groups, jailed: sb.d.jail != nil, waited: make(chan struct{})}
	go func() {
		t.err = cmd.Wait()
		for _, g := range groups {
			sb.untrackGroupIfEmpty(g)
		}
		sb.end()
		close(t.waited)
	}()
	return t, nil
}

type terminal struct {
	ptmx *os.File
	cmd  *exec.Cmd
	// groups are its process group and, under bwrap, bwrap's.
	groups []int
	jailed bool
	waited chan struct{}
	err    error
	once   sync.Once
}

// Read returns io.EOF once the process is gone (the pty reports EIO).
func (t *terminal) Read(p []byte) (int, error) {
	n, err := t.ptmx.Read(p)
	if err != nil && (errors.Is(err, syscall.EIO) || errors.Is(err, os.ErrClosed)) {
		err = io.EOF
	}
	return n, err
}

func (t *terminal) Write(p []byte) (int, error) { return t.ptmx.Write(p) }

func (t *terminal) Resize(rows, cols uint16) error {
	return pty.Setsize(t.ptmx, &pty.Winsize{Rows: rows, Cols: cols})
}

func (t *terminal) Wait() (driver.ExitStatus, error) {
	<-t.waited
	return exitStatus(t.cmd.ProcessState, t.err, t.jailed)
}

// Kill ends the process, everything it started (background jobs in
// groups of their own too: killTree) and closes the pty.
func (t *terminal) Kill() error {
	select {
	case <-t.waited:
		// Reaped: its groups' ids may be another process's by now.
	default:
		killTree(t.cmd.Process.Pid, t.groups)
		for _, g := range t.groups {
			_ = syscall.Kill(-g, syscall.SIGKILL)
		}
	}
	var err error
	t.once.Do(func() { err = t.ptmx.Close() })
	return err
}

// Relocate moves an idle sandbox to the directory of workKey. A sandbox
// mounted over a layer is unmounted, its upper directory renamed with its
// key and mounted again at the new directory.
func (sb *Sandbox) Relocate(ctx context.Context, workKey string) error {
	// A mounted sandbox's upper directory is named by its key.
	sb.layerMu.Lock()
	defer sb.layerMu.Unlock()
	if sb.revived {
		return errors.New("relocate: the sandbox is a revived leftover")
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.destroyed {
		return driver.ErrDestroyed
	}
	if workKey == sb.key {
		return nil
	}
	if sb.running > 0 || sb.copying > 0 {
		return errors.New("relocate: processes are running or the sandbox is being copied")
	}
	if err := sb.d.claimKey(workKey, sb); err != nil {
		return err
	}
	newDir := filepath.Join(sb.d.dir, workKey)
	if err := removeAll(newDir); err != nil {
		sb.d.releaseKey(workKey, sb)
		return err
	}
	move := func() error { return os.Rename(sb.dir, newDir) }
	if sb.layer != nil {
		move = func() error { return sb.d.remount(sb.dir, sb.key, newDir, workKey, sb.layer) }
	}
	if err := move(); err != nil {
		sb.d.releaseKey(workKey, sb)
		return fmt.Errorf("relocate: %w", err)
	}
	sb.d.releaseKey(sb.key, sb)
	sb.key, sb.dir = workKey, newDir
	return nil
}

// Destroy runs hooks, kills every process and removes the directory.
func (sb *Sandbox) Destroy(ctx context.Context, hooks ...driver.DestroyHook) error {
	sb.mu.Lock()
	if sb.destroyed {
		sb.mu.Unlock()
		return nil
	}
	sb.mu.Unlock()
	var errs []error
	for _, h := range hooks {
		if err := h(ctx, sb); err != nil {
			errs = append(errs, err)
		}
	}
	sb.mu.Lock()
	if sb.destroyed {
		sb.mu.Unlock()
		return errors.Join(errs...)
	}
	sb.destroyed = true
	sb.mu.Unlock()
	if err := sb.teardown(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (sb *Sandbox) teardown() error {
	sb.mu.Lock()
	sb.destroyed = true
	if sb.thawed != nil {
		sb.thawed.Broadcast()
	}
	groups := make([]int, 0, len(sb.procs))
	for g := range sb.procs {
		groups = append(groups, g)
	}
	dir, key := sb.dir, sb.key
	sb.mu.Unlock()
	killGroups := func() {
		for _, g := range groups {
			_ = syscall.Kill(-g, syscall.SIGKILL)
		}
	}
	// A tracked group may have emptied since it was last checked
	// (untrackGroupIfEmpty runs when its command is waited for) and its id
	// be another process's group now: with a cgroup, which holds exactly
	// the sandbox's processes, the groups are not killed by id.
	if sb.cg == nil {
		killGroups()
	}
	// The holder's end ends every process in the sandbox's pid namespace.
	sb.stopHolder()
	var cgErr error
	if sb.cg != nil {
		// And whatever left its group.
		if cgErr = sb.cg.kill(); cgErr != nil {
			killGroups()
		}
	}
	if sb.relay != nil {
		_ = sb.relay.Close()
	}
	if sb.ns != nil {
		_ = sb.ns.Close()
	}
	sb.layerMu.Lock()
	l := sb.layer
	sb.layer = nil
	sb.layerMu.Unlock()
	err := cgErr
	if dir != "" {
		err = errors.Join(err, removeAll(dir))
	}
	if sb.d != nil && sb.spec.ID != "" {
		err = errors.Join(err, removeAll(sb.tmpDir()))
	}
	if l != nil {
		err = errors.Join(err, removeAll(sb.d.upperOf(key)), sb.d.releaseLayer(l))
	}
	if sb.revived && dir != "" {
		// A leftover's mount (removeAll unmounted it) held a layer
		// this driver does not count.
		err = errors.Join(err, removeAll(sb.d.upperOf(key)), sb.d.sweepLayers())
	}
	if key != "" {
		sb.d.releaseKey(key, sb)
	}
	return err
}

// removeAll removes dir, first unmounting what is mounted in it (a copy's
// overlays) and making directories writable if a process left one
// read-only.
func removeAll(dir string) error {
	if err := unmountUnder(dir); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err == nil {
		return nil
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o755)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// inCgroup starts a process with attr in the sandbox's cgroup, if it has
// one.
func (sb *Sandbox) inCgroup(attr *syscall.SysProcAttr) *syscall.SysProcAttr {
	if sb.cg != nil {
		attr.UseCgroupFD, attr.CgroupFD = true, sb.cg.fd
	}
	return attr
}
