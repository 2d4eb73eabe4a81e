// Package redisconn opens hangar's Redis connection: to a server given by
// URL, or, with no URL, to an embedded in-process miniredis.
//
// The embedded server is for a single-process hangar (development, a
// laptop): it keeps data in memory only. miniredis expires keys only when its
// clock is advanced, so Open advances it from a ticker; TTL-based leases then
// expire about on time (at most expiryTick late). It has no CONFIG and no
// keyspace notifications: do not build on expiry events.
package redisconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
		return openEmbedded(ctx, logger)
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
	return &Conn{Client: client, addr: opts.Addr}, nil
}

func openEmbedded(ctx context.Context, logger *slog.Logger) (*Conn, error) {
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("HANGAR_REDIS_URL: start embedded redis: %w", err)
	}
	c := &Conn{
		Client:   redis.NewClient(&redis.Options{Addr: mr.Addr()}),
		addr:     mr.Addr(),
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
