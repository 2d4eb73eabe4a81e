package server

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"sync"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// scrollback is how much recent output a re-attach replays.
const scrollback = 64 << 10

// termSession keeps a terminal's process alive between attaches: a pump
// drains the pty all the time (a detached shell never blocks on output),
// keeps the last 64 KiB and forwards output to the attached client.
type termSession struct {
	id        string
	sandboxID string
	term      driver.Terminal

	mu   sync.Mutex
	ring []byte
	sub  chan []byte   // the attached client's output; nil when detached
	gone chan struct{} // closed when that client detaches
	done chan struct{} // closed when the process ended
	exit driver.ExitStatus
	// endOnDetach: the terminal ends when its client leaves
	// (TerminalOpen.end_on_detach).
	endOnDetach bool
}

func (t *termSession) pump() {
	buf := make([]byte, 32<<10)
	for {
		n, err := t.term.Read(buf)
		if n > 0 {
			chunk := append([]byte(nil), buf[:n]...)
			t.mu.Lock()
			t.ring = append(t.ring, chunk...)
			if len(t.ring) > scrollback {
				t.ring = append([]byte(nil), t.ring[len(t.ring)-scrollback:]...)
			}
			sub, gone := t.sub, t.gone
			t.mu.Unlock()
			if sub != nil {
				select {
				case sub <- chunk:
				case <-gone:
				}
			}
		}
		if err != nil {
			break
		}
	}
	st, _ := t.term.Wait()
	t.mu.Lock()
	t.exit = st
	t.mu.Unlock()
	close(t.done)
}

// attach makes the caller the one attached client; it returns the
// scrollback to replay first.
func (t *termSession) attach() (<-chan []byte, []byte, func(), error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sub != nil {
		return nil, nil, nil, fault.FailedPrecondition("TERMINAL_ATTACHED", "terminal %q already has a client attached", t.id)
	}
	sub, gone := make(chan []byte, 16), make(chan struct{})
	t.sub, t.gone = sub, gone
	back := append([]byte(nil), t.ring...)
	return sub, back, func() {
		t.mu.Lock()
		if t.sub == sub {
			t.sub, t.gone = nil, nil
		}
		t.mu.Unlock()
		close(gone)
	}, nil
}

func (s *Server) closeTerminals(sandboxID string) {
	s.mu.Lock()
	var ts []*termSession
	for id, t := range s.terminals {
		if t.sandboxID == sandboxID {
			ts = append(ts, t)
			delete(s.terminals, id)
		}
	}
	s.mu.Unlock()
	for _, t := range ts {
		_ = t.term.Kill()
	}
}

// endTerminal kills the terminal's process and everything it started and forgets
// the terminal.
func (s *Server) endTerminal(t *termSession) {
	s.mu.Lock()
	if s.terminals[t.id] == t {
		delete(s.terminals, t.id)
	}
	s.mu.Unlock()
	_ = t.term.Kill()
}

// AttachTerminal starts or re-attaches a pty. Detach (or the client going
// away) leaves the process running, unless the open said end_on_detach;
// its exit ends the stream.
func (s *Server) AttachTerminal(stream sandboxv1.SandboxService_AttachTerminalServer) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return fault.InvalidArgument("open", "the first terminal message must be open")
		}
		return err
	}
	open := first.GetOpen()
	if open == nil {
		return fault.InvalidArgument("open", "the first terminal message must be open")
	}
	e, err := s.use(ctx, open.GetSandboxId(), open.GetFencingToken())
	if err != nil {
		return err
	}
	defer trackUse(ctx, e, useTerminal, commandLine(open.GetCommand()))()
	var t *termSession
	if id := open.GetTerminalId(); id != "" {
		s.mu.Lock()
		t = s.terminals[id]
		s.mu.Unlock()
		if t == nil || t.sandboxID != e.id {
			return fault.NotFound("TERMINAL_NOT_FOUND", "terminal %q not found in sandbox %q", id, e.id)
		}
		if sz := open.GetSize(); sz != nil && sz.GetRows() > 0 && sz.GetCols() > 0 {
			_ = t.term.Resize(uint16(sz.GetRows()), uint16(sz.GetCols()))
		}
	} else {
		env := map[string]string{}
		for k, v := range e.extraEnv {
			env[k] = v
		}
		for k, v := range open.GetEnv() {
			env[k] = v
		}
		term, err := e.sb.Terminal(s.ctx, driver.TerminalRequest{
			Argv: open.GetCommand(), Env: env, PathPrepend: open.GetPathPrepend(),
			Rows: uint16(open.GetSize().GetRows()), Cols: uint16(open.GetSize().GetCols()),
		})
		if err != nil {
			if errors.Is(err, driver.ErrDestroyed) {
				return fileErr(e.id, "", err)
			}
			return fault.Wrap(fault.KindFailedPrecondition, "TERMINAL_START_FAILED", "the terminal command could not be started", err)
		}
		var b [6]byte
		_, _ = rand.Read(b[:])
		t = &termSession{id: "term-" + hex.EncodeToString(b[:]), sandboxID: e.id, term: term, done: make(chan struct{})}
		s.mu.Lock()
		s.terminals[t.id] = t
		s.mu.Unlock()
		go func() {
			t.pump()
			s.mu.Lock()
			if s.terminals[t.id] == t {
				delete(s.terminals, t.id)
			}
			s.mu.Unlock()
		}()
	}
	out, back, detach, err := t.attach()
	if err != nil {
		return err
	}
	defer detach()
	if open.GetEndOnDetach() {
		t.mu.Lock()
		t.endOnDetach = true
		t.mu.Unlock()
	}
	// Unless the process ended, the client left (detach, its stream ended
	// or broke): a terminal opened with end_on_detach ends with it.
	defer func() {
		select {
		case <-t.done:
			return
		default:
		}
		t.mu.Lock()
		end := t.endOnDetach
		t.mu.Unlock()
		if end {
			s.endTerminal(t)
		}
	}()
	var sendMu sync.Mutex
	send := func(m *sandboxv1.AttachTerminalResponse) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	if err := send(&sandboxv1.AttachTerminalResponse{Msg: &sandboxv1.AttachTerminalResponse_TerminalId{TerminalId: t.id}}); err != nil {
		return err
	}
	if len(back) > 0 {
		if err := send(&sandboxv1.AttachTerminalResponse{Msg: &sandboxv1.AttachTerminalResponse_Output{Output: back}}); err != nil {
			return err
		}
	}
	detached := make(chan struct{})
	go func() {
		defer close(detached)
		for {
			msg, err := stream.Recv()
			if err != nil {
				return
			}
			switch m := msg.GetMsg().(type) {
			case *sandboxv1.AttachTerminalRequest_Input:
				if _, err := t.term.Write(m.Input); err != nil {
					return
				}
			case *sandboxv1.AttachTerminalRequest_Resize:
				_ = t.term.Resize(uint16(m.Resize.GetRows()), uint16(m.Resize.GetCols()))
			case *sandboxv1.AttachTerminalRequest_Detach:
				return
			}
		}
	}()
	for {
		select {
		case chunk := <-out:
			if err := send(&sandboxv1.AttachTerminalResponse{Msg: &sandboxv1.AttachTerminalResponse_Output{Output: chunk}}); err != nil {
				return err
			}
		case <-t.done:
			// Deliver what the pump forwarded before the end.
			for {
				select {
				case chunk := <-out:
					if err := send(&sandboxv1.AttachTerminalResponse{Msg: &sandboxv1.AttachTerminalResponse_Output{Output: chunk}}); err != nil {
						return err
					}
					continue
				default:
				}
				break
			}
			t.mu.Lock()
			st := t.exit
			t.mu.Unlock()
			return send(&sandboxv1.AttachTerminalResponse{Msg: &sandboxv1.AttachTerminalResponse_Exit{
				Exit: &sandboxv1.ExecExit{ExitCode: int32(st.Code), Signal: st.Signal}}})
		case <-detached:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}
