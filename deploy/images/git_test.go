package images

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestGitLayer: the git the service images carry runs on a filesystem
// with nothing else (a chroot of the layer alone) and does what the
// services ask of it: log, clone --mirror, fetch, ls-remote and bundle of a
// local repository.
func TestGitLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	files, sources, err := GitFiles()
	if err != nil {
		t.Fatal(err)
	}
	if len(sources) < 3 {
		t.Fatalf("git files from %v: want git, its remote helper and their libraries", sources)
	}
	var buf bytes.Buffer
	if err := writeTar(&buf, files); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		default:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, b, os.FileMode(h.Mode))
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"tmp", "dev"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o1777); err != nil {
			t.Fatal(err)
		}
	}
	// A container runtime gives every container /dev/null (char 1:3); so
	// does this.
	if err := syscall.Mknod(filepath.Join(root, "dev/null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Fatal(err)
	}
	// A repository made by the host's git, inside the chroot.
	host := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@x", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@x")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	repo := filepath.Join(root, "repo")
	host("init", "-q", "-b", "main", repo)
	if err := os.WriteFile(filepath.Join(repo, "harnesses.lock.yaml"), []byte("locks: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	host("-C", repo, "add", ".")
	host("-C", repo, "commit", "-q", "-m", "one")
	in := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("chroot", append([]string{root, "/usr/bin/git", "-c", "safe.directory=*"}, args...)...)
		cmd.Env = []string{"HOME=/tmp", "PATH=/usr/local/bin:/usr/bin:/bin"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v in the image's filesystem: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := in("--version"); !strings.HasPrefix(out, "git version") {
		t.Errorf("git --version: %q", out)
	}
	head := strings.TrimSpace(in("-C", "/repo", "log", "--format=%H", "-1", "--", "harnesses.lock.yaml"))
	if len(head) != 40 {
		t.Errorf("git log: %q", head)
	}
	if out := in("ls-remote", "--", "/repo", "main"); !strings.HasPrefix(out, head) {
		t.Errorf("git ls-remote: %q, want %s", out, head)
	}
	in("clone", "--quiet", "--mirror", "--", "/repo", "/tmp/mirror")
	in("-C", "/tmp/mirror", "fetch", "--quiet", "--prune", "origin")
	in("-C", "/repo", "bundle", "create", "--quiet", "/tmp/repo.bundle", "--all")
	if out := in("bundle", "list-heads", "/tmp/repo.bundle"); !strings.Contains(out, head) {
		t.Errorf("bundle heads: %q", out)
	}
	// The https helper loads (its libraries are all there).
	out, _ := exec.Command("chroot", root, "/usr/lib/git-core/git-remote-https").CombinedOutput()
	if strings.Contains(string(out), "error while loading shared libraries") || !strings.Contains(string(out), "remote-curl") {
		t.Errorf("git-remote-https with no arguments: %s", out)
	}
}
