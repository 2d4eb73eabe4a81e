package store

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrBadPageToken: ListSessions or ListJobs was given a page token it did
// not issue.
var ErrBadPageToken = errors.New("bad page token")

const sessionColumns = `name, environment, repo, harness, branch, state, state_reason, state_changed_at,
	idle_minutes, parent_id, forked_from_checkpoint, conversation_id, created_at, last_active_at,
	sandbox_id, fencing_token, base_commit, budget_max_cost_usd, budget_max_tokens, budget_max_minutes,
	approvals, harness_lock, cache_ttl, model, question_json, version`

// sessionArgs are the values of sessionColumns, in order.
func sessionArgs(s *Session) ([]any, error) {
	var idle sql.NullInt64
	if s.IdleMinutes != nil {
		idle = sql.NullInt64{Int64: int64(*s.IdleMinutes), Valid: true}
	}
	var question sql.NullString
	if s.Question != nil {
		b, err := json.Marshal(questionJSON{ID: s.Question.ID, Text: s.Question.Text, Turn: s.Question.Turn, AskedAt: toNanos(s.Question.AskedAt)})
		if err != nil {
			return nil, fmt.Errorf("encode question: %w", err)
		}
		question = sql.NullString{String: string(b), Valid: true}
	}
	return []any{
		s.Name, s.Environment, s.Repo, s.Harness, s.Branch, s.State, s.StateReason, toNanos(s.StateChangedAt),
		idle, s.ParentID, s.ForkedFromCheckpoint, s.ConversationID, toNanos(s.CreatedAt), toNanos(s.LastActiveAt),
		s.SandboxID, int64(s.FencingToken), s.BaseCommit, s.Budget.MaxCostUSD, s.Budget.MaxTokens, s.Budget.MaxMinutes,
		s.Approvals, s.HarnessLock, s.CacheTTL, s.Model, question, s.Version,
	}, nil
}

type questionJSON struct {
	ID      string `json:"id"`
	Text    string `json:"text"`
	Turn    int    `json:"turn"`
	AskedAt int64  `json:"asked_at"`
}

type rowScanner interface{ Scan(dest ...any) error }

func scanSession(row rowScanner) (*Session, error) {
	var (
		s                                        Session
		stateChanged, created, lastActive, fence int64
		idle                                     sql.NullInt64
		question                                 sql.NullString
	)
	err := row.Scan(&s.Name, &s.Environment, &s.Repo, &s.Harness, &s.Branch, &s.State, &s.StateReason, &stateChanged,
		&idle, &s.ParentID, &s.ForkedFromCheckpoint, &s.ConversationID, &created, &lastActive,
		&s.SandboxID, &fence, &s.BaseCommit, &s.Budget.MaxCostUSD, &s.Budget.MaxTokens, &s.Budget.MaxMinutes,
		&s.Approvals, &s.HarnessLock, &s.CacheTTL, &s.Model, &question, &s.Version)
	if err != nil {
		return nil, err
	}
	s.StateChangedAt, s.CreatedAt, s.LastActiveAt = fromNanos(stateChanged), fromNanos(created), fromNanos(lastActive)
	s.FencingToken = uint64(fence)
	if idle.Valid {
		v := int(idle.Int64)
		s.IdleMinutes = &v
	}
	if question.Valid {
		var q questionJSON
		if err := json.Unmarshal([]byte(question.String), &q); err != nil {
			return nil, fmt.Errorf("decode question: %w", err)
		}
		s.Question = &Question{ID: q.ID, Text: q.Text, Turn: q.Turn, AskedAt: fromNanos(q.AskedAt)}
	}
	return &s, nil
}

// CreateSession inserts a session. CreatedAt defaults to now, LastActiveAt
// and StateChangedAt to CreatedAt; Version is set to 1 (also in *sess).
// ErrExists if the name is taken.
func (s *Store) CreateSession(ctx context.Context, sess *Session) error {
	if sess.Name == "" {
		return errors.New("store: create session: empty name")
	}
	if sess.CreatedAt.IsZero() {
		sess.CreatedAt = s.now()
	}
	if sess.LastActiveAt.IsZero() {
		sess.LastActiveAt = sess.CreatedAt
	}
	if sess.StateChangedAt.IsZero() {
		sess.StateChangedAt = sess.CreatedAt
	}
	sess.Version = 1
	args, err := sessionArgs(sess)
	if err != nil {
		return fmt.Errorf("store: create session %q: %w", sess.Name, err)
	}
	res, err := s.w.ExecContext(ctx, s.q(`INSERT INTO sessions (`+sessionColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (name) DO NOTHING`), args...)
	err = diskFull(err)
	if err != nil {
		return fmt.Errorf("store: create session %q: %w", sess.Name, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("store: create session %q: %w", sess.Name, err)
	}
	if n == 0 {
		return fmt.Errorf("store: create session %q: %w", sess.Name, ErrExists)
	}
	return nil
}

// GetSession returns the session, or ErrNotFound.
func (s *Store) GetSession(ctx context.Context, name string) (*Session, error) {
	sess, err := s.getSession(ctx, s.r, name, false)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return sess, nil
}

func (s *Store) getSession(ctx context.Context, db queryer, name string, lock bool) (*Session, error) {
	query := `SELECT ` + sessionColumns + ` FROM sessions WHERE name = ?`
	if lock {
		query += s.forUpdate()
	}
	sess, err := scanSession(db.QueryRowContext(ctx, s.q(query), name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("session %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get session %q: %w", name, err)
	}
	return sess, nil
}

// ListOptions filters and pages ListSessions.
type ListOptions struct {
	// States keeps sessions in any of these states; empty keeps all.
	States []string
	// ParentID keeps the forks of this session; "" keeps all.
	ParentID string
	// Limit is the page size; <= 0 returns everything in one page.
	Limit int
	// PageToken continues from the page that returned it.
	PageToken string
}

// ListSessions returns sessions most recently active first (ties by name)
// and the token of the next page ("" on the last one).
func (s *Store) ListSessions(ctx context.Context, opts ListOptions) ([]*Session, string, error) {
	var (
		where []string
		args  []any
	)
	if len(opts.States) > 0 {
		where = append(where, "state IN ("+placeholders(len(opts.States))+")")
		for _, st := range opts.States {
			args = append(args, st)
		}
	}
	if opts.ParentID != "" {
		where = append(where, "parent_id = ?")
		args = append(args, opts.ParentID)
	}
	if opts.PageToken != "" {
		at, name, err := decodePageToken(opts.PageToken)
		if err != nil {
			return nil, "", fmt.Errorf("store: list sessions: %w", err)
		}
		where = append(where, "(last_active_at < ? OR (last_active_at = ? AND name > ?))")
		args = append(args, at, at, name)
	}
	query := `SELECT ` + sessionColumns + ` FROM sessions`
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY last_active_at DESC, name ASC"
	if opts.Limit > 0 {
		query += " LIMIT ?"
		args = append(args, opts.Limit+1)
	}
	out, err := s.querySessions(ctx, query, args...)
	if err != nil {
		return nil, "", fmt.Errorf("store: list sessions: %w", err)
	}
	next := ""
	if opts.Limit > 0 && len(out) > opts.Limit {
		out = out[:opts.Limit]
		last := out[len(out)-1]
		next = encodePageToken(toNanos(last.LastActiveAt), last.Name)
	}
	return out, next, nil
}

// ListSessionsByState returns every session in any of the states (all
// sessions when none are given), most recently active first. It is for
// background loops (idle suspension, checkpoint schedule).
func (s *Store) ListSessionsByState(ctx context.Context, states ...string) ([]*Session, error) {
	out, _, err := s.ListSessions(ctx, ListOptions{States: states})
	return out, err
}

func (s *Store) querySessions(ctx context.Context, query string, args ...any) ([]*Session, error) {
	rows, err := s.r.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Session
	for rows.Next() {
		sess, err := scanSession(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sess)
	}
	return out, rows.Err()
}

func encodePageToken(at int64, name string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at, 10) + "/" + name))
}

func decodePageToken(tok string) (int64, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return 0, "", ErrBadPageToken
	}
	at, name, ok := strings.Cut(string(b), "/")
	if !ok {
		return 0, "", ErrBadPageToken
	}
	n, err := strconv.ParseInt(at, 10, 64)
	if err != nil {
		return 0, "", ErrBadPageToken
	}
	return n, name, nil
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// UpdateSession reads the session, applies fn to it and writes it back, in
// one transaction; Version is bumped. fn must not call the Store (on SQLite
// the transaction holds the only write connection). An error from fn aborts
// the update and is returned as is (wrapped). Name and Version cannot be
// changed by fn; to change State with a recorded reason use Transition.
func (s *Store) UpdateSession(ctx context.Context, name string, fn func(*Session) error) (*Session, error) {
	var out *Session
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		sess, err := s.getSession(ctx, tx, name, true)
		if err != nil {
			return err
		}
		if err := fn(sess); err != nil {
			return err
		}
		sess.Name = name
		out, err = s.writeSession(ctx, tx, sess)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: update session %q: %w", name, err)
	}
	return out, nil
}

// writeSession writes every column of sess, bumping its version.
func (s *Store) writeSession(ctx context.Context, tx *sql.Tx, sess *Session) (*Session, error) {
	old := sess.Version
	sess.Version = old + 1
	args, err := sessionArgs(sess)
	if err != nil {
		return nil, err
	}
	cols := strings.Split(sessionColumns, ",")
	var set []string
	for _, c := range cols[1:] { // not name
		set = append(set, strings.TrimSpace(c)+" = ?")
	}
	args = append(args[1:], sess.Name, old)
	res, err := tx.ExecContext(ctx, s.q(`UPDATE sessions SET `+strings.Join(set, ", ")+` WHERE name = ? AND version = ?`), args...)
	if err != nil {
		return nil, fmt.Errorf("write session: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, fmt.Errorf("write session: %w", err)
	}
	if n != 1 {
		return nil, fmt.Errorf("write session: version %d changed underneath: %w", old, ErrConflict)
	}
	return sess, nil
}

// Transition moves the session to state to, atomically: ErrConflict (with
// the current state in the message) unless its state is one of from (any
// state when from is empty). It sets State, StateReason and StateChangedAt,
// bumps Version and records a Transition.
func (s *Store) Transition(ctx context.Context, name, to, reason string, from ...string) (*Session, error) {
	var out *Session
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		sess, err := s.getSession(ctx, tx, name, true)
		if err != nil {
			return err
		}
		if len(from) > 0 && !slices.Contains(from, sess.State) {
			return fmt.Errorf("session %q is %s, not %s: %w", name, sess.State, strings.Join(from, " or "), ErrConflict)
		}
		now := s.now()
		prev := sess.State
		sess.State, sess.StateReason, sess.StateChangedAt = to, reason, now
		if out, err = s.writeSession(ctx, tx, sess); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO session_transitions (session, from_state, to_state, reason, at) VALUES (?, ?, ?, ?, ?)`),
			name, prev, to, reason, toNanos(now)); err != nil {
			return fmt.Errorf("record transition: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: transition session %q to %s: %w", name, to, err)
	}
	return out, nil
}

// ListTransitions returns the session's newest limit transitions (all when
// limit <= 0), oldest first. ErrNotFound for an unknown session.
func (s *Store) ListTransitions(ctx context.Context, name string, limit int) ([]Transition, error) {
	query := `SELECT session, from_state, to_state, reason, at FROM session_transitions WHERE session = ? ORDER BY id DESC`
	args := []any{name}
	if limit > 0 {
		query += " LIMIT ?"
		args = append(args, limit)
	}
	rows, err := s.r.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, fmt.Errorf("store: list transitions of %q: %w", name, err)
	}
	defer rows.Close()
	var out []Transition
	for rows.Next() {
		var (
			t  Transition
			at int64
		)
		if err := rows.Scan(&t.Session, &t.From, &t.To, &t.Reason, &at); err != nil {
			return nil, fmt.Errorf("store: list transitions of %q: %w", name, err)
		}
		t.At = fromNanos(at)
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list transitions of %q: %w", name, err)
	}
	if len(out) == 0 {
		if err := s.requireSession(ctx, s.r, name); err != nil {
			return nil, fmt.Errorf("store: list transitions: %w", err)
		}
	}
	slices.Reverse(out)
	return out, nil
}

// timeOr returns t, or def when t is zero.
func timeOr(t, def time.Time) time.Time {
	if t.IsZero() {
		return def
	}
	return t
}
