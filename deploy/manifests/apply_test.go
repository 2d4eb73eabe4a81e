package manifests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/hangar-dev/hangar/sandbox-svc/kubetest"
)

// startCluster runs etcd, kube-apiserver and (when node is set) a kwok
// node, or skips saying what to build.
func startCluster(t *testing.T, node string) *kubetest.Cluster {
	t.Helper()
	assets, why := kubetest.Assets()
	if why != "" {
		t.Skip(why)
	}
	if _, err := os.Stat(filepath.Join(assets, "kwok")); node != "" && err != nil {
		t.Skipf("%s has no kwok: run .ci/build-kube", assets)
	}
	c, err := kubetest.Start(t.Context(), assets, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	if node != "" {
		if err := c.StartKwok(t.Context(), assets, node); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

type applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newApplier(t *testing.T, c *kubetest.Cluster) *applier {
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Client.Discovery()))
	return &applier{dyn: dyn, mapper: mapper}
}

// apply server-side applies o (dryRun: with DryRun=All, what
// kubectl apply --server-side --dry-run=server sends).
func (a *applier) apply(ctx context.Context, o *unstructured.Unstructured, dryRun bool) error {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s %s: %w", gvk, o.GetName(), err)
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = a.dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	opts := metav1.ApplyOptions{FieldManager: "hangar-deploy-test", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	if _, err := ri.Apply(ctx, o.GetName(), o, opts); err != nil {
		return fmt.Errorf("apply %s %s/%s: %w", gvk.Kind, o.GetNamespace(), o.GetName(), err)
	}
	return nil
}

// applyAll applies the namespaces for real (objects in a namespace that
// does not exist fail even a dry run, as with kubectl) and then the rest.
func (a *applier) applyAll(t *testing.T, objs []*unstructured.Unstructured, dryRun bool) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			if err := a.apply(t.Context(), o, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			continue
		}
		if err := a.apply(t.Context(), o, dryRun); err != nil {
			t.Error(err)
		}
	}
}

// TestServerDryRun applies every overlay with a server-side dry run
// against a real kube-apiserver: the API server's own validation and
// defaulting of every object (what kubectl apply --dry-run=server -k does),
// and the dry run leaves nothing behind. With kubectl on the PATH, it runs
// that command too, against the same server.
func TestServerDryRun(t *testing.T) {
	c := startCluster(t, "")
	a := newApplier(t, c)
	for _, overlay := range Overlays {
		t.Run(overlay, func(t *testing.T) {
			objs, err := Render(filepath.Join("overlays", overlay))
			if err != nil {
				t.Fatal(err)
			}
			a.applyAll(t, objs, true)
			// Nothing but the namespace was made.
			deps, err := c.Client.AppsV1().Deployments("hangar").List(t.Context(), metav1.ListOptions{})
			if err != nil || len(deps.Items) != 0 {
				t.Errorf("after a dry run: %d Deployments (%v), want none", len(deps.Items), err)
			}
			kubectl, err := exec.LookPath("kubectl")
			if err != nil {
				t.Log("kubectl not on PATH: the client-go dry run above stands for it")
				return
			}
			out, err := exec.CommandContext(t.Context(), kubectl, "--kubeconfig", c.Kubeconfig, "apply", "--dry-run=server",
				"-k", filepath.Join(Dir(), "overlays", overlay)).CombinedOutput()
			if err != nil {
				t.Errorf("kubectl apply --dry-run=server -k overlays/%s: %v\n%s", overlay, err, out)
			} else if !strings.Contains(string(out), "deployment.apps/session-svc") {
				t.Errorf("kubectl apply --dry-run=server -k overlays/%s printed no session-svc Deployment:\n%s", overlay, out)
			}
		})
	}
}

// TestDevOverlayRuns applies the dev overlay for real and runs its pods on
// a kwok node. There is no controller-manager or scheduler here, so the test
// does their part: a Pod per replica from each Deployment's template, bound
// to the node, as a ReplicaSet and the scheduler would make it. Every pod
// comes up Running and Ready; every Service gets a cluster IP and selects
// its pods; sandbox-svc's ServiceAccount may do what the kubernetes driver
// does, and nothing it should not.
func TestDevOverlayRuns(t *testing.T) {
	const node = "hangar-dev-node"
	c := startCluster(t, node)
	a := newApplier(t, c)
	objs, err := Render("overlays/dev")
	if err != nil {
		t.Fatal(err)
	}
	a.applyAll(t, objs, false)
	if t.Failed() {
		return
	}
	ctx := t.Context()
	ns := "hangar"
	// The service account token controller does not run here.
	if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	var want []string
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		var d appsv1.Deployment
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
			t.Fatal(err)
		}
		for i := range *d.Spec.Replicas {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", d.Name, i), Namespace: ns, Labels: d.Spec.Template.Labels, Annotations: d.Spec.Template.Annotations},
				Spec:       d.Spec.Template.Spec,
			}
			pod.Spec.NodeName = node
			if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatalf("pod from Deployment %s: %v", d.Name, err)
			}
			want = append(want, pod.Name)
		}
	}
	if len(want) != 7 {
		t.Errorf("dev made %d pods (%v), want 7: the five services, Redis and PostgreSQL", len(want), want)
	}
	deadline := time.Now().Add(time.Minute)
	for _, name := range want {
		for {
			p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodRunning && podReady(p) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pod %s not Running and Ready: %+v, %v", name, p.Status, err)
			}
			select {
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	svcs, err := c.Client.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs.Items {
		if s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone {
			t.Errorf("Service %s has no cluster IP", s.Name)
		}
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: s.Spec.Selector})})
		if err != nil || len(pods.Items) == 0 {
			t.Errorf("Service %s selects no running pod (%v)", s.Name, err)
		}
	}

	// sandbox-svc's RBAC, asked of the real authorizer.
	sa := "system:serviceaccount:" + ns + ":hangar-sandbox-svc"
	for _, tc := range []struct {
		group, resource, sub, verb string
		allowed                    bool
	}{
		{"", "pods", "", "create", true}, {"", "pods", "", "watch", true}, {"", "pods", "", "update", true},
		{"", "pods", "", "delete", true}, {"", "pods", "exec", "create", true}, {"", "pods", "exec", "get", true},
		{"coordination.k8s.io", "leases", "", "update", true}, {"coordination.k8s.io", "leases", "", "delete", true},
		{"networking.k8s.io", "networkpolicies", "", "create", true}, {"networking.k8s.io", "networkpolicies", "", "delete", true},
		{"", "secrets", "", "get", false}, {"apps", "deployments", "", "update", false}, {"", "pods", "", "deletecollection", false},
	} {
		r, err := c.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Group: tc.group, Resource: tc.resource, Subresource: tc.sub, Verb: tc.verb},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status.Allowed != tc.allowed {
			t.Errorf("sandbox-svc may %s %s/%s in %s: %v, want %v", tc.verb, tc.resource, tc.sub, ns, r.Status.Allowed, tc.allowed)
		}
	}
	// ...and only in its own namespace.
	r, err := c.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: sa, ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "kube-system", Resource: "pods", Verb: "create"},
	}}, metav1.CreateOptions{})
	if err != nil || r.Status.Allowed {
		t.Errorf("sandbox-svc may create pods in kube-system: %v %v", r.Status.Allowed, err)
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
