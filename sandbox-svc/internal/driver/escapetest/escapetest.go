// Package escapetest is the escape suite every isolating sandbox driver
// must pass: from inside a sandbox, as an agent (or its tool calls) would,
// it tries to read the service's secrets and other sandboxes, to see or
// signal processes outside, to leave its network namespace and cgroup, to
// reach anything but the gateway under egress none, and to hold any
// privilege. Each attempt must fail. It drives the sandbox only through the
// driver interface, so any driver can run it.
package escapetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/drivertest"
)

// Target is what the suite attacks.
type Target struct {
	Driver driver.Driver
	// SecretFiles are files of the service (HANGAR_HOME's token, vault.key)
	// by path, with their content; neither may be read from a sandbox.
	SecretFiles map[string]string
	// SecretEnv are values in the service's environment (model keys, the
	// API token); none may show inside a sandbox.
	SecretEnv []string
	// ServicePID is the service's process id (as the host sees it).
	ServicePID int
	// Gateway is the gateway's address inside an egress-none sandbox
	// ("127.0.0.1:port"); connecting must work and the gateway answers
	// GatewayGreeting first.
	Gateway         string
	GatewayGreeting string
	// Forbidden are TCP addresses an egress-none sandbox must not reach:
	// the embedded Redis, other local services, the outside world.
	Forbidden []string
	// CgroupRoot is where the host's cgroup v2 hierarchy is mounted ("" if
	// none): a sandbox must not move itself there.
	CgroupRoot string
}

var seq atomic.Int64

// Run runs the suite.
func Run(t *testing.T, tg Target) {
	t.Helper()
	repo, _ := drivertest.NewRepo(t, map[string]string{"README.md": "escape\n"})
	egressNone := true
	create := func(t *testing.T, egress driver.Egress) driver.Sandbox {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		spec := driver.Spec{ID: fmt.Sprintf("esc-%d", seq.Add(1)), Repository: repo, Egress: egress, Env: map[string]string{"DECLARED": "declared-value"}}
		sb, err := tg.Driver.Create(ctx, spec)
		if errors.Is(err, driver.ErrEgressUnsupported) {
			// The rest still holds with the host's network (the local
			// driver needs root for a network namespace).
			t.Logf("egress none unsupported here (%v): the network escapes are not tried", err)
			egressNone = false
			spec.Egress = driver.EgressFull
			sb, err = tg.Driver.Create(ctx, spec)
		}
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
		return sb
	}
	// sh runs a script in sb; it returns its output (stdout and stderr)
	// and whether it exited 0.
	sh := func(t *testing.T, sb driver.Sandbox, script string, env map[string]string) (string, bool) {
		t.Helper()
		out, errOut, st := drivertest.Run1(t, sb, driver.ExecRequest{Argv: []string{"sh", "-c", script}, Env: env})
		return out + errOut, st.Code == 0 && st.Signal == ""
	}
	// mustFail runs an attempt that must not succeed, nor show secret.
	mustFail := func(t *testing.T, sb driver.Sandbox, what, script string, secrets ...string) {
		t.Helper()
		out, ok := sh(t, sb, script, nil)
		if ok {
			t.Errorf("%s succeeded from inside the sandbox: %q", what, tail(out))
		}
		for _, s := range secrets {
			if s != "" && strings.Contains(out, s) {
				t.Errorf("%s showed a secret: %q", what, tail(out))
			}
		}
	}

	sb := create(t, driver.EgressNone)
	other := create(t, driver.EgressNone)

	t.Run("ServiceFiles", func(t *testing.T) {
		for path, content := range tg.SecretFiles {
			mustFail(t, sb, "reading "+path, "cat "+quote(path), content)
			mustFail(t, sb, "finding "+path, "find / -xdev -name "+quote(filepath.Base(path))+" 2>/dev/null | xargs -r cat 2>/dev/null | grep -qF "+quote(content))
			// Writing at that path may work (in a directory of the
			// sandbox's own that has the same name): the service's file
			// must stay as it was.
			sh(t, sb, "echo x >> "+quote(path)+"; rm -f "+quote(path), nil)
			if got, err := os.ReadFile(path); err != nil || string(got) != content {
				t.Errorf("%s after writing it from inside: %q %v", path, got, err)
			}
		}
	})

	t.Run("OtherSandbox", func(t *testing.T) {
		secret := fmt.Sprintf("other-sandbox-%d", time.Now().UnixNano())
		if out, ok := sh(t, other, "echo "+secret+" > secret.txt", nil); !ok {
			t.Fatalf("write in the other sandbox: %s", out)
		}
		work := other.Info().WorkDir
		mustFail(t, sb, "reading another sandbox's work tree", "cat "+quote(work+"/secret.txt"), secret)
		mustFail(t, sb, "listing another sandbox's work tree", "ls "+quote(work)+" | grep -q secret.txt")
		mustFail(t, sb, "writing another sandbox's work tree", "echo evil > "+quote(work+"/evil.txt"))
		mustFail(t, sb, "reading another sandbox's home", "ls -A "+quote(other.Info().HomeDir)+" | grep -q .")
		if out, _ := sh(t, other, "cat secret.txt; ls evil.txt 2>/dev/null", nil); strings.TrimSpace(out) != secret {
			t.Errorf("the other sandbox's tree after the attempts: %q", out)
		}
	})

	t.Run("Environment", func(t *testing.T) {
		// A process of the other sandbox holds its run token in its
		// environment while this one looks.
		token := fmt.Sprintf("run-token-%d", time.Now().UnixNano())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		bg, err := other.Exec(ctx, driver.ExecRequest{Argv: []string{"sleep", "600"}, Env: map[string]string{"HANGAR_RUN_TOKEN": token}})
		if err != nil {
			t.Fatal(err)
		}
		defer bg.Wait()
		defer cancel()
		secrets := append([]string{token}, tg.SecretEnv...)
		out, _ := sh(t, sb, `env; for f in /proc/[0-9]*/environ; do tr '\0' '\n' < "$f"; done 2>/dev/null; tr '\0' '\n' < /proc/$PPID/environ 2>/dev/null; true`, map[string]string{"HANGAR_RUN_TOKEN": "own-token"})
		for _, s := range secrets {
			if s != "" && strings.Contains(out, s) {
				t.Errorf("a secret shows in the sandbox's /proc/*/environ: %q", s)
			}
		}
		env, _ := sh(t, sb, "env", map[string]string{"HANGAR_RUN_TOKEN": "own-token"})
		for _, want := range []string{"HANGAR_RUN_TOKEN=own-token", "DECLARED=declared-value"} {
			if !strings.Contains(env, want) {
				t.Errorf("env lacks %s: %q", want, env)
			}
		}
	})

	t.Run("Processes", func(t *testing.T) {
		pid := strconv.Itoa(tg.ServicePID)
		mustFail(t, sb, "seeing the service's process", "test -e /proc/"+pid+" && grep -q "+pid+" /proc/"+pid+"/status")
		mustFail(t, sb, "signalling the service", "kill -9 "+pid)
		mustFail(t, sb, "entering the service's network namespace", "nsenter -t "+pid+" -n true")
		mustFail(t, sb, "entering pid 1's namespaces", "nsenter -t 1 -n -m -U true")
		out, _ := sh(t, sb, "ps -eo args 2>/dev/null || ls /proc", nil)
		if strings.Contains(out, "sleep 600") {
			t.Errorf("another sandbox's process is visible: %q", tail(out))
		}
	})

	t.Run("Descriptors", func(t *testing.T) {
		// Nothing of the service's or the runtime's is open in a sandbox
		// process but its stdio.
		out, _ := sh(t, sb, `ls /proc/$$/fd`, nil)
		if got := strings.Join(strings.Fields(out), " "); got != "0 1 2" {
			list, _ := sh(t, sb, `ls -l /proc/$$/fd`, nil)
			t.Errorf("a sandbox process holds descriptors %s, want 0 1 2:\n%s", got, list)
		}
	})

	t.Run("Cgroup", func(t *testing.T) {
		if tg.CgroupRoot != "" {
			mustFail(t, sb, "moving into the root cgroup", "echo $$ > "+quote(tg.CgroupRoot+"/cgroup.procs"))
		}
		mustFail(t, sb, "mounting a cgroupfs", "mkdir -p /tmp/cg && mount -t cgroup2 none /tmp/cg")
		mustFail(t, sb, "writing the visible cgroup.procs", "for f in /sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/unified/cgroup.procs; do echo $$ > $f && exit 0; done; exit 1")
		if out, _ := sh(t, sb, "cat /proc/self/cgroup", nil); !strings.Contains(out, "0::/\n") {
			t.Errorf("/proc/self/cgroup = %q, want the sandbox's cgroup as its root (0::/)", out)
		}
	})

	t.Run("Network", func(t *testing.T) {
		if !egressNone {
			t.Skip("egress none unsupported here")
		}
		for _, addr := range tg.Forbidden {
			host, port, _ := strings.Cut(addr, ":")
			mustFail(t, sb, "reaching "+addr, "timeout 5 bash -c 'exec 3<>/dev/tcp/"+host+"/"+port+"'")
		}
		if tg.Gateway != "" {
			host, port, _ := strings.Cut(tg.Gateway, ":")
			out, ok := sh(t, sb, "timeout 10 bash -c 'exec 3<>/dev/tcp/"+host+"/"+port+" && head -1 <&3'", nil)
			if !ok || strings.TrimSpace(out) != tg.GatewayGreeting {
				t.Errorf("the gateway relay under egress none: %q (ok %v)", out, ok)
			}
		}
	})

	t.Run("Privileges", func(t *testing.T) {
		out, _ := sh(t, sb, "id -u; grep -E '^(CapPrm|CapEff|CapAmb|NoNewPrivs):' /proc/self/status", nil)
		lines := strings.Fields(out)
		if len(lines) == 0 || lines[0] == "0" {
			t.Errorf("runs as uid 0: %q", out)
		}
		for _, want := range []string{"CapPrm:\t0000000000000000", "CapEff:\t0000000000000000", "CapAmb:\t0000000000000000", "NoNewPrivs:\t1"} {
			if !strings.Contains(out, want) {
				t.Errorf("/proc/self/status lacks %q: %q", want, out)
			}
		}
		mustFail(t, sb, "making a user namespace (to get capabilities there)", "unshare -Ur true")
		mustFail(t, sb, "writing the system", "touch /usr/bin/hangar-escape || touch /etc/hangar-escape")
		mustFail(t, sb, "becoming root with setuid binaries", "su -c true root </dev/null || sudo -n true")
	})
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func tail(s string) string {
	if len(s) > 400 {
		return "…" + s[len(s)-400:]
	}
	return s
}
