package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/cli/client"
)

// checkpointCommand is `hangar checkpoint list|get|verify`.
func checkpointCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "checkpoint",
		Short: "List, show and verify a session's checkpoints",
	}
	// withClient resolves and dials hangar, runs fn, and turns an RPC
	// error into its one-line message.
	withClient := func(cmd *cobra.Command, fn func(ctx context.Context, c checkpointv1.CheckpointServiceClient) error) error {
		ep, err := client.Resolve(lookupEnv)
		if err != nil {
			return err
		}
		conn, err := ep.Dial()
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
		defer cancel()
		return checkpointRPCError(fn(ctx, checkpointv1.NewCheckpointServiceClient(conn)))
	}
	cmd.AddCommand(
		checkpointListCommand(streams, withClient),
		checkpointGetCommand(streams, withClient),
		&cobra.Command{
			Use:   "verify <checkpoint-id|session>",
			Short: "Decrypt and check every part of a checkpoint (all of a session's) without restoring",
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return withClient(cmd, func(ctx context.Context, c checkpointv1.CheckpointServiceClient) error {
					ids := []string{args[0]}
					if !checkpointIsID(args[0]) {
						cps, err := checkpointListAll(ctx, c, args[0])
						if err != nil {
							return err
						}
						if len(cps) == 0 {
							return fmt.Errorf("session %s has no checkpoints", args[0])
						}
						ids = ids[:0]
						for _, cp := range cps {
							ids = append(ids, cp.GetId())
						}
					}
					bad := 0
					for _, id := range ids {
						resp, err := c.VerifyCheckpoint(ctx, &checkpointv1.VerifyCheckpointRequest{CheckpointId: id})
						if err != nil {
							return err
						}
						if resp.GetOk() {
							fmt.Fprintf(streams.Out, "%s  ok  %d parts, %s\n", id, len(resp.GetCheckpoint().GetParts()), sessionSizeLabel(resp.GetCheckpoint().GetSizeBytes()))
							continue
						}
						bad++
						fmt.Fprintf(streams.Out, "%s  DAMAGED  %s\n", id, resp.GetProblem())
					}
					if bad > 0 {
						return fmt.Errorf("%d of %d checkpoints failed verification", bad, len(ids))
					}
					return nil
				})
			},
		},
	)
	return cmd
}

// A checkpoint id is "<session>~<stamp>-<random>"; a session name has no '~'.
func checkpointIsID(s string) bool { return strings.Contains(s, "~") }

// checkpointRPCError makes an RPC error one line: its status message.
func checkpointRPCError(err error) error {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok {
		return errors.New(strings.ReplaceAll(st.Message(), "\n", " "))
	}
	return err
}

func checkpointListAll(ctx context.Context, c checkpointv1.CheckpointServiceClient, session string) ([]*checkpointv1.Checkpoint, error) {
	var out []*checkpointv1.Checkpoint
	token := ""
	for {
		resp, err := c.ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: session, PageToken: token})
		if err != nil {
			return nil, err
		}
		out = append(out, resp.GetCheckpoints()...)
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

func checkpointResolve(ctx context.Context, c checkpointv1.CheckpointServiceClient, arg string) (*checkpointv1.Checkpoint, error) {
	if checkpointIsID(arg) {
		resp, err := c.GetCheckpoint(ctx, &checkpointv1.GetCheckpointRequest{CheckpointId: arg})
		return resp.GetCheckpoint(), err
	}
	resp, err := c.ListCheckpoints(ctx, &checkpointv1.ListCheckpointsRequest{Session: arg, PageSize: 1})
	if err != nil {
		return nil, err
	}
	if len(resp.GetCheckpoints()) == 0 {
		return nil, fmt.Errorf("session %s has no checkpoints", arg)
	}
	return resp.GetCheckpoints()[0], nil
}

func checkpointPrintTable(w io.Writer, cps []*checkpointv1.Checkpoint) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCREATED\tREASON\tTURN\tHEAD\tSIZE\tSTORED\tWARNINGS")
	for _, cp := range cps {
		if cp.GetDamaged() != "" {
			fmt.Fprintf(tw, "%s\t%s\tDAMAGED\t-\t-\t-\t-\t%s\n", cp.GetId(),
				cp.GetCreatedAt().AsTime().UTC().Format(time.DateTime), cp.GetDamaged())
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\n", cp.GetId(),
			cp.GetCreatedAt().AsTime().UTC().Format(time.DateTime), checkpointEnumName(cp.GetReason().String(), "CHECKPOINT_REASON_"),
			cp.GetTurn(), checkpointShortHash(cp.GetHeadCommit()), sessionSizeLabel(cp.GetSizeBytes()), sessionSizeLabel(cp.GetStoredBytes()), len(cp.GetWarnings()))
	}
	tw.Flush()
}

func checkpointPrint(w io.Writer, cp *checkpointv1.Checkpoint) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	branch := cp.GetBranch()
	if branch == "" {
		branch = "(detached HEAD)"
	}
	if cp.GetDamaged() != "" {
		fmt.Fprintf(tw, "id\t%s\ndamaged\t%s\n", cp.GetId(), cp.GetDamaged())
		tw.Flush()
		return
	}
	for _, kv := range [][2]string{
		{"id", cp.GetId()},
		{"session", cp.GetSession()},
		{"created", cp.GetCreatedAt().AsTime().UTC().Format(time.RFC3339)},
		{"reason", checkpointEnumName(cp.GetReason().String(), "CHECKPOINT_REASON_")},
		{"harness", cp.GetHarness()},
		{"conversation", cp.GetConversationId()},
		{"turn", fmt.Sprint(cp.GetTurn())},
		{"branch", branch},
		{"base", cp.GetBaseCommit()},
		{"head", cp.GetHeadCommit()},
		{"tree", cp.GetTreeHash()},
		{"size", sessionSizeLabel(cp.GetSizeBytes())},
		{"stored", sessionSizeLabel(cp.GetStoredBytes())},
		{"previous", cp.GetPreviousCheckpoint()},
		{"shared from", cp.GetSharedFrom()},
	} {
		if kv[1] != "" {
			fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
		}
	}
	tw.Flush()
	fmt.Fprintln(w, "parts:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  KIND\tSIZE\tOBJECTS\tSTATE")
	for _, p := range cp.GetParts() {
		state := "kept"
		if p.GetSkipped() {
			state = "skipped"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", checkpointEnumName(p.GetKind().String(), "PART_KIND_"), sessionSizeLabel(p.GetSizeBytes()), len(p.GetObjects()), state)
	}
	tw.Flush()
	for _, wn := range cp.GetWarnings() {
		fmt.Fprintf(w, "warning: %s: %s\n", wn.GetCode(), wn.GetMessage())
	}
}

func checkpointEnumName(s, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(s, prefix))
}

func checkpointShortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

type checkpointClientFunc func(cmd *cobra.Command, fn func(ctx context.Context, c checkpointv1.CheckpointServiceClient) error) error

func checkpointListCommand(streams Streams, withClient checkpointClientFunc) *cobra.Command {
	var output *outputFormat
	cmd := &cobra.Command{
		Use:   "list SESSION",
		Short: "List a session's checkpoints, newest first",
		Example: `  hangar checkpoint list onboarding
  hangar checkpoint list onboarding -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := output.check(); err != nil {
				return err
			}
			return withClient(cmd, func(ctx context.Context, c checkpointv1.CheckpointServiceClient) error {
				cps, err := checkpointListAll(ctx, c, args[0])
				if err != nil {
					return err
				}
				if !output.table() {
					return writeMessage(streams.Out, output.value, &checkpointv1.ListCheckpointsResponse{Checkpoints: cps})
				}
				if len(cps) == 0 {
					fmt.Fprintf(streams.Out, "session %s has no checkpoints\n", args[0])
					return nil
				}
				checkpointPrintTable(streams.Out, cps)
				return nil
			})
		},
	}
	output = addOutputFlag(cmd)
	return cmd
}

func checkpointGetCommand(streams Streams, withClient checkpointClientFunc) *cobra.Command {
	var output *outputFormat
	cmd := &cobra.Command{
		Use:   "get CHECKPOINT_ID|SESSION",
		Short: "Show a checkpoint (a session's newest when given a session)",
		Example: `  hangar checkpoint get onboarding
  hangar checkpoint get 'onboarding~20261201T101500Z-3f2a1b0c' -o yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := output.check(); err != nil {
				return err
			}
			return withClient(cmd, func(ctx context.Context, c checkpointv1.CheckpointServiceClient) error {
				cp, err := checkpointResolve(ctx, c, args[0])
				if err != nil {
					return err
				}
				return output.write(streams.Out, cp, func() error {
					checkpointPrint(streams.Out, cp)
					return nil
				})
			})
		},
	}
	output = addOutputFlag(cmd)
	return cmd
}
