package images

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// GitServices are the services that run git themselves: session-svc reads
// harness locks from HANGAR_HARNESS_REPO (clone, fetch, log), sandbox-svc
// resolves a URL environment's ref (ls-remote) and bundles a local
// repository for a pod (bundle).
var GitServices = map[string]bool{"session-svc": true, "sandbox-svc": true}

// gitAliases are the dashed names git runs itself by (upload-pack for a
// local clone or fetch, ...): links to the git binary, which dispatches on
// its name.
var gitAliases = []string{"git-upload-pack", "git-receive-pack", "git-upload-archive"}

// GitFiles are the build host's git, its HTTP(S) remote helper, /bin/sh
// and the shared libraries they load (as ldd finds them, each at the path the
// loader looks in), for an image with nothing else: what git clone, fetch,
// log, ls-remote and bundle need, over a local path or https. sources are
// the host files read, for the build's inputs key.
func GitFiles() (files []file, sources []string, err error) {
	gitBin, err := exec.LookPath("git")
	if err != nil {
		return nil, nil, fmt.Errorf("git for the service images: %w", err)
	}
	if gitBin, err = filepath.Abs(gitBin); err != nil {
		return nil, nil, err
	}
	out, err := exec.Command(gitBin, "--exec-path").Output()
	if err != nil {
		return nil, nil, fmt.Errorf("git --exec-path: %w", err)
	}
	execPath := strings.TrimSpace(string(out))
	remote := filepath.Join(execPath, "git-remote-http")
	byPath := map[string]file{}
	add := func(f file) {
		if _, ok := byPath[f.path]; !ok {
			byPath[f.path] = f
		}
	}
	// git runs a local transport's upload-pack through /bin/sh (its
	// command is quoted), so the host's sh comes too.
	for _, exe := range []string{gitBin, remote, "/bin/sh"} {
		real, err := filepath.EvalSymlinks(exe)
		if err != nil {
			return nil, nil, fmt.Errorf("git for the service images: %w", err)
		}
		add(file{path: exe, mode: 0o755, src: real})
		libs, err := sharedLibraries(exe)
		if err != nil {
			return nil, nil, err
		}
		for _, lib := range libs {
			real, err := filepath.EvalSymlinks(lib)
			if err != nil {
				return nil, nil, fmt.Errorf("git's library %s: %w", lib, err)
			}
			add(file{path: lib, mode: 0o755, src: real})
		}
	}
	add(file{path: filepath.Join(execPath, "git-remote-https"), link: "git-remote-http"})
	add(file{path: filepath.Join(execPath, "git"), link: gitBin})
	for _, a := range gitAliases {
		add(file{path: filepath.Join(execPath, a), link: gitBin})
		add(file{path: filepath.Join(filepath.Dir(gitBin), a), link: "git"})
	}
	// An empty template directory: git init and clone warn without one.
	add(file{path: "/usr/share/git-core/templates", dir: true, mode: 0o755})
	// Parent directories, each once.
	for p := range byPath {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			add(file{path: d, dir: true, mode: 0o755})
		}
	}
	for _, f := range byPath {
		files = append(files, f)
		if f.src != "" {
			sources = append(sources, f.src)
		}
	}
	sort.Strings(sources)
	return files, sources, nil
}

// GitLayer is GitFiles as a layer.
func GitLayer() (v1.Layer, error) {
	files, _, err := GitFiles()
	if err != nil {
		return nil, err
	}
	return memLayer(files)
}

// sharedLibraries are the libraries ldd says exe loads, the dynamic loader
// included.
func sharedLibraries(exe string) ([]string, error) {
	out, err := exec.Command("ldd", exe).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", exe, err)
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if _, after, ok := strings.Cut(line, "=> "); ok {
			line = after
		}
		p, _, _ := strings.Cut(line, " ")
		if strings.HasPrefix(p, "/") {
			libs = append(libs, p)
		} else if strings.Contains(line, "not found") {
			return nil, fmt.Errorf("ldd %s: %s", exe, line)
		}
	}
	return libs, sc.Err()
}
