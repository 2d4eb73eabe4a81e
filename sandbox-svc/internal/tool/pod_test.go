package tool_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hangar-dev/hangar/api/sandboxtool"
)

// argv is the command line of one of the tool's argv commands.
func argv(t *testing.T, command string, req any) []string {
	t.Helper()
	a, err := sandboxtool.ArgvRequest(sandboxtool.Binary, command, req)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// toolCode runs a stdin command and returns its exit code, output and
// the failure's reason.
func (sb *sandbox) toolCode(command string, req any, input []byte) (int, []byte, string) {
	sb.t.Helper()
	line, err := sandboxtool.Request(req)
	if err != nil {
		sb.t.Fatal(err)
	}
	code, out, errOut := sb.run(append(line, input...), sandboxtool.Binary, command)
	reason := ""
	if code != 0 {
		reason = sandboxtool.FailureOf([]byte(errOut))
	}
	return code, out, reason
}

// waitFor waits, with a deadline, until ok.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-time.After(10 * time.Millisecond)
	}
}

// A pod's clone, with nothing on PATH but the tool and git: from a bundle
// (a repository the pod cannot see) and from a URL, and a missing ref.
func TestCloneWithOnlyGit(t *testing.T) {
	sb := newSandbox(t)
	head := sb.git("-C", sb.work, "rev-parse", "HEAD")
	bundle := filepath.Join(t.TempDir(), "repo.bundle")
	sb.git("-C", sb.work, "bundle", "create", "-q", bundle, "--all")
	data, err := os.ReadFile(bundle)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	work, home := filepath.Join(root, "work"), filepath.Join(root, "home")
	var resp sandboxtool.CloneResponse
	code, out, reason := sb.toolCode(sandboxtool.CommandClone, sandboxtool.CloneRequest{Repository: "/elsewhere/repo", Ref: "main", WorkDir: work, HomeDir: home, Bundled: true}, data)
	if code != 0 || json.Unmarshal(out, &resp) != nil || resp.Commit != head {
		t.Fatalf("bundled clone: %d %q %s", code, out, reason)
	}
	if got := sb.git("-C", work, "remote", "get-url", "origin"); got != "/elsewhere/repo" {
		t.Errorf("origin %q", got)
	}
	if b, err := os.ReadFile(filepath.Join(work, "README.md")); err != nil || string(b) != "hello\n" {
		t.Errorf("work tree: %q %v", b, err)
	}
	if st, err := os.Stat(home); err != nil || !st.IsDir() {
		t.Errorf("home not made: %v", err)
	}
	if _, err := os.Stat(work + ".new"); !os.IsNotExist(err) {
		t.Errorf("the clone's temporary directory is left: %v", err)
	}

	work2 := filepath.Join(t.TempDir(), "work")
	code, out, reason = sb.toolCode(sandboxtool.CommandClone, sandboxtool.CloneRequest{Repository: sb.work, Ref: head, WorkDir: work2}, nil)
	if code != 0 || json.Unmarshal(out, &resp) != nil || resp.Commit != head {
		t.Fatalf("clone by URL at a commit: %d %q %s", code, out, reason)
	}

	code, _, reason = sb.toolCode(sandboxtool.CommandClone, sandboxtool.CloneRequest{Repository: sb.work, Ref: "no-such-branch", WorkDir: filepath.Join(t.TempDir(), "work")}, nil)
	if code != sandboxtool.ExitBaseMissing || !strings.Contains(reason, "base ref no-such-branch not found") {
		t.Errorf("missing ref: %d %q", code, reason)
	}
	code, _, reason = sb.toolCode(sandboxtool.CommandClone, sandboxtool.CloneRequest{Repository: sb.work, Ref: "main", WorkDir: sb.work}, nil)
	if code == 0 || !strings.Contains(reason, "not empty") {
		t.Errorf("clone into a full work tree: %d %q", code, reason)
	}
}

// Exec passes the command's status through, gives it exactly the
// environment asked for, and says 126/127 as a shell would.
func TestExecWithOnlyGit(t *testing.T) {
	sb := newSandbox(t)
	run := filepath.Join(t.TempDir(), "exec-1")
	env := []string{"PATH=" + sb.path, "HOME=" + sb.home, "GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=hangar.t", "GIT_CONFIG_VALUE_0=asked"}
	code, out, errOut := sb.run(nil, argv(t, sandboxtool.CommandExec, sandboxtool.ExecRequest{RunFile: run, Dir: sb.work, Env: env, Argv: []string{"git", "config", "--get", "hangar.t"}})...)
	if code != 0 || strings.TrimSpace(string(out)) != "asked" {
		t.Fatalf("exec: %d %q %q", code, out, errOut)
	}
	if _, err := os.Stat(run); !os.IsNotExist(err) {
		t.Errorf("run file left after the command ended: %v", err)
	}
	// The tool's own environment (sb.env's GIT_CONFIG_GLOBAL) is not the
	// command's: rev-parse runs in Dir and git sees no global config.
	code, out, _ = sb.run(nil, argv(t, sandboxtool.CommandExec, sandboxtool.ExecRequest{RunFile: run, Dir: sb.work, Env: []string{"PATH=" + sb.path}, Argv: []string{"git", "rev-parse", "--show-toplevel"}})...)
	if code != 0 || strings.TrimSpace(string(out)) != sb.work {
		t.Errorf("dir: %d %q", code, out)
	}
	code, _, _ = sb.run(nil, argv(t, sandboxtool.CommandExec, sandboxtool.ExecRequest{RunFile: run, Dir: sb.work, Env: env, Argv: []string{"git", "rev-parse", "--verify", "no-such-ref"}})...)
	if code != 128 {
		t.Errorf("the command's own status: %d", code)
	}
	code, _, errOut = sb.run(nil, argv(t, sandboxtool.CommandExec, sandboxtool.ExecRequest{RunFile: run, Dir: filepath.Join(sb.work, "gone"), Env: env, Argv: []string{"git", "status"}})...)
	if code != 126 || !strings.Contains(errOut, "no such directory") {
		t.Errorf("missing dir: %d %q", code, errOut)
	}
	code, _, errOut = sb.run(nil, argv(t, sandboxtool.CommandExec, sandboxtool.ExecRequest{RunFile: run, Dir: sb.work, Env: env, Argv: []string{"bash", "-c", "true"}})...)
	if code != 127 || !strings.Contains(errOut, "bash: command not found") {
		t.Errorf("missing command: %d %q", code, errOut)
	}
	code, _, _ = sb.run(nil, sandboxtool.Binary, sandboxtool.CommandExec, `{"version":99,"args":{}}`)
	if code != sandboxtool.ExitVersion {
		t.Errorf("foreign protocol: %d", code)
	}
}

// The command runs in a session of its own whose id is in the run file;
// signal reaches that process group, and the exec ends 128+n.
func TestExecSignal(t *testing.T) {
	sb := newSandbox(t)
	run := filepath.Join(t.TempDir(), "exec-1")
	// cat-file --batch waits on its stdin, which stays open.
	a := argv(t, sandboxtool.CommandExec, sandboxtool.ExecRequest{RunFile: run, Dir: sb.work, Env: []string{"PATH=" + sb.path}, Argv: []string{"git", "cat-file", "--batch"}})
	bin := filepath.Join(strings.Split(sb.path, ":")[0], sandboxtool.Binary)
	cmd := exec.Command(bin, a[1:]...)
	cmd.Env = sb.env()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	waitFor(t, "the run file", func() bool {
		b, _ := os.ReadFile(run)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return pid > 0
	})
	if pgid, err := syscall.Getpgid(pid); err != nil || pgid != pid {
		t.Errorf("the command leads no process group of its own: pgid %d %v", pgid, err)
	}
	if code, _, errOut := sb.run(nil, argv(t, sandboxtool.CommandSignal, sandboxtool.SignalRequest{Signal: "TERM", RunFile: run})...); code != 0 {
		t.Fatalf("signal: %d %q", code, errOut)
	}
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 128+int(syscall.SIGTERM) {
		t.Errorf("exec after TERM: %v", err)
	}
	// A run file that never comes: nothing to signal, after the wait.
	if code, _, _ := sb.run(nil, argv(t, sandboxtool.CommandSignal, sandboxtool.SignalRequest{Signal: "NOPE", RunFile: run})...); code != sandboxtool.ExitUsage {
		t.Errorf("unknown signal: %d", code)
	}
}

// A terminal's exec becomes its command, its pid in the run file.
func TestExecReplace(t *testing.T) {
	sb := newSandbox(t)
	run := filepath.Join(t.TempDir(), "term-1")
	code, out, errOut := sb.run(nil, argv(t, sandboxtool.CommandExec, sandboxtool.ExecRequest{RunFile: run, Dir: filepath.Join(sb.work, "gone"), Env: []string{"PATH=" + sb.path}, Argv: []string{"git", "--version"}, Replace: true})...)
	if code != 0 || !strings.HasPrefix(string(out), "git version") {
		t.Fatalf("replace: %d %q %q", code, out, errOut)
	}
	if b, err := os.ReadFile(run); err != nil || strings.TrimSpace(string(b)) == "" {
		t.Errorf("run file: %q %v", b, err)
	}
}

// Install copies the tool with the agent's name beside it; hold makes
// the run directory and outlives a TERM.
func TestInstallAndHold(t *testing.T) {
	sb := newSandbox(t)
	dir := filepath.Join(t.TempDir(), "bin")
	if code, _, errOut := sb.run(nil, argv(t, sandboxtool.CommandInstall, sandboxtool.InstallRequest{Dir: dir})...); code != 0 {
		t.Fatalf("install: %d %q", code, errOut)
	}
	if st, err := os.Stat(filepath.Join(dir, sandboxtool.Binary)); err != nil || st.Mode().Perm()&0o111 == 0 {
		t.Fatalf("installed tool: %v", err)
	}
	if l, err := os.Readlink(filepath.Join(dir, sandboxtool.AgentBinary)); err != nil || l != sandboxtool.Binary {
		t.Errorf("agent link: %q %v", l, err)
	}
	runDir := filepath.Join(t.TempDir(), "run")
	a := argv(t, sandboxtool.CommandHold, sandboxtool.HoldRequest{RunDir: runDir})
	cmd := exec.Command(filepath.Join(dir, sandboxtool.Binary), a[1:]...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer cmd.Process.Kill()
	waitFor(t, "the run directory", func() bool { _, err := os.Stat(runDir); return err == nil })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// It is still there after TERM: KILL is what ends it (the lines after
	// TERM can't tell "ignored" from "not delivered yet", so KILL's
	// status proves it was alive to receive it).
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	err := <-exited
	if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("hold ended by %v, not KILL", err)
	}
}

// File access resolves links in the sandbox and refuses what leaves the
// root, as the local driver's os.Root does.
func TestFileWithOnlyGit(t *testing.T) {
	sb := newSandbox(t)
	root := filepath.Dir(sb.work)
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("no"), 0o644)
	os.Symlink(outside, filepath.Join(sb.work, "out"))
	os.Symlink("README.md", filepath.Join(sb.work, "readme-link"))
	os.Mkdir(filepath.Join(sb.work, "dir"), 0o755)
	odd := "caf\xe9.txt" // not UTF-8
	os.WriteFile(filepath.Join(sb.work, odd), []byte("x"), 0o600)
	file := func(req sandboxtool.FileRequest, input []byte) (int, sandboxtool.FileResponse, []byte) {
		t.Helper()
		req.Root = root
		code, out, _ := sb.toolCode(sandboxtool.CommandFile, req, input)
		var resp sandboxtool.FileResponse
		if code != 0 {
			return code, resp, nil
		}
		head, rest, _ := bytes.Cut(out, []byte("\n"))
		if err := json.Unmarshal(head, &resp); err != nil {
			t.Fatalf("%s: %v in %q", req.Op, err, out)
		}
		return code, resp, rest
	}
	at := func(p string) string { return filepath.Join(sb.work, p) }

	code, resp, content := file(sandboxtool.FileRequest{Op: sandboxtool.FileRead, Path: at("readme-link"), Limit: 100}, nil)
	if code != 0 || string(content) != "hello\n" || resp.File.Size != 6 {
		t.Errorf("read through a link inside: %d %+v %q", code, resp.File, content)
	}
	code, resp, _ = file(sandboxtool.FileRequest{Op: sandboxtool.FileStat, Path: at("readme-link")}, nil)
	if code != 0 || resp.File.Mode&syscall.S_IFMT != syscall.S_IFLNK || resp.File.Link != "README.md" {
		t.Errorf("stat keeps the final link: %d %+v", code, resp.File)
	}
	code, resp, _ = file(sandboxtool.FileRequest{Op: sandboxtool.FileStat, Path: root}, nil)
	if code != 0 || resp.File.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		t.Errorf("stat of the root: %d %+v", code, resp.File)
	}
	code, resp, _ = file(sandboxtool.FileRequest{Op: sandboxtool.FileWrite, Path: at("new/deep/f.sh"), Mode: 0o755}, []byte("#!/bin/sh\n"))
	if b, _ := os.ReadFile(at("new/deep/f.sh")); code != 0 || string(b) != "#!/bin/sh\n" || resp.File.Mode&0o777 != 0o755 {
		t.Errorf("write with parents: %d %+v %q", code, resp.File, b)
	}
	code, resp, _ = file(sandboxtool.FileRequest{Op: sandboxtool.FileWrite, Path: at("readme-link")}, []byte("through\n"))
	if b, _ := os.ReadFile(at("README.md")); code != 0 || string(b) != "through\n" {
		t.Errorf("write through a link inside: %d %q", code, b)
	}
	code, resp, _ = file(sandboxtool.FileRequest{Op: sandboxtool.FileList, Path: sb.work}, nil)
	names := map[string]bool{}
	for _, e := range resp.Entries {
		names[string(e.Name)] = true
	}
	if code != 0 || !names[odd] || !names[".git"] || !names["out"] || !names["dir"] {
		t.Errorf("list: %d %v", code, names)
	}
	for _, c := range []struct {
		name  string
		req   sandboxtool.FileRequest
		input []byte
		want  int
	}{
		{"read through a link out", sandboxtool.FileRequest{Op: sandboxtool.FileRead, Path: at("out/secret"), Limit: 100}, nil, sandboxtool.ExitOutside},
		{"stat under a link out", sandboxtool.FileRequest{Op: sandboxtool.FileStat, Path: at("out/secret")}, nil, sandboxtool.ExitOutside},
		{"write under a link out", sandboxtool.FileRequest{Op: sandboxtool.FileWrite, Path: at("out/planted")}, []byte("x"), sandboxtool.ExitOutside},
		{"list a link out", sandboxtool.FileRequest{Op: sandboxtool.FileList, Path: at("out")}, nil, sandboxtool.ExitOutside},
		{"dotdot", sandboxtool.FileRequest{Op: sandboxtool.FileRead, Path: at("../../etc/passwd"), Limit: 1 << 20}, nil, sandboxtool.ExitOutside},
		{"missing", sandboxtool.FileRequest{Op: sandboxtool.FileRead, Path: at("nope"), Limit: 100}, nil, sandboxtool.ExitNotFound},
		{"stat missing", sandboxtool.FileRequest{Op: sandboxtool.FileStat, Path: at("nope")}, nil, sandboxtool.ExitNotFound},
		{"read a dir", sandboxtool.FileRequest{Op: sandboxtool.FileRead, Path: at("dir"), Limit: 100}, nil, sandboxtool.ExitIsDir},
		{"write over a dir", sandboxtool.FileRequest{Op: sandboxtool.FileWrite, Path: at("dir")}, []byte("x"), sandboxtool.ExitIsDir},
		{"list a file", sandboxtool.FileRequest{Op: sandboxtool.FileList, Path: at("README.md")}, nil, sandboxtool.ExitNotDir},
		{"too large", sandboxtool.FileRequest{Op: sandboxtool.FileRead, Path: at("README.md"), Limit: 3}, nil, sandboxtool.ExitTooLarge},
		{"unknown op", sandboxtool.FileRequest{Op: "chmod", Path: at("README.md")}, nil, sandboxtool.ExitUsage},
	} {
		if code, _, _ := file(c.req, c.input); code != c.want {
			t.Errorf("%s: exit %d, want %d", c.name, code, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "planted")); !os.IsNotExist(err) {
		t.Errorf("a write left the root: %v", err)
	}
}
