package app

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A driver name the build does not know is refused by name, never run as
// another driver; the kubernetes driver without a cluster to reach is
// refused naming the setting that gives one.
func TestNewDriverRefusesUnknown(t *testing.T) {
	_, err := newDriver(context.Background(), Config{Driver: "nomad"}, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), `HANGAR_SANDBOX_DRIVER="nomad"`) {
		t.Fatalf("newDriver(nomad) = %v, want a refusal naming the setting", err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	_, err = newDriver(context.Background(), Config{Driver: "kubernetes"}, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "HANGAR_KUBE_CONFIG") {
		t.Fatalf("newDriver(kubernetes) without a cluster = %v, want a refusal naming HANGAR_KUBE_CONFIG", err)
	}
	// Without HANGAR_SANDBOX_TOOL (and none beside the test binary) the
	// tool is built from this source tree into HANGAR_HOME/bin.
	cfg := Config{Driver: "local"}
	cfg.Home = t.TempDir()
	d, err := newDriver(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil || d.Name() != "local" {
		t.Fatalf("newDriver(local) = %v, %v", d, err)
	}
	if err := closeDriver(d); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(cfg.Home, "bin", "hangar-sandbox")); err != nil || st.Mode()&0o111 == 0 {
		t.Errorf("built tool: %v, %v", st, err)
	}
}

// A bad placement item is refused at start naming the variable and the item.
func TestKubePlacementSettings(t *testing.T) {
	c := Config{Driver: "kubernetes", KubeToolImage: "img", KubeNodeSelector: []string{"hangar.dev/pool=sandbox"}, KubeTolerations: []string{"hangar.dev/pool=sandbox:NoSchedule"}}
	c.Token = "t"
	if err := c.Validate(); err != nil {
		t.Fatalf("good placement refused: %v", err)
	}
	c.KubeNodeSelector = []string{"hangar.dev/pool"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `HANGAR_KUBE_NODE_SELECTOR: "hangar.dev/pool": want label=value`) {
		t.Errorf("bad node selector: %v", err)
	}
	c.KubeNodeSelector = nil
	c.KubeTolerations = []string{"k=v:Sometimes"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `HANGAR_KUBE_TOLERATIONS: "k=v:Sometimes": effect "Sometimes"`) {
		t.Errorf("bad toleration: %v", err)
	}
}
