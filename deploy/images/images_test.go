package images

import (
	"archive/tar"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func deployDir() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(f))
}

// tree reads the image tarball's flattened filesystem: path -> header and
// (for small regular files) contents.
func tree(t *testing.T, path string) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := "/" + strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		hdrs[name] = h
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			data[name] = b
		}
	}
	return hdrs, data
}

// checkServiceImage: loads, entrypoint and user; the binary is a static
// executable (no ELF interpreter) at /usr/local/bin/<name>; passwd names
// the non-root user; the CA bundle is there.
func checkServiceImage(t *testing.T, path, name string) {
	t.Helper()
	if err := Check(path, []string{BinDir + "/" + name}, "65532:65532"); err != nil {
		t.Fatal(err)
	}
	hdrs, data := tree(t, path)
	bin := BinDir + "/" + name
	h, ok := hdrs[bin]
	if !ok || h.Mode&0o111 == 0 {
		t.Fatalf("%s: no executable %s (%+v)", path, bin, h)
	}
	f, err := os.CreateTemp(t.TempDir(), "bin")
	if err != nil {
		t.Fatal(err)
	}
	f.Write(data[bin])
	f.Close()
	e, err := elf.Open(f.Name())
	if err != nil {
		t.Fatalf("%s: %s is not an ELF executable: %v", path, bin, err)
	}
	defer e.Close()
	for _, p := range e.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s: %s is dynamically linked (has an interpreter); want CGO_ENABLED=0", path, bin)
		}
	}
	if !strings.Contains(string(data["/etc/passwd"]), ":65532:65532:") {
		t.Errorf("%s: /etc/passwd has no uid 65532: %q", path, data["/etc/passwd"])
	}
	if len(data["/etc/ssl/certs/ca-certificates.crt"]) == 0 {
		t.Errorf("%s: no CA bundle", path)
	}
	if h := hdrs["/tmp"]; h == nil || h.Mode&0o1777 != 0o1777 {
		t.Errorf("%s: /tmp is not 1777", path)
	}
}

// TestServiceImage builds an image the way hangar-images does, from a real
// static binary (hangar-install-key: small and quick to build), writes it
// as a tarball and reads it back.
func TestServiceImage(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "hangar-install-key")
	cmd := exec.CommandContext(t.Context(), "go", "build", "-trimpath", "-o", bin, "./cmd/hangar-install-key")
	cmd.Dir = deployDir()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	img, err := ServiceImage("hangar-install-key", bin, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	if err := Write(out, "hangar/test:1", img); err != nil {
		t.Fatal(err)
	}
	checkServiceImage(t, out, "hangar-install-key")
	// The same inputs make the same image.
	again, err := ServiceImage("hangar-install-key", bin, nil)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("digests differ for the same inputs: %s, %s", d1, d2)
	}
	// A wrong expectation is reported.
	if err := Check(out, []string{"/bin/sh"}, "0:0"); err == nil {
		t.Error("Check accepted the wrong entrypoint")
	}
}

// TestBuiltImages checks the tarballs deploy/images/build wrote (CI runs it
// before the tests): every service's, and the sandbox image when built.
func TestBuiltImages(t *testing.T) {
	out := os.Getenv("HANGAR_IMAGES_OUT")
	if out == "" {
		out = filepath.Join(deployDir(), "images", "out")
	}
	if _, err := os.Stat(filepath.Join(out, "session-svc.tar")); err != nil {
		t.Skipf("no image tarballs in %s: run deploy/images/build", out)
	}
	for _, s := range Services {
		t.Run(s, func(t *testing.T) { checkServiceImage(t, filepath.Join(out, s+".tar"), s) })
	}
	t.Run("checkpoint-svc has hangar-install-key", func(t *testing.T) {
		hdrs, _ := tree(t, filepath.Join(out, "checkpoint-svc.tar"))
		if h := hdrs[BinDir+"/hangar-install-key"]; h == nil || h.Mode&0o111 == 0 {
			t.Error("checkpoint-svc's image has no hangar-install-key (its init container installs the vault key with it)")
		}
	})
	for s := range GitServices {
		t.Run(s+" has git", func(t *testing.T) {
			hdrs, _ := tree(t, filepath.Join(out, s+".tar"))
			for _, p := range []string{"/usr/bin/git", "/usr/lib/git-core/git-remote-https", "/bin/sh"} {
				if hdrs[p] == nil {
					t.Errorf("%s's image has no %s (it runs git itself)", s, p)
				}
			}
		})
	}
	sb := filepath.Join(out, "sandbox.tar")
	if _, err := os.Stat(sb); err != nil {
		t.Log("no sandbox.tar (deploy/images/build --sandbox builds it)")
		return
	}
	t.Run("sandbox", func(t *testing.T) {
		img, err := tarball.ImageFromPath(sb, nil)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Config.User != "1000:1000" {
			t.Errorf("sandbox user %q, want 1000:1000", cf.Config.User)
		}
		hdrs, _ := tree(t, sb)
		for _, p := range []string{"/usr/bin/git", "/usr/bin/sh", "/usr/bin/cp", BinDir + "/hangar-sandbox", BinDir + "/node", BinDir + "/claude", BinDir + "/codex", BinDir + "/pi"} {
			if hdrs[p] == nil {
				t.Errorf("sandbox image has no %s", p)
			}
		}
	})
}
