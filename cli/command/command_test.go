package command_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hangar-dev/hangar/api/sandboxtool/tooltest"
	"github.com/hangar-dev/hangar/cli/command"
	"github.com/hangar-dev/hangar/cli/up"
)

func envOf(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

func run(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := command.Execute(context.Background(), command.Streams{In: strings.NewReader(""), Out: &out, Err: &errOut}, args, envOf(env))
	return out.String(), err
}

func TestBadInputIsOneLine(t *testing.T) {
	home := filepath.Join(t.TempDir(), "h")
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"unknown flag", map[string]string{"HANGAR_HOME": home}, []string{"up", "--bogus"}, "flag provided but not defined: -bogus"},
		{"unknown command", nil, []string{"bogus"}, `unknown command "bogus"`},
		{"malformed log level", map[string]string{"HANGAR_HOME": home, "HANGAR_LOG_LEVEL": "loud"}, []string{"up"}, `HANGAR_LOG_LEVEL="loud"`},
		{"malformed service setting", map[string]string{"HANGAR_HOME": home, "HANGAR_ADDR": "127.0.0.1:0", "HANGAR_FORK_MAX": "many"}, []string{"up"}, "HANGAR_FORK_MAX"},
		{"arguments to up", map[string]string{"HANGAR_HOME": home}, []string{"up", "now"}, "takes no arguments"},
		{"status with nothing running", map[string]string{"HANGAR_HOME": filepath.Join(t.TempDir(), "empty")}, []string{"status"}, "no hangar found"},
		{"malformed HANGAR_URL", map[string]string{"HANGAR_URL": "localhost", "HANGAR_TOKEN": "t"}, []string{"status"}, `HANGAR_URL="localhost"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := run(t, tc.env, tc.args...)
			if err == nil {
				t.Fatalf("hangar %v succeeded, want an error containing %q", tc.args, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error = %q, want one line containing %q", err, tc.want)
			}
		})
	}
}

func TestUpHelpListsVariables(t *testing.T) {
	out, err := run(t, nil, "up", "-h")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"HANGAR_ADDR", "HANGAR_HOME", "HANGAR_REDIS_URL"} {
		if !strings.Contains(out, want) {
			t.Errorf("up -h does not mention %s:\n%s", want, out)
		}
	}
}

// TestStatusFindsUpThroughDataDir starts a stack and checks that `hangar
// status` finds it through the data directory alone, and through HANGAR_URL
// and HANGAR_TOKEN.
func TestStatusFindsUpThroughDataDir(t *testing.T) {
	home := filepath.Join(t.TempDir(), "h")
	ctx, cancel := context.WithCancel(context.Background())
	var cfg up.Config
	cfg.Home, cfg.Addr, cfg.LogLevel, cfg.LogFormat = home, "127.0.0.1:0", "error", "text"
	stack, err := up.Start(ctx, cfg, envOf(map[string]string{
		"HANGAR_SESSION_ADDR": "127.0.0.1:0", "HANGAR_SANDBOX_ADDR": "127.0.0.1:0", "HANGAR_CHECKPOINT_ADDR": "127.0.0.1:0",
		"HANGAR_GATEWAY_ADDR": "127.0.0.1:0", "HANGAR_REPLAY_ADDR": "127.0.0.1:0", "HANGAR_SANDBOX_TOOL": tooltest.Path(t),
	}), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := stack.Wait(); err != nil {
			t.Error(err)
		}
	}()

	for _, env := range []map[string]string{
		{"HANGAR_HOME": home},
		{"HANGAR_URL": stack.URL, "HANGAR_TOKEN": stack.Token, "HANGAR_HOME": filepath.Join(t.TempDir(), "elsewhere")},
	} {
		out, err := waitStatus(t, env)
		if err != nil {
			t.Fatalf("status with %v: %v\n%s", env, err, out)
		}
		if n := strings.Count(out, "SERVING"); n != 5 {
			t.Errorf("status shows %d serving services, want 5:\n%s", n, out)
		}
	}

	_, err = run(t, map[string]string{"HANGAR_URL": stack.URL, "HANGAR_TOKEN": "wrong"}, "status")
	if err == nil || !strings.Contains(err.Error(), "not serving") {
		t.Errorf("status with a wrong token: %v, want a failure", err)
	}
}

// waitStatus runs `hangar status` until every service reports SERVING (the
// front door learns each service's health asynchronously) or a deadline.
func waitStatus(t *testing.T, env map[string]string) (string, error) {
	t.Helper()
	var out string
	var err error
	for range 50 {
		out, err = run(t, env, "status")
		if err == nil {
			return out, nil
		}
	}
	return out, err
}
