package redisconn

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"
)

// Setting is one setting every replica sharing a Redis must agree on (the
// API token, the vault key, the checkpoint store, the session database),
// by its variable's name and value. Only a hash of the value is written.
type Setting struct {
	Name, Value string
}

// agreeTTL is how long a setting's hash outlives the last live replica
// that renews it: once every replica that used the old value has stopped,
// a new value may start.
const agreeTTL = time.Minute

// agreeKey holds the hash of a setting.
func agreeKey(name string) string { return "hangar:config:" + name }

// agreeScript takes KEYS[1] for ARGV[1] (a hash) with a TTL of ARGV[2] ms,
// or renews it when it holds that hash; it returns the hash found.
var agreeScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
return cur`)

// digest is what the replicas compare: a hash of the value, keyed by the
// setting's name, so the key holds nothing usable.
func digest(s Setting) string {
	sum := sha256.Sum256([]byte("hangar-config\x00" + s.Name + "\x00" + s.Value))
	return hex.EncodeToString(sum[:16])
}

// Agree checks that this replica's settings are those of the other
// replicas on c (the first to start sets them), and renews them while ctx
// lasts. A setting that differs is an error in one line naming it, before
// the service serves anything. An embedded Redis has no other replicas.
func (c *Conn) Agree(ctx context.Context, settings []Setting) error {
	if c.embedded != nil {
		return nil
	}
	sort.Slice(settings, func(i, j int) bool { return settings[i].Name < settings[j].Name })
	renew := func(ctx context.Context) error {
		for _, s := range settings {
			want := digest(s)
			got, err := agreeScript.Run(ctx, c.Client, []string{agreeKey(s.Name)}, want, agreeTTL.Milliseconds()).Text()
			if err != nil {
				return fmt.Errorf("HANGAR_REDIS_URL: comparing %s with the other replicas: %w", s.Name, err)
			}
			if got != want {
				return fmt.Errorf("%s differs from the other replicas' on this Redis: give every replica the same %s (or stop those replicas first)", s.Name, s.Name)
			}
		}
		return nil
	}
	if err := renew(ctx); err != nil {
		return err
	}
	go func() {
		t := time.NewTicker(agreeTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = renew(ctx)
			}
		}
	}()
	return nil
}
