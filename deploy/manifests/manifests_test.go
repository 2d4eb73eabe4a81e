package manifests

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

// services are the five control-plane services and their ports (each
// binary's default HANGAR_<SVC>_ADDR port).
var services = map[string]struct {
	port    int32
	addrVar string
}{
	"session-svc":    {7401, "HANGAR_SESSION_ADDR"},
	"sandbox-svc":    {7402, "HANGAR_SANDBOX_ADDR"},
	"checkpoint-svc": {7403, "HANGAR_CHECKPOINT_ADDR"},
	"gateway-svc":    {7404, "HANGAR_GATEWAY_ADDR"},
	"replay-svc":     {7405, "HANGAR_REPLAY_ADDR"},
}

type rendered struct {
	objs []*unstructured.Unstructured
}

func render(t *testing.T, overlay string) rendered {
	t.Helper()
	objs, err := Render(filepath.Join("overlays", overlay))
	if err != nil {
		t.Fatal(err)
	}
	return rendered{objs}
}

func (r rendered) get(t *testing.T, kind, name string, into any) bool {
	t.Helper()
	for _, o := range r.objs {
		if o.GetKind() == kind && o.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
				t.Fatalf("%s/%s: %v", kind, name, err)
			}
			return true
		}
	}
	return false
}

func (r rendered) all(t *testing.T, kind string, into func(o *unstructured.Unstructured)) {
	t.Helper()
	for _, o := range r.objs {
		if o.GetKind() == kind {
			into(o)
		}
	}
}

func env(c corev1.Container, name string) (corev1.EnvVar, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e, true
		}
	}
	return corev1.EnvVar{}, false
}

// TestOverlaysRender: every overlay builds, every object lands in the
// hangar namespace, and the five services are Deployments with open
// health probes, a Service, a PodDisruptionBudget, the token from the
// Secret, a non-root user and their own listen address.
func TestOverlaysRender(t *testing.T) {
	for _, overlay := range Overlays {
		t.Run(overlay, func(t *testing.T) {
			r := render(t, overlay)
			for _, o := range r.objs {
				switch o.GetKind() {
				case "Namespace", "ClusterRole", "ClusterRoleBinding":
				default:
					if o.GetNamespace() != "hangar" {
						t.Errorf("%s/%s: namespace %q, want hangar", o.GetKind(), o.GetName(), o.GetNamespace())
					}
				}
			}
			for name, want := range services {
				var d appsv1.Deployment
				if !r.get(t, "Deployment", name, &d) {
					t.Errorf("no Deployment %s", name)
					continue
				}
				pod := d.Spec.Template.Spec
				if len(pod.Containers) != 1 {
					t.Fatalf("%s: %d containers", name, len(pod.Containers))
				}
				c := pod.Containers[0]
				if !strings.HasSuffix(strings.Split(c.Image, ":")[0], "/"+name) {
					t.Errorf("%s: image %q", name, c.Image)
				}
				for _, p := range []struct {
					kind  string
					probe *corev1.Probe
					path  string
				}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}, {"startup", c.StartupProbe, "/healthz"}} {
					if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" || len(p.probe.HTTPGet.HTTPHeaders) != 0 {
						t.Errorf("%s: %s probe %+v, want GET %s on port http without headers (no token)", name, p.kind, p.probe, p.path)
					}
				}
				if len(c.Ports) != 1 || c.Ports[0].Name != "http" || c.Ports[0].ContainerPort != want.port {
					t.Errorf("%s: ports %+v, want http %d", name, c.Ports, want.port)
				}
				if e, ok := env(c, want.addrVar); !ok || e.Value != "0.0.0.0:"+itoa(want.port) {
					t.Errorf("%s: %s = %+v, want 0.0.0.0:%d", name, want.addrVar, e, want.port)
				}
				if e, ok := env(c, "HANGAR_TOKEN"); !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "hangar-secrets" {
					t.Errorf("%s: HANGAR_TOKEN %+v, want it from the hangar-secrets Secret", name, e)
				}
				sc := pod.SecurityContext
				if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
					t.Errorf("%s: pod security context %+v, want non-root uid 65532", name, sc)
				}
				if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
					t.Errorf("%s: root filesystem not read-only", name)
				}
				var svc corev1.Service
				if !r.get(t, "Service", name, &svc) || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != want.port {
					t.Errorf("%s: Service %+v, want port %d", name, svc.Spec.Ports, want.port)
				} else if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
					t.Errorf("%s: Service selector %v does not select the pods %v", name, svc.Spec.Selector, d.Spec.Template.Labels)
				}
				var pdb struct {
					Spec struct {
						Selector *metav1.LabelSelector `json:"selector"`
					} `json:"spec"`
				}
				if !r.get(t, "PodDisruptionBudget", name, &pdb) || pdb.Spec.Selector == nil {
					t.Errorf("%s: no PodDisruptionBudget", name)
				} else if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
					t.Errorf("%s: PodDisruptionBudget selector %v does not select the pods", name, pdb.Spec.Selector)
				}
			}
		})
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// TestDevOverlay: one replica each, PostgreSQL and Redis in the cluster, the
// Secret with the token, the vault key and the database URL.
func TestDevOverlay(t *testing.T) {
	r := render(t, "dev")
	for name := range services {
		var d appsv1.Deployment
		r.get(t, "Deployment", name, &d)
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
			t.Errorf("%s: replicas %v, want 1", name, d.Spec.Replicas)
		}
	}
	for _, name := range []string{"postgres", "redis"} {
		var d appsv1.Deployment
		var s corev1.Service
		if !r.get(t, "Deployment", name, &d) || !r.get(t, "Service", name, &s) {
			t.Errorf("dev has no in-cluster %s (Deployment and Service)", name)
		}
	}
	var sec corev1.Secret
	if !r.get(t, "Secret", "hangar-secrets", &sec) {
		t.Fatal("dev has no hangar-secrets Secret")
	}
	for _, k := range []string{"token", "vault.key", "database-url"} {
		if len(sec.Data[k]) == 0 {
			t.Errorf("hangar-secrets has no %s", k)
		}
	}
	if u := string(sec.Data["database-url"]); !strings.Contains(u, "@postgres:5432/") {
		t.Errorf("database-url %q does not name the in-cluster PostgreSQL", u)
	}
}

// TestGKEOverlay: two or more replicas, no PostgreSQL of its own, the
// checkpoint store in GCS and checkpoint-svc's workload identity.
func TestGKEOverlay(t *testing.T) {
	r := render(t, "gke")
	for name := range services {
		var d appsv1.Deployment
		r.get(t, "Deployment", name, &d)
		if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
			t.Errorf("%s: replicas %v, want >= 2", name, d.Spec.Replicas)
		}
		if d.Spec.Template.Spec.NodeSelector["hangar.dev/pool"] != "control" {
			t.Errorf("%s: nodeSelector %v, want the control pool", name, d.Spec.Template.Spec.NodeSelector)
		}
	}
	var pg appsv1.Deployment
	if r.get(t, "Deployment", "postgres", &pg) {
		t.Error("gke runs its own PostgreSQL; it should use the external one (database-url)")
	}
	var sec corev1.Secret
	if r.get(t, "Secret", "hangar-secrets", &sec) {
		t.Error("gke renders hangar-secrets: the Secret is created by the operator, not kept in git")
	}
	// Sandbox pods are placed on terraform's sandbox pool (its label and
	// taint), as sandbox-svc reads the settings.
	var cm corev1.ConfigMap
	r.get(t, "ConfigMap", "hangar-config", &cm)
	if got := cm.Data["HANGAR_KUBE_NODE_SELECTOR"]; got != "hangar.dev/pool=sandbox" {
		t.Errorf("HANGAR_KUBE_NODE_SELECTOR = %q, want hangar.dev/pool=sandbox (the sandbox pool's label)", got)
	}
	if got := cm.Data["HANGAR_KUBE_TOLERATIONS"]; got != "hangar.dev/pool=sandbox:NoSchedule" {
		t.Errorf("HANGAR_KUBE_TOLERATIONS = %q, want hangar.dev/pool=sandbox:NoSchedule (the sandbox pool's taint)", got)
	}
	var cp appsv1.Deployment
	r.get(t, "Deployment", "checkpoint-svc", &cp)
	if e, _ := env(cp.Spec.Template.Spec.Containers[0], "HANGAR_SESSION_STORE"); !strings.HasPrefix(e.Value, "gs://") {
		t.Errorf("checkpoint-svc HANGAR_SESSION_STORE = %q, want gs://", e.Value)
	}
	var sa corev1.ServiceAccount
	if !r.get(t, "ServiceAccount", cp.Spec.Template.Spec.ServiceAccountName, &sa) ||
		!strings.HasSuffix(sa.Annotations["iam.gke.io/gcp-service-account"], ".iam.gserviceaccount.com") {
		t.Errorf("checkpoint-svc's ServiceAccount %q has no workload identity annotation: %v", cp.Spec.Template.Spec.ServiceAccountName, sa.Annotations)
	}
	// The gateway's tapes live in the checkpoint store, reached as the
	// same Google service account.
	var gw appsv1.Deployment
	r.get(t, "Deployment", "gateway-svc", &gw)
	cpStore, _ := env(cp.Spec.Template.Spec.Containers[0], "HANGAR_SESSION_STORE")
	if e, _ := env(gw.Spec.Template.Spec.Containers[0], "HANGAR_SESSION_STORE"); e.Value != cpStore.Value {
		t.Errorf("gateway-svc HANGAR_SESSION_STORE = %q, want checkpoint-svc's %q (the tapes are shared through it)", e.Value, cpStore.Value)
	}
	var gwsa corev1.ServiceAccount
	if !r.get(t, "ServiceAccount", gw.Spec.Template.Spec.ServiceAccountName, &gwsa) ||
		gwsa.Annotations["iam.gke.io/gcp-service-account"] != sa.Annotations["iam.gke.io/gcp-service-account"] {
		t.Errorf("gateway-svc's ServiceAccount %q acts as %q, want checkpoint-svc's %q", gw.Spec.Template.Spec.ServiceAccountName,
			gwsa.Annotations["iam.gke.io/gcp-service-account"], sa.Annotations["iam.gke.io/gcp-service-account"])
	}
	var d appsv1.Deployment
	r.get(t, "Deployment", "session-svc", &d)
	if e, _ := env(d.Spec.Template.Spec.Containers[0], "HANGAR_DATABASE_URL"); e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
		t.Errorf("session-svc HANGAR_DATABASE_URL %+v, want it from the Secret", e)
	}
}

// route is one Ingress path.
type route struct {
	path, typ, backend string
	re                 *regexp.Regexp
}

func ingressRoutes(t *testing.T, r rendered) []route {
	var out []route
	r.all(t, "Ingress", func(o *unstructured.Unstructured) {
		var ing networkingv1.Ingress
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ing); err != nil {
			t.Fatal(err)
		}
		for _, rule := range ing.Spec.Rules {
			for _, p := range rule.HTTP.Paths {
				rt := route{path: p.Path, typ: string(*p.PathType), backend: p.Backend.Service.Name}
				if rt.typ == "ImplementationSpecific" {
					rt.re = regexp.MustCompile("^" + p.Path)
				}
				out = append(out, rt)
			}
		}
	})
	return out
}

// match is the Ingress's choice for path: a regular expression path first
// (ingress-nginx's use-regex), then an Exact path, else the longest Prefix match by path
// elements (the Ingress API's rule).
func match(routes []route, path string) string {
	for _, r := range routes {
		if r.re != nil && r.re.MatchString(path) {
			return r.backend
		}
	}
	for _, r := range routes {
		if r.typ == "Exact" && r.path == path {
			return r.backend
		}
	}
	best, bestLen := "", -1
	for _, r := range routes {
		if r.typ != "Prefix" {
			continue
		}
		p := strings.TrimSuffix(r.path, "/")
		if path == p || strings.HasPrefix(path, p+"/") || p == "" {
			if len(p) > bestLen {
				best, bestLen = r.backend, len(p)
			}
		}
	}
	return best
}

var (
	protoPackage = regexp.MustCompile(`(?m)^package hangar\.([a-z]+)\.v1;`)
	protoService = regexp.MustCompile(`(?m)^service ([A-Za-z]+) \{`)
	protoHTTP    = regexp.MustCompile(`(?:get|post|put|patch|delete): "(/[^"]*)"`)
	pathParam    = regexp.MustCompile(`\{[^}]*\}`)
)

// TestIngressRoutesEveryMethod reads api/hangar/*/v1/service.proto and
// checks that every gRPC service's methods and every REST route reach the
// service that owns them (hangar.<pkg>.v1 is <pkg>-svc's), and that the
// dashboard's page and assets reach session-svc.
func TestIngressRoutesEveryMethod(t *testing.T) {
	protos, err := filepath.Glob(filepath.Join(Dir(), "..", "api", "hangar", "*", "v1", "service.proto"))
	if err != nil || len(protos) < 5 {
		t.Fatalf("service protos: %v (%d found)", err, len(protos))
	}
	for _, overlay := range Overlays {
		t.Run(overlay, func(t *testing.T) {
			routes := ingressRoutes(t, render(t, overlay))
			checked := 0
			for _, f := range protos {
				src, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				pkg := protoPackage.FindSubmatch(src)
				if pkg == nil {
					t.Fatalf("%s: no hangar package", f)
				}
				owner := string(pkg[1]) + "-svc"
				for _, s := range protoService.FindAllSubmatch(src, -1) {
					p := "/hangar." + string(pkg[1]) + ".v1." + string(s[1]) + "/AnyMethod"
					if got := match(routes, p); got != owner {
						t.Errorf("gRPC %s goes to %q, want %s", p, got, owner)
					}
					checked++
				}
				for _, h := range protoHTTP.FindAllSubmatch(src, -1) {
					p := pathParam.ReplaceAllString(string(h[1]), "x1")
					if got := match(routes, p); got != owner {
						t.Errorf("REST %s (%s) goes to %q, want %s", h[1], p, got, owner)
					}
					checked++
				}
			}
			if checked < 50 {
				t.Errorf("checked only %d routes", checked)
			}
			for _, p := range []string{"/", "/assets/app.js", "/ui/assets/app.js"} {
				if got := match(routes, p); got != "session-svc" {
					t.Errorf("dashboard %s goes to %q, want session-svc", p, got)
				}
			}
		})
	}
}

// TestSandboxNetworkPolicy: pods labelled as the kubernetes driver labels
// sandboxes may reach the gateway's pods on its port (and DNS) and nothing
// else, and take no connections.
func TestSandboxNetworkPolicy(t *testing.T) {
	r := render(t, "dev")
	sandboxPod := labels.Set{"app.kubernetes.io/managed-by": "hangar", "hangar.dev/sandbox": "sb-1", "hangar.dev/environment": "default"}
	var gw appsv1.Deployment
	r.get(t, "Deployment", "gateway-svc", &gw)
	var selecting []string
	r.all(t, "NetworkPolicy", func(o *unstructured.Unstructured) {
		var np networkingv1.NetworkPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &np); err != nil {
			t.Fatal(err)
		}
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		for name := range services {
			var d appsv1.Deployment
			r.get(t, "Deployment", name, &d)
			if np.Name == "hangar-sandboxes" && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				t.Errorf("policy %s selects %s's pods", np.Name, name)
			}
		}
		if !sel.Matches(sandboxPod) {
			return
		}
		selecting = append(selecting, np.Name)
		if len(np.Spec.Ingress) != 0 {
			t.Errorf("%s lets connections into sandbox pods: %+v", np.Name, np.Spec.Ingress)
		}
		for _, e := range np.Spec.Egress {
			for _, to := range e.To {
				if to.IPBlock != nil {
					t.Errorf("%s: egress to an IP block %v", np.Name, to.IPBlock)
					continue
				}
				ps, _ := metav1.LabelSelectorAsSelector(to.PodSelector)
				dns := to.NamespaceSelector != nil && to.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "kube-system" &&
					to.PodSelector != nil && to.PodSelector.MatchLabels["k8s-app"] == "kube-dns"
				gateway := to.NamespaceSelector == nil && to.PodSelector != nil && ps.Matches(labels.Set(gw.Spec.Template.Labels))
				if !dns && !gateway {
					t.Errorf("%s: egress to %+v, which is neither the gateway nor DNS", np.Name, to)
				}
				if gateway {
					if len(e.Ports) != 1 || e.Ports[0].Port.IntValue() != 7404 {
						t.Errorf("%s: gateway egress ports %+v, want 7404 only", np.Name, e.Ports)
					}
				}
			}
			if len(e.To) == 0 {
				t.Errorf("%s: an egress rule to anywhere", np.Name)
			}
		}
		types := map[networkingv1.PolicyType]bool{}
		for _, ty := range np.Spec.PolicyTypes {
			types[ty] = true
		}
		if !types[networkingv1.PolicyTypeEgress] || !types[networkingv1.PolicyTypeIngress] {
			t.Errorf("%s: policy types %v, want Ingress and Egress", np.Name, np.Spec.PolicyTypes)
		}
	})
	sort.Strings(selecting)
	if len(selecting) == 0 {
		t.Error("no NetworkPolicy selects sandbox pods")
	}
}
