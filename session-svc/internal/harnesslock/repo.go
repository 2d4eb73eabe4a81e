package harnesslock

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/hangar-dev/hangar/platform/fault"
)

// Repo reads harness locks from the repository HANGAR_HARNESS_REPO names:
// a local git repository (read where it is, at its HEAD commit) or a git
// URL (mirrored under a cache directory and fetched on every read). The
// file at HEAD holds each lock's newest revision; an earlier revision is
// found in the file's history. Parsed files are kept per commit (a
// commit never changes).
type Repo struct {
	source   string
	cacheDir string

	mu     sync.Mutex
	byBlob map[string]parsed
	// fetching serializes clones and fetches of one mirror.
	fetching sync.Mutex
}

type parsed struct {
	locks []Lock
	err   error
}

// NewRepo reads locks from source (HANGAR_HARNESS_REPO); a URL is
// mirrored below cacheDir. An empty source reads nothing: every call
// says how to set it.
func NewRepo(source, cacheDir string) *Repo {
	return &Repo{source: strings.TrimSpace(source), cacheDir: cacheDir, byBlob: map[string]parsed{}}
}

// Source is HANGAR_HARNESS_REPO as given.
func (r *Repo) Source() string { return r.source }

// errUnset is returned when no repository is configured.
func (r *Repo) errUnset() error {
	return fault.FailedPrecondition("HARNESS_REPO_UNSET",
		"no harness locks here: set HANGAR_HARNESS_REPO to the git repository (path or URL) holding %s", FileName)
}

// List returns the newest revision of every lock, and the commit read.
func (r *Repo) List(ctx context.Context) ([]Lock, string, error) {
	if r.source == "" {
		return nil, "", r.errUnset()
	}
	dir, err := r.gitDir(ctx)
	if err != nil {
		return nil, "", err
	}
	head, err := r.head(ctx, dir)
	if err != nil {
		return nil, "", err
	}
	locks, err := r.locksAt(ctx, dir, head)
	return locks, head, err
}

// Get returns the lock ref names ("team-default@r14", or "team-default" for
// its newest revision).
func (r *Repo) Get(ctx context.Context, ref string) (Lock, error) {
	name, rev, err := ParseRef(ref)
	if err != nil {
		return Lock{}, fault.InvalidArgument("harness_lock", "%s", err.Error())
	}
	if r.source == "" {
		return Lock{}, r.errUnset()
	}
	dir, err := r.gitDir(ctx)
	if err != nil {
		return Lock{}, err
	}
	head, err := r.head(ctx, dir)
	if err != nil {
		return Lock{}, err
	}
	newest, err := r.locksAt(ctx, dir, head)
	if err != nil {
		return Lock{}, err
	}
	cur, ok := find(newest, name)
	if ok && (rev == 0 || cur.Revision == rev) {
		return cur, nil
	}
	// An earlier revision: the file's history, newest first.
	out, err := r.git(ctx, dir, "log", "--format=%H", head, "--", FileName)
	if err != nil {
		return Lock{}, fmt.Errorf("history of %s: %w", FileName, err)
	}
	var revisions []string
	known := false
	for _, commit := range strings.Fields(out) {
		locks, err := r.locksAt(ctx, dir, commit)
		if err != nil {
			// A version of the file that never parsed held no lock.
			continue
		}
		l, ok := find(locks, name)
		if !ok {
			continue
		}
		known = true
		if l.Revision == rev {
			return l, nil
		}
		if r := "r" + fmt.Sprint(l.Revision); !contains(revisions, r) {
			revisions = append(revisions, r)
		}
	}
	if !known {
		return Lock{}, fault.NotFound("HARNESS_LOCK_NOT_FOUND", "harness lock %q is not in %s of %s: `hangar harness lock list` shows the locks there", name, FileName, r.source)
	}
	if !ok {
		return Lock{}, fault.NotFound("HARNESS_LOCK_NOT_FOUND", "harness lock %q is no longer in %s of %s (its revisions were %s)", name, FileName, r.source, strings.Join(revisions, ", "))
	}
	return Lock{}, fault.NotFound("HARNESS_LOCK_REVISION_NOT_FOUND", "harness lock %s has no revision r%d in the history of %s (revisions: %s; newest %s)",
		name, rev, r.source, strings.Join(revisions, ", "), cur.Ref())
}

func find(locks []Lock, name string) (Lock, bool) {
	for _, l := range locks {
		if l.Name == name {
			return l, true
		}
	}
	return Lock{}, false
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// locksAt parses the lock file at commit.
func (r *Repo) locksAt(ctx context.Context, dir, commit string) ([]Lock, error) {
	blob, err := r.git(ctx, dir, "rev-parse", "--verify", "--quiet", commit+":"+FileName)
	if err != nil {
		return nil, fault.NotFound("HARNESS_LOCK_FILE_NOT_FOUND", "%s has no %s at its top at commit %s", r.source, FileName, short(commit))
	}
	blob = strings.TrimSpace(blob)
	r.mu.Lock()
	p, ok := r.byBlob[blob]
	r.mu.Unlock()
	if !ok {
		data, err := r.git(ctx, dir, "cat-file", "blob", blob)
		if err != nil {
			return nil, fmt.Errorf("read %s at %s: %w", FileName, short(commit), err)
		}
		p.locks, p.err = Parse([]byte(data))
		r.mu.Lock()
		r.byBlob[blob] = p
		r.mu.Unlock()
	}
	if p.err != nil {
		return nil, fault.InvalidArgument("harness_lock", "%s in %s (commit %s) does not parse: %s", FileName, r.source, short(commit), p.err.Error())
	}
	out := make([]Lock, len(p.locks))
	for i, l := range p.locks {
		l.Commit = commit
		out[i] = l
	}
	return out, nil
}

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}

// head is the commit the repository's HEAD names.
func (r *Repo) head(ctx context.Context, dir string) (string, error) {
	out, err := r.git(ctx, dir, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
	if err != nil {
		return "", fault.FailedPrecondition("HARNESS_REPO_EMPTY", "HANGAR_HARNESS_REPO=%s has no commit: commit %s there", r.source, FileName)
	}
	return strings.TrimSpace(out), nil
}

// isURL says whether source is a git URL rather than a local path.
func isURL(source string) bool {
	if strings.Contains(source, "://") {
		return true
	}
	// scp-like: user@host:path (a local path has no ':' before a '/').
	if i := strings.Index(source, ":"); i > 0 && !strings.Contains(source[:i], "/") {
		return true
	}
	return false
}

// gitDir is the git directory to read: the local repository, or the
// mirror of the URL, fetched now.
func (r *Repo) gitDir(ctx context.Context) (string, error) {
	if !isURL(r.source) {
		dir := r.source
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return "", fault.FailedPrecondition("HARNESS_REPO_UNREACHABLE", "HANGAR_HARNESS_REPO=%s is not a directory here: give a git repository's path or a git URL", r.source)
		}
		if _, err := r.git(ctx, dir, "rev-parse", "--git-dir"); err != nil {
			return "", fault.FailedPrecondition("HARNESS_REPO_UNREACHABLE", "HANGAR_HARNESS_REPO=%s is not a git repository: run git init there and commit %s", r.source, FileName)
		}
		return dir, nil
	}
	sum := sha256.Sum256([]byte(r.source))
	dir := filepath.Join(r.cacheDir, hex.EncodeToString(sum[:8])+".git")
	r.fetching.Lock()
	defer r.fetching.Unlock()
	if _, err := os.Stat(filepath.Join(dir, "HEAD")); err == nil {
		if _, err := r.git(ctx, dir, "fetch", "--quiet", "--prune", "origin"); err != nil {
			return "", fault.Unavailable("HARNESS_REPO_UNREACHABLE", "cannot fetch HANGAR_HARNESS_REPO=%s: %s", r.source, gitMessage(err))
		}
		return dir, nil
	}
	if err := os.MkdirAll(r.cacheDir, 0o700); err != nil {
		return "", fmt.Errorf("harness lock cache: %w", err)
	}
	tmp, err := os.MkdirTemp(r.cacheDir, "clone-")
	if err != nil {
		return "", fmt.Errorf("harness lock cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	if _, err := r.git(ctx, "", "clone", "--quiet", "--mirror", "--", r.source, tmp); err != nil {
		return "", fault.Unavailable("HARNESS_REPO_UNREACHABLE", "cannot clone HANGAR_HARNESS_REPO=%s: %s", r.source, gitMessage(err))
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", fmt.Errorf("harness lock cache: %w", err)
	}
	return dir, nil
}

// gitError is a git command that failed, with what it said.
type gitError struct {
	args   []string
	stderr string
	err    error
}

func (e *gitError) Error() string {
	return fmt.Sprintf("git %s: %v: %s", strings.Join(e.args, " "), e.err, e.stderr)
}

func (e *gitError) Unwrap() error { return e.err }

// gitMessage is the last line git wrote to stderr: safe to show (it names
// the repository the user configured, no credentials of ours).
func gitMessage(err error) string {
	var ge *gitError
	if errors.As(err, &ge) {
		lines := strings.Split(strings.TrimSpace(ge.stderr), "\n")
		if l := strings.TrimSpace(lines[len(lines)-1]); l != "" {
			return l
		}
	}
	return "git failed"
}

func (r *Repo) git(ctx context.Context, dir string, args ...string) (string, error) {
	full := args
	if dir != "" {
		full = append([]string{"-C", dir}, args...)
	}
	cmd := exec.CommandContext(ctx, "git", full...)
	// Never ask for credentials on a terminal: a read that needs them fails.
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GIT_ASKPASS=true")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &gitError{args: args, stderr: stderr.String(), err: err}
	}
	return stdout.String(), nil
}
