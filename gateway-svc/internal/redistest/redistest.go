// Package redistest connects tests to the machine's real Redis with a key
// prefix of their own, and removes the test's keys when it ends (never
// FLUSHALL: other tests share the server).
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Addr is the Redis the tests use: $HANGAR_TEST_REDIS_ADDR or 127.0.0.1:6379.
func Addr() string {
	if a := os.Getenv("HANGAR_TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// New returns a client and a unique key prefix; the test fails if Redis is
// not reachable.
func New(tb testing.TB) (*redis.Client, string) {
	tb.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: Addr()})
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("redis at %s: %v (the tests need a real Redis)", Addr(), err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	prefix := "hangar-test:" + hex.EncodeToString(b) + ":"
	tb.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
		_ = rdb.Close()
	})
	return rdb, prefix
}
