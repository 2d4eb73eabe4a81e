// Command hangar-sandbox is the one program hangar runs inside a sandbox
// besides the agent CLI and the user's commands: the checkpoint, restore
// and fork work, and (called as hangar-agent) the agent's tool. It speaks
// api/sandboxtool's protocol and needs only git. Build it static:
// CGO_ENABLED=0 go build ./sandbox-svc/cmd/hangar-sandbox.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/tool"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := tool.Main(ctx, os.Args, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
