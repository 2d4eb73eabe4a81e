package local_test

import (
	"bufio"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/escapetest"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
)

// The escape suite against the local driver under bubblewrap, laid out as
// hangar runs it: the driver's root is HANGAR_HOME with the token and the
// vault key in it, model keys in the process's environment, a gateway
// reachable through the relay and a Redis on the loopback.
func TestEscape(t *testing.T) {
	home := t.TempDir()
	secrets := map[string]string{
		filepath.Join(home, "token"):     "hangar-api-token-escape-test",
		filepath.Join(home, "vault.key"): "vault-key-escape-test",
	}
	for p, c := range secrets {
		if err := os.WriteFile(p, []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("HANGAR_ANTHROPIC_API_KEY", "sk-ant-escape-test-key")
	t.Setenv("HANGAR_TOKEN", "hangar-api-token-escape-test")

	gateway := listen(t, "gateway\n")
	otherService := listen(t, "service\n")
	d, err := local.New(local.Options{Root: home, Gateway: local.Gateway{Listen: gateway, Target: gateway}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if got := d.Isolation(); got != "bwrap" {
		t.Fatalf("isolation %q: bubblewrap cannot run here", got)
	}
	escapetest.Run(t, escapetest.Target{
		Driver:      d,
		SecretFiles: secrets,
		SecretEnv:   []string{"sk-ant-escape-test-key", "hangar-api-token-escape-test"},
		ServicePID:  os.Getpid(),
		Gateway:     gateway, GatewayGreeting: "gateway",
		Forbidden:  []string{"127.0.0.1:6379", otherService, "10.255.255.1:80"},
		CgroupRoot: cgroup2Mount(t),
	})
}

// listen serves greeting to every connection on a loopback port.
func listen(t *testing.T, greeting string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, greeting)
			c.Close()
		}
	}()
	return ln.Addr().String()
}

func cgroup2Mount(t *testing.T) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, fl := range fields {
			if fl == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" {
				return fields[4]
			}
		}
	}
	return ""
}
