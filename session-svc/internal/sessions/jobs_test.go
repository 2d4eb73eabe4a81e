package sessions_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/sessions"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// A job a stopped process left pending or running is failed at the next
// start; jobs that had ended keep their outcome.
func TestJobsFailInterrupted(t *testing.T) {
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
	jobs := sessions.NewJobs(m)
	if err := jobs.FailInterrupted(ctx); err != nil {
		t.Fatalf("FailInterrupted: %v", err)
	}
	for _, tc := range []struct {
		id, state, error string
		ended            time.Time
	}{
		{"job-pending", sessions.JobFailed, sessions.ReasonJobInterrupted, at},
		{"job-running", sessions.JobFailed, sessions.ReasonJobInterrupted, at},
		{"job-delivered", sessions.JobDelivered, "", ended},
	} {
		// Wait returns at once: the job has ended.
		j, err := jobs.Wait(ctx, tc.id)
		if err != nil {
			t.Fatalf("Wait %s: %v", tc.id, err)
		}
		if j.State != tc.state || j.Error != tc.error || j.EndedAt == nil || !j.EndedAt.Equal(tc.ended) {
			t.Errorf("%s: %s %q ended %v, want %s %q ended %v", tc.id, j.State, j.Error, j.EndedAt, tc.state, tc.error, tc.ended)
		}
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
