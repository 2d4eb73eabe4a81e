// Package fault defines hangar's domain errors and is the one place they
// become gRPC statuses.
//
// Code below the RPC edge returns *Error values (wrapped with %w as they
// travel up); the interceptors in this package turn whatever a handler
// returns into a status with Status. Only Message reaches the client; the
// cause in Err is for logs.
package fault

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"syscall"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
)

// Domain is the ErrorInfo domain of every status built from an *Error.
const Domain = "hangar.dev"

// InternalMessage is the only text a client sees for an error that is not a
// domain error.
const InternalMessage = "internal error"

// Kind classifies an Error. Each kind maps to one gRPC code. The constants
// carry a Kind prefix because the plain names are the constructors
// (fault.NotFound builds an error of kind fault.KindNotFound). The zero Kind
// is not valid and is treated as KindInternal.
type Kind int

// The kinds of domain error.
const (
	KindNotFound Kind = iota + 1
	KindInvalidArgument
	KindFailedPrecondition
	KindAlreadyExists
	KindPermissionDenied
	KindUnauthenticated
	KindResourceExhausted
	KindUnavailable
	KindAborted
	KindDeadlineExceeded
	KindUnimplemented
	KindInternal
)

var kindCodes = map[Kind]codes.Code{
	KindNotFound:           codes.NotFound,
	KindInvalidArgument:    codes.InvalidArgument,
	KindFailedPrecondition: codes.FailedPrecondition,
	KindAlreadyExists:      codes.AlreadyExists,
	KindPermissionDenied:   codes.PermissionDenied,
	KindUnauthenticated:    codes.Unauthenticated,
	KindResourceExhausted:  codes.ResourceExhausted,
	KindUnavailable:        codes.Unavailable,
	KindAborted:            codes.Aborted,
	KindDeadlineExceeded:   codes.DeadlineExceeded,
	KindUnimplemented:      codes.Unimplemented,
	KindInternal:           codes.Internal,
}

// Code returns the gRPC code for k (codes.Internal for an unknown kind).
func (k Kind) Code() codes.Code {
	if c, ok := kindCodes[k]; ok {
		return c
	}
	return codes.Internal
}

// String returns the kind in UPPER_SNAKE form, e.g. "NOT_FOUND"; it is also
// the default Reason of an Error of that kind.
func (k Kind) String() string {
	if _, ok := kindCodes[k]; !ok {
		return fmt.Sprintf("KIND(%d)", int(k))
	}
	return codeNames[k.Code()]
}

var codeNames = map[codes.Code]string{
	codes.NotFound:           "NOT_FOUND",
	codes.InvalidArgument:    "INVALID_ARGUMENT",
	codes.FailedPrecondition: "FAILED_PRECONDITION",
	codes.AlreadyExists:      "ALREADY_EXISTS",
	codes.PermissionDenied:   "PERMISSION_DENIED",
	codes.Unauthenticated:    "UNAUTHENTICATED",
	codes.ResourceExhausted:  "RESOURCE_EXHAUSTED",
	codes.Unavailable:        "UNAVAILABLE",
	codes.Aborted:            "ABORTED",
	codes.DeadlineExceeded:   "DEADLINE_EXCEEDED",
	codes.Unimplemented:      "UNIMPLEMENTED",
	codes.Internal:           "INTERNAL",
}

// Error is a domain error.
type Error struct {
	Kind Kind
	// Reason is a stable UPPER_SNAKE identifier clients may switch on, e.g.
	// SESSION_NOT_FOUND. Empty means the kind's name (KindNotFound: NOT_FOUND).
	Reason string
	// Message is safe to show a client. It must not contain internal details.
	Message string
	// Field names the offending request field of an InvalidArgument error.
	Field string
	// Err is the internal cause. It is logged, never sent to a client.
	Err error
}

// Error returns "REASON: message: cause" for logs.
func (e *Error) Error() string {
	s := e.reason()
	if e.Field != "" {
		s += " " + e.Field
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the internal cause.
func (e *Error) Unwrap() error { return e.Err }

func (e *Error) reason() string {
	if e.Reason != "" {
		return e.Reason
	}
	return codeNames[e.Kind.Code()]
}

func newf(kind Kind, reason, format string, args []any) *Error {
	return &Error{Kind: kind, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// NotFound returns a NotFound error, e.g.
// NotFound("SESSION_NOT_FOUND", "session %q not found", id).
func NotFound(reason, format string, args ...any) *Error {
	return newf(KindNotFound, reason, format, args)
}

// InvalidArgument returns an InvalidArgument error about the request field
// field (reason INVALID_ARGUMENT). Name the field in the message too: only the
// message is shown by most clients.
func InvalidArgument(field, format string, args ...any) *Error {
	e := newf(KindInvalidArgument, "INVALID_ARGUMENT", format, args)
	e.Field = field
	return e
}

// FailedPrecondition returns a FailedPrecondition error: the request is valid
// but the system is not in a state to run it (e.g. the session is stopped).
func FailedPrecondition(reason, format string, args ...any) *Error {
	return newf(KindFailedPrecondition, reason, format, args)
}

// AlreadyExists returns an AlreadyExists error.
func AlreadyExists(reason, format string, args ...any) *Error {
	return newf(KindAlreadyExists, reason, format, args)
}

// PermissionDenied returns a PermissionDenied error.
func PermissionDenied(reason, format string, args ...any) *Error {
	return newf(KindPermissionDenied, reason, format, args)
}

// Unavailable returns an Unavailable error: the client may retry.
func Unavailable(reason, format string, args ...any) *Error {
	return newf(KindUnavailable, reason, format, args)
}

// ResourceExhausted returns a ResourceExhausted error (quota, pool empty).
func ResourceExhausted(reason, format string, args ...any) *Error {
	return newf(KindResourceExhausted, reason, format, args)
}

// Aborted returns an Aborted error: a concurrency conflict such as a lost
// lease or a stale version; the client may retry the whole operation.
func Aborted(reason, format string, args ...any) *Error {
	return newf(KindAborted, reason, format, args)
}

// Unimplemented returns an Unimplemented error (reason UNIMPLEMENTED).
func Unimplemented(format string, args ...any) *Error {
	return newf(KindUnimplemented, "UNIMPLEMENTED", format, args)
}

// Wrap returns an error of the given kind whose client-visible text is
// message and whose internal cause is err.
func Wrap(kind Kind, reason, message string, err error) *Error {
	return &Error{Kind: kind, Reason: reason, Message: message, Err: err}
}

// Is reports whether err's chain holds an *Error of the given kind.
func Is(err error, kind Kind) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == kind
}

// ReasonNoSpace is the reason of every error caused by a full disk
// (ENOSPC anywhere in the chain), whatever else wrapped it.
const ReasonNoSpace = "NO_SPACE"

// NoSpaceMessage is what a client sees for a full disk.
const NoSpaceMessage = "no space left on the data volume (HANGAR_HOME)"

// NoSpace returns the ResourceExhausted error of a full disk with cause err.
// Status gives the same answer for any error whose chain holds
// syscall.ENOSPC; NoSpace is for causes that carry no errno (a command's
// "No space left on device" on stderr).
func NoSpace(err error) *Error {
	return &Error{Kind: KindResourceExhausted, Reason: ReasonNoSpace, Message: NoSpaceMessage, Err: err}
}

// Status converts err into the gRPC status sent to a client:
//
//   - syscall.ENOSPC anywhere in the chain: ResourceExhausted, reason
//     NO_SPACE, "no space left on the data volume (HANGAR_HOME)";
//   - an *Error anywhere in the chain: its kind's code, its Message, an
//     errdetails.ErrorInfo{Reason, Domain: "hangar.dev"} detail and, when
//     Field is set, an errdetails.BadRequest field violation;
//   - context.Canceled and context.DeadlineExceeded: codes.Canceled and
//     codes.DeadlineExceeded;
//   - an error that carries a gRPC status (for example one returned by a
//     call to another service): that status unchanged when it carries
//     hangar's own reason (ErrorInfo domain hangar.dev) or is Unimplemented;
//     a Canceled or DeadlineExceeded one with the standard text; an
//     Unavailable one as Unavailable "a service hangar depends on is
//     unavailable"; any other as "internal error" (its text, which may be a
//     transport's or a library's, is not sent);
//   - anything else: codes.Internal with the message "internal error" (the
//     error's text is not sent).
//
// The interceptors add an id to a masked answer ("internal error (id
// 3f2a...)") that is also in the log line of the call.
//
// A nil err gives an OK status.
func Status(err error) *status.Status {
	st, _ := convert(err)
	return st
}

// UnavailableMessage is what a client sees when a service hangar calls
// could not be reached and said nothing of its own.
const UnavailableMessage = "a service hangar depends on is unavailable; try again"

// convert is Status, and reports whether the answer is masked (the error's
// own text is not in it: the interceptors log it under an id).
func convert(err error) (*status.Status, bool) {
	if err == nil {
		return status.New(codes.OK, ""), false
	}
	if errors.Is(err, syscall.ENOSPC) {
		return NoSpace(err).status(), false
	}
	var fe *Error
	if errors.As(err, &fe) {
		return fe.status(), false
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, context.Canceled.Error()), false
	case errors.Is(err, context.DeadlineExceeded):
		return status.New(codes.DeadlineExceeded, context.DeadlineExceeded.Error()), false
	}
	// Use the carried status itself rather than status.FromError, which
	// would replace its message with the full text of any wrapping errors.
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		if st := se.GRPCStatus(); st != nil && st.Code() != codes.OK {
			switch {
			case Reason(st) != "", st.Code() == codes.Unimplemented:
				return st, false
			case st.Code() == codes.Canceled:
				return status.New(codes.Canceled, context.Canceled.Error()), false
			case st.Code() == codes.DeadlineExceeded:
				return status.New(codes.DeadlineExceeded, context.DeadlineExceeded.Error()), false
			case st.Code() == codes.Unavailable:
				return status.New(codes.Unavailable, UnavailableMessage), true
			}
		}
	}
	return status.New(codes.Internal, InternalMessage), true
}

// PublicMessage is what a client may see of err: the message Status gives
// it ("internal error" when masked). For texts kept on records (a turn's
// failure reason) where no call's log line can carry an id.
func PublicMessage(err error) string {
	return Status(err).Message()
}

// ReasonOf returns the hangar reason err carries: an *Error's, or that of
// a status from another hangar service ("" if none). Check a call's
// result with it, not with its code alone: NotFound from sandbox-svc may be
// FILE_NOT_FOUND or SANDBOX_NOT_FOUND.
func ReasonOf(err error) string {
	if err == nil {
		return ""
	}
	var fe *Error
	if errors.As(err, &fe) {
		return fe.reason()
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		if st := se.GRPCStatus(); st != nil {
			return Reason(st)
		}
	}
	return ""
}

// NewIncidentID returns a short random id that ties a masked answer to the
// log line holding its cause.
func NewIncidentID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// WithIncidentID returns st with " (id ID)" added to its message.
func WithIncidentID(st *status.Status, id string) *status.Status {
	p := st.Proto()
	p.Message = fmt.Sprintf("%s (id %s)", p.GetMessage(), id)
	return status.FromProto(p)
}

func (e *Error) status() *status.Status {
	code := e.Kind.Code()
	msg := e.Message
	if msg == "" {
		msg = e.reason()
	}
	st := status.New(code, msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: e.reason(), Domain: Domain}}
	if e.Field != "" {
		details = append(details, &errdetails.BadRequest{
			FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: e.Field, Description: e.Message}},
		})
	}
	withDetails, err := st.WithDetails(details...)
	if err != nil {
		return st
	}
	return withDetails
}

// Reason returns the ErrorInfo reason of a status built by Status, or "".
func Reason(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetReason()
		}
	}
	return ""
}

// UnaryServerInterceptor maps the error a handler returns with Status
// (for hangar's own services, "/hangar.*"; a library's service such as
// grpc.health.v1 keeps the statuses it returns). A
// masked answer gets an id, and the error is logged with it (the only place
// its text is kept): "internal error (id 3f2a9c01d4e5)" on the client is
// `"msg":"rpc internal error","id":"3f2a9c01d4e5"` in the log.
func UnaryServerInterceptor(logger *slog.Logger) grpc.UnaryServerInterceptor {
	logger = orDiscard(logger)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			return resp, toStatusError(ctx, logger, info.FullMethod, err)
		}
		return resp, nil
	}
}

// StreamServerInterceptor is UnaryServerInterceptor for streaming calls.
func StreamServerInterceptor(logger *slog.Logger) grpc.StreamServerInterceptor {
	logger = orDiscard(logger)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := handler(srv, ss); err != nil {
			return toStatusError(ss.Context(), logger, info.FullMethod, err)
		}
		return nil
	}
}

func toStatusError(ctx context.Context, logger *slog.Logger, method string, err error) error {
	if !strings.HasPrefix(method, "/hangar.") {
		// A library's service (health, reflection) answers with statuses
		// of its own contract ("unknown service"); they are not a call to
		// another service passing through.
		var se interface{ GRPCStatus() *status.Status }
		if errors.As(err, &se) && se.GRPCStatus() != nil {
			return se.GRPCStatus().Err()
		}
	}
	st, masked := convert(err)
	switch {
	case masked:
		id := NewIncidentID()
		st = WithIncidentID(st, id)
		logger.LogAttrs(ctx, slog.LevelError, "rpc internal error",
			slog.String("method", method), slog.String("id", id), slog.String("code", st.Code().String()), slog.Any("error", err))
	case Reason(st) == ReasonNoSpace:
		logger.LogAttrs(ctx, slog.LevelError, "rpc failed: no space left",
			slog.String("method", method), slog.Any("error", err))
	}
	return st.Err()
}

func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
