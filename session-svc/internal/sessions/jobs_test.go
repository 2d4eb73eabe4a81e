package sessions_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/sessions"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// Jobs read back as recorded: a job a stopped process left pending or
// running stays unfinished (it is picked up again, not failed), and pages
// and errors are as documented.
func TestJobsRecords(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	now := func() time.Time { return at }
	records, err := store.Open(ctx, store.Options{SQLitePath: filepath.Join(t.TempDir(), "sessions.db"), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = records.Close() })
	ended := at.Add(-time.Hour)
	for _, j := range []*store.Job{
		{ID: "job-pending", State: store.JobPending, CreatedAt: at.Add(-3 * time.Minute)},
		{ID: "job-running", State: store.JobRunning, CreatedAt: at.Add(-2 * time.Minute)},
		{ID: "job-delivered", State: store.JobDelivered, Winner: "w", EndedAt: &ended, CreatedAt: at.Add(-time.Minute)},
	} {
		if err := records.CreateJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	m := sessions.New(sessions.Deps{Store: records, Now: now})
	t.Cleanup(func() { _ = m.Close(t.Context()) })
	jobs := sessions.NewJobs(m, nil)
	for _, tc := range []struct{ id, state string }{
		{"job-pending", sessions.JobPending},
		{"job-running", sessions.JobRunning},
		{"job-delivered", sessions.JobDelivered},
	} {
		j, err := jobs.Get(ctx, tc.id)
		if err != nil {
			t.Fatalf("Get %s: %v", tc.id, err)
		}
		if j.State != tc.state || (j.EndedAt != nil) != (tc.state == sessions.JobDelivered) {
			t.Errorf("%s: %s ended %v, want %s", tc.id, j.State, j.EndedAt, tc.state)
		}
	}
	if j, err := jobs.Wait(ctx, "job-delivered"); err != nil || !j.EndedAt.Equal(ended) {
		t.Errorf("Wait of an ended job = %v, %v", j, err)
	}
	page, next, err := jobs.List(ctx, 2, "")
	if err != nil || len(page) != 2 || page[0].ID != "job-delivered" || next == "" {
		t.Fatalf("List first page = %v, %q, %v", page, next, err)
	}
	if page, next, err = jobs.List(ctx, 2, next); err != nil || len(page) != 1 || page[0].ID != "job-pending" || next != "" {
		t.Fatalf("List second page = %v, %q, %v", page, next, err)
	}
	if _, err := jobs.Get(ctx, "job-none"); !fault.Is(err, fault.KindNotFound) {
		t.Errorf("Get of a missing job: %v", err)
	}
	if _, _, err := jobs.List(ctx, 2, "!!"); !fault.Is(err, fault.KindInvalidArgument) {
		t.Errorf("List with a bad token: %v", err)
	}
}

// One runner holds a job's claim at a time; a Redis restarted empty lets
// the first runner to renew take it, and the other then learns it lost it.
func TestJobClaims(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Skipf("no Redis: %v", err)
	}
	prefix := fmt.Sprintf("test:jobclaims:%d:", time.Now().UnixNano())
	t.Cleanup(func() { rdb.Del(context.Background(), prefix+"job-1") })
	a, b := sessions.NewJobClaims(rdb, prefix), sessions.NewJobClaims(rdb, prefix)
	claim := func(c *sessions.JobClaims) bool {
		t.Helper()
		ok, err := c.Claim(ctx, "job-1", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !claim(a) || claim(b) || !claim(a) {
		t.Fatal("a first claim, then a renewal, must win; a second runner must lose")
	}
	if err := b.Drop(ctx, "job-1"); err != nil || claim(b) {
		t.Fatalf("a runner that does not hold the claim dropped it: %v", err)
	}
	if err := a.Drop(ctx, "job-1"); err != nil || !claim(b) {
		t.Fatalf("the claim was not free once dropped: %v", err)
	}
	rdb.Del(ctx, prefix+"job-1") // Redis restarted empty
	if !claim(a) || claim(b) {
		t.Fatal("after the claim vanished the first to renew must hold it and the other lose it")
	}
}
