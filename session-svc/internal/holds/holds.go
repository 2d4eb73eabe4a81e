// Package holds keeps the holds that keep a session open, in Redis.
//
// A hold has an owner, a kind and an expiry that its holder renews (a
// heartbeat), so a crashed holder cannot pin a session forever, and since a
// hold is only Redis data a control-plane restart does not drop it: a job
// renews its hold from wherever it runs next.
//
// Per session there are three keys under the prefix, sharing a hash tag:
// a sorted set of hold IDs scored by expiry, a hash of each hold's details,
// and the time the session last stopped being held. Expiry is judged against
// the injected clock inside Lua scripts (a hold is live while expires_at >
// now); Redis key TTLs are not used, so the embedded miniredis behaves the
// same as a real server. Expired holds are removed lazily by whichever call
// sees them first, which also records their expiry as the end of the hold.
//
// Times are kept with microsecond precision.
package holds

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotFound: the hold does not exist (never did, was released or expired).
var ErrNotFound = errors.New("hold not found")

// Kinds of hold.
const (
	// KindTurn: a running turn.
	KindTurn = "turn"
	// KindRunAgent: a run_agent started in the sandbox.
	KindRunAgent = "run_agent"
	// KindTerminal: an attached terminal.
	KindTerminal = "terminal"
	// KindCommand: a hangar command using the sandbox (exec, files, reading
	// terminals, following an agent), for its whole run.
	KindCommand = "command"
	// KindJob: a job's turn, including delivery; survives a restart.
	KindJob = "job"
)

var kinds = map[string]bool{KindTurn: true, KindRunAgent: true, KindTerminal: true, KindCommand: true, KindJob: true}

// Hold is one live reason a session stays open.
type Hold struct {
	ID          string
	Session     string
	Owner       string
	Kind        string
	Description string
	AcquiredAt  time.Time
	ExpiresAt   time.Time
}

// Holds is the hold table. It is safe for concurrent use; several Holds on
// the same Redis and prefix see the same holds.
type Holds struct {
	client *redis.Client
	prefix string
	now    func() time.Time
}

// New returns holds kept in client under keys starting with prefix (e.g.
// "hangar:session:"), judged against now (nil is time.Now).
func New(client *redis.Client, prefix string, now func() time.Time) *Holds {
	if now == nil {
		now = time.Now
	}
	return &Holds{client: client, prefix: prefix, now: now}
}

// details is what the hash stores per hold; the expiry is the set's score.
type details struct {
	Owner       string `json:"owner"`
	Kind        string `json:"kind"`
	Description string `json:"description,omitempty"`
	AcquiredAt  int64  `json:"acquired_at"` // Unix microseconds
}

// keys returns the session's keys: the expiry set, the details hash and the
// last-released time. The hash tag keeps them in one cluster slot.
func (h *Holds) keys(session string) []string {
	base := h.prefix + "holds:{" + session + "}:"
	return []string{base + "expiry", base + "details", base + "released"}
}

// reapLua removes holds expired at ARGV[1] (micros) and moves the released
// time (KEYS[3]) to the latest of their expiries. Every script starts with
// it. Scores and times travel as the decimal strings Redis prints, never as
// Lua numbers, so no precision is lost.
const reapLua = `
local now = ARGV[1]
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES')
if #expired > 0 then
  local latest = redis.call('GET', KEYS[3])
  for i = 1, #expired, 2 do
    redis.call('HDEL', KEYS[2], expired[i])
    if latest == false or tonumber(expired[i + 1]) > tonumber(latest) then
      latest = expired[i + 1]
    end
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('SET', KEYS[3], latest)
end
`

// ARGV: now, id, expires, details.
var acquireScript = redis.NewScript(reapLua + `
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4])
return 1
`)

// ARGV: now, id, expires. Returns the details, or false if not live.
var renewScript = redis.NewScript(reapLua + `
if redis.call('ZSCORE', KEYS[1], ARGV[2]) == false then
  return false
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
return redis.call('HGET', KEYS[2], ARGV[2])
`)

// ARGV: now, id. Returns 1 if a live hold was released.
var releaseScript = redis.NewScript(reapLua + `
if redis.call('ZREM', KEYS[1], ARGV[2]) == 0 then
  return 0
end
redis.call('HDEL', KEYS[2], ARGV[2])
local latest = redis.call('GET', KEYS[3])
if latest == false or tonumber(now) > tonumber(latest) then
  redis.call('SET', KEYS[3], now)
end
return 1
`)

// ARGV: now. Returns id, expires, details, ... for live holds, soonest
// expiry first.
var listScript = redis.NewScript(reapLua + `
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
local out = {}
for i = 1, #live, 2 do
  out[#out + 1] = live[i]
  out[#out + 1] = live[i + 1]
  local d = redis.call('HGET', KEYS[2], live[i])
  if d == false then d = '' end
  out[#out + 1] = d
end
return out
`)

// ARGV: now. Returns {"held"} while a hold is live, {"since", t} after the
// last one ended, {} if there never was one.
var idleScript = redis.NewScript(reapLua + `
if redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') > 0 then
  return {'held'}
end
local t = redis.call('GET', KEYS[3])
if t == false then
  return {}
end
return {'since', t}
`)

func micros(t time.Time) string { return strconv.FormatInt(t.UnixMicro(), 10) }

func fromMicros(s string) (time.Time, error) {
	// Redis prints integral scores as integers; parse as float to be
	// tolerant of an exponent form.
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil {
			return time.Time{}, fmt.Errorf("bad time %q: %w", s, err)
		}
		n = int64(f)
	}
	return time.UnixMicro(n).UTC(), nil
}

// Acquire adds a hold on session for ttl; the holder renews it before it
// expires and releases it when done.
func (h *Holds) Acquire(ctx context.Context, session, owner, kind, description string, ttl time.Duration) (Hold, error) {
	if session == "" {
		return Hold{}, errors.New("holds: acquire: empty session")
	}
	if !kinds[kind] {
		return Hold{}, fmt.Errorf("holds: acquire: unknown kind %q", kind)
	}
	if ttl <= 0 {
		return Hold{}, fmt.Errorf("holds: acquire: ttl %v is not positive", ttl)
	}
	var raw [16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return Hold{}, fmt.Errorf("holds: acquire: new id: %w", err)
	}
	now := h.now()
	hold := Hold{
		ID:          hex.EncodeToString(raw[:]),
		Session:     session,
		Owner:       owner,
		Kind:        kind,
		Description: description,
		AcquiredAt:  time.UnixMicro(now.UnixMicro()).UTC(),
		ExpiresAt:   time.UnixMicro(now.Add(ttl).UnixMicro()).UTC(),
	}
	d, err := json.Marshal(details{Owner: owner, Kind: kind, Description: description, AcquiredAt: now.UnixMicro()})
	if err != nil {
		return Hold{}, fmt.Errorf("holds: acquire: %w", err)
	}
	if err := acquireScript.Run(ctx, h.client, h.keys(session), micros(now), hold.ID, micros(hold.ExpiresAt), string(d)).Err(); err != nil {
		return Hold{}, fmt.Errorf("holds: acquire on %q: %w", session, err)
	}
	return hold, nil
}

// Renew moves the hold's expiry to now+ttl. ErrNotFound if it was released
// or has expired (the holder lost it and must acquire a new one).
func (h *Holds) Renew(ctx context.Context, session, id string, ttl time.Duration) (Hold, error) {
	if ttl <= 0 {
		return Hold{}, fmt.Errorf("holds: renew: ttl %v is not positive", ttl)
	}
	now := h.now()
	expires := now.Add(ttl)
	res, err := renewScript.Run(ctx, h.client, h.keys(session), micros(now), id, micros(expires)).Text()
	if errors.Is(err, redis.Nil) {
		return Hold{}, fmt.Errorf("holds: renew %s on %q: %w", id, session, ErrNotFound)
	}
	if err != nil {
		return Hold{}, fmt.Errorf("holds: renew %s on %q: %w", id, session, err)
	}
	hold, err := decode(session, id, micros(expires), res)
	if err != nil {
		return Hold{}, fmt.Errorf("holds: renew %s on %q: %w", id, session, err)
	}
	return hold, nil
}

// Release ends the hold now. Releasing a hold that is already gone
// (released or expired) is not an error, so a holder can always release on
// its way out.
func (h *Holds) Release(ctx context.Context, session, id string) error {
	if err := releaseScript.Run(ctx, h.client, h.keys(session), micros(h.now()), id).Err(); err != nil {
		return fmt.Errorf("holds: release %s on %q: %w", id, session, err)
	}
	return nil
}

// List returns the session's live holds (expires_at > now), soonest expiry
// first.
func (h *Holds) List(ctx context.Context, session string) ([]Hold, error) {
	res, err := listScript.Run(ctx, h.client, h.keys(session), micros(h.now())).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("holds: list %q: %w", session, err)
	}
	if len(res)%3 != 0 {
		return nil, fmt.Errorf("holds: list %q: malformed reply of %d items", session, len(res))
	}
	out := make([]Hold, 0, len(res)/3)
	for i := 0; i < len(res); i += 3 {
		hold, err := decode(session, res[i], res[i+1], res[i+2])
		if err != nil {
			return nil, fmt.Errorf("holds: list %q: %w", session, err)
		}
		out = append(out, hold)
	}
	return out, nil
}

// IdleSince says when the session last stopped being held: the latest
// release, or expiry of a hold that expired. It is (now, true) while a hold
// is live (the session is in use at this instant) and false if the session
// never had a hold. Idle time is now - max(IdleSince, the session's last
// activity).
func (h *Holds) IdleSince(ctx context.Context, session string) (time.Time, bool, error) {
	now := h.now()
	res, err := idleScript.Run(ctx, h.client, h.keys(session), micros(now)).StringSlice()
	if err != nil {
		return time.Time{}, false, fmt.Errorf("holds: idle time of %q: %w", session, err)
	}
	switch {
	case len(res) == 0:
		return time.Time{}, false, nil
	case res[0] == "held":
		return now, true, nil
	case res[0] == "since" && len(res) == 2:
		t, err := fromMicros(res[1])
		if err != nil {
			return time.Time{}, false, fmt.Errorf("holds: idle time of %q: %w", session, err)
		}
		return t, true, nil
	default:
		return time.Time{}, false, fmt.Errorf("holds: idle time of %q: malformed reply %q", session, res)
	}
}

// Lost says the hold table is new: Redis has no record that this Holds'
// prefix was in use (the first call on a fresh Redis, or a Redis that
// restarted without its data, taking every hold and idle time with it).
// It then records that it is in use, so the next call says false.
func (h *Holds) Lost(ctx context.Context) (bool, error) {
	set, err := h.client.SetNX(ctx, h.prefix+"in-use", "1", 0).Result()
	if err != nil {
		return false, fmt.Errorf("holds: check the table: %w", err)
	}
	return set, nil
}

// Forget deletes everything kept for the session (its holds and its idle
// time), e.g. when it is archived.
func (h *Holds) Forget(ctx context.Context, session string) error {
	if err := h.client.Del(ctx, h.keys(session)...).Err(); err != nil {
		return fmt.Errorf("holds: forget %q: %w", session, err)
	}
	return nil
}

func decode(session, id, expires, raw string) (Hold, error) {
	var d details
	if raw != "" {
		if err := json.Unmarshal([]byte(raw), &d); err != nil {
			return Hold{}, fmt.Errorf("decode hold %s: %w", id, err)
		}
	}
	exp, err := fromMicros(expires)
	if err != nil {
		return Hold{}, fmt.Errorf("decode hold %s: %w", id, err)
	}
	return Hold{
		ID:          id,
		Session:     session,
		Owner:       d.Owner,
		Kind:        d.Kind,
		Description: d.Description,
		AcquiredAt:  time.UnixMicro(d.AcquiredAt).UTC(),
		ExpiresAt:   exp,
	}, nil
}
