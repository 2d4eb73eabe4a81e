package command

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

func fakeModelCommand(streams Streams) *cobra.Command {
	var addr, script string
	cmd := &cobra.Command{
		Use:   "fake-model [--addr A] [--script FILE]",
		Short: "Serve the scripted model upstream (Anthropic Messages, OpenAI Responses and Chat) in the foreground",
		Long: `Serve hangar's scripted model upstream: it speaks the Anthropic Messages and
OpenAI Responses/Chat Completions wire protocols and answers from a script (a
YAML or JSON file of rules; see the gateway-svc/scripted package), or from the
built-in demo script, which writes the prompt into NOTES.md through the
agent's shell tool. Point the gateway at it with
HANGAR_ANTHROPIC_URL=http://A and HANGAR_OPENAI_URL=http://A/v1.
Ctrl-C stops it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s := scripted.Demo()
			if script != "" {
				var err error
				if s, err = scripted.Load(script); err != nil {
					return fmt.Errorf("--script %s: %w", script, err)
				}
			}
			h, err := scripted.New(s)
			if err != nil {
				return err
			}
			lis, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("--addr %s: %w", addr, err)
			}
			url := "http://" + lis.Addr().String()
			fmt.Fprintf(streams.Out, "scripted model upstream at %s\n\n  HANGAR_ANTHROPIC_URL=%s\n  HANGAR_OPENAI_URL=%s/v1\n\nCtrl-C stops it.\n", url, url, url)
			return serveFakeModel(cmd.Context(), lis, h)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:7409", "host:port to listen on")
	cmd.Flags().StringVar(&script, "script", "", "script file (YAML or JSON); default: the built-in demo")
	return cmd
}

// serveFakeModel serves h on lis until ctx ends.
func serveFakeModel(ctx context.Context, lis net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
