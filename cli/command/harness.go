package command

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// harnessCommand is `hangar harness`: harness locks (harnesses.lock.yaml in
// HANGAR_HARNESS_REPO) and sessions thawed from them.
func harnessCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "harness",
		Short: "Harness locks: pinned harness, model, approval mode and CLI version; thaw a session from one",
		Example: `  hangar harness lock list
  hangar harness thaw team-default@r14 --env python "fix the flaky test" -w`,
	}
	lock := &cobra.Command{
		Use:   "lock",
		Short: "Read the harness locks in HANGAR_HARNESS_REPO's harnesses.lock.yaml",
		Example: `  hangar harness lock list
  hangar harness lock get team-default@r14`,
	}
	lock.AddCommand(harnessLockListCommand(streams, lookupEnv), harnessLockGetCommand(streams, lookupEnv))
	cmd.AddCommand(lock, harnessThawCommand(streams, lookupEnv))
	return cmd
}

func harnessLockListCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var output *outputFormat
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "The newest revision of every harness lock",
		Example: "  hangar harness lock list\n  hangar harness lock list -o json",
		Args:    sessionArgs(0, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := output.check(); err != nil {
				return err
			}
			return sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, _ []string) error {
				resp, err := c.ListHarnessLocks(ctx, &sessionv1.ListHarnessLocksRequest{})
				if err != nil {
					return sessionCallErr(err)
				}
				return output.write(streams.Out, resp, func() error {
					if len(resp.GetLocks()) == 0 {
						fmt.Fprintf(streams.Out, "no harness locks in %s at %s\n", resp.GetRepository(), sessionShortCommit(resp.GetCommit()))
						return nil
					}
					tw := tabwriter.NewWriter(streams.Out, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "LOCK\tHARNESS\tMODEL\tAPPROVALS\tCLI")
					for _, l := range resp.GetLocks() {
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", l.GetRef(), sessionHarnessLabel(l.GetHarness()), l.GetModel(), harnessApprovalsLabel(l.GetApprovals()), l.GetCliVersion())
					}
					if err := tw.Flush(); err != nil {
						return err
					}
					fmt.Fprintf(streams.Out, "\nfrom %s at %s; thaw one: hangar harness thaw LOCK --env ENV \"MESSAGE\"\n", resp.GetRepository(), sessionShortCommit(resp.GetCommit()))
					return nil
				})
			})(cmd, args)
		},
	}
	output = addOutputFlag(cmd)
	return cmd
}

func harnessLockGetCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var output *outputFormat
	cmd := &cobra.Command{
		Use:     "get LOCK",
		Short:   "One harness lock: NAME@rREVISION, or NAME for its newest revision",
		Example: "  hangar harness lock get team-default@r14\n  hangar harness lock get team-default -o yaml",
		Args:    sessionArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := output.check(); err != nil {
				return err
			}
			return sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, args []string) error {
				resp, err := c.GetHarnessLock(ctx, &sessionv1.GetHarnessLockRequest{Lock: args[0]})
				if err != nil {
					return sessionCallErr(err)
				}
				l := resp.GetLock()
				return output.write(streams.Out, l, func() error {
					tw := tabwriter.NewWriter(streams.Out, 0, 4, 2, ' ', 0)
					fmt.Fprintf(tw, "lock\t%s\n", l.GetRef())
					fmt.Fprintf(tw, "harness\t%s\n", sessionHarnessLabel(l.GetHarness()))
					fmt.Fprintf(tw, "model\t%s\n", l.GetModel())
					fmt.Fprintf(tw, "approvals\t%s\n", harnessApprovalsLabel(l.GetApprovals()))
					fmt.Fprintf(tw, "cli version\t%s\n", l.GetCliVersion())
					if l.GetEnvironment() != "" {
						fmt.Fprintf(tw, "environment\t%s (pin sets)\n", l.GetEnvironment())
					}
					fmt.Fprintf(tw, "read at\t%s\n", sessionShortCommit(l.GetCommit()))
					return tw.Flush()
				})
			})(cmd, args)
		},
	}
	output = addOutputFlag(cmd)
	return cmd
}

func harnessApprovalsLabel(a sessionv1.ApprovalMode) string {
	if a == sessionv1.ApprovalMode_APPROVAL_MODE_ASK {
		return "ask"
	}
	return "never"
}

func harnessThawCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var (
		tf              sessionTurnFlags
		name, env, repo string
		branch          string
	)
	cmd := &cobra.Command{
		Use:   "thaw LOCK [MESSAGE]",
		Short: "Start a session from a harness lock: its harness, model and approval mode, on the CLI version it pins",
		Long: `Start a session from a harness lock (NAME@rREVISION in HANGAR_HARNESS_REPO's
harnesses.lock.yaml): the lock's harness, concrete model and approval mode, on
the CLI version it pins. A lock on a CLI version the sandboxes do not run is
refused before any sandbox work. Turn 1 is checked against the lock; the
turn's drift lists what differed. A thawed session keeps its harness: start
another session for another lock.`,
		Example: `  hangar harness thaw team-default@r14 --env python "fix the flaky test" -w
  hangar harness thaw team-default@r14 --name flaky --env python "fix the flaky test"`,
		Args: sessionArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &sessionv1.CreateSessionRequest{HarnessLock: args[0], Name: name, Environment: env, Repo: repo, Branch: branch}
			if len(args) > 1 {
				if strings.TrimSpace(args[1]) == "" {
					return errors.New("MESSAGE is empty: leave it out to only create the session")
				}
				req.Message = args[1]
			}
			if req.Message == "" && (tf.wait || len(tf.files) > 0 || len(tf.texts) > 0 || tf.schema != "") {
				return errors.New("-w, --file, --text and --schema go with a first turn: give a MESSAGE")
			}
			if req.Name == "" {
				req.Name = harnessSessionName(args[0])
			}
			var err error
			if req.Harness, err = sessionParseHarness(tf.harness); err != nil {
				return err
			}
			if req.Budget, err = tf.budget(cmd); err != nil {
				return err
			}
			if req.Attachments, err = tf.attachments(); err != nil {
				return err
			}
			if req.OutputSchemaJson, err = tf.schemaJSON(); err != nil {
				return err
			}
			dir := streams.Dir
			if dir == "" {
				dir = "."
			}
			switch {
			case repo != "":
				req.Repo = sessionRepoArg(cmd.Context(), dir, repo)
			case env == "":
				req.WorkingRepository, _ = sessionGitTop(cmd.Context(), dir)
			}
			return sessionRunE(lookupEnv, sessionCreate(streams, req, tf.wait))(cmd, args)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&name, "name", "", "session name (default LOCKNAME-rREV-xxxx)")
	fl.StringVarP(&env, "env", "e", "", "environment to run in (default local, on the git repository you run this in)")
	fl.StringVar(&repo, "repo", "", "repository PATH or URL instead of the environment's")
	fl.StringVar(&branch, "branch", "", "session branch (default hangar/session/NAME)")
	tf.register(cmd)
	// The lock chooses the harness; the server refuses another.
	_ = fl.MarkHidden("harness")
	return cmd
}

var nameUnsafe = regexp.MustCompile(`[^a-z0-9-]+`)

// harnessSessionName is a thawed session's default name: the lock's name
// and revision and four random hex digits ("team-default-r14-3f2a").
func harnessSessionName(lock string) string {
	base := nameUnsafe.ReplaceAllString(strings.ReplaceAll(strings.ToLower(lock), "@", "-"), "-")
	base = strings.Trim(base, "-")
	if len(base) > 57 {
		base = strings.TrimRight(base[:57], "-")
	}
	if base == "" {
		base = "thawed"
	}
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return base + "-" + hex.EncodeToString(b)
}
