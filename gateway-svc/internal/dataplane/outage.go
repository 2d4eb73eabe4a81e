package dataplane

import (
	"context"
	"errors"
	"time"

	"github.com/hangar-dev/hangar/gateway-svc/internal/runs"
)

// storeOutageWait is how long a model call waits out a run store (Redis)
// that can't be reached before answering 503: a Redis restart or failover
// takes seconds, and an agent CLI does not always retry a 503 (Claude
// Code ends the turn), so the gateway rides the blip out itself. The
// agent sees a slow call, not a failed turn.
const storeOutageWait = 30 * time.Second

// rideOut runs f until it succeeds, says something other than "the store
// is unreachable" (an unknown token, a missing run), storeOutageWait has
// passed or ctx ends; it returns f's last error.
func rideOut(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(storeOutageWait)
	delay := 100 * time.Millisecond
	for {
		err := f()
		if err == nil || errors.Is(err, runs.ErrUnknownToken) || errors.Is(err, runs.ErrNotFound) ||
			ctx.Err() != nil || time.Now().Add(delay).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}
