package app

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hangar-dev/hangar/session-svc/internal/harness"
)

// AgentCLI is one agent CLI as the session service would run it.
type AgentCLI struct {
	Harness string
	// Binary is the configured name or path (HANGAR_CLAUDE_BIN, ...).
	Binary string
	// Path is where it was found; "" when it was not.
	Path string
	// Version is the first line of `Binary --version`; "" when that failed.
	Version string
	// Note is extra advice for this CLI (pi's Node version), shown when
	// --version failed.
	Note string
	// Hint is how to install it (npm package, setting).
	Hint string
}

// versionTimeout bounds `CLI --version` (Claude Code 2.1.332 answers in
// ~0.02 s, Codex 0.171.0 in ~0.5 s, pi 1.6.0 in ~0.4 s on 2 cores).
const versionTimeout = 10 * time.Second

// FindAgentCLIs looks for each harness's CLI on this process's PATH (the
// sandboxes' PATH under the local driver) or at its configured path, and
// asks each found one for its version, all at once.
func FindAgentCLIs(ctx context.Context, cfg Config) []AgentCLI {
	bins := map[harness.Name]string{harness.Claude: cfg.ClaudeBin, harness.Codex: cfg.CodexBin, harness.Pi: cfg.PiBin}
	installs := harness.Installs()
	out := make([]AgentCLI, len(installs))
	var wg sync.WaitGroup
	for i, in := range installs {
		bin := bins[in.Harness]
		if bin == "" {
			bin = in.Binary
		}
		out[i] = AgentCLI{Harness: string(in.Harness), Binary: bin, Hint: in.Hint(), Note: in.Note}
		path, err := exec.LookPath(bin)
		if err != nil {
			continue
		}
		if abs, err := filepath.Abs(path); err == nil {
			path = abs
		}
		out[i].Path = path
		var pathPrepend string
		if in.Harness == harness.Pi && cfg.PiNodeBinDir != "" {
			pathPrepend = cfg.PiNodeBinDir
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].Version = cliVersion(ctx, path, pathPrepend)
		}()
	}
	wg.Wait()
	return out
}

func cliVersion(ctx context.Context, path, pathPrepend string) string {
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--version")
	cmd.Env = os.Environ()
	if pathPrepend != "" {
		cmd.Env = append(cmd.Env, "PATH="+pathPrepend+string(filepath.ListSeparator)+os.Getenv("PATH"))
	}
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	if err := cmd.Run(); err != nil {
		return ""
	}
	line, _, _ := strings.Cut(strings.TrimSpace(stdout.String()), "\n")
	return strings.TrimSpace(line)
}

// hostCLIs answers which version of each agent CLI the sandboxes run from
// this process's view of it (the configured binary on its PATH): the
// sandboxes' own under the local driver, which shares the host's
// filesystem. A thaw checks it before any sandbox work.
type hostCLIs struct{ cfg Config }

func (h hostCLIs) Version(ctx context.Context, name harness.Name) (version, path string) {
	bin := map[harness.Name]string{harness.Claude: h.cfg.ClaudeBin, harness.Codex: h.cfg.CodexBin, harness.Pi: h.cfg.PiBin}[name]
	if bin == "" {
		bin = harness.InstallOf(name).Binary
	}
	found, err := exec.LookPath(bin)
	if err != nil {
		return "", ""
	}
	if abs, err := filepath.Abs(found); err == nil {
		found = abs
	}
	var pathPrepend string
	if name == harness.Pi {
		pathPrepend = h.cfg.PiNodeBinDir
	}
	return cliVersion(ctx, found, pathPrepend), found
}
