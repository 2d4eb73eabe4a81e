package sessions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hangar-dev/hangar/platform/logging"
)

// Replicas is what session-svc replicas sharing one database and one Redis
// know of each other (`<prefix>...` keys):
//   - `replica:<id>`: a heartbeat each live replica renews every
//     ReplicaTTL/3 (its address for logs as the value);
//   - `owner:<session>`: the replica that serves the session now: it moved
//     it to running, resuming or suspending, or renews its sandbox lease;
//   - `sweep:<session>`: the replica doing the idle sweep's work on the
//     session (an idle suspend, a periodic checkpoint), so two replicas'
//     sweeps never both do it.
//
// A replica whose heartbeat has expired is dead: the sessions it owned are
// recovered by whichever replica's sweep finds them (a turn ended
// interrupted with a checkpoint, a resume or suspend finished as a suspend
// from the newest checkpoint, an idle session's lease renewed by the
// finder, which then owns it).
type Replicas struct {
	rdb    *redis.Client
	prefix string
	// ID identifies this process.
	ID  string
	ttl time.Duration
}

// ReplicaTTL is how long a replica's heartbeat outlives its last renewal:
// a replica killed outright is known dead this long after.
const ReplicaTTL = 15 * time.Second

// ownerTTL bounds an owner mark nobody clears (a session whose process
// died and that no sweep recovered since).
const ownerTTL = 24 * time.Hour

// NewReplicas returns this process's view of the replicas under prefix
// (`hangar:session:`).
func NewReplicas(rdb *redis.Client, prefix string) *Replicas {
	var raw [6]byte
	_, _ = rand.Read(raw[:])
	return &Replicas{rdb: rdb, prefix: prefix, ID: hex.EncodeToString(raw[:]), ttl: ReplicaTTL}
}

// beat renews this replica's heartbeat.
func (r *Replicas) beat(ctx context.Context) error {
	if err := r.rdb.Set(ctx, r.prefix+"replica:"+r.ID, time.Now().UTC().Format(time.RFC3339), r.ttl).Err(); err != nil {
		return fmt.Errorf("replica heartbeat: %w", err)
	}
	return nil
}

// run beats until ctx ends, then removes the heartbeat (a graceful stop
// has drained its sessions: nothing is left for others to recover).
func (r *Replicas) run(ctx context.Context, log interface {
	WarnContext(context.Context, string, ...any)
}) {
	ticker := time.NewTicker(r.ttl / 3)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = r.rdb.Del(context.WithoutCancel(ctx), r.prefix+"replica:"+r.ID).Err()
			return
		case <-ticker.C:
			if err := r.beat(ctx); err != nil && ctx.Err() == nil {
				log.WarnContext(ctx, "replica heartbeat not renewed", "error", err)
			}
		}
	}
}

// Mark records this replica as the session's owner.
func (r *Replicas) Mark(ctx context.Context, session string) error {
	if err := r.rdb.Set(ctx, r.prefix+"owner:"+session, r.ID, ownerTTL).Err(); err != nil {
		return fmt.Errorf("mark owner of %s: %w", session, err)
	}
	return nil
}

// Owner says which replica owns the session: "" when none is recorded;
// alive whether its heartbeat is current (always for this replica).
func (r *Replicas) Owner(ctx context.Context, session string) (id string, alive bool, err error) {
	id, err = r.rdb.Get(ctx, r.prefix+"owner:"+session).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("owner of %s: %w", session, err)
	}
	if id == r.ID {
		return id, true, nil
	}
	n, err := r.rdb.Exists(ctx, r.prefix+"replica:"+id).Result()
	if err != nil {
		return "", false, fmt.Errorf("replica %s: %w", id, err)
	}
	return id, n == 1, nil
}

// Sweep takes the session's sweep lease for ttl; release gives it back.
// ok is false when another replica holds it.
func (r *Replicas) Sweep(ctx context.Context, session string, ttl time.Duration) (release func(), ok bool, err error) {
	key := r.prefix + "sweep:" + session
	n, err := claimScript.Run(ctx, r.rdb, []string{key}, r.ID, ttl.Milliseconds()).Int()
	if err != nil {
		return nil, false, fmt.Errorf("sweep lease of %s: %w", session, err)
	}
	if n != 1 {
		return nil, false, nil
	}
	return func() { _ = dropScript.Run(context.WithoutCancel(ctx), r.rdb, []string{key}, r.ID).Err() }, true, nil
}

// sweepLeaseTTL bounds a sweep lease whose holder died mid-suspend.
const sweepLeaseTTL = 5 * time.Minute

// markOwner records this replica as s's owner (no-op without Replicas); a
// failure is logged: without the mark a dead replica's session is
// recovered after transientGrace rather than at once.
func (m *Manager) markOwner(ctx context.Context, name string) {
	if m.d.Replicas == nil {
		return
	}
	if err := m.d.Replicas.Mark(ctx, name); err != nil {
		m.log.WarnContext(ctx, "session owner not recorded", "session", name, "error", err)
	}
}

// ownerDead says the session's recorded owner is another replica whose
// heartbeat has expired; known says an owner is recorded at all.
func (m *Manager) ownerDead(ctx context.Context, name string) (dead, known bool) {
	if m.d.Replicas == nil {
		return false, false
	}
	id, alive, err := m.d.Replicas.Owner(ctx, name)
	if err != nil {
		m.log.WarnContext(ctx, "session owner unreadable", "session", name, "error", err)
		return false, false
	}
	if id == "" {
		return false, false
	}
	return !alive, true
}

// ownedHere says this replica is the session's recorded owner.
func (m *Manager) ownedHere(ctx context.Context, name string) bool {
	if m.d.Replicas == nil {
		return false
	}
	id, _, err := m.d.Replicas.Owner(ctx, name)
	return err == nil && id == m.d.Replicas.ID
}

// sweepLease takes the session's sweep lease; without Replicas (one
// process) it always succeeds.
func (m *Manager) sweepLease(ctx context.Context, name string) (release func(), ok bool) {
	if m.d.Replicas == nil {
		return func() {}, true
	}
	release, ok, err := m.d.Replicas.Sweep(ctx, name, sweepLeaseTTL)
	if err != nil {
		m.log.WarnContext(ctx, "sweep lease not taken", "session", name, "error", err)
		return nil, false
	}
	return release, ok
}

// runReplica keeps this replica's heartbeat until ctx ends.
func (m *Manager) runReplica(ctx context.Context) (stop func()) {
	if m.d.Replicas == nil {
		return func() {}
	}
	if err := m.d.Replicas.beat(ctx); err != nil {
		m.log.WarnContext(ctx, "replica heartbeat not written", "error", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer logging.Recover(ctx, m.log, "replica heartbeat")
		m.d.Replicas.run(ctx, m.log)
	}()
	return func() { cancel(); <-done }
}

// adoptOrphans takes over the sessions that are up on a sandbox whose
// owner replica died: this replica renews their leases (the same fencing
// token: the lease is the session's, not a process's) and owns them, so
// they stay up and the idle clock goes on.
func (m *Manager) adoptOrphan(ctx context.Context, name, sandboxID string, token uint64) {
	m.mu.Lock()
	_, here := m.leases[name]
	m.mu.Unlock()
	if here || sandboxID == "" {
		return
	}
	if dead, _ := m.ownerDead(ctx, name); !dead {
		return
	}
	m.keepLease(name, sandboxID, token)
	m.log.WarnContext(ctx, "session of a stopped replica adopted", "session", name, "sandbox", sandboxID)
}

// peerPollEvery is how often a wait on a session (a turn's end, events, a
// job) reads the records again when other replicas may write them: their
// changes wake only their own process's waiters.
const peerPollEvery = 500 * time.Millisecond

// peerPoll fires after peerPollEvery when other replicas may change what a
// waiter waits for; never in a process of its own.
func (m *Manager) peerPoll() <-chan time.Time {
	if m.d.Replicas == nil {
		return nil
	}
	return time.After(peerPollEvery)
}

// interruptChannel is the Redis channel interrupts for turns another
// replica runs travel on, as "<session> <turn>".
func (r *Replicas) interruptChannel() string { return r.prefix + "interrupt" }

// PublishInterrupt asks the replica running the session's turn to
// interrupt it; it says how many replicas heard (0 when none listens).
func (r *Replicas) PublishInterrupt(ctx context.Context, session string, turn int) (int64, error) {
	n, err := r.rdb.Publish(ctx, r.interruptChannel(), fmt.Sprintf("%s %d", session, turn)).Result()
	if err != nil {
		return 0, fmt.Errorf("publish interrupt of %s turn %d: %w", session, turn, err)
	}
	return n, nil
}

// parseInterrupt reads a message of interruptChannel.
func parseInterrupt(payload string) (session string, turn int, ok bool) {
	name, number, found := strings.Cut(payload, " ")
	if !found {
		return "", 0, false
	}
	n, err := strconv.Atoi(number)
	if err != nil || n <= 0 || !nameRE.MatchString(name) {
		return "", 0, false
	}
	return name, n, true
}

// runInterrupts listens for interrupts other replicas were asked for and
// interrupts the turns named that run here, until ctx ends. Subscribed
// when it returns; go-redis subscribes again after a lost connection (a
// message lost meanwhile is sent again: interruptElsewhere repeats it
// until the turn has ended).
func (m *Manager) runInterrupts(ctx context.Context) (stop func()) {
	if m.d.Replicas == nil {
		return func() {}
	}
	ps := m.d.Replicas.rdb.Subscribe(ctx, m.d.Replicas.interruptChannel())
	if _, err := ps.Receive(ctx); err != nil {
		m.log.WarnContext(ctx, "interrupt channel not subscribed yet", "error", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer logging.Recover(ctx, m.log, "interrupt listener")
		for msg := range ps.Channel() {
			name, number, ok := parseInterrupt(msg.Payload)
			if !ok {
				m.log.WarnContext(ctx, "malformed interrupt message ignored", "payload", msg.Payload)
				continue
			}
			m.mu.Lock()
			at := m.turns[name]
			m.mu.Unlock()
			if at != nil && at.number == number {
				m.log.InfoContext(ctx, "turn interrupted through another replica", "session", name, "turn", number)
				at.cancel(errInterrupted)
			}
		}
	}()
	return func() { _ = ps.Close(); <-done }
}

// interruptElsewhere interrupts turn number of a session this replica does
// not run: the replica running it hears it on the interrupt channel (sent
// again at every poll until the turn has ended, so a message lost to a
// reconnect or sent before that replica registered the turn is not the
// end of it); a turn whose owner has died is recovered here (ended
// interrupted with a checkpoint). It returns once the turn has ended.
func (m *Manager) interruptElsewhere(ctx context.Context, name string, number int) error {
	wake, stop := m.events.subscribe(name)
	defer stop()
	for {
		t, err := m.turn(ctx, name, number)
		if err != nil {
			return err
		}
		if t.EndedAt != nil {
			return nil
		}
		if dead, _ := m.ownerDead(ctx, name); dead {
			if _, err := m.recoverOnce(ctx, name); err != nil {
				m.log.WarnContext(ctx, "turn of a stopped replica not recovered for an interrupt", "session", name, "turn", number, "error", err)
			}
		} else if _, err := m.d.Replicas.PublishInterrupt(ctx, name, number); err != nil {
			return err
		}
		select {
		case <-wake:
		case <-m.peerPoll():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
