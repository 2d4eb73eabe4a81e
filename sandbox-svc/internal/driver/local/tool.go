package local

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/hangar-dev/hangar/api/sandboxtool"
)

// toolDirName is the directory in the sandboxes directory that holds the
// driver's copy of hangar-sandbox (and hangar-agent, a link to it). It
// goes first on every sandbox process's PATH. Its name is not a valid
// work key, so no sandbox can take it.
const toolDirName = ".tool"

// installTool checks the tool at src speaks this build's protocol and
// copies it, read-only, into the sandboxes directory: a rebuild of src
// while the driver runs changes nothing its sandboxes run.
func installTool(src, sandboxes string) (string, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	version, err := toolVersion(ctx, src)
	if err != nil {
		return "", 0, err
	}
	if version != sandboxtool.Version {
		return "", 0, fmt.Errorf("%s speaks protocol version %d, this sandbox service version %d: use the hangar-sandbox of this release", src, version, sandboxtool.Version)
	}
	dir := filepath.Join(sandboxes, toolDirName)
	if err := os.RemoveAll(dir); err != nil {
		return "", 0, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", 0, err
	}
	if err := copyExecutable(src, filepath.Join(dir, sandboxtool.Binary)); err != nil {
		return "", 0, fmt.Errorf("install %s: %w", src, err)
	}
	if err := os.Symlink(sandboxtool.Binary, filepath.Join(dir, sandboxtool.AgentBinary)); err != nil {
		return "", 0, err
	}
	return dir, version, nil
}

// toolVersion asks the tool at path which protocol it speaks.
func toolVersion(ctx context.Context, path string) (int, error) {
	out, err := exec.CommandContext(ctx, path, sandboxtool.CommandVersion).Output()
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", path, sandboxtool.CommandVersion, err)
	}
	var v sandboxtool.VersionResponse
	if err := json.Unmarshal(out, &v); err != nil {
		return 0, fmt.Errorf("%s %s: %w", path, sandboxtool.CommandVersion, err)
	}
	return v.Protocol, nil
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o555)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
