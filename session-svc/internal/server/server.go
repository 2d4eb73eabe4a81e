// Package server implements hangar.session.v1: sessions, turns and jobs.
package server

import (
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// Sessions serves hangar.session.v1.SessionService. The session issue fills
// it in; until then every RPC answers Unimplemented.
type Sessions struct {
	sessionv1.UnimplementedSessionServiceServer
}

// Jobs serves hangar.session.v1.JobService.
type Jobs struct {
	sessionv1.UnimplementedJobServiceServer
}
