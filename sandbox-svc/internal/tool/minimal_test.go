package tool_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/api/sandboxtool/tooltest"
)

// sandbox is a work tree and a home, run with a PATH of only the tool and
// git: what the session service does in a sandbox needs nothing else.
type sandbox struct {
	t          *testing.T
	work, home string
	path       string
}

func newSandbox(t *testing.T) *sandbox {
	root := t.TempDir()
	sb := &sandbox{t: t, work: filepath.Join(root, "work"), home: filepath.Join(root, "home"), path: tooltest.MinimalPATH(t)}
	os.MkdirAll(sb.home, 0o755)
	sb.git("init", "-q", "-b", "main", sb.work)
	os.WriteFile(filepath.Join(sb.work, "README.md"), []byte("hello\n"), 0o644)
	sb.git("-C", sb.work, "add", "-A")
	sb.git("-C", sb.work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
	return sb
}

func (sb *sandbox) env() []string {
	return []string{"PATH=" + sb.path, "HOME=" + sb.home, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=" + filepath.Join(sb.home, ".gitconfig")}
}

// git runs the host's git for the test's own setup and checks.
func (sb *sandbox) git(args ...string) string {
	sb.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.CombinedOutput()
	if err != nil {
		sb.t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// run runs argv in the sandbox (argv[0] looked up on its PATH alone).
func (sb *sandbox) run(stdin []byte, argv ...string) (int, []byte, string) {
	sb.t.Helper()
	var bin string
	for _, dir := range filepath.SplitList(sb.path) {
		if _, err := os.Stat(filepath.Join(dir, argv[0])); err == nil {
			bin = filepath.Join(dir, argv[0])
			break
		}
	}
	if bin == "" {
		sb.t.Fatalf("%s is not on the sandbox's PATH", argv[0])
	}
	cmd := exec.Command(bin, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Dir, cmd.Env, cmd.Stdin = sb.work, sb.env(), bytes.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		sb.t.Fatal(err)
	}
	return code, out.Bytes(), errOut.String()
}

func (sb *sandbox) tool(command string, req any, resp any) []byte {
	sb.t.Helper()
	line, err := sandboxtool.Request(req)
	if err != nil {
		sb.t.Fatal(err)
	}
	code, out, errOut := sb.run(line, sandboxtool.Binary, command)
	if code != 0 {
		sb.t.Fatalf("%s: exit %d: %s", command, code, errOut)
	}
	if resp != nil {
		if err := json.Unmarshal(out, resp); err != nil {
			sb.t.Fatalf("%s: %v in %q", command, err, out)
		}
	}
	return out
}

// A session's boot, work, fork copy and --from-local, and the agent's
// tool, with nothing on PATH but hangar-sandbox and git.
func TestSessionWorkWithOnlyGit(t *testing.T) {
	sb := newSandbox(t)
	base := sb.git("-C", sb.work, "rev-parse", "HEAD")
	sb.tool(sandboxtool.CommandInitWork, sandboxtool.InitWorkRequest{WorkDir: sb.work, Branch: "hangar/s1"}, nil)
	if got := sb.git("-C", sb.work, "config", "user.name"); got != "hangar" {
		t.Errorf("identity: %q", got)
	}
	// Work: a commit, an edit, an untracked file.
	os.WriteFile(filepath.Join(sb.work, "a.txt"), []byte("a\n"), 0o644)
	sb.git("-C", sb.work, "add", "a.txt")
	sb.git("-C", sb.work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
	os.WriteFile(filepath.Join(sb.work, "README.md"), []byte("edited\n"), 0o644)
	os.WriteFile(filepath.Join(sb.work, "new.txt"), []byte("new\n"), 0o644)
	var hr sandboxtool.HeadResponse
	sb.tool(sandboxtool.CommandHead, sandboxtool.HeadRequest{WorkDir: sb.work}, &hr)
	if hr.Branch != "hangar/s1" || hr.Head != sb.git("-C", sb.work, "rev-parse", "HEAD") {
		t.Errorf("head: %+v", hr)
	}
	bundle := sb.tool(sandboxtool.CommandWorkBundle, sandboxtool.WorkBundleRequest{WorkDir: sb.work, Base: base, Rev: "refs/heads/hangar/s1"}, nil)
	if len(bundle) == 0 {
		t.Error("no bundle of the branch's commit")
	}
	diff := sb.tool(sandboxtool.CommandWorkDiff, sandboxtool.WorkDiffRequest{WorkDir: sb.work, Against: "HEAD"}, nil)
	if !bytes.Contains(diff, []byte("+edited")) || !bytes.Contains(diff, []byte("new.txt")) {
		t.Errorf("work diff: %s", diff)
	}
	if st := sb.git("-C", sb.work, "status", "--porcelain"); !strings.Contains(st, "?? new.txt") {
		t.Errorf("work-diff touched the index: %q", st)
	}
	if none := sb.tool(sandboxtool.CommandWorkBundle, sandboxtool.WorkBundleRequest{WorkDir: sb.work, Base: "HEAD", Rev: "HEAD"}, nil); len(none) != 0 {
		t.Errorf("bundle with no commits: %d bytes", len(none))
	}

	// --from-local into a fresh clone: the bundle, the diff, an untracked file.
	local := newSandbox(t)
	local.work = filepath.Join(t.TempDir(), "clone")
	local.git("clone", "-q", sb.work, local.work)
	local.git("-C", local.work, "checkout", "-q", "--detach", base)
	dir := filepath.Join(local.home, ".hangar", "from-local")
	os.MkdirAll(dir, 0o700)
	// The CLI's bundle is base..HEAD.
	headBundle := sb.tool(sandboxtool.CommandWorkBundle, sandboxtool.WorkBundleRequest{WorkDir: sb.work, Base: base, Rev: "HEAD"}, nil)
	os.WriteFile(filepath.Join(dir, "bundle"), headBundle, 0o600)
	os.WriteFile(filepath.Join(dir, "diff"), diff, 0o600)
	sb.tool(sandboxtool.CommandFromLocal, sandboxtool.FromLocalRequest{WorkDir: local.work, Dir: dir, Branch: "hangar/s2", Base: base}, nil)
	if b, _ := os.ReadFile(filepath.Join(local.work, "new.txt")); string(b) != "new\n" {
		t.Errorf("from-local new.txt: %q", b)
	}
	if got, want := local.git("-C", local.work, "rev-parse", "HEAD"), hr.Head; got != want {
		t.Errorf("from-local HEAD %s, want %s", got, want)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("from-local left %s: %v", dir, err)
	}
	line, _ := sandboxtool.Request(sandboxtool.FromLocalRequest{WorkDir: local.work, Dir: dir, Branch: "x", Base: strings.Repeat("9", 40)})
	if code, _, errOut := local.run(line, sandboxtool.Binary, sandboxtool.CommandFromLocal); code != sandboxtool.ExitBaseMissing {
		t.Errorf("from-local with a base the repository lacks: %d %s", code, errOut)
	}

	// A fork's copy: rename the branch, move a conversation directory,
	// verify the tree.
	var th sandboxtool.TreeHashResponse
	sb.tool(sandboxtool.CommandTreeHash, sandboxtool.TreeHashRequest{WorkDir: sb.work}, &th)
	conv := filepath.Join(sb.home, ".claude", "projects", "old")
	os.MkdirAll(conv, 0o755)
	os.WriteFile(filepath.Join(conv, "c.jsonl"), []byte("{}\n"), 0o644)
	moved := filepath.Join(sb.home, ".claude", "projects", "new")
	var cr sandboxtool.CopyPrepareResponse
	sb.tool(sandboxtool.CommandCopyPrepare, sandboxtool.CopyPrepareRequest{WorkDir: sb.work, FromBranch: "hangar/s1", ToBranch: "hangar/s3",
		Moves: []sandboxtool.Move{{From: conv, To: moved}, {From: filepath.Join(sb.home, "gone"), To: filepath.Join(sb.home, "x")}}, Verify: true}, &cr)
	if cr.Tree != th.Tree || sb.git("-C", sb.work, "symbolic-ref", "--short", "HEAD") != "hangar/s3" {
		t.Errorf("copy-prepare: tree %s (want %s), branch %s", cr.Tree, th.Tree, sb.git("-C", sb.work, "symbolic-ref", "--short", "HEAD"))
	}
	if _, err := os.Stat(filepath.Join(moved, "c.jsonl")); err != nil {
		t.Errorf("moved conversation: %v", err)
	}

	// The agent's tool, by the name the agent calls it.
	if code, out, errOut := sb.run(nil, sandboxtool.AgentBinary, "ask", "which db?"); code != 0 || !strings.Contains(string(out), "recorded") {
		t.Errorf("hangar-agent ask: %d %s %s", code, out, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(sb.home, ".hangar-agent", "question")); string(b) != "which db?" {
		t.Errorf("question: %q", b)
	}
	if code, _, errOut := sb.run(nil, sandboxtool.AgentBinary, "artifact", "README.md"); code != 0 {
		t.Errorf("hangar-agent artifact: %d %s", code, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(sb.home, ".hangar-agent", "artifacts", "README.md")); string(b) != "edited\n" {
		t.Errorf("artifact: %q", b)
	}
}
