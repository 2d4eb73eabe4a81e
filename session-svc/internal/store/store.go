// Package store keeps session-svc's records in SQL: sessions, their state
// transitions, turns, events, checkpoints, artifacts and jobs.
//
// One Store works on either an embedded SQLite file (the default) or
// PostgreSQL (a postgres:// URL), with the same SQL: queries are written with
// "?" placeholders and rebound to $n for PostgreSQL, and the schema comes from
// embedded, versioned migrations (the schema_migrations table) whose only
// dialect difference is the auto-incrementing key.
//
// Records are plain Go structs. Times are stored as Unix nanoseconds and come
// back in UTC; a zero time.Time is stored as 0 and read back as zero.
//
// Counters that must not race (turn numbers, event sequence numbers) live on
// the session row and are incremented in the same transaction as the insert,
// so the row lock serializes concurrent writers on both dialects. On SQLite
// all writes go through one connection (the database has one writer anyway),
// which removes SQLITE_BUSY between writers of this process; reads use a
// separate pool and run concurrently with writes (WAL).
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// Errors returned by Store methods, wrapped with context; test with
// errors.Is.
var (
	// ErrNotFound: the session (or turn, checkpoint, artifact) does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: a record with that key exists already.
	ErrExists = errors.New("already exists")
	// ErrConflict: a precondition on the record's current state failed.
	ErrConflict = errors.New("conflict")
)

// sqliteBusyTimeout is how long an SQLite connection waits for a lock held
// by another connection (another process, or the reader pool during a
// checkpoint of the WAL) before failing with SQLITE_BUSY.
const sqliteBusyTimeout = 10 * time.Second

// sqliteReaders bounds the SQLite read pool.
const sqliteReaders = 4

// Options configures Open.
type Options struct {
	// DatabaseURL is "" for SQLite at SQLitePath, or a postgres:// or
	// postgresql:// URL for PostgreSQL.
	DatabaseURL string
	// SQLitePath is the SQLite database file, created if missing (with its
	// directory). Used when DatabaseURL is "".
	SQLitePath string
	// Schema is the PostgreSQL schema to create (if missing) and use; "" is
	// public. Ignored for SQLite.
	Schema string
	// Now is the clock for timestamps the store fills in; nil is time.Now.
	Now func() time.Time
}

type dialect int

const (
	dialectSQLite dialect = iota + 1
	dialectPostgres
)

// Store is the session-svc database. It is safe for concurrent use.
type Store struct {
	dialect dialect
	// w takes every write transaction; on SQLite it has one connection.
	w *sql.DB
	// r takes plain reads; on PostgreSQL it is w.
	r   *sql.DB
	now func() time.Time
}

// Open opens (creating if needed) the database and brings its schema up to
// date.
func Open(ctx context.Context, opts Options) (*Store, error) {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	s := &Store{now: now}
	switch {
	case opts.DatabaseURL == "":
		if err := s.openSQLite(opts.SQLitePath); err != nil {
			return nil, err
		}
	case strings.HasPrefix(opts.DatabaseURL, "postgres://"), strings.HasPrefix(opts.DatabaseURL, "postgresql://"):
		if err := s.openPostgres(ctx, opts.DatabaseURL, opts.Schema); err != nil {
			return nil, err
		}
	default:
		return nil, errors.New("store: database URL must start with postgres:// or postgresql:// (or be empty for SQLite)")
	}
	if err := s.migrate(ctx); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) openSQLite(path string) error {
	if path == "" {
		return errors.New("store: SQLite path is empty")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("store: create database directory: %w", err)
	}
	dsn := func(extra string) string {
		return "file:" + path + "?_pragma=busy_timeout(" + fmt.Sprint(sqliteBusyTimeout.Milliseconds()) + ")" +
			"&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)" + extra
	}
	w, err := sql.Open("sqlite", dsn("&_txlock=immediate"))
	if err != nil {
		return fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	if err := w.Ping(); err != nil {
		_ = w.Close()
		return fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	r, err := sql.Open("sqlite", dsn("&_pragma=query_only(1)"))
	if err != nil {
		_ = w.Close()
		return fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	r.SetMaxOpenConns(sqliteReaders)
	r.SetMaxIdleConns(sqliteReaders)
	s.dialect, s.w, s.r = dialectSQLite, w, r
	return nil
}

func (s *Store) openPostgres(ctx context.Context, url, schema string) error {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("store: parse database URL: %w", err)
	}
	if schema != "" {
		// Create the schema on a connection of its own, then point every
		// pooled connection at it.
		conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
		if err != nil {
			return fmt.Errorf("store: connect to postgres: %w", err)
		}
		_, err = conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize())
		_ = conn.Close(ctx)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "42P06") {
			// Another Open created it between the existence check and the
			// insert: IF NOT EXISTS is not atomic.
			err = nil
		}
		if err != nil {
			return fmt.Errorf("store: create schema %q: %w", schema, err)
		}
		cfg.RuntimeParams["search_path"] = schema
	}
	db := stdlib.OpenDB(*cfg)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return fmt.Errorf("store: connect to postgres: %w", err)
	}
	s.dialect, s.w, s.r = dialectPostgres, db, db
	return nil
}

// Close closes the database.
// Ping checks the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.w.PingContext(ctx); err != nil {
		return fmt.Errorf("store: ping: %w", err)
	}
	return nil
}

func (s *Store) Close() error {
	err := s.w.Close()
	if s.r != s.w {
		err = errors.Join(err, s.r.Close())
	}
	if err != nil {
		return fmt.Errorf("store: close: %w", err)
	}
	return nil
}

// q rewrites a query written with "?" placeholders for the dialect.
func (s *Store) q(query string) string {
	if s.dialect != dialectPostgres {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 16)
	n := 0
	for _, c := range query {
		if c == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// forUpdate is the row-locking suffix of a SELECT inside a write transaction.
// SQLite has one writer at a time, so it needs none.
func (s *Store) forUpdate() string {
	if s.dialect == dialectPostgres {
		return " FOR UPDATE"
	}
	return ""
}

// inTx runs fn in a write transaction, committing when it returns nil.
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", diskFull(err))
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return diskFull(err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", diskFull(err))
	}
	return nil
}

// queryer is what both *sql.DB and *sql.Tx offer.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// sessionExists reports whether the session exists.
func (s *Store) sessionExists(ctx context.Context, db queryer, name string) (bool, error) {
	var one int
	err := db.QueryRowContext(ctx, s.q(`SELECT 1 FROM sessions WHERE name = ?`), name).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up session %q: %w", name, err)
	}
	return true, nil
}

// requireSession returns ErrNotFound (wrapped) unless the session exists.
func (s *Store) requireSession(ctx context.Context, db queryer, name string) error {
	ok, err := s.sessionExists(ctx, db, name)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("session %q: %w", name, ErrNotFound)
	}
	return nil
}

// toNanos stores a time; the zero time is 0.
func toNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// fromNanos reads a stored time; 0 is the zero time.
func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func nullNanos(t *time.Time) sql.NullInt64 {
	if t == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: toNanos(*t), Valid: true}
}

func fromNullNanos(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := fromNanos(n.Int64)
	return &t
}
