package server

import (
	"bytes"
	"context"
)

// ReapNow runs one pass of the lease reaper.
func (s *Server) ReapNow(ctx context.Context) { s.reap(ctx) }

// Subscribers is the number of destroy-notice subscribers.
func (s *Server) Subscribers() int { return s.hooks.Subscribers() }

// TerminalScrollbackContains reports whether a terminal's kept output
// contains want.
func (s *Server) TerminalScrollbackContains(id, want string) bool {
	s.mu.Lock()
	t := s.terminals[id]
	s.mu.Unlock()
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return bytes.Contains(t.ring, []byte(want))
}

// HasTerminal reports whether the server still keeps terminal id.
func (s *Server) HasTerminal(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.terminals[id] != nil
}

// PoolIDOf is the pool id (driver.Spec.Pool) of environment name's warm
// sandboxes as it is stored now.
func (s *Server) PoolIDOf(ctx context.Context, name string) (string, error) {
	e, err := s.envs.GetWith(ctx, name, "")
	if err != nil {
		return "", err
	}
	return poolID(*e), nil
}

// LocalPoolReady is how many ready sandboxes the default environment's
// pool of repo holds (-1: it has none).
func (s *Server) LocalPoolReady(repo string) int {
	s.mu.Lock()
	lp := s.localPools[repo]
	s.mu.Unlock()
	if lp == nil {
		return -1
	}
	return lp.pool.Stats().Ready
}
