package up_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/cli/up"
	"github.com/hangar-dev/hangar/platform/rpc"
)

func startEnv(t *testing.T, extra map[string]string) *up.Stack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stack, err := up.Start(ctx, config(t), env(extra), quietLogger())
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

// modelCall creates a run through the front door and makes one model call
// through the gateway's data plane with the run's token.
func modelCall(t *testing.T, stack *up.Stack) string {
	t.Helper()
	body, _ := modelCallUsage(t, stack)
	return body
}

// modelCallUsage is modelCall, and the run's usage after it.
func modelCallUsage(t *testing.T, stack *up.Stack) (string, *gatewayv1.Usage) {
	t.Helper()
	conn, err := rpc.Dial(strings.TrimPrefix(stack.URL, "http://"), rpc.ClientOptions{Token: stack.Token})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	created, err := gatewayv1.NewGatewayServiceClient(conn).CreateRun(context.Background(), &gatewayv1.CreateRunRequest{Session: "demo", Turn: 1, Harness: "claude"})
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	body := `{"model":"claude-sonnet-4-5","max_tokens":100,"messages":[{"role":"user","content":"hello"}]}`
	req, _ := http.NewRequest(http.MethodPost, created.Run.AnthropicBaseUrl+"/v1/messages", strings.NewReader(body))
	req.Header.Set("x-api-key", created.Token)
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("model call: %d %s", resp.StatusCode, b)
	}
	run, err := gatewayv1.NewGatewayServiceClient(conn).GetRun(context.Background(), &gatewayv1.GetRunRequest{Run: created.GetRun().GetId()})
	if err != nil {
		t.Fatalf("GetRun: %v", err)
	}
	return string(b), run.GetRun().GetUsage()
}

func TestOfflineUsesScriptedUpstream(t *testing.T) {
	stack := startEnv(t, nil)
	if !strings.HasPrefix(stack.OfflineModel, "http://127.0.0.1:") {
		t.Fatalf("OfflineModel = %q", stack.OfflineModel)
	}
	got, usage := modelCallUsage(t, stack)
	if !strings.Contains(got, "hangar offline demo model") {
		t.Errorf("answer %s", got)
	}
	// The offline model costs nothing, whatever model the CLI names.
	if usage.GetInputTokens() == 0 || usage.GetCostUsd() != 0 {
		t.Errorf("offline usage = %v, want tokens counted at $0.00", usage)
	}
}

func TestOfflineScriptFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "script.yaml")
	if err := os.WriteFile(path, []byte("default: {text: \"from my script\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stack := startEnv(t, map[string]string{"HANGAR_SCRIPT": path})
	if got := modelCall(t, stack); !strings.Contains(got, "from my script") {
		t.Errorf("answer %s", got)
	}
}

func TestOnlineWithCredentials(t *testing.T) {
	stack := startEnv(t, map[string]string{"HANGAR_ANTHROPIC_API_KEY": "sk-ant-test"})
	if stack.OfflineModel != "" {
		t.Errorf("OfflineModel = %q with a key set", stack.OfflineModel)
	}
}

func TestOfflineBadScript(t *testing.T) {
	_, err := up.Start(context.Background(), config(t), env(map[string]string{"HANGAR_SCRIPT": "/nonexistent/script.yaml"}), quietLogger())
	if err == nil || !strings.Contains(err.Error(), "HANGAR_SCRIPT=/nonexistent/script.yaml") {
		t.Errorf("err = %v", err)
	}
}
