package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/hangar-dev/hangar/gateway-svc/internal/server"
	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// ttfb posts body and returns the time to the first SSE event; it reads the
// rest of the answer.
func ttfb(b *testing.B, client *http.Client, url, token, body string) time.Duration {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("x-api-key", token)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		b.Fatal(err)
	}
	d := time.Since(start)
	_, _ = io.Copy(io.Discard, br)
	return d
}

func percentile(ds []time.Duration, p float64) time.Duration {
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(float64(len(ds))*p))]
}

// BenchmarkAddedLatency measures time to first byte through the gateway and
// directly to the scripted upstream; it reports p50/p99 of both and the
// added p50.
func BenchmarkAddedLatency(b *testing.B) {
	e := newEnv(b, scripted.Script{Default: &scripted.Answer{Text: "hello", Usage: &scripted.Usage{InputTokens: 10, OutputTokens: 2}}})
	_, tok := e.createRun(b, &gatewayv1.CreateRunRequest{})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	var direct, via []time.Duration
	for b.Loop() {
		direct = append(direct, ttfb(b, client, e.up.URL+"/v1/messages", tok, anthBody))
		via = append(via, ttfb(b, client, e.data.URL+"/v1/messages", tok, anthBody))
	}
	b.ReportMetric(float64(percentile(direct, 0.5).Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(percentile(direct, 0.99).Microseconds()), "direct-p99-µs")
	b.ReportMetric(float64(percentile(via, 0.5).Microseconds()), "gateway-p50-µs")
	b.ReportMetric(float64(percentile(via, 0.99).Microseconds()), "gateway-p99-µs")
	b.ReportMetric(float64((percentile(via, 0.5) - percentile(direct, 0.5)).Microseconds()), "added-p50-µs")
}

// BenchmarkConcurrentStreams runs 32 streams at a time through the gateway
// and reports completed streams per second.
func BenchmarkConcurrentStreams(b *testing.B) {
	e := newEnv(b, scripted.Script{Default: &scripted.Answer{Text: strings.Repeat("token ", 200), Chunks: 50, Usage: &scripted.Usage{InputTokens: 10, OutputTokens: 200}}})
	const workers = 32
	toks := make([]string, workers)
	for i := range toks {
		_, toks[i] = e.createRun(b, &gatewayv1.CreateRunRequest{})
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	start := time.Now()
	n := 0
	for b.Loop() {
		var wg sync.WaitGroup
		for i := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ttfb(b, client, e.data.URL+"/v1/messages", toks[i], anthBody)
			}()
		}
		wg.Wait()
		n += workers
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "streams/s")
}

// sleepTrees is a TreeHasher that takes d per hash (a sandbox exec of
// `hangar-sandbox tree-hash`).
type sleepTrees struct{ d time.Duration }

func (s sleepTrees) TreeHash(ctx context.Context, _ *gatewayv1.RunSandbox) (string, error) {
	select {
	case <-time.After(s.d):
		return "tree-1", nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// slowFirstByte delays every upstream answer by d (the model's time to
// its first byte).
func slowFirstByte(next http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(d) // the simulated upstream latency, not a wait on a condition
		next.ServeHTTP(w, r)
	})
}

// BenchmarkStepTreeHash measures a whole step (request to the answer's
// end) through the gateway with the work tree hash taken at each step, for
// a hash of 0 (no hasher) and 10 ms against an upstream whose first byte
// takes 0 or 20 ms, and for a replayed step (answered from the tape). The
// hash runs concurrently with the upstream call: with the 20 ms upstream a
// 10 ms hash adds nothing; a replayed step costs the hash plus the
// gateway's own work (tree-added-ms: the time over the same step with no
// hasher).
//
//	go test -run '^$' -bench BenchmarkStepTreeHash ./internal/server/
func BenchmarkStepTreeHash(b *testing.B) {
	const hash = 10 * time.Millisecond
	for _, upDelay := range []time.Duration{0, 20 * time.Millisecond} {
		for _, mode := range []string{"live", "replay"} {
			if mode == "replay" && upDelay != 0 {
				continue // no upstream call
			}
			var base float64
			for _, h := range []time.Duration{0, hash} {
				name := fmt.Sprintf("%s/upstream-%dms/hash-%dms", mode, upDelay.Milliseconds(), h.Milliseconds())
				if mode == "replay" {
					name = fmt.Sprintf("%s/hash-%dms", mode, h.Milliseconds())
				}
				b.Run(name, func(b *testing.B) {
					msPerStep := stepTime(b, mode, upDelay, h)
					b.ReportMetric(msPerStep, "ms/step")
					if h == 0 {
						base = msPerStep
					} else {
						b.ReportMetric(msPerStep-base, "tree-added-ms")
					}
				})
			}
		}
	}
}

// stepTime is the mean time of a step in b's loop, in ms.
func stepTime(b *testing.B, mode string, upDelay, hash time.Duration) float64 {
	script := scripted.Script{Default: &scripted.Answer{Text: "hello", Usage: &scripted.Usage{InputTokens: 10, OutputTokens: 2}}}
	upstream := scripted.MustNew(script)
	up := httptest.NewServer(slowFirstByte(upstream, upDelay))
	b.Cleanup(up.Close)
	e := newEnv(b, script, func(d *server.Deps) {
		d.Upstreams.AnthropicURL = up.URL
		if hash > 0 {
			d.Trees = sleepTrees{hash}
		}
	})
	ctx := context.Background()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	sb := &gatewayv1.RunSandbox{Id: "sb-1", WorkDir: "/s/work"}
	rec, tok := e.createRun(b, &gatewayv1.CreateRunRequest{Session: "ses-rec", Sandbox: sb})
	step := func(tok string) time.Duration {
		req, _ := http.NewRequest(http.MethodPost, e.data.URL+"/v1/messages", strings.NewReader(anthBody))
		req.Header.Set("x-api-key", tok)
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("step: %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	if mode == "replay" {
		step(tok) // the taped step every replay answers from
	}
	var total time.Duration
	n := 0
	for b.Loop() {
		if mode == "live" {
			total += step(tok)
		} else {
			b.StopTimer()
			r, rtok := e.createRun(b, &gatewayv1.CreateRunRequest{Session: "ses-rp", Sandbox: sb})
			if _, err := e.srv.SetReplay(ctx, &gatewayv1.SetReplayRequest{Run: r.GetId(), Replay: &gatewayv1.Replay{TapeRun: rec.GetId(), AtSeq: 1}}); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			total += step(rtok)
		}
		n++
	}
	return float64(total.Microseconds()) / 1000 / float64(n)
}
