package kubernetes

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

func TestParsePlacement(t *testing.T) {
	sel, err := ParseNodeSelector([]string{"hangar.dev/pool=sandbox", " cloud.google.com/gke-spot=true"})
	if err != nil || !reflect.DeepEqual(sel, map[string]string{"hangar.dev/pool": "sandbox", "cloud.google.com/gke-spot": "true"}) {
		t.Errorf("node selector: %v %v", sel, err)
	}
	if sel, err := ParseNodeSelector(nil); sel != nil || err != nil {
		t.Errorf("no node selector: %v %v", sel, err)
	}
	for _, bad := range []string{"hangar.dev/pool", "=sandbox", "bad key=x", "k=bad value"} {
		if _, err := ParseNodeSelector([]string{bad}); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("node selector %q: %v, want a refusal quoting it", bad, err)
		}
	}

	tol, err := ParseTolerations([]string{"hangar.dev/pool=sandbox:NoSchedule", "dedicated:NoExecute", "gpu"})
	want := []corev1.Toleration{
		{Key: "hangar.dev/pool", Operator: corev1.TolerationOpEqual, Value: "sandbox", Effect: corev1.TaintEffectNoSchedule},
		{Key: "dedicated", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
		{Key: "gpu", Operator: corev1.TolerationOpExists},
	}
	if err != nil || !reflect.DeepEqual(tol, want) {
		t.Errorf("tolerations: %v %v", tol, err)
	}
	for _, bad := range []string{"k=v:Never", ":NoSchedule", "k=bad value:NoSchedule"} {
		if _, err := ParseTolerations([]string{bad}); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("toleration %q: %v, want a refusal quoting it", bad, err)
		}
	}

	// The pod carries both.
	d := &Driver{opts: Options{NodeSelector: sel, Tolerations: tol, Image: "img", ToolImage: "tool"}}
	pod := d.podFor(&Sandbox{d: d, spec: driver.Spec{ID: "sb-1", Environment: "e"}, pod: "hangar-sb-1"})
	if !reflect.DeepEqual(pod.Spec.NodeSelector, sel) || !reflect.DeepEqual(pod.Spec.Tolerations, tol) {
		t.Errorf("pod placement: selector %v, tolerations %v", pod.Spec.NodeSelector, pod.Spec.Tolerations)
	}
}
