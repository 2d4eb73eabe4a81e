package command

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	checkpointapp "github.com/hangar-dev/hangar/checkpoint-svc/app"
	"github.com/hangar-dev/hangar/cli/up"
	gatewayapp "github.com/hangar-dev/hangar/gateway-svc/app"
	"github.com/hangar-dev/hangar/platform/config"
	replayapp "github.com/hangar-dev/hangar/replay-svc/app"
	sandboxapp "github.com/hangar-dev/hangar/sandbox-svc/app"
	sessionapp "github.com/hangar-dev/hangar/session-svc/app"
	"github.com/hangar-dev/hangar/web"
)

func upCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	return &cobra.Command{
		Use:   "up [flags]",
		Short: "Run all of hangar in this process, on loopback, with embedded defaults",
		Long: `Run all five hangar services in this process on loopback: data under
HANGAR_HOME (~/.hangar), an embedded Redis unless HANGAR_REDIS_URL is set,
SQLite unless HANGAR_DATABASE_URL is set. Prints the URL and token clients use;
Ctrl-C stops it. Every flag has a HANGAR_* variable (see -h).

The terminal shows warnings and errors (-v: every record at the log level);
the full log goes to HANGAR_HOME/logs/hangar.log (the previous start's is
hangar.log.1).`,
		Example: `  hangar up
  hangar up -v                         # every log record on the terminal too
  hangar up --port 7500                # a second hangar: the front door on 7500, services on 7501-7505
  HANGAR_HOME=/tmp/h2 hangar up --port 7500`,
		// The flags are the typed config's own (with HANGAR_* names); they
		// take --name or -name.
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			var cfg up.Config
			fs := flag.NewFlagSet("hangar up", flag.ContinueOnError)
			// Errors are one line; -h prints the flags and their variables.
			fs.SetOutput(io.Discard)
			if err := config.Load(&cfg, fs, args, lookupEnv); err != nil {
				if errors.Is(err, flag.ErrHelp) {
					return writeUpHelp(streams.Out, cmd, fs)
				}
				return err
			}
			if fs.NArg() > 0 {
				return fmt.Errorf("hangar up takes no arguments, got %q", strings.Join(fs.Args(), " "))
			}
			log, err := openUpLog(cfg.Home, cfg.LogLevel, cfg.LogFormat, cfg.Verbose, streams.Err)
			if err != nil {
				return err
			}
			defer log.close()
			stack, err := up.Start(cmd.Context(), cfg, lookupEnv, log.logger)
			if err != nil {
				return err
			}
			printStack(streams, stack)
			stopped := make(chan struct{})
			go func() {
				select {
				case <-cmd.Context().Done():
					log.stopping()
				case <-stopped:
				}
			}()
			err = stack.Wait()
			close(stopped)
			if cmd.Context().Err() != nil {
				log.stopping() // its header comes before the last line, whichever goroutine runs first
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(streams.Err, "hangar stopped")
			return nil
		},
	}
}

// writeAgentCLIs lists each agent CLI with its version, or how to get it.
func writeAgentCLIs(w io.Writer, clis []sessionapp.AgentCLI) {
	for i, c := range clis {
		label := "  agents  "
		if i > 0 {
			label = "          "
		}
		switch {
		case c.Path == "":
			fmt.Fprintf(w, "%s%-11s not found (%s): %s\n", label, c.Harness, c.Binary, c.Hint)
		case c.Version == "":
			fmt.Fprintf(w, "%s%-11s %s, but `%s --version` failed", label, c.Harness, c.Path, filepath.Base(c.Path))
			if c.Note != "" {
				fmt.Fprintf(w, ": %s", c.Note)
			}
			fmt.Fprintln(w)
		default:
			fmt.Fprintf(w, "%s%-11s %s  %s\n", label, c.Harness, c.Version, c.Path)
		}
	}
}

// upSettingRE finds the variable in a config flag's usage ("..., env
// HANGAR_X)").
var upSettingRE = regexp.MustCompile(`env (HANGAR_[A-Z0-9_]+)`)

// writeUpHelp is `hangar up -h`: its own flags (--name, each also a
// variable), then every setting the services it runs read, by service.
func writeUpHelp(w io.Writer, cmd *cobra.Command, own *flag.FlagSet) error {
	fmt.Fprintf(w, "%s\n\nUsage:\n  hangar up [flags]\n\nExamples:\n%s\n\nFlags (each also the HANGAR_* variable named):\n", cmd.Long, cmd.Example)
	seen := map[string]bool{}
	own.VisitAll(func(f *flag.Flag) {
		name := "--" + f.Name
		if len(f.Name) == 1 {
			name = "-" + f.Name
		}
		def := ""
		if f.DefValue != "" && f.DefValue != "false" {
			def = " (default " + f.DefValue + ")"
		}
		text, kind, limits := upSettingUsage(f.Usage)
		if kind != "" && kind != "bool" {
			name += " " + kind
		}
		fmt.Fprintf(w, "  %-22s %s%s%s\n", name, text, limits, def)
		if m := upSettingRE.FindStringSubmatch(f.Usage); m != nil {
			seen[m[1]] = true
		}
	})
	fmt.Fprintf(w, "  %-22s %s\n", "-h, --help", "this help")
	none := func(string) (string, bool) { return "", false }
	for _, svc := range []struct {
		name string
		load func(fs *flag.FlagSet) error
	}{
		{"session-svc", func(fs *flag.FlagSet) error { _, err := sessionapp.LoadConfig(fs, nil, none); return err }},
		{"sandbox-svc", func(fs *flag.FlagSet) error { _, err := sandboxapp.LoadConfig(fs, nil, none); return err }},
		{"checkpoint-svc", func(fs *flag.FlagSet) error { _, err := checkpointapp.LoadConfig(fs, nil, none); return err }},
		{"gateway-svc", func(fs *flag.FlagSet) error { _, err := gatewayapp.LoadConfig(fs, nil, none); return err }},
		{"replay-svc", func(fs *flag.FlagSet) error { _, err := replayapp.LoadConfig(fs, nil, none); return err }},
	} {
		fs := flag.NewFlagSet(svc.name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		_ = svc.load(fs) // only the registered flags matter: a missing token is no error here
		var lines []string
		fs.VisitAll(func(f *flag.Flag) {
			m := upSettingRE.FindStringSubmatch(f.Usage)
			if m == nil || seen[m[1]] {
				return
			}
			seen[m[1]] = true
			text, kind, limits := upSettingUsage(f.Usage)
			usage := text + limits
			if kind != "" && kind != "string" && kind != "int" && kind != "bool" {
				usage += " (" + kind + ")"
			}
			setting := m[1]
			if f.DefValue != "" {
				setting += "=" + f.DefValue
			}
			lines = append(lines, fmt.Sprintf("  %-44s %s", setting, usage))
		})
		if len(lines) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s settings (variables; the default after =):\n%s\n", svc.name, strings.Join(lines, "\n"))
	}
	return nil
}

// upSettingUsage splits a config flag's usage, "text (`kind`, limits, env
// HANGAR_X)", into the text, the kind (string, minutes, ...) and the limits
// (" (one of a|b)", " (>= 0)").
func upSettingUsage(usage string) (text, kind, limits string) {
	i := strings.LastIndex(usage, " (")
	if i < 0 || !strings.HasSuffix(usage, ")") || !strings.Contains(usage[i:], "env HANGAR_") {
		return usage, "", ""
	}
	text = usage[:i]
	var rest []string
	for _, part := range strings.Split(strings.TrimSuffix(usage[i+2:], ")"), ", ") {
		switch {
		case strings.HasPrefix(part, "env "):
		case strings.HasPrefix(part, "`") && strings.HasSuffix(part, "`"):
			kind = strings.Trim(part, "`")
		default:
			rest = append(rest, part)
		}
	}
	if len(rest) > 0 {
		limits = " (" + strings.Join(rest, ", ") + ")"
	}
	return text, kind, limits
}

func printStack(streams Streams, s *up.Stack) {
	w := streams.Out
	fmt.Fprintf(w, "hangar is up\n\n")
	fmt.Fprintf(w, "  url     %s\n", s.URL)
	if s.TokenGenerated {
		fmt.Fprintf(w, "  token   %s   (new; saved in %s/token)\n", s.Token, s.Home)
	} else {
		fmt.Fprintf(w, "  token   %s\n", s.Token)
	}
	fmt.Fprintf(w, "  data    %s\n", s.Home)
	fmt.Fprintf(w, "  web     %s   (the dashboard; opening it signs you in)\n", web.SignInURL(s.URL, s.Token))
	if s.OfflineModel != "" {
		fmt.Fprintf(w, "  model   offline (scripted upstream at %s; set HANGAR_ANTHROPIC_API_KEY or HANGAR_OPENAI_API_KEY for a real one)\n", s.OfflineModel)
	}
	switch s.SandboxIsolation {
	case "none":
		fmt.Fprintf(w, "  sandbox isolation OFF (HANGAR_SANDBOX_ISOLATION=none): agents run as this user and can read its files, hangar's token and keys\n")
	case "unavailable":
		fmt.Fprintf(w, "  sandbox isolation UNAVAILABLE: no sandbox will start (install bubblewrap and allow user namespaces, or set HANGAR_SANDBOX_ISOLATION=none)\n")
	}
	writeAgentCLIs(w, s.AgentCLIs)
	fmt.Fprintf(w, "\n")
	for _, e := range s.Services {
		fmt.Fprintf(w, "  %-15s %s\n", e.Name, e.Addr)
	}
	fmt.Fprintf(w, "\nThe hangar CLI finds it through %s; elsewhere set HANGAR_URL=%s and HANGAR_TOKEN.\nCtrl-C stops it.\n", s.Home, s.URL)
	if f, ok := w.(*os.File); ok {
		_ = f.Sync()
	}
}
