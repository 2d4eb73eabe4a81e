package logging_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/hangar-dev/hangar/platform/logging"
)

func TestNewAddsTraceIDs(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	defer span.End()

	var buf bytes.Buffer
	logger := logging.New(&buf, "info", "json").With(slog.String("service", "session-svc"))
	logger.InfoContext(ctx, "session started", slog.String("session_id", "s-1"))
	logger.InfoContext(context.Background(), "no span")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines: %q", len(lines), buf.String())
	}
	var withSpan, without map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &withSpan); err != nil {
		t.Fatalf("json: %v", err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &without); err != nil {
		t.Fatalf("json: %v", err)
	}
	sc := span.SpanContext()
	if withSpan["trace_id"] != sc.TraceID().String() || withSpan["span_id"] != sc.SpanID().String() {
		t.Errorf("trace attrs = %v %v, want %s %s", withSpan["trace_id"], withSpan["span_id"], sc.TraceID(), sc.SpanID())
	}
	if withSpan["msg"] != "session started" || withSpan["session_id"] != "s-1" || withSpan["service"] != "session-svc" {
		t.Errorf("record = %v", withSpan)
	}
	if _, ok := without["trace_id"]; ok {
		t.Errorf("record without span has trace_id: %v", without)
	}
}

func TestNewLevelAndFormat(t *testing.T) {
	t.Parallel()
	tests := []struct {
		level, format string
		wantDebug     bool
		wantWarn      bool
		wantPrefix    string
	}{
		{"debug", "text", true, true, "time="},
		{"info", "json", false, true, "{"},
		{"warn", "json", false, true, "{"},
		{"error", "text", false, false, ""},
		{"bogus", "bogus", false, true, "time="},
	}
	for _, tt := range tests {
		t.Run(tt.level+"/"+tt.format, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			logger := logging.New(&buf, tt.level, tt.format)
			logger.Debug("debug line")
			if got := strings.Contains(buf.String(), "debug line"); got != tt.wantDebug {
				t.Errorf("debug logged = %v, want %v", got, tt.wantDebug)
			}
			buf.Reset()
			logger.Warn("warn line")
			if got := strings.Contains(buf.String(), "warn line"); got != tt.wantWarn {
				t.Errorf("warn logged = %v, want %v", got, tt.wantWarn)
			}
			if !strings.HasPrefix(buf.String(), tt.wantPrefix) {
				t.Errorf("output %q, want prefix %q", buf.String(), tt.wantPrefix)
			}
		})
	}
}

func TestTraceHandlerInGroup(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	defer span.End()

	var buf bytes.Buffer
	logger := slog.New(logging.NewTraceHandler(slog.NewTextHandler(&buf, nil))).WithGroup("req")
	logger.InfoContext(ctx, "grouped", slog.Int("n", 1))
	if want := "req.trace_id=" + span.SpanContext().TraceID().String(); !strings.Contains(buf.String(), want) {
		t.Errorf("output %q lacks %q", buf.String(), want)
	}
}
