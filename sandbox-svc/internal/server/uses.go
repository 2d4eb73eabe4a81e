package server

import (
	"context"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
)

// Kinds of use (sandboxv1.SandboxUse.kind).
const (
	useExec      = "exec"
	useTerminal  = "terminal"
	useReadFile  = "read_file"
	useWriteFile = "write_file"
)

// maxUseDescription bounds a use's description (a long command line).
const maxUseDescription = 200

// useSet is a sandbox's live uses and when the last one ended, so the
// session service can hold the sandbox's session open for callers that go
// straight to the sandbox API (it reads them with GetSandbox). They live in
// this process, with the sandbox.
type useSet struct {
	mu   sync.Mutex
	next uint64
	live map[uint64]*sandboxv1.SandboxUse
	last time.Time
}

// trackUse records a caller's use of e until the returned function is
// called. A call a hangar service makes for its own work is not a use.
func trackUse(ctx context.Context, e *entry, kind, description string) func() {
	if sandboxexec.IsServiceCall(ctx) {
		return func() {}
	}
	if len(description) > maxUseDescription {
		description = description[:maxUseDescription] + "…"
	}
	u := &e.uses
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.live == nil {
		u.live = map[uint64]*sandboxv1.SandboxUse{}
	}
	u.next++
	id := u.next
	u.live[id] = &sandboxv1.SandboxUse{Kind: kind, Description: description, StartedAt: timestamppb.Now()}
	var once sync.Once
	return func() {
		once.Do(func() {
			u.mu.Lock()
			defer u.mu.Unlock()
			delete(u.live, id)
			u.last = time.Now()
		})
	}
}

// fill sets p's uses and last_used_at, oldest use first.
func (u *useSet) fill(p *sandboxv1.Sandbox) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for id := uint64(1); id <= u.next && len(p.Uses) < len(u.live); id++ {
		if use, ok := u.live[id]; ok {
			p.Uses = append(p.Uses, use)
		}
	}
	if !u.last.IsZero() {
		p.LastUsedAt = timestamppb.New(u.last)
	}
}

func commandLine(argv []string) string { return strings.Join(argv, " ") }
