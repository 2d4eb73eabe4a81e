package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hangar-dev/hangar/platform/rpc"
)

// ownConn is a client of this service's own listener, for the dashboard's
// terminals (their session calls pass the same interceptors as any other
// caller's). It is dialed once Run has the listener; a call before that
// waits for it.
type ownConn struct {
	token string
	ready chan struct{}
	once  sync.Once
	conn  *grpc.ClientConn
	err   error
}

func newOwnConn(token string) *ownConn {
	return &ownConn{token: token, ready: make(chan struct{})}
}

// dial connects to lis; only the first call does anything.
func (c *ownConn) dial(lis net.Addr) {
	c.once.Do(func() {
		c.conn, c.err = rpc.Dial(loopbackTarget(lis), rpc.ClientOptions{Token: c.token})
		close(c.ready)
	})
}

// fail makes every call fail (the service stopped before it served).
func (c *ownConn) fail() {
	c.once.Do(func() {
		c.err = errors.New("session-svc is not serving")
		close(c.ready)
	})
}

func (c *ownConn) get(ctx context.Context) (*grpc.ClientConn, error) {
	select {
	case <-c.ready:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if c.err != nil {
		return nil, status.Error(codes.Unavailable, "session-svc is not serving")
	}
	return c.conn, nil
}

func (c *ownConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	conn, err := c.get(ctx)
	if err != nil {
		return err
	}
	return conn.Invoke(ctx, method, args, reply, opts...)
}

func (c *ownConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	conn, err := c.get(ctx)
	if err != nil {
		return nil, err
	}
	return conn.NewStream(ctx, desc, method, opts...)
}

func (c *ownConn) Close() error {
	c.fail()
	if c.conn != nil {
		return c.conn.Close()
	}
	return nil
}

// loopbackTarget is addr to dial from this host: an unspecified address
// (":7401") is reached on loopback.
func loopbackTarget(addr net.Addr) string {
	a, ok := addr.(*net.TCPAddr)
	if !ok {
		if u, ok := addr.(*net.UnixAddr); ok {
			if name, ok := strings.CutPrefix(u.Name, "@"); ok {
				return "unix-abstract:" + name
			}
			return "unix:" + u.Name
		}
		return addr.String()
	}
	switch {
	case a.IP == nil || a.IP.Equal(net.IPv4zero):
		return net.JoinHostPort("127.0.0.1", fmt.Sprint(a.Port))
	case a.IP.IsUnspecified():
		return net.JoinHostPort("localhost", fmt.Sprint(a.Port))
	}
	return a.String()
}
