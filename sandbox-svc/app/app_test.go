package app

import (
	"log/slog"
	"strings"
	"testing"
)

// A driver name the build does not know is refused by name, never run as
// another driver.
func TestNewDriverRefusesUnknown(t *testing.T) {
	_, err := newDriver(Config{Driver: "kubernetes"}, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), `HANGAR_SANDBOX_DRIVER="kubernetes"`) {
		t.Fatalf("newDriver(kubernetes) = %v, want a refusal naming the setting", err)
	}
	cfg := Config{Driver: "local"}
	cfg.Home = t.TempDir()
	d, err := newDriver(cfg, slog.New(slog.DiscardHandler))
	if err != nil || d.Name() != "local" {
		t.Fatalf("newDriver(local) = %v, %v", d, err)
	}
	if err := closeDriver(d); err != nil {
		t.Fatal(err)
	}
}
