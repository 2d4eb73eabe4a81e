package up_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/up"
	"github.com/hangar-dev/hangar/platform/rpc"
)

// env is a fake process environment: every address on a free port.
func env(extra map[string]string) func(string) (string, bool) {
	vars := map[string]string{
		"HANGAR_SESSION_ADDR":    "127.0.0.1:0",
		"HANGAR_SANDBOX_ADDR":    "127.0.0.1:0",
		"HANGAR_CHECKPOINT_ADDR": "127.0.0.1:0",
		"HANGAR_GATEWAY_ADDR":    "127.0.0.1:0",
		"HANGAR_REPLAY_ADDR":     "127.0.0.1:0",
	}
	for k, v := range extra {
		vars[k] = v
	}
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func start(t *testing.T, cfg up.Config) *up.Stack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stack, err := up.Start(ctx, cfg, env(nil), quietLogger())
	if err != nil {
		cancel()
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := stack.Wait(); err != nil {
			t.Errorf("stack stopped with %v", err)
		}
	})
	return stack
}

func config(t *testing.T) up.Config {
	var cfg up.Config
	cfg.Home = filepath.Join(t.TempDir(), "hangar")
	cfg.Addr = "127.0.0.1:0"
	cfg.LogLevel, cfg.LogFormat = "error", "text"
	return cfg
}

// TestEveryServiceAnswersHealth starts the whole stack in-process and checks
// every service's health over gRPC and REST, on its own address and through
// the front door, with and without the token.
func TestEveryServiceAnswersHealth(t *testing.T) {
	stack := start(t, config(t))
	if len(stack.Services) != 5 {
		t.Fatalf("got %d services, want 5", len(stack.Services))
	}

	for _, svc := range stack.Services {
		t.Run(svc.Name+"/grpc", func(t *testing.T) {
			for _, tc := range []struct {
				name  string
				token string
				want  codes.Code
			}{
				{"valid token", stack.Token, codes.OK},
				{"no token", "", codes.Unauthenticated},
				{"wrong token", "not-the-token", codes.Unauthenticated},
			} {
				conn, err := rpc.Dial(svc.Addr, rpc.ClientOptions{Token: tc.token})
				if err != nil {
					t.Fatal(err)
				}
				resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
				conn.Close()
				if got := status.Code(err); got != tc.want {
					t.Errorf("%s: health Check code = %v, want %v (%v)", tc.name, got, tc.want, err)
				}
				if tc.want == codes.OK && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					t.Errorf("%s: status = %v, want SERVING", tc.name, resp.GetStatus())
				}
			}
		})
		t.Run(svc.Name+"/rest", func(t *testing.T) {
			checkHTTP(t, "http://"+svc.Addr+"/healthz", "", http.StatusOK)
			checkHTTP(t, "http://"+svc.Addr+"/readyz", "", http.StatusOK)
			checkHTTP(t, "http://"+svc.Addr+"/metrics", "", http.StatusUnauthorized)
			checkHTTP(t, "http://"+svc.Addr+"/metrics", "wrong", http.StatusUnauthorized)
			checkHTTP(t, "http://"+svc.Addr+"/metrics", stack.Token, http.StatusOK)
		})
	}

	t.Run("front door", func(t *testing.T) {
		checkHTTP(t, stack.URL+"/healthz", "", http.StatusOK)
		checkHTTP(t, stack.URL+"/readyz", "", http.StatusOK)
		checkHTTP(t, stack.URL+"/metrics", "", http.StatusUnauthorized)
		checkHTTP(t, stack.URL+"/metrics", stack.Token, http.StatusOK)
		checkHTTP(t, stack.URL+"/openapi.json", "", http.StatusOK)

		conn, err := rpc.Dial(strings.TrimPrefix(stack.URL, "http://"), rpc.ClientOptions{Token: stack.Token})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		health := healthpb.NewHealthClient(conn)
		for _, name := range []string{
			sessionv1.SessionService_ServiceDesc.ServiceName,
			sandboxv1.SandboxService_ServiceDesc.ServiceName,
			checkpointv1.CheckpointService_ServiceDesc.ServiceName,
			gatewayv1.GatewayService_ServiceDesc.ServiceName,
			replayv1.ReplayService_ServiceDesc.ServiceName,
		} {
			waitServing(t, health, name)
		}
	})
}

// TestFrontDoorRoutesToServices checks that gRPC and REST calls through the
// front door reach each service (their RPCs may still be Unimplemented) and
// are refused without the token.
func TestFrontDoorRoutesToServices(t *testing.T) {
	stack := start(t, config(t))
	target := strings.TrimPrefix(stack.URL, "http://")

	withToken, err := rpc.Dial(target, rpc.ClientOptions{Token: stack.Token})
	if err != nil {
		t.Fatal(err)
	}
	defer withToken.Close()
	noToken, err := rpc.Dial(target, rpc.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer noToken.Close()

	ctx := context.Background()
	_, err = sessionv1.NewSessionServiceClient(noToken).ListSessions(ctx, &sessionv1.ListSessionsRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("ListSessions without token: %v, want Unauthenticated", err)
	}
	calls := map[string]func() error{
		"session": func() error {
			_, err := sessionv1.NewSessionServiceClient(withToken).ListSessions(ctx, &sessionv1.ListSessionsRequest{})
			return err
		},
		"sandbox": func() error {
			_, err := sandboxv1.NewSandboxServiceClient(withToken).ListSandboxes(ctx, &sandboxv1.ListSandboxesRequest{})
			return err
		},
		"checkpoint": func() error {
			_, err := checkpointv1.NewCheckpointServiceClient(withToken).GetCheckpoint(ctx, &checkpointv1.GetCheckpointRequest{CheckpointId: "x"})
			return err
		},
		"gateway": func() error {
			_, err := gatewayv1.NewGatewayServiceClient(withToken).GetRun(ctx, &gatewayv1.GetRunRequest{Run: "x"})
			return err
		},
		"replay": func() error {
			_, err := replayv1.NewReplayServiceClient(withToken).GetFork(ctx, &replayv1.GetForkRequest{Fork: "x"})
			return err
		},
	}
	for name, call := range calls {
		// Reaching the service means an answer from it: anything but
		// Unauthenticated or Unavailable (no route).
		if code := status.Code(call()); code == codes.Unauthenticated || code == codes.Unavailable || code == codes.Unknown {
			t.Errorf("%s through the front door: code %v", name, code)
		}
	}

	checkHTTP(t, stack.URL+"/api/sessions", "", http.StatusUnauthorized)
	// Answers from the services themselves: the route and the token got the
	// calls there.
	checkHTTP(t, stack.URL+"/api/sessions", stack.Token, http.StatusOK)
	checkHTTP(t, stack.URL+"/api/sessions/nope", stack.Token, http.StatusNotFound)
	checkHTTP(t, stack.URL+"/api/forks/job-1", stack.Token, http.StatusNotFound)
}

// TestStartMakesSecrets checks the token and vault key files and their modes,
// and that a second start reuses them.
func TestStartMakesSecrets(t *testing.T) {
	cfg := config(t)
	first := start(t, cfg)
	if !first.TokenGenerated || first.Token == "" {
		t.Fatalf("first start: token %q generated=%v", first.Token, first.TokenGenerated)
	}
	for _, name := range []string{"token", "vault.key"} {
		info, err := os.Stat(filepath.Join(cfg.Home, name))
		if err != nil {
			t.Fatal(err)
		}
		if perm := info.Mode().Perm(); perm != 0o600 {
			t.Errorf("%s has mode %04o, want 0600", name, perm)
		}
	}
	endpoint, err := os.ReadFile(filepath.Join(cfg.Home, "endpoint"))
	if err != nil || strings.TrimSpace(string(endpoint)) != first.URL {
		t.Errorf("endpoint file = %q, %v; want %s", endpoint, err, first.URL)
	}
}

func TestStartRefusesBadInput(t *testing.T) {
	occupied, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer occupied.Close()
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		mutate func(*up.Config)
		env    map[string]string
		want   string
	}{
		{"occupied front door", func(c *up.Config) { c.Addr = occupied.Addr().String() }, nil, "HANGAR_ADDR=" + occupied.Addr().String() + ": address already in use"},
		{"occupied service port", nil, map[string]string{"HANGAR_GATEWAY_ADDR": occupied.Addr().String()}, "HANGAR_GATEWAY_ADDR=" + occupied.Addr().String() + ": address already in use"},
		{"data dir under a file", func(c *up.Config) { c.Home = filepath.Join(file, "hangar") }, nil, "HANGAR_HOME=" + filepath.Join(file, "hangar") + ": cannot create the data directory"},
		{"malformed service setting", nil, map[string]string{"HANGAR_SESSION_IDLE_MINUTES": "soon"}, "HANGAR_SESSION_IDLE_MINUTES"},
		{"bad upstream URL", nil, map[string]string{"HANGAR_ANTHROPIC_URL": "api.anthropic.com"}, "HANGAR_ANTHROPIC_URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config(t)
			if tc.mutate != nil {
				tc.mutate(&cfg)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stack, err := up.Start(ctx, cfg, env(tc.env), quietLogger())
			if err == nil {
				cancel()
				_ = stack.Wait()
				t.Fatalf("Start succeeded, want an error containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error = %q, want one line containing %q", err, tc.want)
			}
		})
	}
}

func waitServing(t *testing.T, health healthpb.HealthClient, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := health.Watch(ctx, &healthpb.HealthCheckRequest{Service: name})
	if err != nil {
		t.Fatalf("watch %s: %v", name, err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s never became SERVING through the front door: %v", name, err)
		}
		if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
	}
}

func doHTTP(t *testing.T, url, token string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func checkHTTP(t *testing.T, url, token string, want int) {
	t.Helper()
	if got := doHTTP(t, url, token); got != want {
		t.Errorf("GET %s (token %q): status %d, want %d", url, token, got, want)
	}
}

// TestOneBasePort: --port moves the front door, and the services follow on
// the next five ports, so a second hangar needs one setting.
func TestOneBasePort(t *testing.T) {
	var port int
	for try := 0; try < 20 && port == 0; try++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if p+5 > 65535 {
			continue
		}
		free := true
		for i := 1; i <= 5; i++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+i))
			if err != nil {
				free = false
				break
			}
			l.Close()
		}
		if free {
			port = p
		}
	}
	if port == 0 {
		t.Fatal("no six free ports in a row")
	}
	cfg := config(t)
	cfg.Addr, cfg.Port = "127.0.0.1:7400", port
	ctx, cancel := context.WithCancel(context.Background())
	stack, err := up.Start(ctx, cfg, func(string) (string, bool) { return "", false }, quietLogger())
	if err != nil {
		cancel()
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := stack.Wait(); err != nil {
			t.Errorf("stack stopped with %v", err)
		}
	})
	if want := fmt.Sprintf("http://127.0.0.1:%d", port); stack.URL != want {
		t.Errorf("URL %s, want %s", stack.URL, want)
	}
	for i, svc := range stack.Services {
		if want := fmt.Sprintf("127.0.0.1:%d", port+i+1); svc.Addr != want {
			t.Errorf("%s listens on %s, want %s", svc.Name, svc.Addr, want)
		}
	}
}
