package server_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/redistest"
	"github.com/hangar-dev/hangar/gateway-svc/internal/server"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
	"github.com/hangar-dev/hangar/platform/blob"
)

// env is a gateway in front of a scripted upstream, on loopback.
type env struct {
	srv      *server.Server
	upstream *scripted.Server
	up       *httptest.Server
	data     *httptest.Server
	blobDir  string
}

type envOpt func(*server.Deps)

func newEnv(t testing.TB, script scripted.Script, opts ...envOpt) *env {
	t.Helper()
	rdb, prefix := redistest.New(t)
	dir := t.TempDir()
	store, err := blob.NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{upstream: scripted.MustNew(script), blobDir: dir}
	e.up = httptest.NewServer(e.upstream)
	t.Cleanup(e.up.Close)
	e.data = httptest.NewUnstartedServer(nil)
	e.data.Start()
	t.Cleanup(e.data.Close)
	deps := server.Deps{
		Redis: rdb, Tapes: store, KeyPrefix: prefix, PublicURL: e.data.URL,
		Upstreams: server.Upstreams{
			AnthropicURL: e.up.URL, AnthropicKey: "sk-ant-real",
			OpenAIURL: e.up.URL + "/v1", OpenAIKey: "sk-openai-real",
		},
		SweepInterval: -1,
	}
	for _, o := range opts {
		o(&deps)
	}
	srv, err := server.New(context.Background(), deps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	e.srv = srv
	e.data.Config.Handler = srv.DataPlane()
	return e
}

func (e *env) createRun(t testing.TB, req *gatewayv1.CreateRunRequest) (*gatewayv1.Run, string) {
	t.Helper()
	resp, err := e.srv.CreateRun(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Run, resp.Token
}

func (e *env) getRun(t testing.TB, id string) *gatewayv1.Run {
	t.Helper()
	r, err := e.srv.GetRun(context.Background(), &gatewayv1.GetRunRequest{Run: id})
	if err != nil {
		t.Fatal(err)
	}
	return r.Run
}

func (e *env) tape(t testing.TB, id string) []*gatewayv1.Step {
	t.Helper()
	r, err := e.srv.GetTape(context.Background(), &gatewayv1.GetTapeRequest{Run: id})
	if err != nil {
		t.Fatal(err)
	}
	return r.Steps
}

// do posts body to the data plane with the token as the given header.
func (e *env) do(t testing.TB, path, authHeader, token, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.data.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	switch authHeader {
	case "x-api-key":
		req.Header.Set("x-api-key", token)
	case "bearer":
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// Read the whole answer, as a CLI does, so the step is recorded.
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp
}

func readAll(t testing.TB, r io.Reader) string {
	t.Helper()
	b, _ := io.ReadAll(r)
	return string(b)
}

// sseData returns the data lines of an SSE body.
func sseData(r io.Reader) []string {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, d time.Duration, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

func ioPipe() (*io.PipeReader, *io.PipeWriter) { return io.Pipe() }

func newReq(method, url, token string) (*http.Request, error) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("x-api-key", token)
	return req, nil
}

func httpDo(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp, nil
}
