package command

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/spf13/cobra"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// sessionForkCommand is `hangar session fork NAME [MESSAGE] -n N`.
func sessionForkCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var (
		n       int32
		names   []string
		harness string
		wait    bool
	)
	cmd := &cobra.Command{
		Use:   "fork NAME [MESSAGE]",
		Short: "Branch a session into N sessions (forks); with a message each runs it, without one they only boot",
		Args:  sessionArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &sessionv1.ForkSessionRequest{Name: args[0], N: n, Names: names}
			if len(args) == 2 {
				if strings.TrimSpace(args[1]) == "" {
					return errors.New("MESSAGE is empty")
				}
				req.Message = args[1]
			}
			if !cmd.Flags().Changed("n") && len(names) > 0 {
				req.N = int32(len(names))
			}
			var err error
			if req.Harness, err = sessionParseHarness(harness); err != nil {
				return err
			}
			return sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, _ []string) error {
				resp, err := c.ForkSession(ctx, req)
				if err != nil {
					return sessionCallErr(err)
				}
				fmt.Fprintf(streams.Out, "forked %s at checkpoint %s into %d:\n", args[0], resp.GetForkedFromCheckpoint(), len(resp.GetForks()))
				for _, f := range resp.GetForks() {
					fmt.Fprintf(streams.Out, "  %s  branch %s  %s\n", f.GetName(), f.GetBranch(), sessionStateName(f.GetState()))
				}
				if !wait || req.Message == "" {
					return nil
				}
				var errs []error
				for _, f := range resp.GetForks() {
					// The fork's own first turn follows its inherited ones.
					if err := sessionWaitForTurn(ctx, c, streams, f.GetName(), 0); err != nil {
						errs = append(errs, fmt.Errorf("%s: %w", f.GetName(), err))
					}
				}
				return errors.Join(errs...)
			})(cmd, args)
		},
	}
	int32Flag(cmd.Flags(), &n, "n", "n", 1, 1, math.MaxInt32, "how many forks (up to HANGAR_FORK_MAX, 8)")
	cmd.Flags().StringArrayVar(&names, "name", nil, "a fork's name, once per fork (default NAME-fork-<i>)")
	cmd.Flags().StringVar(&harness, "harness", "", "fork into another agent: claude, codex, pi, antigravity (starts with a handoff)")
	cmd.Flags().BoolVarP(&wait, "wait", "w", false, "wait for every fork's first turn to end")
	return cmd
}

// sessionStateName is a state's short name ("idle", "suspended").
func sessionStateName(s sessionv1.SessionState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "SESSION_STATE_"))
}
