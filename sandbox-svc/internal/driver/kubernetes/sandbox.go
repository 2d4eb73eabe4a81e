package kubernetes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// Sandbox is one sandbox pod.
type Sandbox struct {
	d         *Driver
	spec      driver.Spec
	pod       string
	createdAt time.Time

	mu          sync.Mutex
	key         string
	podObj      *corev1.Pod
	baseCommit  string
	toolVersion int
	running     int
	destroyed   bool
	gone        bool // someone else deleted the pod
	lost        bool // another replica claimed the warm pod first
	execs       map[*process]struct{}
}

func newSandbox(d *Driver, spec driver.Spec, pod, key string) *Sandbox {
	return &Sandbox{d: d, spec: spec, pod: pod, key: key, execs: map[*process]struct{}{}}
}

func (sb *Sandbox) setPod(p *corev1.Pod) {
	sb.mu.Lock()
	sb.podObj = p
	sb.mu.Unlock()
}

// markGone records that someone else deleted the pod; false when it was
// this driver's own Destroy (or already recorded).
func (sb *Sandbox) markGone() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.destroyed || sb.gone {
		return false
	}
	sb.gone = true
	return true
}

// Pod is the sandbox's pod name.
func (sb *Sandbox) Pod() string { return sb.pod }

func (sb *Sandbox) dir() string {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return path.Join(SandboxesDir, sb.key)
}

// Info describes the sandbox.
func (sb *Sandbox) Info() driver.Info {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	dir := path.Join(SandboxesDir, sb.key)
	return driver.Info{
		ID: sb.spec.ID, WorkKey: sb.key, WorkDir: path.Join(dir, "work"), HomeDir: path.Join(dir, "home"),
		BaseCommit: sb.baseCommit, Egress: sb.spec.Egress, CreatedAt: sb.createdAt, ToolVersion: sb.toolVersion,
	}
}

// env is a process's whole environment: a fixed base, the sandbox's and
// the request's.
func (sb *Sandbox) env(extra map[string]string, pathPrepend []string) []string {
	info := sb.Info()
	m := map[string]string{
		"PATH":                ToolDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME":                info.HomeDir,
		"USER":                "hangar",
		"LOGNAME":             "hangar",
		"SHELL":               "/bin/sh",
		"LANG":                "C.UTF-8",
		"TMPDIR":              "/tmp",
		"HANGAR_SANDBOX_ID":   sb.spec.ID,
		"HANGAR_WORK_DIR":     info.WorkDir,
		"GIT_TERMINAL_PROMPT": "0",
	}
	if gw := sb.d.gatewayAddr(); gw != "" {
		m["HANGAR_GATEWAY_ADDR"] = gw
	}
	for k, v := range sb.spec.Env {
		m[k] = v
	}
	for k, v := range extra {
		m[k] = v
	}
	if len(pathPrepend) > 0 {
		m["PATH"] = strings.Join(pathPrepend, ":") + ":" + m["PATH"]
	}
	if !strings.HasPrefix(m["PATH"], ToolDir+":") {
		m["PATH"] = ToolDir + ":" + m["PATH"]
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// resolve turns a request path into an absolute path in the pod:
// relative paths are relative to the work tree; absolute ones must lie in
// the sandbox directory. Symlinks are checked in the pod.
func (sb *Sandbox) resolve(p string) (string, error) {
	dir := sb.dir()
	var abs string
	if path.IsAbs(p) {
		abs = path.Clean(p)
	} else {
		abs = path.Join(dir, "work", p)
	}
	if abs != dir && !strings.HasPrefix(abs, dir+"/") {
		return "", fmt.Errorf("%w: %s", driver.ErrOutsideSandbox, p)
	}
	return abs, nil
}

func (sb *Sandbox) begin() error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.destroyed {
		return driver.ErrDestroyed
	}
	sb.running++
	return nil
}

func (sb *Sandbox) end() {
	sb.mu.Lock()
	sb.running--
	sb.mu.Unlock()
}

// toolBin is hangar-sandbox in a pod. The driver's own steps run through
// it (sandboxtool's pod commands), so an image needs git and nothing
// else of hangar's: no shell, no coreutils.
const toolBin = ToolDir + "/" + sandboxtool.Binary

// toolArgv is the command line of an argv command of the tool.
func toolArgv(command string, args any) []string { return mustArgv(toolBin, command, args) }

// mustArgv is the command line of an argv command of the tool at bin.
func mustArgv(bin, command string, args any) []string {
	argv, err := sandboxtool.ArgvRequest(bin, command, args)
	if err != nil {
		// The requests are the package's own structs: they always encode.
		panic(err)
	}
	return argv
}

// Exec starts a command in the pod through the API server.
func (sb *Sandbox) Exec(ctx context.Context, req driver.ExecRequest) (driver.Process, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, errors.New("empty command")
	}
	dir, err := sb.resolve(req.Dir)
	if err != nil {
		return nil, err
	}
	return sb.start(ctx, req, dir)
}

// start runs req in dir, an absolute path in the pod the caller checked
// (the driver's own steps run in "/", outside the sandbox directory).
func (sb *Sandbox) start(ctx context.Context, req driver.ExecRequest, dir string) (driver.Process, error) {
	if err := sb.begin(); err != nil {
		return nil, err
	}
	run := path.Join(RunDir, "exec-"+randomHex(8))
	// The tool starts the command in a session of its own whose id it
	// records in the run file (signals and cancel go to that process
	// group), with exactly this environment, and exits with its status
	// (126: no directory, 127: no such command, as the local driver).
	argv := toolArgv(sandboxtool.CommandExec, sandboxtool.ExecRequest{RunFile: run, Dir: dir, Env: sb.env(req.Env, req.PathPrepend), Argv: req.Argv})
	p := &process{sb: sb, run: run, done: make(chan struct{})}
	streamCtx, cancel := context.WithCancel(sb.d.ctx)
	p.cancelStream = cancel
	sb.mu.Lock()
	sb.execs[p] = struct{}{}
	sb.mu.Unlock()
	go func() {
		defer sb.end()
		defer cancel()
		p.err = sb.d.stream(streamCtx, sb.pod, argv, streamOptions{stdin: req.Stdin, stdout: req.Stdout, stderr: req.Stderr})
		sb.mu.Lock()
		delete(sb.execs, p)
		sb.mu.Unlock()
		close(p.done)
	}()
	go func() {
		select {
		case <-ctx.Done():
			p.kill()
		case <-p.done:
		}
	}()
	return p, nil
}

// process is one exec in a pod.
type process struct {
	sb           *Sandbox
	run          string
	done         chan struct{}
	err          error
	cancelStream context.CancelFunc

	mu   sync.Mutex
	sent map[int]string // exit code 128+n -> the signal this driver sent
}

func (p *process) noteSignal(sig syscall.Signal) {
	p.mu.Lock()
	if p.sent == nil {
		p.sent = map[int]string{}
	}
	p.sent[128+int(sig)] = driver.SignalName(sig)
	p.mu.Unlock()
}

// Signal sends sig to the process group.
func (p *process) Signal(sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("unsupported signal %v", sig)
	}
	select {
	case <-p.done:
		return errors.New("process already finished")
	default:
	}
	p.noteSignal(s)
	ctx, cancel := context.WithTimeout(p.sb.d.ctx, 30*time.Second)
	defer cancel()
	return p.sb.d.stream(ctx, p.sb.pod, signalArgv(driver.SignalName(s), p.run), streamOptions{})
}

// signalArgv signals the process group in the run file (waiting a while
// for the file: the exec may not have written it yet).
func signalArgv(sig, run string) []string {
	return toolArgv(sandboxtool.CommandSignal, sandboxtool.SignalRequest{Signal: sig, RunFile: run})
}

// kill ends the process group (the caller's context ended); the stream
// is cut when the pod cannot be reached.
func (p *process) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		p.cancelStream()
		return
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cancelStream()
	}
}

// Wait returns how the process ended. A code above 128 is reported as the
// signal 128+n when this driver sent that signal (through the API server
// a process killed by a signal and one that exits 128+n look the same).
func (p *process) Wait() (driver.ExitStatus, error) {
	<-p.done
	code, err := exitCode(p.err)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		// A stream cut by a kill this driver sent (cancel, Destroy): the
		// process is gone with its pod or group.
		if name, killed := p.sent[128+int(syscall.SIGKILL)]; killed {
			return driver.ExitStatus{Code: -1, Signal: name}, nil
		}
		return driver.ExitStatus{}, err
	}
	if name, ok := p.sent[code]; ok {
		return driver.ExitStatus{Code: -1, Signal: name}, nil
	}
	return driver.ExitStatus{Code: code}, nil
}

// run1 runs a command to completion, collecting its output (at most 1 MiB
// of each stream is kept).
func (sb *Sandbox) run1(ctx context.Context, argv []string, stdin io.Reader, dir string) (string, string, int, error) {
	var out, errOut limitedBuffer
	req := driver.ExecRequest{Argv: argv, Stdin: stdin, Stdout: &out, Stderr: &errOut}
	if dir == "" {
		d, err := sb.resolve("")
		if err != nil {
			return "", "", 0, err
		}
		dir = d
	}
	p, err := sb.start(ctx, req, dir)
	if err != nil {
		return "", "", 0, err
	}
	st, err := p.Wait()
	if err != nil {
		return "", "", 0, err
	}
	if st.Signal != "" {
		return out.String(), errOut.String(), 128, fmt.Errorf("%s: killed by %s", argv[0], st.Signal)
	}
	return out.String(), errOut.String(), st.Code, nil
}

// prepare fills a ready pod: the work tree and home, the clone at the
// base ref, setup, and the tool's protocol version.
func (sb *Sandbox) prepare(ctx context.Context) error {
	info := sb.Info()
	out, errOut, code, err := sb.run1(ctx, []string{"hangar-sandbox", sandboxtool.CommandVersion}, nil, "/")
	if err != nil {
		return fmt.Errorf("hangar-sandbox in pod %s: %w", sb.pod, err)
	}
	if code != 0 {
		return fmt.Errorf("hangar-sandbox in pod %s exited %d: %s", sb.pod, code, strings.TrimSpace(errOut))
	}
	var v sandboxtool.VersionResponse
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return fmt.Errorf("hangar-sandbox %s in pod %s: %w", sandboxtool.CommandVersion, sb.pod, err)
	}
	sb.mu.Lock()
	sb.toolVersion = v.Protocol
	sb.mu.Unlock()
	commit, err := sb.clone(ctx, info)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	sb.baseCommit = commit
	sb.mu.Unlock()
	for _, cmd := range sb.spec.Setup {
		out, errOut, code, err := sb.run1(ctx, []string{"sh", "-c", cmd}, nil, "")
		if err != nil {
			return fmt.Errorf("setup %q: %w", cmd, err)
		}
		if code != 0 {
			return fmt.Errorf("setup %q exited %d: %s", cmd, code, strings.TrimSpace(out+errOut))
		}
	}
	return nil
}

// clone makes the work tree and home and clones into the work tree: from
// a bundle when the repository is a path on this service's machine (the
// pod cannot see it), else from the URL; then checks out the base ref
// detached.
func (sb *Sandbox) clone(ctx context.Context, info driver.Info) (string, error) {
	repo := sb.spec.Repository
	if repo == "" {
		return "", errors.New("repository is required")
	}
	ref := sb.spec.BaseRef
	if ref == "" {
		ref = "HEAD"
	}
	var bundleFile io.Reader = strings.NewReader("")
	bundled := false
	if st, err := os.Stat(repo); err == nil && st.IsDir() {
		// A local repository reaches the pod as a bundle of every ref.
		b, err := bundle(ctx, repo)
		if err != nil {
			return "", err
		}
		defer os.Remove(b)
		f, err := os.Open(b)
		if err != nil {
			return "", err
		}
		defer f.Close()
		bundleFile, bundled = f, true
	}
	line, err := sandboxtool.Request(sandboxtool.CloneRequest{Repository: repo, Ref: ref, WorkDir: info.WorkDir, HomeDir: info.HomeDir, Bundled: bundled})
	if err != nil {
		return "", err
	}
	stdin := io.MultiReader(bytes.NewReader(line), bundleFile)
	out, errOut, code, err := sb.run1(ctx, []string{toolBin, sandboxtool.CommandClone}, stdin, "/")
	if err != nil {
		return "", fmt.Errorf("clone %s in pod %s: %w", repo, sb.pod, err)
	}
	if code != 0 {
		return "", fmt.Errorf("clone %s at %q in pod %s: exit %d: %s", repo, ref, sb.pod, code, sandboxtool.FailureOf([]byte(errOut)))
	}
	var resp sandboxtool.CloneResponse
	if err := json.Unmarshal([]byte(out), &resp); err != nil || resp.Commit == "" {
		return "", fmt.Errorf("clone %s in pod %s: unexpected answer %q", repo, sb.pod, strings.TrimSpace(out))
	}
	return resp.Commit, nil
}

// bundle writes a bundle of every ref of the local repository (and its
// HEAD) to a temporary file.
func bundle(ctx context.Context, repo string) (string, error) {
	f, err := os.CreateTemp("", "hangar-bundle-*")
	if err != nil {
		return "", err
	}
	f.Close()
	cmd := exec.CommandContext(ctx, "git", "-C", repo, "bundle", "create", "--quiet", f.Name(), "--all")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("git bundle of %s: %w: %s", repo, err, strings.TrimSpace(errb.String()))
	}
	return f.Name(), nil
}

// Annotations recording what prepare found, so a replica that claims the
// pod knows it.
const (
	AnnotationBaseCommit  = "hangar.dev/base-commit"
	AnnotationToolVersion = "hangar.dev/tool-version"
	AnnotationEgress      = "hangar.dev/egress"
	AnnotationImage       = "hangar.dev/image"
)

// record writes what prepare found into the pod's annotations.
func (sb *Sandbox) record(ctx context.Context) error {
	sb.mu.Lock()
	pod := sb.podObj.DeepCopy()
	commit, tv := sb.baseCommit, sb.toolVersion
	sb.mu.Unlock()
	pod.Annotations[AnnotationBaseCommit] = commit
	pod.Annotations[AnnotationToolVersion] = strconv.Itoa(tv)
	updated, err := sb.d.client.CoreV1().Pods(sb.d.opts.Namespace).Update(ctx, pod, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("record pod %s: %w", sb.pod, sb.d.mapErr(err))
	}
	sb.setPod(updated)
	return nil
}

// ClaimWarm takes a ready warm pod of pool (made by any replica) for this
// one, relocated to workKey (or left at its key when empty): nil when
// there is none. Of replicas racing for one pod, one claim wins; the
// others go on to the next pod.
func (d *Driver) ClaimWarm(ctx context.Context, pool, workKey string) (driver.Sandbox, error) {
	if pool == "" {
		return nil, nil
	}
	list, err := d.client.CoreV1().Pods(d.opts.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + managedBy +
		"," + LabelState + "=" + StateWarm + "," + LabelPool + "=" + labelValue(pool)})
	if err != nil {
		return nil, fmt.Errorf("list warm pods in %s: %w", d.opts.Namespace, d.mapErr(err))
	}
	for i := range list.Items {
		pod := &list.Items[i]
		if pod.DeletionTimestamp != nil {
			continue
		}
		if ready, _ := podStarted(pod); !ready {
			continue
		}
		sb := d.adopt(pod)
		d.mu.Lock()
		if _, taken := d.live[sb.pod]; taken {
			d.mu.Unlock()
			continue
		}
		d.live[sb.pod] = sb
		d.keys[sb.key] = sb.pod
		d.mu.Unlock()
		key := workKey
		if key == "" {
			key = sb.key
		}
		if err := sb.Relocate(ctx, key); err != nil {
			if sb.claimedHere() {
				// Claimed, then not moved: ours, and broken.
				_ = sb.Destroy(context.WithoutCancel(ctx))
			} else {
				d.release(sb)
			}
			if errors.Is(err, driver.ErrInUse) || errors.Is(err, driver.ErrDestroyed) {
				continue
			}
			return nil, err
		}
		return sb, nil
	}
	return nil, nil
}

// adopt makes a Sandbox of a pod another replica prepared.
func (d *Driver) adopt(pod *corev1.Pod) *Sandbox {
	a := pod.Annotations
	spec := driver.Spec{ID: a[AnnotationID], Environment: a[AnnotationEnv], Image: a[AnnotationImage]}
	if a[AnnotationEgress] == "none" {
		spec.Egress = driver.EgressNone
	}
	sb := newSandbox(d, spec, pod.Name, a[AnnotationWorkKey])
	sb.podObj = pod.DeepCopy()
	sb.baseCommit = a[AnnotationBaseCommit]
	sb.toolVersion, _ = strconv.Atoi(a[AnnotationToolVersion])
	sb.createdAt = pod.CreationTimestamp.Time
	return sb
}

// Relocate moves an idle warm sandbox to workKey's directory and claims
// its pod (ErrInUse when another replica claimed it first).
func (sb *Sandbox) Relocate(ctx context.Context, workKey string) error {
	if !driver.ValidKey(workKey) {
		return fmt.Errorf("work key %q: letters, digits, '.', '_' and '-' only", workKey)
	}
	d := sb.d
	sb.mu.Lock()
	old := sb.key
	sb.mu.Unlock()
	if old == workKey {
		return sb.Claim(ctx)
	}
	d.mu.Lock()
	if _, taken := d.keys[workKey]; taken {
		d.mu.Unlock()
		return fmt.Errorf("%w: %s", driver.ErrInUse, workKey)
	}
	d.keys[workKey] = sb.pod
	d.mu.Unlock()
	undo := func() {
		d.mu.Lock()
		if d.keys[workKey] == sb.pod {
			delete(d.keys, workKey)
		}
		d.mu.Unlock()
	}
	if err := sb.claim(ctx, workKey); err != nil {
		undo()
		return err
	}
	_, errOut, code, err := sb.run1(ctx, []string{"mv", "-T", path.Join(SandboxesDir, old), path.Join(SandboxesDir, workKey)}, nil, "/")
	if err == nil && code != 0 {
		err = fmt.Errorf("mv exited %d: %s", code, strings.TrimSpace(errOut))
	}
	if err != nil {
		undo()
		return fmt.Errorf("relocate %s to %s: %w", sb.pod, workKey, err)
	}
	d.mu.Lock()
	if d.keys[old] == sb.pod {
		delete(d.keys, old)
	}
	d.mu.Unlock()
	sb.mu.Lock()
	sb.key = workKey
	sb.mu.Unlock()
	return nil
}

// Claim takes a warm pod for this replica: a label update carrying the
// resourceVersion last read, so of two replicas claiming one pod one
// wins; the other gets ErrInUse.
func (sb *Sandbox) Claim(ctx context.Context) error {
	sb.mu.Lock()
	key := sb.key
	sb.mu.Unlock()
	return sb.claim(ctx, key)
}

func (sb *Sandbox) claim(ctx context.Context, workKey string) error {
	sb.mu.Lock()
	pod := sb.podObj.DeepCopy()
	sb.mu.Unlock()
	if pod == nil {
		return fmt.Errorf("%w: pod %s not started", driver.ErrDestroyed, sb.pod)
	}
	pods := sb.d.client.CoreV1().Pods(sb.d.opts.Namespace)
	// A conflict is another replica's claim, or only the kubelet's status
	// update since the pod was read: read it again and claim it while it
	// is still warm.
	for attempt := 0; ; attempt++ {
		// A pod this replica holds already (made for a lease, not warm)
		// moves to another work key by the same label update.
		moving := pod.Labels[LabelState] == StateClaimed && pod.Labels[LabelOwner] == sb.d.opts.Replica &&
			pod.Annotations[AnnotationWorkKey] != workKey
		if (pod.Labels[LabelState] != StateWarm && !moving) || pod.DeletionTimestamp != nil {
			if pod.Labels[LabelOwner] != sb.d.opts.Replica || pod.DeletionTimestamp != nil {
				sb.loseClaim()
			}
			return fmt.Errorf("%w: pod %s was claimed by replica %s", driver.ErrInUse, sb.pod, pod.Labels[LabelOwner])
		}
		pod.Labels[LabelState] = StateClaimed
		pod.Labels[LabelOwner] = sb.d.opts.Replica
		pod.Labels[LabelWorkKey] = workKeyHash(workKey)
		delete(pod.Labels, LabelPool)
		pod.Annotations[AnnotationWorkKey] = workKey
		updated, err := pods.Update(ctx, pod, metav1.UpdateOptions{})
		switch {
		case apierrors.IsConflict(err) && attempt < 5:
			if pod, err = pods.Get(ctx, sb.pod, metav1.GetOptions{}); err != nil {
				if apierrors.IsNotFound(err) {
					return fmt.Errorf("%w: pod %s is gone", driver.ErrDestroyed, sb.pod)
				}
				return fmt.Errorf("claim pod %s: %w", sb.pod, sb.d.mapErr(err))
			}
			continue
		case apierrors.IsConflict(err):
			return fmt.Errorf("%w: pod %s keeps changing under its claim", driver.ErrInUse, sb.pod)
		case apierrors.IsNotFound(err):
			return fmt.Errorf("%w: pod %s is gone", driver.ErrDestroyed, sb.pod)
		case err != nil:
			return fmt.Errorf("claim pod %s: %w", sb.pod, sb.d.mapErr(err))
		}
		sb.setPod(updated)
		return nil
	}
}

// claimedHere says whether the pod, as last read, is claimed by this
// replica.
func (sb *Sandbox) claimedHere() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.podObj != nil && sb.podObj.Labels[LabelState] == StateClaimed && sb.podObj.Labels[LabelOwner] == sb.d.opts.Replica
}

// loseClaim records that another replica claimed the pod first: it is
// that replica's now, so Destroy here only forgets it.
func (sb *Sandbox) loseClaim() {
	sb.mu.Lock()
	sb.lost = true
	sb.mu.Unlock()
}

// KillProcesses ends every process in the pod but its pid 1 (whatever
// they started, detached or not); the sandbox stays usable.
func (sb *Sandbox) KillProcesses(ctx context.Context) error {
	if err := sb.begin(); err != nil {
		return err
	}
	defer sb.end()
	// kill -1 signals every process the caller may, save init and itself.
	err := sb.d.stream(ctx, sb.pod, []string{toolBin, sandboxtool.CommandKillAll}, streamOptions{})
	if _, cerr := exitCode(err); cerr != nil {
		return fmt.Errorf("kill the processes of pod %s: %w", sb.pod, cerr)
	}
	return nil
}

// Destroy runs the hooks while the pod is whole, then deletes it (and its
// NetworkPolicy) and ends its execs.
func (sb *Sandbox) Destroy(ctx context.Context, hooks ...driver.DestroyHook) error {
	sb.mu.Lock()
	if sb.destroyed {
		sb.mu.Unlock()
		return nil
	}
	if sb.lost {
		// Another replica's pod now: not ours to hook or delete.
		sb.destroyed = true
		sb.mu.Unlock()
		sb.d.release(sb)
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
	sb.destroyed = true
	execs := make([]*process, 0, len(sb.execs))
	for p := range sb.execs {
		execs = append(execs, p)
	}
	sb.mu.Unlock()
	delCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := sb.d.deletePod(delCtx, sb.pod, 0); err != nil {
		errs = append(errs, err)
	}
	for _, p := range execs {
		// The pod's deletion ends them; a stream the API server keeps open
		// is cut after a while.
		p.noteSignal(syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cancelStream()
		}
	}
	sb.d.release(sb)
	return errors.Join(errs...)
}

// limitedBuffer keeps the first MiB written.
type limitedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := 1<<20 - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var _ = filepath.Join
