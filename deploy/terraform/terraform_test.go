// Package terraform_test checks deploy/terraform offline: the HCL parses
// (github.com/hashicorp/hcl/v2, Terraform's own parser), the variables and
// outputs the spec names exist with their types and defaults, and they are
// wired to the resources they configure. Neither terraform validate nor
// tofu validate can run here (they need the google provider, downloaded
// from a registry CI cannot reach); with a terraform binary on the PATH the
// test also runs terraform fmt -check, which needs none.
package terraform_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

func dir() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Dir(f)
}

type module struct {
	blocks []*hclsyntax.Block
}

func load(t *testing.T) module {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir(), "*.tf"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no .tf files in %s (%v)", dir(), err)
	}
	p := hclparse.NewParser()
	var m module
	for _, f := range files {
		file, diags := p.ParseHCLFile(f)
		if diags.HasErrors() {
			t.Fatalf("%s: %v", f, diags)
		}
		m.blocks = append(m.blocks, file.Body.(*hclsyntax.Body).Blocks...)
	}
	return m
}

func (m module) find(typ string, labels ...string) *hclsyntax.Block {
	for _, b := range m.blocks {
		if b.Type == typ && strings.Join(b.Labels, "/") == strings.Join(labels, "/") {
			return b
		}
	}
	return nil
}

func child(b *hclsyntax.Block, typ string) *hclsyntax.Block {
	if b == nil {
		return nil
	}
	for _, c := range b.Body.Blocks {
		if c.Type == typ || (c.Type == "dynamic" && len(c.Labels) == 1 && c.Labels[0] == typ) {
			return c
		}
	}
	return nil
}

// refs is every variable an attribute of b refers to, as "var.x".
func refs(b *hclsyntax.Block, attr string) []string {
	if b == nil {
		return nil
	}
	a, ok := b.Body.Attributes[attr]
	if !ok {
		return nil
	}
	var out []string
	for _, tr := range a.Expr.Variables() {
		out = append(out, traversal(tr))
	}
	return out
}

func traversal(tr hcl.Traversal) string {
	var parts []string
	for _, s := range tr {
		switch s := s.(type) {
		case hcl.TraverseRoot:
			parts = append(parts, s.Name)
		case hcl.TraverseAttr:
			parts = append(parts, s.Name)
		}
	}
	return strings.Join(parts, ".")
}

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func value(t *testing.T, b *hclsyntax.Block, attr string) cty.Value {
	t.Helper()
	a, ok := b.Body.Attributes[attr]
	if !ok {
		return cty.NilVal
	}
	v, diags := a.Expr.Value(nil)
	if diags.HasErrors() {
		t.Fatalf("%s: %v", attr, diags)
	}
	return v
}

func typeName(b *hclsyntax.Block) string {
	a, ok := b.Body.Attributes["type"]
	if !ok {
		return ""
	}
	return hcl.ExprAsKeyword(a.Expr)
}

// TestSpecVariables: image_streaming (bool, off), sandbox_disk_gb (a
// number) and session_retention_days (a number, null: no age-based
// deletion), as the spec's Cost and speed section says.
func TestSpecVariables(t *testing.T) {
	m := load(t)
	for _, tc := range []struct {
		name, typ string
		def       cty.Value
	}{
		{"image_streaming", "bool", cty.False},
		{"sandbox_disk_gb", "number", cty.NumberIntVal(250)},
		{"session_retention_days", "number", cty.NullVal(cty.DynamicPseudoType)},
		{"project_id", "string", cty.NilVal},
	} {
		b := m.find("variable", tc.name)
		if b == nil {
			t.Errorf("no variable %q", tc.name)
			continue
		}
		if got := typeName(b); got != tc.typ {
			t.Errorf("variable %s: type %q, want %s", tc.name, got, tc.typ)
		}
		got := value(t, b, "default")
		switch {
		case tc.def == cty.NilVal:
			if got != cty.NilVal {
				t.Errorf("variable %s has a default (%#v); it must be given", tc.name, got)
			}
		case tc.def.IsNull():
			if got == cty.NilVal || !got.IsNull() {
				t.Errorf("variable %s: default %#v, want null", tc.name, got)
			}
		case got == cty.NilVal || !got.RawEquals(tc.def):
			t.Errorf("variable %s: default %#v, want %#v", tc.name, got, tc.def)
		}
		if d := value(t, b, "description"); d == cty.NilVal || d.AsString() == "" {
			t.Errorf("variable %s has no description", tc.name)
		}
	}
}

// TestWiring: the variables reach the resources they configure, and the
// outputs the overlays need exist.
func TestWiring(t *testing.T) {
	m := load(t)
	cluster := m.find("resource", "google_container_cluster", "hangar")
	if cluster == nil {
		t.Fatal("no google_container_cluster.hangar")
	}
	if child(cluster, "workload_identity_config") == nil {
		t.Error("the cluster has no workload identity")
	}
	if v := value(t, cluster, "datapath_provider"); v == cty.NilVal || v.AsString() != "ADVANCED_DATAPATH" {
		t.Error("the cluster does not enforce NetworkPolicies (datapath_provider ADVANCED_DATAPATH)")
	}
	pool := m.find("resource", "google_container_node_pool", "sandbox")
	if pool == nil {
		t.Fatal("no sandbox node pool")
	}
	nc := child(pool, "node_config")
	if !has(refs(nc, "disk_size_gb"), "var.sandbox_disk_gb") {
		t.Error("the sandbox pool's disk_size_gb is not var.sandbox_disk_gb")
	}
	if !has(refs(child(nc, "gcfs_config"), "enabled"), "var.image_streaming") {
		t.Error("the sandbox pool's gcfs_config (image streaming) is not var.image_streaming")
	}
	if !strings.Contains(value(t, nc, "labels").GoString(), "sandbox") {
		t.Error("sandbox nodes are not labelled hangar.dev/pool=sandbox")
	}
	// The taint deploy/overlays/gke's HANGAR_KUBE_TOLERATIONS tolerates.
	if taint := child(nc, "taint"); taint == nil || value(t, taint, "key").AsString() != "hangar.dev/pool" ||
		value(t, taint, "value").AsString() != "sandbox" || value(t, taint, "effect").AsString() != "NO_SCHEDULE" {
		t.Error("the sandbox pool has no taint hangar.dev/pool=sandbox:NO_SCHEDULE (only sandbox pods tolerate it)")
	}
	control := m.find("resource", "google_container_node_pool", "control")
	if control == nil || !strings.Contains(value(t, child(control, "node_config"), "labels").GoString(), "control") {
		t.Error("no control pool labelled hangar.dev/pool=control (deploy/overlays/gke selects it)")
	}
	bucket := m.find("resource", "google_storage_bucket", "sessions")
	if bucket == nil {
		t.Fatal("no google_storage_bucket.sessions")
	}
	lr := child(bucket, "lifecycle_rule")
	if lr == nil || lr.Type != "dynamic" || !has(refs(lr, "for_each"), "var.session_retention_days") {
		t.Error("the bucket's lifecycle rule is not a dynamic block on var.session_retention_days (no rule when null)")
	}
	out := m.find("output", "session_bucket")
	if out == nil || !has(refs(out, "value"), "google_storage_bucket.sessions.name") {
		t.Error("no output session_bucket from the bucket's name")
	}
	wi := m.find("resource", "google_service_account_iam_member", "checkpoint_workload_identity")
	if wi == nil || value(t, wi, "role").AsString() != "roles/iam.workloadIdentityUser" {
		t.Error("checkpoint-svc's Kubernetes ServiceAccount cannot act as its Google service account")
	}
	gw := m.find("resource", "google_service_account_iam_member", "gateway_workload_identity")
	if gw == nil || value(t, gw, "role").AsString() != "roles/iam.workloadIdentityUser" {
		t.Error("gateway-svc's Kubernetes ServiceAccount cannot act as the store's Google service account (the tapes are in the bucket)")
	}
	for _, o := range []string{"checkpoint_service_account", "image_repository"} {
		if m.find("output", o) == nil {
			t.Errorf("no output %s", o)
		}
	}
}

// TestFormatted runs terraform fmt -check when a terraform binary is on
// the PATH (it needs no provider).
func TestFormatted(t *testing.T) {
	bin, err := exec.LookPath("terraform")
	if err != nil {
		bin, err = exec.LookPath("tofu")
	}
	if err != nil {
		t.Skip("neither terraform nor tofu is on the PATH")
	}
	cmd := exec.CommandContext(t.Context(), bin, "fmt", "-check", "-diff", dir())
	cmd.Env = append(os.Environ(), "TF_CLI_CONFIG_FILE=/dev/null", "CHECKPOINT_DISABLE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s fmt -check: %v\n%s", bin, err, out)
	}
}
