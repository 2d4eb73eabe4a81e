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
