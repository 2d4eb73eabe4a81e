package rpc_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/platform/rpc"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const token = "rpc-test-token"

// testService is a hand-written gRPC service (no generated code needed) whose
// methods exercise the interceptor chain.
type testService struct{}

func unary(name string, fn func(ctx context.Context) (any, error)) grpc.MethodDesc {
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: "/hangar.test.v1.Test/" + name}
			h := func(ctx context.Context, _ any) (any, error) { return fn(ctx) }
			if icpt == nil {
				return h(ctx, in)
			}
			return icpt(ctx, in, info, h)
		},
	}
}

var testDesc = grpc.ServiceDesc{
	ServiceName: "hangar.test.v1.Test",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		unary("Ok", func(context.Context) (any, error) { return &emptypb.Empty{}, nil }),
		unary("Panic", func(context.Context) (any, error) { panic("boom: secret detail") }),
		unary("NotFound", func(context.Context) (any, error) {
			return nil, fault.NotFound("THING_NOT_FOUND", "thing not found")
		}),
		unary("Raw", func(context.Context) (any, error) { return nil, errors.New("raw secret detail") }),
		unary("Deadline", func(ctx context.Context) (any, error) {
			d, ok := ctx.Deadline()
			if !ok {
				return wrapperspb.Int64(-1), nil
			}
			return wrapperspb.Int64(int64(time.Until(d))), nil
		}),
	},
	Streams: []grpc.StreamDesc{
		{StreamName: "StreamPanic", ServerStreams: true, Handler: func(any, grpc.ServerStream) error { panic("stream boom") }},
		{StreamName: "StreamFault", ServerStreams: true, Handler: func(any, grpc.ServerStream) error {
			return fault.Aborted("LEASE_LOST", "lease lost")
		}},
	},
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type fixture struct {
	addr string
	logs *syncBuffer
}

func start(t *testing.T, opts rpc.ServerOptions) fixture {
	t.Helper()
	logs := &syncBuffer{}
	if opts.Logger == nil {
		opts.Logger = logging.New(logs, "debug", "json")
	}
	opts.Token = token
	srv := rpc.NewServer(opts)
	srv.RegisterService(&testDesc, testService{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return fixture{addr: lis.Addr().String(), logs: logs}
}

func dial(t *testing.T, addr string, opts rpc.ClientOptions) *grpc.ClientConn {
	t.Helper()
	conn, err := rpc.Dial(addr, opts)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

var incidentRE = regexp.MustCompile(`^internal error \(id ([0-9a-f]{12})\)$`)

func TestServerChain(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	f := start(t, rpc.ServerOptions{TracerProvider: tp})
	conn := dial(t, f.addr, rpc.ClientOptions{Token: token})

	tests := []struct {
		method     string
		wantCode   codes.Code
		wantMsg    string
		wantReason string
	}{
		{"Ok", codes.OK, "", ""},
		{"Panic", codes.Internal, "internal error", ""},
		{"NotFound", codes.NotFound, "thing not found", "THING_NOT_FOUND"},
		{"Raw", codes.Internal, "internal error", ""},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			err := conn.Invoke(t.Context(), "/hangar.test.v1.Test/"+tt.method, &emptypb.Empty{}, &emptypb.Empty{})
			st := status.Convert(err)
			msg := st.Message()
			if tt.wantMsg == "internal error" {
				// The masked answer names the id its log line carries.
				m := incidentRE.FindStringSubmatch(msg)
				if m == nil {
					t.Fatalf("message %q has no id", msg)
				}
				if !strings.Contains(f.logs.String(), `"id":"`+m[1]+`"`) {
					t.Errorf("no log line has id %s:\n%s", m[1], f.logs.String())
				}
				msg = "internal error"
			}
			if st.Code() != tt.wantCode || msg != tt.wantMsg || fault.Reason(st) != tt.wantReason {
				t.Errorf("got %v %q %q, want %v %q %q", st.Code(), st.Message(), fault.Reason(st), tt.wantCode, tt.wantMsg, tt.wantReason)
			}
		})
	}

	logs := f.logs.String()
	for _, want := range []string{
		`"msg":"rpc panicked","method":"/hangar.test.v1.Test/Panic","id":"`,
		`"panic":"boom: secret detail","stack":"goroutine`,
		`"msg":"rpc internal error","method":"/hangar.test.v1.Test/Raw","id":"`,
		`"error":"raw secret detail"`,
		`"level":"ERROR","msg":"rpc finished","method":"/hangar.test.v1.Test/Panic","code":"Internal"`,
		`"level":"INFO","msg":"rpc finished","method":"/hangar.test.v1.Test/NotFound","code":"NotFound","duration":`,
		`"trace_id":"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
}

func TestServerAuth(t *testing.T) {
	f := start(t, rpc.ServerOptions{AuthExempt: func(m string) bool { return m == "/hangar.test.v1.Test/Deadline" }})
	tests := []struct {
		name     string
		token    string
		method   string
		wantCode codes.Code
	}{
		{"right token", token, "Ok", codes.OK},
		{"wrong token", "nope", "Ok", codes.Unauthenticated},
		{"no token", "", "Ok", codes.Unauthenticated},
		{"no token, exempt method", "", "Deadline", codes.OK},
		{"no token, stream", "", "StreamFault", codes.Unauthenticated},
		// An unknown service or method is no hint without the token.
		{"no token, unknown service", "", "/hangar.nope.v1.Nope/Call", codes.Unauthenticated},
		{"wrong token, unknown method", "nope", "/hangar.test.v1.Test/Nope", codes.Unauthenticated},
		{"right token, unknown service", token, "/hangar.nope.v1.Nope/Call", codes.Unimplemented},
		{"no token, unknown stream", "", "/hangar.nope.v1.Nope/StreamCall", codes.Unauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := dial(t, f.addr, rpc.ClientOptions{Token: tt.token})
			method := tt.method
			if !strings.HasPrefix(method, "/") {
				method = "/hangar.test.v1.Test/" + method
			}
			var err error
			if strings.Contains(method, "/Stream") {
				err = recvStream(t, conn, method)
			} else {
				err = conn.Invoke(t.Context(), method, &emptypb.Empty{}, &wrapperspb.Int64Value{})
			}
			if got := status.Code(err); got != tt.wantCode {
				t.Errorf("code = %v (%v), want %v", got, err, tt.wantCode)
			}
		})
	}
}

func recvStream(t *testing.T, conn *grpc.ClientConn, method string) error {
	t.Helper()
	if !strings.HasPrefix(method, "/") {
		method = "/hangar.test.v1.Test/" + method
	}
	desc := &grpc.StreamDesc{StreamName: method, ServerStreams: true}
	s, err := conn.NewStream(t.Context(), desc, method)
	if err != nil {
		return err
	}
	if err := s.SendMsg(&emptypb.Empty{}); err != nil {
		return err
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	err = s.RecvMsg(&emptypb.Empty{})
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

func TestServerStreams(t *testing.T) {
	f := start(t, rpc.ServerOptions{})
	conn := dial(t, f.addr, rpc.ClientOptions{Token: token})

	st := status.Convert(recvStream(t, conn, "StreamPanic"))
	if st.Code() != codes.Internal || !incidentRE.MatchString(st.Message()) {
		t.Errorf("StreamPanic = %v %q", st.Code(), st.Message())
	}
	st = status.Convert(recvStream(t, conn, "StreamFault"))
	if st.Code() != codes.Aborted || fault.Reason(st) != "LEASE_LOST" {
		t.Errorf("StreamFault = %v %q", st.Code(), fault.Reason(st))
	}
	if !strings.Contains(f.logs.String(), `"msg":"rpc panicked","method":"/hangar.test.v1.Test/StreamPanic"`) {
		t.Errorf("stream panic not logged:\n%s", f.logs.String())
	}
}

func TestDeadlines(t *testing.T) {
	remaining := func(t *testing.T, conn *grpc.ClientConn, ctx context.Context) time.Duration {
		t.Helper()
		out := &wrapperspb.Int64Value{}
		if err := conn.Invoke(ctx, "/hangar.test.v1.Test/Deadline", &emptypb.Empty{}, out); err != nil {
			t.Fatalf("Deadline: %v", err)
		}
		return time.Duration(out.GetValue())
	}

	t.Run("server adds its default", func(t *testing.T) {
		f := start(t, rpc.ServerOptions{DefaultTimeout: 7 * time.Second})
		conn := dial(t, f.addr, rpc.ClientOptions{Token: token, DefaultTimeout: -1})
		if d := remaining(t, conn, t.Context()); d <= 0 || d > 7*time.Second {
			t.Errorf("server-side deadline = %v, want (0, 7s]", d)
		}
	})
	t.Run("server default is 30s", func(t *testing.T) {
		f := start(t, rpc.ServerOptions{})
		conn := dial(t, f.addr, rpc.ClientOptions{Token: token, DefaultTimeout: -1})
		if d := remaining(t, conn, t.Context()); d <= 25*time.Second || d > 30*time.Second {
			t.Errorf("server-side deadline = %v, want about 30s", d)
		}
	})
	t.Run("client adds its default", func(t *testing.T) {
		f := start(t, rpc.ServerOptions{DefaultTimeout: -1})
		conn := dial(t, f.addr, rpc.ClientOptions{Token: token, DefaultTimeout: 3 * time.Second})
		if d := remaining(t, conn, t.Context()); d <= 0 || d > 3*time.Second {
			t.Errorf("deadline = %v, want (0, 3s]", d)
		}
	})
	t.Run("caller's deadline wins", func(t *testing.T) {
		f := start(t, rpc.ServerOptions{DefaultTimeout: time.Second})
		conn := dial(t, f.addr, rpc.ClientOptions{Token: token, DefaultTimeout: time.Second})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if d := remaining(t, conn, ctx); d <= 50*time.Second {
			t.Errorf("deadline = %v, want the caller's minute", d)
		}
	})
	t.Run("none when disabled", func(t *testing.T) {
		f := start(t, rpc.ServerOptions{DefaultTimeout: -1})
		conn := dial(t, f.addr, rpc.ClientOptions{Token: token, DefaultTimeout: -1})
		if d := remaining(t, conn, t.Context()); d != -1 {
			t.Errorf("deadline = %v, want none", d)
		}
	})
}
