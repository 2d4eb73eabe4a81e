package environment_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/environment"
)

func gitRepo(t *testing.T) (string, string) {
	t.Helper()
	dir := t.TempDir()
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "--allow-empty", "-m", "x"},
	} {
		if out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	out, _ := exec.Command("git", "-C", dir, "rev-parse", "HEAD").Output()
	real, _ := filepath.EvalSymlinks(dir)
	return real, strings.TrimSpace(string(out))
}

func TestBuiltInLocal(t *testing.T) {
	repo, commit := gitRepo(t)
	sub := filepath.Join(repo, "sub")
	os.MkdirAll(sub, 0o755)
	s, err := environment.Open(environment.Options{Home: t.TempDir(), WorkDir: sub})
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Get(context.Background(), "local")
	if err != nil {
		t.Fatal(err)
	}
	if e.Repository != repo || e.BaseRef != commit || !e.BuiltIn || e.Egress != "full" {
		t.Errorf("local = %+v, want repo %s at %s", e, repo, commit)
	}
	list, err := s.List(context.Background())
	if err != nil || len(list) != 1 || list[0].Name != "local" {
		t.Errorf("List = %v, %v", list, err)
	}
	if err := s.Delete(context.Background(), "local"); !fault.Is(err, fault.KindFailedPrecondition) {
		t.Errorf("Delete built-in: %v", err)
	}

	notRepo, _ := environment.Open(environment.Options{Home: t.TempDir(), WorkDir: t.TempDir()})
	if _, err := notRepo.Get(context.Background(), "local"); !fault.Is(err, fault.KindNotFound) {
		t.Errorf("local outside a repo: %v", err)
	}
	// Given a repository (session new run in one), local works outside a
	// repository too; other environments still must exist.
	e, err = notRepo.GetWith(context.Background(), "local", repo)
	if err != nil || e.Repository != repo || e.BuiltIn || e.Egress != "full" || e.Driver != "local" {
		t.Errorf("GetWith(local, %s) outside a repo = %+v, %v", repo, e, err)
	}
	if base, err := environment.ResolveBase(context.Background(), e); err != nil || base != commit {
		t.Errorf("ResolveBase = %s, %v; want %s", base, err, commit)
	}
	if _, err := notRepo.GetWith(context.Background(), "local", ""); !fault.Is(err, fault.KindNotFound) {
		t.Errorf("GetWith(local, \"\") outside a repo: %v", err)
	}
	if _, err := notRepo.GetWith(context.Background(), "other", repo); !fault.Is(err, fault.KindNotFound) {
		t.Errorf("GetWith(other, %s): %v", repo, err)
	}
}

func TestCRUD(t *testing.T) {
	repo, _ := gitRepo(t)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	home := t.TempDir()
	s, err := environment.Open(environment.Options{Home: home, WorkDir: repo, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	env := environment.Environment{Name: "web", Repository: repo, BaseRef: "main", Setup: []string{"make deps"},
		Env: map[string]string{"A": "1"}, Egress: "none", WarmPoolSize: 2}
	got, created, err := s.Apply(ctx, env)
	if err != nil || !created || !got.UpdatedAt.Equal(now) {
		t.Fatalf("Apply = %+v %v %v", got, created, err)
	}
	if _, created, _ = s.Apply(ctx, env); created {
		t.Error("second Apply reported created")
	}
	e, err := s.Get(ctx, "web")
	if err != nil || e.Egress != "none" || e.WarmPoolSize != 2 || e.Env["A"] != "1" || e.Setup[0] != "make deps" || e.Driver != "local" {
		t.Errorf("Get = %+v %v", e, err)
	}
	data, _ := os.ReadFile(filepath.Join(home, "environments", "web.yaml"))
	if !strings.Contains(string(data), "warm_pool_size: 2") {
		t.Errorf("file:\n%s", data)
	}
	// An override of local replaces the built-in.
	if _, _, err := s.Apply(ctx, environment.Environment{Name: "local", Repository: repo, WarmPoolSize: 1}); err != nil {
		t.Fatal(err)
	}
	list, _ := s.List(ctx)
	if len(list) != 2 || list[0].Name != "local" || list[0].BuiltIn || list[0].WarmPoolSize != 1 {
		t.Errorf("List = %+v", list)
	}
	if err := s.Delete(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "web"); !fault.Is(err, fault.KindNotFound) || !strings.Contains(err.Error(), `"web"`) {
		t.Errorf("Get deleted: %v", err)
	}
	if err := s.Delete(ctx, "web"); !fault.Is(err, fault.KindNotFound) {
		t.Errorf("Delete twice: %v", err)
	}
}

func TestValidate(t *testing.T) {
	ok := environment.Environment{Name: "ok", Repository: "/srv/repo"}
	cases := []struct {
		name  string
		mod   func(*environment.Environment)
		field string
	}{
		{"upper name", func(e *environment.Environment) { e.Name = "Web" }, "environment.name"},
		{"long name", func(e *environment.Environment) { e.Name = strings.Repeat("a", 64) }, "environment.name"},
		{"no repo", func(e *environment.Environment) { e.Repository = "" }, "environment.repository"},
		{"relative repo", func(e *environment.Environment) { e.Repository = "repo" }, "environment.repository"},
		{"egress", func(e *environment.Environment) { e.Egress = "some" }, "environment.egress"},
		{"pool", func(e *environment.Environment) { e.WarmPoolSize = -1 }, "environment.warm_pool_size"},
		{"pool big", func(e *environment.Environment) { e.WarmPoolSize = 1000 }, "environment.warm_pool_size"},
		{"ref", func(e *environment.Environment) { e.BaseRef = "--upload-pack=x" }, "environment.base_ref"},
		{"env", func(e *environment.Environment) { e.Env = map[string]string{"1X": ""} }, "environment.env"},
		{"driver", func(e *environment.Environment) { e.Driver = "docker" }, "environment.driver"},
		{"cache", func(e *environment.Environment) { e.CacheTTL = "2h" }, "environment.cache_ttl"},
		{"resources", func(e *environment.Environment) { e.Resources.MemoryMB = -5 }, "environment.resources"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := ok
			tc.mod(&e)
			err := e.Validate()
			var fe *fault.Error
			if !fault.Is(err, fault.KindInvalidArgument) || !asFault(err, &fe) || fe.Field != tc.field {
				t.Errorf("Validate = %v, want InvalidArgument on %s", err, tc.field)
			}
		})
	}
	for _, repo := range []string{"https://github.com/x/y.git", "git@github.com:x/y.git", "/abs/path"} {
		e := ok
		e.Repository = repo
		if err := e.Validate(); err != nil {
			t.Errorf("%s: %v", repo, err)
		}
	}
}

func asFault(err error, fe **fault.Error) bool {
	for err != nil {
		if f, ok := err.(*fault.Error); ok {
			*fe = f
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

// An ad-hoc environment (--repo) keeps everything but the repository and
// base_ref, and its base resolves in the other repository: a path, a
// file:// URL, or neither (unreachable, with what to do).
func TestWithRepositoryAndResolveBase(t *testing.T) {
	ctx := context.Background()
	own, ownCommit := gitRepo(t)
	other, otherCommit := gitRepo(t)
	e := &environment.Environment{Name: "web", Repository: own, BaseRef: "main", Setup: []string{"make"}, Egress: environment.EgressNone}

	if got, err := environment.WithRepository(e, own); err != nil || got != e {
		t.Errorf("WithRepository(its own) = %v, %v; want e itself", got, err)
	}
	adhoc, err := environment.WithRepository(e, other)
	if err != nil {
		t.Fatal(err)
	}
	if adhoc.Repository != other || adhoc.BaseRef != "" || adhoc.Setup[0] != "make" || adhoc.Egress != environment.EgressNone || e.Repository != own {
		t.Errorf("ad-hoc environment = %+v (original %+v)", adhoc, e)
	}
	if _, err := environment.WithRepository(e, "relative/dir"); !fault.Is(err, fault.KindInvalidArgument) {
		t.Errorf("relative repository: %v, want InvalidArgument", err)
	}

	for _, tc := range []struct {
		name string
		env  *environment.Environment
		want string
	}{
		{"own main", e, ownCommit},
		{"other HEAD", adhoc, otherCommit},
		{"file URL", &environment.Environment{Repository: "file://" + other}, otherCommit},
		{"a full commit as is", &environment.Environment{Repository: "https://example.invalid/x.git", BaseRef: strings.Repeat("a", 40)}, strings.Repeat("a", 40)},
	} {
		got, err := environment.ResolveBase(ctx, tc.env)
		if err != nil || got != tc.want {
			t.Errorf("%s: ResolveBase = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}

	for _, tc := range []struct {
		name, repo, ref, want string
	}{
		{"missing path", filepath.Join(own, "nope"), "", "is not a directory on hangar's machine"},
		{"not a repository", t.TempDir(), "", "is not a git repository"},
		{"missing ref", own, "no-such-branch", `base ref "no-such-branch" not found`},
		{"unreachable URL", "file://" + filepath.Join(own, "nope"), "", "cannot be read from hangar's machine"},
	} {
		_, err := environment.ResolveBase(ctx, &environment.Environment{Repository: tc.repo, BaseRef: tc.ref})
		if !fault.Is(err, fault.KindFailedPrecondition) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: ResolveBase error %v, want FailedPrecondition containing %q", tc.name, err, tc.want)
		}
	}
}
