package server_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/holds"
	"github.com/hangar-dev/hangar/session-svc/internal/server"
	"github.com/hangar-dev/hangar/session-svc/internal/sessions"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// realRedis is the Redis every test of the repository uses.
const realRedis = "127.0.0.1:6379"

// errorWorld is a session service on a real SQLite file and real Redis,
// with one session "s1" that has turn 1.
type errorWorld struct {
	srv    *server.Sessions
	dbPath string
	st     *store.Store
}

func newErrorWorld(t *testing.T, redisAddr string) *errorWorld {
	t.Helper()
	ctx := context.Background()
	dbPath := filepath.Join(t.TempDir(), "sessions.db")
	st, err := store.Open(ctx, store.Options{SQLitePath: dbPath})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.CreateSession(ctx, &store.Session{Name: "s1", Environment: "local", Harness: "claude", Branch: "hangar/session/s1", State: store.StateIdle}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTurn(ctx, &store.Turn{Session: "s1", Message: "hi"}); err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: redisAddr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = client.Close() })
	h := holds.New(client, fmt.Sprintf("test:server-errors:%d:", time.Now().UnixNano()), nil)
	m := sessions.New(sessions.Deps{Store: st, Holds: h, Checkpoints: noCheckpoints{}})
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return &errorWorld{srv: server.New(m, st, h), dbPath: dbPath, st: st}
}

// noCheckpoints is a checkpoint service that holds none.
type noCheckpoints struct {
	checkpointv1.CheckpointServiceClient
}

func (noCheckpoints) ListCheckpoints(context.Context, *checkpointv1.ListCheckpointsRequest, ...grpc.CallOption) (*checkpointv1.ListCheckpointsResponse, error) {
	return &checkpointv1.ListCheckpointsResponse{}, nil
}

// breakTable drops a table behind the store's back: its queries then fail
// with an error that is not "not found".
func (w *errorWorld) breakTable(t *testing.T, table string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+w.dbPath+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("PRAGMA foreign_keys = OFF; DROP TABLE " + table); err != nil {
		t.Fatal(err)
	}
}

// closedAddr is an address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestErrorsMeanWhatTheySay: a "not found" answer only for a record that is
// not there; any other failure is masked, never a wrong reason.
func TestErrorsMeanWhatTheySay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		redis      func(t *testing.T) string
		breakTable string
		call       func(ctx context.Context, s *server.Sessions) error
		wantCode   codes.Code
		wantReason string
	}{
		{
			name: "turn there",
			call: func(ctx context.Context, s *server.Sessions) error {
				_, err := s.GetTurn(ctx, &sessionv1.GetTurnRequest{Name: "s1", Turn: 1})
				return err
			},
			wantCode: codes.OK,
		},
		{
			name: "turn missing",
			call: func(ctx context.Context, s *server.Sessions) error {
				_, err := s.GetTurn(ctx, &sessionv1.GetTurnRequest{Name: "s1", Turn: 7})
				return err
			},
			wantCode: codes.NotFound, wantReason: "TURN_NOT_FOUND",
		},
		{
			name:       "turns unreadable is not TURN_NOT_FOUND",
			breakTable: "turns",
			call: func(ctx context.Context, s *server.Sessions) error {
				_, err := s.GetTurn(ctx, &sessionv1.GetTurnRequest{Name: "s1", Turn: 1})
				return err
			},
			wantCode: codes.Internal,
		},
		{
			name: "hold missing",
			call: func(ctx context.Context, s *server.Sessions) error {
				_, err := s.RenewHold(ctx, &sessionv1.RenewHoldRequest{Name: "s1", HoldId: "h-none", TtlSeconds: 30})
				return err
			},
			wantCode: codes.NotFound, wantReason: "HOLD_NOT_FOUND",
		},
		{
			name:  "hold store down is not HOLD_NOT_FOUND",
			redis: closedAddr,
			call: func(ctx context.Context, s *server.Sessions) error {
				_, err := s.RenewHold(ctx, &sessionv1.RenewHoldRequest{Name: "s1", HoldId: "h-1", TtlSeconds: 30})
				return err
			},
			wantCode: codes.Unavailable, wantReason: "HOLD_STORE_UNAVAILABLE",
		},
		{
			// get answers while Redis is down, without the holds (the
			// session record is in SQL); hold calls say the store is down.
			name:  "get with the hold store down still answers",
			redis: closedAddr,
			call: func(ctx context.Context, s *server.Sessions) error {
				_, err := s.GetSession(ctx, &sessionv1.GetSessionRequest{Name: "s1"})
				return err
			},
			wantCode: codes.OK, wantReason: "",
		},
		{
			name: "bad page token",
			call: func(ctx context.Context, s *server.Sessions) error {
				_, err := s.ListSessions(ctx, &sessionv1.ListSessionsRequest{PageToken: "nonsense"})
				return err
			},
			wantCode: codes.InvalidArgument, wantReason: "INVALID_ARGUMENT",
		},
		{
			name:       "sessions unreadable is not a bad page token",
			breakTable: "sessions",
			call: func(ctx context.Context, s *server.Sessions) error {
				_, err := s.ListSessions(ctx, &sessionv1.ListSessionsRequest{})
				return err
			},
			wantCode: codes.Internal,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			addr := realRedis
			if tt.redis != nil {
				addr = tt.redis(t)
			}
			w := newErrorWorld(t, addr)
			if tt.breakTable != "" {
				w.breakTable(t, tt.breakTable)
			}
			err := tt.call(t.Context(), w.srv)
			st := fault.Status(err)
			if st.Code() != tt.wantCode || fault.Reason(st) != tt.wantReason {
				t.Fatalf("got %v %s %q (%v), want %v %s", st.Code(), fault.Reason(st), st.Message(), err, tt.wantCode, tt.wantReason)
			}
		})
	}
}
