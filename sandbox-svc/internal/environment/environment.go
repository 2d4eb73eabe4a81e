// Package environment stores environment definitions (-e NAME): one YAML
// file per environment under <HANGAR_HOME>/environments/, plus the built-in
// "local" environment, which is the git repository of the process's working
// directory at its current HEAD, so a new user needs no config.
package environment

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/hangar-dev/hangar/platform/fault"
)

// Local is the name of the built-in environment.
const Local = "local"

// Egress policies as written in files.
const (
	EgressFull = "full"
	EgressNone = "none"
)

// MaxWarmPoolSize bounds warm_pool_size: each warm sandbox is a full clone.
const MaxWarmPoolSize = 64

// Environment says how to build a sandbox.
type Environment struct {
	Name       string            `json:"name"`
	Repository string            `json:"repository"`
	BaseRef    string            `json:"base_ref,omitempty"`
	Setup      []string          `json:"setup,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	// Egress is full (default) or none.
	Egress       string    `json:"egress,omitempty"`
	Resources    Resources `json:"resources,omitempty"`
	WarmPoolSize int       `json:"warm_pool_size,omitempty"`
	// Driver is local (default) or kubernetes.
	Driver    string    `json:"driver,omitempty"`
	Image     string    `json:"image,omitempty"`
	CacheTTL  string    `json:"cache_ttl,omitempty"`
	UpdatedAt time.Time `json:"updated_at,omitempty"`
	// BuiltIn is true for the default "local" environment when no file
	// overrides it. Not stored.
	BuiltIn bool `json:"-"`
}

// Resources are hints for the driver.
type Resources struct {
	CPUMillis int `json:"cpu_millis,omitempty"`
	MemoryMB  int `json:"memory_mb,omitempty"`
	DiskGB    int `json:"disk_gb,omitempty"`
}

var (
	dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	envName  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// Validate checks e and fills defaults (egress full, driver local).
func (e *Environment) Validate() error {
	if !dnsLabel.MatchString(e.Name) {
		return fault.InvalidArgument("environment.name", "environment name %q must be a DNS label (lowercase letters, digits and '-', at most 63)", e.Name)
	}
	if strings.TrimSpace(e.Repository) == "" {
		return fault.InvalidArgument("environment.repository", "environment %q needs a repository (a local path or a git URL)", e.Name)
	}
	if !isURL(e.Repository) && !filepath.IsAbs(e.Repository) {
		return fault.InvalidArgument("environment.repository", "repository %q must be an absolute path or a git URL", e.Repository)
	}
	if strings.HasPrefix(e.BaseRef, "-") || strings.ContainsAny(e.BaseRef, " \t\n~^:?*[\\") {
		return fault.InvalidArgument("environment.base_ref", "base_ref %q is not a valid git ref", e.BaseRef)
	}
	for i, s := range e.Setup {
		if strings.TrimSpace(s) == "" {
			return fault.InvalidArgument("environment.setup", "setup command %d is empty", i)
		}
	}
	for k := range e.Env {
		if !envName.MatchString(k) {
			return fault.InvalidArgument("environment.env", "env var name %q is not valid", k)
		}
	}
	switch e.Egress {
	case "":
		e.Egress = EgressFull
	case EgressFull, EgressNone:
	default:
		return fault.InvalidArgument("environment.egress", "egress %q must be full or none", e.Egress)
	}
	if e.WarmPoolSize < 0 || e.WarmPoolSize > MaxWarmPoolSize {
		return fault.InvalidArgument("environment.warm_pool_size", "warm_pool_size %d must be between 0 and %d", e.WarmPoolSize, MaxWarmPoolSize)
	}
	if e.Resources.CPUMillis < 0 || e.Resources.MemoryMB < 0 || e.Resources.DiskGB < 0 {
		return fault.InvalidArgument("environment.resources", "resources must not be negative")
	}
	switch e.Driver {
	case "":
		e.Driver = "local"
	case "local", "kubernetes":
	default:
		return fault.InvalidArgument("environment.driver", "driver %q must be local or kubernetes", e.Driver)
	}
	switch e.CacheTTL {
	case "", "auto", "5m", "1h", "off":
	default:
		return fault.InvalidArgument("environment.cache_ttl", "cache_ttl %q must be auto, 5m, 1h or off", e.CacheTTL)
	}
	return nil
}

func isURL(s string) bool {
	if strings.Contains(s, "://") {
		return true
	}
	// scp-like: user@host:path
	at, colon := strings.Index(s, "@"), strings.Index(s, ":")
	return at > 0 && colon > at
}

// Store keeps environments as files.
type Store struct {
	dir string
	now func() time.Time
	// localRepo finds the built-in environment's repository and commit.
	localRepo func(ctx context.Context) (repo, commit string, err error)

	mu sync.Mutex
}

// Options configure a Store.
type Options struct {
	// Home is HANGAR_HOME; files live in Home/environments.
	Home string
	Now  func() time.Time
	// WorkDir is where the built-in environment looks for a git
	// repository; the process's working directory when empty.
	WorkDir string
}

// Open returns a store, creating its directory.
func Open(opts Options) (*Store, error) {
	if opts.Home == "" {
		return nil, errors.New("environment store: home is required")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	dir := filepath.Join(opts.Home, "environments")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("environment store: %w", err)
	}
	wd := opts.WorkDir
	return &Store{dir: dir, now: opts.Now, localRepo: func(ctx context.Context) (string, string, error) {
		return GitRepo(ctx, wd)
	}}, nil
}

// Dir returns the directory holding the files.
func (s *Store) Dir() string { return s.dir }

// GitRepo returns the top level of the git repository containing dir (the
// working directory when empty) and its HEAD commit.
func GitRepo(ctx context.Context, dir string) (string, string, error) {
	run := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = dir
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
		}
		return strings.TrimSpace(out.String()), nil
	}
	top, err := run("rev-parse", "--show-toplevel")
	if err != nil {
		return "", "", err
	}
	commit, err := run("rev-parse", "HEAD")
	if err != nil {
		return "", "", err
	}
	return top, commit, nil
}

func (s *Store) path(name string) string { return filepath.Join(s.dir, name+".yaml") }

func (s *Store) read(name string) (*Environment, error) {
	data, err := os.ReadFile(s.path(name))
	if err != nil {
		return nil, err
	}
	var e Environment
	if err := yaml.UnmarshalStrict(data, &e); err != nil {
		return nil, fmt.Errorf("environment file %s: %w", s.path(name), err)
	}
	if e.Name == "" {
		e.Name = name
	}
	if e.Name != name {
		return nil, fmt.Errorf("environment file %s names %q", s.path(name), e.Name)
	}
	if err := e.Validate(); err != nil {
		return nil, fmt.Errorf("environment file %s: %w", s.path(name), err)
	}
	return &e, nil
}

func (s *Store) builtIn(ctx context.Context) (*Environment, error) {
	repo, commit, err := s.localRepo(ctx)
	if err != nil {
		return nil, fault.Wrap(fault.KindNotFound, "ENVIRONMENT_NOT_FOUND",
			`environment "local" not found: the working directory is not in a git repository; apply one with "hangar env apply"`, err)
	}
	return &Environment{Name: Local, Repository: repo, BaseRef: commit, Egress: EgressFull, Driver: "local", BuiltIn: true}, nil
}

// Get returns the named environment.
func (s *Store) Get(ctx context.Context, name string) (*Environment, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.get(ctx, name)
}

// GetWith returns the named environment with repository (when set) in
// place of its own (WithRepository). The built-in local one needs no
// repository of its own then: `hangar session new` run in a repository
// works when hangar up was started outside any.
func (s *Store) GetWith(ctx context.Context, name, repository string) (*Environment, error) {
	e, err := s.Get(ctx, name)
	if err != nil && name == Local && strings.TrimSpace(repository) != "" && fault.ReasonOf(err) == "ENVIRONMENT_NOT_FOUND" {
		e, err = &Environment{Name: Local, Egress: EgressFull, Driver: "local", BuiltIn: true}, nil
	}
	if err != nil {
		return nil, err
	}
	return WithRepository(e, repository)
}

func (s *Store) get(ctx context.Context, name string) (*Environment, error) {
	if !dnsLabel.MatchString(name) {
		return nil, fault.NotFound("ENVIRONMENT_NOT_FOUND", "environment %q not found", name)
	}
	e, err := s.read(name)
	switch {
	case err == nil:
		return e, nil
	case errors.Is(err, fs.ErrNotExist) && name == Local:
		return s.builtIn(ctx)
	case errors.Is(err, fs.ErrNotExist):
		return nil, fault.NotFound("ENVIRONMENT_NOT_FOUND", "environment %q not found", name)
	}
	return nil, err
}

// List returns every environment sorted by name, the built-in one
// included when the working directory is a git repository. A broken file
// is an error naming it.
func (s *Store) List(ctx context.Context) ([]*Environment, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var out []*Environment
	seenLocal := false
	for _, ent := range entries {
		name, ok := strings.CutSuffix(ent.Name(), ".yaml")
		if !ok || ent.IsDir() {
			continue
		}
		e, err := s.read(name)
		if err != nil {
			return nil, err
		}
		seenLocal = seenLocal || name == Local
		out = append(out, e)
	}
	if !seenLocal {
		if e, err := s.builtIn(ctx); err == nil {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Apply creates or replaces an environment; created is true when it did
// not exist (a file overriding the built-in "local" counts as created).
func (s *Store) Apply(ctx context.Context, e Environment) (*Environment, bool, error) {
	if err := e.Validate(); err != nil {
		return nil, false, err
	}
	e.BuiltIn = false
	e.UpdatedAt = s.now().UTC()
	data, err := yaml.Marshal(e)
	if err != nil {
		return nil, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, statErr := os.Stat(s.path(e.Name))
	created := errors.Is(statErr, fs.ErrNotExist)
	tmp, err := os.CreateTemp(s.dir, "."+e.Name+".*.tmp")
	if err != nil {
		return nil, false, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return nil, false, err
	}
	if err := tmp.Close(); err != nil {
		return nil, false, err
	}
	if err := os.Rename(tmp.Name(), s.path(e.Name)); err != nil {
		return nil, false, err
	}
	return &e, created, nil
}

// Delete removes an environment's file. Deleting "local" removes an
// override; the built-in one cannot be deleted.
func (s *Store) Delete(ctx context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !dnsLabel.MatchString(name) {
		return fault.NotFound("ENVIRONMENT_NOT_FOUND", "environment %q not found", name)
	}
	err := os.Remove(s.path(name))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist) && name == Local:
		return fault.FailedPrecondition("ENVIRONMENT_BUILT_IN", `environment "local" is built in and cannot be deleted`)
	case errors.Is(err, fs.ErrNotExist):
		return fault.NotFound("ENVIRONMENT_NOT_FOUND", "environment %q not found", name)
	}
	return err
}

// WithRepository returns e working on repo instead of its own repository (a
// session's --repo, an ad-hoc environment): everything else is e's, except
// base_ref, which named a ref of e's repository: the copy starts from
// repo's HEAD. repo equal to e's repository (or empty) returns e.
func WithRepository(e *Environment, repo string) (*Environment, error) {
	repo = strings.TrimSpace(repo)
	if repo == "" || repo == e.Repository {
		return e, nil
	}
	if !isURL(repo) && !filepath.IsAbs(repo) {
		return nil, fault.InvalidArgument("repository", "repository %q must be an absolute path or a git URL", repo)
	}
	c := *e
	c.Repository, c.BaseRef, c.BuiltIn = repo, "", false
	return &c, nil
}

// resolveTimeout bounds resolving a base: `git ls-remote` of a URL is a
// network round trip (under a second to GitHub from a typical machine).
const resolveTimeout = 30 * time.Second

// ResolveBase returns the commit a sandbox of e created now starts from:
// e's base_ref (HEAD when empty) in e's repository. A repository this
// machine cannot read is REPOSITORY_UNREACHABLE, naming what is wrong.
func ResolveBase(ctx context.Context, e *Environment) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	ref := e.BaseRef
	if ref == "" {
		ref = "HEAD"
	}
	repo := e.Repository
	if fullCommit.MatchString(ref) {
		return ref, nil
	}
	if isURL(repo) {
		out, err := gitOutput(ctx, "", "ls-remote", "--", repo, ref)
		if err != nil {
			return "", fault.Wrap(fault.KindFailedPrecondition, "REPOSITORY_UNREACHABLE",
				fmt.Sprintf("repository %s cannot be read from hangar's machine (git ls-remote failed): check the URL and that this machine has access", repo), err)
		}
		if f := strings.Fields(out); len(f) > 0 && fullCommit.MatchString(f[0]) {
			return f[0], nil
		}
		return "", fault.FailedPrecondition("BASE_REF_NOT_FOUND", "base ref %q not found in %s", ref, repo)
	}
	st, err := os.Stat(repo)
	if err != nil || !st.IsDir() {
		return "", fault.FailedPrecondition("REPOSITORY_UNREACHABLE",
			"repository %s is not a directory on hangar's machine: hangar runs elsewhere, or as another user; pass a git URL it can clone (--repo URL) or an environment (-e ENV)", repo)
	}
	if _, err := gitOutput(ctx, repo, "rev-parse", "--git-dir"); err != nil {
		return "", fault.FailedPrecondition("REPOSITORY_UNREACHABLE", "%s is not a git repository", repo)
	}
	out, err := gitOutput(ctx, repo, "rev-parse", "--verify", "--quiet", ref+"^{commit}")
	if err != nil {
		if ref == "HEAD" {
			return "", fault.FailedPrecondition("BASE_REF_NOT_FOUND", "repository %s has no commit yet: commit something first", repo)
		}
		return "", fault.FailedPrecondition("BASE_REF_NOT_FOUND", "base ref %q not found in %s", ref, repo)
	}
	return strings.TrimSpace(out), nil
}

var fullCommit = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)

func gitOutput(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "LC_ALL=C")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w: %s", args[0], err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}
