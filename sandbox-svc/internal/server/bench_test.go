package server_test

import (
	"context"
	"fmt"
	"github.com/hangar-dev/hangar/api/sandboxtool/tooltest"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/server"
)

var (
	bigRepoOnce sync.Once
	bigRepoDir  string
	bigRepoErr  error
)

// bigRepo generates, once per test binary, a repository of 5,000 files
// totalling 100 MB (incompressible content, so git cannot shrink it).
func bigRepo(b *testing.B) string {
	bigRepoOnce.Do(func() {
		dir, err := os.MkdirTemp("", "hangar-bench-repo-")
		if err != nil {
			bigRepoErr = err
			return
		}
		bigRepoDir = dir
		rng := rand.New(rand.NewPCG(1, 2))
		buf := make([]byte, 100<<20/5000)
		for i := range 5000 {
			for j := 0; j < len(buf); j += 8 {
				v := rng.Uint64()
				for k := 0; k < 8 && j+k < len(buf); k++ {
					buf[j+k] = byte(v >> (8 * k))
				}
			}
			p := filepath.Join(dir, fmt.Sprintf("d%02d", i%50), fmt.Sprintf("f%04d.bin", i))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				bigRepoErr = err
				return
			}
			if err := os.WriteFile(p, buf, 0o644); err != nil {
				bigRepoErr = err
				return
			}
		}
		for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "-A"}, {"-c", "user.name=b", "-c", "user.email=b@e", "commit", "-q", "-m", "big"}} {
			cmd := exec.Command("git", args...)
			cmd.Dir = dir
			if out, err := cmd.CombinedOutput(); err != nil {
				bigRepoErr = fmt.Errorf("git %v: %v: %s", args, err, out)
				return
			}
		}
	})
	if bigRepoErr != nil {
		b.Fatal(bigRepoErr)
	}
	return bigRepoDir
}

func BenchmarkAcquire(b *testing.B) {
	repo := bigRepo(b)
	for _, mode := range []string{"warm", "cold"} {
		b.Run(mode, func(b *testing.B) {
			e := start(b, nil)
			ctx := context.Background()
			size := int32(0)
			if mode == "warm" {
				size = 2
			}
			if _, err := e.client.ApplyEnvironment(ctx, &sandboxv1.ApplyEnvironmentRequest{Environment: &sandboxv1.Environment{
				Name: "big", Repository: repo, WarmPoolSize: size}}); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if mode == "warm" {
					b.StopTimer()
					waitFor(b, "a ready sandbox", func() bool {
						p, err := e.client.GetPool(ctx, &sandboxv1.GetPoolRequest{Environment: "big"})
						return err == nil && p.GetPool().GetReady() > 0
					})
					b.StartTimer()
				}
				acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Environment: "big", Cold: mode == "cold"})
				if err != nil {
					b.Fatal(err)
				}
				if acq.GetSandbox().GetFromPool() != (mode == "warm") {
					b.Fatalf("from_pool = %v", acq.GetSandbox().GetFromPool())
				}
				b.StopTimer()
				e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: acq.GetSandbox().GetId(), FencingToken: acq.GetLease().GetFencingToken()})
				b.StartTimer()
			}
		})
	}
}

// isolations are the ways sandboxes run, for benchmarks that compare them.
var isolations = []struct {
	name string
	iso  local.Isolation
}{{"bwrap", local.IsolationBwrap}, {"none", local.IsolationNone}}

// withIsolation gives the server a local driver isolating as iso.
func withIsolation(b *testing.B, iso local.Isolation) func(*server.Deps) {
	return func(d *server.Deps) {
		drv, err := local.New(local.Options{Root: d.Home, Tool: tooltest.Path(b), Isolation: iso})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { drv.Close() })
		d.Driver = drv
	}
}

func BenchmarkExecRoundTrip(b *testing.B) {
	for _, is := range isolations {
		b.Run("isolation="+is.name, func(b *testing.B) {
			e := start(b, withIsolation(b, is.iso))
			acq, err := e.client.AcquireSandbox(context.Background(), &sandboxv1.AcquireSandboxRequest{})
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				r, err := execOnce(b, e.client, acq.GetSandbox().GetId(), acq.GetLease().GetFencingToken(), "", "true")
				if err != nil || r.exit.GetExitCode() != 0 {
					b.Fatal(r, err)
				}
			}
		})
	}
}

// BenchmarkCreateAndExec: a cold sandbox of a small repository (clone,
// no setup), its first command (under isolation the one that makes its
// namespaces) and its release.
func BenchmarkCreateAndExec(b *testing.B) {
	for _, is := range isolations {
		b.Run("isolation="+is.name, func(b *testing.B) {
			e := start(b, withIsolation(b, is.iso))
			ctx := context.Background()
			for b.Loop() {
				acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Cold: true})
				if err != nil {
					b.Fatal(err)
				}
				r, err := execOnce(b, e.client, acq.GetSandbox().GetId(), acq.GetLease().GetFencingToken(), "", "true")
				if err != nil || r.exit.GetExitCode() != 0 {
					b.Fatal(r, err)
				}
				if _, err := e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: acq.GetSandbox().GetId(), FencingToken: acq.GetLease().GetFencingToken()}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkExecThroughput512MB(b *testing.B) {
	e := start(b, nil)
	acq, err := e.client.AcquireSandbox(context.Background(), &sandboxv1.AcquireSandboxRequest{})
	if err != nil {
		b.Fatal(err)
	}
	const size = 512 << 20
	b.SetBytes(size)
	for b.Loop() {
		stream, err := e.client.Exec(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Start{Start: &sandboxv1.ExecStart{
			SandboxId: acq.GetSandbox().GetId(), FencingToken: acq.GetLease().GetFencingToken(),
			Command: []string{"head", "-c", fmt.Sprint(size), "/dev/zero"}}}})
		stream.CloseSend()
		got := 0
		for {
			msg, err := stream.Recv()
			if err != nil {
				b.Fatal(err)
			}
			got += len(msg.GetStdout())
			if msg.GetExit() != nil {
				break
			}
		}
		if got != size {
			b.Fatalf("got %d bytes", got)
		}
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bigRepoDir != "" {
		os.RemoveAll(bigRepoDir)
	}
	os.Exit(code)
}
