package sessions

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/platform/blob"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// LocalWork is --from-local: a local checkout's unpushed commits (a bundle
// from BaseCommit), its uncommitted changes to tracked files (one binary
// diff against the local HEAD, staged and unstaged together) and its
// untracked files (a tarball). It is kept until the session's first boot,
// which applies it on the session branch.
type LocalWork struct {
	BaseCommit string `json:"base_commit"`
	Branch     string `json:"branch,omitempty"`
	Bundle     []byte `json:"git_bundle,omitempty"`
	Diff       []byte `json:"diff,omitempty"`
	Untracked  []byte `json:"untracked_tar,omitempty"`
}

// localWorkKey is where a session's LocalWork waits in the artifact store
// for the first boot. Session names never hold '_', so no artifact key
// (<session>/<turn>/<path>) starts like it.
func localWorkKey(name string) string { return "_from-local/" + name + ".json" }

var commitRE = strings.NewReplacer("0", "", "1", "", "2", "", "3", "", "4", "", "5", "", "6", "", "7", "", "8", "", "9", "", "a", "", "b", "", "c", "", "d", "", "e", "", "f", "")

// validate checks what can be checked before a sandbox exists: the base
// commit's form and the tarball's names.
func (lw *LocalWork) validate() error {
	if n := len(lw.BaseCommit); (n != 40 && n != 64) || commitRE.Replace(lw.BaseCommit) != "" {
		return fault.InvalidArgument("from_local.base_commit", "base commit %q is not a full commit id", lw.BaseCommit)
	}
	if len(lw.Untracked) > 0 {
		if err := checkUntrackedTar(lw.Untracked); err != nil {
			return fault.InvalidArgument("from_local.untracked_tar", "untracked files: %v", err)
		}
	}
	return nil
}

// checkUntrackedTar accepts a tarball of regular files, directories and
// symlinks whose names stay inside the work tree and never pass through
// a symlink the tarball itself made.
func checkUntrackedTar(b []byte) error {
	tr := tar.NewReader(bytes.NewReader(b))
	links := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("not a tarball: %w", err)
		}
		name := hdr.Name
		clean := path.Clean(name)
		switch {
		case name == "" || path.IsAbs(name) || strings.HasPrefix(name, "/"):
			return fmt.Errorf("%q is an absolute path", name)
		case clean == ".." || strings.HasPrefix(clean, "../") || strings.Contains("/"+name+"/", "/../"):
			return fmt.Errorf("%q leaves the work tree", name)
		case clean == ".git" || strings.HasPrefix(clean, ".git/"):
			return fmt.Errorf("%q is inside .git", name)
		}
		for dir := path.Dir(clean); dir != "." && dir != "/"; dir = path.Dir(dir) {
			if links[dir] {
				return fmt.Errorf("%q goes through the symlink %q", name, dir)
			}
		}
		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeDir:
		case tar.TypeSymlink:
			links[clean] = true
		default:
			return fmt.Errorf("%q is not a file, directory or symlink", name)
		}
	}
}

// keepLocalWork stores a new session's LocalWork until its first boot.
func (m *Manager) keepLocalWork(ctx context.Context, name string, lw *LocalWork) error {
	b, err := json.Marshal(lw)
	if err != nil {
		return fmt.Errorf("encode local work of %s: %w", name, err)
	}
	if err := m.d.Artifacts.Put(ctx, localWorkKey(name), bytes.NewReader(b)); err != nil {
		return fmt.Errorf("store local work of %s: %w", name, err)
	}
	return nil
}

// localWork returns the LocalWork waiting for s's first boot, if any.
func (m *Manager) localWork(ctx context.Context, name string) (*LocalWork, error) {
	r, err := m.d.Artifacts.Get(ctx, localWorkKey(name))
	if errors.Is(err, blob.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("local work of %s: %w", name, err)
	}
	defer r.Close()
	lw := &LocalWork{}
	if err := json.NewDecoder(r).Decode(lw); err != nil {
		return nil, fmt.Errorf("decode local work of %s: %w", name, err)
	}
	return lw, nil
}

// forgetLocalWork drops a session's LocalWork once its first boot has
// recorded the sandbox (checkpoints keep the work from then on).
func (m *Manager) forgetLocalWork(ctx context.Context, name string) {
	if err := m.d.Artifacts.Delete(ctx, localWorkKey(name)); err != nil && !errors.Is(err, blob.ErrNotFound) {
		m.log.WarnContext(ctx, "local work not dropped", "session", name, "error", err)
	}
}

// applyLocalWork applies the session's LocalWork, if it has one, in its
// newly booted sandbox.
func (m *Manager) applyLocalWork(ctx context.Context, s *store.Session, sb *sandboxv1.Sandbox, token uint64) error {
	lw, err := m.localWork(ctx, s.Name)
	if err != nil || lw == nil {
		return err
	}
	dir := path.Join(sb.GetHomeDir(), ".hangar", "from-local")
	for _, f := range []struct {
		name    string
		content []byte
	}{{"bundle", lw.Bundle}, {"diff", lw.Diff}, {"untracked.tar", lw.Untracked}} {
		if len(f.content) == 0 {
			continue
		}
		if _, err := m.d.Sandboxes.WriteFile(ctx, &sandboxv1.WriteFileRequest{
			SandboxId: sb.GetId(), FencingToken: token, Path: path.Join(dir, f.name), Content: f.content, Mode: 0o600,
		}); err != nil {
			return fmt.Errorf("place local %s of %s: %w", f.name, s.Name, err)
		}
	}
	err = m.tool(ctx, sb.GetId(), token, sandboxtool.CommandFromLocal, sandboxtool.FromLocalRequest{WorkDir: sb.GetWorkDir(), Dir: dir, Branch: s.Branch, Base: lw.BaseCommit}, nil)
	if err != nil {
		if te, ok := errors.AsType[*toolError](err); ok && te.code == sandboxtool.ExitBaseMissing {
			return fault.FailedPrecondition("LOCAL_BASE_MISSING", "your local work is based on commit %s, which the environment's repository does not have: push it, then start the session again", lw.BaseCommit)
		}
		return fault.FailedPrecondition("LOCAL_WORK_NOT_APPLIED", "your local work could not be applied in the sandbox: %s", lastLines(err.Error(), 2))
	}
	m.appendStoreEvents(ctx, s.Name, []store.Event{{Kind: "file_change", Text: "applied the local checkout's work (--from-local)"}})
	return nil
}
