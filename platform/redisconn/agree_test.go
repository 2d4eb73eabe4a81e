package redisconn_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/hangar-dev/hangar/platform/redisconn"
)

// TestAgree: the first replica sets a setting, one with the same value
// starts, one with another value is refused in one line naming it; an
// embedded Redis agrees with anything.
func TestAgree(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func() *redisconn.Conn {
		c, err := redisconn.Open(ctx, "redis://"+realRedis+"/0", nil)
		if err != nil {
			t.Skipf("no redis-server at %s: %v", realRedis, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "HANGAR_TEST_AGREE_" + strings.ToUpper(hex.EncodeToString(b))
	first, same, other := open(), open(), open()
	t.Cleanup(func() { _ = first.Client.Del(context.Background(), "hangar:config:"+name).Err() })
	if err := first.Agree(ctx, []redisconn.Setting{{Name: name, Value: "key-one"}}); err != nil {
		t.Fatalf("first replica: %v", err)
	}
	if err := same.Agree(ctx, []redisconn.Setting{{Name: name, Value: "key-one"}}); err != nil {
		t.Fatalf("a replica with the same value: %v", err)
	}
	err := other.Agree(ctx, []redisconn.Setting{{Name: name, Value: "key-two"}})
	if err == nil || !strings.HasPrefix(err.Error(), name+" differs from the other replicas'") || strings.Contains(err.Error(), "key-") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("a replica with another value: %v, want one line naming %s and not the values", err, name)
	}
	got, err := first.Client.Get(ctx, "hangar:config:"+name).Result()
	if err != nil || strings.Contains(got, "key-one") {
		t.Fatalf("stored %q (%v): want a hash, never the value", got, err)
	}
	embedded, err := redisconn.Open(ctx, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer embedded.Close()
	if err := embedded.Agree(ctx, []redisconn.Setting{{Name: name, Value: "key-three"}}); err != nil {
		t.Fatalf("embedded: %v", err)
	}
}
