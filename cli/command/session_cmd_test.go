package command_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/command"
)

// TestSessionBadInputIsOneLine checks what the CLI refuses before it calls
// the server, and that a server that is not there is one line too.
func TestSessionBadInputIsOneLine(t *testing.T) {
	t.Parallel()
	env := map[string]string{"HANGAR_URL": "http://127.0.0.1:1", "HANGAR_TOKEN": "t", "HANGAR_HOME": t.TempDir()}
	schema := filepath.Join(t.TempDir(), "schema.json")
	if err := os.WriteFile(schema, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"new without a name", []string{"session", "new"}, "usage: hangar session new NAME [MESSAGE]"},
		{"new with an empty name", []string{"session", "new", ""}, "NAME must not be empty"},
		{"new with too many arguments", []string{"session", "new", "a", "b", "c"}, "usage: hangar session new NAME [MESSAGE]"},
		{"unknown harness", []string{"session", "new", "a", "hi", "--harness", "gpt"}, `--harness "gpt": want claude, codex, pi or antigravity`},
		{"negative idle", []string{"session", "new", "a", "--idle", "-1"}, "--idle -1: want minutes"},
		{"idle not a number", []string{"session", "new", "a", "--idle", "soon"}, `invalid argument "soon" for "--idle"`},
		{"negative cost", []string{"session", "new", "a", "hi", "--max-cost", "-2"}, "--max-cost -2: want 0 or more USD"},
		{"negative tokens", []string{"session", "send", "a", "hi", "--max-tokens", "-5"}, "--max-tokens -5: want 0 or more"},
		{"negative minutes", []string{"session", "send", "a", "hi", "--max-minutes", "-5"}, "--max-minutes -5: want 0 or more"},
		{"wait without a message", []string{"session", "new", "a", "-w"}, "give a MESSAGE"},
		{"empty message", []string{"session", "new", "a", "  "}, "MESSAGE is empty"},
		{"missing file", []string{"session", "send", "a", "hi", "--file", "/nonexistent/x.txt"}, "--file /nonexistent/x.txt: no such file or directory"},
		{"empty text", []string{"session", "send", "a", "hi", "--text", ""}, "--text #1 is empty"},
		{"schema not JSON", []string{"session", "send", "a", "hi", "--schema", schema}, "not valid JSON"},
		{"bad approvals", []string{"session", "new", "a", "--approvals", "sometimes"}, `--approvals "sometimes": want never or ask`},
		{"send without a message", []string{"session", "send", "a"}, "usage: hangar session send NAME MESSAGE"},
		{"send with an empty message", []string{"session", "send", "a", ""}, "MESSAGE is empty"},
		{"keep without --idle", []string{"session", "keep", "a"}, "--idle MIN is required"},
		{"keep with negative idle", []string{"session", "keep", "a", "--idle", "-3"}, "--idle -3: want minutes"},
		{"get with a bad -o", []string{"session", "get", "a", "-o", "xml"}, `-o "xml": want table, json or yaml`},
		{"list with a bad state", []string{"session", "list", "--state", "sleeping"}, `--state "sleeping"`},
		{"list with arguments", []string{"session", "list", "x"}, `unknown command "x"`},
		{"events of a negative turn", []string{"session", "events", "a", "--turn", "-1"}, "--turn -1"},
		// Counts are parsed as the int32 the API takes: no wrap to a small
		// number (4294967297 was int32 1: one fork).
		{"fork -n past int32", []string{"session", "fork", "a", "-n", "4294967297"}, `invalid argument "4294967297" for "-n, --n" flag: want a whole number from 1 to 2147483647`},
		{"fork -n 0", []string{"session", "fork", "a", "-n", "0"}, `invalid argument "0" for "-n, --n" flag: want a whole number from 1 to 2147483647`},
		{"fork -n not a number", []string{"session", "fork", "a", "-n", "three"}, `invalid argument "three" for "-n, --n" flag`},
		{"best-of past int32", []string{"job", "run", "--session", "a", "--check", "true", "--best-of", "4294967298", "hi"}, `invalid argument "4294967298" for "--best-of" flag: want a whole number from 1 to 2147483647`},
		{"idle past int32", []string{"session", "keep", "a", "--idle", "4294967296"}, `invalid argument "4294967296" for "--idle" flag: want a whole number that fits in 32 bits`},
		{"max-minutes past int32", []string{"session", "send", "a", "hi", "--max-minutes", "2147483648"}, `invalid argument "2147483648" for "--max-minutes" flag`},
		{"turn past int32", []string{"session", "events", "a", "--turn", "4294967297"}, `invalid argument "4294967297" for "--turn" flag`},
		{"artifacts turn past int32", []string{"session", "artifacts", "a", "--turn", "4294967297"}, `invalid argument "4294967297" for "--turn" flag`},
		{"exec timeout past int32 seconds", []string{"sb", "exec", "sb-1", "--timeout", "1000000h", "--", "true"}, "--timeout 1000000h0m0s: want at most 596523h14m7s"},
		{"exec negative timeout", []string{"sb", "exec", "sb-1", "--timeout", "-1s", "--", "true"}, "--timeout -1s: want 0 or more"},
		{"artifacts --to without --get", []string{"session", "artifacts", "a", "--to", "x"}, "--to FILE goes with --get PATH"},
		{"allow and deny", []string{"session", "approvals", "a", "--allow", "x", "--deny", "y"}, "not both"},
		{"allow without an id", []string{"session", "approvals", "a", "--allow", ""}, "take an approval ID"},
		{"steer with nothing", []string{"session", "steer", "a", " "}, "MESSAGE is empty"},
		{"interrupt -w without a message", []string{"session", "interrupt", "a", "-w"}, "-w goes with a MESSAGE"},
		{"pull outside a checkout", []string{"session", "pull", "a", "-C", t.TempDir()}, "is not a git checkout"},
		{"no server", []string{"session", "get", "a"}, "is not running: start it with `hangar up`"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, env, tc.args...)
			if err == nil {
				t.Fatalf("hangar %q succeeded (%q), want an error containing %q", tc.args, out, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error = %q, want one line containing %q", err, tc.want)
			}
		})
	}
}

func TestSessionHelpListsEveryCommand(t *testing.T) {
	t.Parallel()
	out, err := run(t, nil, "session", "-h")
	if err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"new", "list", "send", "open", "keep", "suspend", "get", "archive", "events", "artifacts", "patch", "pull", "steer", "interrupt", "approvals"} {
		if !strings.Contains(out, "\n  "+sub+" ") {
			t.Errorf("session -h does not list %s:\n%s", sub, out)
		}
	}
	out, err = run(t, nil, "session", "new", "-h")
	if err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{"--environment", "--repo", "--harness", "--branch", "--idle", "--max-cost", "--max-tokens", "--max-minutes", "--file", "--text", "--schema", "--model", "--from-local", "--wait"} {
		if !strings.Contains(out, flag) {
			t.Errorf("session new -h does not mention %s", flag)
		}
	}
}

// sessionGitRepo makes a repository with one commit and returns its path.
func sessionGitRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	sessionGitRun(t, dir, "init", "-q", "-b", "main")
	sessionGitRun(t, dir, "config", "user.email", "test@example.com")
	sessionGitRun(t, dir, "config", "user.name", "Test")
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sessionGitRun(t, dir, "add", "a.txt")
	sessionGitRun(t, dir, "commit", "-q", "-m", "base")
	return dir
}

func sessionGitRun(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestSessionLocalWork builds --from-local's payload from a real checkout:
// one unpushed commit, an uncommitted edit and an untracked file.
func TestSessionLocalWork(t *testing.T) {
	t.Parallel()
	dir := sessionGitRepo(t)
	base := sessionGitRun(t, dir, "rev-parse", "HEAD")
	remote := t.TempDir()
	sessionGitRun(t, remote, "init", "-q", "--bare")
	sessionGitRun(t, dir, "remote", "add", "origin", remote)
	sessionGitRun(t, dir, "push", "-q", "origin", "main")
	if err := os.WriteFile(filepath.Join(dir, "b.txt"), []byte("two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sessionGitRun(t, dir, "add", "b.txt")
	sessionGitRun(t, dir, "commit", "-q", "-m", "unpushed")
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("one\nedited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".gitignore"), []byte("ignored.txt\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"new.txt", "ignored.txt"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	lw, err := command.SessionLocalWork(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if lw.GetBaseCommit() != base || lw.GetBranch() != "main" {
		t.Errorf("base %s branch %q, want %s main", lw.GetBaseCommit(), lw.GetBranch(), base)
	}
	bundle := filepath.Join(t.TempDir(), "b.bundle")
	if err := os.WriteFile(bundle, lw.GetGitBundle(), 0o600); err != nil {
		t.Fatal(err)
	}
	sessionGitRun(t, dir, "bundle", "verify", "-q", bundle)
	if !strings.Contains(string(lw.GetDiff()), "+edited") {
		t.Errorf("diff lacks the uncommitted edit:\n%s", lw.GetDiff())
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(lw.GetUntrackedTar()))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	if strings.Join(names, ",") != ".gitignore,new.txt" {
		t.Errorf("untracked tar holds %v, want .gitignore and new.txt (not ignored.txt)", names)
	}

	sessionGitRun(t, dir, "remote", "remove", "origin")
	if _, err := command.SessionLocalWork(context.Background(), dir); err == nil || !strings.Contains(err.Error(), "no remote") {
		t.Errorf("without a remote: %v, want a refusal", err)
	}
}

// sessionPatchOnly is a client whose server has GetSessionPatch but not
// GetSessionWork: only what pull's git work needs.
type sessionPatchOnly struct {
	sessionv1.SessionServiceClient
	resp *sessionv1.GetSessionPatchResponse
}

func (c sessionPatchOnly) GetSessionPatch(context.Context, *sessionv1.GetSessionPatchRequest, ...grpc.CallOption) (*sessionv1.GetSessionPatchResponse, error) {
	return c.resp, nil
}

// TestSessionPullFromPatch applies a real session-style patch (git diff
// --cached --binary BASE) with and without --checkout.
func TestSessionPullFromPatch(t *testing.T) {
	t.Parallel()
	// The "sandbox": the base, one commit and an uncommitted edit, as one patch.
	sandbox := sessionGitRepo(t)
	base := sessionGitRun(t, sandbox, "rev-parse", "HEAD")
	if err := os.WriteFile(filepath.Join(sandbox, "b.txt"), []byte("committed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sessionGitRun(t, sandbox, "add", "b.txt")
	sessionGitRun(t, sandbox, "commit", "-q", "-m", "work")
	if err := os.WriteFile(filepath.Join(sandbox, "a.txt"), []byte("one\nuncommitted\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sessionGitRun(t, sandbox, "add", "-A")
	patch := sessionGitRun(t, sandbox, "diff", "--cached", "--binary", base) + "\n"
	c := sessionPatchOnly{resp: &sessionv1.GetSessionPatchResponse{Patch: patch, BaseCommit: base}}

	t.Run("branch with one commit", func(t *testing.T) {
		local := t.TempDir()
		sessionGitRun(t, local, "clone", "-q", sandbox, ".")
		sessionGitRun(t, local, "config", "user.email", "test@example.com")
		sessionGitRun(t, local, "config", "user.name", "Test")
		sessionGitRun(t, local, "reset", "-q", "--hard", base)
		var out bytes.Buffer
		if err := command.SessionPullFromPatch(context.Background(), c, local, &out, "onb", false); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "created branch hangar/onb: the session's work as one commit") {
			t.Errorf("pull said %q", out.String())
		}
		if got := sessionGitRun(t, local, "rev-parse", "hangar/onb^"); got != base {
			t.Errorf("hangar/onb's parent is %s, want the base %s", got, base)
		}
		if got := sessionGitRun(t, local, "show", "hangar/onb:a.txt"); got != "one\nuncommitted" {
			t.Errorf("a.txt on hangar/onb = %q", got)
		}
		if got := sessionGitRun(t, local, "show", "hangar/onb:b.txt"); got != "committed" {
			t.Errorf("b.txt on hangar/onb = %q", got)
		}
		if st := sessionGitRun(t, local, "status", "--porcelain"); st != "" || sessionGitRun(t, local, "branch", "--show-current") != "main" {
			t.Errorf("the work tree changed: status %q", st)
		}
		err := command.SessionPullFromPatch(context.Background(), c, local, &out, "onb", false)
		if err == nil || !strings.Contains(err.Error(), "branch hangar/onb already exists") {
			t.Errorf("second pull: %v, want a refusal", err)
		}
	})

	t.Run("checkout", func(t *testing.T) {
		local := t.TempDir()
		sessionGitRun(t, local, "clone", "-q", sandbox, ".")
		sessionGitRun(t, local, "reset", "-q", "--hard", base)
		if err := os.WriteFile(filepath.Join(local, "a.txt"), []byte("dirty\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		err := command.SessionPullFromPatch(context.Background(), c, local, &out, "onb", true)
		if err == nil || !strings.Contains(err.Error(), "uncommitted changes") {
			t.Fatalf("pull --checkout on a dirty tree: %v, want a refusal", err)
		}
		sessionGitRun(t, local, "checkout", "--", "a.txt")
		if err := command.SessionPullFromPatch(context.Background(), c, local, &out, "onb", true); err != nil {
			t.Fatal(err)
		}
		if got := sessionGitRun(t, local, "branch", "--show-current"); got != "hangar/onb" {
			t.Errorf("on branch %q, want hangar/onb", got)
		}
		if got := sessionGitRun(t, local, "rev-parse", "HEAD"); got != base {
			t.Errorf("HEAD %s, want the base %s", got, base)
		}
		if st := sessionGitRun(t, local, "status", "--porcelain"); st != "M  a.txt\nA  b.txt" {
			t.Errorf("status = %q, want a.txt modified and b.txt added, both staged", st)
		}
	})

	t.Run("base not here", func(t *testing.T) {
		other := sessionGitRepo(t)
		c := sessionPatchOnly{resp: &sessionv1.GetSessionPatchResponse{Patch: patch, BaseCommit: strings.Repeat("1", 40)}}
		err := command.SessionPullFromPatch(context.Background(), c, other, io.Discard, "onb", false)
		if err == nil || !strings.Contains(err.Error(), "is not in this repository") {
			t.Errorf("pull without the base: %v", err)
		}
	})
}
