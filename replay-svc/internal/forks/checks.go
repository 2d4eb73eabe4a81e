package forks

import (
	"context"
	"fmt"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
)

// Opener opens a session's sandbox (session-svc OpenSession).
type Opener interface {
	OpenSession(ctx context.Context, in *sessionv1.OpenSessionRequest, opts ...grpcCallOption) (*sessionv1.OpenSessionResponse, error)
}

// SandboxChecks runs a job's check in a session's sandbox, as the job ran
// it on its attempts (`sh -c CHECK` in the work tree).
type SandboxChecks struct {
	Sessions  Opener
	Sandboxes sandboxv1.SandboxServiceClient
}

// Check opens session and runs check there; it returns the exit code.
func (c SandboxChecks) Check(ctx context.Context, session, check string) (int, error) {
	open, err := c.Sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: session})
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", session, err)
	}
	sb := open.GetSession().GetSandboxId()
	if sb == "" {
		return -1, fmt.Errorf("open %s: no sandbox", session)
	}
	code, err := sandboxexec.New(c.Sandboxes).Exec(ctx, sb, 0, []string{"sh", "-c", check}, nil, "", nil, nil, nil)
	if err != nil {
		return -1, fmt.Errorf("check in %s: %w", session, err)
	}
	return code, nil
}
