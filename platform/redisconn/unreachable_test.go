package redisconn_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hangar-dev/hangar/platform/redisconn"
)

func TestUnreachable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	down := redis.NewClient(&redis.Options{Addr: closed, MaxRetries: -1, DialTimeout: time.Second})
	defer down.Close()
	up := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer up.Close()
	key := fmt.Sprintf("test:unreachable:%d", time.Now().UnixNano())
	if err := up.Set(ctx, key, "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	defer up.Del(ctx, key)
	closedClient := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	closedClient.Close()

	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"connection refused", fmt.Errorf("get run: %w", down.Get(ctx, key).Err()), true},
		{"client closed", closedClient.Get(ctx, key).Err(), true},
		{"wrong type", up.LPush(ctx, key, "y").Err(), false},
		{"script error", up.Eval(ctx, "return redis.error_reply('NOPE')", nil).Err(), false},
		{"missing key", up.Get(ctx, key+":none").Err(), false},
		{"plain", errors.New("decode run: bad json"), false},
	}
	for _, tt := range tests {
		if got := redisconn.Unreachable(tt.err); got != tt.want {
			t.Errorf("%s: Unreachable(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}
