package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hangar-dev/hangar/platform/auth"
	"github.com/hangar-dev/hangar/platform/fault"
)

// RESTError is the body of every REST error: the gRPC code's name, hangar's
// reason (SESSION_NOT_FOUND, ...), the message, and the request field at
// fault when there is one. The HTTP status carries the number.
type RESTError struct {
	Code    string `json:"code"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

// restErrorBody is the body for st.
func restErrorBody(st *status.Status) RESTError {
	body := RESTError{Code: codeName(st.Code()), Reason: fault.Reason(st), Message: st.Message()}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			body.Field = br.GetFieldViolations()[0].GetField()
		}
	}
	if body.Reason == "" && st.Code() == codes.Unauthenticated {
		body.Reason = "UNAUTHENTICATED"
	}
	return body
}

// codeName is a gRPC code as its canonical name (NOT_FOUND).
func codeName(c codes.Code) string {
	switch c {
	case codes.OK:
		return "OK"
	case codes.Canceled:
		return "CANCELLED"
	case codes.Unknown:
		return "UNKNOWN"
	case codes.InvalidArgument:
		return "INVALID_ARGUMENT"
	case codes.DeadlineExceeded:
		return "DEADLINE_EXCEEDED"
	case codes.NotFound:
		return "NOT_FOUND"
	case codes.AlreadyExists:
		return "ALREADY_EXISTS"
	case codes.PermissionDenied:
		return "PERMISSION_DENIED"
	case codes.ResourceExhausted:
		return "RESOURCE_EXHAUSTED"
	case codes.FailedPrecondition:
		return "FAILED_PRECONDITION"
	case codes.Aborted:
		return "ABORTED"
	case codes.OutOfRange:
		return "OUT_OF_RANGE"
	case codes.Unimplemented:
		return "UNIMPLEMENTED"
	case codes.Internal:
		return "INTERNAL"
	case codes.Unavailable:
		return "UNAVAILABLE"
	case codes.DataLoss:
		return "DATA_LOSS"
	case codes.Unauthenticated:
		return "UNAUTHENTICATED"
	}
	return "UNKNOWN"
}

// restErrorHandler writes a failed REST call: the HTTP status of its gRPC
// code, a RESTError body, and for a refused token an RFC 6750
// WWW-Authenticate challenge. No gRPC metadata goes out as headers.
func restErrorHandler(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	st := status.Convert(err)
	var httpStatus int
	var he *runtime.HTTPStatusError
	if errors.As(err, &he) {
		httpStatus, st = he.HTTPStatus, status.Convert(he.Err)
	} else {
		httpStatus = runtime.HTTPStatusFromCode(st.Code())
	}
	h := w.Header()
	h.Del("Trailer")
	h.Del("Transfer-Encoding")
	h.Set("Content-Type", "application/json")
	if st.Code() == codes.Unauthenticated {
		h.Set("WWW-Authenticate", auth.Challenge(r.Header.Get("Authorization") != ""))
	}
	w.WriteHeader(httpStatus)
	_ = json.NewEncoder(w).Encode(restErrorBody(st))
}

// noMetadataHeaders drops every gRPC header and trailer from REST responses
// (grpc-gateway would send them as Grpc-Metadata-*).
func noMetadataHeaders(string) (string, bool) { return "", false }
