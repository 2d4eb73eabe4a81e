package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

const turnColumns = `session, number, message, harness, command, outcome, outcome_reason, summary, result,
	structured_result_json, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd,
	model_calls, checkpoint_id, started_at, ended_at, warnings_json, inherited, run_id,
	budget_max_cost_usd, budget_max_tokens, budget_max_minutes, drift_json`

func turnArgs(t *Turn) ([]any, error) {
	warnings, err := encodeList(t.Warnings)
	if err != nil {
		return nil, fmt.Errorf("encode warnings: %w", err)
	}
	drift, err := encodeList(t.Drift)
	if err != nil {
		return nil, fmt.Errorf("encode drift: %w", err)
	}
	return []any{
		t.Session, t.Number, t.Message, t.Harness, t.Command, t.Outcome, t.OutcomeReason, t.Summary, t.Result,
		t.StructuredResultJSON, t.Usage.InputTokens, t.Usage.OutputTokens, t.Usage.CacheReadTokens, t.Usage.CacheWriteTokens, t.Usage.CostUSD,
		t.Usage.ModelCalls, t.CheckpointID, toNanos(t.StartedAt), nullNanos(t.EndedAt), warnings, t.Inherited, t.RunID,
		t.Budget.MaxCostUSD, t.Budget.MaxTokens, t.Budget.MaxMinutes, drift,
	}, nil
}

func scanTurn(row rowScanner) (*Turn, error) {
	var (
		t               Turn
		started         int64
		ended           sql.NullInt64
		warnings, drift string
	)
	err := row.Scan(&t.Session, &t.Number, &t.Message, &t.Harness, &t.Command, &t.Outcome, &t.OutcomeReason, &t.Summary, &t.Result,
		&t.StructuredResultJSON, &t.Usage.InputTokens, &t.Usage.OutputTokens, &t.Usage.CacheReadTokens, &t.Usage.CacheWriteTokens, &t.Usage.CostUSD,
		&t.Usage.ModelCalls, &t.CheckpointID, &started, &ended, &warnings, &t.Inherited, &t.RunID,
		&t.Budget.MaxCostUSD, &t.Budget.MaxTokens, &t.Budget.MaxMinutes, &drift)
	if err != nil {
		return nil, err
	}
	t.StartedAt, t.EndedAt = fromNanos(started), fromNullNanos(ended)
	if err := decodeList(warnings, &t.Warnings); err != nil {
		return nil, fmt.Errorf("decode warnings: %w", err)
	}
	if err := decodeList(drift, &t.Drift); err != nil {
		return nil, fmt.Errorf("decode drift: %w", err)
	}
	return &t, nil
}

// encodeList stores a list as JSON; empty is "".
func encodeList[T any](v []T) (string, error) {
	if len(v) == 0 {
		return "", nil
	}
	b, err := json.Marshal(v)
	return string(b), err
}

func decodeList[T any](s string, v *[]T) error {
	if s == "" {
		return nil
	}
	return json.Unmarshal([]byte(s), v)
}

// CreateTurn inserts a turn, numbering it one past the session's last turn
// (atomically; t.Number and t.Session are set). StartedAt defaults to now.
// ErrNotFound for an unknown session.
func (s *Store) CreateTurn(ctx context.Context, t *Turn) error {
	if t.StartedAt.IsZero() {
		t.StartedAt = s.now()
	}
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var n int
		err := tx.QueryRowContext(ctx, s.q(`UPDATE sessions SET last_turn = last_turn + 1 WHERE name = ? RETURNING last_turn`), t.Session).Scan(&n)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("session %q: %w", t.Session, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("number turn: %w", err)
		}
		t.Number = n
		args, err := turnArgs(t)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO turns (`+turnColumns+`) VALUES (`+placeholders(len(args))+`)`), args...); err != nil {
			return fmt.Errorf("insert turn: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: create turn of %q: %w", t.Session, err)
	}
	return nil
}

// GetTurn returns turn number of the session, or ErrNotFound.
func (s *Store) GetTurn(ctx context.Context, name string, number int) (*Turn, error) {
	t, err := s.getTurn(ctx, s.r, name, number, false)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return t, nil
}

func (s *Store) getTurn(ctx context.Context, db queryer, name string, number int, lock bool) (*Turn, error) {
	query := `SELECT ` + turnColumns + ` FROM turns WHERE session = ? AND number = ?`
	if lock {
		query += s.forUpdate()
	}
	t, err := scanTurn(db.QueryRowContext(ctx, s.q(query), name, number))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("turn %d of session %q: %w", number, name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get turn %d of %q: %w", number, name, err)
	}
	return t, nil
}

// ListTurns returns the session's turns, first to last. ErrNotFound for an
// unknown session.
func (s *Store) ListTurns(ctx context.Context, name string) ([]*Turn, error) {
	rows, err := s.r.QueryContext(ctx, s.q(`SELECT `+turnColumns+` FROM turns WHERE session = ? ORDER BY number`), name)
	if err != nil {
		return nil, fmt.Errorf("store: list turns of %q: %w", name, err)
	}
	defer rows.Close()
	var out []*Turn
	for rows.Next() {
		t, err := scanTurn(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list turns of %q: %w", name, err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list turns of %q: %w", name, err)
	}
	if len(out) == 0 {
		if err := s.requireSession(ctx, s.r, name); err != nil {
			return nil, fmt.Errorf("store: list turns: %w", err)
		}
	}
	return out, nil
}

// UpdateTurn reads the turn, applies fn and writes it back in one
// transaction. fn must not call the Store; it cannot change Session or
// Number. ErrNotFound for an unknown turn.
func (s *Store) UpdateTurn(ctx context.Context, name string, number int, fn func(*Turn) error) (*Turn, error) {
	var out *Turn
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		t, err := s.getTurn(ctx, tx, name, number, true)
		if err != nil {
			return err
		}
		if err := fn(t); err != nil {
			return err
		}
		t.Session, t.Number = name, number
		args, err := turnArgs(t)
		if err != nil {
			return err
		}
		cols := strings.Split(turnColumns, ",")
		var set []string
		for _, c := range cols[2:] { // not session, number
			set = append(set, strings.TrimSpace(c)+" = ?")
		}
		args = append(args[2:], name, number)
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE turns SET `+strings.Join(set, ", ")+` WHERE session = ? AND number = ?`), args...); err != nil {
			return fmt.Errorf("write turn: %w", err)
		}
		out = t
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: update turn %d of %q: %w", number, name, err)
	}
	return out, nil
}
