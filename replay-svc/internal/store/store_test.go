package store_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	"github.com/hangar-dev/hangar/replay-svc/internal/store"
)

func postgresURL() string {
	if u := os.Getenv("HANGAR_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// dialects opens one store per dialect: SQLite in a temp dir and
// PostgreSQL in a schema of its own, dropped at cleanup.
func dialects(t *testing.T) map[string]func(t *testing.T) store.Options {
	return map[string]func(t *testing.T) store.Options{
		"sqlite": func(t *testing.T) store.Options {
			return store.Options{SQLitePath: filepath.Join(t.TempDir(), "replay.db")}
		},
		"postgres": func(t *testing.T) store.Options {
			b := make([]byte, 6)
			_, _ = rand.Read(b)
			schema := "replay_test_" + hex.EncodeToString(b)
			t.Cleanup(func() {
				ctx := context.Background()
				conn, err := pgx.Connect(ctx, postgresURL())
				if err != nil {
					return
				}
				_, _ = conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
				_ = conn.Close(ctx)
			})
			return store.Options{DatabaseURL: postgresURL(), Schema: schema}
		},
	}
}

func open(t *testing.T, opts store.Options) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func fork(id, run string, at time.Time, k int) *replayv1.Fork {
	f := &replayv1.Fork{Fork: id, Run: run, Status: replayv1.ForkStatus_FORK_STATUS_REPLAYING, AtSeq: 3, Continuations: int32(k),
		Budget: &replayv1.Budget{MaxCostUsd: 5}, CreatedAt: timestamppb.New(at), Harness: "claude", PrefixSession: id + "-prefix"}
	for i := 1; i <= k; i++ {
		tid := id + "." + string(rune('0'+i))
		f.TrialIds = append(f.TrialIds, tid)
		f.Trials = append(f.Trials, &replayv1.Trial{Id: tid, Fork: id, Source: "experiment", ForkOf: run,
			Status: replayv1.TrialStatus_TRIAL_STATUS_REPLAYING, CreatedAt: timestamppb.New(at)})
	}
	return f
}

// TestStore runs one suite on SQLite and PostgreSQL.
func TestStore(t *testing.T) {
	for name, opts := range dialects(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			o := opts(t)
			s := open(t, o)
			t0 := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
			a := fork("job-aaaaaaaa", "ses-demo.run-1", t0, 2)
			b := fork("job-bbbbbbbb", "ses-demo.run-1", t0.Add(time.Minute), 1)
			c := fork("job-cccccccc", "ses-other.run-9", t0.Add(2*time.Minute), 0)
			for _, f := range []*replayv1.Fork{a, b, c} {
				if err := s.CreateFork(ctx, f); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.CreateFork(ctx, a); !errors.Is(err, store.ErrExists) {
				t.Errorf("second create: %v, want ErrExists", err)
			}
			got, err := s.GetFork(ctx, a.Fork)
			if err != nil || !proto.Equal(got, a) {
				t.Fatalf("get: %v\n got %v\nwant %v", err, got, a)
			}
			if _, err := s.GetFork(ctx, "job-nope"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("get unknown: %v", err)
			}

			// Updates of the fork and of a trial.
			a.Status = replayv1.ForkStatus_FORK_STATUS_FORKED
			a.ReplayedSteps = 3
			if err := s.UpdateFork(ctx, a); err != nil {
				t.Fatal(err)
			}
			tr := a.Trials[1]
			tr.Status, tr.Outcome, tr.Session, tr.CostUsd = replayv1.TrialStatus_TRIAL_STATUS_ENDED, replayv1.TrialOutcome_TRIAL_OUTCOME_COMPLETED, "job-aaaaaaaa-2", 0.25
			tr.Aa = proto.Bool(true)
			if err := s.UpdateTrial(ctx, tr); err != nil {
				t.Fatal(err)
			}
			if got, _ := s.GetFork(ctx, a.Fork); !proto.Equal(got, a) {
				t.Errorf("after updates:\n got %v\nwant %v", got, a)
			}
			if got, err := s.GetTrial(ctx, tr.Id); err != nil || !proto.Equal(got, tr) {
				t.Errorf("get trial: %v %v", got, err)
			}
			if err := s.UpdateTrial(ctx, &replayv1.Trial{Id: "job-nope.1"}); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("update unknown trial: %v", err)
			}

			// Lists: by run, by status, paged, newest first.
			list := func(run string, st []replayv1.ForkStatus, off, lim int) []string {
				fs, err := s.ListForks(ctx, run, st, off, lim)
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, f := range fs {
					ids = append(ids, f.Fork)
				}
				return ids
			}
			if got := list("", nil, 0, 0); len(got) != 3 || got[0] != c.Fork || got[2] != a.Fork {
				t.Errorf("all forks: %v", got)
			}
			if got := list("ses-demo.run-1", nil, 0, 0); len(got) != 2 || got[0] != b.Fork {
				t.Errorf("forks of run: %v", got)
			}
			if got := list("", []replayv1.ForkStatus{replayv1.ForkStatus_FORK_STATUS_REPLAYING}, 0, 0); len(got) != 2 {
				t.Errorf("replaying forks: %v", got)
			}
			if got := list("", nil, 1, 1); len(got) != 1 || got[0] != b.Fork {
				t.Errorf("page 2 of 1: %v", got)
			}
			if ts, _ := s.ListTrials(ctx, "", "ses-demo.run-1"); len(ts) != 3 {
				t.Errorf("trials of run: %d", len(ts))
			}

			// Leases: one holder at a time; renewed by its holder; taken
			// by another once expired; released by its holder only.
			lease := func(holder string, at time.Time) bool {
				ok, err := s.TakeLease(ctx, "fork:job-aaaaaaaa", holder, at, 30*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				return ok
			}
			if !lease("r1", t0) || lease("r2", t0.Add(time.Second)) || !lease("r1", t0.Add(20*time.Second)) {
				t.Errorf("a lease held and renewed by r1 must refuse r2")
			}
			if lease("r2", t0.Add(49*time.Second)) || !lease("r2", t0.Add(51*time.Second)) || lease("r1", t0.Add(52*time.Second)) {
				t.Errorf("an expired lease goes to the first who asks, and only to them")
			}
			if err := s.ReleaseLease(ctx, "fork:job-aaaaaaaa", "r1"); err != nil || lease("r1", t0.Add(53*time.Second)) {
				t.Errorf("a release by another than the holder must do nothing: %v", err)
			}
			if err := s.ReleaseLease(ctx, "fork:job-aaaaaaaa", "r2"); err != nil || !lease("r1", t0.Add(54*time.Second)) {
				t.Errorf("a released lease is free at once: %v", err)
			}

			// Reopened: everything is still there.
			s2 := open(t, o)
			if got, _ := s2.GetFork(ctx, a.Fork); !proto.Equal(got, a) {
				t.Errorf("after reopen: %v", got)
			}
		})
	}
}

// TestOpenConcurrently: replicas starting at once on one new schema all
// open it (CREATE TABLE IF NOT EXISTS of one table in two sessions at once
// fails on pg_type's unique index without the store's advisory lock).
func TestOpenConcurrently(t *testing.T) {
	o := dialects(t)["postgres"](t)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			s, err := store.Open(context.Background(), o)
			if err == nil {
				_ = s.Close()
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("open: %v", err)
		}
	}
}
