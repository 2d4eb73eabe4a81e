// Package lease keeps leases in Redis: a lease on a resource has a holder, a
// TTL renewed by heartbeat and a fencing token from a per-resource monotonic
// counter. A call carrying a token that is not the current lease's (an
// expired, released or superseded lease) is refused with FailedPrecondition.
//
// Counters are seeded from the clock (microseconds since the epoch) the
// first time they are used, so a Redis that restarts empty (no persistence)
// still issues tokens above every token it issued before, as long as fewer
// than one token per microsecond were taken; a holder of a lease lost in a
// restart is refused, never doubled.
package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/platform/redisconn"
)

// Reasons of the errors this package returns.
const (
	ReasonHeld        = "LEASE_HELD"
	ReasonExpired     = "LEASE_EXPIRED"
	ReasonStaleToken  = "STALE_FENCING_TOKEN"
	ReasonUnavailable = "LEASE_STORE_UNAVAILABLE"
)

// Lease is the right to use a resource until ExpiresAt.
type Lease struct {
	Resource  string
	Holder    string
	Token     uint64
	TTL       time.Duration
	ExpiresAt time.Time
}

// Manager takes and checks leases.
type Manager struct {
	rdb    redis.Cmdable
	prefix string
	now    func() time.Time
}

// New returns a manager whose keys start with prefix.
func New(rdb redis.Cmdable, prefix string, now func() time.Time) *Manager {
	if now == nil {
		now = time.Now
	}
	return &Manager{rdb: rdb, prefix: prefix, now: now}
}

func (m *Manager) leaseKey(r string) string { return m.prefix + "lease:" + r }
func (m *Manager) fenceKey(r string) string { return m.prefix + "fence:" + r }

// FenceTTL is how long a resource's token counter outlives its last
// acquire. Resources come and go (a sandbox id is used once), so counters
// must not stay forever; a counter that expired is seeded from the clock
// again, above every token it issued (fewer than one per microsecond).
// Tokens are checked against the lease itself, never the counter.
const FenceTTL = 24 * time.Hour

// The lease value is "<token>|<holder>". Tokens are formatted with %.0f:
// Lua numbers are doubles and their default formatting loses digits.
var acquireScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('GET', KEYS[1])}
end
redis.call('SET', KEYS[2], ARGV[3], 'NX')
local tok = string.format('%.0f', redis.call('INCR', KEYS[2]))
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('SET', KEYS[1], tok .. '|' .. ARGV[1], 'PX', ARGV[2])
return {1, tok}
`)

// renewScript: 1 renewed, -1 no lease, -2 another token holds it.
var renewScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then return {-1, ''} end
if string.sub(cur, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then return {-2, cur} end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, cur}
`)

var releaseScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then return {-1, ''} end
if string.sub(cur, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then return {-2, cur} end
redis.call('DEL', KEYS[1])
return {1, cur}
`)

func ms(d time.Duration) int64 {
	if d < time.Millisecond {
		return 1
	}
	return d.Milliseconds()
}

// unavailable is the answer to a failed lease store call: Unavailable (try
// again) when Redis could not be reached, else the error itself (an
// internal error: a reply this code did not expect is not an outage).
func unavailable(err error) error {
	if !redisconn.Unreachable(err) {
		return fmt.Errorf("lease store: %w", err)
	}
	return fault.Wrap(fault.KindUnavailable, ReasonUnavailable, "the lease store is unavailable", err)
}

func parseValue(v string) (uint64, string, error) {
	tok, holder, ok := strings.Cut(v, "|")
	if !ok {
		return 0, "", fmt.Errorf("malformed lease value %q", v)
	}
	n, err := strconv.ParseUint(tok, 10, 64)
	return n, holder, err
}

func scriptResult(res any) (int64, string, error) {
	arr, ok := res.([]any)
	if !ok || len(arr) != 2 {
		return 0, "", fmt.Errorf("unexpected script result %v", res)
	}
	code, _ := arr[0].(int64)
	s, _ := arr[1].(string)
	return code, s, nil
}

// Acquire takes the lease on resource, or fails with FailedPrecondition
// LEASE_HELD naming the current holder.
func (m *Manager) Acquire(ctx context.Context, resource, holder string, ttl time.Duration) (Lease, error) {
	if ttl <= 0 {
		return Lease{}, fault.InvalidArgument("ttl_seconds", "lease ttl must be positive")
	}
	seed := strconv.FormatInt(m.now().UnixMicro(), 10)
	now := m.now()
	res, err := acquireScript.Run(ctx, m.rdb, []string{m.leaseKey(resource), m.fenceKey(resource)}, holder, ms(ttl), seed, ms(max(FenceTTL, 2*ttl))).Result()
	if err != nil {
		return Lease{}, unavailable(err)
	}
	code, s, err := scriptResult(res)
	if err != nil {
		return Lease{}, unavailable(err)
	}
	if code != 1 {
		_, cur, _ := parseValue(s)
		return Lease{}, fault.FailedPrecondition(ReasonHeld, "%s is leased by %q", resource, cur)
	}
	tok, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return Lease{}, unavailable(err)
	}
	return Lease{Resource: resource, Holder: holder, Token: tok, TTL: ttl, ExpiresAt: now.Add(ttl)}, nil
}

func (m *Manager) refuse(resource string, token uint64, code int64, cur string) error {
	if code == -1 {
		return fault.FailedPrecondition(ReasonExpired, "the lease on %s with fencing token %d has expired or was released", resource, token)
	}
	curTok, _, _ := parseValue(cur)
	return fault.FailedPrecondition(ReasonStaleToken, "fencing token %d for %s is stale (current %d)", token, resource, curTok)
}

// Renew extends the lease held with token by ttl from now.
func (m *Manager) Renew(ctx context.Context, resource string, token uint64, ttl time.Duration) (Lease, error) {
	if ttl <= 0 {
		return Lease{}, fault.InvalidArgument("ttl_seconds", "lease ttl must be positive")
	}
	now := m.now()
	res, err := renewScript.Run(ctx, m.rdb, []string{m.leaseKey(resource)}, strconv.FormatUint(token, 10), ms(ttl)).Result()
	if err != nil {
		return Lease{}, unavailable(err)
	}
	code, cur, err := scriptResult(res)
	if err != nil {
		return Lease{}, unavailable(err)
	}
	if code != 1 {
		return Lease{}, m.refuse(resource, token, code, cur)
	}
	_, holder, _ := parseValue(cur)
	return Lease{Resource: resource, Holder: holder, Token: token, TTL: ttl, ExpiresAt: now.Add(ttl)}, nil
}

// Release ends the lease held with token.
func (m *Manager) Release(ctx context.Context, resource string, token uint64) (Lease, error) {
	res, err := releaseScript.Run(ctx, m.rdb, []string{m.leaseKey(resource)}, strconv.FormatUint(token, 10)).Result()
	if err != nil {
		return Lease{}, unavailable(err)
	}
	code, cur, err := scriptResult(res)
	if err != nil {
		return Lease{}, unavailable(err)
	}
	if code != 1 {
		return Lease{}, m.refuse(resource, token, code, cur)
	}
	_, holder, _ := parseValue(cur)
	return Lease{Resource: resource, Holder: holder, Token: token}, nil
}

// restoreScript puts a lease back unless one is there, and raises the
// counter to at least its token. ARGV: token, holder, lease ms, counter ms.
var restoreScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local cur = redis.call('GET', KEYS[2])
if not cur or tonumber(cur) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[4])
end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. ARGV[2], 'PX', ARGV[3])
return 1
`)

// Restore puts back a lease Redis lost (a Redis restarted empty, a
// failover that dropped writes) for the rest of its term, with its token
// and holder, unless a lease is there now: false then. Only the owner of
// the resource's authoritative record may call it (the sandbox service
// for its own sandboxes, which no one else can lease): the lease is not
// given to anyone new, it is the same lease kept, and the counter is
// raised to its token so tokens still only rise.
func (m *Manager) Restore(ctx context.Context, l Lease) (bool, error) {
	left := l.ExpiresAt.Sub(m.now())
	if left <= 0 || l.Token == 0 {
		return false, nil
	}
	tok := strconv.FormatUint(l.Token, 10)
	n, err := restoreScript.Run(ctx, m.rdb, []string{m.leaseKey(l.Resource), m.fenceKey(l.Resource)}, tok, l.Holder, ms(left), ms(max(FenceTTL, 2*l.TTL))).Int()
	if err != nil {
		return false, unavailable(err)
	}
	return n == 1, nil
}

// Get returns the current lease on resource; ok is false when none.
func (m *Manager) Get(ctx context.Context, resource string) (Lease, bool, error) {
	pipe := m.rdb.Pipeline()
	get := pipe.Get(ctx, m.leaseKey(resource))
	pttl := pipe.PTTL(ctx, m.leaseKey(resource))
	now := m.now()
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Lease{}, false, unavailable(err)
	}
	v, err := get.Result()
	if errors.Is(err, redis.Nil) {
		return Lease{}, false, nil
	}
	if err != nil {
		return Lease{}, false, unavailable(err)
	}
	tok, holder, err := parseValue(v)
	if err != nil {
		return Lease{}, false, unavailable(err)
	}
	l := Lease{Resource: resource, Holder: holder, Token: tok}
	if d, err := pttl.Result(); err == nil && d > 0 {
		l.ExpiresAt = now.Add(d)
	}
	return l, true, nil
}

// Check verifies token is the current lease's.
func (m *Manager) Check(ctx context.Context, resource string, token uint64) (Lease, error) {
	l, ok, err := m.Get(ctx, resource)
	if err != nil {
		return Lease{}, err
	}
	if !ok {
		return Lease{}, m.refuse(resource, token, -1, "")
	}
	if l.Token != token {
		return Lease{}, m.refuse(resource, token, -2, strconv.FormatUint(l.Token, 10)+"|"+l.Holder)
	}
	return l, nil
}

// Singleton guards work that must run once across replicas (pool refill,
// reaping): whoever holds the named lease does the work.
type Singleton struct {
	m      *Manager
	name   string
	holder string
	ttl    time.Duration
	token  uint64
}

// Singleton returns a guard for name held as holder (a replica id). The
// holder should call Hold at least every ttl/3.
func (m *Manager) Singleton(name, holder string, ttl time.Duration) *Singleton {
	return &Singleton{m: m, name: "singleton:" + name, holder: holder, ttl: ttl}
}

// Hold renews the lease if this replica holds it, else tries to take it.
// It reports whether this replica may do the work now. It is not safe for
// concurrent use; call it from one loop.
func (s *Singleton) Hold(ctx context.Context) (bool, error) {
	if s.token != 0 {
		if _, err := s.m.Renew(ctx, s.name, s.token, s.ttl); err == nil {
			return true, nil
		} else if !fault.Is(err, fault.KindFailedPrecondition) {
			return false, err
		}
		s.token = 0
	}
	l, err := s.m.Acquire(ctx, s.name, s.holder, s.ttl)
	if fault.Is(err, fault.KindFailedPrecondition) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	s.token = l.Token
	return true, nil
}

// Token is the fencing token of the current hold (0 when not held).
func (s *Singleton) Token() uint64 { return s.token }

// Release gives the lease up (on shutdown), so another replica takes over
// without waiting for the TTL.
func (s *Singleton) Release(ctx context.Context) error {
	if s.token == 0 {
		return nil
	}
	_, err := s.m.Release(ctx, s.name, s.token)
	s.token = 0
	if fault.Is(err, fault.KindFailedPrecondition) {
		return nil
	}
	return err
}
