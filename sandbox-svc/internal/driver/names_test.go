package driver_test

import (
	"strings"
	"syscall"
	"testing"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

func TestValidKey(t *testing.T) {
	for key, want := range map[string]bool{
		"sess-1": true, "a.b_c": true, "A": true, strings.Repeat("k", 128): true,
		"": false, "-x": false, ".x": false, "a..b": false, "a/b": false, "a b": false, strings.Repeat("k", 129): false,
	} {
		if got := driver.ValidKey(key); got != want {
			t.Errorf("ValidKey(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]syscall.Signal{"TERM": syscall.SIGTERM, "sigkill": syscall.SIGKILL, " INT ": syscall.SIGINT, "9": syscall.SIGKILL} {
		got, err := driver.ParseSignal(in)
		if err != nil || got != want {
			t.Errorf("ParseSignal(%q) = %v, %v; want %v", in, got, err, want)
		}
		if name := driver.SignalName(want); !strings.Contains(strings.ToUpper(in), name) && in != "9" {
			t.Errorf("SignalName(%v) = %q", want, name)
		}
	}
	for _, in := range []string{"", "NOPE", "0", "99"} {
		if _, err := driver.ParseSignal(in); err == nil {
			t.Errorf("ParseSignal(%q) succeeded", in)
		}
	}
}
