package sessions

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/platform/fault"
)

func TestExecFailure(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&sandboxexec.SignalError{Signal: "KILL"}, "the agent was killed by signal KILL"},
		{fmt.Errorf("run: %w", &sandboxexec.SignalError{Signal: "SEGV"}), "the agent was killed by signal SEGV"},
		{fmt.Errorf("exec: %w", fault.Status(fault.FailedPrecondition("LEASE_EXPIRED", "lease expired")).Err()), "the agent could not run: lease expired"},
		{fmt.Errorf("exec: %w", status.Error(codes.Unavailable, "dial tcp 10.0.0.7:7001: connection refused")), "the agent could not run: " + fault.UnavailableMessage},
		{fmt.Errorf("exec: %w", status.Error(codes.NotFound, "stream 10.0.0.7 gone")), "the agent could not run: internal error"},
		{&sandboxexec.NotStartedError{Reason: "no such file"}, "the agent could not run: internal error"},
		{errors.New("stream broke"), "the agent could not run: internal error"},
	} {
		if got := execFailure(c.err); got != c.want {
			t.Errorf("execFailure(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
