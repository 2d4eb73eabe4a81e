package sessions

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// Claims keeps, per agent conversation id, the one session that continues
// it, in Redis: `<prefix><id>` holds the session's name. Two sessions can
// come to hold one id (a fork copies its parent's; a restore elsewhere); the
// oldest session (created first) keeps it and the others fork it on their
// next turn instead of resuming it.
type Claims struct {
	rdb    *redis.Client
	prefix string
}

// NewClaims returns claims kept under prefix.
func NewClaims(rdb *redis.Client, prefix string) *Claims {
	return &Claims{rdb: rdb, prefix: prefix}
}

// Claim claims id for session unless someone holds it, and returns the
// holder (session when it was free).
func (c *Claims) Claim(ctx context.Context, id, session string) (string, error) {
	key := c.prefix + id
	ok, err := c.rdb.SetNX(ctx, key, session, 0).Result()
	if err != nil {
		return "", fmt.Errorf("claim conversation %s: %w", id, err)
	}
	if ok {
		return session, nil
	}
	holder, err := c.rdb.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return c.Claim(ctx, id, session)
	}
	if err != nil {
		return "", fmt.Errorf("read claim of conversation %s: %w", id, err)
	}
	return holder, nil
}

// replaceScript swaps a claim's holder only if it is still the one read.
var replaceScript = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then
	redis.call('SET', KEYS[1], ARGV[2])
	return 1
end
return 0`)

// Replace moves id's claim from one session to another if from still holds
// it.
func (c *Claims) Replace(ctx context.Context, id, from, to string) (bool, error) {
	n, err := replaceScript.Run(ctx, c.rdb, []string{c.prefix + id}, from, to).Int()
	if err != nil {
		return false, fmt.Errorf("move claim of conversation %s: %w", id, err)
	}
	return n == 1, nil
}

// releaseScript drops a claim only if its holder is still the one given.
var releaseScript = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('DEL', KEYS[1])
end
return 0`)

// Release drops session's claim on id, if it holds it (an archived session
// continues nothing; its claims would stay in Redis for good).
func (c *Claims) Release(ctx context.Context, id, session string) error {
	if err := releaseScript.Run(ctx, c.rdb, []string{c.prefix + id}, session).Err(); err != nil {
		return fmt.Errorf("release claim of conversation %s: %w", id, err)
	}
	return nil
}

// Holder says who holds id ("" when no one).
func (c *Claims) Holder(ctx context.Context, id string) (string, error) {
	v, err := c.rdb.Get(ctx, c.prefix+id).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read claim of conversation %s: %w", id, err)
	}
	return v, nil
}

// ownsConversation says whether s may continue conversation id: it claims
// it when free; a holder that no longer has the id (or no longer exists)
// gives it up; between two live holders the older session keeps it.
func (m *Manager) ownsConversation(ctx context.Context, s *store.Session, id string) bool {
	if m.d.Claims == nil {
		// Without claims a fork still forks its parent's conversation.
		if s.ParentID == "" {
			return true
		}
		p, err := m.d.Store.GetSession(ctx, s.ParentID)
		return err != nil || p.ConversationID != id
	}
	for range 3 {
		holder, err := m.d.Claims.Claim(ctx, id, s.Name)
		if err != nil {
			m.log.WarnContext(ctx, "conversation claim unreadable", "session", s.Name, "error", err)
			return s.ParentID == ""
		}
		if holder == s.Name {
			return true
		}
		other, err := m.d.Store.GetSession(ctx, holder)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			m.log.WarnContext(ctx, "conversation holder unreadable", "session", s.Name, "holder", holder, "error", err)
			return false
		}
		if err == nil && other.ConversationID == id && other.State != store.StateArchived && older(other, s) {
			return false
		}
		ok, err := m.d.Claims.Replace(ctx, id, holder, s.Name)
		if err != nil {
			m.log.WarnContext(ctx, "conversation claim not moved", "session", s.Name, "error", err)
			return false
		}
		if ok {
			return true
		}
	}
	return false
}

// older orders sessions by creation, then name.
func older(a, b *store.Session) bool {
	if !a.CreatedAt.Equal(b.CreatedAt) {
		return a.CreatedAt.Before(b.CreatedAt)
	}
	return a.Name < b.Name
}
