package command

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/spf13/cobra"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/client"
)

// jobCommand is `hangar job`: jobs run sessions for programs.
func jobCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "job",
		Short: "Jobs: best-of-N attempts on a prepared session, scored by a check",
	}
	cmd.AddCommand(jobRunCommand(streams, lookupEnv), jobGetCommand(streams, lookupEnv), jobListCommand(streams, lookupEnv))
	return cmd
}

// jobRunE dials the job service and runs body.
func jobRunE(lookupEnv func(string) (string, bool), body func(ctx context.Context, c sessionv1.JobServiceClient) error) error {
	ep, err := client.Resolve(lookupEnv)
	if err != nil {
		return err
	}
	conn, err := ep.Dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	return body(context.Background(), sessionv1.NewJobServiceClient(conn))
}

func jobRunCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var (
		bestOf         int32
		check, session string
		wait           bool
	)
	cmd := &cobra.Command{
		Use:   "run --best-of N --check CMD --session NAME MESSAGE",
		Short: "Fork a prepared session into N attempts, score each with CMD in its sandbox, deliver the best",
		Args:  sessionArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case session == "":
				return errors.New("--session NAME is required: the prepared session to fork")
			case strings.TrimSpace(check) == "":
				return errors.New("--check CMD is required: it scores each attempt (exit status, then the last number it prints)")
			case strings.TrimSpace(args[0]) == "":
				return errors.New("MESSAGE is empty")
			}
			req := &sessionv1.CreateJobRequest{
				Strategy: sessionv1.JobStrategy_JOB_STRATEGY_BEST_OF_N, Session: session, Message: args[0], N: bestOf, Check: check,
			}
			return jobRunE(lookupEnv, func(_ context.Context, c sessionv1.JobServiceClient) error {
				ctx := cmd.Context()
				resp, err := c.CreateJob(ctx, req)
				if err != nil {
					return sessionCallErr(err)
				}
				id := resp.GetJob().GetId()
				fmt.Fprintf(streams.Out, "job %s: best of %d on %s\n", id, bestOf, session)
				if !wait {
					return nil
				}
				job, err := jobWait(ctx, c, id, jobProgress(streams))
				if err != nil {
					return err
				}
				fmt.Fprintln(streams.Out)
				jobWrite(streams, job)
				if job.GetState() != sessionv1.JobState_JOB_STATE_DELIVERED {
					return fmt.Errorf("job %s %s: %s", id, jobStateName(job.GetState()), job.GetError())
				}
				return nil
			})
		},
	}
	int32Flag(cmd.Flags(), &bestOf, "best-of", "", 2, 1, math.MaxInt32, "attempts (up to HANGAR_FORK_MAX, 8)")
	cmd.Flags().StringVar(&check, "check", "", "command run in each attempt's work tree: exit 0 passes, the last number printed is the score")
	cmd.Flags().StringVar(&session, "session", "", "the prepared session to fork")
	cmd.Flags().BoolVarP(&wait, "wait", "w", false, "wait for the job to deliver")
	return cmd
}

func jobGetCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var output *outputFormat
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "A job, its attempts and what it delivered",
		Example: `  hangar job get job-9c8d7e6f
  hangar job get job-9c8d7e6f -o json`,
		Args: sessionArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := output.check(); err != nil {
				return err
			}
			return jobRunE(lookupEnv, func(_ context.Context, c sessionv1.JobServiceClient) error {
				resp, err := c.GetJob(cmd.Context(), &sessionv1.GetJobRequest{Id: args[0]})
				if err != nil {
					return sessionCallErr(err)
				}
				return output.write(streams.Out, resp.GetJob(), func() error {
					jobWrite(streams, resp.GetJob())
					return nil
				})
			})
		},
	}
	output = addOutputFlag(cmd)
	return cmd
}

func jobListCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var output *outputFormat
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Jobs, newest first",
		Example: `  hangar job list
  hangar job list -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := output.check(); err != nil {
				return err
			}
			return jobRunE(lookupEnv, func(_ context.Context, c sessionv1.JobServiceClient) error {
				req := &sessionv1.ListJobsRequest{PageSize: 200}
				var all []*sessionv1.Job
				for {
					resp, err := c.ListJobs(cmd.Context(), req)
					if err != nil {
						return sessionCallErr(err)
					}
					all = append(all, resp.GetJobs()...)
					if resp.GetNextPageToken() == "" || resp.GetNextPageToken() == req.PageToken {
						break
					}
					req.PageToken = resp.GetNextPageToken()
				}
				return output.write(streams.Out, &sessionv1.ListJobsResponse{Jobs: all}, func() error {
					if len(all) == 0 {
						_, err := fmt.Fprintln(streams.Out, "no jobs yet: start one with hangar job run")
						return err
					}
					tw := sessionTabs(streams.Out)
					fmt.Fprintln(tw, "ID\tSTATE\tSESSION\tATTEMPTS\tWINNER\tBRANCH")
					for _, j := range all {
						fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", j.GetId(), jobStateName(j.GetState()), j.GetSession(), len(j.GetAttempts()),
							orDash(j.GetWinner()), orDash(j.GetBranch()))
					}
					return tw.Flush()
				})
			})
		},
	}
	output = addOutputFlag(cmd)
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// jobWait polls a job until it ends (the contract has no wait for jobs),
// showing each state progress reports.
func jobWait(ctx context.Context, c sessionv1.JobServiceClient, id string, progress func(*sessionv1.Job)) (*sessionv1.Job, error) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := c.GetJob(ctx, &sessionv1.GetJobRequest{Id: id})
		if err != nil {
			return nil, sessionCallErr(err)
		}
		progress(resp.GetJob())
		if resp.GetJob().GetEndedAt() != nil {
			return resp.GetJob(), nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("stopped waiting; job %s goes on (hangar job get %s)", id, id)
		case <-tick.C:
		}
	}
}

// jobProgress prints what changed in a job since the last look: its state,
// each attempt as it appears, ends its turn and is checked.
func jobProgress(streams Streams) func(*sessionv1.Job) {
	var state sessionv1.JobState
	seen := map[string]string{}
	return func(j *sessionv1.Job) {
		now := time.Now().Format("15:04:05")
		if j.GetState() != state {
			state = j.GetState()
			fmt.Fprintf(streams.Out, "%s  job %s %s\n", now, j.GetId(), jobStateName(state))
		}
		for _, a := range j.GetAttempts() {
			var step string
			switch {
			case a.Score != nil || a.GetCheckExitCode() != 0:
				score := "-"
				if a.Score != nil {
					score = fmt.Sprint(a.GetScore())
				}
				step = fmt.Sprintf("checked: exit %d, score %s", a.GetCheckExitCode(), score)
			case a.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_UNSPECIFIED:
				step = "turn " + sessionOutcomeLabel(a.GetOutcome())
			default:
				step = "running on branch " + a.GetBranch()
			}
			if seen[a.GetSession()] != step {
				seen[a.GetSession()] = step
				fmt.Fprintf(streams.Out, "%s  attempt %s %s\n", now, a.GetSession(), step)
			}
		}
	}
}

func jobStateName(s sessionv1.JobState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "JOB_STATE_"))
}

func jobWrite(streams Streams, j *sessionv1.Job) {
	fmt.Fprintf(streams.Out, "job %s %s\n", j.GetId(), jobStateName(j.GetState()))
	for _, a := range j.GetAttempts() {
		score := "-"
		if a.Score != nil {
			score = fmt.Sprint(a.GetScore())
		}
		mark := " "
		if a.GetSession() == j.GetWinner() {
			mark = "*"
		}
		fmt.Fprintf(streams.Out, "%s %s  branch %s  check exit %d  score %s\n", mark, a.GetSession(), a.GetBranch(), a.GetCheckExitCode(), score)
	}
	if j.GetWinner() != "" {
		fmt.Fprintf(streams.Out, "delivered %s on branch %s (hangar session patch %s)\n", j.GetWinner(), j.GetBranch(), j.GetWinner())
	}
}
