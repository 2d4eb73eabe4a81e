package server_test

import (
	"bufio"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
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
