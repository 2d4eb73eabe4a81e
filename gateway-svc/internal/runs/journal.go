package runs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// A run outlives a Redis that restarts empty. Redis keeps the live state
// (every model call reads and updates it atomically); the journal keeps a
// copy of each run on disk (or the object store), written when the run is
// created and after every change that counts (usage, steps, state): its
// record, its token's hash, its counters. A call that finds a run or a
// token missing from Redis puts the run back from the journal and goes on,
// so an agent's token keeps working mid-turn, the run's usage and its
// budget are not reset to zero and its tape's step numbers keep rising.
// What a Redis restart still loses: steering messages queued and not yet
// taken, approvals waiting, a replay's divergence and the stagger groups'
// first answers (all short-lived).

// Journal is where run copies are kept (platform/blob.Store satisfies it).
type Journal interface {
	Put(ctx context.Context, key string, r io.Reader) error
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	Delete(ctx context.Context, key string) error
}

// journalEntry is a run's copy. Keys are part of the stored format.
type journalEntry struct {
	// Rec is the run's static part (the "rec" hash field), a Run proto.
	Rec       []byte `json:"rec"`
	TokenHash string `json:"token_hash"`
	// Fields are the run hash's other fields as Redis holds them.
	Fields map[string]string `json:"fields"`
}

func (s *Store) journalRunKey(id string) string     { return s.journalPrefix + "run/" + id + ".json" }
func (s *Store) journalTokenKey(hash string) string { return s.journalPrefix + "token/" + hash }

// journalPut writes the run's copy from what Redis holds now. Errors are
// returned for the caller to log: Redis stays the live state.
func (s *Store) journalPut(ctx context.Context, id string) error {
	if s.journal == nil {
		return nil
	}
	vals, err := s.rdb.HGetAll(ctx, s.runKey(id)).Result()
	if err != nil {
		return fmt.Errorf("runs: journal %s: %w", id, err)
	}
	if vals["rec"] == "" {
		return nil
	}
	e := journalEntry{Rec: []byte(vals["rec"]), TokenHash: vals["tokhash"], Fields: map[string]string{}}
	for k, v := range vals {
		if k != "rec" {
			e.Fields[k] = v
		}
	}
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("runs: journal %s: %w", id, err)
	}
	if err := s.journal.Put(context.WithoutCancel(ctx), s.journalRunKey(id), bytes.NewReader(b)); err != nil {
		return fmt.Errorf("runs: journal %s: %w", id, err)
	}
	return nil
}

// journalToken records which run a token hash belongs to.
func (s *Store) journalToken(ctx context.Context, hash, id string) error {
	if s.journal == nil {
		return nil
	}
	if err := s.journal.Put(context.WithoutCancel(ctx), s.journalTokenKey(hash), bytes.NewReader([]byte(id))); err != nil {
		return fmt.Errorf("runs: journal token of %s: %w", id, err)
	}
	return nil
}

func (s *Store) journalRead(ctx context.Context, key string) ([]byte, bool, error) {
	r, err := s.journal.Get(ctx, key)
	if err != nil {
		if s.journalNotFound != nil && errors.Is(err, s.journalNotFound) {
			return nil, false, nil
		}
		return nil, false, err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	return b, err == nil, err
}

// restoreScript puts a run back unless Redis has its record. KEYS: run,
// token, runs index, session index, tapes index. ARGV: keep ms, token ttl
// ms (0: none), run id, created ms, session ("" none), has tape (0/1),
// then field, value pairs. The step counter only rises (a step taken after
// the restart, before this, keeps its number).
var restoreScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], 'rec') == 1 then return 0 end
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
for i = 7, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
if seq > tonumber(redis.call('HGET', KEYS[1], 'seq') or '0') then
  redis.call('HSET', KEYS[1], 'seq', seq)
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
if tonumber(ARGV[2]) > 0 then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
end
redis.call('ZADD', KEYS[3], 'NX', ARGV[4], ARGV[3])
if ARGV[5] ~= '' then
  redis.call('ZADD', KEYS[4], 'NX', ARGV[4], ARGV[3])
  redis.call('PEXPIRE', KEYS[4], ARGV[1])
end
if ARGV[6] == '1' then
  redis.call('ZADD', KEYS[5], 'NX', ARGV[4], ARGV[3])
end
return 1`)

// restore puts run id back into Redis from the journal; false when the
// journal has no copy of it.
func (s *Store) restore(ctx context.Context, id string) (bool, error) {
	if s.journal == nil {
		return false, nil
	}
	b, ok, err := s.journalRead(ctx, s.journalRunKey(id))
	if err != nil || !ok {
		return false, err
	}
	var e journalEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return false, fmt.Errorf("runs: journal of %s: %w", id, err)
	}
	run, err := decodeRec(e.Rec)
	if err != nil {
		return false, fmt.Errorf("runs: journal of %s: %w", id, err)
	}
	now := s.now()
	created := run.GetCreatedAt().AsTime()
	expires := run.GetExpiresAt().AsTime()
	keep := max(s.keep, expires.Sub(created)+24*time.Hour) - now.Sub(created)
	if keep <= 0 {
		return false, nil
	}
	tokenTTL := int64(0)
	if e.TokenHash != "" && expires.After(now) {
		tokenTTL = ms(expires.Sub(now))
	}
	tape := "0"
	if n, _ := strconv.Atoi(e.Fields["seq"]); n > 0 {
		tape = "1"
	}
	args := []any{ms(keep), tokenTTL, id, created.UnixMilli(), run.GetSession(), tape, "rec", e.Rec}
	for k, v := range e.Fields {
		args = append(args, k, v)
	}
	tokKey := s.tokKey(e.TokenHash)
	if e.TokenHash == "" {
		tokKey = s.prefix + "tok:none"
	}
	if err := restoreScript.Run(ctx, s.rdb, []string{s.runKey(id), tokKey, s.runsKey(), s.sessionKey(run.GetSession()), s.tapesKey()}, args...).Err(); err != nil {
		return false, fmt.Errorf("runs: restore %s: %w", id, err)
	}
	return true, nil
}

// restoreToken finds the run of a token hash in the journal and puts it
// back; "" when the journal does not know the token.
func (s *Store) restoreToken(ctx context.Context, hash string) (string, error) {
	if s.journal == nil {
		return "", nil
	}
	b, ok, err := s.journalRead(ctx, s.journalTokenKey(hash))
	if err != nil || !ok {
		return "", err
	}
	id := string(b)
	if ok, err := s.restore(ctx, id); err != nil || !ok {
		return "", err
	}
	return id, nil
}

func ms(d time.Duration) int64 {
	if d < time.Millisecond {
		return 1
	}
	return d.Milliseconds()
}
