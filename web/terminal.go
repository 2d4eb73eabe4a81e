package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/platform/auth"
)

// A terminal holds its session for as long as it is open (the spec's
// terminal hold): taken with holdTTL, renewed every holdRenew, released when
// the WebSocket closes; a hangar that dies leaves it to lapse.
const (
	holdTTL   = time.Minute
	holdRenew = holdTTL / 3
)

// Terminal kinds: a shell in the work tree, or the agent CLI resuming the
// session's conversation (its resume_command, through a gateway run of its
// own: StartInteractive).
const (
	kindShell = "shell"
	kindAgent = "agent"
)

// The WebSocket protocol: the browser sends keystrokes as binary messages
// and {"type":"resize","rows":R,"cols":C} as text; the server sends the pty's
// output as binary messages and, as text, {"type":"ready","terminal_id":..,
// "command":..} once attached, {"type":"exit","code":N} when the process
// ended and {"type":"error","message":..} when the terminal could not run.
type controlMessage struct {
	Type       string `json:"type"`
	Rows       uint32 `json:"rows,omitempty"`
	Cols       uint32 `json:"cols,omitempty"`
	TerminalID string `json:"terminal_id,omitempty"`
	Command    string `json:"command,omitempty"`
	Code       *int32 `json:"code,omitempty"`
	Message    string `json:"message,omitempty"`
}

// maxInputBytes caps one message from the browser (a paste).
const maxInputBytes = 1 << 20

var upgrader = websocket.Upgrader{
	ReadBufferSize:  32 << 10,
	WriteBufferSize: 32 << 10,
	// Cross-site WebSocket hijacking: the handshake must come from this
	// origin (the cookie is SameSite=Strict as well).
	CheckOrigin: auth.SameOrigin,
}

// serveTerminal is GET /ui/terminal?session=NAME&kind=shell|agent&rows=R&cols=C,
// a WebSocket to a new pty in the session's sandbox.
func (h *Handler) serveTerminal(w http.ResponseWriter, r *http.Request) {
	if !h.authorized(r) {
		auth.WriteUnauthorized(w, r)
		return
	}
	q := r.URL.Query()
	name, kind := q.Get("session"), q.Get("kind")
	if name == "" {
		writeError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "session: the session's name is required")
		return
	}
	if kind == "" {
		kind = kindShell
	}
	if kind != kindShell && kind != kindAgent {
		writeError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "kind: want shell or agent")
		return
	}
	size := &sandboxv1.TerminalSize{Rows: parseDim(q.Get("rows"), 24), Cols: parseDim(q.Get("cols"), 80)}
	ws, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader answered
	}
	defer ws.Close()
	ws.SetReadLimit(maxInputBytes)
	// The terminal lives as long as the WebSocket, not the handshake.
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	logger := h.logger.With(slog.String("session", name), slog.String("kind", kind))
	if err := h.runTerminal(ctx, ws, name, kind, size, r.RemoteAddr); err != nil {
		logger.LogAttrs(ctx, slog.LevelInfo, "dashboard terminal ended", slog.String("error", err.Error()))
		_ = writeControl(ws, controlMessage{Type: "error", Message: terminalErrorText(err)})
	}
	_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
}

func parseDim(s string, def uint32) uint32 {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return def
	}
	return uint32(n)
}

// terminalErrorText is what the browser is told: the status message of a
// service's refusal (already written for users), never internal text.
func terminalErrorText(err error) string {
	var userErr userError
	if errors.As(err, &userErr) {
		return string(userErr)
	}
	if st, ok := status.FromError(errors.Unwrap(err)); ok && st.Code() != codes.Unknown && st.Code() != codes.Internal {
		return st.Message()
	}
	return "the terminal could not be opened: see hangar's log"
}

// userError is a message for the browser as it is.
type userError string

func (e userError) Error() string { return string(e) }

// runTerminal opens the pty and pumps it to and from ws until either side
// ends.
func (h *Handler) runTerminal(ctx context.Context, ws *websocket.Conn, name, kind string, size *sandboxv1.TerminalSize, remote string) error {
	got, err := h.sessions.GetSession(ctx, &sessionv1.GetSessionRequest{Name: name})
	if err != nil {
		return fmt.Errorf("get session: %w", err)
	}
	sandboxID := got.GetSession().GetSandboxId()
	if sandboxID == "" {
		return userError(fmt.Sprintf("session %s is not open: open it first", name))
	}
	release := h.hold(ctx, name, remote, kind)
	defer release()

	// A closed tab cannot re-attach: the terminal ends with the WebSocket,
	// its process and everything started there (`sleep 1000 &`) killed.
	open := &sandboxv1.TerminalOpen{SandboxId: sandboxID, Size: size, EndOnDetach: true}
	var command string
	if kind == kindAgent {
		in, err := h.sessions.StartInteractive(ctx, &sessionv1.StartInteractiveRequest{Name: name})
		if err != nil {
			return fmt.Errorf("start interactive: %w", err)
		}
		defer func() {
			endCtx, stop := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer stop()
			_, _ = h.sessions.EndInteractive(endCtx, &sessionv1.EndInteractiveRequest{Name: name, Run: in.GetRun()})
		}()
		command = in.GetCommand()
		open.SandboxId = in.GetSandboxId()
		open.Env = in.GetEnv()
		open.Command = []string{"sh", "-c", command}
	}

	// The stream ends when either side does.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := h.sandboxes.AttachTerminal(ctx)
	if err != nil {
		return fmt.Errorf("attach terminal: %w", err)
	}
	var sendMu sync.Mutex
	send := func(m *sandboxv1.AttachTerminalRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	if err := send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Open{Open: open}}); err != nil {
		return fmt.Errorf("attach terminal: %w", stream.RecvMsg(new(sandboxv1.AttachTerminalResponse)))
	}
	first, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("attach terminal: %w", err)
	}
	if err := writeControl(ws, controlMessage{Type: "ready", TerminalID: first.GetTerminalId(), Command: command}); err != nil {
		return nil // the browser went away
	}

	// Browser → pty. When the WebSocket closes, the terminal detaches and,
	// opened with end_on_detach, the sandbox kills its processes.
	go func() {
		defer cancel()
		for {
			typ, data, err := ws.ReadMessage()
			if err != nil {
				_ = send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Detach{Detach: true}})
				return
			}
			switch typ {
			case websocket.BinaryMessage:
				if len(data) > 0 && send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Input{Input: data}}) != nil {
					return
				}
			case websocket.TextMessage:
				var m controlMessage
				if json.Unmarshal(data, &m) == nil && m.Type == "resize" && m.Rows > 0 && m.Cols > 0 {
					_ = send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Resize{Resize: &sandboxv1.TerminalSize{Rows: m.Rows, Cols: m.Cols}}})
				}
			}
		}
	}()
	// pty → browser (the only writer of ws from here on).
	for {
		msg, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil || status.Code(err) == codes.Canceled {
				return nil // the browser closed the terminal
			}
			return fmt.Errorf("terminal stream: %w", err)
		}
		switch m := msg.GetMsg().(type) {
		case *sandboxv1.AttachTerminalResponse_Output:
			if err := ws.WriteMessage(websocket.BinaryMessage, m.Output); err != nil {
				return nil
			}
		case *sandboxv1.AttachTerminalResponse_Exit:
			code := m.Exit.GetExitCode()
			_ = writeControl(ws, controlMessage{Type: "exit", Code: &code})
			return nil
		}
	}
}

func writeControl(ws *websocket.Conn, m controlMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return ws.WriteMessage(websocket.TextMessage, b)
}

// hold takes a terminal hold on the session and renews it until the
// returned function is called, which releases it. Best effort: the terminal
// still opens when the hold cannot be taken.
func (h *Handler) hold(ctx context.Context, name, remote, kind string) func() {
	acquire := &sessionv1.AcquireHoldRequest{
		Name: name, Owner: "dashboard/" + remote, Kind: sessionv1.HoldKind_HOLD_KIND_TERMINAL,
		Description: "dashboard " + kind + " terminal", TtlSeconds: int32(holdTTL / time.Second),
	}
	resp, err := h.sessions.AcquireHold(ctx, acquire)
	if err != nil {
		h.logger.LogAttrs(ctx, slog.LevelWarn, "dashboard terminal hold not taken", slog.String("session", name), slog.String("error", err.Error()))
		return func() {}
	}
	id := resp.GetHold().GetId()
	renewCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(holdRenew)
		defer ticker.Stop()
		for {
			select {
			case <-renewCtx.Done():
				return
			case <-ticker.C:
				_, err := h.sessions.RenewHold(renewCtx, &sessionv1.RenewHoldRequest{Name: name, HoldId: id, TtlSeconds: int32(holdTTL / time.Second)})
				if status.Code(err) == codes.NotFound {
					if again, err := h.sessions.AcquireHold(renewCtx, acquire); err == nil {
						id = again.GetHold().GetId()
					}
				}
			}
		}
	}()
	return func() {
		stop()
		<-done
		releaseCtx, cancelRelease := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancelRelease()
		_, _ = h.sessions.ReleaseHold(releaseCtx, &sessionv1.ReleaseHoldRequest{Name: name, HoldId: id})
	}
}
