package checkpoint_test

import (
	"crypto/sha1"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRestoreSettlesForeignOwner (issue 16): a sandbox cloned outside its
// user namespace (the local driver clones on the host) has an index whose
// entries name the host's uid and gid while, inside, the files are the
// sandbox's: git takes every entry for changed and each later command (a
// step's tree hash, a checkpoint's probe) reads and hashes every tracked
// file again. After a restore the index's stat data must hold for every
// file the restore left as it was captured: `git diff-files` (which does
// not refresh) names only the file the checkpoint changed.
func TestRestoreSettlesForeignOwner(t *testing.T) {
	w := newWorld(t)
	work, _ := w.sandbox()
	write(t, work, "src/a.go", "package a // changed\n", 0o644)
	cp := w.capture("owner", work).Checkpoint

	fresh, _ := w.sandbox()
	st, err := os.Lstat(fresh)
	if err != nil {
		t.Fatal(err)
	}
	agedForeignIndex(t, fresh)
	if dirty := git(t, fresh, "diff-files", "--name-only"); dirty == "" {
		t.Fatalf("the rewritten index is not taken for changed (test setup; owner of %s: %v)", fresh, st.Sys())
	}
	tree, err := w.restore(cp.GetId(), fresh, "")
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if tree != cp.GetTreeHash() {
		t.Fatalf("restored tree %s, want %s", tree, cp.GetTreeHash())
	}
	if dirty := git(t, fresh, "diff-files", "--name-only"); dirty != "src/a.go" {
		t.Fatalf("after the restore git diff-files names %q, want only src/a.go: the index still names another owner", strings.ReplaceAll(dirty, "\n", " "))
	}
}

// foreignizeIndex sets the uid and gid of every entry of a version 2 SHA-1
// index to id and rewrites its checksum: the index as a process of another
// owner wrote it.
func foreignizeIndex(t *testing.T, path string, id uint32) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(data[:4]) != "DIRC" || binary.BigEndian.Uint32(data[4:8]) != 2 {
		t.Fatalf("index %s: not a version 2 index", path)
	}
	n := int(binary.BigEndian.Uint32(data[8:12]))
	off := 12
	for range n {
		e := data[off:]
		binary.BigEndian.PutUint32(e[28:32], id)
		binary.BigEndian.PutUint32(e[32:36], id)
		nameLen := int(binary.BigEndian.Uint16(e[60:62]) & 0xfff)
		off += (62 + nameLen + 8) &^ 7
	}
	sum := sha1.Sum(data[:len(data)-sha1.Size])
	copy(data[len(data)-sha1.Size:], sum[:])
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The restore takes such an index's entries as the sandbox's own without
// reading the files again, but a file changed since the index was written
// (same size, its modification time put back: only its change time
// differs) is still read, found and restored.
func TestRestoreAdoptsForeignOwnerYetCatchesAChange(t *testing.T) {
	w := newWorld(t)
	work, _ := w.sandbox()
	write(t, work, "src/a.go", "package a // changed\n", 0o644)
	cp := w.capture("owner", work).Checkpoint

	fresh, _ := w.sandbox()
	old := agedForeignIndex(t, fresh)
	readme := filepath.Join(fresh, "README.md")
	if err := os.WriteFile(readme, []byte("HELLO\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(readme, old, old); err != nil {
		t.Fatal(err)
	}
	tree, err := w.restore(cp.GetId(), fresh, "")
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if tree != cp.GetTreeHash() {
		t.Fatalf("restored tree %s, want %s", tree, cp.GetTreeHash())
	}
	if b, err := os.ReadFile(readme); err != nil || string(b) != "hello\n" {
		t.Fatalf("README.md after the restore: %q %v, want the checkpoint's", b, err)
	}
	if dirty := git(t, fresh, "diff-files", "--name-only"); dirty != "src/a.go" {
		t.Fatalf("after the restore git diff-files names %q, want only src/a.go", strings.ReplaceAll(dirty, "\n", " "))
	}
}

// agedForeignIndex makes fresh a sandbox made a while ago (its tracked
// files an hour old, so a restore has no reason of its own to read them
// again) whose index names another owner (uid 4242), as a clone made on
// the host leaves it. It returns the files' time.
func agedForeignIndex(t *testing.T, fresh string) time.Time {
	t.Helper()
	old := time.Now().Add(-time.Hour)
	for _, name := range strings.Fields(git(t, fresh, "ls-files")) {
		if fi, err := os.Lstat(filepath.Join(fresh, name)); err == nil && fi.Mode().IsRegular() {
			if err := os.Chtimes(filepath.Join(fresh, name), old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	git(t, fresh, "update-index", "-q", "--refresh")
	foreignizeIndex(t, filepath.Join(fresh, ".git", "index"), 4242)
	return old
}
