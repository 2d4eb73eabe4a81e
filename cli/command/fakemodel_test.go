package command_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hangar-dev/hangar/cli/command"
)

// syncBuffer is a writer the test reads while the command writes.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func TestFakeModelServesTheDemoScript(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- command.Execute(ctx, command.Streams{In: strings.NewReader(""), Out: &out, Err: io.Discard},
			[]string{"fake-model", "--addr", "127.0.0.1:0"}, envOf(nil))
	}()
	re := regexp.MustCompile(`scripted model upstream at (http://\S+)`)
	var url string
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for url == "" {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("no address printed: %q (%v)", out.String(), <-done)
		}
		<-tick.C
	}
	resp, err := http.Post(url+"/v1/messages", "application/json", strings.NewReader(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "offline demo model") {
		t.Errorf("%d %s", resp.StatusCode, b)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("fake-model: %v", err)
	}
}
