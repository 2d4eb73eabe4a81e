package command

import (
	"context"
	"io"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// The session formatters, for the golden tests in package command_test.
var (
	SessionFormatList       = sessionFormatSessionList
	SessionFormat           = sessionFormatSession
	SessionFormatEvent      = sessionFormatEvent
	SessionFormatOutcome    = sessionFormatOutcome
	SessionWriteTurnEnd     = sessionWriteTurnEnd
	SessionWriteCreated     = sessionWriteCreated
	SessionWriteTurnStarted = sessionWriteTurnStarted
	SessionFormatArtifacts  = sessionFormatArtifacts
	SessionFormatApprovals  = sessionFormatApprovals
	SessionTurnExit         = sessionTurnExit
	SessionNewTurnProgress  = sessionNewTurnProgress
	SessionLocalWork        = sessionLocalWork
)

// Println and Stop drive a progress writer from tests.
func (p *sessionTurnProgress) Println(line string) { p.println(line) }
func (p *sessionTurnProgress) Stop()               { p.stop() }

// SessionPullFromPatch is pull's fallback, run in dir.
func SessionPullFromPatch(ctx context.Context, c sessionv1.SessionServiceClient, dir string, out io.Writer, name string, checkout bool) error {
	return sessionPullFromPatch(ctx, c, sessionGit{dir: dir}, out, name, "hangar/"+name, checkout)
}

// SessionPullFromWork is pull from GetSessionWork's answer, run in dir.
func SessionPullFromWork(ctx context.Context, dir string, out io.Writer, work *sessionv1.GetSessionWorkResponse, name string, checkout bool) error {
	return sessionPullFromWork(ctx, sessionGit{dir: dir}, out, work, "hangar/"+name, checkout)
}
