// Package store keeps replay-svc's records in SQL: forks at a step and their
// trials.
//
// One Store works on an embedded SQLite file (the default) or PostgreSQL (a
// postgres:// URL) with the same SQL, as session-svc's store does: queries
// use "?" placeholders, rebound to $n for PostgreSQL. A record is kept as
// its protobuf message in JSON (rec) beside the columns queries filter and
// order on, so the schema does not follow every field of the contract.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"google.golang.org/protobuf/encoding/protojson"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
)

// Errors returned by Store methods, wrapped; test with errors.Is.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
)

// Options configures Open.
type Options struct {
	// DatabaseURL is "" for SQLite at SQLitePath, or a postgres:// URL.
	DatabaseURL string
	SQLitePath  string
	// Schema is the PostgreSQL schema to create and use; "" is public.
	Schema string
}

// Store is replay-svc's database; safe for concurrent use.
type Store struct {
	postgres bool
	db       *sql.DB
}

const schema = `
CREATE TABLE IF NOT EXISTS replay_forks (
  id TEXT PRIMARY KEY,
  run TEXT NOT NULL,
  status INTEGER NOT NULL,
  created_at BIGINT NOT NULL,
  rec TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS replay_forks_run ON replay_forks (run, created_at);
CREATE INDEX IF NOT EXISTS replay_forks_status ON replay_forks (status);
CREATE TABLE IF NOT EXISTS replay_trials (
  id TEXT PRIMARY KEY,
  fork TEXT NOT NULL,
  n INTEGER NOT NULL,
  fork_of TEXT NOT NULL,
  status INTEGER NOT NULL,
  rec TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS replay_trials_fork ON replay_trials (fork, n);
CREATE INDEX IF NOT EXISTS replay_trials_fork_of ON replay_trials (fork_of);
CREATE TABLE IF NOT EXISTS replay_leases (
  id TEXT PRIMARY KEY,
  holder TEXT NOT NULL,
  expires_at BIGINT NOT NULL
);
`

// Open opens (creating if needed) the database and its tables.
func Open(ctx context.Context, opts Options) (*Store, error) {
	s := &Store{}
	switch u := opts.DatabaseURL; {
	case u == "":
		if opts.SQLitePath == "" {
			return nil, errors.New("store: SQLite path is empty")
		}
		if err := os.MkdirAll(filepath.Dir(opts.SQLitePath), 0o700); err != nil {
			return nil, fmt.Errorf("store: create database directory: %w", err)
		}
		db, err := sql.Open("sqlite", "file:"+opts.SQLitePath+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
		if err != nil {
			return nil, fmt.Errorf("store: open sqlite: %w", err)
		}
		// One writer: SQLite has one anyway, and this removes SQLITE_BUSY
		// between this process's writers.
		db.SetMaxOpenConns(1)
		s.db = db
	case strings.HasPrefix(u, "postgres://"), strings.HasPrefix(u, "postgresql://"):
		cfg, err := pgx.ParseConfig(u)
		if err != nil {
			return nil, fmt.Errorf("store: parse database URL: %w", err)
		}
		if opts.Schema != "" {
			conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
			if err != nil {
				return nil, fmt.Errorf("store: connect to postgres: %w", err)
			}
			_, err = conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{opts.Schema}.Sanitize())
			_ = conn.Close(ctx)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P06") {
				err = nil // created concurrently: IF NOT EXISTS is not atomic
			}
			if err != nil {
				return nil, fmt.Errorf("store: create schema: %w", err)
			}
			cfg.RuntimeParams["search_path"] = opts.Schema
		}
		s.db, s.postgres = stdlib.OpenDB(*cfg), true
	default:
		return nil, errors.New("store: database URL must start with postgres:// or postgresql:// (or be empty for SQLite)")
	}
	if err := s.createTables(ctx); err != nil {
		_ = s.db.Close()
		return nil, fmt.Errorf("store: create tables: %w", err)
	}
	return s, nil
}

// createTables creates the tables in one transaction. On PostgreSQL an
// advisory lock keyed by the schema serialises replicas starting at once:
// concurrent CREATE TABLE IF NOT EXISTS of one table can fail on
// pg_type's unique index (seen with two replay-svc started together).
func (s *Store) createTables(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if s.postgres {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext('hangar-replay-store:' || current_schema()))`); err != nil {
			return err
		}
	}
	for _, st := range strings.Split(schema, ";") {
		if strings.TrimSpace(st) == "" {
			continue
		}
		if _, err := tx.ExecContext(ctx, st); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// q rebinds "?" placeholders for PostgreSQL.
func (s *Store) q(query string) string {
	if !s.postgres {
		return query
	}
	var sb strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			sb.WriteString("$" + strconv.Itoa(n))
			continue
		}
		sb.WriteRune(r)
	}
	return sb.String()
}

func isUnique(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "23505"
	}
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed")
}

// forkRec is a fork without its trials (they have their own rows).
func forkRec(f *replayv1.Fork) (string, error) {
	c := &replayv1.Fork{}
	*c = replayv1.Fork{
		Fork: f.GetFork(), Run: f.GetRun(), Status: f.GetStatus(), Divergence: f.GetDivergence(), TrialIds: f.GetTrialIds(),
		AtSeq: f.GetAtSeq(), Continuations: f.GetContinuations(), PinSet: f.GetPinSet(), OnDivergence: f.GetOnDivergence(),
		Budget: f.GetBudget(), Tainted: f.GetTainted(), CreatedAt: f.GetCreatedAt(), StatusReason: f.GetStatusReason(),
		PrefixSession: f.GetPrefixSession(), ReplayedSteps: f.GetReplayedSteps(), Harness: f.GetHarness(),
	}
	b, err := protojson.Marshal(c)
	return string(b), err
}

// CreateFork stores a new fork and its trials in one transaction.
func (s *Store) CreateFork(ctx context.Context, f *replayv1.Fork) error {
	rec, err := forkRec(f)
	if err != nil {
		return fmt.Errorf("store: encode fork: %w", err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO replay_forks (id, run, status, created_at, rec) VALUES (?, ?, ?, ?, ?)`),
		f.GetFork(), f.GetRun(), int(f.GetStatus()), f.GetCreatedAt().AsTime().UnixNano(), rec); err != nil {
		if isUnique(err) {
			return fmt.Errorf("%w: fork %s", ErrExists, f.GetFork())
		}
		return fmt.Errorf("store: insert fork %s: %w", f.GetFork(), err)
	}
	for i, t := range f.GetTrials() {
		b, err := protojson.Marshal(t)
		if err != nil {
			return fmt.Errorf("store: encode trial: %w", err)
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO replay_trials (id, fork, n, fork_of, status, rec) VALUES (?, ?, ?, ?, ?, ?)`),
			t.GetId(), f.GetFork(), i+1, t.GetForkOf(), int(t.GetStatus()), string(b)); err != nil {
			return fmt.Errorf("store: insert trial %s: %w", t.GetId(), err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: commit fork %s: %w", f.GetFork(), err)
	}
	return nil
}

// UpdateFork replaces a fork's record (not its trials).
func (s *Store) UpdateFork(ctx context.Context, f *replayv1.Fork) error {
	rec, err := forkRec(f)
	if err != nil {
		return fmt.Errorf("store: encode fork: %w", err)
	}
	res, err := s.db.ExecContext(ctx, s.q(`UPDATE replay_forks SET status = ?, rec = ? WHERE id = ?`), int(f.GetStatus()), rec, f.GetFork())
	if err != nil {
		return fmt.Errorf("store: update fork %s: %w", f.GetFork(), err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: fork %s", ErrNotFound, f.GetFork())
	}
	return nil
}

// UpdateTrial replaces a trial's record.
func (s *Store) UpdateTrial(ctx context.Context, t *replayv1.Trial) error {
	b, err := protojson.Marshal(t)
	if err != nil {
		return fmt.Errorf("store: encode trial: %w", err)
	}
	res, err := s.db.ExecContext(ctx, s.q(`UPDATE replay_trials SET status = ?, rec = ? WHERE id = ?`), int(t.GetStatus()), string(b), t.GetId())
	if err != nil {
		return fmt.Errorf("store: update trial %s: %w", t.GetId(), err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: trial %s", ErrNotFound, t.GetId())
	}
	return nil
}

// GetFork returns a fork with its trials.
func (s *Store) GetFork(ctx context.Context, id string) (*replayv1.Fork, error) {
	var rec string
	err := s.db.QueryRowContext(ctx, s.q(`SELECT rec FROM replay_forks WHERE id = ?`), id).Scan(&rec)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: fork %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("store: get fork %s: %w", id, err)
	}
	f := &replayv1.Fork{}
	if err := protojson.Unmarshal([]byte(rec), f); err != nil {
		return nil, fmt.Errorf("store: decode fork %s: %w", id, err)
	}
	if f.Trials, err = s.ListTrials(ctx, id, ""); err != nil {
		return nil, err
	}
	return f, nil
}

// ListForks returns forks, newest first: all, those of run, or those in one
// of statuses; offset and limit page them (limit 0: all).
func (s *Store) ListForks(ctx context.Context, run string, statuses []replayv1.ForkStatus, offset, limit int) ([]*replayv1.Fork, error) {
	query := `SELECT id FROM replay_forks WHERE 1 = 1`
	var args []any
	if run != "" {
		query += ` AND run = ?`
		args = append(args, run)
	}
	if len(statuses) > 0 {
		query += ` AND status IN (?` + strings.Repeat(", ?", len(statuses)-1) + `)`
		for _, st := range statuses {
			args = append(args, int(st))
		}
	}
	query += ` ORDER BY created_at DESC, id DESC`
	if limit > 0 {
		query += ` LIMIT ` + strconv.Itoa(limit) + ` OFFSET ` + strconv.Itoa(offset)
	}
	rows, err := s.db.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, fmt.Errorf("store: list forks: %w", err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			_ = rows.Close()
			return nil, fmt.Errorf("store: list forks: %w", err)
		}
		ids = append(ids, id)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("store: list forks: %w", err)
	}
	out := make([]*replayv1.Fork, 0, len(ids))
	for _, id := range ids {
		f, err := s.GetFork(ctx, id)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

// ListTrials returns trials in fork order: those of fork, or of forks of
// forkOf (both may be set; neither: all).
func (s *Store) ListTrials(ctx context.Context, fork, forkOf string) ([]*replayv1.Trial, error) {
	query := `SELECT rec FROM replay_trials WHERE 1 = 1`
	var args []any
	if fork != "" {
		query += ` AND fork = ?`
		args = append(args, fork)
	}
	if forkOf != "" {
		query += ` AND fork_of = ?`
		args = append(args, forkOf)
	}
	query += ` ORDER BY fork, n`
	rows, err := s.db.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, fmt.Errorf("store: list trials: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []*replayv1.Trial
	for rows.Next() {
		var rec string
		if err := rows.Scan(&rec); err != nil {
			return nil, fmt.Errorf("store: list trials: %w", err)
		}
		t := &replayv1.Trial{}
		if err := protojson.Unmarshal([]byte(rec), t); err != nil {
			return nil, fmt.Errorf("store: decode trial: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list trials: %w", err)
	}
	return out, nil
}

// GetTrial returns one trial.
func (s *Store) GetTrial(ctx context.Context, id string) (*replayv1.Trial, error) {
	var rec string
	err := s.db.QueryRowContext(ctx, s.q(`SELECT rec FROM replay_trials WHERE id = ?`), id).Scan(&rec)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: trial %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("store: get trial %s: %w", id, err)
	}
	t := &replayv1.Trial{}
	if err := protojson.Unmarshal([]byte(rec), t); err != nil {
		return nil, fmt.Errorf("store: decode trial %s: %w", id, err)
	}
	return t, nil
}

// TakeLease takes or renews the lease id (a fork or a trial being driven)
// for holder until now+ttl. ok is false while another holder's lease on it
// has not expired: that replica drives it. One statement, so two replicas
// racing for an expired lease never both get it.
func (s *Store) TakeLease(ctx context.Context, id, holder string, now time.Time, ttl time.Duration) (ok bool, err error) {
	res, err := s.db.ExecContext(ctx, s.q(`INSERT INTO replay_leases (id, holder, expires_at) VALUES (?, ?, ?)
ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE replay_leases.holder = excluded.holder OR replay_leases.expires_at < ?`),
		id, holder, now.Add(ttl).UnixMilli(), now.UnixMilli())
	if err != nil {
		return false, fmt.Errorf("store: lease %s: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("store: lease %s: %w", id, err)
	}
	return n == 1, nil
}

// ReleaseLease gives holder's lease id back (no-op when another holds it).
func (s *Store) ReleaseLease(ctx context.Context, id, holder string) error {
	if _, err := s.db.ExecContext(ctx, s.q(`DELETE FROM replay_leases WHERE id = ? AND holder = ?`), id, holder); err != nil {
		return fmt.Errorf("store: release lease %s: %w", id, err)
	}
	return nil
}
