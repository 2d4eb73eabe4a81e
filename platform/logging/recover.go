package logging

import (
	"context"
	"log/slog"
	"runtime/debug"
)

// Recover, deferred at the top of a background goroutine, keeps a panic in
// it from taking the whole process (and every session in it) down: the
// panic is logged with its stack and the goroutine ends.
//
//	go func() {
//		defer logging.Recover(ctx, logger, "turn")
//		...
//	}()
func Recover(ctx context.Context, logger *slog.Logger, what string) {
	v := recover()
	if v == nil {
		return
	}
	if logger == nil {
		logger = slog.Default()
	}
	logger.ErrorContext(ctx, "background work panicked", "work", what, "panic", v, "stack", string(debug.Stack()))
}
