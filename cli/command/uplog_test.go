package command

import (
	"bytes"
	"github.com/hangar-dev/hangar/cli/up"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The terminal gets warnings and errors (with -v everything at the level),
// the file everything; at shutdown the terminal gets errors and a line per
// service stopped. Each start keeps the previous log as .1.
func TestUpLog(t *testing.T) {
	home := t.TempDir()
	var term bytes.Buffer
	l, err := openUpLog(home, "info", "text", false, &term)
	if err != nil {
		t.Fatal(err)
	}
	svc := l.logger.With("service", "session-svc")
	svc.Info("rpc finished", "method", "/x")
	svc.Warn("checkpoint failed", "session", "demo")
	l.stopping()
	svc.Warn("redis client warning", "detail", "connection refused")
	svc.Info("service stopped")
	l.logger.Info(up.StopStepMessage, "step", "sessions", "took", "148ms")
	l.logger.Info(up.StopStepMessage, "step", "redis", "took", "0s")
	svc.Error("drain timed out")
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(term.String()), "\n")
	want := []string{"checkpoint failed", "stopping hangar (the full log is in " + filepath.Join(home, "logs", "hangar.log") + ")",
		"  stopped sessions (148ms)", "  stopped redis (0s)", "drain timed out"}
	if len(lines) != len(want) {
		t.Fatalf("terminal:\n%s\nwant %d lines: %q", term.String(), len(want), want)
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Errorf("terminal line %d = %q, want it to contain %q", i+1, lines[i], w)
		}
	}
	file, err := os.ReadFile(filepath.Join(home, "logs", "hangar.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"rpc finished", "checkpoint failed", "connection refused", "service stopped", "drain timed out"} {
		if !strings.Contains(string(file), w) {
			t.Errorf("the log file lacks %q:\n%s", w, file)
		}
	}

	term.Reset()
	l, err = openUpLog(home, "info", "json", true, &term)
	if err != nil {
		t.Fatal(err)
	}
	l.logger.Info("rpc finished", "method", "/y")
	l.logger.Debug("not at this level")
	l.close()
	if !strings.Contains(term.String(), "rpc finished") || strings.Contains(term.String(), "not at this level") {
		t.Errorf("-v terminal:\n%s", term.String())
	}
	prev, _ := os.ReadFile(filepath.Join(home, "logs", "hangar.log.1"))
	cur, _ := os.ReadFile(filepath.Join(home, "logs", "hangar.log"))
	if !strings.Contains(string(prev), "checkpoint failed") || !strings.Contains(string(cur), `"method":"/y"`) || strings.Contains(string(cur), "checkpoint failed") {
		t.Errorf("previous log:\n%s\ncurrent log:\n%s", prev, cur)
	}
}
