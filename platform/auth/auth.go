// Package auth checks the shared API bearer token on gRPC calls and HTTP
// requests, and attaches it to outgoing gRPC calls.
//
// Every hangar service accepts one static token (HANGAR_TOKEN), sent as
// "authorization: Bearer <token>". Tokens are compared in constant time. An
// empty configured token rejects every call: services refuse to start
// without one, so an empty token here is a bug, and failing closed is safer
// than accepting "Bearer ".
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Message is the text of every authentication failure.
const Message = "missing or invalid bearer token"

// Scheme is the HTTP authorization scheme.
const Scheme = "Bearer"

// header is the gRPC metadata key (and, canonicalised, the HTTP header).
const header = "authorization"

// Valid reports whether the authorization value (e.g. "Bearer abc") carries
// token. The scheme is matched case-insensitively (RFC 6750); the token is
// compared in constant time, including its length.
func Valid(token, authorization string) bool {
	if token == "" {
		return false
	}
	scheme, got, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, Scheme) {
		return false
	}
	// Hash both sides so the comparison does not leak the token's length.
	a := sha256.Sum256([]byte(strings.TrimSpace(got)))
	b := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

func errUnauthenticated() error { return status.Error(codes.Unauthenticated, Message) }

func check(ctx context.Context, token string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(header)
	if len(vals) == 0 || !Valid(token, vals[0]) {
		return errUnauthenticated()
	}
	return nil
}

// UnaryServerInterceptor rejects calls whose metadata lacks
// "authorization: Bearer <token>" with codes.Unauthenticated. Methods for
// which exempt (may be nil) returns true are let through.
func UnaryServerInterceptor(token string, exempt func(fullMethod string) bool) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if exempt == nil || !exempt(info.FullMethod) {
			if err := check(ctx, token); err != nil {
				return nil, err
			}
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor is UnaryServerInterceptor for streaming calls.
func StreamServerInterceptor(token string, exempt func(fullMethod string) bool) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if exempt == nil || !exempt(info.FullMethod) {
			if err := check(ss.Context(), token); err != nil {
				return err
			}
		}
		return handler(srv, ss)
	}
}

// unauthorizedBody is what the REST error handler writes for
// codes.Unauthenticated, so REST clients see one error shape.
const unauthorizedBody = `{"code":"UNAUTHENTICATED","reason":"UNAUTHENTICATED","message":"` + Message + `"}`

// Challenge is the RFC 6750 WWW-Authenticate value of a refused request:
// with error="invalid_token" when it carried credentials (without any, the
// RFC says to name no error).
func Challenge(gaveCredentials bool) string {
	if gaveCredentials {
		return Scheme + ` realm="hangar", error="invalid_token", error_description="` + Message + `"`
	}
	return Scheme + ` realm="hangar"`
}

// HTTPMiddleware passes requests whose Authorization header carries token to
// next and answers the rest with 401, an RFC 6750 challenge and a JSON body
// {"code":"UNAUTHENTICATED","reason":"UNAUTHENTICATED","message":"missing or invalid bearer token"}.
func HTTPMiddleware(token string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Valid(token, r.Header.Get(header)) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("WWW-Authenticate", Challenge(r.Header.Get(header) != ""))
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(unauthorizedBody + "\n"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// WriteUnauthorized answers 401 with an RFC 6750 challenge (Challenge) and
// the REST error body ({"code":"UNAUTHENTICATED",...}). It reads nothing of
// the request but its headers.
func WriteUnauthorized(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("WWW-Authenticate", Challenge(r.Header.Get(header) != ""))
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = w.Write([]byte(unauthorizedBody + "\n"))
}

// TokenCredentials attaches "authorization: Bearer <Token>" to every
// outgoing call:
//
//	grpc.WithPerRPCCredentials(auth.TokenCredentials{Token: token})
//
// RequireTransportSecurity returns false so the token is also sent over
// plaintext connections. hangar's services talk over loopback (all services
// in one process) or inside a cluster network; put TLS in front (a mesh or an
// ingress) before sending the token across anything else.
type TokenCredentials struct {
	Token string
}

var _ credentials.PerRPCCredentials = TokenCredentials{}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (c TokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{header: Scheme + " " + c.Token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials; see the
// type's documentation for why it is false.
func (TokenCredentials) RequireTransportSecurity() bool { return false }
