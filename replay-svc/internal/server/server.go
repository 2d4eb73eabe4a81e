// Package server implements hangar.replay.v1: fork at a step.
package server

import (
	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
)

// Replays serves hangar.replay.v1.ReplayService. The fork-at-a-step issue
// fills it in; until then every RPC answers Unimplemented.
type Replays struct {
	replayv1.UnimplementedReplayServiceServer
}
