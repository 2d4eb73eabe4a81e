// Package tooltest builds hangar-sandbox once per test process, for tests
// that run the real tool (a sandbox's only helper besides git).
package tooltest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/hangar-dev/hangar/api/sandboxtool/toolbuild"
)

var (
	once sync.Once
	dir  string
	err  error
)

// Dir returns a directory holding hangar-sandbox and hangar-agent, built
// from this source tree the first time it is called in the process. Put
// it on the PATH a sandbox (or a host executor standing in for one) runs
// commands with.
func Dir(tb testing.TB) string {
	tb.Helper()
	once.Do(func() {
		var d string
		if d, err = os.MkdirTemp("", "hangar-sandbox-tool-"); err != nil {
			return
		}
		dir = filepath.Join(d, "bin")
		_, err = toolbuild.Build(context.Background(), dir)
	})
	if err != nil {
		tb.Fatalf("building hangar-sandbox: %v", err)
	}
	return dir
}

// Path returns the built hangar-sandbox.
func Path(tb testing.TB) string {
	return filepath.Join(Dir(tb), "hangar-sandbox")
}

// MinimalPATH returns a PATH that holds the tool and git and nothing else
// (no shell, tar, grep, xargs, coreutils): what a sandbox must have.
func MinimalPATH(tb testing.TB) string {
	tb.Helper()
	gitPath, err := exec.LookPath("git")
	if err != nil {
		tb.Fatalf("git is not on PATH: %v", err)
	}
	gitDir := tb.TempDir()
	if err := os.Symlink(gitPath, filepath.Join(gitDir, "git")); err != nil {
		tb.Fatal(err)
	}
	return Dir(tb) + string(os.PathListSeparator) + gitDir
}
