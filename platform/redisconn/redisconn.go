// Package redisconn opens hangar's Redis connection: to a server given by
// URL, or, with no URL, to an embedded in-process miniredis.
//
// The embedded server listens on loopback, where a sandbox with full egress
// or any local user can reach it, so it requires a password (AUTH) like a
// real deployment should: one given to OpenEmbedded (`hangar up` keeps it
// under HANGAR_HOME and hands every service the URL with it) or a random one.
// A URL without a password is accepted with a warning.
//
// The embedded server is for a single-process hangar (development, a
// laptop): it keeps data in memory only. miniredis expires keys only when its
// clock is advanced, so Open advances it from a ticker; TTL-based leases then
// expire about on time (at most expiryTick late). It has no CONFIG and no
// keyspace notifications: do not build on expiry events.
package redisconn

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// pingTimeout bounds the reachability check in Open.
const pingTimeout = 5 * time.Second

// expiryTick is how often the embedded server's clock is advanced, and so
// the most a key outlives its TTL there.
const expiryTick = 100 * time.Millisecond

// Conn is an open Redis connection.
type Conn struct {
	// Client is the go-redis client; it is safe for concurrent use.
	Client *redis.Client

	addr     string
	password string // the embedded server's
	embedded *miniredis.Miniredis
	stop     chan struct{}
	ticking  sync.WaitGroup
	once     sync.Once
	closeErr error
}

// Open connects to the Redis server at url (redis://, rediss:// or unix://,
// as understood by redis.ParseURL) and checks it answers PING within 5s. With
// url "" it starts an embedded miniredis on 127.0.0.1 instead. Errors are one
// line starting with "HANGAR_REDIS_URL: ". ctx bounds the connection check
// only. A non-nil logger also receives go-redis's own (process-wide) log
// output.
func Open(ctx context.Context, url string, logger *slog.Logger) (*Conn, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	} else {
		// go-redis has one process-wide logger; route it to slog. With several
		// services in one process the last Open's logger receives it.
		redis.SetLogger(clientLogger{logger})
	}
	if url == "" {
		password, err := randomPassword()
		if err != nil {
			return nil, err
		}
		return openEmbedded(ctx, password, logger)
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		// ParseURL's errors name the problem without echoing the URL (which
		// may hold a password).
		return nil, fmt.Errorf("HANGAR_REDIS_URL: want a redis://, rediss:// or unix:// URL: %w", err)
	}
	client := redis.NewClient(opts)
	pingCtx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := client.Ping(pingCtx).Err(); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("HANGAR_REDIS_URL: cannot reach redis at %s: %w", opts.Addr, err)
	}
	logger.LogAttrs(ctx, slog.LevelInfo, "redis connected",
		slog.String("addr", opts.Addr), slog.Int("db", opts.DB))
	if opts.Password == "" {
		warnNoPassword(ctx, logger, opts.Addr)
	}
	return &Conn{Client: client, addr: opts.Addr}, nil
}

// warned holds the addresses already warned about: with several services in
// one process (hangar up) each opens the same URL, and one warning says it.
var warned sync.Map

func warnNoPassword(ctx context.Context, logger *slog.Logger, addr string) {
	if _, dup := warned.LoadOrStore(addr, true); dup {
		return
	}
	logger.LogAttrs(ctx, slog.LevelWarn, "HANGAR_REDIS_URL has no password",
		slog.String("addr", addr),
		slog.String("risk", "anyone who reaches the server can forge run tokens and edit leases, holds and budgets"),
		slog.String("fix", "set requirepass (or an ACL user) on the server and use redis://:PASSWORD@host:port/db"))
}

// OpenEmbedded starts an embedded miniredis on 127.0.0.1 that refuses every
// command until a client authenticates with password (NOAUTH), and returns a
// connection authenticated with it. password must not be empty.
func OpenEmbedded(ctx context.Context, password string, logger *slog.Logger) (*Conn, error) {
	if password == "" {
		return nil, errors.New("redisconn: the embedded redis needs a password")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return openEmbedded(ctx, password, logger)
}

func randomPassword() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("HANGAR_REDIS_URL: generating the embedded redis password: %w", err)
	}
	return hex.EncodeToString(b), nil
}

func openEmbedded(ctx context.Context, password string, logger *slog.Logger) (*Conn, error) {
	mr := miniredis.NewMiniRedis()
	mr.RequireAuth(password)
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("HANGAR_REDIS_URL: start embedded redis: %w", err)
	}
	c := &Conn{
		Client:   redis.NewClient(&redis.Options{Addr: mr.Addr(), Password: password}),
		addr:     mr.Addr(),
		password: password,
		embedded: mr,
		stop:     make(chan struct{}),
	}
	c.ticking.Add(1)
	go c.advanceClock(time.Now)
	logger.LogAttrs(ctx, slog.LevelInfo, "redis embedded", slog.String("addr", mr.Addr()))
	return c, nil
}

// advanceClock moves miniredis's clock forward by the real time elapsed, so
// that TTLs run out.
func (c *Conn) advanceClock(now func() time.Time) {
	defer c.ticking.Done()
	t := time.NewTicker(expiryTick)
	defer t.Stop()
	last := now()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			n := now()
			if elapsed := n.Sub(last); elapsed > 0 {
				c.embedded.FastForward(elapsed)
			}
			last = n
		}
	}
}

// Embedded reports whether the connection is to the embedded server.
func (c *Conn) Embedded() bool { return c.embedded != nil }

// Addr returns the server's address (host:port or socket path).
func (c *Conn) Addr() string { return c.addr }

// URL returns a redis:// URL for the embedded server, password included, for
// other services of the process to connect with; "" for a server given by
// URL. It holds a secret: pass it on in memory, never log it.
func (c *Conn) URL() string {
	if c.embedded == nil {
		return ""
	}
	u := url.URL{Scheme: "redis", User: url.UserPassword("", c.password), Host: c.addr}
	return u.String()
}

// Close closes the client and, for the embedded server, stops its clock and
// the server. It is safe to call more than once.
func (c *Conn) Close() error {
	c.once.Do(func() {
		err := c.Client.Close()
		if c.embedded != nil {
			close(c.stop)
			c.ticking.Wait()
			c.embedded.Close()
		}
		if err != nil && !errors.Is(err, redis.ErrClosed) {
			c.closeErr = fmt.Errorf("redis: close: %w", err)
		}
	})
	return c.closeErr
}

// clientLogger adapts go-redis's printf-style logging (pool and reconnect
// warnings) to slog with a static message.
type clientLogger struct{ logger *slog.Logger }

func (l clientLogger) Printf(ctx context.Context, format string, v ...any) {
	l.logger.LogAttrs(ctx, slog.LevelWarn, "redis client warning",
		slog.String("detail", fmt.Sprintf(format, v...)))
}
