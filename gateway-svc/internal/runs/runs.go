// Package runs keeps the gateway's live run state in Redis: run records,
// run tokens (stored only as SHA-256 hashes), usage and cost, budgets, step
// sequence numbers, steering queues, replay state and the tape index.
//
// Keys, all under the configured prefix:
//
//	run:<id>        hash: rec (Run proto, static part), state, reason, ended,
//	                usage counters, seq, replayed, div (Divergence proto)
//	tok:<sha256>    the run id of a token; expires with the run
//	steer:<id>      list of queued steering messages
//	runs            zset of run ids by creation time (ListRuns, the tape index)
//	session:<name>  zset of a session's run ids by creation time
//	tapes           zset of runs with a tape by creation time (the sweeper)
package runs

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Errors of token checks and lookups.
var (
	ErrNotFound     = errors.New("runs: run not found")
	ErrUnknownToken = errors.New("runs: unknown or expired run token")
	// ErrBadPageToken: List was given a page token it did not return.
	ErrBadPageToken = errors.New("runs: bad page token")
)

// DefaultTTL is how long a run's token works when CreateRun gives no TTL.
const DefaultTTL = 6 * time.Hour

// tokenPrefix marks hangar run tokens (so they are recognisable in logs and
// secret scanners).
const tokenPrefix = "hgr_"

// Store is the Redis-backed run store.
type Store struct {
	rdb    redis.UniversalClient
	prefix string
	now    func() time.Time
	prices PriceTable
	// keep is how long run records outlive their runs (the tape retention).
	keep time.Duration
	// journal keeps a copy of every run (journal.go); nil keeps none.
	journal         Journal
	journalNotFound error
	journalPrefix   string
	log             *slog.Logger
}

// Options configures a Store.
type Options struct {
	Prefix string
	Now    func() time.Time
	Prices PriceTable
	// Keep is how long a run's record is kept after it is created (at least
	// the tape retention, so a tape's run can be read as long as the tape).
	Keep time.Duration
	// Journal, when set, keeps a copy of every run under JournalPrefix, so
	// runs survive a Redis that restarts empty; JournalNotFound is the
	// error (wrapped) its Get returns for a missing key.
	Journal         Journal
	JournalNotFound error
	JournalPrefix   string
	// Logger gets journal write failures (Redis stays the live state).
	Logger *slog.Logger
}

// New returns a Store.
func New(rdb redis.UniversalClient, o Options) *Store {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Prices == nil {
		o.Prices = DefaultPrices()
	}
	if o.Keep <= 0 {
		o.Keep = 31 * 24 * time.Hour
	}
	if o.JournalPrefix == "" {
		o.JournalPrefix = "runs/"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Store{rdb: rdb, prefix: o.Prefix, now: o.Now, prices: o.Prices, keep: o.Keep,
		journal: o.Journal, journalNotFound: o.JournalNotFound, journalPrefix: o.JournalPrefix, log: o.Logger}
}

// Prices returns the price table.
func (s *Store) Prices() PriceTable { return s.prices }

func (s *Store) runKey(id string) string      { return s.prefix + "run:" + id }
func (s *Store) tokKey(hash string) string    { return s.prefix + "tok:" + hash }
func (s *Store) steerKey(id string) string    { return s.prefix + "steer:" + id }
func (s *Store) sessionKey(ses string) string { return s.prefix + "session:" + ses }
func (s *Store) runsKey() string              { return s.prefix + "runs" }
func (s *Store) tapesKey() string             { return s.prefix + "tapes" }

func hashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var sessionName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidSessionName reports whether s can be part of a run id.
func ValidSessionName(s string) bool { return sessionName.MatchString(s) }

// Create stores a new run and returns it with its token (shown only here).
// run carries the requested fields; Create sets id, state, times.
func (s *Store) Create(ctx context.Context, run *gatewayv1.Run, ttl time.Duration) (*gatewayv1.Run, string, error) {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	now := s.now()
	run = proto.Clone(run).(*gatewayv1.Run)
	if run.Session != "" {
		run.Id = run.Session + ".run-" + randomHex(4)
	} else {
		run.Id = "run-" + randomHex(6)
	}
	run.State = gatewayv1.RunState_RUN_STATE_ACTIVE
	run.CreatedAt = timestamppb.New(now)
	run.ExpiresAt = timestamppb.New(now.Add(ttl))
	var secret [32]byte
	_, _ = rand.Read(secret[:])
	token := tokenPrefix + base64.RawURLEncoding.EncodeToString(secret[:])

	rec, err := proto.Marshal(staticPart(run))
	if err != nil {
		return nil, "", fmt.Errorf("runs: encode run: %w", err)
	}
	keep := max(s.keep, ttl+24*time.Hour)
	score := float64(now.UnixMilli())
	pipe := s.rdb.TxPipeline()
	pipe.HSet(ctx, s.runKey(run.Id), "rec", rec, "state", int(run.State), "tokhash", hashToken(token))
	pipe.Expire(ctx, s.runKey(run.Id), keep)
	pipe.Set(ctx, s.tokKey(hashToken(token)), run.Id, ttl)
	pipe.ZAdd(ctx, s.runsKey(), redis.Z{Score: score, Member: run.Id})
	if run.Session != "" {
		pipe.ZAdd(ctx, s.sessionKey(run.Session), redis.Z{Score: score, Member: run.Id})
		pipe.Expire(ctx, s.sessionKey(run.Session), keep)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, "", fmt.Errorf("runs: create: %w", err)
	}
	if err := s.journalToken(ctx, hashToken(token), run.Id); err != nil {
		return nil, "", err
	}
	if err := s.journalPut(ctx, run.Id); err != nil {
		return nil, "", err
	}
	return run, token, nil
}

// staticPart is the part of a run kept in the "rec" field: everything but
// state, usage and counters, which live in their own hash fields.
func staticPart(run *gatewayv1.Run) *gatewayv1.Run {
	r := proto.Clone(run).(*gatewayv1.Run)
	r.State, r.StateReason, r.Usage, r.Steps, r.EndedAt = 0, "", nil, 0, nil
	return r
}

// Authenticate returns the run a token belongs to, whatever its state. A
// token past its run's expiry is unknown.
func (s *Store) Authenticate(ctx context.Context, token string) (*gatewayv1.Run, error) {
	if token == "" {
		return nil, ErrUnknownToken
	}
	id, err := s.rdb.Get(ctx, s.tokKey(hashToken(token))).Result()
	if errors.Is(err, redis.Nil) {
		// Redis may have lost it (a restart): the journal knows.
		if id, err = s.restoreToken(ctx, hashToken(token)); err != nil {
			return nil, fmt.Errorf("runs: token lookup: %w", err)
		}
		if id == "" {
			return nil, ErrUnknownToken
		}
	}
	if err != nil {
		return nil, fmt.Errorf("runs: token lookup: %w", err)
	}
	run, err := s.Get(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return nil, ErrUnknownToken
	}
	if err != nil {
		return nil, err
	}
	if !s.now().Before(run.GetExpiresAt().AsTime()) {
		return nil, ErrUnknownToken
	}
	return run, nil
}

// Get returns a run with its state, usage and counters.
func (s *Store) Get(ctx context.Context, id string) (*gatewayv1.Run, error) {
	vals, err := s.rdb.HGetAll(ctx, s.runKey(id)).Result()
	if err != nil {
		return nil, fmt.Errorf("runs: get %s: %w", id, err)
	}
	if vals["rec"] == "" {
		if ok, err := s.restore(ctx, id); err != nil {
			return nil, err
		} else if ok {
			if vals, err = s.rdb.HGetAll(ctx, s.runKey(id)).Result(); err != nil {
				return nil, fmt.Errorf("runs: get %s: %w", id, err)
			}
		}
	}
	if vals["rec"] == "" {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	run := &gatewayv1.Run{}
	if err := proto.Unmarshal([]byte(vals["rec"]), run); err != nil {
		return nil, fmt.Errorf("runs: decode %s: %w", id, err)
	}
	i := func(k string) int64 { n, _ := strconv.ParseInt(vals[k], 10, 64); return n }
	run.State = gatewayv1.RunState(i("state"))
	run.StateReason = vals["reason"]
	if e := i("ended"); e > 0 {
		run.EndedAt = timestamppb.New(time.UnixMilli(e))
	}
	run.Steps = int32(i("steps"))
	run.Usage = &gatewayv1.Usage{
		InputTokens: i("in"), OutputTokens: i("out"), CacheReadTokens: i("cr"), CacheWriteTokens: i("cw"),
		CostUsd: float64(i("cost_nanos")) / 1e9, ModelCalls: int32(i("calls")),
	}
	if run.State == gatewayv1.RunState_RUN_STATE_ACTIVE && !s.now().Before(run.GetExpiresAt().AsTime()) {
		run.State = gatewayv1.RunState_RUN_STATE_ENDED
		run.StateReason = "expired"
		run.EndedAt = run.ExpiresAt
	}
	return run, nil
}

// setState moves a run from ACTIVE to state with reason; it does nothing to
// a run that is no longer active. It reports whether it moved the run.
var setStateScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return -1 end
if tonumber(st) ~= 1 then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'reason', ARGV[2], 'ended', ARGV[3])
return 1`)

// End ends a run: its token stops working.
func (s *Store) End(ctx context.Context, id, reason string) (*gatewayv1.Run, error) {
	return s.SetState(ctx, id, gatewayv1.RunState_RUN_STATE_ENDED, reason)
}

// SetState moves an active run to state (ENDED, OVER_BUDGET, STOPPED) with
// a reason; a run already out of ACTIVE keeps its state.
func (s *Store) SetState(ctx context.Context, id string, state gatewayv1.RunState, reason string) (*gatewayv1.Run, error) {
	n, err := setStateScript.Run(ctx, s.rdb, []string{s.runKey(id)}, int(state), reason, s.now().UnixMilli()).Int()
	if err == nil && n < 0 {
		if ok, rerr := s.restore(ctx, id); rerr == nil && ok {
			n, err = setStateScript.Run(ctx, s.rdb, []string{s.runKey(id)}, int(state), reason, s.now().UnixMilli()).Int()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("runs: set state of %s: %w", id, err)
	}
	if n < 0 {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if n == 1 {
		s.journalLogged(ctx, id)
	}
	return s.Get(ctx, id)
}

// NextSeq allocates the next step number of a run.
func (s *Store) NextSeq(ctx context.Context, id string) (int32, error) {
	n, err := s.rdb.HIncrBy(ctx, s.runKey(id), "seq", 1).Result()
	if err != nil {
		return 0, fmt.Errorf("runs: next seq of %s: %w", id, err)
	}
	return int32(n), nil
}

// addUsageScript adds a step's usage and checks the budget atomically.
// ARGV: in, out, cr, cw, cost_nanos, max_tokens, max_cost_nanos, now_ms, seq.
// Returns {state, reason}.
var addUsageScript = redis.NewScript(`
local k = KEYS[1]
if redis.call('HEXISTS', k, 'rec') == 0 then return {-1, ''} end
local sq = tonumber(redis.call('HGET', k, 'seq') or '0')
if tonumber(ARGV[9]) > sq then redis.call('HSET', k, 'seq', ARGV[9]) end
local tin = redis.call('HINCRBY', k, 'in', ARGV[1])
local tout = redis.call('HINCRBY', k, 'out', ARGV[2])
local tcr = redis.call('HINCRBY', k, 'cr', ARGV[3])
local tcw = redis.call('HINCRBY', k, 'cw', ARGV[4])
local cost = redis.call('HINCRBY', k, 'cost_nanos', ARGV[5])
redis.call('HINCRBY', k, 'calls', 1)
local steps = tonumber(redis.call('HGET', k, 'steps') or '0')
if tonumber(ARGV[9]) > steps then redis.call('HSET', k, 'steps', ARGV[9]) end
local state = tonumber(redis.call('HGET', k, 'state'))
if state ~= 1 then return {state, redis.call('HGET', k, 'reason') or ''} end
local maxTok = tonumber(ARGV[6])
local maxCost = tonumber(ARGV[7])
local total = tin + tout + tcr + tcw
local reason = ''
if maxTok > 0 and total > maxTok then
  reason = 'max_tokens ' .. ARGV[6] .. ' exceeded (used ' .. total .. ')'
elseif maxCost > 0 and cost > maxCost then
  reason = string.format('max_cost_usd %.2f exceeded (spent %.4f)', maxCost / 1e9, cost / 1e9)
end
if reason ~= '' then
  redis.call('HSET', k, 'state', 3, 'reason', reason, 'ended', ARGV[8])
  return {3, reason}
end
return {1, ''}`)

// StepUsage is one step's token counts.
type StepUsage struct {
	Model                                string
	Input, Output, CacheRead, CacheWrite int64
}

// AddUsage adds a step's usage to its run, prices it and checks the run's
// budget; a crossed budget moves the run to OVER_BUDGET. It returns the
// step's Usage (with cost) and the run's state after it.
func (s *Store) AddUsage(ctx context.Context, run *gatewayv1.Run, seq int32, u StepUsage) (*gatewayv1.Usage, gatewayv1.RunState, string, error) {
	model := u.Model
	if model == "" {
		model = run.GetModel()
	}
	cost := s.prices.Cost(model, u.Input, u.Output, u.CacheRead, u.CacheWrite)
	step := &gatewayv1.Usage{InputTokens: u.Input, OutputTokens: u.Output, CacheReadTokens: u.CacheRead,
		CacheWriteTokens: u.CacheWrite, CostUsd: cost, ModelCalls: 1}
	maxCost := int64(0)
	if c := run.GetBudget().GetMaxCostUsd(); c > 0 {
		maxCost = int64(math.Round(c * 1e9))
	}
	add := func() (int64, string, error) {
		res, err := addUsageScript.Run(ctx, s.rdb, []string{s.runKey(run.GetId())},
			u.Input, u.Output, u.CacheRead, u.CacheWrite, int64(math.Round(cost*1e9)),
			run.GetBudget().GetMaxTokens(), maxCost, s.now().UnixMilli(), seq).Slice()
		if err != nil {
			return 0, "", fmt.Errorf("runs: add usage to %s: %w", run.GetId(), err)
		}
		state, _ := res[0].(int64)
		reason, _ := res[1].(string)
		return state, reason, nil
	}
	state, reason, err := add()
	if err == nil && state < 0 {
		// Redis lost the run since the call began: put it back, count
		// the call.
		if ok, rerr := s.restore(ctx, run.GetId()); rerr == nil && ok {
			state, reason, err = add()
		}
	}
	if err != nil {
		return step, 0, "", err
	}
	if state < 0 {
		return step, 0, "", fmt.Errorf("%w: %s", ErrNotFound, run.GetId())
	}
	s.journalLogged(ctx, run.GetId())
	return step, gatewayv1.RunState(state), reason, nil
}

// Touch records that a run has a step seq without usage (a failed call).
func (s *Store) Touch(ctx context.Context, id string, seq int32) error {
	if err := setMaxScript.Run(ctx, s.rdb, []string{s.runKey(id)}, "steps", seq).Err(); err != nil {
		return err
	}
	s.journalLogged(ctx, id)
	return nil
}

var setMaxScript = redis.NewScript(`
local v = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if tonumber(ARGV[2]) > v then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return 1`)

// List returns runs, newest first; session filters (empty: all). The page
// token is an offset.
func (s *Store) List(ctx context.Context, session string, pageSize int, pageToken string) ([]*gatewayv1.Run, string, error) {
	if pageSize <= 0 || pageSize > 1000 {
		pageSize = 100
	}
	off := 0
	if pageToken != "" {
		var err error
		if off, err = strconv.Atoi(pageToken); err != nil || off < 0 {
			return nil, "", ErrBadPageToken
		}
	}
	key := s.runsKey()
	if session != "" {
		key = s.sessionKey(session)
	}
	ids, err := s.rdb.ZRevRange(ctx, key, int64(off), int64(off+pageSize)).Result()
	if err != nil {
		return nil, "", fmt.Errorf("runs: list: %w", err)
	}
	next := ""
	if len(ids) > pageSize {
		ids = ids[:pageSize]
		next = strconv.Itoa(off + pageSize)
	}
	out := make([]*gatewayv1.Run, 0, len(ids))
	for _, id := range ids {
		r, err := s.Get(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, "", err
		}
		out = append(out, r)
	}
	return out, next, nil
}

// SessionRuns returns every run of a session.
func (s *Store) SessionRuns(ctx context.Context, session string) ([]*gatewayv1.Run, error) {
	ids, err := s.rdb.ZRange(ctx, s.sessionKey(session), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("runs: session runs: %w", err)
	}
	var out []*gatewayv1.Run
	for _, id := range ids {
		r, err := s.Get(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// Steer queues a message for the run's next model request and returns how
// many are queued.
func (s *Store) Steer(ctx context.Context, id, msg string) (int, error) {
	pipe := s.rdb.TxPipeline()
	n := pipe.RPush(ctx, s.steerKey(id), msg)
	pipe.Expire(ctx, s.steerKey(id), s.keep)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("runs: steer %s: %w", id, err)
	}
	return int(n.Val()), nil
}

var popAllScript = redis.NewScript(`
local v = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
return v`)

// TakeSteering removes and returns the queued steering messages of a run.
func (s *Store) TakeSteering(ctx context.Context, id string) ([]string, error) {
	v, err := popAllScript.Run(ctx, s.rdb, []string{s.steerKey(id)}).StringSlice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("runs: take steering of %s: %w", id, err)
	}
	return v, nil
}

// SetReplay stores a run's replay configuration and clears its replay
// progress.
func (s *Store) SetReplay(ctx context.Context, id string, rp *gatewayv1.Replay) (*gatewayv1.Run, error) {
	run, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	run.Replay = rp
	rec, err := proto.Marshal(staticPart(run))
	if err != nil {
		return nil, fmt.Errorf("runs: encode run: %w", err)
	}
	if err := s.rdb.HSet(ctx, s.runKey(id), "rec", rec, "replayed", 0, "div", "", "tapeskip", 0).Err(); err != nil {
		return nil, fmt.Errorf("runs: set replay of %s: %w", id, err)
	}
	return s.Get(ctx, id)
}

func (s *Store) armKey(session string) string { return s.prefix + "replay-arm:" + session }

// armTTL is how long an armed replay waits for its session's first run.
const armTTL = 24 * time.Hour

// ArmReplay keeps rp for session's first run (see ArmedReplay).
func (s *Store) ArmReplay(ctx context.Context, session string, rp *gatewayv1.Replay) error {
	b, err := proto.Marshal(rp)
	if err != nil {
		return fmt.Errorf("runs: encode replay: %w", err)
	}
	if err := s.rdb.Set(ctx, s.armKey(session), b, armTTL).Err(); err != nil {
		return fmt.Errorf("runs: arm replay for %s: %w", session, err)
	}
	return nil
}

// ArmedReplay returns the replay armed for session, or nil. It stays
// armed: a first turn run again (after a restart) replays again.
func (s *Store) ArmedReplay(ctx context.Context, session string) (*gatewayv1.Replay, error) {
	b, err := s.rdb.Get(ctx, s.armKey(session)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("runs: armed replay of %s: %w", session, err)
	}
	rp := &gatewayv1.Replay{}
	if err := proto.Unmarshal(b, rp); err != nil {
		return nil, fmt.Errorf("runs: decode armed replay: %w", err)
	}
	return rp, nil
}

// ReplayProgress counts a step answered from the tape.
func (s *Store) ReplayProgress(ctx context.Context, id string) error {
	return s.rdb.HIncrBy(ctx, s.runKey(id), "replayed", 1).Err()
}

// SetDivergence records a replay's first divergence (later ones are
// ignored) and reports whether it was the first.
func (s *Store) SetDivergence(ctx context.Context, id string, d *gatewayv1.Divergence) (bool, error) {
	b, err := proto.Marshal(d)
	if err != nil {
		return false, err
	}
	ok, err := setIfEmptyScript.Run(ctx, s.rdb, []string{s.runKey(id)}, "div", b).Int()
	if err != nil {
		return false, fmt.Errorf("runs: set divergence of %s: %w", id, err)
	}
	return ok == 1, nil
}

var setIfEmptyScript = redis.NewScript(`
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and v ~= '' then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1`)

// SkipTape records that a replay passed over n taped steps the replay's
// harness does not make (the side calls of a call with outside effects,
// made by the tool itself): the run's later steps are the tape's n steps
// further on, and they count as replayed.
func (s *Store) SkipTape(ctx context.Context, id string, n int32) error {
	pipe := s.rdb.TxPipeline()
	pipe.HIncrBy(ctx, s.runKey(id), "tapeskip", int64(n))
	pipe.HIncrBy(ctx, s.runKey(id), "replayed", int64(n))
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("runs: skip tape steps of %s: %w", id, err)
	}
	return nil
}

// ReplayState is a replaying run's first divergence (nil if none), the
// number of steps answered from its tape, and how many taped steps it
// passed over (SkipTape): its step seq is the tape's seq+skipped.
func (s *Store) ReplayState(ctx context.Context, id string) (d *gatewayv1.Divergence, replayed, skipped int32, err error) {
	vals, err := s.rdb.HMGet(ctx, s.runKey(id), "rec", "div", "replayed", "tapeskip").Result()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("runs: replay state of %s: %w", id, err)
	}
	if v, ok := vals[3].(string); ok {
		n, _ := strconv.ParseInt(v, 10, 32)
		skipped = int32(n)
	}
	d, replayed, err = parseDivergence(id, vals[:3])
	return d, replayed, skipped, err
}

// Divergence returns a run's first divergence (nil if none) and the number
// of steps answered from its tape.
func (s *Store) Divergence(ctx context.Context, id string) (*gatewayv1.Divergence, int32, error) {
	vals, err := s.rdb.HMGet(ctx, s.runKey(id), "rec", "div", "replayed").Result()
	if err != nil {
		return nil, 0, fmt.Errorf("runs: divergence of %s: %w", id, err)
	}
	return parseDivergence(id, vals)
}

// parseDivergence reads the fields rec, div, replayed of a run's hash.
func parseDivergence(id string, vals []any) (*gatewayv1.Divergence, int32, error) {
	if vals[0] == nil {
		return nil, 0, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	var n int64
	if v, ok := vals[2].(string); ok {
		n, _ = strconv.ParseInt(v, 10, 64)
	}
	var d *gatewayv1.Divergence
	if v, ok := vals[1].(string); ok && v != "" {
		d = &gatewayv1.Divergence{}
		if err := proto.Unmarshal([]byte(v), d); err != nil {
			return nil, 0, fmt.Errorf("runs: decode divergence: %w", err)
		}
	}
	return d, int32(n), nil
}

// IndexTape records that run has a tape (idempotent).
func (s *Store) IndexTape(ctx context.Context, run *gatewayv1.Run) error {
	return s.rdb.ZAddNX(ctx, s.tapesKey(), redis.Z{Score: float64(run.GetCreatedAt().AsTime().UnixMilli()), Member: run.GetId()}).Err()
}

// TapesBefore implements tape.Index.
func (s *Store) TapesBefore(ctx context.Context, t time.Time) (map[string]int32, error) {
	ids, err := s.rdb.ZRangeByScore(ctx, s.tapesKey(), &redis.ZRangeBy{Min: "-inf", Max: "(" + strconv.FormatInt(t.UnixMilli(), 10)}).Result()
	if err != nil {
		return nil, fmt.Errorf("runs: tapes before: %w", err)
	}
	out := make(map[string]int32, len(ids))
	for _, id := range ids {
		seq, err := s.rdb.HGet(ctx, s.runKey(id), "seq").Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("runs: tapes before: %w", err)
		}
		out[id] = int32(seq)
	}
	return out, nil
}

// ForgetTape implements tape.Index. The run's journal copy goes with its
// tape.
func (s *Store) ForgetTape(ctx context.Context, run string) error {
	if s.journal != nil {
		if err := s.journal.Delete(ctx, s.journalRunKey(run)); err != nil && (s.journalNotFound == nil || !errors.Is(err, s.journalNotFound)) {
			return fmt.Errorf("runs: forget the journal of %s: %w", run, err)
		}
	}
	return s.rdb.ZRem(ctx, s.tapesKey(), run).Err()
}

// Stagger group coordination: the first sibling of a group to get its first
// answer sets the group's "answered" key.

func (s *Store) groupKey(group string) string { return s.prefix + "group:" + group }

// GroupAnswered marks a sibling group as having its first answer.
func (s *Store) GroupAnswered(ctx context.Context, group string) error {
	return s.rdb.Set(ctx, s.groupKey(group), "1", s.keep).Err()
}

// GroupClaimFirst makes the caller the group's leader if nobody is; the
// leader calls upstream at once, the others wait.
func (s *Store) GroupClaimFirst(ctx context.Context, group, run string) (bool, error) {
	ok, err := s.rdb.SetNX(ctx, s.groupKey(group)+":leader", run, s.keep).Result()
	if err != nil {
		return false, fmt.Errorf("runs: claim group: %w", err)
	}
	if ok {
		return true, nil
	}
	leader, err := s.rdb.Get(ctx, s.groupKey(group)+":leader").Result()
	if err != nil {
		return false, fmt.Errorf("runs: claim group: %w", err)
	}
	return leader == run, nil
}

// IsGroupAnswered reports whether a sibling of the group got its first answer.
func (s *Store) IsGroupAnswered(ctx context.Context, group string) (bool, error) {
	n, err := s.rdb.Exists(ctx, s.groupKey(group)).Result()
	return n == 1, err
}

// Tool-call approvals: a run created with approvals has the hash field
// "approvals"; its held tool calls live in calls:<id> (tool call id → ToolCall
// proto) and every answer pushes the step's number to wake:<id>:<seq>, which
// the held request blocks on (so an answer given to any replica releases it).

func (s *Store) callsKey(id string) string { return s.prefix + "calls:" + id }
func (s *Store) wakeKey(id string, seq int32) string {
	return s.prefix + "wake:" + id + ":" + strconv.Itoa(int(seq))
}

// ErrToolCallNotFound is returned for a tool call the run does not hold.
var ErrToolCallNotFound = errors.New("runs: tool call not found")

// ErrToolCallAnswered is returned when a tool call was already answered
// the other way.
var ErrToolCallAnswered = errors.New("runs: tool call already answered")

// EnableApprovals makes the run hold every model answer that carries a tool
// call until it is allowed or denied.
func (s *Store) EnableApprovals(ctx context.Context, id string) error {
	if err := s.rdb.HSet(ctx, s.runKey(id), "approvals", 1).Err(); err != nil {
		return fmt.Errorf("runs: enable approvals of %s: %w", id, err)
	}
	return nil
}

// Approvals reports whether the run holds tool calls for approval.
func (s *Store) Approvals(ctx context.Context, id string) (bool, error) {
	v, err := s.rdb.HGet(ctx, s.runKey(id), "approvals").Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("runs: approvals of %s: %w", id, err)
	}
	return v == "1", nil
}

// HoldToolCalls records the pending tool calls of one held answer.
func (s *Store) HoldToolCalls(ctx context.Context, id string, calls []*gatewayv1.ToolCall) error {
	args := make([]any, 0, 2*len(calls))
	for _, c := range calls {
		b, err := proto.Marshal(c)
		if err != nil {
			return fmt.Errorf("runs: encode tool call: %w", err)
		}
		args = append(args, c.GetId(), b)
	}
	pipe := s.rdb.TxPipeline()
	pipe.HSet(ctx, s.callsKey(id), args...)
	pipe.Expire(ctx, s.callsKey(id), s.keep)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("runs: hold tool calls of %s: %w", id, err)
	}
	return nil
}

// ToolCalls returns the run's tool calls in the order they were requested.
func (s *Store) ToolCalls(ctx context.Context, id string) ([]*gatewayv1.ToolCall, error) {
	vals, err := s.rdb.HGetAll(ctx, s.callsKey(id)).Result()
	if err != nil {
		return nil, fmt.Errorf("runs: tool calls of %s: %w", id, err)
	}
	out := make([]*gatewayv1.ToolCall, 0, len(vals))
	for k, v := range vals {
		if strings.HasSuffix(k, ":st") {
			continue
		}
		c := &gatewayv1.ToolCall{}
		if err := proto.Unmarshal([]byte(v), c); err != nil {
			return nil, fmt.Errorf("runs: decode tool call: %w", err)
		}
		if st, ok := vals[k+":st"]; ok {
			n, _ := strconv.Atoi(st)
			c.State = gatewayv1.ToolCallState(n)
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *gatewayv1.ToolCall) int {
		if a.GetSeq() != b.GetSeq() {
			return cmp.Compare(a.GetSeq(), b.GetSeq())
		}
		return a.GetRequestedAt().AsTime().Compare(b.GetRequestedAt().AsTime())
	})
	return out, nil
}

// answerScript sets a tool call's state (field "<call>:st") once and wakes
// its held request. KEYS: calls, wake. ARGV: call id, state.
// Returns 1 answered, 0 already in that state, -1 not found, -2 answered the
// other way.
var answerScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return -1 end
local cur = redis.call('HGET', KEYS[1], ARGV[1] .. ':st')
if cur then
  if cur == ARGV[2] then return 0 end
  return -2
end
redis.call('HSET', KEYS[1], ARGV[1] .. ':st', ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], 86400)
return 1`)

// AnswerToolCall allows or denies a pending tool call and wakes the request
// holding its answer. Answering again the same way is a no-op; the other
// way is ErrToolCallAnswered.
func (s *Store) AnswerToolCall(ctx context.Context, id, callID string, allow bool) (*gatewayv1.ToolCall, error) {
	want := gatewayv1.ToolCallState_TOOL_CALL_STATE_DENIED
	if allow {
		want = gatewayv1.ToolCallState_TOOL_CALL_STATE_ALLOWED
	}
	v, err := s.rdb.HGet(ctx, s.callsKey(id), callID).Result()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("%w: %s", ErrToolCallNotFound, callID)
	}
	if err != nil {
		return nil, fmt.Errorf("runs: tool call %s: %w", callID, err)
	}
	c := &gatewayv1.ToolCall{}
	if err := proto.Unmarshal([]byte(v), c); err != nil {
		return nil, fmt.Errorf("runs: decode tool call: %w", err)
	}
	n, err := answerScript.Run(ctx, s.rdb, []string{s.callsKey(id), s.wakeKey(id, c.GetSeq())}, callID, int(want)).Int()
	if err != nil {
		return nil, fmt.Errorf("runs: answer tool call %s: %w", callID, err)
	}
	switch n {
	case -1:
		return nil, fmt.Errorf("%w: %s", ErrToolCallNotFound, callID)
	case -2:
		return nil, fmt.Errorf("%w: %s", ErrToolCallAnswered, callID)
	}
	c.State = want
	return c, nil
}

// WaitToolCallAnswer blocks until an answer to one of the step's tool calls
// arrives or wait passes; it reports whether one arrived.
func (s *Store) WaitToolCallAnswer(ctx context.Context, id string, seq int32, wait time.Duration) (bool, error) {
	_, err := s.rdb.BLPop(ctx, wait, s.wakeKey(id, seq)).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("runs: wait for tool call answers of %s: %w", id, err)
	}
	return true, nil
}

// journalLogged writes the run's journal copy, logging a failure (Redis
// stays the live state; the next write tries again).
func (s *Store) journalLogged(ctx context.Context, id string) {
	if err := s.journalPut(ctx, id); err != nil {
		s.log.WarnContext(ctx, "run journal not written", "run", id, "error", err)
	}
}

func decodeRec(rec []byte) (*gatewayv1.Run, error) {
	run := &gatewayv1.Run{}
	if err := proto.Unmarshal(rec, run); err != nil {
		return nil, err
	}
	return run, nil
}
