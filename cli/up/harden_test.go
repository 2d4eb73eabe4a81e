package up_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/up"
	"github.com/hangar-dev/hangar/platform/rpc"
)

// letters is an endless run of 'A' that costs nothing to send.
type letters struct{}

func (letters) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'A'
	}
	return len(p), nil
}

// postBody POSTs n bytes of a JSON-looking body with Content-Length n.
func postBody(t *testing.T, url, token string, n int64) (int, string) {
	t.Helper()
	const head = `{"name":"`
	body := io.MultiReader(strings.NewReader(head), io.LimitReader(letters{}, n-int64(len(head))))
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = n
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestEveryPortRefusesBeforeReading sends, to the front door and to every
// service's own port: a 100 MB body without the token (401, and the process
// allocates less than 20 MB answering it: the body is not read), and a body
// over HANGAR_MAX_REQUEST_MB with the token (413). A gRPC call for a service
// a port does not serve is Unauthenticated without the token, like any
// other, and Unimplemented with it.
func TestEveryPortRefusesBeforeReading(t *testing.T) {
	cfg := config(t)
	cfg.MaxRequestMB = 1 // the front door's; the services read the overlay
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

	ports := []up.Endpoint{{Name: "front door", Addr: strings.TrimPrefix(stack.URL, "http://")}}
	ports = append(ports, stack.Services...)
	for _, port := range ports {
		t.Run(port.Name, func(t *testing.T) {
			url := "http://" + port.Addr + "/api/sessions"

			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			code, body := postBody(t, url, "", 100<<20)
			runtime.ReadMemStats(&after)
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("unauthenticated 100 MB: %d, allocated %.1f MB", code, float64(allocated)/(1<<20))
			if code != http.StatusUnauthorized || !strings.Contains(body, `"code":"UNAUTHENTICATED"`) {
				t.Errorf("unauthenticated 100 MB body: %d %q, want 401", code, body)
			}
			if allocated >= 20<<20 {
				t.Errorf("allocated %d bytes answering an unauthenticated 100 MB body, want < 20 MB", allocated)
			}

			code, body = postBody(t, url, stack.Token, 2<<20)
			if code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "over the 1 MB limit (HANGAR_MAX_REQUEST_MB)") {
				t.Errorf("authenticated 2 MB body: %d %q, want 413 naming the limit", code, body)
			}

			// Not a port that serves the session service (except the
			// front door, which routes it): the token decides first.
			for _, tc := range []struct {
				token string
				want  codes.Code
			}{{"", codes.Unauthenticated}, {"wrong", codes.Unauthenticated}} {
				conn, err := rpc.Dial(port.Addr, rpc.ClientOptions{Token: tc.token})
				if err != nil {
					t.Fatal(err)
				}
				err = conn.Invoke(t.Context(), "/hangar.nope.v1.Nope/Call", &sessionv1.ListSessionsRequest{}, &sessionv1.ListSessionsResponse{})
				_ = conn.Close()
				if status.Code(err) != tc.want {
					t.Errorf("unknown service with token %q: %v, want %v", tc.token, err, tc.want)
				}
			}
			conn, err := rpc.Dial(port.Addr, rpc.ClientOptions{Token: stack.Token})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			err = conn.Invoke(t.Context(), "/hangar.nope.v1.Nope/Call", &sessionv1.ListSessionsRequest{}, &sessionv1.ListSessionsResponse{})
			if status.Code(err) != codes.Unimplemented {
				t.Errorf("unknown service with the token: %v, want Unimplemented", err)
			}
		})
	}
}

// TestEmbeddedRedisRequiresPassword checks that the embedded Redis refuses a
// client without the password kept in HANGAR_HOME/redis.password (0600,
// reused by the next start), and that the services, which get it through
// their redis URL, still work (a gateway run lives in Redis).
func TestEmbeddedRedisRequiresPassword(t *testing.T) {
	cfg := config(t)
	stack := start(t, cfg)
	if stack.EmbeddedRedis == "" {
		t.Fatal("no embedded redis address")
	}
	path := filepath.Join(cfg.Home, "redis.password")
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := info.Mode().Perm(); perm != 0o600 {
		t.Errorf("redis.password has mode %04o, want 0600", perm)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	password := strings.TrimSpace(string(raw))
	if len(password) != 64 {
		t.Errorf("password is %d characters, want 64 (32 random bytes, hex)", len(password))
	}

	ctx := t.Context()
	anonymous := redis.NewClient(&redis.Options{Addr: stack.EmbeddedRedis})
	defer anonymous.Close()
	if err := anonymous.Set(ctx, "run-token:forged", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOAUTH") {
		t.Errorf("SET without the password = %v, want NOAUTH", err)
	}
	authed := redis.NewClient(&redis.Options{Addr: stack.EmbeddedRedis, Password: password})
	defer authed.Close()
	if err := authed.Ping(ctx).Err(); err != nil {
		t.Errorf("PING with the password from redis.password: %v", err)
	}

	conn, err := rpc.Dial(strings.TrimPrefix(stack.URL, "http://"), rpc.ClientOptions{Token: stack.Token})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	gw := gatewayv1.NewGatewayServiceClient(conn)
	created, err := gw.CreateRun(ctx, &gatewayv1.CreateRunRequest{Session: "redis-auth", Turn: 1, Harness: "claude"})
	if err != nil {
		t.Fatalf("CreateRun through the stack: %v", err)
	}
	got, err := gw.GetRun(ctx, &gatewayv1.GetRunRequest{Run: created.GetRun().GetId()})
	if err != nil || got.GetRun().GetId() != created.GetRun().GetId() {
		t.Errorf("GetRun = %v, %v; want the run just created", got, err)
	}
}

// TestRedisPasswordIsReused checks that a second start on the same
// HANGAR_HOME keeps the password, and that a password file readable by
// others is refused.
func TestRedisPasswordIsReused(t *testing.T) {
	cfg := config(t)
	first, cancel := startStoppable(t, cfg)
	path := filepath.Join(cfg.Home, "redis.password")
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := first.Wait(); err != nil {
		t.Fatalf("first stack: %v", err)
	}
	start(t, cfg)
	after, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(before, after) {
		t.Errorf("password changed across starts (%v)", err)
	}

	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	stack, err := up.Start(ctx, cfg, env(nil), quietLogger())
	if err == nil {
		cancel2()
		_ = stack.Wait()
		t.Fatal("Start with a world-readable redis.password succeeded")
	}
	if !strings.Contains(err.Error(), "chmod 600 "+path) {
		t.Errorf("error = %q, want it to say chmod 600 %s", err, path)
	}
}

func startStoppable(t *testing.T, cfg up.Config) (*up.Stack, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stack, err := up.Start(ctx, cfg, env(nil), quietLogger())
	if err != nil {
		cancel()
		t.Fatalf("Start: %v", err)
	}
	return stack, cancel
}

// TestUnknownEnumsAreRefused sends a harness the API does not have, by name
// and by number over REST and by number over gRPC: InvalidArgument naming
// the field and the allowed values (REST by the docs' names, gRPC by the
// proto's), and no session is made.
func TestUnknownEnumsAreRefused(t *testing.T) {
	stack := start(t, config(t))
	const allowed = "want one of claude, codex, pi, antigravity"
	const allowedGRPC = "want one of HARNESS_CLAUDE, HARNESS_CODEX, HARNESS_PI, HARNESS_ANTIGRAVITY"
	for _, body := range []string{`{"name":"enum-test","harness":"gpt"}`, `{"name":"enum-test","harness":"HARNESS_GPT"}`, `{"name":"enum-test","harness":99}`} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, stack.URL+"/api/sessions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+stack.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		err = json.NewDecoder(resp.Body).Decode(&got)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusBadRequest || got.Code != "INVALID_ARGUMENT" ||
			!strings.HasPrefix(got.Message, "harness: unknown value ") || !strings.HasSuffix(got.Message, allowed) {
			t.Errorf("POST /api/sessions %s = %d %+v (%v), want 400 naming harness and %s", body, resp.StatusCode, got, err, allowed)
		}
	}

	// In a query, too.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, stack.URL+"/api/sessions?states=SESSION_STATE_IDLE&states=sleeping", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+stack.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Message string `json:"message"`
	}
	err = json.NewDecoder(resp.Body).Decode(&got)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusBadRequest || !strings.HasPrefix(got.Message, `states: unknown value "sleeping"; want one of running, idle, suspending, `) {
		t.Errorf("GET /api/sessions?states=sleeping = %d %+v (%v), want 400 naming states and its values", resp.StatusCode, got, err)
	}

	// The OpenAPI document describes the same names, and 64-bit integers
	// as integers.
	resp, err = http.Get(stack.URL + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Definitions map[string]struct {
			Enum       []string `json:"enum"`
			Default    *string  `json:"default"`
			Properties map[string]struct {
				Type string `json:"type"`
			} `json:"properties"`
		} `json:"definitions"`
	}
	err = json.NewDecoder(resp.Body).Decode(&doc)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatalf("GET /openapi.json: %v", err)
	}
	if got := doc.Definitions["v1Harness"]; strings.Join(got.Enum, ", ") != "claude, codex, pi, antigravity" || got.Default != nil {
		t.Errorf("/openapi.json's v1Harness = %+v, want the JSON names and no default", got)
	}
	if got := doc.Definitions["v1SessionState"].Enum; !slices.Contains(got, "needs_input") || slices.Contains(got, "SESSION_STATE_IDLE") {
		t.Errorf("/openapi.json's v1SessionState = %q", got)
	}
	if got := doc.Definitions["hangarSessionV1Usage"].Properties["input_tokens"].Type; got != "integer" {
		t.Errorf("/openapi.json's Usage.input_tokens is %q, want integer", got)
	}
	for name, def := range doc.Definitions {
		for _, v := range def.Enum {
			if strings.ToUpper(v) == v && name != "protobufNullValue" {
				t.Errorf("/openapi.json's %s lists %s, a proto name", name, v)
			}
		}
	}

	conn, err := rpc.Dial(strings.TrimPrefix(stack.URL, "http://"), rpc.ClientOptions{Token: stack.Token})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sessions := sessionv1.NewSessionServiceClient(conn)
	_, err = sessions.CreateSession(t.Context(), &sessionv1.CreateSessionRequest{Name: "enum-test", Harness: sessionv1.Harness(99)})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != "harness: unknown value 99; "+allowedGRPC {
		t.Errorf("CreateSession(harness 99) = %v, want InvalidArgument naming harness", err)
	}
	if _, err := sessions.GetSession(t.Context(), &sessionv1.GetSessionRequest{Name: "enum-test"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetSession after the refused creates = %v, want NotFound", err)
	}
}
