// Package manifests renders deploy/'s kustomize overlays (sigs.k8s.io/kustomize
// krusty, the library behind kubectl -k) into Kubernetes objects, for the
// tests that check them and apply them to a real API server.
package manifests

import (
	"fmt"
	"path/filepath"
	"runtime"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Overlays are the overlay directories below deploy/overlays.
var Overlays = []string{"dev", "gke"}

// Dir is deploy/, found from this source file.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// Render builds the kustomization in dir (absolute, or relative to deploy/)
// into objects, in kustomize's output order.
func Render(dir string) ([]*unstructured.Unstructured, error) {
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(Dir(), dir)
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range res.Resources() {
		m, err := r.Map()
		if err != nil {
			return nil, fmt.Errorf("kustomize build %s: %s: %w", dir, r.CurId(), err)
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out, nil
}
