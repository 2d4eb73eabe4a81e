package kubernetes

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ParseNodeSelector reads HANGAR_KUBE_NODE_SELECTOR's items, each
// label=value: the labels a node must carry for sandbox pods to be placed
// on it (e.g. hangar.dev/pool=sandbox, the sandbox pool of
// deploy/terraform).
func ParseNodeSelector(items []string) (map[string]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, item := range items {
		key, value, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return nil, fmt.Errorf("%q: want label=value", item)
		}
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return nil, fmt.Errorf("%q: label %q: %s", item, key, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
			return nil, fmt.Errorf("%q: value %q: %s", item, value, strings.Join(errs, "; "))
		}
		out[key] = value
	}
	return out, nil
}

// ParseTolerations reads HANGAR_KUBE_TOLERATIONS's items, each a taint as
// kubectl taint writes it: key=value:effect (tolerated with that value),
// key:effect (any value) or key (any value and effect); effect is
// NoSchedule, PreferNoSchedule or NoExecute.
func ParseTolerations(items []string) ([]corev1.Toleration, error) {
	var out []corev1.Toleration
	for _, item := range items {
		item = strings.TrimSpace(item)
		rest, effect, hasEffect := strings.Cut(item, ":")
		key, value, hasValue := strings.Cut(rest, "=")
		t := corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists}
		if hasValue {
			t.Operator, t.Value = corev1.TolerationOpEqual, value
			if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
				return nil, fmt.Errorf("%q: value %q: %s", item, value, strings.Join(errs, "; "))
			}
		}
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return nil, fmt.Errorf("%q: key %q: %s", item, key, strings.Join(errs, "; "))
		}
		if hasEffect {
			switch e := corev1.TaintEffect(effect); e {
			case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
				t.Effect = e
			default:
				return nil, fmt.Errorf("%q: effect %q: want NoSchedule, PreferNoSchedule or NoExecute", item, effect)
			}
		}
		out = append(out, t)
	}
	return out, nil
}
