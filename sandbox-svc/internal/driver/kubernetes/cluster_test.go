package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/kubetest"
)

// The tests share one control plane (etcd, kube-apiserver) and one kwok
// node per test binary; each test has its own namespace.
var (
	cluster     *kubetest.Cluster
	clusterSkip string
	clusterErr  error
	assetsDir   string
)

const kwokNode = "kwok-node"

// unpullable is an image kwok's extra stage (below) treats as the kubelet
// treats an image it cannot pull: ErrImagePull and a Warning event.
const unpullable = "registry.invalid/hangar/no-such-image:1"

const pullFailureStage = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-image-pull-failure
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.spec.containers[0].image'
      operator: 'In'
      values: ['` + unpullable + `']
  weight: 10
  next:
    event:
      type: Warning
      reason: Failed
      message: 'Failed to pull image "` + unpullable + `": dial tcp: lookup registry.invalid: no such host'
    statusTemplate: |
      phase: Pending
      containerStatuses:
      - name: sandbox
        image: ` + unpullable + `
        ready: false
        restartCount: 0
        state:
          waiting:
            reason: ErrImagePull
            message: 'failed to pull and unpack image "` + unpullable + `"'
`

func TestMain(m *testing.M) {
	code := func() int {
		dir, skip := kubetest.Assets()
		if skip != "" {
			clusterSkip = skip
			return m.Run()
		}
		assetsDir = dir
		tmp, err := os.MkdirTemp("", "hangar-kube-")
		if err != nil {
			clusterErr = err
			return m.Run()
		}
		defer os.RemoveAll(tmp)
		ctx := context.Background()
		cluster, clusterErr = kubetest.Start(ctx, dir, tmp)
		if clusterErr == nil {
			defer cluster.Stop()
			clusterErr = cluster.StartKwok(ctx, dir, kwokNode, pullFailureStage)
		}
		return m.Run()
	}()
	os.Exit(code)
}

func needCluster(t testing.TB) *kubetest.Cluster {
	t.Helper()
	if clusterSkip != "" {
		t.Skip(clusterSkip)
	}
	if clusterErr != nil {
		t.Fatalf("test cluster: %v", clusterErr)
	}
	return cluster
}

var nsSeq atomic.Int64

func newNamespace(t *testing.T, c *kubetest.Cluster) string {
	name := fmt.Sprintf("t%d-%s", nsSeq.Add(1), strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))
	return c.Namespace(t, strings.TrimRight(name[:min(40, len(name))], "-"))
}

func newDriver(t testing.TB, c *kubetest.Cluster, ns string, mod func(*Options)) *Driver {
	t.Helper()
	opts := Options{Config: c.Config, Namespace: ns, Image: "debian:bookworm", ToolImage: "hangar:test",
		NodeName: kwokNode, Gateway: "10.0.0.7:7404", ReadyTimeout: time.Minute, DeleteGrace: 30 * time.Second}
	if mod != nil {
		mod(&opts)
	}
	d, err := New(context.Background(), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// started makes a sandbox whose pod is ready, without the exec steps of
// Create (kwok runs no containers, so nothing can be exec'd in its pods).
func started(t *testing.T, d *Driver, spec driver.Spec) *Sandbox {
	t.Helper()
	key := spec.WorkKey
	if key == "" {
		key = spec.ID
	}
	sb := newSandbox(d, spec, podName(spec.ID), key)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.reserve(ctx, sb); err != nil {
		t.Fatalf("reserve %s: %v", spec.ID, err)
	}
	if err := d.startPod(ctx, sb); err != nil {
		t.Fatalf("start pod %s: %v", spec.ID, err)
	}
	return sb
}

func getPod(t *testing.T, d *Driver, name string) (*corev1.Pod, bool) {
	t.Helper()
	p, err := d.client.CoreV1().Pods(d.opts.Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return p, true
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestPodFromEnvironment(t *testing.T) {
	c := needCluster(t)
	ns := newNamespace(t, c)
	d := newDriver(t, c, ns, nil)
	sb := started(t, d, driver.Spec{ID: "sb-pod1", WorkKey: "session-one", Environment: "web app", Image: "example.test/web:1",
		CPUMillis: 1500, MemoryMB: 2048, DiskGB: 10})
	pod, ok := getPod(t, d, sb.pod)
	if !ok {
		t.Fatal("no pod")
	}
	if pod.Labels[LabelSandbox] != "sb-pod1" || pod.Labels[LabelEnvironment] == "" || pod.Annotations[AnnotationEnv] != "web app" ||
		pod.Labels[LabelOwner] != d.Replica() || pod.Labels[LabelState] != StateClaimed || pod.Annotations[AnnotationWorkKey] != "session-one" {
		t.Errorf("labels %v annotations %v", pod.Labels, pod.Annotations)
	}
	main := pod.Spec.Containers[0]
	if main.Image != "example.test/web:1" {
		t.Errorf("image %q", main.Image)
	}
	if got := main.Resources.Limits.Cpu().MilliValue(); got != 1500 {
		t.Errorf("cpu limit %d", got)
	}
	if got := main.Resources.Limits.Memory().Value(); got != 2048<<20 {
		t.Errorf("memory limit %d", got)
	}
	if ed := pod.Spec.Volumes[0].EmptyDir; ed == nil || ed.SizeLimit == nil || ed.SizeLimit.String() != "10Gi" {
		t.Errorf("work tree volume %+v", pod.Spec.Volumes[0])
	}
	if ic := pod.Spec.InitContainers; len(ic) != 1 || ic[0].Image != "hangar:test" || !strings.Contains(strings.Join(ic[0].Command, " "), DefaultToolPath) {
		t.Errorf("init container %+v", ic)
	}
	if pod.Status.Phase != corev1.PodRunning {
		t.Errorf("phase %s", pod.Status.Phase)
	}
	// The default image when the environment names none.
	// A pool's pod is warm, labelled with its pool; one made for a lease
	// (no pool) is claimed from the start, work key or not.
	plain := started(t, d, driver.Spec{ID: "sb-pod2", Environment: "plain", Pool: "plain-pool"})
	p2, _ := getPod(t, d, plain.pod)
	if p2.Spec.Containers[0].Image != "debian:bookworm" || p2.Labels[LabelState] != StateWarm || p2.Labels[LabelPool] != "plain-pool" {
		t.Errorf("default image %q state %q pool %q", p2.Spec.Containers[0].Image, p2.Labels[LabelState], p2.Labels[LabelPool])
	}
	leased := started(t, d, driver.Spec{ID: "sb-pod3", Environment: "plain"})
	if p3, _ := getPod(t, d, leased.pod); p3.Labels[LabelState] != StateClaimed || p3.Labels[LabelPool] != "" {
		t.Errorf("a pod made for a lease: labels %v", p3.Labels)
	}
	// A live work key is taken, on this replica and on another.
	if _, err := d.Create(context.Background(), driver.Spec{ID: "sb-other", WorkKey: "session-one"}); !errors.Is(err, driver.ErrInUse) {
		t.Errorf("Create with a live work key: %v, want ErrInUse", err)
	}
	other := newDriver(t, c, ns, nil)
	if _, err := other.Create(context.Background(), driver.Spec{ID: "sb-other", WorkKey: "session-one"}); !errors.Is(err, driver.ErrInUse) {
		t.Errorf("another replica's Create with a live work key: %v, want ErrInUse", err)
	}
	if _, ok := getPod(t, d, podName("sb-other")); ok {
		t.Error("a refused Create left a pod")
	}
	hooked := false
	if err := sb.Destroy(context.Background(), func(ctx context.Context, s driver.Sandbox) error {
		_, ok := getPod(t, d, sb.pod)
		hooked = ok
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !hooked {
		t.Error("the destroy hook ran after the pod was deleted")
	}
	waitFor(t, time.Minute, "the pod to be deleted", func() bool { _, ok := getPod(t, d, sb.pod); return !ok })
	if err := sb.Destroy(context.Background()); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
	if _, err := sb.Exec(context.Background(), driver.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, driver.ErrDestroyed) {
		t.Errorf("exec after destroy: %v", err)
	}
}

func TestEgressNoneNetworkPolicy(t *testing.T) {
	c := needCluster(t)
	ns := newNamespace(t, c)
	d := newDriver(t, c, ns, nil)
	sb := started(t, d, driver.Spec{ID: "sb-egress", Environment: "locked", Egress: driver.EgressNone})
	np, err := d.client.NetworkingV1().NetworkPolicies(ns).Get(context.Background(), sb.pod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("no network policy: %v", err)
	}
	if np.Spec.PodSelector.MatchLabels[LabelSandbox] != "sb-egress" {
		t.Errorf("selector %v", np.Spec.PodSelector.MatchLabels)
	}
	if len(np.Spec.Egress) != 1 || len(np.Spec.Egress[0].To) != 1 || np.Spec.Egress[0].To[0].IPBlock.CIDR != "10.0.0.7/32" ||
		np.Spec.Egress[0].Ports[0].Port.IntValue() != 7404 {
		t.Errorf("egress rules %+v, want only the gateway 10.0.0.7:7404", np.Spec.Egress)
	}
	pod, _ := getPod(t, d, sb.pod)
	selected := true
	for k, v := range np.Spec.PodSelector.MatchLabels {
		selected = selected && pod.Labels[k] == v
	}
	if !selected {
		t.Error("the policy does not select the sandbox's pod")
	}
	full := started(t, d, driver.Spec{ID: "sb-full", Environment: "open"})
	if _, err := d.client.NetworkingV1().NetworkPolicies(ns).Get(context.Background(), full.pod, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("egress full has a policy: %v", err)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.NetworkingV1().NetworkPolicies(ns).Get(context.Background(), sb.pod, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("policy after destroy: %v", err)
	}
	// A gateway a policy cannot name: egress none is refused, nothing left.
	named := newDriver(t, c, ns, func(o *Options) { o.Gateway = "gateway.internal:7404" })
	if _, err := named.Create(context.Background(), driver.Spec{ID: "sb-egress2", Egress: driver.EgressNone, Repository: "/nowhere"}); !errors.Is(err, driver.ErrEgressUnsupported) {
		t.Errorf("egress none with a host-named gateway: %v", err)
	}
	if _, ok := getPod(t, d, podName("sb-egress2")); ok {
		t.Error("pod left behind")
	}
}

// A gateway named by its Service (the deployment's gateway-svc:7404): the
// sandbox reaches it by cluster IP (egress none has no DNS) and the policy
// allows the Service's pods on their target port.
func TestEgressNoneToGatewayService(t *testing.T) {
	c := needCluster(t)
	ns := newNamespace(t, c)
	svc, err := c.Client.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "gateway-svc"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app.kubernetes.io/name": "gateway-svc"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 7404, TargetPort: intstr.FromString("gateway")}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := newDriver(t, c, ns, func(o *Options) { o.Gateway = "gateway-svc:7404" })
	sb := started(t, d, driver.Spec{ID: "sb-egress-svc", Environment: "locked", Egress: driver.EgressNone})
	np, err := d.client.NetworkingV1().NetworkPolicies(ns).Get(context.Background(), sb.pod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("no network policy: %v", err)
	}
	if len(np.Spec.Egress) != 1 || len(np.Spec.Egress[0].To) != 1 || np.Spec.Egress[0].To[0].PodSelector == nil ||
		np.Spec.Egress[0].To[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "gateway-svc" || np.Spec.Egress[0].To[0].IPBlock != nil ||
		np.Spec.Egress[0].Ports[0].Port.String() != "gateway" {
		t.Errorf("egress rules %+v, want only the gateway Service's pods on port \"gateway\"", np.Spec.Egress)
	}
	want := svc.Spec.ClusterIP + ":7404"
	if got := d.gatewayAddr(); got != want || svc.Spec.ClusterIP == "" {
		t.Errorf("HANGAR_GATEWAY_ADDR %q, want the cluster IP %q", got, want)
	}
	env := strings.Join(sb.env(nil, nil), "\n")
	if !strings.Contains(env, "HANGAR_GATEWAY_ADDR="+want+"\n") && !strings.HasSuffix(env, "HANGAR_GATEWAY_ADDR="+want) {
		t.Errorf("the sandbox's environment names another gateway:\n%s", env)
	}
	// A Service of another name: refused, no pod left.
	other := newDriver(t, c, ns, func(o *Options) { o.Gateway = "no-such-svc:7404" })
	if _, err := other.Create(context.Background(), driver.Spec{ID: "sb-egress-svc2", Egress: driver.EgressNone, Repository: "/nowhere"}); !errors.Is(err, driver.ErrEgressUnsupported) || !strings.Contains(err.Error(), "no-such-svc") {
		t.Errorf("egress none with a missing gateway Service: %v", err)
	}
	if _, ok := getPod(t, d, podName("sb-egress-svc2")); ok {
		t.Error("pod left behind")
	}
}

func TestServiceName(t *testing.T) {
	for _, c := range []struct{ host, name, ns string }{
		{"gateway-svc", "gateway-svc", "hangar"},
		{"gateway-svc.other", "gateway-svc", "other"},
		{"gateway-svc.other.svc", "gateway-svc", "other"},
		{"gateway-svc.other.svc.cluster.local", "gateway-svc", "other"},
		{"gateway.example.com", "", ""},
		{"", "", ""},
	} {
		name, ns, ok := serviceName(c.host, "hangar")
		if name != c.name || ns != c.ns || ok != (c.name != "") {
			t.Errorf("serviceName(%q) = %q %q %v", c.host, name, ns, ok)
		}
	}
}

func TestBadImageReasonFromEvents(t *testing.T) {
	c := needCluster(t)
	ns := newNamespace(t, c)
	d := newDriver(t, c, ns, nil)
	_, err := d.Create(context.Background(), driver.Spec{ID: "sb-pull", Environment: "broken", Image: unpullable, Repository: "/nowhere"})
	if !errors.Is(err, ErrPodFailed) || !strings.Contains(err.Error(), "ErrImagePull") || !strings.Contains(err.Error(), "no such host") {
		t.Fatalf("Create with an unpullable image: %v, want ErrPodFailed with the pull error and the event", err)
	}
	t.Logf("error: %v", err)
	waitFor(t, time.Minute, "the failed pod to be deleted", func() bool { _, ok := getPod(t, d, podName("sb-pull")); return !ok })

	// A pod that never becomes ready (bound to a node no kubelet serves).
	slow := newDriver(t, c, ns, func(o *Options) { o.NodeName = "no-such-node"; o.ReadyTimeout = 2 * time.Second })
	_, err = slow.Create(context.Background(), driver.Spec{ID: "sb-never", Environment: "broken", Repository: "/nowhere"})
	if !errors.Is(err, ErrPodFailed) || !strings.Contains(err.Error(), "not ready within 2s") {
		t.Fatalf("Create of a pod that is never ready: %v", err)
	}
	waitFor(t, time.Minute, "the unready pod to be deleted", func() bool { _, ok := getPod(t, d, podName("sb-never")); return !ok })
	if _, err := slow.Create(context.Background(), driver.Spec{ID: "sb-never2", WorkKey: "sb-never", Repository: "/nowhere"}); errors.Is(err, driver.ErrInUse) {
		t.Errorf("a failed create kept its work key: %v", err)
	}
}

func TestAPIServerUnreachable(t *testing.T) {
	// Needs no cluster: a closed port.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := "https://" + l.Addr().String()
	l.Close()
	_, err = New(context.Background(), Options{Config: &rest.Config{Host: host, Timeout: 5 * time.Second, TLSClientConfig: rest.TLSClientConfig{Insecure: true}},
		Namespace: "hangar", ToolImage: "hangar:test"})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), host) {
		t.Fatalf("New against a closed port: %v, want ErrUnavailable naming %s", err, host)
	}
}

// The API server lost after the driver started (here: the only route to
// it, a TCP forwarder, closed): a create is ErrUnavailable naming it, and
// leaves nothing behind (the work key is free again).
func TestAPIServerGoesAway(t *testing.T) {
	c := needCluster(t)
	ns := newNamespace(t, c)
	fw := forward(t, strings.TrimPrefix(c.Host(), "https://"))
	cfg := rest.CopyConfig(c.Config)
	cfg.Host, cfg.Timeout = "https://"+fw.Addr().String(), 5*time.Second
	d := newDriver(t, c, ns, func(o *Options) { o.Config = cfg })
	fw.Close()
	_, err := d.Create(context.Background(), driver.Spec{ID: "sb-gone-api", WorkKey: "session-api", Repository: "/nowhere"})
	if !errors.Is(err, driver.ErrBackendUnavailable) || !strings.Contains(err.Error(), cfg.Host) {
		t.Fatalf("Create with the API server gone: %v, want ErrBackendUnavailable naming %s", err, cfg.Host)
	}
	d.mu.Lock()
	live, keys := len(d.live), len(d.keys)
	d.mu.Unlock()
	if live != 0 || keys != 0 {
		t.Errorf("a failed create left %d live sandboxes, %d work keys", live, keys)
	}
	if _, err := d.ClaimWarm(context.Background(), "pool-1", ""); !errors.Is(err, driver.ErrBackendUnavailable) {
		t.Errorf("ClaimWarm with the API server gone: %v", err)
	}
}

// forwarder passes TCP connections to addr until closed; Close also cuts
// the connections it passed.
type forwarder struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func forward(t *testing.T, addr string) *forwarder { return forwardOn(t, "127.0.0.1:0", addr) }

// forwardOn is forward listening on listen.
func forwardOn(t *testing.T, listen, addr string) *forwarder {
	t.Helper()
	l, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{Listener: l}
	t.Cleanup(func() { f.Close() })
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				in.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, in, out)
			f.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); out.Close() }()
			go func() { _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	return f
}

func (f *forwarder) Close() error {
	err := f.Listener.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
	return err
}

func TestWarmClaimsNeverDoubleHandOut(t *testing.T) {
	c := needCluster(t)
	ns := newNamespace(t, c)
	a := newDriver(t, c, ns, nil)
	b := newDriver(t, c, ns, nil)
	const warm = 4
	var made []*Sandbox
	for i := range warm {
		sb := started(t, a, driver.Spec{ID: fmt.Sprintf("sb-warm%d", i), Environment: "pool", Pool: "pool-1"})
		made = append(made, sb)
	}
	// Another pool (another environment, or this one as it was before an
	// edit) and a leased pod of the environment are never claimed warm.
	started(t, a, driver.Spec{ID: "sb-warm-other-env", Environment: "other", Pool: "other-1"})
	started(t, a, driver.Spec{ID: "sb-warm-old-def", Environment: "pool", Pool: "pool-0"})
	started(t, a, driver.Spec{ID: "sb-leased", Environment: "pool"})
	// Replica a hands its own warm pods out (Claim) while replica b
	// adopts warm pods of the environment (ClaimWarm), all at once.
	var mu sync.Mutex
	owners := map[string][]string{}
	var wg sync.WaitGroup
	for _, sb := range made {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := sb.Claim(context.Background())
			if err == nil {
				mu.Lock()
				owners[sb.pod] = append(owners[sb.pod], "a")
				mu.Unlock()
			} else if !errors.Is(err, driver.ErrInUse) {
				t.Errorf("claim %s: %v", sb.pod, err)
			}
		}()
	}
	for range warm {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := b.ClaimWarm(context.Background(), "pool-1", "")
			if err != nil {
				t.Errorf("ClaimWarm: %v", err)
				return
			}
			if got != nil {
				sb := got.(*Sandbox)
				mu.Lock()
				owners[sb.pod] = append(owners[sb.pod], "b")
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(owners) != warm {
		t.Errorf("%d of %d warm pods handed out: %v", len(owners), warm, owners)
	}
	for pod, who := range owners {
		if len(who) != 1 {
			t.Errorf("pod %s handed out %d times: %v", pod, len(who), who)
		}
		p, _ := getPod(t, a, pod)
		want := a.Replica()
		if who[0] == "b" {
			want = b.Replica()
		}
		if p.Labels[LabelOwner] != want || p.Labels[LabelState] != StateClaimed {
			t.Errorf("pod %s labels %v after %s claimed it", pod, p.Labels, who[0])
		}
	}
	if sb, err := b.ClaimWarm(context.Background(), "pool-1", ""); sb != nil || err != nil {
		t.Errorf("ClaimWarm with none left: %v %v", sb, err)
	}
	// A's pods that b claimed first: a forgets them and leaves them be.
	for _, sb := range made {
		if who := owners[sb.pod]; len(who) == 1 && who[0] == "b" {
			if err := sb.Destroy(context.Background()); err != nil {
				t.Errorf("destroy of a pod lost to b: %v", err)
			}
			if p, ok := getPod(t, a, sb.pod); !ok || p.DeletionTimestamp != nil || p.Labels[LabelOwner] != b.Replica() {
				t.Errorf("pod %s that b claimed was deleted or changed by a's Destroy", sb.pod)
			}
		}
	}
}

// A claim that meets a newer resourceVersion only because the pod's status
// changed (the kubelet's update) still claims it: one read and retry.
func TestClaimAfterStatusUpdate(t *testing.T) {
	c := needCluster(t)
	ns := newNamespace(t, c)
	d := newDriver(t, c, ns, nil)
	sb := started(t, d, driver.Spec{ID: "sb-stale", Environment: "pool", Pool: "pool-1"})
	p, _ := getPod(t, d, sb.pod)
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: "hangar.dev/test", Status: corev1.ConditionTrue})
	if _, err := c.Client.CoreV1().Pods(ns).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := sb.Claim(context.Background()); err != nil {
		t.Fatalf("claim after a status update: %v", err)
	}
	if p, _ := getPod(t, d, sb.pod); p.Labels[LabelState] != StateClaimed || p.Labels[LabelOwner] != d.Replica() || p.Labels[LabelPool] != "" {
		t.Errorf("labels after the claim %v", p.Labels)
	}
}

func TestLeftoversByLabel(t *testing.T) {
	c := needCluster(t)
	ns := newNamespace(t, c)
	crashed := newDriver(t, c, ns, func(o *Options) { o.Replica = "crashed" })
	lo1 := started(t, crashed, driver.Spec{ID: "sb-left1", WorkKey: "session-left", Environment: "e"})
	started(t, crashed, driver.Spec{ID: "sb-left2", Environment: "e", Egress: driver.EgressNone})
	// It stops without destroying its sandboxes: its Lease goes with it.
	if err := crashed.Close(); err != nil {
		t.Fatal(err)
	}
	alive := newDriver(t, c, ns, func(o *Options) { o.Replica = "alive" })
	keep := started(t, alive, driver.Spec{ID: "sb-keep", Environment: "e"})

	next := newDriver(t, c, ns, nil)
	list, err := next.Leftovers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]driver.Leftover{}
	for _, lo := range list {
		got[lo.ID] = lo
	}
	if len(got) != 2 || got["sb-left1"].Key != "session-left" || got["sb-left2"].Environment != "e" {
		t.Fatalf("leftovers %+v, want the crashed replica's two pods only", list)
	}
	// One changes after the listing (a replica claimed it): not removed.
	pod, _ := getPod(t, next, lo1.pod)
	pod.Labels["touched"] = "yes"
	if _, err := next.client.CoreV1().Pods(ns).Update(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if removed, err := next.RemoveLeftover(context.Background(), got["sb-left1"]); err != nil || removed {
		t.Errorf("RemoveLeftover of a pod changed since listed = %v, %v; want false", removed, err)
	}
	if removed, err := next.RemoveLeftover(context.Background(), got["sb-left2"]); err != nil || !removed {
		t.Errorf("RemoveLeftover = %v, %v", removed, err)
	}
	waitFor(t, time.Minute, "the leftover pod to go", func() bool { _, ok := getPod(t, next, podName("sb-left2")); return !ok })
	if _, err := next.client.NetworkingV1().NetworkPolicies(ns).Get(context.Background(), podName("sb-left2"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("leftover's network policy: %v", err)
	}
	if _, ok := getPod(t, next, keep.pod); !ok {
		t.Error("a live replica's pod was removed")
	}
}

func TestPodDeletedBySomeoneElseRunsHooks(t *testing.T) {
	c := needCluster(t)
	ns := newNamespace(t, c)
	d := newDriver(t, c, ns, nil)
	gone := make(chan string, 4)
	d.NotifyGone(func(id string) { gone <- id })
	select {
	case <-d.watchOK:
	case <-time.After(time.Minute):
		t.Fatal("pod watch did not start")
	}
	sb := started(t, d, driver.Spec{ID: "sb-evicted", Environment: "e"})
	mine := started(t, d, driver.Spec{ID: "sb-mine", Environment: "e"})
	if err := mine.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), sb.pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-gone:
		if id != "sb-evicted" {
			t.Errorf("gone %q, want sb-evicted (its own Destroy is not reported)", id)
		}
	case <-time.After(time.Minute):
		t.Fatal("no report of the deleted pod")
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-gone:
		t.Errorf("reported again: %s", id)
	default:
	}
}
