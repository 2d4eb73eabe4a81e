package sessions

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

func cpID(session string, n int) string {
	return session + "~20261201T0000" + string(rune('0'+n/10)) + string(rune('0'+n%10)) + ".000000000Z-0000000" + string(rune('0'+n%10))
}

func TestPlanRestore(t *testing.T) {
	t.Parallel()
	s := &store.Session{Name: "s1"}
	fork := &store.Session{Name: "f1", ForkedFromCheckpoint: cpID("s1", 2)}
	intact := func(session string, n int) *checkpointv1.Checkpoint {
		return &checkpointv1.Checkpoint{Id: cpID(session, n), Session: session, Turn: int32(n)}
	}
	damaged := func(session string, n int) *checkpointv1.Checkpoint {
		return &checkpointv1.Checkpoint{Id: cpID(session, n), Session: session, Damaged: "checkpoint is damaged"}
	}
	tests := []struct {
		name    string
		s       *store.Session
		named   string
		listed  []*checkpointv1.Checkpoint
		want    string // id restored; "" with no error: boot at the base
		wantErr []string
	}{
		{name: "new session", s: s},
		{name: "named is newest", s: s, named: cpID("s1", 3), listed: []*checkpointv1.Checkpoint{intact("s1", 3), intact("s1", 2)}, want: cpID("s1", 3)},
		{name: "newer than named (recording lost)", s: s, named: cpID("s1", 2), listed: []*checkpointv1.Checkpoint{intact("s1", 3), intact("s1", 2)}, want: cpID("s1", 3)},
		{name: "newer damaged passed over for the named", s: s, named: cpID("s1", 2), listed: []*checkpointv1.Checkpoint{damaged("s1", 3), intact("s1", 2)}, want: cpID("s1", 2)},
		{
			name: "named deleted: not the older one", s: s, named: cpID("s1", 3), listed: []*checkpointv1.Checkpoint{intact("s1", 2), intact("s1", 1)},
			wantErr: []string{cpID("s1", 3) + " is missing", "it can be restored from: " + cpID("s1", 2) + " (turn 2), " + cpID("s1", 1) + " (turn 1)"},
		},
		{
			name: "named damaged", s: s, named: cpID("s1", 3), listed: []*checkpointv1.Checkpoint{damaged("s1", 3), intact("s1", 2)},
			wantErr: []string{cpID("s1", 3) + " is damaged", "restored from: " + cpID("s1", 2)},
		},
		{
			name: "all deleted: not a bare tree", s: s, named: cpID("s1", 3),
			wantErr: []string{cpID("s1", 3) + " is missing", `session "s1" has no other checkpoint that can be restored`},
		},
		{name: "unrecorded session: newest listed", s: s, listed: []*checkpointv1.Checkpoint{intact("s1", 2), intact("s1", 1)}, want: cpID("s1", 2)},
		{
			name: "unrecorded session, newest damaged", s: s, listed: []*checkpointv1.Checkpoint{damaged("s1", 2), intact("s1", 1)},
			wantErr: []string{cpID("s1", 2) + " is damaged", "restored from: " + cpID("s1", 1)},
		},
		{name: "fork with its checkpoint", s: fork, listed: []*checkpointv1.Checkpoint{intact("f1", 4)}, want: cpID("f1", 4)},
		{name: "fork without its checkpoint", s: fork, wantErr: []string{"is a fork of checkpoint " + cpID("s1", 2), "its own checkpoint is missing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := planRestore(tt.s, tt.named, tt.listed)
			if len(tt.wantErr) > 0 {
				var fe *fault.Error
				if got != nil || !asFault(err, &fe) || fe.Kind != fault.KindNotFound || fe.Reason != ReasonCheckpointMissing {
					t.Fatalf("got %v, %v; want %s", got.GetId(), err, ReasonCheckpointMissing)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(fe.Message, w) {
						t.Errorf("message %q lacks %q", fe.Message, w)
					}
				}
				return
			}
			if err != nil || got.GetId() != tt.want {
				t.Fatalf("got %q, %v; want %q", got.GetId(), err, tt.want)
			}
		})
	}
}

func asFault(err error, fe **fault.Error) bool {
	e, ok := err.(*fault.Error)
	*fe = e
	return ok
}

func TestNewestOf(t *testing.T) {
	t.Parallel()
	ids := []string{"", cpID("s1", 2), cpID("s10", 9), cpID("s1", 11), cpID("s1", 3), "garbage"}
	if got := newestOf("s1", ids); got != cpID("s1", 11) {
		t.Fatalf("newestOf = %q", got)
	}
	if got := newestOf("s2", ids); got != "" {
		t.Fatalf("newestOf another session = %q", got)
	}
}

// TestNamedCheckpoint: the record names the newest checkpoint noted on it
// or, for a session recorded before checkpoints were, its own turns' (not
// the inherited turns of its parent).
func TestNamedCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := store.Open(ctx, store.Options{SQLitePath: filepath.Join(t.TempDir(), "sessions.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	m := New(Deps{Store: st})
	t.Cleanup(func() { _ = m.Close(ctx) })
	for _, name := range []string{"s1", "f1"} {
		if err := st.CreateSession(ctx, &store.Session{Name: name, Environment: "local", Harness: "claude", Branch: "b", State: store.StateSuspended}); err != nil {
			t.Fatal(err)
		}
	}
	s1, _ := st.GetSession(ctx, "s1")
	if got, err := m.namedCheckpoint(ctx, s1); err != nil || got != "" {
		t.Fatalf("new session names %q, %v", got, err)
	}
	if err := st.CreateTurn(ctx, &store.Turn{Session: "s1", Message: "a", CheckpointID: cpID("s1", 2)}); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.namedCheckpoint(ctx, s1); got != cpID("s1", 2) {
		t.Fatalf("from turns: %q", got)
	}
	at := time.Date(2026, 12, 1, 0, 0, 5, 0, time.UTC)
	m.noteCheckpoint(ctx, "s1", &checkpointv1.Checkpoint{Id: cpID("s1", 5), CreatedAt: timestamppb.New(at), Reason: checkpointv1.CheckpointReason_CHECKPOINT_REASON_SUSPEND})
	m.noteCheckpoint(ctx, "s1", &checkpointv1.Checkpoint{Id: cpID("s1", 5), CreatedAt: timestamppb.New(at)}) // unchanged capture: no-op
	if got, _ := m.namedCheckpoint(ctx, s1); got != cpID("s1", 5) {
		t.Fatalf("noted: %q", got)
	}
	recs, _ := st.ListCheckpoints(ctx, "s1")
	if len(recs) != 1 || recs[0].Reason != "suspend" {
		t.Fatalf("records: %+v", recs)
	}
	if err := st.CopyHistory(ctx, "s1", "f1"); err != nil {
		t.Fatal(err)
	}
	f1, _ := st.GetSession(ctx, "f1")
	if got, _ := m.namedCheckpoint(ctx, f1); got != "" {
		t.Fatalf("a fork names its parent's checkpoint %q", got)
	}
}

// listingCheckpoints is a checkpoint service that lists fixed checkpoints.
type listingCheckpoints struct {
	checkpointv1.CheckpointServiceClient
	list []*checkpointv1.Checkpoint
}

func (l *listingCheckpoints) ListCheckpoints(context.Context, *checkpointv1.ListCheckpointsRequest, ...grpc.CallOption) (*checkpointv1.ListCheckpointsResponse, error) {
	return &checkpointv1.ListCheckpointsResponse{Checkpoints: l.list}, nil
}

// TestMissingNewestCheckpoint: the newest checkpoint noted on the record
// is gone from the checkpoint service: a boot refuses to restore the older
// one, and get lists the missing one as such.
func TestMissingNewestCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := store.Open(ctx, store.Options{SQLitePath: filepath.Join(t.TempDir(), "sessions.db")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	older := &checkpointv1.Checkpoint{Id: cpID("s1", 2), Session: "s1", Turn: 1, CreatedAt: timestamppb.New(time.Date(2026, 12, 1, 0, 0, 2, 0, time.UTC))}
	m := New(Deps{Store: st, Checkpoints: &listingCheckpoints{list: []*checkpointv1.Checkpoint{older}}})
	t.Cleanup(func() { _ = m.Close(ctx) })
	if err := st.CreateSession(ctx, &store.Session{Name: "s1", Environment: "local", Harness: "claude", Branch: "b", State: store.StateSuspended}); err != nil {
		t.Fatal(err)
	}
	s1, _ := st.GetSession(ctx, "s1")
	m.noteCheckpoint(ctx, "s1", older)
	if cp, err := m.restorePoint(ctx, s1); err != nil || cp.GetId() != older.GetId() {
		t.Fatalf("restore point with its newest there: %v %v", cp.GetId(), err)
	}
	m.noteCheckpoint(ctx, "s1", &checkpointv1.Checkpoint{Id: cpID("s1", 3), Turn: 2, CreatedAt: timestamppb.New(time.Date(2026, 12, 1, 0, 0, 3, 0, time.UTC)),
		Reason: checkpointv1.CheckpointReason_CHECKPOINT_REASON_SUSPEND})
	cp, err := m.restorePoint(ctx, s1)
	if fault.ReasonOf(err) != ReasonCheckpointMissing || cp != nil || !strings.Contains(err.Error(), cpID("s1", 3)+" is missing") {
		t.Fatalf("restore point with its newest gone: %v, %v", cp.GetId(), err)
	}
	list, err := m.SessionCheckpoints(ctx, s1)
	if err != nil || len(list) != 2 || list[0].GetId() != cpID("s1", 3) || !strings.HasPrefix(list[0].GetDamaged(), "missing") ||
		list[0].GetTurn() != 2 || list[0].GetReason() != checkpointv1.CheckpointReason_CHECKPOINT_REASON_SUSPEND || list[1].GetId() != older.GetId() {
		t.Fatalf("get's checkpoints: %v, %v", list, err)
	}
}
