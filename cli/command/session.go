package command

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/client"
	"github.com/hangar-dev/hangar/platform/apijson"
)

// sessionCallErr makes a failed call one line: the status message alone
// ("session \"x\" does not exist"), which main prefixes with "hangar:".
func sessionCallErr(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := sessionOneLine(st.Message())
	if msg == "" {
		msg = st.Code().String()
	}
	return errors.New(msg)
}

// sessionOneLine joins a text's lines with " ↵ " so it fits on one line.
func sessionOneLine(s string) string {
	s = strings.TrimSpace(strings.ReplaceAll(s, "\r\n", "\n"))
	return strings.ReplaceAll(s, "\n", " ↵ ")
}

// dialSession connects to the session service through the endpoint.
func dialSession(lookupEnv func(string) (string, bool)) (sessionv1.SessionServiceClient, func(), error) {
	ep, err := client.Resolve(lookupEnv)
	if err != nil {
		return nil, nil, err
	}
	conn, err := ep.Dial()
	if err != nil {
		return nil, nil, err
	}
	return sessionv1.NewSessionServiceClient(conn), func() { _ = conn.Close() }, nil
}

// sessionRunE wraps a command body that needs the session service: it dials,
// calls body and closes the connection.
func sessionRunE(lookupEnv func(string) (string, bool), body func(ctx context.Context, c sessionv1.SessionServiceClient, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, done, err := dialSession(lookupEnv)
		if err != nil {
			return err
		}
		defer done()
		return body(cmd.Context(), c, args)
	}
}

// sessionArgs checks the positional arguments: at least min, at most max,
// else one line with the usage.
func sessionArgs(minArgs, maxArgs int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < minArgs || len(args) > maxArgs {
			return fmt.Errorf("usage: hangar session %s", cmd.Use)
		}
		if len(args) > 0 && args[0] == "" {
			return fmt.Errorf("usage: hangar session %s (NAME must not be empty)", cmd.Use)
		}
		return nil
	}
}

var sessionHarnesses = []struct {
	name string
	enum sessionv1.Harness
}{
	{"claude", sessionv1.Harness_HARNESS_CLAUDE},
	{"codex", sessionv1.Harness_HARNESS_CODEX},
	{"pi", sessionv1.Harness_HARNESS_PI},
	{"antigravity", sessionv1.Harness_HARNESS_ANTIGRAVITY},
}

// sessionParseHarness reads --harness; "" is the server's default.
func sessionParseHarness(s string) (sessionv1.Harness, error) {
	if s == "" {
		return sessionv1.Harness_HARNESS_UNSPECIFIED, nil
	}
	for _, h := range sessionHarnesses {
		if strings.EqualFold(s, h.name) {
			return h.enum, nil
		}
	}
	return 0, fmt.Errorf("--harness %q: want claude, codex, pi or antigravity", s)
}

// sessionTurnFlags are the flags new and send share: attachments, an output
// schema, a per-turn budget and -w.
type sessionTurnFlags struct {
	harness    string
	files      []string
	texts      []string
	schema     string
	maxCost    float64
	maxTokens  int64
	maxMinutes int32
	wait       bool
}

func (f *sessionTurnFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.harness, "harness", "", "agent CLI: claude, codex, pi or antigravity")
	fl.StringArrayVar(&f.files, "file", nil, "attach a file the agent finds under ~/.hangar-agent/context (repeatable)")
	fl.StringArrayVar(&f.texts, "text", nil, "add TEXT to the prompt as context (repeatable)")
	fl.StringVar(&f.schema, "schema", "", "JSON Schema FILE: the turn returns a structured result matching it")
	fl.Float64Var(&f.maxCost, "max-cost", 0, "stop the turn (outcome over_budget) past this many USD")
	fl.Int64Var(&f.maxTokens, "max-tokens", 0, "stop the turn (outcome over_budget) past this many tokens")
	int32Flag(fl, &f.maxMinutes, "max-minutes", "", 0, math.MinInt32, math.MaxInt32, "stop the turn (outcome over_budget) past this many minutes")
	fl.BoolVarP(&f.wait, "wait", "w", false, "wait for the turn: show its events, then its outcome and result; exit 1 failed, 2 over_budget, 3 interrupted")
}

// budget is the per-turn budget the flags give, nil when none was set.
func (f *sessionTurnFlags) budget(cmd *cobra.Command) (*sessionv1.Budget, error) {
	fl := cmd.Flags()
	if !fl.Changed("max-cost") && !fl.Changed("max-tokens") && !fl.Changed("max-minutes") {
		return nil, nil
	}
	switch {
	case f.maxCost < 0:
		return nil, fmt.Errorf("--max-cost %v: want 0 or more USD", f.maxCost)
	case f.maxTokens < 0:
		return nil, fmt.Errorf("--max-tokens %d: want 0 or more", f.maxTokens)
	case f.maxMinutes < 0:
		return nil, fmt.Errorf("--max-minutes %d: want 0 or more", f.maxMinutes)
	}
	return &sessionv1.Budget{MaxCostUsd: f.maxCost, MaxTokens: f.maxTokens, MaxMinutes: f.maxMinutes}, nil
}

// attachments reads --file and --text, in that order.
func (f *sessionTurnFlags) attachments() ([]*sessionv1.Attachment, error) {
	var out []*sessionv1.Attachment
	for _, p := range f.files {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("--file %s: %w", p, sessionUnwrapPathErr(err))
		}
		out = append(out, &sessionv1.Attachment{Name: filepath.Base(p), Content: &sessionv1.Attachment_File{File: b}})
	}
	for i, t := range f.texts {
		if strings.TrimSpace(t) == "" {
			return nil, fmt.Errorf("--text #%d is empty", i+1)
		}
		out = append(out, &sessionv1.Attachment{Name: fmt.Sprintf("text-%d", i+1), Content: &sessionv1.Attachment_Text{Text: t}})
	}
	return out, nil
}

// schemaJSON reads --schema: a JSON document.
func (f *sessionTurnFlags) schemaJSON() (string, error) {
	if f.schema == "" {
		return "", nil
	}
	b, err := os.ReadFile(f.schema)
	if err != nil {
		return "", fmt.Errorf("--schema %s: %w", f.schema, sessionUnwrapPathErr(err))
	}
	if !json.Valid(b) {
		return "", fmt.Errorf("--schema %s: not valid JSON", f.schema)
	}
	return string(b), nil
}

// sessionRepoArg reads --repo: a directory here is sent as the absolute
// top level of its git repository (or the absolute directory), anything
// else as a URL.
func sessionRepoArg(ctx context.Context, dir, repo string) string {
	p := repo
	if !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	if st, err := os.Stat(p); err != nil || !st.IsDir() {
		return repo
	}
	if top, err := sessionGitTop(ctx, p); err == nil {
		return top
	}
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// sessionGitTop is the top level of the git repository holding dir.
func sessionGitTop(ctx context.Context, dir string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", "rev-parse", "--show-toplevel")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// sessionUnwrapPathErr drops the path an *os.PathError repeats.
func sessionUnwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func sessionCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session",
		Short: "Streams of work you can come back to: start, continue, suspend, inspect",
	}
	cmd.AddCommand(
		sessionNewCommand(streams, lookupEnv),
		sessionListCommand(streams, lookupEnv),
		sessionSendCommand(streams, lookupEnv),
		sessionOpenCommand(streams, lookupEnv),
		sessionKeepCommand(streams, lookupEnv),
		sessionSuspendCommand(streams, lookupEnv),
		sessionArchiveCommand(streams, lookupEnv),
		sessionGetCommand(streams, lookupEnv),
		sessionEventsCommand(streams, lookupEnv),
		sessionArtifactsCommand(streams, lookupEnv),
		sessionPatchCommand(streams, lookupEnv),
		sessionPullCommand(streams, lookupEnv),
		sessionSteerCommand(streams, lookupEnv),
		sessionInterruptCommand(streams, lookupEnv),
		sessionForkCommand(streams, lookupEnv),
		sessionApprovalsCommand(streams, lookupEnv),
	)
	return cmd
}

func sessionNewCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var (
		tf                                 sessionTurnFlags
		env, repo, branch, model, approval string
		idle                               int32
		fromLocal                          bool
	)
	cmd := &cobra.Command{
		Use:   "new NAME [MESSAGE]",
		Short: "Start a session, and a first turn given a message",
		Args:  sessionArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &sessionv1.CreateSessionRequest{Name: args[0], Environment: env, Repo: repo, Branch: branch, Model: model}
			if len(args) > 1 {
				req.Message = args[1]
			}
			if strings.TrimSpace(req.Message) == "" && len(args) > 1 {
				return errors.New("MESSAGE is empty: leave it out to only create the session")
			}
			if req.Message == "" && (tf.wait || len(tf.files) > 0 || len(tf.texts) > 0 || tf.schema != "" || fromLocal) {
				return errors.New("-w, --file, --text, --schema and --from-local go with a first turn: give a MESSAGE")
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
			if cmd.Flags().Changed("idle") {
				if idle < 0 {
					return fmt.Errorf("--idle %d: want minutes, 0 (never) or more", idle)
				}
				req.IdleMinutes = proto.Int32(idle)
			}
			switch approval {
			case "":
			case "never":
				req.Approvals = sessionv1.ApprovalMode_APPROVAL_MODE_NEVER
			case "ask":
				req.Approvals = sessionv1.ApprovalMode_APPROVAL_MODE_ASK
			default:
				return fmt.Errorf("--approvals %q: want never or ask", approval)
			}
			dir := streams.Dir
			if dir == "" {
				dir = "."
			}
			if fromLocal {
				if req.FromLocal, err = sessionLocalWork(cmd.Context(), dir); err != nil {
					return err
				}
			}
			switch {
			case repo != "":
				req.Repo = sessionRepoArg(cmd.Context(), dir, repo)
			case env == "":
				// The repository you are in, when hangar can read it.
				req.WorkingRepository, _ = sessionGitTop(cmd.Context(), dir)
			}
			return sessionRunE(lookupEnv, sessionCreate(streams, req, tf.wait))(cmd, args)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&env, "environment", "e", "", "environment to run in (default local, on the git repository you run this in)")
	fl.StringVar(&repo, "repo", "", "repository PATH or URL instead of the environment's (an ad-hoc environment)")
	fl.StringVar(&branch, "branch", "", "session branch (default hangar/session/NAME)")
	int32Flag(fl, &idle, "idle", "", 0, math.MinInt32, math.MaxInt32, "minutes idle before suspending; 0 = never (default HANGAR_SESSION_IDLE_MINUTES)")
	fl.StringVar(&model, "model", "", "model the harness runs")
	fl.StringVar(&approval, "approvals", "", "tool calls: never (run without asking) or ask (wait for session approvals)")
	fl.BoolVar(&fromLocal, "from-local", false, "continue this checkout: its unpushed commits and uncommitted changes go with the first turn")
	tf.register(cmd)
	return cmd
}

func sessionSendCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var tf sessionTurnFlags
	cmd := &cobra.Command{
		Use:   "send NAME MESSAGE",
		Short: "Continue a session: resume it if suspended, then run a turn (answers its open question)",
		Args:  sessionArgs(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(args[1]) == "" {
				return errors.New("MESSAGE is empty")
			}
			req := &sessionv1.SendMessageRequest{Name: args[0], Message: args[1]}
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
			return sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, _ []string) error {
				resp, err := c.SendMessage(ctx, req)
				if err != nil {
					return sessionCallErr(err)
				}
				sessionWriteTurnStarted(streams.Out, resp.GetSession(), resp.GetTurn())
				if tf.wait {
					return sessionWaitForTurn(ctx, c, streams, args[0], resp.GetTurn().GetNumber())
				}
				return nil
			})(cmd, args)
		},
	}
	tf.register(cmd)
	return cmd
}

func sessionListCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var (
		output *outputFormat
		states []string
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Sessions, most recently active first",
		Example: `  hangar session list
  hangar session list --state idle,suspended
  hangar session list -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := output.check(); err != nil {
				return err
			}
			req := &sessionv1.ListSessionsRequest{PageSize: 200}
			for _, s := range states {
				st, err := sessionParseState(s)
				if err != nil {
					return err
				}
				req.States = append(req.States, st)
			}
			return sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, _ []string) error {
				var all []*sessionv1.Session
				for {
					resp, err := c.ListSessions(ctx, req)
					if err != nil {
						return sessionCallErr(err)
					}
					all = append(all, resp.GetSessions()...)
					if resp.GetNextPageToken() == "" || resp.GetNextPageToken() == req.PageToken {
						break
					}
					req.PageToken = resp.GetNextPageToken()
				}
				return output.write(streams.Out, &sessionv1.ListSessionsResponse{Sessions: all}, func() error {
					return sessionFormatSessionList(streams.Out, all, time.Now())
				})
			})(cmd, args)
		},
	}
	output = addOutputFlag(cmd)
	cmd.Flags().StringSliceVar(&states, "state", nil, "only sessions in these states (idle, suspended, ...)")
	return cmd
}

// sessionParseState reads a state name as list shows it.
func sessionParseState(s string) (sessionv1.SessionState, error) {
	v, ok := sessionv1.SessionState_value["SESSION_STATE_"+strings.ToUpper(strings.ReplaceAll(s, "-", "_"))]
	if !ok || v == 0 {
		return 0, fmt.Errorf("--state %q: want running, idle, suspending, suspended, resuming, needs_input, archived or failed", s)
	}
	return sessionv1.SessionState(v), nil
}

func sessionGetCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var output *outputFormat
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "A session's state, turns, summaries, checkpoints, usage and resume_command",
		Example: `  hangar session get onboarding
  hangar session get onboarding -o yaml`,
		Args: sessionArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := output.check(); err != nil {
				return err
			}
			return sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, args []string) error {
				resp, err := c.GetSession(ctx, &sessionv1.GetSessionRequest{Name: args[0]})
				if err != nil {
					return sessionCallErr(err)
				}
				return output.write(streams.Out, resp.GetSession(), func() error {
					return sessionFormatSession(streams.Out, resp.GetSession(), time.Now())
				})
			})(cmd, args)
		},
	}
	output = addOutputFlag(cmd)
	return cmd
}

func sessionOpenCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	return &cobra.Command{
		Use:   "open NAME",
		Short: "Boot and restore a session without running the agent: work in its sandbox yourself",
		Args:  sessionArgs(1, 1),
		RunE: sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, args []string) error {
			resp, err := c.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: args[0]})
			if err != nil {
				return sessionCallErr(err)
			}
			s := resp.GetSession()
			fmt.Fprintf(streams.Out, "session %s is %s", s.GetName(), sessionStateLabel(s.GetState()))
			if s.GetSandboxId() != "" {
				fmt.Fprintf(streams.Out, " in sandbox %s\nattach: hangar sb attach %s\n", s.GetSandboxId(), s.GetSandboxId())
			} else {
				fmt.Fprintln(streams.Out)
			}
			if s.GetResumeCommand() != "" {
				fmt.Fprintf(streams.Out, "continue the agent's conversation there: %s\n", s.GetResumeCommand())
			}
			return nil
		}),
	}
}

func sessionKeepCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var idle int32
	cmd := &cobra.Command{
		Use:   "keep NAME --idle MIN",
		Short: "Set how long a session may sit idle before it suspends (0 = never)",
		Args:  sessionArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("idle") {
				return errors.New("--idle MIN is required: minutes idle before suspending, 0 = never")
			}
			if idle < 0 {
				return fmt.Errorf("--idle %d: want minutes, 0 (never) or more", idle)
			}
			return sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, args []string) error {
				resp, err := c.KeepSession(ctx, &sessionv1.KeepSessionRequest{Name: args[0], IdleMinutes: idle})
				if err != nil {
					return sessionCallErr(err)
				}
				name := resp.GetSession().GetName()
				if name == "" {
					name = args[0]
				}
				if idle == 0 {
					fmt.Fprintf(streams.Out, "session %s stays up until you suspend it (idle 0)\n", name)
				} else {
					fmt.Fprintf(streams.Out, "session %s suspends after %s idle\n", name, sessionMinutesLabel(idle))
				}
				return nil
			})(cmd, args)
		},
	}
	int32Flag(cmd.Flags(), &idle, "idle", "", 0, math.MinInt32, math.MaxInt32, "minutes idle before suspending; 0 = never")
	return cmd
}

func sessionSuspendCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	return &cobra.Command{
		Use:   "suspend NAME",
		Short: "Checkpoint a session and release its sandbox now",
		Args:  sessionArgs(1, 1),
		RunE: sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, args []string) error {
			resp, err := c.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: args[0]})
			if err != nil {
				return sessionCallErr(err)
			}
			sessionWriteStateLine(streams.Out, resp.GetSession())
			return nil
		}),
	}
}

func sessionArchiveCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	return &cobra.Command{
		Use:   "archive NAME",
		Short: "Drop a session's checkpoints; the record stays",
		Args:  sessionArgs(1, 1),
		RunE: sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, args []string) error {
			resp, err := c.ArchiveSession(ctx, &sessionv1.ArchiveSessionRequest{Name: args[0]})
			if err != nil {
				return sessionCallErr(err)
			}
			sessionWriteStateLine(streams.Out, resp.GetSession())
			return nil
		}),
	}
}

// sessionWriteStateLine prints "session NAME is STATE: REASON".
func sessionWriteStateLine(w io.Writer, s *sessionv1.Session) {
	fmt.Fprintf(w, "session %s is %s", s.GetName(), sessionStateLabel(s.GetState()))
	if s.GetStateReason() != "" && s.GetStateReason() != sessionStateLabel(s.GetState()) {
		fmt.Fprintf(w, ": %s", sessionOneLine(s.GetStateReason()))
	}
	fmt.Fprintln(w)
}

func sessionEventsCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var (
		follow bool
		turn   int32
		output *outputFormat
	)
	cmd := &cobra.Command{
		Use:   "events NAME",
		Short: "What the agent did: messages, commands, file changes, errors, usage",
		Example: `  hangar session events onboarding
  hangar session events onboarding --turn 2
  hangar session events onboarding --follow
  hangar session events onboarding -o json   # with --follow: one JSON object a line`,
		Args: sessionArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if turn < 0 {
				return fmt.Errorf("--turn %d: want a turn number (1, 2, ...)", turn)
			}
			if err := output.check(); err != nil {
				return err
			}
			return sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, args []string) error {
				var listed []*sessionv1.Event
				emit := func(e *sessionv1.Event, now time.Time, live bool) error {
					switch {
					case output.table():
						_, err := fmt.Fprintln(streams.Out, sessionFormatEvent(e, now))
						return err
					case !live:
						listed = append(listed, e)
						return nil
					case output.value == "json":
						b, err := apijson.Marshal(e)
						if err != nil {
							return err
						}
						_, err = fmt.Fprintf(streams.Out, "%s\n", b)
						return err
					default:
						fmt.Fprintln(streams.Out, "---")
						return writeMessage(streams.Out, "yaml", e)
					}
				}
				flush := func() error {
					if output.table() {
						return nil
					}
					if output.value == "json" && follow {
						for _, e := range listed {
							if err := emit(e, time.Time{}, true); err != nil {
								return err
							}
						}
						listed = nil
						return nil
					}
					err := writeMessage(streams.Out, output.value, &sessionv1.ListEventsResponse{Events: listed})
					listed = nil
					return err
				}
				return sessionEvents(ctx, c, args[0], turn, follow, emit, flush)
			})(cmd, args)
		},
	}
	output = addOutputFlag(cmd)
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing events as they happen (Ctrl-C to stop)")
	int32Flag(cmd.Flags(), &turn, "turn", "", 0, math.MinInt32, math.MaxInt32, "only this turn's events")
	return cmd
}

// sessionEventPage is how many events one ListEvents call asks for.
const sessionEventPage = 500

// sessionEvents lists a session's events through emit (live false), calls
// flush, then with follow emits each new one as it comes (live true).
func sessionEvents(ctx context.Context, c sessionv1.SessionServiceClient, name string, turn int32, follow bool,
	emit func(e *sessionv1.Event, now time.Time, live bool) error, flush func() error) error {
	var after int64
	for {
		resp, err := c.ListEvents(ctx, &sessionv1.ListEventsRequest{Name: name, AfterSeq: after, Turn: turn, PageSize: sessionEventPage})
		if err != nil {
			return sessionCallErr(err)
		}
		evs := resp.GetEvents()
		now := time.Now()
		for _, e := range evs {
			if err := emit(e, now, false); err != nil {
				return err
			}
			if e.GetSeq() > after {
				after = e.GetSeq()
			}
		}
		if len(evs) < sessionEventPage {
			break
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if !follow {
		return nil
	}
	// Following an agent holds its session open.
	release := holdSession(ctx, c, name, sessionv1.HoldKind_HOLD_KIND_COMMAND, "hangar session events --follow")
	defer release()
	stream, err := c.StreamEvents(ctx, &sessionv1.StreamEventsRequest{Name: name, AfterSeq: after})
	if err != nil {
		return sessionCallErr(err)
	}
	for {
		resp, err := stream.Recv()
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case status.Code(err) == codes.Canceled || ctx.Err() != nil:
			return nil // Ctrl-C: following ends without an error
		case err != nil:
			return sessionCallErr(err)
		}
		e := resp.GetEvent()
		if e.GetSeq() <= after || (turn != 0 && e.GetTurn() != turn) {
			continue
		}
		after = e.GetSeq()
		if err := emit(e, time.Now(), true); err != nil {
			return err
		}
	}
}

func sessionArtifactsCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var (
		get, to string
		turn    int32
		output  *outputFormat
	)
	cmd := &cobra.Command{
		Use:   "artifacts NAME",
		Short: "Files the agent handed back; --get PATH downloads one",
		Example: `  hangar session artifacts onboarding
  hangar session artifacts onboarding --get report.md
  hangar session artifacts onboarding --get report.md --to - | less`,
		Args: sessionArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if to != "" && get == "" {
				return errors.New("--to FILE goes with --get PATH")
			}
			if err := output.check(); err != nil {
				return err
			}
			if turn < 0 {
				return fmt.Errorf("--turn %d: want a turn number (1, 2, ...)", turn)
			}
			return sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, args []string) error {
				if get == "" {
					resp, err := c.ListArtifacts(ctx, &sessionv1.ListArtifactsRequest{Name: args[0], Turn: turn})
					if err != nil {
						return sessionCallErr(err)
					}
					return output.write(streams.Out, resp, func() error { return sessionFormatArtifacts(streams.Out, resp.GetArtifacts()) })
				}
				resp, err := c.GetArtifact(ctx, &sessionv1.GetArtifactRequest{Name: args[0], Path: get, Turn: turn})
				if err != nil {
					return sessionCallErr(err)
				}
				dest := to
				if dest == "" {
					dest = filepath.Base(get)
				}
				if dest == "-" {
					_, err := streams.Out.Write(resp.GetContent())
					return err
				}
				if err := sessionWriteNewFile(dest, resp.GetContent(), to == ""); err != nil {
					return err
				}
				fmt.Fprintf(streams.Out, "wrote %s (turn %d, %s) to %s\n", resp.GetArtifact().GetPath(), resp.GetArtifact().GetTurn(), sessionSizeLabel(int64(len(resp.GetContent()))), dest)
				return nil
			})(cmd, args)
		},
	}
	cmd.Flags().StringVar(&get, "get", "", "download the artifact at PATH")
	cmd.Flags().StringVar(&to, "to", "", "with --get: write to FILE (- for stdout; default the artifact's name here)")
	output = addOutputFlag(cmd)
	int32Flag(cmd.Flags(), &turn, "turn", "", 0, math.MinInt32, math.MaxInt32, "only this turn's artifacts (default every turn's; with --get the newest that has it)")
	return cmd
}

// sessionWriteNewFile writes content to path; keep refuses to overwrite a file that
// is there (the default destination, which the user did not choose).
func sessionWriteNewFile(path string, content []byte, keep bool) error {
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if keep {
		flags = os.O_WRONLY | os.O_CREATE | os.O_EXCL
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s already exists: choose another file with --to", path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, sessionUnwrapPathErr(err))
	}
	if _, err := f.Write(content); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, sessionUnwrapPathErr(err))
	}
	return f.Close()
}

func sessionPatchCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var to string
	cmd := &cobra.Command{
		Use:   "patch NAME",
		Short: "The session's work as one patch against its base (even while suspended)",
		Example: `  hangar session patch onboarding | git apply
  hangar session patch onboarding --to onboarding.patch`,
		Args: sessionArgs(1, 1),
		RunE: sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, args []string) error {
			resp, err := c.GetSessionPatch(ctx, &sessionv1.GetSessionPatchRequest{Name: args[0]})
			if err != nil {
				return sessionCallErr(err)
			}
			from := "it has not run yet"
			if resp.GetBaseCommit() != "" {
				from = "against base " + sessionShortCommit(resp.GetBaseCommit())
			}
			if resp.GetCheckpointId() != "" {
				from += ", from checkpoint " + resp.GetCheckpointId()
			}
			if to == "" || to == "-" {
				if resp.GetPatch() == "" {
					fmt.Fprintf(streams.Err, "session %s has no changes (%s)\n", args[0], from)
				}
				_, err := io.WriteString(streams.Out, resp.GetPatch())
				return err
			}
			if err := sessionWriteNewFile(to, []byte(resp.GetPatch()), false); err != nil {
				return err
			}
			fmt.Fprintf(streams.Out, "wrote the patch of %s (%s, %s) to %s\n", args[0], sessionSizeLabel(int64(len(resp.GetPatch()))), from, to)
			return nil
		}),
	}
	cmd.Flags().StringVar(&to, "to", "", "write the patch to FILE instead of stdout")
	return cmd
}

func sessionSteerCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	return &cobra.Command{
		Use:   "steer NAME MESSAGE",
		Short: "Tell the running agent something; it reads it at its next step",
		Args:  sessionArgs(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(args[1]) == "" {
				return errors.New("MESSAGE is empty")
			}
			return sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, args []string) error {
				resp, err := c.SteerTurn(ctx, &sessionv1.SteerTurnRequest{Name: args[0], Message: args[1]})
				if err != nil {
					return sessionCallErr(err)
				}
				fmt.Fprintf(streams.Out, "sent to the agent of %s: it reads it at its next step\n", sessionNameOr(resp.GetSession(), args[0]))
				return nil
			})(cmd, args)
		},
	}
}

func sessionInterruptCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var wait bool
	cmd := &cobra.Command{
		Use:   "interrupt NAME [MESSAGE]",
		Short: "Stop the running turn, or stop it and carry on with a new message",
		Args:  sessionArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &sessionv1.InterruptTurnRequest{Name: args[0]}
			if len(args) > 1 {
				if strings.TrimSpace(args[1]) == "" {
					return errors.New("MESSAGE is empty: leave it out to only stop the turn")
				}
				req.Message = args[1]
			}
			if wait && req.Message == "" {
				return errors.New("-w goes with a MESSAGE: without one no new turn starts")
			}
			return sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, args []string) error {
				resp, err := c.InterruptTurn(ctx, req)
				if err != nil {
					return sessionCallErr(err)
				}
				name := sessionNameOr(resp.GetSession(), args[0])
				fmt.Fprintf(streams.Out, "interrupted the running turn of %s\n", name)
				if t := resp.GetTurn(); t != nil && req.Message != "" {
					sessionWriteTurnStarted(streams.Out, resp.GetSession(), t)
					if wait {
						return sessionWaitForTurn(ctx, c, streams, name, t.GetNumber())
					}
				}
				return nil
			})(cmd, args)
		},
	}
	cmd.Flags().BoolVarP(&wait, "wait", "w", false, "with a MESSAGE: wait for the new turn")
	return cmd
}

func sessionApprovalsCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	var (
		allow, deny string
		all         bool
		output      *outputFormat
	)
	cmd := &cobra.Command{
		Use:   "approvals NAME [--allow ID | --deny ID]",
		Short: "Tool calls the agent waits on (--approvals ask); allow or deny one",
		Args:  sessionArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("allow") && cmd.Flags().Changed("deny") {
				return errors.New("give --allow ID or --deny ID, not both")
			}
			id, allowed := allow, true
			if cmd.Flags().Changed("deny") {
				id, allowed = deny, false
			}
			if (cmd.Flags().Changed("allow") || cmd.Flags().Changed("deny")) && id == "" {
				return errors.New("--allow and --deny take an approval ID (see hangar session approvals NAME)")
			}
			if err := output.check(); err != nil {
				return err
			}
			return sessionRunE(lookupEnv, func(ctx context.Context, c sessionv1.SessionServiceClient, args []string) error {
				if id == "" {
					resp, err := c.ListApprovals(ctx, &sessionv1.ListApprovalsRequest{Name: args[0], All: all})
					if err != nil {
						return sessionCallErr(err)
					}
					return output.write(streams.Out, resp, func() error { return sessionFormatApprovals(streams.Out, resp.GetApprovals(), time.Now()) })
				}
				resp, err := c.AnswerApproval(ctx, &sessionv1.AnswerApprovalRequest{Name: args[0], ApprovalId: id, Allow: allowed})
				if err != nil {
					return sessionCallErr(err)
				}
				a := resp.GetApproval()
				fmt.Fprintf(streams.Out, "%s %s (%s)\n", sessionApprovalStateLabel(a.GetState()), id, a.GetToolName())
				return nil
			})(cmd, args)
		},
	}
	cmd.Flags().StringVar(&allow, "allow", "", "let the tool call with this ID run")
	cmd.Flags().StringVar(&deny, "deny", "", "refuse the tool call with this ID")
	cmd.Flags().BoolVar(&all, "all", false, "include answered ones")
	output = addOutputFlag(cmd)
	return cmd
}

func sessionNameOr(s *sessionv1.Session, name string) string {
	if s.GetName() != "" {
		return s.GetName()
	}
	return name
}

// sessionTabs is the tabwriter every session table uses.
func sessionTabs(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// sessionCreate creates the session req names, says so, and with wait
// follows its first turn to its end (session new, harness thaw).
func sessionCreate(streams Streams, req *sessionv1.CreateSessionRequest, wait bool) func(ctx context.Context, c sessionv1.SessionServiceClient, _ []string) error {
	return func(ctx context.Context, c sessionv1.SessionServiceClient, _ []string) error {
		resp, err := c.CreateSession(ctx, req)
		if err != nil {
			return sessionCallErr(err)
		}
		sessionWriteCreated(streams.Out, resp)
		if wait && resp.GetTurn() != nil {
			return sessionWaitForTurn(ctx, c, streams, resp.GetSession().GetName(), resp.GetTurn().GetNumber())
		}
		return nil
	}
}
