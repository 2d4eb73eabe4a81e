package logging_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/hangar-dev/hangar/platform/logging"
)

func TestRecoverLogsAPanicAndEndsTheGoroutine(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer logging.Recover(context.Background(), logger, "test work")
		var m map[string]int
		m["boom"] = 1 // panics: assignment to a nil map
	}()
	<-done
	out := buf.String()
	for _, want := range []string{"background work panicked", "work=\"test work\"", "nil map", "recover_test.go"} {
		if !strings.Contains(out, want) {
			t.Errorf("log %q lacks %q", out, want)
		}
	}
}

func TestRecoverIsQuietWithoutAPanic(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	func() {
		defer logging.Recover(context.Background(), logger, "calm work")
	}()
	if buf.Len() != 0 {
		t.Fatalf("logged %q without a panic", buf.String())
	}
}
