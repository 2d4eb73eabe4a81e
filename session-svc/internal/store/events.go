package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
)

const eventColumns = `session, seq, turn, at, kind, text, exit_code, path, usage_json, data_json`

// AppendEvents stores events at the end of the session's log, assigning
// each its Seq (one past the last, atomically) and Session; a zero Time
// becomes now. It returns the stored events. ErrNotFound for an unknown
// session.
func (s *Store) AppendEvents(ctx context.Context, name string, events []Event) ([]Event, error) {
	if len(events) == 0 {
		return nil, nil
	}
	out := make([]Event, len(events))
	copy(out, events)
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var last int64
		err := tx.QueryRowContext(ctx, s.q(`UPDATE sessions SET last_event_seq = last_event_seq + ? WHERE name = ? RETURNING last_event_seq`),
			int64(len(out)), name).Scan(&last)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("session %q: %w", name, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("number events: %w", err)
		}
		now := s.now()
		first := last - int64(len(out)) + 1
		insert := s.q(`INSERT INTO events (` + eventColumns + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
		for i := range out {
			e := &out[i]
			e.Session, e.Seq, e.Time = name, first+int64(i), timeOr(e.Time, now)
			var usage sql.NullString
			if e.Usage != nil {
				b, err := json.Marshal(e.Usage)
				if err != nil {
					return fmt.Errorf("encode usage: %w", err)
				}
				usage = sql.NullString{String: string(b), Valid: true}
			}
			if _, err := tx.ExecContext(ctx, insert, e.Session, e.Seq, e.Turn, toNanos(e.Time), e.Kind, e.Text, e.ExitCode, e.Path, usage, e.DataJSON); err != nil {
				return fmt.Errorf("insert event: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: append events to %q: %w", name, err)
	}
	return out, nil
}

// ListEvents returns the session's events with Seq > afterSeq, in order;
// turn > 0 keeps that turn's only; limit > 0 bounds the count. ErrNotFound
// for an unknown session.
func (s *Store) ListEvents(ctx context.Context, name string, afterSeq int64, turn int, limit int) ([]Event, error) {
	query := `SELECT ` + eventColumns + ` FROM events WHERE session = ? AND seq > ?`
	args := []any{name, afterSeq}
	if turn > 0 {
		query += " AND turn = ?"
		args = append(args, turn)
	}
	query += " ORDER BY seq"
	if limit > 0 {
		query += " LIMIT ?"
		args = append(args, limit)
	}
	rows, err := s.r.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, fmt.Errorf("store: list events of %q: %w", name, err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var (
			e     Event
			at    int64
			usage sql.NullString
		)
		if err := rows.Scan(&e.Session, &e.Seq, &e.Turn, &at, &e.Kind, &e.Text, &e.ExitCode, &e.Path, &usage, &e.DataJSON); err != nil {
			return nil, fmt.Errorf("store: list events of %q: %w", name, err)
		}
		e.Time = fromNanos(at)
		if usage.Valid {
			e.Usage = &Usage{}
			if err := json.Unmarshal([]byte(usage.String), e.Usage); err != nil {
				return nil, fmt.Errorf("store: list events of %q: decode usage: %w", name, err)
			}
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list events of %q: %w", name, err)
	}
	if len(out) == 0 {
		if err := s.requireSession(ctx, s.r, name); err != nil {
			return nil, fmt.Errorf("store: list events: %w", err)
		}
	}
	return out, nil
}
