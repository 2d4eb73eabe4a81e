package command

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/hangar-dev/hangar/cli/up"
	"github.com/hangar-dev/hangar/platform/config"
	sessionapp "github.com/hangar-dev/hangar/session-svc/app"
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
		// The flags are the typed config's own (std flag, with HANGAR_* names).
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			var cfg up.Config
			fs := flag.NewFlagSet("hangar up", flag.ContinueOnError)
			// Errors are one line; -h prints the flags and their variables.
			fs.SetOutput(io.Discard)
			if err := config.Load(&cfg, fs, args, lookupEnv); err != nil {
				if errors.Is(err, flag.ErrHelp) {
					fmt.Fprintf(streams.Out, "Usage: hangar up [flags]\n\n")
					fs.SetOutput(streams.Out)
					fs.PrintDefaults()
					return nil
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
	if s.OfflineModel != "" {
		fmt.Fprintf(w, "  model   offline (scripted upstream at %s; set HANGAR_ANTHROPIC_API_KEY or HANGAR_OPENAI_API_KEY for a real one)\n", s.OfflineModel)
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
