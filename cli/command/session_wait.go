package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/term"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// Exit codes of -w for turns that did not complete.
const (
	sessionExitFailed      = 1
	sessionExitOverBudget  = 2
	sessionExitInterrupted = 3
)

// sessionTurnExit is the process's answer to a finished turn: nil for completed and
// needs_input, an *ExitError otherwise (its outcome line already said why).
func sessionTurnExit(t *sessionv1.Turn) error {
	switch t.GetOutcome() {
	case sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED, sessionv1.TurnOutcome_TURN_OUTCOME_NEEDS_INPUT:
		return nil
	case sessionv1.TurnOutcome_TURN_OUTCOME_OVER_BUDGET:
		return &ExitError{Code: sessionExitOverBudget}
	case sessionv1.TurnOutcome_TURN_OUTCOME_INTERRUPTED:
		return &ExitError{Code: sessionExitInterrupted}
	default:
		return &ExitError{Code: sessionExitFailed}
	}
}

// sessionWaitForTurn follows a turn with WaitForTurn: each event as a line as it
// arrives, tool calls waiting on approval with the command that answers
// them, a spinner while nothing happens (on a terminal only), then the
// outcome and the agent's result.
func sessionWaitForTurn(ctx context.Context, c sessionv1.SessionServiceClient, streams Streams, name string, number int32) error {
	p := sessionNewTurnProgress(streams.Out, sessionIsTerminal(streams.Out), fmt.Sprintf("turn %d running", number), time.Now)
	defer p.stop()
	stopApprovals := sessionWatchApprovals(ctx, c, name, "", sessionApprovalPoll, p.println)
	t, err := sessionFollowTurn(ctx, c, name, number, func(e *sessionv1.Event) { p.println(sessionFormatEvent(e, time.Now())) })
	stopApprovals()
	p.stop()
	if err != nil {
		return err
	}
	sessionWriteTurnEnd(streams.Out, name, t)
	return sessionTurnExit(t)
}

// sessionFollowTurn streams a turn's updates: each event to onEvent, then
// the finished turn.
func sessionFollowTurn(ctx context.Context, c sessionv1.SessionServiceClient, name string, number int32, onEvent func(*sessionv1.Event)) (*sessionv1.Turn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.WaitForTurn(ctx, &sessionv1.WaitForTurnRequest{Name: name, Turn: number})
	if err != nil {
		return nil, sessionCallErr(err)
	}
	for {
		resp, err := stream.Recv()
		switch {
		case errors.Is(err, io.EOF):
			return nil, fmt.Errorf("the server stopped sending turn %d of %s before it ended: see hangar session get %s", number, name, name)
		case status.Code(err) == codes.Canceled || (err != nil && ctx.Err() != nil):
			return nil, fmt.Errorf("stopped waiting; turn %d of %s goes on (follow it: hangar session events %s --follow --turn %d)", number, name, name, number)
		case err != nil:
			return nil, sessionCallErr(err)
		}
		switch u := resp.GetUpdate().(type) {
		case *sessionv1.WaitForTurnResponse_Progress:
			onEvent(u.Progress)
		case *sessionv1.WaitForTurnResponse_Result:
			return u.Result, nil
		}
	}
}

// sessionApprovalPoll is how often -w looks for tool calls waiting on
// approval (the contract pushes no event for them; one ListApprovals is a
// Redis read and a gateway call, well under a millisecond on loopback).
const sessionApprovalPoll = time.Second

// sessionWatchApprovals, for a session under --approvals ask, prints each
// tool call that starts waiting on approval, once, with the commands that
// answer it, until the returned function is called.
func sessionWatchApprovals(ctx context.Context, c sessionv1.SessionServiceClient, name, prefix string, every time.Duration, println func(string)) func() {
	got, err := c.GetSession(ctx, &sessionv1.GetSessionRequest{Name: name})
	if err != nil || got.GetSession().GetApprovals() != sessionv1.ApprovalMode_APPROVAL_MODE_ASK {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		seen := map[string]bool{}
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			resp, err := c.ListApprovals(ctx, &sessionv1.ListApprovalsRequest{Name: name})
			if err == nil {
				for _, a := range resp.GetApprovals() {
					if seen[a.GetId()] || a.GetState() != sessionv1.ApprovalState_APPROVAL_STATE_PENDING {
						continue
					}
					seen[a.GetId()] = true
					println(prefix + sessionFormatPendingApproval(name, a))
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// sessionFormatPendingApproval is one waiting tool call and how to answer
// it.
func sessionFormatPendingApproval(name string, a *sessionv1.Approval) string {
	input := sessionOneLine(a.GetInputJson())
	if len(input) > 120 {
		input = input[:117] + "..."
	}
	return fmt.Sprintf("approval needed: %s %s\n  allow: hangar session approvals %s --allow %s\n  deny:  hangar session approvals %s --deny %s",
		a.GetToolName(), input, name, a.GetId(), name, a.GetId())
}

// sessionIsTerminal says whether w is a terminal (a spinner makes sense there and
// nowhere else).
func sessionIsTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}

// sessionSpinnerFrames turn every sessionSpinnerEvery while a turn runs.
var sessionSpinnerFrames = []string{"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"}

const sessionSpinnerEvery = 120 * time.Millisecond

// sessionTurnProgress writes event lines; on a terminal it keeps a spinner line
// ("⠙ turn 2 running · 12s") below them, redrawn by its own goroutine.
type sessionTurnProgress struct {
	out   io.Writer
	tty   bool
	label string
	now   func() time.Time
	start time.Time

	mu      sync.Mutex
	frame   int
	shown   bool
	stopped bool
	done    chan struct{}
	wg      sync.WaitGroup
}

func sessionNewTurnProgress(out io.Writer, tty bool, label string, now func() time.Time) *sessionTurnProgress {
	p := &sessionTurnProgress{out: out, tty: tty, label: label, now: now, start: now(), done: make(chan struct{})}
	if tty {
		p.wg.Add(1)
		go p.spin()
	}
	return p
}

func (p *sessionTurnProgress) spin() {
	defer p.wg.Done()
	t := time.NewTicker(sessionSpinnerEvery)
	defer t.Stop()
	p.mu.Lock()
	p.draw()
	p.mu.Unlock()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			p.mu.Lock()
			p.frame++
			p.draw()
			p.mu.Unlock()
		}
	}
}

// draw shows the spinner line; p.mu is held.
func (p *sessionTurnProgress) draw() {
	if p.stopped {
		return
	}
	fmt.Fprintf(p.out, "\r\x1b[K%s %s · %s", sessionSpinnerFrames[p.frame%len(sessionSpinnerFrames)], p.label, sessionDuration(p.now().Sub(p.start)))
	p.shown = true
}

// clear removes the spinner line; p.mu is held.
func (p *sessionTurnProgress) clear() {
	if p.shown {
		fmt.Fprint(p.out, "\r\x1b[K")
		p.shown = false
	}
}

// println writes one line above the spinner.
func (p *sessionTurnProgress) println(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
	fmt.Fprintln(p.out, line)
	if p.tty {
		p.draw()
	}
}

// stop ends the spinner and clears its line; it may be called again.
func (p *sessionTurnProgress) stop() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.stopped = true
	p.clear()
	p.mu.Unlock()
	close(p.done)
	p.wg.Wait()
}
