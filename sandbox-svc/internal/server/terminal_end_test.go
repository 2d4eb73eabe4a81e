package server_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool/tooltest"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/server"
)

// sleepers lists the processes running `sleep ARG`.
func sleepers(arg string) []string {
	var found []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	want := []byte("sleep\x00" + arg + "\x00")
	for _, d := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !bytes.Contains(cmdline, want) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join(d, "stat")); err == nil && bytes.Contains(stat, []byte(") Z ")) {
			continue // ended, not yet reaped
		}
		found = append(found, filepath.Base(d))
	}
	return found
}

// TestTerminalEndOnDetach: a terminal opened with end_on_detach (the
// dashboard's) ends when its client leaves, by detaching or by its stream
// going away: the shell and what it left running in the background
// (`sleep ... &`, in a process group of its own under job control) are
// killed and the terminal is forgotten. Without it, both stay.
func TestTerminalEndOnDetach(t *testing.T) {
	t.Run("bwrap", func(t *testing.T) { testTerminalEndOnDetach(t, start(t, nil)) })
	t.Run("no isolation", func(t *testing.T) {
		testTerminalEndOnDetach(t, start(t, func(d *server.Deps) {
			drv, err := local.New(local.Options{Root: d.Home, Tool: tooltest.Path(t), Isolation: local.IsolationNone})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { drv.Close() })
			d.Driver = drv
		}))
	})
}

func testTerminalEndOnDetach(t *testing.T, e *env) {
	ctx := context.Background()
	acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id, tok := acq.GetSandbox().GetId(), acq.GetLease().GetFencingToken()
	for _, tc := range []struct {
		name        string
		endOnDetach bool
		leave       func(st sandboxv1.SandboxService_AttachTerminalClient, cancel context.CancelFunc)
	}{
		{"stream goes away", true, func(_ sandboxv1.SandboxService_AttachTerminalClient, cancel context.CancelFunc) { cancel() }},
		{"detach", true, func(st sandboxv1.SandboxService_AttachTerminalClient, _ context.CancelFunc) {
			_ = st.Send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Detach{Detach: true}})
		}},
		{"kept without end_on_detach", false, func(_ sandboxv1.SandboxService_AttachTerminalClient, cancel context.CancelFunc) { cancel() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			arg := fmt.Sprintf("1000.%d", time.Now().UnixNano()%1_000_000_000)
			sctx, cancel := context.WithCancel(ctx)
			defer cancel()
			st, err := e.client.AttachTerminal(sctx)
			if err != nil {
				t.Fatal(err)
			}
			// The user's interactive shell, as the dashboard opens it.
			if err := st.Send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Open{Open: &sandboxv1.TerminalOpen{
				SandboxId: id, FencingToken: tok, Size: &sandboxv1.TerminalSize{Rows: 24, Cols: 80}, EndOnDetach: tc.endOnDetach}}}); err != nil {
				t.Fatal(err)
			}
			first, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			termID := first.GetTerminalId()
			_ = st.Send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Input{Input: []byte("sleep " + arg + " & echo started-$((40+2))\n")}})
			waitFor(t, "the background sleep", func() bool { return len(sleepers(arg)) == 1 && e.srv.TerminalScrollbackContains(termID, "started-42") })

			tc.leave(st, cancel)
			if !tc.endOnDetach {
				// Detached, not ended: the terminal and its job are there
				// to re-attach to, until the sandbox goes.
				waitFor(t, "the detach", func() bool {
					st, err := e.client.AttachTerminal(ctx)
					if err != nil {
						return false
					}
					defer st.CloseSend()
					_ = st.Send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Open{Open: &sandboxv1.TerminalOpen{SandboxId: id, FencingToken: tok, TerminalId: termID}}})
					m, err := st.Recv()
					return err == nil && m.GetTerminalId() == termID
				})
				if got := sleepers(arg); len(got) != 1 || !e.srv.HasTerminal(termID) {
					t.Errorf("without end_on_detach: sleepers %v, terminal kept %v", got, e.srv.HasTerminal(termID))
				}
				return
			}
			waitFor(t, "the terminal and its background job to end", func() bool {
				return len(sleepers(arg)) == 0 && !e.srv.HasTerminal(termID)
			})
		})
	}
}
