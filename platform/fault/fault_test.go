package fault_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hangar-dev/hangar/platform/fault"
)

func TestStatus(t *testing.T) {
	t.Parallel()
	secret := errors.New("open /var/lib/hangar/db: permission denied")
	downstream := status.New(codes.NotFound, "sandbox not found")
	hangarDownstream := status.Convert(fault.Status(fault.NotFound("SANDBOX_NOT_FOUND", "sandbox not found")).Err()).Err()
	otherDomain := func() error {
		st, err := status.New(codes.NotFound, "bucket 10.0.0.7 not found").WithDetails(&errdetails.ErrorInfo{Reason: "NOT_FOUND", Domain: "googleapis.com"})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}()

	tests := []struct {
		name       string
		err        error
		wantCode   codes.Code
		wantMsg    string
		wantReason string
		wantField  string
	}{
		{
			name:       "domain error",
			err:        fault.NotFound("SESSION_NOT_FOUND", "session %q not found", "s-1"),
			wantCode:   codes.NotFound,
			wantMsg:    `session "s-1" not found`,
			wantReason: "SESSION_NOT_FOUND",
		},
		{
			name:       "wrapped domain error",
			err:        fmt.Errorf("stopping session: %w", fault.FailedPrecondition("SESSION_STOPPED", "session is stopped")),
			wantCode:   codes.FailedPrecondition,
			wantMsg:    "session is stopped",
			wantReason: "SESSION_STOPPED",
		},
		{
			name:       "invalid argument carries the field",
			err:        fault.InvalidArgument("spec.image", "spec.image must not be empty"),
			wantCode:   codes.InvalidArgument,
			wantMsg:    "spec.image must not be empty",
			wantReason: "INVALID_ARGUMENT",
			wantField:  "spec.image",
		},
		{
			name:       "wrap keeps the cause out of the message",
			err:        fault.Wrap(fault.KindUnavailable, "REDIS_UNAVAILABLE", "session store unavailable", secret),
			wantCode:   codes.Unavailable,
			wantMsg:    "session store unavailable",
			wantReason: "REDIS_UNAVAILABLE",
		},
		{
			name:       "empty reason defaults to the kind",
			err:        &fault.Error{Kind: fault.KindAborted, Message: "lease lost"},
			wantCode:   codes.Aborted,
			wantMsg:    "lease lost",
			wantReason: "ABORTED",
		},
		{
			name:       "zero kind is internal",
			err:        &fault.Error{Message: "oops"},
			wantCode:   codes.Internal,
			wantMsg:    "oops",
			wantReason: "INTERNAL",
		},
		{name: "unimplemented", err: fault.Unimplemented("fork is not supported by the %s driver", "local"), wantCode: codes.Unimplemented, wantMsg: "fork is not supported by the local driver", wantReason: "UNIMPLEMENTED"},
		{name: "already exists", err: fault.AlreadyExists("SESSION_EXISTS", "exists"), wantCode: codes.AlreadyExists, wantMsg: "exists", wantReason: "SESSION_EXISTS"},
		{name: "exhausted", err: fault.ResourceExhausted("POOL_EMPTY", "no warm sandbox"), wantCode: codes.ResourceExhausted, wantMsg: "no warm sandbox", wantReason: "POOL_EMPTY"},
		{name: "permission denied", err: fault.PermissionDenied("READ_ONLY", "read only"), wantCode: codes.PermissionDenied, wantMsg: "read only", wantReason: "READ_ONLY"},
		{name: "unavailable", err: fault.Unavailable("DRAINING", "draining"), wantCode: codes.Unavailable, wantMsg: "draining", wantReason: "DRAINING"},
		{name: "plain error does not leak", err: secret, wantCode: codes.Internal, wantMsg: "internal error"},
		{name: "wrapped plain error does not leak", err: fmt.Errorf("load: %w", secret), wantCode: codes.Internal, wantMsg: "internal error"},
		{name: "canceled", err: fmt.Errorf("waiting: %w", context.Canceled), wantCode: codes.Canceled, wantMsg: "context canceled"},
		{name: "deadline", err: context.DeadlineExceeded, wantCode: codes.DeadlineExceeded, wantMsg: "context deadline exceeded"},
		{name: "hangar status passes through", err: hangarDownstream, wantCode: codes.NotFound, wantMsg: "sandbox not found", wantReason: "SANDBOX_NOT_FOUND"},
		{name: "wrapped hangar status keeps its own message", err: fmt.Errorf("calling sandbox-svc at 10.0.0.7: %w", hangarDownstream), wantCode: codes.NotFound, wantMsg: "sandbox not found", wantReason: "SANDBOX_NOT_FOUND"},
		{name: "foreign status is masked", err: downstream.Err(), wantCode: codes.Internal, wantMsg: "internal error"},
		{name: "wrapped foreign status is masked", err: fmt.Errorf("calling sandbox-svc at 10.0.0.7: %w", downstream.Err()), wantCode: codes.Internal, wantMsg: "internal error"},
		{name: "foreign unavailable stays unavailable", err: status.Error(codes.Unavailable, "connection error: dial tcp 10.0.0.7:7001: connect: connection refused"), wantCode: codes.Unavailable, wantMsg: fault.UnavailableMessage},
		{name: "foreign deadline", err: status.Error(codes.DeadlineExceeded, "deadline at 10.0.0.7"), wantCode: codes.DeadlineExceeded, wantMsg: "context deadline exceeded"},
		{name: "foreign canceled", err: status.Error(codes.Canceled, "grpc: the client connection is closing at 10.0.0.7"), wantCode: codes.Canceled, wantMsg: "context canceled"},
		{name: "foreign unimplemented passes", err: status.Error(codes.Unimplemented, "method Fork not implemented"), wantCode: codes.Unimplemented, wantMsg: "method Fork not implemented"},
		{name: "foreign permission denied is masked", err: status.Error(codes.PermissionDenied, "token for 10.0.0.7 rejected"), wantCode: codes.Internal, wantMsg: "internal error"},
		{name: "foreign reason of another domain is masked", err: otherDomain, wantCode: codes.Internal, wantMsg: "internal error"},
		{name: "ENOSPC says so", err: fmt.Errorf("put objects/ab: %w", &fs.PathError{Op: "write", Path: "/var/lib/hangar/x", Err: syscall.ENOSPC}), wantCode: codes.ResourceExhausted, wantMsg: fault.NoSpaceMessage, wantReason: fault.ReasonNoSpace},
		{name: "ENOSPC under a domain error says so", err: fault.Wrap(fault.KindFailedPrecondition, "SANDBOX_CREATE_FAILED", "create failed", syscall.ENOSPC), wantCode: codes.ResourceExhausted, wantMsg: fault.NoSpaceMessage, wantReason: fault.ReasonNoSpace},
		{name: "no space without errno", err: fault.NoSpace(errors.New("tar: No space left on device")), wantCode: codes.ResourceExhausted, wantMsg: fault.NoSpaceMessage, wantReason: fault.ReasonNoSpace},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := fault.Status(tt.err)
			if st.Code() != tt.wantCode || st.Message() != tt.wantMsg {
				t.Fatalf("Status = %v %q, want %v %q", st.Code(), st.Message(), tt.wantCode, tt.wantMsg)
			}
			if got := fault.Reason(st); got != tt.wantReason {
				t.Errorf("Reason = %q, want %q", got, tt.wantReason)
			}
			var field string
			for _, d := range st.Details() {
				if br, ok := d.(*errdetails.BadRequest); ok {
					field = br.GetFieldViolations()[0].GetField()
				}
				if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() != fault.Domain {
					t.Errorf("ErrorInfo domain = %q", info.GetDomain())
				}
			}
			if field != tt.wantField {
				t.Errorf("BadRequest field = %q, want %q", field, tt.wantField)
			}
			if strings.Contains(st.Message(), "permission denied") || strings.Contains(st.Message(), "10.0.0.7") {
				t.Errorf("status message leaks internal text: %q", st.Message())
			}
		})
	}
}

func TestStatusNil(t *testing.T) {
	t.Parallel()
	if st := fault.Status(nil); st.Code() != codes.OK {
		t.Errorf("Status(nil) = %v, want OK", st.Code())
	}
}

func TestErrorChain(t *testing.T) {
	t.Parallel()
	cause := errors.New("disk full")
	err := fmt.Errorf("saving snapshot: %w", fault.Wrap(fault.KindInternal, "SNAPSHOT_FAILED", "snapshot failed", cause))
	if !errors.Is(err, cause) {
		t.Error("errors.Is(err, cause) = false, want the cause reachable through Unwrap")
	}
	if !fault.Is(err, fault.KindInternal) || fault.Is(err, fault.KindNotFound) {
		t.Error("fault.Is does not match the kind in the chain")
	}
	want := "saving snapshot: SNAPSHOT_FAILED: snapshot failed: disk full"
	if err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
	if got := fault.InvalidArgument("name", "name is empty").Error(); got != "INVALID_ARGUMENT name: name is empty" {
		t.Errorf("Error() = %q", got)
	}
}

func TestKind(t *testing.T) {
	t.Parallel()
	if fault.KindFailedPrecondition.String() != "FAILED_PRECONDITION" || fault.KindFailedPrecondition.Code() != codes.FailedPrecondition {
		t.Errorf("KindFailedPrecondition = %s %v", fault.KindFailedPrecondition, fault.KindFailedPrecondition.Code())
	}
	if k := fault.Kind(99); k.Code() != codes.Internal || k.String() != "KIND(99)" {
		t.Errorf("Kind(99) = %s %v", k, k.Code())
	}
}

func TestUnaryServerInterceptor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		method   string
		err      error
		wantCode codes.Code
		// wantID: the message carries an id, which the log line has too.
		wantID  bool
		wantLog string
	}{
		{name: "ok", err: nil, wantCode: codes.OK},
		{name: "domain", err: fault.NotFound("X_NOT_FOUND", "x not found"), wantCode: codes.NotFound},
		{name: "internal is logged with an id", err: errors.New("db password=hunter2 rejected"), wantCode: codes.Internal, wantID: true, wantLog: "rpc internal error"},
		{name: "foreign status is logged with an id", err: status.Error(codes.NotFound, "hunter2 not found"), wantCode: codes.Internal, wantID: true, wantLog: "rpc internal error"},
		{name: "unavailable downstream is logged with an id", err: status.Error(codes.Unavailable, "dial hunter2"), wantCode: codes.Unavailable, wantID: true, wantLog: "rpc internal error"},
		{name: "no space is logged", err: fmt.Errorf("put hunter2: %w", syscall.ENOSPC), wantCode: codes.ResourceExhausted, wantLog: "rpc failed: no space left"},
		{name: "a library's service keeps its statuses", method: "/grpc.health.v1.Health/Check", err: status.Error(codes.NotFound, "unknown service"), wantCode: codes.NotFound},
	}
	idRE := regexp.MustCompile(`^(internal error|` + regexp.QuoteMeta(fault.UnavailableMessage) + `) \(id ([0-9a-f]{12})\)$`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			logger := slog.New(slog.NewJSONHandler(&logs, nil))
			icpt := fault.UnaryServerInterceptor(logger)
			info := &grpc.UnaryServerInfo{FullMethod: "/hangar.test.v1.Test/Do"}
			if tt.method != "" {
				info.FullMethod = tt.method
			}
			_, err := icpt(context.Background(), nil, info, func(context.Context, any) (any, error) { return nil, tt.err })
			st := status.Convert(err)
			if st.Code() != tt.wantCode {
				t.Fatalf("code = %v, want %v", st.Code(), tt.wantCode)
			}
			if strings.Contains(st.Message(), "hunter2") {
				t.Errorf("message leaks: %q", st.Message())
			}
			logged := logs.String()
			if (tt.wantLog != "") != (logged != "") {
				t.Fatalf("log = %q, want %q", logged, tt.wantLog)
			}
			if tt.wantLog != "" {
				for _, want := range []string{`"msg":"` + tt.wantLog + `"`, `"method":"/hangar.test.v1.Test/Do"`, `hunter2`} {
					if !strings.Contains(logged, want) {
						t.Errorf("log %q lacks %s", logged, want)
					}
				}
			}
			m := idRE.FindStringSubmatch(st.Message())
			if tt.wantID != (m != nil) {
				t.Fatalf("message %q: want an id %v", st.Message(), tt.wantID)
			}
			if m != nil && !strings.Contains(logged, `"id":"`+m[2]+`"`) {
				t.Errorf("log %q lacks the id %s of the answer", logged, m[2])
			}
		})
	}
}

func TestReasonOf(t *testing.T) {
	t.Parallel()
	remote := fault.Status(fault.NotFound("FILE_NOT_FOUND", "no file")).Err()
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"domain", fmt.Errorf("x: %w", fault.NotFound("SANDBOX_NOT_FOUND", "gone")), "SANDBOX_NOT_FOUND"},
		{"domain default", &fault.Error{Kind: fault.KindAborted}, "ABORTED"},
		{"remote", fmt.Errorf("read: %w", remote), "FILE_NOT_FOUND"},
		{"foreign status", status.Error(codes.NotFound, "x"), ""},
		{"plain", errors.New("x"), ""},
	}
	for _, tt := range tests {
		if got := fault.ReasonOf(tt.err); got != tt.want {
			t.Errorf("%s: ReasonOf = %q, want %q", tt.name, got, tt.want)
		}
	}
	if got := fault.PublicMessage(status.Error(codes.Unavailable, "dial 10.0.0.7")); got != fault.UnavailableMessage {
		t.Errorf("PublicMessage = %q", got)
	}
}

type stream struct{ grpc.ServerStream }

func (stream) Context() context.Context { return context.Background() }

func TestStreamServerInterceptor(t *testing.T) {
	t.Parallel()
	icpt := fault.StreamServerInterceptor(nil)
	info := &grpc.StreamServerInfo{FullMethod: "/hangar.test.v1.Test/Watch"}
	err := icpt(nil, stream{}, info, func(any, grpc.ServerStream) error {
		return fmt.Errorf("watch: %w", fault.Aborted("LEASE_LOST", "lease lost"))
	})
	if st := status.Convert(err); st.Code() != codes.Aborted || st.Message() != "lease lost" || fault.Reason(st) != "LEASE_LOST" {
		t.Errorf("status = %v %q %q", st.Code(), st.Message(), fault.Reason(st))
	}
	if err := icpt(nil, stream{}, info, func(any, grpc.ServerStream) error { return nil }); err != nil {
		t.Errorf("nil handler error became %v", err)
	}
}
