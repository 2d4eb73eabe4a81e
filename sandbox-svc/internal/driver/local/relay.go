package local

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"
)

// Gateway is the one destination an egress-none sandbox may still reach.
// The relay listens on Listen inside the sandbox's namespace and forwards
// every connection to Target, dialled from the host's namespace.
type Gateway struct {
	// Listen is a loopback address inside the sandbox, e.g. 127.0.0.1:4180.
	Listen string
	// Target is "host:port" (TCP) or "unix:/path/to.sock".
	Target string
}

// ParseGateway turns a single address into a Gateway: a TCP address is
// listened on at the same address inside (so the same base URL works with
// egress full and none); a unix socket gets DefaultRelayListen.
func ParseGateway(addr string) Gateway {
	if addr == "" {
		return Gateway{}
	}
	if strings.HasPrefix(addr, "unix:") {
		return Gateway{Listen: DefaultRelayListen, Target: addr}
	}
	return Gateway{Listen: addr, Target: addr}
}

// DefaultRelayListen is where a relay to a unix-socket gateway listens.
const DefaultRelayListen = "127.0.0.1:4180"

func (g Gateway) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	if path, ok := strings.CutPrefix(g.Target, "unix:"); ok {
		return d.DialContext(ctx, "unix", path)
	}
	return d.DialContext(ctx, "tcp", g.Target)
}

// relay forwards connections accepted on ln to the gateway.
type relay struct {
	ln     net.Listener
	gw     Gateway
	logger *slog.Logger
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func startRelay(ln net.Listener, gw Gateway, logger *slog.Logger) *relay {
	r := &relay{ln: ln, gw: gw, logger: logger, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.serve()
	return r
}

func (r *relay) serve() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.track(c) {
			c.Close()
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer r.untrack(c)
			r.forward(c)
		}()
	}
}

func (r *relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	c.Close()
}

// relayDialTimeout bounds the dial to the gateway (it is local).
const relayDialTimeout = 5 * time.Second

func (r *relay) forward(in net.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), relayDialTimeout)
	out, err := r.gw.dial(ctx)
	cancel()
	if err != nil {
		r.logger.Warn("gateway relay dial failed", slog.String("target", r.gw.Target), slog.Any("error", err))
		return
	}
	if !r.track(out) {
		out.Close()
		return
	}
	defer r.untrack(out)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}

func (r *relay) Close() error {
	err := r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
