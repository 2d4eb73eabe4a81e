package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// AddCheckpoint records a checkpoint of c.Session. CreatedAt defaults to
// now. ErrNotFound for an unknown session, ErrExists for a duplicate ID.
func (s *Store) AddCheckpoint(ctx context.Context, c *Checkpoint) error {
	if c.CreatedAt.IsZero() {
		c.CreatedAt = s.now()
	}
	warnings, err := encodeList(c.Warnings)
	if err != nil {
		return fmt.Errorf("store: add checkpoint: encode warnings: %w", err)
	}
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.requireSession(ctx, tx, c.Session); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, s.q(`INSERT INTO checkpoints (session, id, created_at, reason, turn, size_bytes, warnings_json)
			VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (session, id) DO NOTHING`),
			c.Session, c.ID, toNanos(c.CreatedAt), c.Reason, c.Turn, c.SizeBytes, warnings)
		if err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("insert: %w", err)
		} else if n == 0 {
			return fmt.Errorf("checkpoint %q: %w", c.ID, ErrExists)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: add checkpoint to %q: %w", c.Session, err)
	}
	return nil
}

// ListCheckpoints returns the session's checkpoints, newest first.
// ErrNotFound for an unknown session.
func (s *Store) ListCheckpoints(ctx context.Context, name string) ([]*Checkpoint, error) {
	rows, err := s.r.QueryContext(ctx, s.q(`SELECT session, id, created_at, reason, turn, size_bytes, warnings_json
		FROM checkpoints WHERE session = ? ORDER BY created_at DESC, turn DESC, id DESC`), name)
	if err != nil {
		return nil, fmt.Errorf("store: list checkpoints of %q: %w", name, err)
	}
	defer rows.Close()
	var out []*Checkpoint
	for rows.Next() {
		var (
			c        Checkpoint
			created  int64
			warnings string
		)
		if err := rows.Scan(&c.Session, &c.ID, &created, &c.Reason, &c.Turn, &c.SizeBytes, &warnings); err != nil {
			return nil, fmt.Errorf("store: list checkpoints of %q: %w", name, err)
		}
		c.CreatedAt = fromNanos(created)
		if err := decodeList(warnings, &c.Warnings); err != nil {
			return nil, fmt.Errorf("store: list checkpoints of %q: decode warnings: %w", name, err)
		}
		out = append(out, &c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list checkpoints of %q: %w", name, err)
	}
	if len(out) == 0 {
		if err := s.requireSession(ctx, s.r, name); err != nil {
			return nil, fmt.Errorf("store: list checkpoints: %w", err)
		}
	}
	return out, nil
}

// DeleteCheckpoint removes one checkpoint record; ErrNotFound if absent.
func (s *Store) DeleteCheckpoint(ctx context.Context, name, id string) error {
	res, err := s.w.ExecContext(ctx, s.q(`DELETE FROM checkpoints WHERE session = ? AND id = ?`), name, id)
	err = diskFull(err)
	if err != nil {
		return fmt.Errorf("store: delete checkpoint %q of %q: %w", id, name, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("store: delete checkpoint %q of %q: %w", id, name, err)
	}
	if n == 0 {
		return fmt.Errorf("store: checkpoint %q of session %q: %w", id, name, ErrNotFound)
	}
	return nil
}

// DeleteCheckpoints removes every checkpoint record of the session and
// returns how many there were.
func (s *Store) DeleteCheckpoints(ctx context.Context, name string) (int, error) {
	res, err := s.w.ExecContext(ctx, s.q(`DELETE FROM checkpoints WHERE session = ?`), name)
	err = diskFull(err)
	if err != nil {
		return 0, fmt.Errorf("store: delete checkpoints of %q: %w", name, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("store: delete checkpoints of %q: %w", name, err)
	}
	return int(n), nil
}

const artifactColumns = `session, turn, path, size_bytes, content_type, sha256, blob_key`

// AddArtifact records an artifact of a.Session; one with the same turn and
// path is replaced. ErrNotFound for an unknown session.
func (s *Store) AddArtifact(ctx context.Context, a *Artifact) error {
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.requireSession(ctx, tx, a.Session); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO artifacts (`+artifactColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (session, turn, path) DO UPDATE SET size_bytes = excluded.size_bytes,
				content_type = excluded.content_type, sha256 = excluded.sha256, blob_key = excluded.blob_key`),
			a.Session, a.Turn, a.Path, a.SizeBytes, a.ContentType, a.SHA256, a.BlobKey)
		if err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: add artifact %q to %q: %w", a.Path, a.Session, err)
	}
	return nil
}

func scanArtifact(row rowScanner) (*Artifact, error) {
	var a Artifact
	if err := row.Scan(&a.Session, &a.Turn, &a.Path, &a.SizeBytes, &a.ContentType, &a.SHA256, &a.BlobKey); err != nil {
		return nil, err
	}
	return &a, nil
}

// ListArtifacts returns the session's artifacts by turn then path; turn > 0
// keeps that turn's only. ErrNotFound for an unknown session.
func (s *Store) ListArtifacts(ctx context.Context, name string, turn int) ([]*Artifact, error) {
	query := `SELECT ` + artifactColumns + ` FROM artifacts WHERE session = ?`
	args := []any{name}
	if turn > 0 {
		query += " AND turn = ?"
		args = append(args, turn)
	}
	query += " ORDER BY turn, path"
	rows, err := s.r.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, fmt.Errorf("store: list artifacts of %q: %w", name, err)
	}
	defer rows.Close()
	var out []*Artifact
	for rows.Next() {
		a, err := scanArtifact(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list artifacts of %q: %w", name, err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list artifacts of %q: %w", name, err)
	}
	if len(out) == 0 {
		if err := s.requireSession(ctx, s.r, name); err != nil {
			return nil, fmt.Errorf("store: list artifacts: %w", err)
		}
	}
	return out, nil
}

// GetArtifact returns the artifact at path from turn, or from the newest
// turn that has one when turn is 0. ErrNotFound if there is none.
func (s *Store) GetArtifact(ctx context.Context, name, path string, turn int) (*Artifact, error) {
	query := `SELECT ` + artifactColumns + ` FROM artifacts WHERE session = ? AND path = ?`
	args := []any{name, path}
	if turn > 0 {
		query += " AND turn = ?"
		args = append(args, turn)
	}
	query += " ORDER BY turn DESC LIMIT 1"
	a, err := scanArtifact(s.r.QueryRowContext(ctx, s.q(query), args...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("store: artifact %q of session %q: %w", path, name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: get artifact %q of %q: %w", path, name, err)
	}
	return a, nil
}
