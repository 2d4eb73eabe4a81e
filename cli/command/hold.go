package command

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// A command using a session's sandbox holds the session open for its whole
// run (spec: "Staying open while you work"): the hold is renewed while the
// command runs and released when it ends; a crashed CLI's hold lapses after
// holdTTL.
const (
	holdTTL   = time.Minute
	holdRenew = holdTTL / 3
)

// holdSession takes a hold of kind on a session and keeps it until the
// returned function is called. Holding is best effort: when the hold can't
// be taken the command still runs, as the sandbox is what it needs.
func holdSession(ctx context.Context, sessions sessionv1.SessionServiceClient, name string, kind sessionv1.HoldKind, what string) func() {
	host, _ := os.Hostname()
	acquire := &sessionv1.AcquireHoldRequest{
		Name: name, Owner: fmt.Sprintf("cli/%s/%d", host, os.Getpid()), Kind: kind,
		Description: what, TtlSeconds: int32(holdTTL / time.Second),
	}
	resp, err := sessions.AcquireHold(ctx, acquire)
	if err != nil {
		return func() {}
	}
	id := resp.GetHold().GetId()
	renewCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(holdRenew)
		defer ticker.Stop()
		for {
			select {
			case <-renewCtx.Done():
				return
			case <-ticker.C:
				_, err := sessions.RenewHold(renewCtx, &sessionv1.RenewHoldRequest{Name: name, HoldId: id, TtlSeconds: int32(holdTTL / time.Second)})
				if status.Code(err) == codes.NotFound {
					// The hold vanished (a Redis restarted without its
					// data): take it again.
					if again, err := sessions.AcquireHold(renewCtx, acquire); err == nil {
						id = again.GetHold().GetId()
					}
				}
			}
		}
	}()
	return func() {
		cancel()
		<-done
		releaseCtx, stop := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer stop()
		_, _ = sessions.ReleaseHold(releaseCtx, &sessionv1.ReleaseHoldRequest{Name: name, HoldId: id})
	}
}

// holdSandboxSession holds the session whose sandbox this is, if a session
// holds its lease.
func holdSandboxSession(ctx context.Context, sandboxes sandboxv1.SandboxServiceClient, sessions sessionv1.SessionServiceClient, sandboxID string, kind sessionv1.HoldKind, what string) func() {
	name := sandboxSessionName(ctx, sandboxes, sandboxID)
	if name == "" {
		return func() {}
	}
	return holdSession(ctx, sessions, name, kind, what)
}

// sandboxSessionName is the session holding a sandbox's lease, "" when
// none does.
func sandboxSessionName(ctx context.Context, sandboxes sandboxv1.SandboxServiceClient, sandboxID string) string {
	resp, err := sandboxes.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: sandboxID})
	if err != nil {
		return ""
	}
	name, _ := strings.CutPrefix(resp.GetSandbox().GetLease().GetHolder(), "session/")
	if name == resp.GetSandbox().GetLease().GetHolder() {
		return ""
	}
	return name
}
