package kubernetes

import (
	"context"
	"fmt"
	"testing"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/drivertest"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
)

// BenchmarkKwokPodStart: one pod created, Ready and deleted through the
// API server, kwok as the node (the control-plane part of a cold start).
func BenchmarkKwokPodStart(b *testing.B) {
	c := needCluster(b)
	ns := c.Namespace(b, fmt.Sprintf("bench-start-%d", nsSeq.Add(1)))
	d := newDriver(b, c, ns, nil)
	b.ResetTimer()
	for i := range b.N {
		sb := newSandbox(d, driver.Spec{ID: fmt.Sprintf("sb-b%d", i), Environment: "bench"}, podName(fmt.Sprintf("sb-b%d", i)), fmt.Sprintf("sb-b%d", i))
		if err := d.reserve(context.Background(), sb); err != nil {
			b.Fatal(err)
		}
		if err := d.startPod(context.Background(), sb); err != nil {
			b.Fatal(err)
		}
		if err := sb.Destroy(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKwokWarmClaim: a warm pod handed out (the label claim with its
// resourceVersion), the pool's part of a warm acquire.
func BenchmarkKwokWarmClaim(b *testing.B) {
	c := needCluster(b)
	ns := c.Namespace(b, fmt.Sprintf("bench-claim-%d", nsSeq.Add(1)))
	d := newDriver(b, c, ns, nil)
	var warm []*Sandbox
	for i := range b.N {
		id := fmt.Sprintf("sb-w%d", i)
		sb := newSandbox(d, driver.Spec{ID: id, Environment: "bench", Pool: "bench"}, podName(id), id)
		if err := d.reserve(context.Background(), sb); err != nil {
			b.Fatal(err)
		}
		if err := d.startPod(context.Background(), sb); err != nil {
			b.Fatal(err)
		}
		warm = append(warm, sb)
	}
	b.ResetTimer()
	for _, sb := range warm {
		if err := sb.Claim(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKwokClaimWarmOtherReplica: a warm pod another replica's pool
// made, found by its pool label and claimed (ClaimWarm: a List and the
// label update), the part of a warm acquire its own pool could not serve.
func BenchmarkKwokClaimWarmOtherReplica(b *testing.B) {
	c := needCluster(b)
	ns := c.Namespace(b, fmt.Sprintf("bench-claimwarm-%d", nsSeq.Add(1)))
	maker := newDriver(b, c, ns, nil)
	d := newDriver(b, c, ns, nil)
	for i := range b.N {
		id := fmt.Sprintf("sb-o%d", i)
		sb := newSandbox(maker, driver.Spec{ID: id, Environment: "bench", Pool: "bench"}, podName(id), id)
		if err := maker.reserve(context.Background(), sb); err != nil {
			b.Fatal(err)
		}
		if err := maker.startPod(context.Background(), sb); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		got, err := d.ClaimWarm(context.Background(), "bench", "")
		if err != nil || got == nil {
			b.Fatalf("ClaimWarm = %v, %v", got, err)
		}
	}
}

// BenchmarkRealNode: a cold create (pod, init container, clone), a warm
// acquire from the pod pool and an exec round trip through the API server
// on the real node, beside the local driver's figures in the same run.
func BenchmarkRealNode(b *testing.B) {
	c := needNode(b)
	ns := c.Namespace(b, fmt.Sprintf("bench-node-%d", nsSeq.Add(1)))
	d := newDriver(b, c, ns, realNodeOpts)
	repo, _ := drivertest.NewRepo(b, map[string]string{"README.md": "bench\n"})
	b.Run("ColdCreate", func(b *testing.B) {
		for i := range b.N {
			sb, err := d.Create(context.Background(), driver.Spec{ID: fmt.Sprintf("sb-cold%d", i), Environment: "bench", Repository: repo})
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			_ = sb.Destroy(context.Background())
			b.StartTimer()
		}
	})
	// A warm acquire: a pool's ready pod (made untimed) claimed and moved
	// to the session's work key, as the pool hands one out (Relocate).
	b.Run("WarmAcquire", func(b *testing.B) {
		b.StopTimer()
		warm := make([]driver.Sandbox, b.N)
		for i := range b.N {
			sb, err := d.Create(context.Background(), driver.Spec{ID: fmt.Sprintf("sb-warm%d", i), Environment: "bench", Pool: "bench-1", Repository: repo})
			if err != nil {
				b.Fatal(err)
			}
			warm[i] = sb
		}
		b.StartTimer()
		for i, sb := range warm {
			if err := sb.Relocate(context.Background(), fmt.Sprintf("session-%d", i)); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		for _, sb := range warm {
			_ = sb.Destroy(context.Background())
		}
	})
	sb, err := d.Create(context.Background(), driver.Spec{ID: "sb-exec", Environment: "bench", Repository: repo})
	if err != nil {
		b.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	b.Run("ExecRoundTrip", func(b *testing.B) { benchExec(b, sb) })
	ld, err := local.New(local.Options{Root: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer ld.Close()
	lsb, err := ld.Create(context.Background(), driver.Spec{ID: "sb-local", Repository: repo})
	if err != nil {
		b.Fatal(err)
	}
	defer lsb.Destroy(context.Background())
	b.Run("LocalExecRoundTrip", func(b *testing.B) { benchExec(b, lsb) })
	b.Run("LocalColdCreate", func(b *testing.B) {
		for i := range b.N {
			sb, err := ld.Create(context.Background(), driver.Spec{ID: fmt.Sprintf("sb-lcold%d", i), Repository: repo})
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			_ = sb.Destroy(context.Background())
			b.StartTimer()
		}
	})
}

func benchExec(b *testing.B, sb driver.Sandbox) {
	for range b.N {
		p, err := sb.Exec(context.Background(), driver.ExecRequest{Argv: []string{"true"}})
		if err != nil {
			b.Fatal(err)
		}
		if st, err := p.Wait(); err != nil || st.Code != 0 {
			b.Fatal(st, err)
		}
	}
}
