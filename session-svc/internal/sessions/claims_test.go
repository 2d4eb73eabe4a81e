package sessions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/redis/go-redis/v9"
)

// A claim is released only by its holder.
func TestClaimsRelease(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	t.Cleanup(func() { _ = client.Close() })
	ctx := context.Background()
	if err := client.Ping(ctx).Err(); err != nil {
		t.Skipf("no Redis at 127.0.0.1:6379: %v", err)
	}
	var raw [6]byte
	_, _ = rand.Read(raw[:])
	prefix := "test:claims:" + hex.EncodeToString(raw[:]) + ":"
	t.Cleanup(func() { client.Del(context.Background(), prefix+"conv") })
	c := NewClaims(client, prefix)
	if h, err := c.Claim(ctx, "conv", "older"); err != nil || h != "older" {
		t.Fatalf("claim = %q, %v", h, err)
	}
	if err := c.Release(ctx, "conv", "younger"); err != nil {
		t.Fatal(err)
	}
	if h, _ := c.Holder(ctx, "conv"); h != "older" {
		t.Fatalf("a non-holder's release dropped the claim: holder %q", h)
	}
	if err := c.Release(ctx, "conv", "older"); err != nil {
		t.Fatal(err)
	}
	if h, _ := c.Holder(ctx, "conv"); h != "" {
		t.Fatalf("holder after its release: %q", h)
	}
	if n, _ := client.Exists(ctx, prefix+"conv").Result(); n != 0 {
		t.Error("the claim's key stays in Redis")
	}
	if h, err := c.Claim(ctx, "conv", "younger"); err != nil || h != "younger" {
		t.Fatalf("claim after release = %q, %v", h, err)
	}
}
