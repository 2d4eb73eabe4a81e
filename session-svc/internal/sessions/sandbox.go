package sessions

import (
	"context"
	"fmt"
	"path"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// holder names a session's sandbox lease, so a destroy notice can be traced
// back to its session.
func holder(name string) string { return "session/" + name }

// sessionOfHolder is holder's inverse.
func sessionOfHolder(h string) (string, bool) { return strings.CutPrefix(h, "session/") }

// leaseKeeper renews a sandbox lease until stopped.
type leaseKeeper struct {
	stop func()
}

// keepLease starts renewing the lease of s's sandbox.
func (m *Manager) keepLease(name, sandboxID string, token uint64) {
	k := &leaseKeeper{}
	k.stop = m.heartbeat(m.background, "lease renewal", func(ctx context.Context) {
		_, err := m.d.Sandboxes.RenewLease(ctx, &sandboxv1.RenewLeaseRequest{
			SandboxId: sandboxID, FencingToken: token, TtlSeconds: int32(m.cfg.LeaseTTL / time.Second),
		})
		if err != nil && ctx.Err() == nil {
			// A lost lease ends in a destroy notice, which checkpoints
			// the session first; nothing more to do here.
			m.log.WarnContext(ctx, "sandbox lease renewal failed", "session", name, "sandbox", sandboxID, "error", err)
			if c := status.Code(err); c == codes.NotFound || c == codes.FailedPrecondition {
				// Gone, or released by another replica (a suspend it
				// made): no renewal can succeed again.
				go m.dropLeaseOf(name, k)
			}
		}
	})
	m.mu.Lock()
	old := m.leases[name]
	m.leases[name] = k
	m.mu.Unlock()
	if old != nil {
		old.stop()
	}
	m.markOwner(m.background, name)
}

// ensureLease renews the lease of s's sandbox from this process, unless it
// does already.
func (m *Manager) ensureLease(s *store.Session) {
	if s.SandboxID == "" {
		return
	}
	m.mu.Lock()
	_, here := m.leases[s.Name]
	m.mu.Unlock()
	if !here {
		m.keepLease(s.Name, s.SandboxID, s.FencingToken)
	}
}

// dropLeaseOf stops k, if it is still the session's lease keeper.
func (m *Manager) dropLeaseOf(name string, k *leaseKeeper) {
	m.mu.Lock()
	if m.leases[name] != k {
		m.mu.Unlock()
		return
	}
	delete(m.leases, name)
	m.mu.Unlock()
	k.stop()
}

// dropLease stops renewing a session's lease.
func (m *Manager) dropLease(name string) {
	m.mu.Lock()
	k := m.leases[name]
	delete(m.leases, name)
	m.mu.Unlock()
	if k != nil {
		k.stop()
	}
}

// sandboxOf returns the sandbox serving s (paths included).
func (m *Manager) sandboxOf(ctx context.Context, s *store.Session) (*sandboxv1.Sandbox, error) {
	m.mu.Lock()
	sb := m.sandboxes[s.SandboxID]
	m.mu.Unlock()
	if sb != nil {
		return sb, nil
	}
	resp, err := m.d.Sandboxes.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: s.SandboxID})
	if err != nil {
		return nil, fmt.Errorf("sandbox %s of session %s: %w", s.SandboxID, s.Name, err)
	}
	m.mu.Lock()
	m.sandboxes[s.SandboxID] = resp.GetSandbox()
	m.mu.Unlock()
	return resp.GetSandbox(), nil
}

// boot gives a session without a sandbox one: it leases a sandbox (warm pool
// first) with the session's work key, restores the newest checkpoint
// (verified against its tree hash), or, for a new session, creates its
// branch at the environment's base. It records the sandbox on the session.
func (m *Manager) boot(ctx context.Context, s *store.Session) (*store.Session, error) {
	b, err := m.prepare(ctx, s)
	if err != nil {
		return nil, err
	}
	return m.record(ctx, s, b, false)
}

// fullCommit is a full git object name.
var fullCommit = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)

// baseHint is the base commit an acquire may ask a new sandbox to start
// at: the session's pinned base when it is a full commit name (records
// older than pinning have none).
func baseHint(base string) string {
	if fullCommit.MatchString(base) {
		return base
	}
	return ""
}

// booted is a sandbox made ready for a session but not yet recorded on it.
type booted struct {
	sb    *sandboxv1.Sandbox
	token uint64
	base  string
	// restored is the checkpoint restored (nil for a new session) and tree
	// the restored work tree's hash, verified against it.
	restored *checkpointv1.Checkpoint
	tree     string
}

// prepare leases and fills a sandbox for s (boot without the record). On
// failure the sandbox is released.
//
// The sandbox may be the session's own, cached since its suspend (its
// files kept, see sandbox-svc's cache): it is used only when the checkpoint
// it was released after is the one to restore and a capture of it, storing
// nothing, is that checkpoint exactly (RestoreCheckpointRequest.reuse_sandbox);
// otherwise it is destroyed and a fresh one restored.
func (m *Manager) prepare(ctx context.Context, s *store.Session) (*booted, error) {
	acquire := func(noCache bool) (*sandboxv1.AcquireSandboxResponse, error) {
		acq, err := m.d.Sandboxes.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{
			Environment: s.Environment,
			Repository:  s.Repo,
			Holder:      holder(s.Name),
			TtlSeconds:  int32(m.cfg.LeaseTTL / time.Second),
			WorkKey:     s.Name,
			NoCache:     noCache,
			// A sandbox made for this boot starts at the session's base:
			// the restore then writes only what the session changed.
			BaseCommit: baseHint(s.BaseCommit),
		})
		if err != nil {
			return nil, fmt.Errorf("lease a sandbox for %s: %w", s.Name, err)
		}
		return acq, nil
	}
	acq, err := acquire(false)
	if err != nil {
		return nil, err
	}
	b := m.leased(s.Name, acq)
	fail := func(err error) (*booted, error) {
		m.releaseSandbox(context.WithoutCancel(ctx), s.Name, b.sb.GetId(), b.token, "")
		return nil, err
	}

	newest, err := m.restorePoint(ctx, s)
	if err != nil {
		return fail(err)
	}
	b.base = s.BaseCommit
	if cached := acq.GetCachedCheckpoint(); cached != "" {
		if newest != nil && cached == newest.GetId() {
			resp, err := m.d.Checkpoints.RestoreCheckpoint(ctx, &checkpointv1.RestoreCheckpointRequest{
				CheckpointId: newest.GetId(), SandboxId: b.sb.GetId(), FencingToken: b.token,
				WorkDir: b.sb.GetWorkDir(), Branch: s.Branch, Relocate: relocation(b.sb, newest), ReuseSandbox: true,
			})
			if err == nil && resp.GetReused() {
				b.restored, b.tree = newest, resp.GetTreeHash()
				return b, nil
			}
			if ctx.Err() != nil {
				return fail(ctx.Err())
			}
			// CACHED_SANDBOX_DIFFERS, or the check could not be made: the
			// fresh path below restores and verifies.
			m.log.InfoContext(ctx, "cached sandbox not reused; restoring into a fresh one", "session", s.Name, "sandbox", b.sb.GetId(), "error", err)
		}
		// Not the checkpoint to restore, or changed since: never used.
		m.releaseSandbox(context.WithoutCancel(ctx), s.Name, b.sb.GetId(), b.token, "")
		if acq, err = acquire(true); err != nil {
			return nil, err
		}
		b = m.leased(s.Name, acq)
		b.base = s.BaseCommit
	}
	if newest != nil {
		// A checkpoint keeps no .git/config: without an identity again
		// the agent could not commit after a resume. Set alongside the
		// restore (it writes only .git/config, which no step of the
		// restore writes or depends on), not after it: one exec fewer on
		// the resume's path. Nothing is handed out before both end.
		identity := make(chan error, 1)
		go func() {
			identity <- m.tool(ctx, b.sb.GetId(), b.token, sandboxtool.CommandInitWork, sandboxtool.InitWorkRequest{WorkDir: b.sb.GetWorkDir()}, nil)
		}()
		resp, err := m.d.Checkpoints.RestoreCheckpoint(ctx, &checkpointv1.RestoreCheckpointRequest{
			CheckpointId: newest.GetId(), SandboxId: b.sb.GetId(), FencingToken: b.token,
			WorkDir: b.sb.GetWorkDir(), Branch: s.Branch, Relocate: relocation(b.sb, newest),
		})
		idErr := <-identity
		if err != nil {
			return fail(fmt.Errorf("restore checkpoint %s of %s: %w", newest.GetId(), s.Name, err))
		}
		b.restored, b.tree = newest, resp.GetTreeHash()
		if idErr != nil {
			return fail(fmt.Errorf("git identity of %s: %w", s.Name, idErr))
		}
	} else {
		if b.base == "" {
			b.base = b.sb.GetBaseCommit()
		}
		// The branch starts at the base pinned when the session was
		// created, which a sandbox cloned earlier (warm pool) or later
		// (the repository moved on) may not be at.
		if err := m.tool(ctx, b.sb.GetId(), b.token, sandboxtool.CommandInitWork, sandboxtool.InitWorkRequest{WorkDir: b.sb.GetWorkDir(), Branch: s.Branch, Base: b.base}, nil); err != nil {
			return fail(fmt.Errorf("create branch %s: %w", s.Branch, err))
		}
		if err := m.applyLocalWork(ctx, s, b.sb, b.token); err != nil {
			return fail(err)
		}
	}
	return b, nil
}

// leased remembers a newly leased sandbox and starts renewing its lease.
func (m *Manager) leased(name string, acq *sandboxv1.AcquireSandboxResponse) *booted {
	b := &booted{sb: acq.GetSandbox(), token: acq.GetLease().GetFencingToken()}
	m.mu.Lock()
	m.sandboxes[b.sb.GetId()] = b.sb
	m.mu.Unlock()
	m.keepLease(name, b.sb.GetId(), b.token)
	return b
}

// record puts a prepared sandbox on s's record (active also marks it
// active now); on failure the sandbox is released.
func (m *Manager) record(ctx context.Context, s *store.Session, b *booted, active bool) (*store.Session, error) {
	updated, err := m.d.Store.UpdateSession(ctx, s.Name, func(cur *store.Session) error {
		cur.SandboxID = b.sb.GetId()
		cur.FencingToken = b.token
		if cur.BaseCommit == "" {
			cur.BaseCommit = b.base
		}
		if active {
			cur.LastActiveAt = m.now()
		}
		return nil
	})
	if err != nil {
		m.releaseSandbox(context.WithoutCancel(ctx), s.Name, b.sb.GetId(), b.token, "")
		return nil, fmt.Errorf("record sandbox of %s: %w", s.Name, err)
	}
	if b.restored == nil {
		m.forgetLocalWork(ctx, s.Name)
	}
	return updated, nil
}

// releaseSandbox gives a sandbox back (destroyed, never pooled) and
// forgets it. With cacheCheckpoint (the checkpoint its tree holds, just
// captured) the sandbox service may keep it for the session's next boot
// instead.
func (m *Manager) releaseSandbox(ctx context.Context, name, sandboxID string, token uint64, cacheCheckpoint string) {
	m.dropLease(name)
	m.mu.Lock()
	delete(m.sandboxes, sandboxID)
	m.mu.Unlock()
	resp, err := m.d.Sandboxes.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: sandboxID, FencingToken: token, CacheCheckpoint: cacheCheckpoint})
	if err != nil {
		m.log.WarnContext(ctx, "sandbox release failed", "session", name, "sandbox", sandboxID, "error", err)
		return
	}
	if resp.GetCached() {
		return // kept, not destroyed: nothing to wait for
	}
	// Destruction runs after the release returns (destroy hooks first). Wait
	// for it: a suspended session has no sandbox, and the next boot reuses
	// the work tree path.
	wait, cancel := context.WithTimeout(ctx, releaseWait)
	defer cancel()
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, 500*time.Millisecond) {
		_, err := m.d.Sandboxes.GetSandbox(wait, &sandboxv1.GetSandboxRequest{SandboxId: sandboxID})
		if status.Code(err) == codes.NotFound {
			return
		}
		select {
		case <-wait.Done():
			m.log.WarnContext(ctx, "released sandbox not destroyed in time", "session", name, "sandbox", sandboxID)
			return
		case <-time.After(delay):
		}
	}
}

// killProcesses ends every process in a session's sandbox (what a turn or
// a command left running, detached or not), so that a checkpoint reads a
// tree nothing writes. A failure is logged: the checkpoint is still taken.
func (m *Manager) killProcesses(ctx context.Context, name, sandboxID string, token uint64) {
	if _, err := m.d.Sandboxes.KillProcesses(ctx, &sandboxv1.KillProcessesRequest{SandboxId: sandboxID, FencingToken: token}); err != nil {
		m.log.WarnContext(ctx, "sandbox processes not ended before a checkpoint", "session", name, "sandbox", sandboxID, "error", err)
	}
}

// releaseWait bounds waiting for a released sandbox to be destroyed (its
// destroy hooks may checkpoint first).
const releaseWait = 2 * time.Minute

// agentDir is where hangar-agent writes, under the sandbox's HOME.
func agentDir(sb *sandboxv1.Sandbox) string { return path.Join(sb.GetHomeDir(), ".hangar-agent") }

// lastLines keeps the end of a command's stderr for an error message.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
