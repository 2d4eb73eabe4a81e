package sessions

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// openForks opens forks that start from one checkpoint: the first is booted
// as any session is (sandbox, restore verified by the tree hash), the
// others get a copy of its sandbox (the sandbox service's copy_of), each
// moved onto its own branch and conversation paths and verified against
// the same tree hash. A fork whose copy can't be made or doesn't verify is
// booted on its own. The result and errors are per session. Only the first
// fork's record need exist yet: its boot starts, then rest waits for the
// others' (its errors, per session, are theirs).
func (m *Manager) openForks(ctx context.Context, names []string, rest func() []error) ([]*store.Session, []error) {
	out := make([]*store.Session, len(names))
	errs := make([]error, len(names))
	sessions := make([]*store.Session, len(names))
	first := -1
	var src *booted
	var srcErr error
	booting := make(chan struct{})
	begin := func(i int) {
		s, up, err := m.beginOpen(ctx, names[i])
		switch {
		case err != nil:
			errs[i] = err
		case up:
			out[i] = s
		default:
			sessions[i] = s
			if first < 0 {
				first = i
			}
		}
	}
	begin(0)
	if first == 0 {
		go func() {
			defer close(booting)
			src, srcErr = m.prepare(ctx, sessions[0])
		}()
	} else {
		close(booting)
	}
	restErrs := rest()
	for i := 1; i < len(names); i++ {
		if restErrs[i] != nil {
			errs[i] = restErrs[i]
			continue
		}
		begin(i)
	}
	<-booting
	switch {
	case first < 0:
		return out, errs
	case first > 0:
		src, srcErr = m.prepare(ctx, sessions[first])
	}
	var wg sync.WaitGroup
	prepared := make([]*booted, len(names))
	for i, s := range sessions {
		if s == nil || i == first {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if srcErr == nil {
				b, err := m.prepareCopy(ctx, s, sessions[first], src)
				if err == nil {
					prepared[i] = b
					return
				}
				m.log.InfoContext(ctx, "fork sandbox not copied; booting it on its own", "session", s.Name, "error", err)
			}
			prepared[i], errs[i] = m.prepare(ctx, s)
		}()
	}
	wg.Wait()
	// The first is recorded (and can be used) only now: nothing runs in
	// its sandbox while it is copied.
	prepared[first], errs[first] = src, srcErr
	for i, s := range sessions {
		if s == nil {
			continue
		}
		out[i], errs[i] = m.finishOpen(ctx, s, prepared[i], errs[i])
	}
	return out, errs
}

// errNoCopy says a fork's sandbox can't be a copy of its sibling's.
var errNoCopy = errors.New("not copyable")

// prepareCopy prepares s's sandbox as a copy of src, the sandbox prepared
// for srcSession from a checkpoint holding the same work (forks of one
// checkpoint): the copy's branch is renamed to s's, the conversation files
// moved to where s's harness looks for them, and, unless the copy shares
// src's files (the sandbox service says so), its work tree's hash must be
// the one src's restore verified. On failure the copy is released.
func (m *Manager) prepareCopy(ctx context.Context, s, srcSession *store.Session, src *booted) (*booted, error) {
	cp, err := m.restorePoint(ctx, s)
	if err != nil {
		return nil, err
	}
	if cp == nil || src.restored == nil || src.tree == "" {
		return nil, fmt.Errorf("%w: nothing restored to copy", errNoCopy)
	}
	from := src.restored
	if cp.GetTreeHash() != from.GetTreeHash() || cp.GetHeadCommit() != from.GetHeadCommit() ||
		cp.GetHarness() != from.GetHarness() || strings.Join(cp.GetConversationPaths(), "\x00") != strings.Join(from.GetConversationPaths(), "\x00") ||
		s.Branch == "" || srcSession.Branch == "" || s.Environment != srcSession.Environment {
		return nil, fmt.Errorf("%w: checkpoint %s is not the work of %s", errNoCopy, cp.GetId(), from.GetId())
	}
	acq, err := m.d.Sandboxes.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{
		Environment: s.Environment,
		Holder:      holder(s.Name),
		TtlSeconds:  int32(m.cfg.LeaseTTL / time.Second),
		WorkKey:     s.Name,
		CopyOf:      src.sb.GetId(), CopyOfFencingToken: src.token,
	})
	if err != nil {
		return nil, fmt.Errorf("copy sandbox of %s for %s: %w", srcSession.Name, s.Name, err)
	}
	b := m.leased(s.Name, acq)
	b.base, b.restored = src.base, cp
	fail := func(err error) (*booted, error) {
		m.releaseSandbox(context.WithoutCancel(ctx), s.Name, b.sb.GetId(), b.token, "")
		return nil, err
	}
	// The copy is checked byte for byte unless it shares the sibling's
	// files (then it holds them by construction).
	req := sandboxtool.CopyPrepareRequest{WorkDir: b.sb.GetWorkDir(), FromBranch: srcSession.Branch, ToBranch: s.Branch, Verify: !acq.GetSharedCopy()}
	had, want := conversationTargets(src.sb, from), conversationTargets(b.sb, cp)
	for i := range had {
		moved, ok := movePath(had[i], src.sb, b.sb)
		if !ok {
			return fail(fmt.Errorf("%w: conversation path %s is outside the sandbox", errNoCopy, had[i]))
		}
		if moved != want[i] {
			req.Moves = append(req.Moves, sandboxtool.Move{From: moved, To: want[i]})
		}
	}
	var resp sandboxtool.CopyPrepareResponse
	if err := m.toolJSON(ctx, b.sb.GetId(), b.token, sandboxtool.CommandCopyPrepare, req, &resp); err != nil {
		return fail(fmt.Errorf("move the copy to %s: %w", s.Name, err))
	}
	if got := resp.Tree; !acq.GetSharedCopy() && got != src.tree {
		return fail(fmt.Errorf("copied work tree of %s: tree %s, want %s", s.Name, got, src.tree))
	}
	b.tree = src.tree
	return b, nil
}

// conversationTargets is where a checkpoint's conversation paths are in sb
// once restored there (relocation's targets, else where they were).
func conversationTargets(sb *sandboxv1.Sandbox, cp *checkpointv1.Checkpoint) []string {
	out := append([]string(nil), cp.GetConversationPaths()...)
	for _, r := range relocation(sb, cp) {
		for i, p := range out {
			if p == r.GetFrom() {
				out[i] = r.GetTo()
			}
		}
	}
	return out
}

// movePath is where p, a path in sandbox a's work tree or home, is in b, a
// copy of a.
func movePath(p string, a, b *sandboxv1.Sandbox) (string, bool) {
	for _, d := range [][2]string{{a.GetWorkDir(), b.GetWorkDir()}, {a.GetHomeDir(), b.GetHomeDir()}} {
		if d[0] == "" || d[1] == "" {
			continue
		}
		if p == d[0] {
			return d[1], true
		}
		if rest, ok := strings.CutPrefix(p, d[0]+"/"); ok {
			return path.Join(d[1], rest), true
		}
	}
	return "", false
}
