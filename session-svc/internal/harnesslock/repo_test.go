package harnesslock

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hangar-dev/hangar/platform/fault"
)

// lockRepo makes a git repository whose harnesses.lock.yaml went through
// each content in turn, one commit each.
func lockRepo(t *testing.T, contents ...string) string {
	t.Helper()
	dir := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q", "-b", "main")
	for i, c := range contents {
		if err := os.WriteFile(filepath.Join(dir, FileName), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
		git("add", "-A")
		git("commit", "-q", "-m", "locks "+string(rune('a'+i)))
	}
	return dir
}

func lockYAML(rev, version string) string {
	return "locks:\n  team-default:\n    revision: " + rev + "\n    harness: claude\n    model: claude-sonnet-4-5\n    approvals: never\n    cli_version: " + version + "\n"
}

func TestRepoRevisions(t *testing.T) {
	dir := lockRepo(t, lockYAML("13", "2.1.300"), lockYAML("14", "2.1.332")+"  other:\n    revision: 1\n    harness: codex\n    model: gpt-5.5\n    approvals: ask\n    cli_version: 0.171.0\n")
	for _, source := range []string{dir, "file://" + dir} {
		t.Run(source, func(t *testing.T) {
			ctx := context.Background()
			r := NewRepo(source, t.TempDir())
			list, head, err := r.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != 2 || list[0].Name != "other" || list[1].Ref() != "team-default@r14" || list[1].Commit != head {
				t.Fatalf("List = %+v at %s", list, head)
			}
			for ref, version := range map[string]string{"team-default@r14": "2.1.332", "team-default": "2.1.332", "team-default@r13": "2.1.300"} {
				l, err := r.Get(ctx, ref)
				if err != nil {
					t.Fatalf("Get(%s): %v", ref, err)
				}
				if l.CLIVersion != version {
					t.Errorf("Get(%s) = %+v, want CLI %s", ref, l, version)
				}
			}
			for ref, want := range map[string]struct {
				kind       fault.Kind
				reason, in string
			}{
				"team-default@r12": {fault.KindNotFound, "HARNESS_LOCK_REVISION_NOT_FOUND", "no revision r12"},
				"nobody@r1":        {fault.KindNotFound, "HARNESS_LOCK_NOT_FOUND", `harness lock "nobody" is not in harnesses.lock.yaml`},
				"team-default@14":  {fault.KindInvalidArgument, "", "want NAME@rREVISION"},
			} {
				_, err := r.Get(ctx, ref)
				if !fault.Is(err, want.kind) || (want.reason != "" && fault.ReasonOf(err) != want.reason) || !strings.Contains(err.Error(), want.in) {
					t.Errorf("Get(%s) = %v, want %v %s saying %q", ref, err, want.kind, want.reason, want.in)
				}
			}
		})
	}
}

func TestRepoRefusesWhatItCannotRead(t *testing.T) {
	ctx := context.Background()
	broken := lockRepo(t, lockYAML("1", "2.1.332"), "locks:\n  team-default:\n    revision: two\n")
	_, err := NewRepo(broken, t.TempDir()).Get(ctx, "team-default@r1")
	if !fault.Is(err, fault.KindInvalidArgument) || !strings.Contains(err.Error(), "harnesses.lock.yaml in "+broken) || !strings.Contains(err.Error(), `line 3: lock "team-default": revision "two"`) {
		t.Errorf("a lock file that does not parse: %v", err)
	}
	if _, _, err := NewRepo("", "").List(ctx); fault.ReasonOf(err) != "HARNESS_REPO_UNSET" || !strings.Contains(err.Error(), "HANGAR_HARNESS_REPO") {
		t.Errorf("no repository: %v", err)
	}
	if _, _, err := NewRepo(t.TempDir(), "").List(ctx); fault.ReasonOf(err) != "HARNESS_REPO_UNREACHABLE" {
		t.Errorf("not a git repository: %v", err)
	}
	empty := lockRepo(t)
	_ = os.WriteFile(filepath.Join(empty, "README"), []byte("x"), 0o644)
	cmd := exec.Command("git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", empty, "commit", "-q", "--allow-empty", "-m", "no locks")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if _, _, err := NewRepo(empty, "").List(ctx); fault.ReasonOf(err) != "HARNESS_LOCK_FILE_NOT_FOUND" {
		t.Errorf("no lock file: %v", err)
	}
	if _, _, err := NewRepo("file://"+filepath.Join(t.TempDir(), "nowhere"), t.TempDir()).List(ctx); fault.ReasonOf(err) != "HARNESS_REPO_UNREACHABLE" {
		t.Errorf("a URL that does not clone: %v", err)
	}
}
