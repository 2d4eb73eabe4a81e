package command

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

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
				return sessionWaitForForks(ctx, c, streams, resp.GetForks())
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

// sessionWaitForForks follows every fork's first turn at once: each event
// line tagged with its fork's name, then one summary line per fork. It
// fails as the first fork (in order) whose turn did not complete.
func sessionWaitForForks(ctx context.Context, c sessionv1.SessionServiceClient, streams Streams, forks []*sessionv1.Session) error {
	p := sessionNewTurnProgress(streams.Out, sessionIsTerminal(streams.Out), fmt.Sprintf("%d forks running", len(forks)), time.Now)
	defer p.stop()
	width := 0
	for _, f := range forks {
		width = max(width, len(f.GetName()))
	}
	turns := make([]*sessionv1.Turn, len(forks))
	errs := make([]error, len(forks))
	var wg sync.WaitGroup
	for i, f := range forks {
		tag := fmt.Sprintf("[%-*s] ", width, f.GetName())
		wg.Add(1)
		go func() {
			defer wg.Done()
			stop := sessionWatchApprovals(ctx, c, f.GetName(), tag, sessionApprovalPoll, p.println)
			defer stop()
			// The fork's own first turn follows its inherited ones (0: the newest).
			turns[i], errs[i] = sessionFollowTurn(ctx, c, f.GetName(), 0, func(e *sessionv1.Event) {
				p.println(tag + sessionFormatEvent(e, time.Now()))
			})
		}()
	}
	wg.Wait()
	p.stop()
	fmt.Fprintln(streams.Out, "\nforks:")
	var exit error
	for i, f := range forks {
		if errs[i] != nil {
			fmt.Fprintf(streams.Out, "  %-*s  %s\n", width, f.GetName(), errs[i])
			exit = errors.Join(exit, fmt.Errorf("%s: %w", f.GetName(), errs[i]))
			continue
		}
		fmt.Fprintf(streams.Out, "  %-*s  %s · branch %s · hangar session patch %s\n", width, f.GetName(), sessionFormatOutcome(turns[i]), f.GetBranch(), f.GetName())
		if e := sessionTurnExit(turns[i]); e != nil && exit == nil {
			exit = e
		}
	}
	return exit
}
