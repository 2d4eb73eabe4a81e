package store_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// postgresURL is the machine's PostgreSQL; HANGAR_TEST_DATABASE_URL
// overrides it. Each test gets a schema of its own, dropped at cleanup.
func postgresURL() string {
	if u := os.Getenv("HANGAR_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// db opens (and reopens) one test database.
type db struct {
	clock *clock
	opts  store.Options
}

func (d db) open(t *testing.T) *store.Store {
	t.Helper()
	return mustOpen(t, d.opts)
}

// dialects runs body against SQLite and PostgreSQL.
func dialects(t *testing.T, body func(t *testing.T, d db)) {
	t.Helper()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		clk := newClock()
		path := filepath.Join(t.TempDir(), "sub", "hangar.db")
		body(t, db{clock: clk, opts: store.Options{SQLitePath: path, Now: clk.Now}})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		url := postgresURL()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Skipf("no PostgreSQL at %s: %v", url, err)
		}
		_ = conn.Close(ctx)
		var raw [6]byte
		_, _ = rand.Read(raw[:])
		schema := "store_test_" + hex.EncodeToString(raw[:])
		t.Cleanup(func() {
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Errorf("drop schema: %v", err)
				return
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
				t.Errorf("drop schema: %v", err)
			}
		})
		clk := newClock()
		body(t, db{clock: clk, opts: store.Options{DatabaseURL: url, Schema: schema, Now: clk.Now}})
	})
}

func mustOpen(t *testing.T, opts store.Options) *store.Store {
	t.Helper()
	s, err := store.Open(t.Context(), opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func intp(v int) *int { return &v }

func newSession(name string, at time.Time) *store.Session {
	return &store.Session{Name: name, Environment: "default", Harness: "claude", Branch: "hangar/session/" + name,
		State: store.StateIdle, CreatedAt: at, LastActiveAt: at}
}

func TestSessionCRUD(t *testing.T) {
	t.Parallel()
	dialects(t, func(t *testing.T, d db) {
		ctx := t.Context()
		s := d.open(t)
		now := d.clock.Now()
		full := &store.Session{
			Name: "full", Environment: "web", Repo: "https://example.com/r.git", Harness: "codex", Branch: "b",
			State: store.StateRunning, StateReason: "created", IdleMinutes: intp(0), ParentID: "p",
			ForkedFromCheckpoint: "cp1", ConversationID: "conv", SandboxID: "sb", FencingToken: 1<<63 + 5,
			BaseCommit: "abc", Budget: store.Budget{MaxCostUSD: 1.5, MaxTokens: 1000, MaxMinutes: 7},
			Approvals: "ask", HarnessLock: "lock", CacheTTL: "1h", Model: "m",
			Question: &store.Question{ID: "q1", Text: "which?", Turn: 2, AskedAt: now.Add(time.Second)},
		}
		if err := s.CreateSession(ctx, full); err != nil {
			t.Fatalf("CreateSession: %v", err)
		}
		if full.Version != 1 || !full.CreatedAt.Equal(now) || !full.LastActiveAt.Equal(now) || !full.StateChangedAt.Equal(now) {
			t.Fatalf("CreateSession defaults: %+v", full)
		}
		got, err := s.GetSession(ctx, "full")
		if err != nil {
			t.Fatalf("GetSession: %v", err)
		}
		if !reflect.DeepEqual(got, full) {
			t.Fatalf("GetSession =\n%+v\nwant\n%+v", got, full)
		}

		for _, tc := range []struct {
			name string
			err  error
			call func() error
		}{
			{"duplicate", store.ErrExists, func() error { return s.CreateSession(ctx, newSession("full", now)) }},
			{"get unknown", store.ErrNotFound, func() error { _, err := s.GetSession(ctx, "nope"); return err }},
			{"update unknown", store.ErrNotFound, func() error {
				_, err := s.UpdateSession(ctx, "nope", func(*store.Session) error { return nil })
				return err
			}},
			{"transition unknown", store.ErrNotFound, func() error { _, err := s.Transition(ctx, "nope", store.StateIdle, ""); return err }},
			{"turns of unknown", store.ErrNotFound, func() error { _, err := s.ListTurns(ctx, "nope"); return err }},
			{"create turn of unknown", store.ErrNotFound, func() error { return s.CreateTurn(ctx, &store.Turn{Session: "nope"}) }},
			{"events of unknown", store.ErrNotFound, func() error { _, err := s.ListEvents(ctx, "nope", 0, 0, 0); return err }},
			{"append to unknown", store.ErrNotFound, func() error { _, err := s.AppendEvents(ctx, "nope", []store.Event{{}}); return err }},
			{"checkpoints of unknown", store.ErrNotFound, func() error { _, err := s.ListCheckpoints(ctx, "nope"); return err }},
			{"checkpoint to unknown", store.ErrNotFound, func() error { return s.AddCheckpoint(ctx, &store.Checkpoint{Session: "nope", ID: "c"}) }},
			{"artifact to unknown", store.ErrNotFound, func() error { return s.AddArtifact(ctx, &store.Artifact{Session: "nope", Turn: 1, Path: "a"}) }},
			{"transitions of unknown", store.ErrNotFound, func() error { _, err := s.ListTransitions(ctx, "nope", 0); return err }},
			{"unknown turn", store.ErrNotFound, func() error { _, err := s.GetTurn(ctx, "full", 9); return err }},
		} {
			if err := tc.call(); !errors.Is(err, tc.err) {
				t.Errorf("%s: err = %v, want %v", tc.name, err, tc.err)
			}
		}

		boom := errors.New("boom")
		if _, err := s.UpdateSession(ctx, "full", func(s *store.Session) error { s.Model = "x"; return boom }); !errors.Is(err, boom) {
			t.Fatalf("UpdateSession with failing fn = %v, want boom", err)
		}
		updated, err := s.UpdateSession(ctx, "full", func(s *store.Session) error {
			s.Name = "renamed" // ignored
			s.Model = "other"
			s.IdleMinutes = nil
			s.Question = nil
			s.LastActiveAt = now.Add(time.Minute)
			return nil
		})
		if err != nil {
			t.Fatalf("UpdateSession: %v", err)
		}
		got, err = s.GetSession(ctx, "full")
		if err != nil {
			t.Fatal(err)
		}
		if got.Version != 2 || got.Model != "other" || got.IdleMinutes != nil || got.Question != nil || got.Name != "full" ||
			!reflect.DeepEqual(got, updated) {
			t.Fatalf("after UpdateSession: %+v (returned %+v)", got, updated)
		}
	})
}

func TestListSessions(t *testing.T) {
	t.Parallel()
	dialects(t, func(t *testing.T, d db) {
		ctx := t.Context()
		s := d.open(t)
		base := d.clock.Now()
		// name, minutes after base, state, parent
		rows := []struct {
			name   string
			min    int
			state  string
			parent string
		}{
			{"a", 1, store.StateIdle, ""},
			{"b", 5, store.StateRunning, ""},
			{"c", 5, store.StateSuspended, "a"},
			{"d", 5, store.StateIdle, "a"},
			{"e", 3, store.StateSuspended, ""},
			{"f", 9, store.StateArchived, ""},
			{"g", 0, store.StateIdle, "b"},
		}
		for _, r := range rows {
			sess := newSession(r.name, base.Add(time.Duration(r.min)*time.Minute))
			sess.State, sess.ParentID = r.state, r.parent
			if err := s.CreateSession(ctx, sess); err != nil {
				t.Fatal(err)
			}
		}
		names := func(ss []*store.Session) []string {
			var out []string
			for _, s := range ss {
				out = append(out, s.Name)
			}
			return out
		}
		for _, tc := range []struct {
			name string
			opts store.ListOptions
			want []string
		}{
			{"all", store.ListOptions{}, []string{"f", "b", "c", "d", "e", "a", "g"}},
			{"states", store.ListOptions{States: []string{store.StateIdle, store.StateSuspended}}, []string{"c", "d", "e", "a", "g"}},
			{"parent", store.ListOptions{ParentID: "a"}, []string{"c", "d"}},
			{"parent and state", store.ListOptions{ParentID: "a", States: []string{store.StateIdle}}, []string{"d"}},
			{"none", store.ListOptions{States: []string{store.StateFailed}}, nil},
		} {
			for _, limit := range []int{0, 1, 2, 3, 10} {
				opts := tc.opts
				opts.Limit = limit
				var all []string
				pages := 0
				for {
					page, next, err := s.ListSessions(ctx, opts)
					if err != nil {
						t.Fatalf("%s limit %d: %v", tc.name, limit, err)
					}
					if limit > 0 && len(page) > limit {
						t.Fatalf("%s limit %d: page of %d", tc.name, limit, len(page))
					}
					all = append(all, names(page)...)
					pages++
					if next == "" {
						break
					}
					if pages > 10 {
						t.Fatalf("%s limit %d: too many pages", tc.name, limit)
					}
					opts.PageToken = next
				}
				if !slices.Equal(all, tc.want) {
					t.Errorf("%s limit %d: %v, want %v", tc.name, limit, all, tc.want)
				}
			}
		}
		if _, _, err := s.ListSessions(ctx, store.ListOptions{PageToken: "!!"}); !errors.Is(err, store.ErrBadPageToken) {
			t.Errorf("bad token: %v", err)
		}
		byState, err := s.ListSessionsByState(ctx, store.StateSuspended)
		if err != nil || !slices.Equal(names(byState), []string{"c", "e"}) {
			t.Errorf("ListSessionsByState = %v, %v", names(byState), err)
		}
	})
}

func TestTransition(t *testing.T) {
	t.Parallel()
	dialects(t, func(t *testing.T, d db) {
		ctx := t.Context()
		s := d.open(t)
		if err := s.CreateSession(ctx, newSession("s", d.clock.Now())); err != nil {
			t.Fatal(err)
		}
		steps := []struct {
			to, reason string
			from       []string
			err        error
		}{
			{store.StateRunning, "turn 1", []string{store.StateIdle}, nil},
			{store.StateRunning, "again", []string{store.StateIdle}, store.ErrConflict},
			{store.StateIdle, "turn 1 done", []string{store.StateRunning, store.StateNeedsInput}, nil},
			{store.StateSuspending, "idle 30m", nil, nil},
			{store.StateSuspended, "checkpoint taken", []string{store.StateSuspending}, nil},
			{store.StateResuming, "send", []string{store.StateIdle}, store.ErrConflict},
		}
		var want []store.Transition
		prev := store.StateIdle
		for i, st := range steps {
			d.clock.Advance(time.Second)
			got, err := s.Transition(ctx, "s", st.to, st.reason, st.from...)
			if !errors.Is(err, st.err) {
				t.Fatalf("step %d: err = %v, want %v", i, err, st.err)
			}
			if err != nil {
				continue
			}
			if got.State != st.to || got.StateReason != st.reason || !got.StateChangedAt.Equal(d.clock.Now()) {
				t.Fatalf("step %d: session %+v", i, got)
			}
			want = append(want, store.Transition{Session: "s", From: prev, To: st.to, Reason: st.reason, At: d.clock.Now()})
			prev = st.to
		}
		got, err := s.ListTransitions(ctx, "s", 0)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("ListTransitions = %+v, %v\nwant %+v", got, err, want)
		}
		last2, err := s.ListTransitions(ctx, "s", 2)
		if err != nil || !reflect.DeepEqual(last2, want[len(want)-2:]) {
			t.Fatalf("ListTransitions(2) = %+v, %v", last2, err)
		}
		sess, err := s.GetSession(ctx, "s")
		if err != nil || sess.Version != int64(1+len(want)) {
			t.Fatalf("version after transitions = %+v, %v", sess, err)
		}
	})
}

func TestTransitionConcurrent(t *testing.T) {
	t.Parallel()
	dialects(t, func(t *testing.T, d db) {
		ctx := t.Context()
		s := d.open(t)
		const n = 16

		// Everyone tries idle→running: exactly one wins.
		if err := s.CreateSession(ctx, newSession("race", d.clock.Now())); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		results := make(chan error, n)
		for range n {
			wg.Go(func() {
				_, err := s.Transition(ctx, "race", store.StateRunning, "send", store.StateIdle)
				results <- err
			})
		}
		wg.Wait()
		close(results)
		wins := 0
		for err := range results {
			switch {
			case err == nil:
				wins++
			case !errors.Is(err, store.ErrConflict):
				t.Fatalf("Transition: %v", err)
			}
		}
		if wins != 1 {
			t.Fatalf("%d of %d won idle→running, want 1", wins, n)
		}

		// Half try idle→running, half running→idle: every success flips the
		// state, so the recorded transitions form one chain.
		if err := s.CreateSession(ctx, newSession("flip", d.clock.Now())); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		succeeded := 0
		for i := range 2 * n {
			wg.Go(func() {
				to, from := store.StateRunning, store.StateIdle
				if i%2 == 1 {
					to, from = store.StateIdle, store.StateRunning
				}
				_, err := s.Transition(ctx, "flip", to, fmt.Sprint(i), from)
				if err != nil && !errors.Is(err, store.ErrConflict) {
					t.Errorf("Transition: %v", err)
					return
				}
				if err == nil {
					mu.Lock()
					succeeded++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		trs, err := s.ListTransitions(ctx, "flip", 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(trs) != succeeded || succeeded == 0 {
			t.Fatalf("%d transitions recorded, %d calls succeeded", len(trs), succeeded)
		}
		state := store.StateIdle
		for i, tr := range trs {
			if tr.From != state || tr.To == tr.From {
				t.Fatalf("transition %d: %+v after state %s", i, tr, state)
			}
			state = tr.To
		}
		sess, err := s.GetSession(ctx, "flip")
		if err != nil || sess.State != state || sess.Version != int64(1+succeeded) {
			t.Fatalf("final session %+v, %v; want state %s version %d", sess, err, state, 1+succeeded)
		}
	})
}

func TestTurns(t *testing.T) {
	t.Parallel()
	dialects(t, func(t *testing.T, d db) {
		ctx := t.Context()
		s := d.open(t)
		if err := s.CreateSession(ctx, newSession("s", d.clock.Now())); err != nil {
			t.Fatal(err)
		}
		const n = 20
		var wg sync.WaitGroup
		numbers := make(chan int, n)
		for i := range n {
			wg.Go(func() {
				turn := &store.Turn{Session: "s", Message: fmt.Sprint("message ", i), Harness: "claude"}
				if err := s.CreateTurn(ctx, turn); err != nil {
					t.Errorf("CreateTurn: %v", err)
					return
				}
				numbers <- turn.Number
			})
		}
		wg.Wait()
		close(numbers)
		var got []int
		for num := range numbers {
			got = append(got, num)
		}
		slices.Sort(got)
		for i, num := range got {
			if num != i+1 {
				t.Fatalf("turn numbers %v, want 1..%d", got, n)
			}
		}
		turns, err := s.ListTurns(ctx, "s")
		if err != nil || len(turns) != n {
			t.Fatalf("ListTurns = %d, %v", len(turns), err)
		}
		for i, turn := range turns {
			if turn.Number != i+1 || turn.Outcome != "" || turn.EndedAt != nil || !turn.StartedAt.Equal(d.clock.Now()) {
				t.Fatalf("turn %d: %+v", i, turn)
			}
		}

		d.clock.Advance(time.Minute)
		ended := d.clock.Now()
		updated, err := s.UpdateTurn(ctx, "s", 3, func(turn *store.Turn) error {
			turn.Number = 99 // ignored
			turn.Outcome, turn.OutcomeReason, turn.Summary, turn.Result = store.OutcomeOverBudget, "max_cost_usd 1 exceeded", "sum", "res"
			turn.StructuredResultJSON = `{"ok":true}`
			turn.Usage = store.Usage{InputTokens: 1, OutputTokens: 2, CacheReadTokens: 3, CacheWriteTokens: 4, CostUSD: 0.25, ModelCalls: 5}
			turn.CheckpointID, turn.EndedAt, turn.RunID = "cp", &ended, "run"
			turn.Warnings = []string{"w1", "w2"}
			turn.Drift = []store.Drift{{Field: "model", Locked: "a", Actual: "b"}}
			turn.Budget = store.Budget{MaxCostUSD: 1, MaxTokens: 2, MaxMinutes: 3}
			turn.Command = "claude -p"
			return nil
		})
		if err != nil {
			t.Fatalf("UpdateTurn: %v", err)
		}
		got3, err := s.GetTurn(ctx, "s", 3)
		if err != nil || got3.Number != 3 || !reflect.DeepEqual(got3, updated) {
			t.Fatalf("GetTurn = %+v, %v\nwant %+v", got3, err, updated)
		}
		if _, err := s.UpdateTurn(ctx, "s", 99, func(*store.Turn) error { return nil }); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("UpdateTurn unknown = %v", err)
		}
	})
}

func TestEvents(t *testing.T) {
	t.Parallel()
	dialects(t, func(t *testing.T, d db) {
		ctx := t.Context()
		s := d.open(t)
		if err := s.CreateSession(ctx, newSession("s", d.clock.Now())); err != nil {
			t.Fatal(err)
		}
		if evs, err := s.ListEvents(ctx, "s", 0, 0, 0); err != nil || len(evs) != 0 {
			t.Fatalf("ListEvents on empty session = %v, %v", evs, err)
		}
		const writers, batch = 10, 3
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				evs := make([]store.Event, batch)
				for i := range evs {
					evs[i] = store.Event{Turn: w%2 + 1, Kind: store.EventMessage, Text: fmt.Sprintf("%d/%d", w, i)}
				}
				stored, err := s.AppendEvents(ctx, "s", evs)
				if err != nil {
					t.Errorf("AppendEvents: %v", err)
					return
				}
				for i := 1; i < len(stored); i++ {
					if stored[i].Seq != stored[0].Seq+int64(i) {
						t.Errorf("batch not contiguous: %+v", stored)
					}
				}
			})
		}
		wg.Wait()
		all, err := s.ListEvents(ctx, "s", 0, 0, 0)
		if err != nil || len(all) != writers*batch {
			t.Fatalf("ListEvents = %d, %v", len(all), err)
		}
		for i, e := range all {
			if e.Seq != int64(i+1) || e.Session != "s" || !e.Time.Equal(d.clock.Now()) {
				t.Fatalf("event %d: %+v", i, e)
			}
		}
		page, err := s.ListEvents(ctx, "s", 10, 0, 5)
		if err != nil || len(page) != 5 || page[0].Seq != 11 {
			t.Fatalf("ListEvents after 10 limit 5 = %+v, %v", page, err)
		}
		turn2, err := s.ListEvents(ctx, "s", 0, 2, 0)
		if err != nil || len(turn2) != writers/2*batch {
			t.Fatalf("ListEvents turn 2 = %d, %v", len(turn2), err)
		}

		at := d.clock.Now().Add(-time.Hour)
		rich := store.Event{Turn: 1, Time: at, Kind: store.EventCommand, Text: "go test", ExitCode: 2, Path: "x.go",
			Usage: &store.Usage{InputTokens: 10, CostUSD: 0.5, ModelCalls: 1}, DataJSON: `{"a":1}`}
		stored, err := s.AppendEvents(ctx, "s", []store.Event{rich})
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.ListEvents(ctx, "s", stored[0].Seq-1, 0, 0)
		if err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], stored[0]) {
			t.Fatalf("rich event = %+v, %v; want %+v", got, err, stored[0])
		}
	})
}

func TestCheckpointsAndArtifacts(t *testing.T) {
	t.Parallel()
	dialects(t, func(t *testing.T, d db) {
		ctx := t.Context()
		s := d.open(t)
		if err := s.CreateSession(ctx, newSession("s", d.clock.Now())); err != nil {
			t.Fatal(err)
		}
		for i, reason := range []string{"turn", "schedule", "suspend"} {
			d.clock.Advance(time.Minute)
			c := &store.Checkpoint{ID: fmt.Sprint("cp", i), Session: "s", Reason: reason, Turn: 1, SizeBytes: int64(100 * i)}
			if i == 2 {
				c.Warnings = []string{"untracked files skipped"}
			}
			if err := s.AddCheckpoint(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.AddCheckpoint(ctx, &store.Checkpoint{ID: "cp1", Session: "s"}); !errors.Is(err, store.ErrExists) {
			t.Fatalf("duplicate checkpoint = %v", err)
		}
		cps, err := s.ListCheckpoints(ctx, "s")
		if err != nil || len(cps) != 3 || cps[0].ID != "cp2" || cps[2].ID != "cp0" ||
			!slices.Equal(cps[0].Warnings, []string{"untracked files skipped"}) || !cps[0].CreatedAt.Equal(d.clock.Now()) {
			t.Fatalf("ListCheckpoints = %+v, %v", cps, err)
		}
		if err := s.DeleteCheckpoint(ctx, "s", "cp1"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteCheckpoint(ctx, "s", "cp1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("second DeleteCheckpoint = %v", err)
		}
		if n, err := s.DeleteCheckpoints(ctx, "s"); err != nil || n != 2 {
			t.Fatalf("DeleteCheckpoints = %d, %v", n, err)
		}
		if cps, err := s.ListCheckpoints(ctx, "s"); err != nil || len(cps) != 0 {
			t.Fatalf("ListCheckpoints after delete = %+v, %v", cps, err)
		}

		arts := []*store.Artifact{
			{Session: "s", Turn: 1, Path: "out/report.md", SizeBytes: 10, ContentType: "text/markdown", SHA256: "h1", BlobKey: "k1"},
			{Session: "s", Turn: 1, Path: "a.png", SizeBytes: 20, ContentType: "image/png", SHA256: "h2", BlobKey: "k2"},
			{Session: "s", Turn: 2, Path: "out/report.md", SizeBytes: 30, ContentType: "text/markdown", SHA256: "h3", BlobKey: "k3"},
		}
		for _, a := range arts {
			if err := s.AddArtifact(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		for _, tc := range []struct {
			path string
			turn int
			want *store.Artifact
		}{
			{"out/report.md", 0, arts[2]},
			{"out/report.md", 1, arts[0]},
			{"a.png", 0, arts[1]},
			{"a.png", 2, nil},
			{"missing", 0, nil},
		} {
			got, err := s.GetArtifact(ctx, "s", tc.path, tc.turn)
			if tc.want == nil {
				if !errors.Is(err, store.ErrNotFound) {
					t.Errorf("GetArtifact(%s, %d) = %+v, %v; want ErrNotFound", tc.path, tc.turn, got, err)
				}
				continue
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("GetArtifact(%s, %d) = %+v, %v; want %+v", tc.path, tc.turn, got, err, tc.want)
			}
		}
		list, err := s.ListArtifacts(ctx, "s", 0)
		if err != nil || !reflect.DeepEqual(list, []*store.Artifact{arts[1], arts[0], arts[2]}) {
			t.Fatalf("ListArtifacts = %+v, %v", list, err)
		}
		// Adding the same turn and path again replaces it.
		repl := *arts[0]
		repl.SizeBytes, repl.BlobKey = 11, "k1b"
		if err := s.AddArtifact(ctx, &repl); err != nil {
			t.Fatal(err)
		}
		list, err = s.ListArtifacts(ctx, "s", 1)
		if err != nil || !reflect.DeepEqual(list, []*store.Artifact{arts[1], &repl}) {
			t.Fatalf("ListArtifacts turn 1 = %+v, %v", list, err)
		}
	})
}

func TestCopyHistory(t *testing.T) {
	t.Parallel()
	dialects(t, func(t *testing.T, d db) {
		ctx := t.Context()
		s := d.open(t)
		if err := s.CreateSession(ctx, newSession("parent", d.clock.Now())); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			turn := &store.Turn{Session: "parent", Message: fmt.Sprint("m", i), Outcome: store.OutcomeCompleted,
				Usage: store.Usage{InputTokens: 100, CostUSD: 1}, Warnings: []string{"w"}, CheckpointID: fmt.Sprint("cp", i)}
			if err := s.CreateTurn(ctx, turn); err != nil {
				t.Fatal(err)
			}
			if _, err := s.AppendEvents(ctx, "parent", []store.Event{{Turn: turn.Number, Kind: store.EventMessage, Text: "hi"},
				{Turn: turn.Number, Kind: store.EventUsage, Usage: &store.Usage{InputTokens: 100}}}); err != nil {
				t.Fatal(err)
			}
			if err := s.AddArtifact(ctx, &store.Artifact{Session: "parent", Turn: turn.Number, Path: "r.md", BlobKey: fmt.Sprint("k", i)}); err != nil {
				t.Fatal(err)
			}
		}
		fork := newSession("fork", d.clock.Now())
		fork.ParentID, fork.ForkedFromCheckpoint = "parent", "cp1"
		if err := s.CreateSession(ctx, fork); err != nil {
			t.Fatal(err)
		}
		if err := s.CopyHistory(ctx, "parent", "fork"); err != nil {
			t.Fatalf("CopyHistory: %v", err)
		}

		parentTurns, _ := s.ListTurns(ctx, "parent")
		forkTurns, err := s.ListTurns(ctx, "fork")
		if err != nil || len(forkTurns) != 2 {
			t.Fatalf("fork turns = %+v, %v", forkTurns, err)
		}
		for i, ft := range forkTurns {
			want := *parentTurns[i]
			want.Session, want.Inherited, want.Usage = "fork", true, store.Usage{}
			if !reflect.DeepEqual(*ft, want) {
				t.Errorf("fork turn %d = %+v\nwant %+v", i, ft, want)
			}
			if parentTurns[i].Inherited || parentTurns[i].Usage.InputTokens != 100 {
				t.Errorf("parent turn changed: %+v", parentTurns[i])
			}
		}
		parentEvents, _ := s.ListEvents(ctx, "parent", 0, 0, 0)
		forkEvents, err := s.ListEvents(ctx, "fork", 0, 0, 0)
		if err != nil || len(forkEvents) != len(parentEvents) {
			t.Fatalf("fork events = %d, %v; want %d", len(forkEvents), err, len(parentEvents))
		}
		for i := range forkEvents {
			want := parentEvents[i]
			want.Session = "fork"
			if !reflect.DeepEqual(forkEvents[i], want) {
				t.Errorf("fork event %d = %+v, want %+v", i, forkEvents[i], want)
			}
		}
		art, err := s.GetArtifact(ctx, "fork", "r.md", 0)
		if err != nil || art.Turn != 2 || art.BlobKey != "k1" || art.Session != "fork" {
			t.Fatalf("fork artifact = %+v, %v", art, err)
		}

		// The fork's own history continues after the inherited one.
		next := &store.Turn{Session: "fork", Message: "own"}
		if err := s.CreateTurn(ctx, next); err != nil || next.Number != 3 {
			t.Fatalf("fork's first own turn = %d, %v; want 3", next.Number, err)
		}
		evs, err := s.AppendEvents(ctx, "fork", []store.Event{{Turn: 3, Kind: store.EventMessage}})
		if err != nil || evs[0].Seq != int64(len(parentEvents)+1) {
			t.Fatalf("fork's first own event = %+v, %v", evs, err)
		}
		if err := s.CopyHistory(ctx, "parent", "fork"); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("second CopyHistory = %v, want ErrConflict", err)
		}
		if err := s.CopyHistory(ctx, "nope", "fork"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("CopyHistory from unknown = %v, want ErrNotFound", err)
		}
	})
}

func TestReopen(t *testing.T) {
	t.Parallel()
	dialects(t, func(t *testing.T, d db) {
		ctx := t.Context()
		s := d.open(t)
		if err := s.CreateSession(ctx, newSession("kept", d.clock.Now())); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateTurn(ctx, &store.Turn{Session: "kept"}); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		// Reopening runs the migrations again: nothing to do, data kept.
		for range 2 {
			s = d.open(t)
			if _, err := s.GetSession(ctx, "kept"); err != nil {
				t.Fatalf("after reopen: %v", err)
			}
			turn := &store.Turn{Session: "kept"}
			if err := s.CreateTurn(ctx, turn); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
		s = d.open(t)
		turns, err := s.ListTurns(ctx, "kept")
		if err != nil || len(turns) != 3 {
			t.Fatalf("turns after reopens = %d, %v", len(turns), err)
		}
	})
}

// Concurrent Opens of one fresh database agree on the schema.
func TestConcurrentOpen(t *testing.T) {
	t.Parallel()
	dialects(t, func(t *testing.T, d db) {
		var wg sync.WaitGroup
		stores := make([]*store.Store, 3)
		errs := make([]error, len(stores))
		for i := range stores {
			wg.Go(func() { stores[i], errs[i] = store.Open(t.Context(), d.opts) })
		}
		wg.Wait()
		for i, s := range stores {
			if errs[i] != nil {
				t.Fatalf("open %d: %v", i, errs[i])
			}
			t.Cleanup(func() { _ = s.Close() })
			if err := s.CreateSession(t.Context(), newSession(fmt.Sprint("s", i), d.clock.Now())); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestOpenRejectsBadURL(t *testing.T) {
	t.Parallel()
	if _, err := store.Open(t.Context(), store.Options{DatabaseURL: "mysql://x"}); err == nil {
		t.Fatal("Open accepted a mysql URL")
	}
	if _, err := store.Open(t.Context(), store.Options{}); err == nil {
		t.Fatal("Open accepted no SQLite path")
	}
}

func floatp(v float64) *float64 { return &v }

func TestJobs(t *testing.T) {
	t.Parallel()
	dialects(t, func(t *testing.T, d db) {
		ctx := t.Context()
		s := d.open(t)
		now := d.clock.Now()
		full := &store.Job{
			ID: "job-full", Strategy: "best_of_n", State: store.JobPending, Session: "parent", Message: "do it",
			N: 2, Check: "make test", Budget: &store.Budget{MaxCostUSD: 0.5, MaxTokens: 900, MaxMinutes: 3},
		}
		if err := s.CreateJob(ctx, full); err != nil {
			t.Fatalf("CreateJob: %v", err)
		}
		if !full.CreatedAt.Equal(now) {
			t.Fatalf("CreateJob CreatedAt = %v, want %v", full.CreatedAt, now)
		}
		if err := s.CreateJob(ctx, &store.Job{ID: "job-full"}); !errors.Is(err, store.ErrExists) {
			t.Fatalf("duplicate CreateJob: %v", err)
		}
		if err := s.CreateJob(ctx, &store.Job{}); err == nil {
			t.Fatal("CreateJob accepted an empty id")
		}
		got, err := s.GetJob(ctx, "job-full")
		if err != nil {
			t.Fatalf("GetJob: %v", err)
		}
		if !reflect.DeepEqual(got, full) {
			t.Fatalf("GetJob = %+v\nwant %+v", got, full)
		}
		if _, err := s.GetJob(ctx, "job-none"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("GetJob of a missing job: %v", err)
		}

		d.clock.Advance(time.Minute)
		end := d.clock.Now()
		attempts := []store.Attempt{
			{Session: "parent-full-1", Branch: "b1", Outcome: store.OutcomeCompleted, CheckExitCode: 0, Score: floatp(7.5),
				CheckOutput: "score 7.5", Usage: store.Usage{InputTokens: 1, OutputTokens: 2, CacheReadTokens: 3, CacheWriteTokens: 4, CostUSD: 0.25, ModelCalls: 5}},
			{Session: "parent-full-2", Outcome: store.OutcomeFailed, CheckExitCode: -1},
		}
		updated, err := s.UpdateJob(ctx, "job-full", func(j *store.Job) error {
			j.ID = "ignored"
			j.State, j.Attempts, j.Winner, j.Patch, j.Branch = store.JobDelivered, attempts, "parent-full-1", "diff --git", "b1"
			j.Budget, j.EndedAt = nil, &end
			return nil
		})
		if err != nil {
			t.Fatalf("UpdateJob: %v", err)
		}
		got, err = s.GetJob(ctx, "job-full")
		if err != nil {
			t.Fatalf("GetJob after update: %v", err)
		}
		if got.ID != "job-full" || !reflect.DeepEqual(got, updated) {
			t.Fatalf("after UpdateJob: %+v\nreturned %+v", got, updated)
		}
		if got.Budget != nil || got.EndedAt == nil || !got.EndedAt.Equal(end) || !reflect.DeepEqual(got.Attempts, attempts) {
			t.Fatalf("after UpdateJob: budget %v, ended %v, attempts %+v", got.Budget, got.EndedAt, got.Attempts)
		}

		boom := errors.New("boom")
		if _, err := s.UpdateJob(ctx, "job-full", func(j *store.Job) error { j.State = store.JobFailed; return boom }); !errors.Is(err, boom) {
			t.Fatalf("UpdateJob with a failing fn: %v", err)
		}
		if got, err := s.GetJob(ctx, "job-full"); err != nil || got.State != store.JobDelivered {
			t.Fatalf("a failed UpdateJob wrote: %v, %v", got, err)
		}
		if _, err := s.UpdateJob(ctx, "job-none", func(*store.Job) error { return nil }); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("UpdateJob of a missing job: %v", err)
		}

		// Jobs outlive the process: a reopened store has them.
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = d.open(t)
		if got, err := s.GetJob(ctx, "job-full"); err != nil || !reflect.DeepEqual(got, updated) {
			t.Fatalf("after reopen: %+v, %v", got, err)
		}
	})
}

// Concurrent UpdateJobs of one job each see the others' writes.
func TestUpdateJobConcurrent(t *testing.T) {
	t.Parallel()
	dialects(t, func(t *testing.T, d db) {
		ctx := t.Context()
		s := d.open(t)
		if err := s.CreateJob(ctx, &store.Job{ID: "job-c", State: store.JobRunning}); err != nil {
			t.Fatal(err)
		}
		const writers = 8
		var wg sync.WaitGroup
		errs := make([]error, writers)
		for i := range writers {
			wg.Go(func() {
				_, errs[i] = s.UpdateJob(ctx, "job-c", func(j *store.Job) error {
					j.Attempts = append(j.Attempts, store.Attempt{Session: fmt.Sprint("a", i)})
					return nil
				})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("writer %d: %v", i, err)
			}
		}
		got, err := s.GetJob(ctx, "job-c")
		if err != nil || len(got.Attempts) != writers {
			t.Fatalf("attempts after %d concurrent updates: %d, %v", writers, len(got.Attempts), err)
		}
	})
}

func TestListJobs(t *testing.T) {
	t.Parallel()
	dialects(t, func(t *testing.T, d db) {
		ctx := t.Context()
		s := d.open(t)
		if jobs, next, err := s.ListJobs(ctx, 2, ""); err != nil || len(jobs) != 0 || next != "" {
			t.Fatalf("ListJobs of none = %v, %q, %v", jobs, next, err)
		}
		base := d.clock.Now()
		// id, minutes after base: job-b, job-c and job-d tie on created_at.
		for _, r := range []struct {
			id  string
			min int
		}{{"job-a", 1}, {"job-b", 5}, {"job-c", 5}, {"job-d", 5}, {"job-e", 3}, {"job-f", 9}} {
			j := &store.Job{ID: r.id, State: store.JobPending, CreatedAt: base.Add(time.Duration(r.min) * time.Minute)}
			if err := s.CreateJob(ctx, j); err != nil {
				t.Fatal(err)
			}
		}
		want := []string{"job-f", "job-d", "job-c", "job-b", "job-e", "job-a"}
		for _, limit := range []int{0, 1, 2, 4, 6, 10} {
			var all []string
			token := ""
			for pages := 1; ; pages++ {
				page, next, err := s.ListJobs(ctx, limit, token)
				if err != nil {
					t.Fatalf("limit %d: %v", limit, err)
				}
				if limit > 0 && len(page) > limit {
					t.Fatalf("limit %d: page of %d", limit, len(page))
				}
				for _, j := range page {
					all = append(all, j.ID)
				}
				if next == "" {
					break
				}
				if pages > 10 {
					t.Fatalf("limit %d: too many pages", limit)
				}
				token = next
			}
			if !slices.Equal(all, want) {
				t.Errorf("limit %d: %v, want %v", limit, all, want)
			}
		}
		if _, _, err := s.ListJobs(ctx, 1, "!!"); !errors.Is(err, store.ErrBadPageToken) {
			t.Errorf("bad token: %v", err)
		}
	})
}

func TestListUnfinishedJobs(t *testing.T) {
	t.Parallel()
	dialects(t, func(t *testing.T, d db) {
		ctx := t.Context()
		s := d.open(t)
		ended := d.clock.Now()
		score := 3.0
		for _, j := range []*store.Job{
			{ID: "job-r", State: store.JobRunning, CreatedAt: ended.Add(-time.Minute), Attempts: []store.Attempt{
				{Session: "a-1", Outcome: "completed", Checked: true, Score: &score, Resends: 2},
				{Session: "a-2"},
			}},
			{ID: "job-p", State: store.JobPending, CreatedAt: ended},
			{ID: "job-d", State: store.JobDelivered, Winner: "w", EndedAt: &ended},
			{ID: "job-f", State: store.JobFailed, Error: "no attempt passed the check", EndedAt: &ended},
		} {
			if err := s.CreateJob(ctx, j); err != nil {
				t.Fatal(err)
			}
		}
		jobs, err := s.ListUnfinishedJobs(ctx)
		if err != nil || len(jobs) != 2 || jobs[0].ID != "job-r" || jobs[1].ID != "job-p" {
			t.Fatalf("ListUnfinishedJobs = %v, %v", jobs, err)
		}
		a := jobs[0].Attempts
		if len(a) != 2 || !a[0].Checked || a[0].Resends != 2 || a[1].Checked || a[1].Session != "a-2" {
			t.Errorf("attempts read back as %+v", a)
		}
	})
}
