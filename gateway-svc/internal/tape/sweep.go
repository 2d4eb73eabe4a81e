package tape

import (
	"context"
	"log/slog"
	"time"
)

// Index lists tapes by creation time; the runs store implements it.
type Index interface {
	// TapesBefore returns runs whose tapes were started before t, with their
	// step counts.
	TapesBefore(ctx context.Context, t time.Time) (map[string]int32, error)
	// ForgetTape drops run from the index.
	ForgetTape(ctx context.Context, run string) error
}

// Sweeper deletes tapes older than Days.
type Sweeper struct {
	Tapes  *Tapes
	Index  Index
	Days   int
	Now    func() time.Time
	Logger *slog.Logger
}

// Sweep deletes every tape started more than Days days before Now and
// returns how many it deleted.
func (s *Sweeper) Sweep(ctx context.Context) (int, error) {
	cutoff := s.Now().Add(-time.Duration(s.Days) * 24 * time.Hour)
	old, err := s.Index.TapesBefore(ctx, cutoff)
	if err != nil {
		return 0, err
	}
	n := 0
	for run, steps := range old {
		if err := s.Tapes.Delete(ctx, run, steps); err != nil {
			return n, err
		}
		if err := s.Index.ForgetTape(ctx, run); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// Run sweeps every interval until ctx ends.
func (s *Sweeper) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if n, err := s.Sweep(ctx); err != nil {
			s.logger().LogAttrs(ctx, slog.LevelWarn, "tape sweep failed", slog.Any("error", err))
		} else if n > 0 {
			s.logger().LogAttrs(ctx, slog.LevelInfo, "tapes deleted", slog.Int("count", n), slog.Int("days", s.Days))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Sweeper) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}
