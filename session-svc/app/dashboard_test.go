package app_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/hangar-dev/hangar/platform/auth"
	"github.com/hangar-dev/hangar/session-svc/app"
)

const dashToken = "session-svc-dashboard-token"

// startAlone runs session-svc on its own, as cmd/session-svc does when
// deployed: its own listener, SQLite in a temporary home, an embedded
// Redis; the other services are not there (nothing here reaches them).
func startAlone(t *testing.T) string {
	t.Helper()
	env := map[string]string{
		"HANGAR_TOKEN":           dashToken,
		"HANGAR_HOME":            t.TempDir(),
		"HANGAR_SANDBOX_ADDR":    "127.0.0.1:1",
		"HANGAR_CHECKPOINT_ADDR": "127.0.0.1:1",
		"HANGAR_GATEWAY_ADDR":    "127.0.0.1:1",
		"HANGAR_LOG_LEVEL":       "warn",
	}
	cfg, err := app.LoadConfig(nil, nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.New(ctx, cfg, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	base := "http://" + lis.Addr().String()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("session-svc did not become ready: %v", err)
		}
		<-time.After(20 * time.Millisecond)
	}
	return base
}

func do(t *testing.T, method, url string, body string, headers map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestDashboardServedBySessionSvc: session-svc alone serves the dashboard
// as hangar up's front door does: the page at / without a token, its
// assets, sign-in setting the HttpOnly, SameSite=Strict cookie, the REST
// API taking that cookie (from this origin only), and terminals through
// its own listener.
func TestDashboardServedBySessionSvc(t *testing.T) {
	base := startAlone(t)
	host := strings.TrimPrefix(base, "http://")

	resp, page := do(t, http.MethodGet, base+"/", "", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "/ui/assets/app.js") || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") {
		t.Fatalf("GET / = %d %q\n%.300s", resp.StatusCode, resp.Header.Get("Content-Security-Policy"), page)
	}
	if resp, js := do(t, http.MethodGet, base+"/ui/assets/app.js", "", nil); resp.StatusCode != http.StatusOK || !strings.Contains(js, "/api/sessions") {
		t.Errorf("GET /ui/assets/app.js = %d", resp.StatusCode)
	}

	// No token: no data.
	if resp, body := do(t, http.MethodGet, base+"/api/sessions", "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /api/sessions without a token = %d %s", resp.StatusCode, body)
	}
	// A wrong token signs nothing in; the right one sets the cookie.
	origin := map[string]string{"Origin": base, "Content-Type": "application/json"}
	if resp, body := do(t, http.MethodPost, base+"/ui/signin", `{"token":"nope"}`, origin); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Errorf("sign-in with a wrong token = %d %v %s", resp.StatusCode, resp.Cookies(), body)
	}
	resp, body := do(t, http.MethodPost, base+"/ui/signin", `{"token":"`+dashToken+`"}`, origin)
	if resp.StatusCode != http.StatusNoContent || len(resp.Cookies()) != 1 {
		t.Fatalf("sign-in = %d %v %s", resp.StatusCode, resp.Cookies(), body)
	}
	c := resp.Cookies()[0]
	if c.Name != auth.CookieName || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode {
		t.Errorf("cookie: %+v", c)
	}
	cookie := map[string]string{"Cookie": c.Name + "=" + c.Value, "Sec-Fetch-Site": "same-origin"}
	if resp, body := do(t, http.MethodGet, base+"/api/sessions", "", cookie); resp.StatusCode != http.StatusOK || !strings.HasPrefix(body, "{") {
		t.Errorf("GET /api/sessions with the cookie = %d %s", resp.StatusCode, body)
	}
	// From another site the cookie stands for nothing.
	cross := map[string]string{"Cookie": c.Name + "=" + c.Value, "Sec-Fetch-Site": "cross-site", "Origin": "http://elsewhere.test"}
	if resp, body := do(t, http.MethodGet, base+"/api/sessions", "", cross); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /api/sessions with the cookie from another site = %d %s", resp.StatusCode, body)
	}
	// A change needs the CSRF header as well.
	if resp, body := do(t, http.MethodPost, base+"/api/sessions/nope:archive", "{}", cookie); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST with the cookie and no %s = %d %s", auth.CSRFHeader, resp.StatusCode, body)
	}

	// A terminal: the WebSocket is accepted with the cookie and its
	// session calls reach this service through its own listener (here:
	// the session does not exist).
	h := http.Header{}
	h.Set("Cookie", c.Name+"="+c.Value)
	h.Set("Origin", base)
	ws, _, err := websocket.DefaultDialer.Dial("ws://"+host+"/ui/terminal?session=nope&kind=shell", h)
	if err != nil {
		t.Fatalf("terminal WebSocket: %v", err)
	}
	defer ws.Close()
	_ = ws.SetReadDeadline(time.Now().Add(30 * time.Second))
	typ, msg, err := ws.ReadMessage()
	var ctl struct{ Type, Message string }
	if err != nil || typ != websocket.TextMessage || json.Unmarshal(msg, &ctl) != nil || ctl.Type != "error" || !strings.Contains(ctl.Message, "nope") {
		t.Errorf("terminal for a session that does not exist: %d %s %v", typ, msg, err)
	}
	// Without the cookie there is no WebSocket.
	if _, resp, err := websocket.DefaultDialer.Dial("ws://"+host+"/ui/terminal?session=nope", http.Header{"Origin": {base}}); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("terminal without the cookie: %v %v", resp, err)
	}
}

// TestRESTListArtifacts: GET /api/sessions/NAME/artifacts is ListArtifacts
// (it was GetArtifact of an empty path: "artifact path \"\" is not a path
// inside the session"), .../artifacts/PATH GetArtifact.
func TestRESTListArtifacts(t *testing.T) {
	base := startAlone(t)
	bearer := map[string]string{"Authorization": "Bearer " + dashToken}
	for _, path := range []string{"/api/sessions/nope/artifacts", "/api/sessions/nope/artifacts?turn=1", "/api/sessions/nope/artifacts/report.txt"} {
		resp, body := do(t, http.MethodGet, base+path, "", bearer)
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "SESSION_NOT_FOUND") {
			t.Errorf("GET %s = %d %s, want 404 SESSION_NOT_FOUND", path, resp.StatusCode, body)
		}
	}
	if resp, body := do(t, http.MethodGet, base+"/api/sessions/nope/artifacts/", "", bearer); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "path") {
		t.Errorf("GET .../artifacts/ (no path) = %d %s, want 400 naming path", resp.StatusCode, body)
	}
}
