package redisconn_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/hangar-dev/hangar/platform/logging"
	"github.com/hangar-dev/hangar/platform/redisconn"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const realRedis = "127.0.0.1:6379"

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

// keyPrefix is unique per test run so tests never touch other data.
func keyPrefix(t *testing.T) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "test:" + t.Name() + ":" + hex.EncodeToString(b) + ":"
}

func TestRedis(t *testing.T) {
	backends := []struct {
		name     string
		url      string
		embedded bool
	}{
		{"real", "redis://" + realRedis + "/0", false},
		{"embedded", "", true},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			if !b.embedded {
				c, err := net.DialTimeout("tcp", realRedis, time.Second)
				if err != nil {
					t.Skipf("no redis-server at %s: %v", realRedis, err)
				}
				_ = c.Close()
			}
			conn, err := redisconn.Open(t.Context(), b.url, nil)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			t.Cleanup(func() {
				if err := conn.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			if conn.Embedded() != b.embedded {
				t.Fatalf("Embedded() = %v, want %v", conn.Embedded(), b.embedded)
			}
			exercise(t, conn.Client)
		})
	}
}

// exercise is the one test body both backends must pass.
func exercise(t *testing.T, rdb *redis.Client) {
	ctx := t.Context()
	p := keyPrefix(t)
	var keys []string
	key := func(name string) string {
		keys = append(keys, p+name)
		return p + name
	}
	t.Cleanup(func() {
		if len(keys) > 0 {
			_ = rdb.Del(context.Background(), keys...).Err()
		}
	})

	t.Run("set get", func(t *testing.T) {
		k := key("plain")
		if err := rdb.Set(ctx, k, "v1", 0).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
		if got, err := rdb.Get(ctx, k).Result(); err != nil || got != "v1" {
			t.Fatalf("GET = %q, %v", got, err)
		}
		if _, err := rdb.Get(ctx, key("missing")).Result(); !errors.Is(err, redis.Nil) {
			t.Fatalf("GET missing = %v, want redis.Nil", err)
		}
	})

	t.Run("lease with SET NX PX", func(t *testing.T) {
		k := key("lease")
		ok, err := rdb.SetNX(ctx, k, "owner-a", 300*time.Millisecond).Result()
		if err != nil || !ok {
			t.Fatalf("first SET NX = %v, %v; want acquired", ok, err)
		}
		ok, err = rdb.SetNX(ctx, k, "owner-b", 300*time.Millisecond).Result()
		if err != nil || ok {
			t.Fatalf("second SET NX = %v, %v; want refused while held", ok, err)
		}
		if pttl, err := rdb.PTTL(ctx, k).Result(); err != nil || pttl <= 0 || pttl > 300*time.Millisecond {
			t.Fatalf("PTTL = %v, %v", pttl, err)
		}
		waitFor(t, "the lease to expire", 5*time.Second, func() bool {
			n, err := rdb.Exists(ctx, k).Result()
			return err == nil && n == 0
		})
		ok, err = rdb.SetNX(ctx, k, "owner-b", time.Minute).Result()
		if err != nil || !ok {
			t.Fatalf("SET NX after expiry = %v, %v; want acquired", ok, err)
		}
	})

	t.Run("lua compare and delete", func(t *testing.T) {
		release := redis.NewScript(`
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0`)
		k := key("owned")
		if err := rdb.Set(ctx, k, "owner-a", time.Minute).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
		if n, err := release.Run(ctx, rdb, []string{k}, "owner-b").Int(); err != nil || n != 0 {
			t.Fatalf("release by non-owner = %d, %v; want 0", n, err)
		}
		if n, err := release.Run(ctx, rdb, []string{k}, "owner-a").Int(); err != nil || n != 1 {
			t.Fatalf("release by owner = %d, %v; want 1", n, err)
		}
		if n, err := rdb.Exists(ctx, k).Result(); err != nil || n != 0 {
			t.Fatalf("EXISTS after release = %d, %v", n, err)
		}
		// EVAL too (not only EVALSHA through Script.Run).
		if got, err := rdb.Eval(ctx, `return ARGV[1] .. "!"`, nil, "hi").Text(); err != nil || got != "hi!" {
			t.Fatalf("EVAL = %q, %v", got, err)
		}
	})

	t.Run("incr fencing counter", func(t *testing.T) {
		k := key("fence")
		var last int64
		for range 5 {
			n, err := rdb.Incr(ctx, k).Result()
			if err != nil {
				t.Fatalf("INCR: %v", err)
			}
			if n <= last {
				t.Fatalf("INCR = %d after %d, want monotonic", n, last)
			}
			last = n
		}
		if last != 5 {
			t.Fatalf("counter = %d, want 5", last)
		}
	})
}

func TestOpenErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, url, wantPrefix string
	}{
		{"unreachable", "redis://127.0.0.1:1/0", "HANGAR_REDIS_URL: cannot reach redis at 127.0.0.1:1: "},
		{"bad scheme", "http://127.0.0.1:6379", "HANGAR_REDIS_URL: want a redis://, rediss:// or unix:// URL: "},
		{"missing socket", "unix:///nonexistent/redis.sock", "HANGAR_REDIS_URL: cannot reach redis at /nonexistent/redis.sock: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn, err := redisconn.Open(t.Context(), tt.url, nil)
			if err == nil {
				_ = conn.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.HasPrefix(err.Error(), tt.wantPrefix) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error = %q, want one line starting %q", err, tt.wantPrefix)
			}
		})
	}
}

func TestOpenDoesNotLeakPassword(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	_, err := redisconn.Open(t.Context(), "redis://user:hunter2@127.0.0.1:1/0", logging.New(&logs, "debug", "json"))
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error = %v", err)
	}
	if strings.Contains(logs.String(), "hunter2") {
		t.Errorf("logs leak the password: %s", logs.String())
	}
	if !strings.Contains(logs.String(), `"msg":"redis client warning"`) {
		t.Errorf("go-redis output not routed to slog: %q", logs.String())
	}
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

func TestCloseTwice(t *testing.T) {
	t.Parallel()
	conn, err := redisconn.Open(t.Context(), "", nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if conn.Addr() == "" || !strings.HasPrefix(conn.Addr(), "127.0.0.1:") {
		t.Errorf("Addr = %q", conn.Addr())
	}
	if err := conn.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := conn.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestEmbeddedRequiresPassword checks that the embedded server refuses
// clients without the password (NOAUTH) or with a wrong one, and serves the
// connection Open returns and clients using its URL.
func TestEmbeddedRequiresPassword(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		open func() (*redisconn.Conn, error)
	}{
		{"random password", func() (*redisconn.Conn, error) { return redisconn.Open(t.Context(), "", nil) }},
		{"given password", func() (*redisconn.Conn, error) {
			return redisconn.OpenEmbedded(t.Context(), "s3cret-for-test", nil)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := tt.open()
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			ctx := t.Context()

			anonymous := redis.NewClient(&redis.Options{Addr: conn.Addr()})
			defer anonymous.Close()
			if err := anonymous.Set(ctx, keyPrefix(t)+"forged", "run", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOAUTH") {
				t.Errorf("SET without a password = %v, want NOAUTH", err)
			}
			wrong := redis.NewClient(&redis.Options{Addr: conn.Addr(), Password: "guess"})
			defer wrong.Close()
			if err := wrong.Ping(ctx).Err(); err == nil {
				t.Error("PING with a wrong password succeeded")
			}

			if err := conn.Client.Ping(ctx).Err(); err != nil {
				t.Errorf("PING on the connection Open returned: %v", err)
			}
			other, err := redisconn.Open(ctx, conn.URL(), nil)
			if err != nil {
				t.Fatalf("Open(URL()): %v", err)
			}
			defer other.Close()
			k := keyPrefix(t) + "shared"
			if err := other.Client.Set(ctx, k, "v", 0).Err(); err != nil {
				t.Fatalf("SET through URL(): %v", err)
			}
			if got, err := conn.Client.Get(ctx, k).Result(); err != nil || got != "v" {
				t.Errorf("GET = %q, %v; want the value set through URL()", got, err)
			}
		})
	}
	if _, err := redisconn.OpenEmbedded(t.Context(), "", nil); err == nil {
		t.Error("OpenEmbedded with an empty password succeeded")
	}
}

// TestURLWithoutPasswordWarns checks the warning at start for a server given
// without credentials, once per address, and none with a password.
func TestURLWithoutPasswordWarns(t *testing.T) {
	c, err := net.DialTimeout("tcp", realRedis, time.Second)
	if err != nil {
		t.Skipf("no redis-server at %s: %v", realRedis, err)
	}
	_ = c.Close()
	// "localhost" rather than 127.0.0.1: an address no other test opens, so
	// the once-per-address warning is this test's.
	const url = "redis://localhost:6379/0"
	var logs syncBuffer
	logger := logging.New(&logs, "info", "json")
	for range 2 {
		conn, err := redisconn.Open(t.Context(), url, logger)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		_ = conn.Close()
	}
	if n := strings.Count(logs.String(), `"msg":"HANGAR_REDIS_URL has no password"`); n != 1 {
		t.Errorf("warnings = %d, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), `"level":"WARN"`) || !strings.Contains(logs.String(), `"addr":"localhost:6379"`) {
		t.Errorf("warning lacks its level or address:\n%s", logs.String())
	}

	// With a password, no warning (the embedded server stands in for one
	// with requirepass).
	embedded, err := redisconn.OpenEmbedded(t.Context(), "pw", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer embedded.Close()
	logs = syncBuffer{}
	conn, err := redisconn.Open(t.Context(), embedded.URL(), logger)
	if err != nil {
		t.Fatalf("Open(with password): %v", err)
	}
	_ = conn.Close()
	if strings.Contains(logs.String(), "no password") {
		t.Errorf("warned with a password:\n%s", logs.String())
	}
}
