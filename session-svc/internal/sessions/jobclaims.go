package sessions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// JobClaims keep one runner per job among session-svc replicas sharing a
// database: `<prefix><job id>` holds the runner's id with a TTL the runner
// renews. A runner that stops (drain, crash) lets its claims lapse, or
// drops them, and another replica's sweep claims the job and picks it up.
//
// A Redis restarted empty forgets every claim: a runner renewing its claim
// takes it again when no one else has (the key is set anew), and gives the
// job up when another runner got there first, so two runners overlap for
// at most one renewal period.
type JobClaims struct {
	rdb    *redis.Client
	prefix string
	// runner identifies this process.
	runner string
}

// NewJobClaims returns claims kept under prefix, for this process.
func NewJobClaims(rdb *redis.Client, prefix string) *JobClaims {
	var raw [8]byte
	_, _ = rand.Read(raw[:])
	return &JobClaims{rdb: rdb, prefix: prefix, runner: hex.EncodeToString(raw[:])}
}

// claimScript sets KEYS[1] to ARGV[1] for ARGV[2] ms unless another runner
// holds it. 1: ours now; 0: another's.
var claimScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0`)

// dropScript deletes KEYS[1] if ARGV[1] holds it.
var dropScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// Claim takes or renews the job's claim for ttl; false when another runner
// holds it.
func (c *JobClaims) Claim(ctx context.Context, job string, ttl time.Duration) (bool, error) {
	n, err := claimScript.Run(ctx, c.rdb, []string{c.prefix + job}, c.runner, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("claim job %s: %w", job, err)
	}
	return n == 1, nil
}

// Drop gives the job's claim up, if this runner holds it.
func (c *JobClaims) Drop(ctx context.Context, job string) error {
	if err := dropScript.Run(ctx, c.rdb, []string{c.prefix + job}, c.runner).Err(); err != nil {
		return fmt.Errorf("drop job claim %s: %w", job, err)
	}
	return nil
}
