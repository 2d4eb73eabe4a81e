package sandboxexec

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// ServiceCallKey is the metadata key a hangar service sets on the calls it
// makes on a sandbox for its own work (running a turn, a check, capturing a
// checkpoint). The sandbox service does not count those as someone using
// the sandbox (hangar.sandbox.v1.SandboxUse): only callers' own commands,
// terminals and file reads and writes keep a session open.
const ServiceCallKey = "x-hangar-service-call"

// ServiceCallDialOptions mark every call made on the connection as a
// service's own.
func ServiceCallDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(markServiceCall(ctx), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(markServiceCall(ctx), desc, cc, method, opts...)
		}),
	}
}

func markServiceCall(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, ServiceCallKey, "1")
}

// IsServiceCall says an incoming call was marked as a service's own.
func IsServiceCall(ctx context.Context) bool {
	return len(metadata.ValueFromIncomingContext(ctx, ServiceCallKey)) > 0
}
