package command

import (
	"context"
	"errors"
	"fmt"
	"github.com/hangar-dev/hangar/cli/up"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/hangar-dev/hangar/platform/logging"
)

// upLogFile is where `hangar up` keeps its full log, under HANGAR_HOME; the
// previous start's is kept as upLogFile+".1".
const upLogFile = "logs/hangar.log"

// upLog is `hangar up`'s logging: every record at the configured level to
// the log file; on the terminal only warnings and errors (-v: the
// configured level too) until shutdown, then only errors and one line per
// service stopped.
type upLog struct {
	logger   *slog.Logger
	path     string
	file     *os.File
	terminal *upTerminal
}

func openUpLog(home, level, format string, verbose bool, terminal io.Writer) (*upLog, error) {
	path := filepath.Join(home, upLogFile)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("HANGAR_HOME=%s: cannot create the log directory: %w", home, sessionUnwrapPathErr(err))
	}
	if err := os.Rename(path, path+".1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("cannot keep the previous log %s: %w", path, sessionUnwrapPathErr(err))
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cannot open the log file %s: %w", path, sessionUnwrapPathErr(err))
	}
	fileLevel := logging.ParseLevel(level)
	termLevel := max(fileLevel, slog.LevelWarn)
	if verbose {
		termLevel = fileLevel
	}
	term := &upTerminal{w: terminal}
	term.level.Set(termLevel)
	opts := &slog.HandlerOptions{Level: fileLevel}
	var fileHandler slog.Handler = slog.NewTextHandler(f, opts)
	if format == "json" {
		fileHandler = slog.NewJSONHandler(f, opts)
	}
	termHandler := &upTerminalHandler{term: term, next: slog.NewTextHandler(terminal, &slog.HandlerOptions{Level: &term.level})}
	return &upLog{
		logger:   slog.New(logging.NewTraceHandler(slog.NewMultiHandler(fileHandler, termHandler))),
		path:     path,
		file:     f,
		terminal: term,
	}, nil
}

// stopping switches the terminal to shutdown: errors only, and a line per
// step of the ordered stop. What else shutdown logs (connections refused between
// services stopping one after the other) stays in the file.
func (l *upLog) stopping() {
	l.terminal.mu.Lock()
	defer l.terminal.mu.Unlock()
	if l.terminal.stopping {
		return
	}
	l.terminal.stopping = true
	l.terminal.level.Set(slog.LevelError)
	fmt.Fprintf(l.terminal.w, "stopping hangar (the full log is in %s)\n", l.path)
}

func (l *upLog) close() error { return l.file.Close() }

type upTerminal struct {
	w     io.Writer
	level slog.LevelVar

	mu       sync.Mutex
	stopping bool
}

// upTerminalHandler writes records at the terminal's level, and during
// shutdown one line per step of the ordered stop.
type upTerminalHandler struct {
	term    *upTerminal
	next    slog.Handler
	service string
}

func (h *upTerminalHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level) || h.isStopping()
}

func (h *upTerminalHandler) isStopping() bool {
	h.term.mu.Lock()
	defer h.term.mu.Unlock()
	return h.term.stopping
}

func (h *upTerminalHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == up.StopStepMessage && h.isStopping() {
		// One line per step of the ordered stop (cli/up: stopInOrder).
		var step, took string
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "step":
				step = a.Value.String()
			case "took":
				took = a.Value.String()
			}
			return true
		})
		h.term.mu.Lock()
		defer h.term.mu.Unlock()
		_, err := fmt.Fprintf(h.term.w, "  stopped %s (%s)\n", step, took)
		return err
	}
	if !h.next.Enabled(ctx, r.Level) {
		return nil
	}
	return h.next.Handle(ctx, r)
}

func (h *upTerminalHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.next = h.next.WithAttrs(attrs)
	for _, a := range attrs {
		if a.Key == "service" {
			c.service = a.Value.String()
		}
	}
	return &c
}

func (h *upTerminalHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.next = h.next.WithGroup(name)
	return &c
}
