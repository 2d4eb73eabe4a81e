// Package toolbuild builds hangar-sandbox from source with the go command
// on PATH, for `hangar up` and tests run from the source tree (a release
// ships the binary beside the services instead).
package toolbuild

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/hangar-dev/hangar/api/sandboxtool"
)

// Package is the tool's main package.
const Package = "github.com/hangar-dev/hangar/sandbox-svc/cmd/hangar-sandbox"

// Build builds the tool into dir/hangar-sandbox, static (CGO_ENABLED=0:
// it runs in images that have no C library of ours), and links
// dir/hangar-agent to it. The go command's cache makes a build of
// unchanged sources cost about a second, and leaves an up-to-date binary
// as it is. It must run inside the source tree (the go.work workspace).
func Build(ctx context.Context, dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", errors.New("the go command is not on PATH")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	out := filepath.Join(dir, sandboxtool.Binary)
	cmd := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-o", out, Package)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w: %s", Package, err, msg)
	}
	agent := filepath.Join(dir, sandboxtool.AgentBinary)
	if target, err := os.Readlink(agent); err != nil || target != sandboxtool.Binary {
		_ = os.Remove(agent)
		if err := os.Symlink(sandboxtool.Binary, agent); err != nil {
			return "", err
		}
	}
	return out, nil
}
