// Command hangar is the hangar CLI: `hangar up` runs everything in one
// process; the other commands talk to a running hangar.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hangar-dev/hangar/cli/command"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// The first signal starts a graceful stop (hangar up checkpoints
		// and suspends its sessions); a second one stops at once.
		<-ctx.Done()
		stop()
	}()
	err := command.Execute(ctx, command.Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}, os.Args[1:], os.LookupEnv)
	stop()
	var exit *command.ExitError
	if errors.As(err, &exit) {
		// A remote command's exit code; its stderr already said why.
		os.Exit(exit.Code)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hangar:", err)
		os.Exit(1)
	}
}
