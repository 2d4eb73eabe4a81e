package sessions

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hangar-dev/hangar/api/sandboxexec"
)

func TestExecFailure(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&sandboxexec.SignalError{Signal: "KILL"}, "the agent was killed by signal KILL"},
		{fmt.Errorf("run: %w", &sandboxexec.SignalError{Signal: "SEGV"}), "the agent was killed by signal SEGV"},
		{fmt.Errorf("exec: %w", status.Error(codes.FailedPrecondition, "lease expired")), "the agent could not run: lease expired"},
		{&sandboxexec.NotStartedError{Reason: "no such file"}, "the agent could not run: internal error"},
		{errors.New("stream broke"), "the agent could not run: internal error"},
	} {
		if got := execFailure(c.err); got != c.want {
			t.Errorf("execFailure(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
