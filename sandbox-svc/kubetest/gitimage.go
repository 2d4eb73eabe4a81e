package kubetest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// GitOnlyImage writes, as a docker archive in dir, an image holding
// nothing but this machine's git (with its HTTP remote helper and the
// shared libraries both load), an empty /tmp and the tool at
// /usr/local/bin/hangar-sandbox: no shell, no coreutils. It is what an
// image needs for hangar's own work in a pod. It returns the archive and
// the image's name.
func GitOnlyImage(dir, tool string) (archive, name string, err error) {
	name = "hangar.test/git-only:1"
	gitBin, err := exec.LookPath("git")
	if err != nil {
		return "", "", err
	}
	out, err := exec.Command(gitBin, "--exec-path").Output()
	if err != nil {
		return "", "", fmt.Errorf("git --exec-path: %w", err)
	}
	files := map[string]string{} // path in the image -> host file
	for _, exe := range []string{gitBin, filepath.Join(strings.TrimSpace(string(out)), "git-remote-http")} {
		files[exe] = exe
		libs, err := sharedLibraries(exe)
		if err != nil {
			return "", "", err
		}
		for _, l := range libs {
			files[l] = l
		}
	}
	files["/usr/local/bin/hangar-sandbox"] = tool
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	dirs := map[string]bool{}
	var mkdirs func(p string) error
	mkdirs = func(p string) error {
		if p == "/" || p == "." || dirs[p] {
			return nil
		}
		if err := mkdirs(filepath.Dir(p)); err != nil {
			return err
		}
		dirs[p] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(p, "/") + "/", Mode: 0o755})
	}
	if err := mkdirs("/tmp"); err != nil {
		return "", "", err
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		real, err := filepath.EvalSymlinks(files[p])
		if err != nil {
			return "", "", err
		}
		data, err := os.ReadFile(real)
		if err != nil {
			return "", "", err
		}
		if err := mkdirs(filepath.Dir(p)); err != nil {
			return "", "", err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: 0o755, Size: int64(len(data))}); err != nil {
			return "", "", err
		}
		if _, err := tw.Write(data); err != nil {
			return "", "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", "", err
	}
	sum := sha256.Sum256(layer.Bytes())
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Env": []string{"PATH=/usr/local/bin:/usr/bin:/bin"}, "Cmd": []string{"/usr/local/bin/hangar-sandbox", "hold", `{"version":1,"args":{"run_dir":"/tmp/run"}}`}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(sum[:])}},
	})
	manifest, _ := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{name}, "Layers": []string{"layer.tar"}}})
	archive = filepath.Join(dir, "git-only.tar")
	f, err := os.Create(archive)
	if err != nil {
		return "", "", err
	}
	aw := tar.NewWriter(f)
	for _, e := range []struct {
		name string
		data []byte
	}{{"manifest.json", manifest}, {"config.json", config}, {"layer.tar", layer.Bytes()}} {
		if err := aw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data))}); err != nil {
			f.Close()
			return "", "", err
		}
		if _, err := aw.Write(e.data); err != nil {
			f.Close()
			return "", "", err
		}
	}
	if err := aw.Close(); err != nil {
		f.Close()
		return "", "", err
	}
	return archive, name, f.Close()
}

// sharedLibraries are the libraries exe loads, as ldd finds them, with
// the dynamic loader.
func sharedLibraries(exe string) ([]string, error) {
	out, err := exec.Command("ldd", exe).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", exe, err)
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0])
		}
	}
	return libs, sc.Err()
}
