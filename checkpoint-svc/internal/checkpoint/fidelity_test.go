package checkpoint_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
)

func ignored(rel string) bool {
	return strings.HasSuffix(rel, ".log") || rel == "node_modules" || strings.HasPrefix(rel, "node_modules/")
}

// messUp builds a work tree with every kind of change.
func messUp(t *testing.T, work, home string) []string {
	write(t, work, "old.txt", "old name\n", 0o644)
	write(t, work, "src/a.go", "package a\n\nfunc A() {}\n", 0o644)
	git(t, work, "add", "-A")
	git(t, work, "commit", "-q", "-m", "one")
	write(t, work, "src/c.go", "package c\n", 0o644)
	git(t, work, "add", "-A")
	git(t, work, "commit", "-q", "-m", "two")
	// Staged, then changed again unstaged.
	write(t, work, "src/b.go", "package b\n\nfunc B() { staged() }\n", 0o644)
	git(t, work, "add", "src/b.go")
	write(t, work, "src/b.go", "package b\n\nfunc B() { unstaged() }\n", 0o644)
	// Binary: modified unstaged; a new one staged.
	write(t, work, "data.bin", string([]byte{0, 9, 8, 7, 255, 0, 0, 1}), 0o644)
	write(t, work, "img.bin", string([]byte{0x89, 'P', 'N', 'G', 0, 0, 0, 13, 0xff}), 0o644)
	git(t, work, "add", "img.bin")
	// Modes: one unstaged, one staged.
	os.Chmod(filepath.Join(work, "src/a.go"), 0o755)
	os.Chmod(filepath.Join(work, "bin/run.sh"), 0o644)
	git(t, work, "add", "bin/run.sh")
	// Deletions: unstaged and staged; a rename staged.
	os.Remove(filepath.Join(work, "README.md"))
	git(t, work, "rm", "-q", "link-a")
	git(t, work, "mv", "old.txt", "new.txt")
	// Untracked: a symlink, an empty directory, odd names, an executable.
	write(t, work, "notes/todo.txt", "todo\n", 0o600)
	os.Symlink("../src/a.go", filepath.Join(work, "notes/ln"))
	os.Symlink("/etc/hostname", filepath.Join(work, "abs-link"))
	os.MkdirAll(filepath.Join(work, "emptydir/sub"), 0o750)
	write(t, work, "weird\nname\xff\x01.txt", "odd\n", 0o644)
	write(t, work, "-dash", "dash\n", 0o644)
	write(t, work, "tool.sh", "#!/bin/sh\n", 0o755)
	// Ignored: must not come back.
	write(t, work, "debug.log", "noise\n", 0o644)
	write(t, work, "node_modules/x/index.js", "x\n", 0o644)
	// Conversation files.
	conv := filepath.Join(home, ".claude/projects/-work")
	write(t, conv, "c1.jsonl", "{\"turn\":1}\n", 0o600)
	return []string{filepath.Join(home, ".claude/projects")}
}

func TestRoundTripFidelity(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	work, home := w.sandbox()
	conv := messUp(t, work, home)
	res := w.capture("s1", work, conv...)
	if !res.Created || len(res.Warnings) != 0 {
		t.Fatalf("capture: created=%v warnings=%v", res.Created, res.Warnings)
	}
	cp := res.Checkpoint
	if cp.GetHeadCommit() != git(t, work, "rev-parse", "HEAD") || cp.GetBranch() != "hangar/session/s1" {
		t.Fatalf("metadata: head %s branch %s", cp.GetHeadCommit(), cp.GetBranch())
	}

	// The conversation goes away with the old sandbox; the restore brings it back.
	wantConv := snapshot(t, home, nil)
	os.RemoveAll(filepath.Join(home, ".claude"))
	work2, _ := w.sandbox()
	tree, err := w.restore(cp.GetId(), work2, "")
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if tree != cp.GetTreeHash() {
		t.Fatalf("tree %s, want %s", tree, cp.GetTreeHash())
	}
	diffSnap(t, snapshot(t, work, ignored), snapshot(t, work2, nil))
	diffSnap(t, wantConv, snapshot(t, home, nil))
	for _, args := range [][]string{
		{"rev-parse", "HEAD"}, {"symbolic-ref", "HEAD"}, {"ls-files", "-s"}, {"diff", "--cached", "--stat"},
		{"for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/"},
	} {
		if a, b := git(t, work, args...), git(t, work2, args...); a != b {
			t.Errorf("git %v:\n%s\nrestored:\n%s", args, a, b)
		}
	}
	if _, err := os.Lstat(filepath.Join(work2, "debug.log")); !os.IsNotExist(err) {
		t.Error("ignored file restored")
	}
	// No entry is racily clean (as new as the index, to the second): git
	// would read each again at every status, and an overlay copy of the
	// sandbox would copy each up.
	idx, err := os.Stat(filepath.Join(work2, ".git", "index"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Split(git(t, work2, "ls-files"), "\n") {
		if fi, err := os.Lstat(filepath.Join(work2, f)); err == nil && fi.ModTime().Unix() >= idx.ModTime().Unix() {
			t.Errorf("%s (mtime %v) is racily clean: the index was written at %v", f, fi.ModTime(), idx.ModTime())
		}
	}

	// Verify, get and read a part.
	if _, err := w.eng.Verify(context.Background(), cp.GetId()); err != nil {
		t.Fatalf("verify: %v", err)
	}
	var diff strings.Builder
	if err := w.eng.ReadPart(context.Background(), cp.GetId(), checkpointv1.PartKind_PART_KIND_DIFF, &diff); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(diff.String(), "unstaged()") {
		t.Fatalf("diff part lacks the unstaged change:\n%s", diff.String())
	}
}

// TestRoundTripUnusualStates covers states the tree diffs see differently
// from git diff: an index with unmerged entries (it has no tree, so the
// capture falls back to git diff), a staged deletion of a file that stays,
// an empty untracked directory at the top, an untracked repository, and
// intent-to-add entries (git add -N); and that the index comes back.
func TestRoundTripUnusualStates(t *testing.T) {
	t.Parallel()
	cases := map[string]func(t *testing.T, work string){
		"unmerged": func(t *testing.T, work string) {
			write(t, work, "conflict.txt", "base\n", 0o644)
			git(t, work, "add", "-A")
			git(t, work, "commit", "-q", "-m", "base")
			git(t, work, "checkout", "-q", "-b", "other")
			write(t, work, "conflict.txt", "theirs\n", 0o644)
			git(t, work, "commit", "-q", "-am", "theirs")
			git(t, work, "checkout", "-q", "hangar/session/s1")
			write(t, work, "conflict.txt", "ours\n", 0o644)
			write(t, work, "src/a.go", "package a // edited\n", 0o644)
			git(t, work, "commit", "-q", "-am", "ours")
			cmd := exec.Command("git", "merge", "-q", "other")
			cmd.Dir = work
			if err := cmd.Run(); err == nil {
				t.Fatal("merge did not conflict")
			}
			write(t, work, "src/b.go", "package b // unstaged\n", 0o644)
			nested := filepath.Join(work, "deps/lib")
			write(t, nested, "lib.go", "package lib\n", 0o644)
			git(t, nested, "init", "-q")
			git(t, nested, "add", "-A")
			git(t, nested, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "lib")
		},
		"staged deletion kept": func(t *testing.T, work string) {
			git(t, work, "rm", "-q", "--cached", "README.md")
			git(t, work, "rm", "-q", "--cached", "src/a.go")
			write(t, work, "src/a.go", "package a // now untracked\n", 0o600)
			write(t, work, "src/b.go", "package b // unstaged\n", 0o644)
		},
		"intent to add": func(t *testing.T, work string) {
			write(t, work, "planned.go", "package planned\n", 0o644)
			write(t, work, "src/later.go", "package later\n", 0o755)
			write(t, work, "empty.txt", "", 0o644)
			git(t, work, "add", "-N", "planned.go", "src/later.go")
			git(t, work, "add", "empty.txt") // a staged empty file is no intent to add
			write(t, work, "plain-untracked.txt", "u\n", 0o644)
		},
		"empty and nested": func(t *testing.T, work string) {
			os.MkdirAll(filepath.Join(work, "emptytop"), 0o700)
			os.MkdirAll(filepath.Join(work, "src/empty/deeper"), 0o750)
			nested := filepath.Join(work, "vendor/lib")
			write(t, nested, "lib.go", "package lib\n", 0o644)
			git(t, nested, "init", "-q")
			git(t, nested, "add", "-A")
			git(t, nested, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "lib")
			os.Remove(filepath.Join(work, "bin/run.sh")) // leaves bin/ empty
		},
	}
	for name, mess := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			work, _ := w.sandbox()
			mess(t, work)
			cp := w.capture("s1", work).Checkpoint
			work2, _ := w.sandbox()
			tree, err := w.restore(cp.GetId(), work2, "")
			if err != nil {
				t.Fatalf("restore: %v", err)
			}
			if tree != cp.GetTreeHash() {
				t.Fatalf("tree %s, want %s", tree, cp.GetTreeHash())
			}
			diffSnap(t, snapshot(t, work, ignored), snapshot(t, work2, nil))
			if name == "unmerged" {
				return // the index comes back merged (the work tree's state)
			}
			for _, args := range [][]string{{"status", "--porcelain=v1", "-uall"}, {"ls-files", "-s"}, {"diff", "--cached", "--stat"}} {
				if a, b := git(t, work, args...), git(t, work2, args...); a != b {
					t.Errorf("git %v:\n%s\nrestored:\n%s", args, a, b)
				}
			}
		})
	}
}

// TestRestoreIntoAMessySandbox: a restore takes the fast way (only the
// paths that differ from the sandbox's HEAD are written) only into a
// sandbox whose index is its HEAD's tree, and the full way whenever the
// sandbox holds anything of its own; either way the result is the
// checkpoint exactly, never the sandbox's leftovers.
func TestRestoreIntoAMessySandbox(t *testing.T) {
	t.Parallel()
	cases := map[string]func(t *testing.T, work string){
		"clean":          func(t *testing.T, work string) {},
		"untracked file": func(t *testing.T, work string) { write(t, work, "src/mine.txt", "the sandbox's own\n", 0o644) },
		"in the way": func(t *testing.T, work string) {
			write(t, work, "new.txt", "an untracked file where one comes\n", 0o644)
		},
		"empty directory":  func(t *testing.T, work string) { os.MkdirAll(filepath.Join(work, "build/out"), 0o755) },
		"modified tracked": func(t *testing.T, work string) { write(t, work, "data.bin", "not the base's\n", 0o644) },
		"staged": func(t *testing.T, work string) {
			write(t, work, "src/b.go", "package b // staged in the sandbox\n", 0o644)
			git(t, work, "add", "src/b.go")
			write(t, work, "src/b.go", "package b\n\nfunc B() {}\n", 0o644)
		},
		"staged new file": func(t *testing.T, work string) {
			write(t, work, "staged.txt", "x\n", 0o644)
			git(t, work, "add", "staged.txt")
			os.Remove(filepath.Join(work, "staged.txt"))
		},
		"mode change": func(t *testing.T, work string) { os.Chmod(filepath.Join(work, "src/a.go"), 0o755) },
		"other branch": func(t *testing.T, work string) {
			git(t, work, "checkout", "-q", "-b", "elsewhere")
			write(t, work, "README.md", "elsewhere\n", 0o644)
			git(t, work, "commit", "-q", "-am", "elsewhere")
		},
	}
	w := newWorld(t)
	work, home := w.sandbox()
	conv := messUp(t, work, home)
	cp := w.capture("s1", work, conv...).Checkpoint
	// Every case's restore puts the conversation files at the captured
	// sandbox's absolute paths, the same files: one restore at a time.
	var restoring sync.Mutex
	for name, mess := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			work2, _ := w.sandbox()
			mess(t, work2)
			restoring.Lock()
			tree, err := w.restore(cp.GetId(), work2, "")
			restoring.Unlock()
			if err != nil {
				t.Fatalf("restore: %v", err)
			}
			if tree != cp.GetTreeHash() {
				t.Fatalf("tree %s, want %s", tree, cp.GetTreeHash())
			}
			diffSnap(t, snapshot(t, work, ignored), snapshot(t, work2, nil))
			for _, args := range [][]string{
				{"rev-parse", "HEAD"}, {"symbolic-ref", "HEAD"}, {"ls-files", "-s"}, {"diff", "--cached", "--stat"},
				{"status", "--porcelain=v1", "-uall"},
			} {
				if a, b := git(t, work, args...), git(t, work2, args...); a != b {
					t.Errorf("git %v:\n%s\nrestored:\n%s", args, a, b)
				}
			}
			if a, b := git(t, work, "rev-parse", "refs/heads/hangar/session/s1"), git(t, work2, "rev-parse", "refs/heads/hangar/session/s1"); a != b {
				t.Errorf("branch at %s, want %s", b, a)
			}
			idx, err := os.Stat(filepath.Join(work2, ".git", "index"))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range strings.Split(git(t, work2, "ls-files"), "\n") {
				if fi, err := os.Lstat(filepath.Join(work2, f)); err == nil && fi.ModTime().Unix() >= idx.ModTime().Unix() {
					t.Errorf("%s (mtime %v) is racily clean: the index was written at %v", f, fi.ModTime(), idx.ModTime())
				}
			}
		})
	}
}
