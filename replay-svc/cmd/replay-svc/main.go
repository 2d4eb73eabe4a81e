// Command replay-svc runs the replay service on its own.
package main

import (
	"context"
	"flag"

	"github.com/hangar-dev/hangar/platform/service"
	"github.com/hangar-dev/hangar/replay-svc/app"
)

func main() {
	service.Main(app.Name, func(ctx context.Context, args []string) error {
		cfg, err := app.LoadConfig(flag.NewFlagSet(app.Name, flag.ContinueOnError), args, nil)
		if err != nil {
			return err
		}
		a, err := app.New(ctx, cfg, nil)
		if err != nil {
			return err
		}
		lis, err := service.Listen(cfg.Addr, "HANGAR_REPLAY_ADDR")
		if err != nil {
			return err
		}
		return a.Run(ctx, lis)
	})
}
