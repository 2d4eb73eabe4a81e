package server_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool/tooltest"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/server"
)

// otherDriver is a driver the server knows only through driver.Driver: the
// local driver under another name, without its optional interfaces
// (Copier, LeftoverCleaner).
type otherDriver struct {
	inner driver.Driver
	name  string
}

func (d otherDriver) Name() string { return d.name }
func (d otherDriver) Create(ctx context.Context, spec driver.Spec) (driver.Sandbox, error) {
	return d.inner.Create(ctx, spec)
}

// The server runs whatever driver it is given, and refuses an environment
// that names a driver it doesn't run instead of running it on its own.
func TestDriverPlugsIn(t *testing.T) {
	home := t.TempDir()
	inner, err := local.New(local.Options{Root: home, Tool: tooltest.Path(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inner.Close() })
	e := start(t, func(d *server.Deps) { d.Home, d.Driver = home, otherDriver{inner: inner, name: "kubernetes"} })
	ctx := context.Background()

	// The built-in environment is a local one: refused by name.
	_, err = e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "t"})
	wantCode(t, err, codes.FailedPrecondition, `environment "local" uses the local driver, but this sandbox service runs the kubernetes driver`)
	_, err = e.client.ApplyEnvironment(ctx, &sandboxv1.ApplyEnvironmentRequest{Environment: &sandboxv1.Environment{Name: "web", Repository: e.repo}})
	wantCode(t, err, codes.FailedPrecondition, `environment "web" uses the local driver`)

	if _, err := e.client.ApplyEnvironment(ctx, &sandboxv1.ApplyEnvironmentRequest{Environment: &sandboxv1.Environment{
		Name: "pods", Repository: e.repo, Driver: "kubernetes"}}); err != nil {
		t.Fatal(err)
	}
	acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Environment: "pods", Holder: "t", WorkKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := execOnce(t, e.client, acq.GetSandbox().GetId(), acq.GetLease().GetFencingToken(), "", "cat", "README.md")
	if err != nil || res.stdout != "hello\n" {
		t.Errorf("exec through the plugged driver = %+v, %v", res, err)
	}
	// No Copier: copies are refused as unimplemented.
	_, err = e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Environment: "pods", Holder: "t",
		CopyOf: acq.GetSandbox().GetId(), CopyOfFencingToken: acq.GetLease().GetFencingToken()})
	wantCode(t, err, codes.Unimplemented, "the kubernetes driver can't copy sandboxes")
	_, err = e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Environment: "pods", Holder: "t", WorkKey: "a/../b"})
	wantCode(t, err, codes.InvalidArgument, "work_key")
}

// Every sandbox has hangar-sandbox and hangar-agent first on its PATH, and
// a sandbox whose tool speaks another protocol (here: none) is refused at
// acquire.
func TestSandboxTool(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "t"})
	if err != nil {
		t.Fatal(err)
	}
	id, tok := acq.GetSandbox().GetId(), acq.GetLease().GetFencingToken()
	res, err := execOnce(t, e.client, id, tok, "", "hangar-sandbox", "version")
	if err != nil || res.exit.GetExitCode() != 0 || !strings.Contains(res.stdout, `"protocol":1`) {
		t.Errorf("hangar-sandbox version = %+v, %v", res, err)
	}
	res, err = execOnce(t, e.client, id, tok, "", "hangar-agent", "ask", "which", "db?")
	if err != nil || res.exit.GetExitCode() != 0 || !strings.Contains(res.stdout, "question is recorded") {
		t.Errorf("hangar-agent ask = %+v, %v", res, err)
	}
	rf, err := e.client.ReadFile(ctx, &sandboxv1.ReadFileRequest{SandboxId: id, FencingToken: tok, Path: acq.GetSandbox().GetHomeDir() + "/.hangar-agent/question"})
	if err != nil || string(rf.GetContent()) != "which db?" {
		t.Errorf("question = %q, %v", rf.GetContent(), err)
	}

	home := t.TempDir()
	bare, err := local.New(local.Options{Root: home})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bare.Close() })
	old := start(t, func(d *server.Deps) { d.Home, d.Driver = home, bare })
	_, err = old.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "t"})
	wantCode(t, err, codes.FailedPrecondition, "hangar-sandbox protocol version 0, this service needs 1")
}
