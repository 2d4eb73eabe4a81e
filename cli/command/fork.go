package command

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	"github.com/hangar-dev/hangar/cli/client"
)

// replayRunE dials the replay service and runs body.
func replayRunE(lookupEnv func(string) (string, bool), body func(ctx context.Context, c replayv1.ReplayServiceClient) error) error {
	ep, err := client.Resolve(lookupEnv)
	if err != nil {
		return err
	}
	conn, err := ep.Dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	return body(context.Background(), replayv1.NewReplayServiceClient(conn))
}

// runCommand is `hangar run`: recorded runs (a session turn's model traffic).
func runCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Recorded runs: fork one at a step",
		Example: `  hangar session get demo -o json    # turns[0].run_id
  hangar run fork ses-1a2b3c4d.run-5e6f7a8b --at 20 -k 3 -w`,
	}
	cmd.AddCommand(runForkCommand(streams, lookupEnv))
	return cmd
}

// runForkCommand is `hangar run fork RUN --at N -k K [-w]`.
func runForkCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var (
		at, k        int32
		onDivergence string
		pinSet       string
		maxCost      float64
		wait         bool
		waitSeconds  int32
		output       *outputFormat
	)
	cmd := &cobra.Command{
		Use:   "fork RUN --at N [-k K]",
		Short: "Rebuild a run's state at step N from its tape, then continue it live K times (trials)",
		Example: `  hangar run fork ses-1a2b3c4d.run-5e6f7a8b --at 20 -k 3 -w
  hangar run fork ses-1a2b3c4d.run-5e6f7a8b --at 20 -k 0 -w   # only check that steps 1-20 reproduce`,
		Args: sessionArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := output.check(); err != nil {
				return err
			}
			req := &replayv1.ForkRunRequest{Run: args[0], AtSeq: at, Continuations: proto.Int32(k), WaitSeconds: waitSeconds, PinSet: pinSet}
			switch strings.ToLower(onDivergence) {
			case "", "stop":
				req.OnDivergence = replayv1.OnDivergence_ON_DIVERGENCE_STOP
			case "live":
				req.OnDivergence = replayv1.OnDivergence_ON_DIVERGENCE_LIVE
			default:
				return fmt.Errorf("--on-divergence %q: want stop or live", onDivergence)
			}
			if cmd.Flags().Changed("max-cost-usd") {
				req.Budget = &replayv1.Budget{MaxCostUsd: maxCost}
			}
			if wait && !cmd.Flags().Changed("wait-seconds") {
				req.WaitSeconds = 3600
			}
			return replayRunE(lookupEnv, func(_ context.Context, c replayv1.ReplayServiceClient) error {
				ctx := cmd.Context()
				resp, err := c.ForkRun(ctx, req)
				if err != nil {
					return sessionCallErr(err)
				}
				get, err := c.GetFork(ctx, &replayv1.GetForkRequest{Fork: resp.GetFork()})
				if err != nil {
					return sessionCallErr(err)
				}
				f := get.GetFork()
				if wait {
					// -w: until every trial has ended too.
					for !forkSettled(f) {
						select {
						case <-ctx.Done():
							return ctx.Err()
						case <-time.After(time.Second):
						}
						if get, err = c.GetFork(ctx, &replayv1.GetForkRequest{Fork: f.GetFork()}); err != nil {
							return sessionCallErr(err)
						}
						f = get.GetFork()
					}
				}
				return output.write(streams.Out, f, func() error {
					forkWrite(streams, f)
					return nil
				})
			})
		},
	}
	int32Flag(cmd.Flags(), &at, "at", "", 0, 0, math.MaxInt32, "the step to fork at: steps 1..N are answered from the tape (0: check the first request, then live)")
	int32Flag(cmd.Flags(), &k, "continuations", "k", 1, 0, 10, "live continuations (trials), 0 only verifies the prefix")
	cmd.Flags().StringVar(&onDivergence, "on-divergence", "stop", "at a divergence: stop (the trials end) or live (they go on live)")
	cmd.Flags().Float64Var(&maxCost, "max-cost-usd", 5, "each continuation's budget")
	cmd.Flags().StringVar(&pinSet, "pin-set", "", "continue with this pin set: a harness lock with an environment (NAME@rN); one on another harness diverges at step 1")
	cmd.Flags().BoolVarP(&wait, "wait", "w", false, "wait for the prefix and every trial to end")
	int32Flag(cmd.Flags(), &waitSeconds, "wait-seconds", "", 0, 0, math.MaxInt32, "answer once the prefix settled or after this long (0: at once)")
	_ = cmd.MarkFlagRequired("at")
	output = addOutputFlag(cmd)
	return cmd
}

// forkSettled: the prefix settled and no trial is still running.
func forkSettled(f *replayv1.Fork) bool {
	if f.GetStatus() == replayv1.ForkStatus_FORK_STATUS_REPLAYING {
		return false
	}
	for _, t := range f.GetTrials() {
		if t.GetStatus() == replayv1.TrialStatus_TRIAL_STATUS_REPLAYING || t.GetStatus() == replayv1.TrialStatus_TRIAL_STATUS_LIVE {
			return false
		}
	}
	return true
}

func forkStatusName(s replayv1.ForkStatus) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "FORK_STATUS_"))
}

func trialStatusName(s replayv1.TrialStatus) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "TRIAL_STATUS_"))
}

func trialOutcomeName(o replayv1.TrialOutcome) string {
	if o == replayv1.TrialOutcome_TRIAL_OUTCOME_UNSPECIFIED {
		return "-"
	}
	return strings.ToLower(strings.TrimPrefix(o.String(), "TRIAL_OUTCOME_"))
}

func forkWrite(streams Streams, f *replayv1.Fork) {
	fmt.Fprintf(streams.Out, "fork %s of %s at step %d: %s", f.GetFork(), f.GetRun(), f.GetAtSeq(), forkStatusName(f.GetStatus()))
	if r := f.GetStatusReason(); r != "" {
		fmt.Fprintf(streams.Out, " (%s)", r)
	}
	fmt.Fprintln(streams.Out)
	if d := f.GetDivergence(); d != nil {
		fmt.Fprintf(streams.Out, "  divergence at step %d: %s: %s\n", d.GetSeq(), strings.ToLower(strings.TrimPrefix(d.GetKind().String(), "DIVERGENCE_KIND_")), d.GetDetail())
	}
	if f.GetTainted() {
		fmt.Fprintln(streams.Out, "  tainted: the tape came from untrusted input")
	}
	if p := f.GetPinSet(); p != "" {
		fmt.Fprintf(streams.Out, "  pin set %s\n", p)
	}
	for _, t := range f.GetTrials() {
		trialWrite(streams, t)
	}
}

func trialWrite(streams Streams, t *replayv1.Trial) {
	pin := ""
	if p := t.GetPinSet(); p != "" {
		pin = "  pin set " + p
	}
	fmt.Fprintf(streams.Out, "  %s  %s  %s  session %s  $%.4f%s\n", t.GetId(), trialStatusName(t.GetStatus()), trialOutcomeName(t.GetOutcome()), orDash(t.GetSession()), t.GetCostUsd(), pin)
}

// forkCommand is `hangar fork get|list`.
func forkCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fork",
		Short: "Forks at a step (hangar run fork) and their trials",
		Example: `  hangar fork get job-9c8d7e6f
  hangar fork list --run ses-1a2b3c4d.run-5e6f7a8b`,
	}
	var getOutput, listOutput *outputFormat
	get := &cobra.Command{
		Use:     "get FORK",
		Short:   "A fork at a step: its status, divergence and trials",
		Example: `  hangar fork get job-9c8d7e6f -o json`,
		Args:    sessionArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := getOutput.check(); err != nil {
				return err
			}
			return replayRunE(lookupEnv, func(_ context.Context, c replayv1.ReplayServiceClient) error {
				resp, err := c.GetFork(cmd.Context(), &replayv1.GetForkRequest{Fork: args[0]})
				if err != nil {
					return sessionCallErr(err)
				}
				return getOutput.write(streams.Out, resp.GetFork(), func() error {
					forkWrite(streams, resp.GetFork())
					return nil
				})
			})
		},
	}
	getOutput = addOutputFlag(get)
	var run string
	list := &cobra.Command{
		Use:     "list [--run RUN]",
		Short:   "Forks at a step, newest first",
		Example: `  hangar fork list --run ses-1a2b3c4d.run-5e6f7a8b`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := listOutput.check(); err != nil {
				return err
			}
			return replayRunE(lookupEnv, func(_ context.Context, c replayv1.ReplayServiceClient) error {
				resp, err := c.ListForks(cmd.Context(), &replayv1.ListForksRequest{Run: run, PageSize: 500})
				if err != nil {
					return sessionCallErr(err)
				}
				return listOutput.write(streams.Out, resp, func() error {
					for _, f := range resp.GetForks() {
						fmt.Fprintf(streams.Out, "%s  %s  step %d  %s  %d trials\n", f.GetFork(), f.GetRun(), f.GetAtSeq(), forkStatusName(f.GetStatus()), len(f.GetTrials()))
					}
					return nil
				})
			})
		},
	}
	list.Flags().StringVar(&run, "run", "", "only forks of this run")
	listOutput = addOutputFlag(list)
	cmd.AddCommand(get, list)
	return cmd
}

// trialCommand is `hangar trial get`.
func trialCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "trial",
		Short:   "Trials: the live continuations of a fork at a step",
		Example: `  hangar trial get job-9c8d7e6f.1`,
	}
	var output *outputFormat
	get := &cobra.Command{
		Use:     "get TRIAL",
		Short:   "A trial: its session, run, status and outcome",
		Example: `  hangar trial get job-9c8d7e6f.1 -o json`,
		Args:    sessionArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := output.check(); err != nil {
				return err
			}
			return replayRunE(lookupEnv, func(_ context.Context, c replayv1.ReplayServiceClient) error {
				resp, err := c.GetTrial(cmd.Context(), &replayv1.GetTrialRequest{Trial: args[0]})
				if err != nil {
					return sessionCallErr(err)
				}
				return output.write(streams.Out, resp.GetTrial(), func() error {
					trialWrite(streams, resp.GetTrial())
					return nil
				})
			})
		},
	}
	output = addOutputFlag(get)
	cmd.AddCommand(get)
	return cmd
}
