package driver

import (
	"fmt"
	"regexp"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

var keyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidKey reports whether key can name a sandbox (a work key): letters,
// digits, '.', '_' and '-', at most 128, never "..". Every driver accepts
// exactly these, so the server checks them before choosing one.
func ValidKey(key string) bool { return keyPattern.MatchString(key) && !strings.Contains(key, "..") }

// SignalName returns "KILL" for SIGKILL.
func SignalName(s syscall.Signal) string {
	return strings.TrimPrefix(unix.SignalName(s), "SIG")
}

// ParseSignal accepts "TERM", "SIGTERM" or a number.
func ParseSignal(name string) (syscall.Signal, error) {
	n := strings.ToUpper(strings.TrimSpace(name))
	if !strings.HasPrefix(n, "SIG") {
		n = "SIG" + n
	}
	if s := unix.SignalNum(n); s != 0 {
		return s, nil
	}
	var num int
	if _, err := fmt.Sscanf(name, "%d", &num); err == nil && num > 0 && num < 65 {
		return syscall.Signal(num), nil
	}
	return 0, fmt.Errorf("unknown signal %q", name)
}
