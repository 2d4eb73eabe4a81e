// Command hangar-images builds hangar's image tarballs (package images)
// into -out: <service>.tar for each service and, with -sandbox,
// sandbox.tar. Binaries are built with CGO_ENABLED=0 from the repository at
// -repo. An image whose inputs (binaries, rootfs, harness pins) are
// unchanged since the last run is left as it is. Every tarball written is
// loaded back and checked (entrypoint, user). deploy/images/build runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/hangar-dev/hangar/deploy/images"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "hangar-images: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("hangar-images", flag.ContinueOnError)
	repo := fs.String("repo", ".", "repository root")
	out := fs.String("out", "deploy/images/out", "directory for the image tarballs")
	cache := fs.String("cache", filepath.Join(os.TempDir(), "hangar-images"), "cache directory (binaries, the harness layer)")
	tag := fs.String("tag", "dev", "tag of every image (hangar/<name>:<tag>)")
	sandbox := fs.Bool("sandbox", false, "also build the sandbox base image (needs -rootfs and the HANGAR_*_BIN variables of .ci/install-harnesses)")
	rootfs := fs.String("rootfs", "", "uncompressed tar of the sandbox's Debian root filesystem (with git)")
	only := fs.String("only", "", "comma-separated services to build (default: all)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, d := range []string{*out, *cache} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	bins := filepath.Join(*cache, "bin")
	services := images.Services
	if *only != "" {
		services = strings.Split(*only, ",")
	}
	pkgs := map[string]string{"hangar-install-key": "./deploy/cmd/hangar-install-key", "hangar-sandbox": "./sandbox-svc/cmd/hangar-sandbox"}
	var want []string
	for _, s := range services {
		pkgs[s] = "./" + s + "/cmd/" + s
		want = append(want, s)
	}
	want = append(want, "hangar-install-key")
	if *sandbox {
		want = append(want, "hangar-sandbox")
	}
	var targets []string
	for _, w := range want {
		targets = append(targets, pkgs[w])
	}
	// One go build for all binaries: the Go build cache makes it seconds
	// when nothing changed.
	if err := goBuild(ctx, *repo, bins, targets); err != nil {
		return err
	}
	for _, s := range services {
		bin := filepath.Join(bins, s)
		extras := map[string]string{}
		if s == "checkpoint-svc" {
			extras["hangar-install-key"] = filepath.Join(bins, "hangar-install-key")
		}
		inputs := append([]string{bin}, values(extras)...)
		if images.GitServices[s] {
			// The host's git and its libraries (GitFiles).
			_, gitSources, err := images.GitFiles()
			if err != nil {
				return err
			}
			inputs = append(inputs, gitSources...)
		}
		key, err := inputsKey(inputs...)
		if err != nil {
			return err
		}
		err = build(filepath.Join(*out, s+".tar"), "hangar/"+s+":"+*tag, key, func() (v1.Image, error) {
			if !images.GitServices[s] {
				return images.ServiceImage(s, bin, extras)
			}
			git, err := images.GitLayer()
			if err != nil {
				return nil, err
			}
			return images.ServiceImage(s, bin, extras, git)
		}, []string{images.BinDir + "/" + s}, fmt.Sprintf("%d:%d", images.NonRoot, images.NonRoot))
		if err != nil {
			return err
		}
	}
	if !*sandbox {
		return nil
	}
	if *rootfs == "" {
		return fmt.Errorf("-sandbox needs -rootfs (deploy/images/build makes one with debootstrap)")
	}
	harnesses, err := harnessesFromEnv()
	if err != nil {
		return err
	}
	tool := filepath.Join(bins, "hangar-sandbox")
	var dirs []string
	for _, h := range harnesses {
		dirs = append(dirs, h.Dir)
	}
	key, err := inputsKey(tool, *rootfs)
	if err != nil {
		return err
	}
	key += " " + strings.Join(dirs, " ")
	return build(filepath.Join(*out, "sandbox.tar"), "hangar/sandbox:"+*tag, key, func() (v1.Image, error) {
		return images.SandboxImage(*rootfs, harnesses, tool, *cache)
	}, nil, fmt.Sprintf("%d:%d", images.SandboxUser, images.SandboxUser))
}

func values(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// build writes the image unless path's recorded key is key, then checks it.
func build(path, ref, key string, make func() (v1.Image, error), entrypoint []string, user string) error {
	keyFile := path + ".key"
	if old, err := os.ReadFile(keyFile); err == nil && string(old) == key {
		if _, err := os.Stat(path); err == nil {
			fmt.Fprintf(os.Stderr, "hangar-images: %s is up to date\n", path)
			return nil
		}
	}
	img, err := make()
	if err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	if err := images.Write(path, ref, img); err != nil {
		return err
	}
	if err := images.Check(path, entrypoint, user); err != nil {
		return err
	}
	d, _ := img.Digest()
	fmt.Fprintf(os.Stderr, "hangar-images: wrote %s (%s, %s)\n", path, ref, d)
	return os.WriteFile(keyFile, []byte(key), 0o644)
}

// inputsKey is the SHA-256 of each input file, in order.
func inputsKey(files ...string) (string, error) {
	var parts []string
	for _, f := range files {
		s, err := images.FileSHA256(f)
		if err != nil {
			return "", err
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " "), nil
}

func goBuild(ctx context.Context, repo, outDir string, pkgs []string) error {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	abs, err := filepath.Abs(outDir)
	if err != nil {
		return err
	}
	args := append([]string{"build", "-trimpath", "-ldflags=-s -w", "-o", abs + "/"}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w", strings.Join(pkgs, " "), err)
	}
	return nil
}

// harnessesFromEnv finds the pinned install directories from the lines
// .ci/install-harnesses prints (HANGAR_HARNESS_DIR, HANGAR_CLAUDE_BIN,
// HANGAR_CODEX_BIN, HANGAR_PI_BIN, HANGAR_PI_NODE_BIN_DIR). Node (the one
// pi is pinned to) becomes the image's node.
func harnessesFromEnv() ([]images.Harness, error) {
	root := os.Getenv("HANGAR_HARNESS_DIR")
	if root == "" {
		return nil, fmt.Errorf("HANGAR_HARNESS_DIR is unset: eval the output of .ci/install-harnesses first")
	}
	byDir := map[string]*images.Harness{}
	var order []string
	add := func(variable, cmd, p string) error {
		if p == "" {
			return fmt.Errorf("%s is unset: eval the output of .ci/install-harnesses first", variable)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || strings.HasPrefix(rel, "..") {
			return fmt.Errorf("%s=%s is not below HANGAR_HARNESS_DIR=%s", variable, p, root)
		}
		top, rest, _ := strings.Cut(filepath.ToSlash(rel), "/")
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s: %w", variable, err)
		}
		h := byDir[top]
		if h == nil {
			h = &images.Harness{Dir: filepath.Join(root, top), Links: map[string]string{}}
			byDir[top] = h
			order = append(order, top)
		}
		h.Links[cmd] = rest
		return nil
	}
	for _, v := range []struct{ variable, cmd, path string }{
		{"HANGAR_CLAUDE_BIN", "claude", os.Getenv("HANGAR_CLAUDE_BIN")},
		{"HANGAR_CODEX_BIN", "codex", os.Getenv("HANGAR_CODEX_BIN")},
		{"HANGAR_PI_BIN", "pi", os.Getenv("HANGAR_PI_BIN")},
		{"HANGAR_PI_NODE_BIN_DIR", "node", filepath.Join(os.Getenv("HANGAR_PI_NODE_BIN_DIR"), "node")},
	} {
		if err := add(v.variable, v.cmd, v.path); err != nil {
			return nil, err
		}
	}
	var out []images.Harness
	for _, d := range order {
		out = append(out, *byDir[d])
	}
	return out, nil
}
