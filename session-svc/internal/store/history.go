package store

import (
	"context"
	"database/sql"
	"fmt"
)

// CopyHistory gives the fork to its parent from's history, in one
// transaction: from's turns (marked Inherited, with zero usage and the same
// numbers), their artifacts (same blob keys) and its events (same sequence
// numbers, copied as they are). to's turn and event counters continue after
// them. Both sessions must exist (ErrNotFound); to must have no turns or
// events of its own yet (ErrConflict).
func (s *Store) CopyHistory(ctx context.Context, from, to string) error {
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := s.getSession(ctx, tx, from, true); err != nil {
			return err
		}
		if _, err := s.getSession(ctx, tx, to, true); err != nil {
			return err
		}
		var lastTurn int
		var lastSeq int64
		if err := tx.QueryRowContext(ctx, s.q(`SELECT last_turn, last_event_seq FROM sessions WHERE name = ?`), to).Scan(&lastTurn, &lastSeq); err != nil {
			return fmt.Errorf("read counters of %q: %w", to, err)
		}
		if lastTurn != 0 || lastSeq != 0 {
			return fmt.Errorf("session %q has history of its own: %w", to, ErrConflict)
		}
		steps := []struct{ what, query string }{
			{"turns", `INSERT INTO turns (` + turnColumns + `)
				SELECT CAST(? AS TEXT), number, message, harness, command, outcome, outcome_reason, summary, result,
					structured_result_json, 0, 0, 0, 0, 0,
					0, checkpoint_id, started_at, ended_at, warnings_json, TRUE, run_id,
					budget_max_cost_usd, budget_max_tokens, budget_max_minutes, drift_json
				FROM turns WHERE session = ?`},
			{"artifacts", `INSERT INTO artifacts (` + artifactColumns + `)
				SELECT CAST(? AS TEXT), turn, path, size_bytes, content_type, sha256, blob_key FROM artifacts WHERE session = ?`},
			{"events", `INSERT INTO events (` + eventColumns + `)
				SELECT CAST(? AS TEXT), seq, turn, at, kind, text, exit_code, path, usage_json, data_json FROM events WHERE session = ?`},
			{"counters", `UPDATE sessions SET
				last_turn = (SELECT p.last_turn FROM sessions p WHERE p.name = ?),
				last_event_seq = (SELECT p.last_event_seq FROM sessions p WHERE p.name = ?)
				WHERE name = ?`},
		}
		for _, st := range steps {
			args := []any{to, from}
			if st.what == "counters" {
				args = []any{from, from, to}
			}
			if _, err := tx.ExecContext(ctx, s.q(st.query), args...); err != nil {
				return fmt.Errorf("copy %s: %w", st.what, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: copy history from %q to %q: %w", from, to, err)
	}
	return nil
}
