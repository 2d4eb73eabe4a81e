// Package logging builds hangar's slog loggers.
//
// Log messages are static strings; the data goes in attributes:
//
//	logger.InfoContext(ctx, "session started", slog.String("session_id", id))
//
// Use the *Context methods: the handler adds trace_id and span_id from the
// OpenTelemetry span in the context, so a log line can be found from a trace
// and the other way round.
package logging

import (
	"context"
	"io"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// New returns a logger writing to w at level ("debug", "info", "warn" or
// "error"; anything else means info) in format "json" or "text" (anything
// else means text). Records logged with a context that holds a valid span get
// trace_id and span_id attributes.
func New(w io.Writer, level, format string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: ParseLevel(level)}
	var h slog.Handler
	if strings.EqualFold(format, "json") {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = slog.NewTextHandler(w, opts)
	}
	return slog.New(NewTraceHandler(h))
}

// ParseLevel maps "debug", "info", "warn" and "error" (any case) to a level;
// anything else is info.
func ParseLevel(level string) slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return slog.LevelInfo
	}
	return l
}

// NewTraceHandler wraps h so that records logged with a context holding a
// valid OpenTelemetry span get trace_id and span_id attributes. Inside a
// WithGroup the two attributes land in that group, like any other.
func NewTraceHandler(h slog.Handler) slog.Handler {
	return traceHandler{h}
}

type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(
			slog.String("trace_id", sc.TraceID().String()),
			slog.String("span_id", sc.SpanID().String()),
		)
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(attrs)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
