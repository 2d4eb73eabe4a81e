package kubernetes

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/drivertest"
	"github.com/hangar-dev/hangar/sandbox-svc/kubetest"
)

const realNode = "real-node"

var (
	nodeOnce sync.Once
	nodeErr  error
)

// needNode starts (once) a real node: kubelet, containerd, runc and the
// bridge CNI plugin, with the sandbox image imported.
func needNode(t testing.TB) *kubetest.Cluster {
	t.Helper()
	c := needCluster(t)
	if skip := kubetest.NodeSkip(assetsDir); skip != "" {
		t.Skip(skip)
	}
	nodeOnce.Do(func() { nodeErr = c.StartNode(context.Background(), assetsDir, realNode) })
	if nodeErr != nil {
		t.Fatalf("real node: %v\nkubelet log tail:\n%s", nodeErr, tail(c.Log("kubelet-"+realNode), 4000))
	}
	return c
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// realNodeOpts places pods on the real node with the imported image.
func realNodeOpts(o *Options) {
	image := os.Getenv(kubetest.ImageEnv)
	o.NodeName, o.Image, o.ToolImage, o.ReadyTimeout = realNode, image, image, 3*time.Minute
	o.Gateway = "10.244.0.1:7404"
	o.DeleteGrace = 5 * time.Second
}

func realNodeDriver(t testing.TB, c *kubetest.Cluster, ns string) *Driver {
	return newDriver(t, c, ns, realNodeOpts)
}

// TestConformanceOnRealNode runs the driver suite on pods of a real
// kubelet: exec, files and terminals through the API server.
func TestConformanceOnRealNode(t *testing.T) {
	c := needNode(t)
	ns := newNamespace(t, c)
	drivertest.RunOptions(t, func(t *testing.T) driver.Driver { return realNodeDriver(t, c, ns) }, drivertest.Options{
		// The pods' bridge reaches this machine at its gateway address.
		HostIP: "10.244.0.1",
		Skip: map[string]string{
			"EgressNone": "the bridge CNI plugin here does not enforce NetworkPolicies (the policy itself is tested in TestEgressNoneNetworkPolicy)",
		},
	})
}
