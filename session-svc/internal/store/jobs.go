package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

const jobColumns = `id, strategy, state, session, message, n, check_command, budget_json, winner, patch, branch,
	error, attempts_json, created_at, ended_at`

// budgetJSON and attemptJSON are the stored forms of a job's budget and
// attempts: their keys are part of the schema, not Go field names.
type budgetJSON struct {
	MaxCostUSD float64 `json:"max_cost_usd,omitempty"`
	MaxTokens  int64   `json:"max_tokens,omitempty"`
	MaxMinutes int     `json:"max_minutes,omitempty"`
}

type usageJSON struct {
	InputTokens      int64   `json:"input_tokens,omitempty"`
	OutputTokens     int64   `json:"output_tokens,omitempty"`
	CacheReadTokens  int64   `json:"cache_read_tokens,omitempty"`
	CacheWriteTokens int64   `json:"cache_write_tokens,omitempty"`
	CostUSD          float64 `json:"cost_usd,omitempty"`
	ModelCalls       int     `json:"model_calls,omitempty"`
}

type attemptJSON struct {
	Session       string    `json:"session"`
	Branch        string    `json:"branch,omitempty"`
	Outcome       string    `json:"outcome,omitempty"`
	CheckExitCode int       `json:"check_exit_code"`
	Score         *float64  `json:"score,omitempty"`
	CheckOutput   string    `json:"check_output,omitempty"`
	Usage         usageJSON `json:"usage"`
	Checked       bool      `json:"checked,omitempty"`
	Resends       int       `json:"resends,omitempty"`
}

// jobArgs are the values of jobColumns, in order.
func jobArgs(j *Job) ([]any, error) {
	var budget sql.NullString
	if j.Budget != nil {
		b, err := json.Marshal(budgetJSON{MaxCostUSD: j.Budget.MaxCostUSD, MaxTokens: j.Budget.MaxTokens, MaxMinutes: j.Budget.MaxMinutes})
		if err != nil {
			return nil, fmt.Errorf("encode budget: %w", err)
		}
		budget = sql.NullString{String: string(b), Valid: true}
	}
	stored := make([]attemptJSON, len(j.Attempts))
	for i, a := range j.Attempts {
		u := a.Usage
		stored[i] = attemptJSON{
			Session: a.Session, Branch: a.Branch, Outcome: a.Outcome, CheckExitCode: a.CheckExitCode,
			Score: a.Score, CheckOutput: a.CheckOutput, Checked: a.Checked, Resends: a.Resends,
			Usage: usageJSON{
				InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, CacheReadTokens: u.CacheReadTokens,
				CacheWriteTokens: u.CacheWriteTokens, CostUSD: u.CostUSD, ModelCalls: u.ModelCalls,
			},
		}
	}
	attempts, err := encodeList(stored)
	if err != nil {
		return nil, fmt.Errorf("encode attempts: %w", err)
	}
	return []any{
		j.ID, j.Strategy, j.State, j.Session, j.Message, j.N, j.Check, budget, j.Winner, j.Patch, j.Branch,
		j.Error, attempts, toNanos(j.CreatedAt), nullNanos(j.EndedAt),
	}, nil
}

func scanJob(row rowScanner) (*Job, error) {
	var (
		j        Job
		budget   sql.NullString
		attempts string
		created  int64
		ended    sql.NullInt64
	)
	err := row.Scan(&j.ID, &j.Strategy, &j.State, &j.Session, &j.Message, &j.N, &j.Check, &budget, &j.Winner, &j.Patch, &j.Branch,
		&j.Error, &attempts, &created, &ended)
	if err != nil {
		return nil, err
	}
	j.CreatedAt, j.EndedAt = fromNanos(created), fromNullNanos(ended)
	if budget.Valid {
		var b budgetJSON
		if err := json.Unmarshal([]byte(budget.String), &b); err != nil {
			return nil, fmt.Errorf("decode budget of job %q: %w", j.ID, err)
		}
		j.Budget = &Budget{MaxCostUSD: b.MaxCostUSD, MaxTokens: b.MaxTokens, MaxMinutes: b.MaxMinutes}
	}
	var stored []attemptJSON
	if err := decodeList(attempts, &stored); err != nil {
		return nil, fmt.Errorf("decode attempts of job %q: %w", j.ID, err)
	}
	for _, a := range stored {
		u := a.Usage
		j.Attempts = append(j.Attempts, Attempt{
			Session: a.Session, Branch: a.Branch, Outcome: a.Outcome, CheckExitCode: a.CheckExitCode,
			Score: a.Score, CheckOutput: a.CheckOutput, Checked: a.Checked, Resends: a.Resends,
			Usage: Usage{
				InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, CacheReadTokens: u.CacheReadTokens,
				CacheWriteTokens: u.CacheWriteTokens, CostUSD: u.CostUSD, ModelCalls: u.ModelCalls,
			},
		})
	}
	return &j, nil
}

// CreateJob inserts a job. CreatedAt defaults to now (also in *j).
// ErrExists if the id is taken.
func (s *Store) CreateJob(ctx context.Context, j *Job) error {
	if j.ID == "" {
		return errors.New("store: create job: empty id")
	}
	if j.CreatedAt.IsZero() {
		j.CreatedAt = s.now()
	}
	args, err := jobArgs(j)
	if err != nil {
		return fmt.Errorf("store: create job %q: %w", j.ID, err)
	}
	res, err := s.w.ExecContext(ctx, s.q(`INSERT INTO jobs (`+jobColumns+`) VALUES (`+placeholders(len(args))+`)
		ON CONFLICT (id) DO NOTHING`), args...)
	err = diskFull(err)
	if err != nil {
		return fmt.Errorf("store: create job %q: %w", j.ID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("store: create job %q: %w", j.ID, err)
	}
	if n == 0 {
		return fmt.Errorf("store: create job %q: %w", j.ID, ErrExists)
	}
	return nil
}

// GetJob returns the job, or ErrNotFound.
func (s *Store) GetJob(ctx context.Context, id string) (*Job, error) {
	j, err := s.getJob(ctx, s.r, id, false)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return j, nil
}

func (s *Store) getJob(ctx context.Context, db queryer, id string, lock bool) (*Job, error) {
	query := `SELECT ` + jobColumns + ` FROM jobs WHERE id = ?`
	if lock {
		query += s.forUpdate()
	}
	j, err := scanJob(db.QueryRowContext(ctx, s.q(query), id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("job %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get job %q: %w", id, err)
	}
	return j, nil
}

// UpdateJob reads the job, applies fn to it and writes it back, in one
// transaction. fn must not call the Store (on SQLite the transaction holds
// the only write connection); it cannot change ID. An error from fn aborts
// the update and is returned (wrapped). ErrNotFound for an unknown job.
func (s *Store) UpdateJob(ctx context.Context, id string, fn func(*Job) error) (*Job, error) {
	var out *Job
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		j, err := s.getJob(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if err := fn(j); err != nil {
			return err
		}
		j.ID = id
		args, err := jobArgs(j)
		if err != nil {
			return err
		}
		var set []string
		for _, c := range strings.Split(jobColumns, ",")[1:] { // not id
			set = append(set, strings.TrimSpace(c)+" = ?")
		}
		args = append(args[1:], id)
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE jobs SET `+strings.Join(set, ", ")+` WHERE id = ?`), args...); err != nil {
			return fmt.Errorf("write job: %w", err)
		}
		out = j
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: update job %q: %w", id, err)
	}
	return out, nil
}

// ListJobs returns jobs newest first (by CreatedAt, ties by id, descending)
// and the token of the next page ("" on the last one). limit <= 0 returns
// everything in one page. ErrBadPageToken for a token it did not issue.
func (s *Store) ListJobs(ctx context.Context, limit int, pageToken string) ([]*Job, string, error) {
	query := `SELECT ` + jobColumns + ` FROM jobs`
	var args []any
	if pageToken != "" {
		at, id, err := decodePageToken(pageToken)
		if err != nil {
			return nil, "", fmt.Errorf("store: list jobs: %w", err)
		}
		query += " WHERE (created_at < ? OR (created_at = ? AND id < ?))"
		args = append(args, at, at, id)
	}
	query += " ORDER BY created_at DESC, id DESC"
	if limit > 0 {
		query += " LIMIT ?"
		args = append(args, limit+1)
	}
	rows, err := s.r.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, "", fmt.Errorf("store: list jobs: %w", err)
	}
	defer rows.Close()
	var out []*Job
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, "", fmt.Errorf("store: list jobs: %w", err)
		}
		out = append(out, j)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("store: list jobs: %w", err)
	}
	next := ""
	if limit > 0 && len(out) > limit {
		out = out[:limit]
		last := out[len(out)-1]
		next = encodePageToken(toNanos(last.CreatedAt), last.ID)
	}
	return out, next, nil
}

// ListUnfinishedJobs returns the jobs still pending or running, oldest
// first: the ones a runner may pick up (after claiming them).
func (s *Store) ListUnfinishedJobs(ctx context.Context) ([]*Job, error) {
	rows, err := s.r.QueryContext(ctx, s.q(`SELECT `+jobColumns+` FROM jobs WHERE state IN (?, ?) ORDER BY created_at, id`), JobPending, JobRunning)
	if err != nil {
		return nil, fmt.Errorf("store: list unfinished jobs: %w", err)
	}
	defer rows.Close()
	var out []*Job
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list unfinished jobs: %w", err)
		}
		out = append(out, j)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list unfinished jobs: %w", err)
	}
	return out, nil
}
