// Package client finds a running hangar and connects to it. The endpoint
// comes from HANGAR_URL and HANGAR_TOKEN, or from the files `hangar up`
// leaves in the data directory (HANGAR_HOME, default ~/.hangar).
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hangar-dev/hangar/platform/rpc"
)

// Endpoint is where hangar answers and the token it wants.
type Endpoint struct {
	URL   string
	Token string
	// URLFrom and TokenFrom say where URL and Token came from
	// ("HANGAR_URL", or a file's path), for messages; "" when set directly.
	URLFrom, TokenFrom string
}

// Resolve finds the endpoint: HANGAR_URL and HANGAR_TOKEN win; what they
// leave unset is read from the data directory.
func Resolve(lookupEnv func(string) (string, bool)) (Endpoint, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	get := func(name string) string {
		v, _ := lookupEnv(name)
		return strings.TrimSpace(v)
	}
	ep := Endpoint{URL: get("HANGAR_URL"), Token: get("HANGAR_TOKEN"), URLFrom: "HANGAR_URL", TokenFrom: "HANGAR_TOKEN"}
	home := get("HANGAR_HOME")
	if home == "" {
		dir, err := os.UserHomeDir()
		if err != nil {
			return Endpoint{}, fmt.Errorf("HANGAR_HOME is unset and the home directory is unknown: set HANGAR_URL and HANGAR_TOKEN")
		}
		home = filepath.Join(dir, ".hangar")
	}
	if ep.URL == "" {
		path := filepath.Join(home, "endpoint")
		v, err := readFile(path)
		if err != nil {
			return Endpoint{}, fmt.Errorf("no hangar found: HANGAR_URL is unset and %s has no endpoint file: start one with `hangar up` (%w)", home, err)
		}
		ep.URL, ep.URLFrom = v, path
	}
	if ep.Token == "" {
		path := filepath.Join(home, "token")
		v, err := readFile(path)
		if err != nil {
			return Endpoint{}, fmt.Errorf("HANGAR_TOKEN is unset and %s has no token file: set HANGAR_TOKEN to the token `hangar up` printed (%w)", home, err)
		}
		ep.Token, ep.TokenFrom = v, path
	}
	if _, err := ep.target(); err != nil {
		return Endpoint{}, err
	}
	return ep, nil
}

// Dial opens a gRPC connection to the endpoint (lazily: errors show on the
// first call).
func (e Endpoint) Dial() (*grpc.ClientConn, error) {
	target, err := e.target()
	if err != nil {
		return nil, err
	}
	return rpc.Dial(target, rpc.ClientOptions{Token: e.Token},
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return e.explain(invoker(ctx, method, req, reply, cc, opts...))
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, e.explain(err)
			}
			return explainedStream{ClientStream: s, ep: e}, nil
		}))
}

// explain rewrites the two errors a person can fix before anything else:
// no hangar at the URL, and a token it refuses. Other errors pass as they are.
func (e Endpoint) explain(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.Unavailable:
		msg := st.Message()
		if !strings.Contains(msg, "connection refused") && !strings.Contains(msg, "no such host") && !strings.Contains(msg, "connect:") {
			return err
		}
		// Only a failure to reach hangar itself, the dial naming its
		// address: a running hangar's own Unavailable (a backend it cannot
		// reach, such as the Kubernetes API server) passes as it is.
		if !e.namedIn(msg) {
			return err
		}
		from := ""
		if e.URLFrom != "" {
			from = " (from " + e.URLFrom + ")"
		}
		return status.Errorf(codes.Unavailable, "hangar at %s%s is not running: start it with `hangar up`, or point HANGAR_URL at a running one", e.URL, from)
	case codes.Unauthenticated:
		from := ""
		if e.TokenFrom != "" {
			from = " from " + e.TokenFrom
		}
		return status.Errorf(codes.Unauthenticated, "hangar at %s refused the token%s: use the one its `hangar up` printed (saved in its HANGAR_HOME/token), through HANGAR_TOKEN or that file", e.URL, from)
	}
	return err
}

// namedIn says whether a dial error's message names the endpoint: its
// host:port, its port as dialled ("dial tcp [::1]:7400: connect: ..."
// for localhost), or its host not found.
func (e Endpoint) namedIn(msg string) bool {
	target, err := e.target()
	if err != nil {
		return false
	}
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return strings.Contains(msg, target)
	}
	return strings.Contains(msg, target) || strings.Contains(msg, ":"+port+": connect:") ||
		(strings.Contains(msg, "no such host") && strings.Contains(msg, host))
}

type explainedStream struct {
	grpc.ClientStream
	ep Endpoint
}

func (s explainedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if errors.Is(err, io.EOF) {
		return err
	}
	return s.ep.explain(err)
}

func (s explainedStream) SendMsg(m any) error {
	err := s.ClientStream.SendMsg(m)
	if errors.Is(err, io.EOF) {
		return err
	}
	return s.ep.explain(err)
}

func (e Endpoint) target() (string, error) {
	u, err := url.Parse(e.URL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("HANGAR_URL=%q: want http://host:port", e.URL)
	}
	if u.Scheme == "https" {
		return "", fmt.Errorf("HANGAR_URL=%q: https is not supported yet; use a plaintext loopback or in-cluster URL", e.URL)
	}
	return u.Host, nil
}

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return "", pe.Err
		}
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
