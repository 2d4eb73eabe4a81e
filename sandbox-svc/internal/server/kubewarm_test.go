package server_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/kubernetes"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/server"
	"github.com/hangar-dev/hangar/sandbox-svc/kubetest"
)

// A warm pod of the environment's pool that another replica made is
// acquired (claimed by label update) before any cold create: on a real
// kube-apiserver, kwok as the node.
func TestAcquireClaimsAnotherReplicasWarmPod(t *testing.T) {
	assets, skip := kubetest.Assets()
	if skip != "" {
		t.Skip(skip)
	}
	ctx := context.Background()
	c, err := kubetest.Start(ctx, assets, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	const node = "kwok-warm"
	if err := c.StartKwok(ctx, assets, node); err != nil {
		t.Fatal(err)
	}
	ns := c.Namespace(t, "warm-claim")
	drv, err := kubernetes.New(ctx, kubernetes.Options{Config: c.Config, Namespace: ns, Image: "debian:bookworm", ToolImage: "hangar:test",
		NodeName: node, Replica: "replica-a", ReadyTimeout: 30 * time.Second, DeleteGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drv.Close() })
	// The default pacing: this replica's own pool cannot prepare pods on
	// kwok (no exec), so its creates fail, slowly.
	e := start(t, func(d *server.Deps) { d.Driver, d.PoolLimiter = drv, nil })
	if _, err := e.client.ApplyEnvironment(ctx, &sandboxv1.ApplyEnvironmentRequest{Environment: &sandboxv1.Environment{
		Name: "pods", Repository: e.repo, Driver: "kubernetes", WarmPoolSize: 1}}); err != nil {
		t.Fatal(err)
	}
	pool, err := e.srv.PoolIDOf(ctx, "pods")
	if err != nil {
		t.Fatal(err)
	}
	// Replica b's warm pod, as its driver leaves it once prepared.
	warm := func(id, pool string) {
		t.Helper()
		_, err := c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "hangar-" + id,
				Labels: map[string]string{kubernetes.LabelManagedBy: "hangar", kubernetes.LabelState: kubernetes.StateWarm, kubernetes.LabelPool: pool,
					kubernetes.LabelOwner: "replica-b", kubernetes.LabelEnvironment: "pods", kubernetes.LabelSandbox: id, kubernetes.LabelWorkKey: "x"},
				Annotations: map[string]string{kubernetes.AnnotationID: id, kubernetes.AnnotationEnv: "pods", kubernetes.AnnotationWorkKey: id,
					kubernetes.AnnotationToolVersion: strconv.Itoa(sandboxtool.Version), kubernetes.AnnotationBaseCommit: e.commit,
					kubernetes.AnnotationImage: "debian:bookworm", kubernetes.AnnotationEgress: "full"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "sandbox", Image: "debian:bookworm"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	warm("sb-other-def", "an-earlier-definition")
	warm("sb-b1", pool)
	ready := func(name string) bool {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return true
			}
		}
		return false
	}
	waitFor(t, "replica b's warm pods ready", func() bool { return ready("hangar-sb-b1") && ready("hangar-sb-other-def") })

	acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Environment: "pods", Holder: "t"})
	if err != nil {
		t.Fatalf("acquire with a warm pod of another replica: %v", err)
	}
	if id := acq.GetSandbox().GetId(); id != "sb-b1" {
		t.Fatalf("acquired %q, want replica b's warm pod sb-b1", id)
	}
	p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "hangar-sb-b1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Labels[kubernetes.LabelOwner] != "replica-a" || p.Labels[kubernetes.LabelState] != kubernetes.StateClaimed || p.Labels[kubernetes.LabelPool] != "" {
		t.Errorf("claimed pod labels %v", p.Labels)
	}
	if p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "hangar-sb-other-def", metav1.GetOptions{}); err != nil || p.Labels[kubernetes.LabelState] != kubernetes.StateWarm {
		t.Errorf("a warm pod of another pool definition was touched: %v %v", err, p.GetLabels())
	}
	// Released, it goes (never back to a pool).
	if _, err := e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: "sb-b1", FencingToken: acq.GetLease().GetFencingToken()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the released pod deleted", func() bool {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "hangar-sb-b1", metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
	})
}
