// Package redistest gives tests a Redis: the machine's real redis-server
// (127.0.0.1:6379, keys under a unique prefix, removed afterwards; never
// FLUSHALL), an embedded miniredis, or a private redis-server that can be
// restarted.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// RealAddr is the machine's redis-server.
const RealAddr = "127.0.0.1:6379"

// Backend is one Redis to run a test body against.
type Backend struct {
	Name   string
	Client *redis.Client
	Prefix string
	// Mini is set for the embedded backend.
	Mini *miniredis.Miniredis
}

// Expire makes every key with a TTL of at most d expire: miniredis's clock
// is advanced; on a real server it waits (on the key, with a deadline)
// until key is gone.
func (b *Backend) Expire(t testing.TB, key string, d time.Duration) {
	t.Helper()
	if b.Mini != nil {
		b.Mini.FastForward(d)
		return
	}
	deadline := time.Now().Add(d + 5*time.Second)
	for {
		n, err := b.Client.Exists(context.Background(), key).Result()
		if err == nil && n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %s did not expire within %v", key, d)
		}
		<-time.After(time.Millisecond)
	}
}

// Prefix returns a key prefix unique to this test.
func Prefix(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return "hangar:test:" + name + ":" + hex.EncodeToString(b[:]) + ":"
}

// Real connects to the machine's redis-server and removes the test's keys
// when it ends.
func Real(t testing.TB) *Backend {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: RealAddr, PoolSize: 64})
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("the real redis-server at %s is required: %v", RealAddr, err)
	}
	prefix := Prefix(t)
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		c.Close()
	})
	return &Backend{Name: "real", Client: c, Prefix: prefix}
}

// Mini starts an embedded miniredis.
func Mini(t testing.TB) *Backend {
	t.Helper()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	return &Backend{Name: "miniredis", Client: c, Prefix: Prefix(t), Mini: m}
}

// Each runs body against the real server and miniredis.
func Each(t *testing.T, body func(t *testing.T, b *Backend)) {
	t.Run("real", func(t *testing.T) { body(t, Real(t)) })
	t.Run("miniredis", func(t *testing.T) { body(t, Mini(t)) })
}

// Server is a private redis-server without persistence.
type Server struct {
	Port int
	dir  string
	cmd  *exec.Cmd
}

// Addr is host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// StartServer starts a private redis-server on a free port.
func StartServer(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &Server{Port: port, dir: t.TempDir()}
	s.start(t)
	t.Cleanup(func() { s.stop() })
	return s
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	s.cmd = exec.Command("redis-server", "--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log"))
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			t.Fatalf("redis-server on %d not ready: %v\n%s", s.Port, err, log)
		}
		<-time.After(5 * time.Millisecond)
	}
}

func (s *Server) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// Restart kills the server and starts an empty one on the same port.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.stop()
	s.start(t)
}

// String describes the server.
func (s *Server) String() string { return fmt.Sprintf("redis-server:%d", s.Port) }
