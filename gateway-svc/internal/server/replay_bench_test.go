package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/server"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
	"github.com/hangar-dev/hangar/platform/redisconn"
)

// ccBody is a request of a Claude Code-like run at step n (1-based) in
// session ses: its shape and size are Claude Code 2.1's (a 60 kB tools
// array, a 7 kB system prompt naming the work tree and the date, metadata
// with the CLI's session id, and the conversation: a tool call and its
// result per earlier step), about 80 kB at step 1.
func ccBody(ses, cliSession string, n int) string {
	words := strings.Fields("the tool reads a file in the work tree and answers with its content when the path exists otherwise an error names it")
	text := func(seed, size int) string {
		var sb strings.Builder
		for i := seed; sb.Len() < size; i++ {
			sb.WriteString(words[i%len(words)])
			sb.WriteByte(' ')
		}
		return sb.String()
	}
	var tools []map[string]any
	for i := range 21 {
		tools = append(tools, map[string]any{
			"name": fmt.Sprintf("Tool%d", i), "description": text(i, 2600),
			"input_schema": map[string]any{"type": "object", "properties": map[string]any{
				"command": map[string]any{"type": "string", "description": text(i+3, 200)},
				"timeout": map[string]any{"type": "integer", "minimum": 0, "maximum": 600000},
			}, "required": []string{"command"}},
		})
	}
	sys := "You are Claude Code.\n - Primary working directory: /hangar/sandboxes/" + ses + "/work\n" + text(7, 7000) +
		"\nToday's date is 2026-12-01.\nCurrent branch: hangar/session/" + ses + "\n"
	msgs := []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "Please do the replay task."}}}}
	for i := 1; i < n; i++ {
		id := fmt.Sprintf("toolu_%02d", i)
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": id, "name": "Bash",
				"input": map[string]any{"command": fmt.Sprintf("echo step %d >> NOTES.md", i)}}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": id,
				"content": fmt.Sprintf("step %d done in /hangar/sandboxes/%s/work\n%s", i, ses, text(i, 400)), "is_error": false}}})
	}
	b, _ := json.Marshal(map[string]any{
		"model": "claude-sonnet-4-5", "stream": true, "max_tokens": 32000,
		"system":   []any{map[string]any{"type": "text", "text": sys, "cache_control": map[string]any{"type": "ephemeral"}}},
		"tools":    tools,
		"messages": msgs,
		"metadata": map[string]any{"user_id": `{"device_id":"d","session_id":"` + cliSession + `"}`},
	})
	return string(b)
}

// BenchmarkReplayedStep measures the gateway's time for one replayed step
// (request to the answer's end, as a harness sees it; 30 ms of tool time
// between two steps, as a harness has) of a Claude Code-like
// run armed as a fork's prefix is (at_seq 7, tree check at the end, stop
// after the prefix), against the real Redis and the embedded one (`hangar
// up`'s miniredis, which the e2e benchmark runs on), with the tape and run
// journal on a local directory (fsynced writes). Each replayed request is
// checked against the tape (canonicalised: the session's paths and branch,
// the CLI's session id), and the request after the prefix too (untimed).
//
//	go test -run '^$' -bench BenchmarkReplayedStep ./internal/server/
func BenchmarkReplayedStep(b *testing.B) {
	const (
		n        = 7
		toolTime = 30 * time.Millisecond
	)
	for _, store := range []string{"redis", "miniredis"} {
		b.Run(store, func(b *testing.B) {
			var opts []envOpt
			if store == "miniredis" {
				conn, err := redisconn.OpenEmbedded(context.Background(), "bench-password", nil)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = conn.Close() })
				opts = append(opts, func(d *server.Deps) { d.Redis, d.KeyPrefix = conn.Client, "bench:" })
			}
			e := newEnv(b, scripted.Script{Default: &scripted.Answer{Text: "done", Usage: &scripted.Usage{InputTokens: 10, OutputTokens: 2}}}, opts...)
			ctx := context.Background()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			post := func(tok, body string) int {
				req, _ := http.NewRequest(http.MethodPost, e.data.URL+"/v1/messages?beta=true", strings.NewReader(body))
				req.Header.Set("x-api-key", tok)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				return resp.StatusCode
			}
			rec, tok := e.createRun(b, &gatewayv1.CreateRunRequest{Session: "ses-rec"})
			for i := 1; i <= n+1; i++ {
				if code := post(tok, ccBody("ses-rec", "cli-rec", i)); code != http.StatusOK {
					b.Fatalf("recording step %d: %d", i, code)
				}
			}
			var total time.Duration
			steps := 0
			for b.Loop() {
				b.StopTimer()
				ses := fmt.Sprintf("ses-rp-%d", steps)
				r, rtok := e.createRun(b, &gatewayv1.CreateRunRequest{Session: ses})
				if _, err := e.srv.SetReplay(ctx, &gatewayv1.SetReplayRequest{Run: r.GetId(), Replay: &gatewayv1.Replay{TapeRun: rec.GetId(), AtSeq: n,
					TreeCheckAtEnd: true, AfterPrefix: gatewayv1.AfterPrefix_AFTER_PREFIX_STOP}}); err != nil {
					b.Fatal(err)
				}
				bodies := make([]string, n+1)
				for i := range bodies {
					bodies[i] = ccBody(ses, "cli-"+ses, i+1)
				}
				b.StartTimer()
				for i := range n {
					start := time.Now()
					if code := post(rtok, bodies[i]); code != http.StatusOK {
						b.Fatalf("replayed step %d: %d", i+1, code)
					}
					total += time.Since(start)
					// The harness runs the answer's tools before its next
					// call (a Claude Code step's tools and CLI took 60-70
					// ms in BenchmarkForkAtStep's recordings).
					time.Sleep(toolTime) // the simulated tool time, not a wait on a condition
				}
				steps += n
				b.StopTimer()
				// The request after the prefix matches, and the run stops.
				if code := post(rtok, bodies[n]); code != http.StatusForbidden {
					b.Fatalf("request after the prefix: %d, want 403", code)
				}
				if d, err := e.srv.GetDivergence(ctx, &gatewayv1.GetDivergenceRequest{Run: r.GetId()}); err != nil || d.GetDivergence() != nil {
					b.Fatalf("divergence: %v %v", d, err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(steps), "ms/step")
		})
	}
}
