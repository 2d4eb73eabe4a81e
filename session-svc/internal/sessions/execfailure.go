package sessions

import (
	"errors"

	"github.com/hangar-dev/hangar/api/sandboxexec"
)

// execFailure is a failed turn's reason when the agent's exec ended without
// an exit code: a CLI killed by a signal (it crashed, or something killed
// it) ran and died, which is not the same as a CLI that could not run.
func execFailure(err error) string {
	var sig *sandboxexec.SignalError
	if errors.As(err, &sig) {
		return "the agent was killed by signal " + sig.Signal
	}
	return "the agent could not run: " + publicMessage(err)
}
