package tool

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// agentMain is hangar-agent, the agent's way to hand things back: `ask`
// records a question (the turn ends needs_input), `artifact` hands files
// back. It writes under $HOME/.hangar-agent, which the session reads when
// the turn ends: no network is needed, so it works with egress none.
func agentMain(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	usage := func() int {
		fmt.Fprintln(stderr, "usage: hangar-agent ask QUESTION | hangar-agent artifact PATH...")
		return 2
	}
	if len(args) == 0 {
		return usage()
	}
	home, err := os.UserHomeDir()
	if err != nil {
		fmt.Fprintf(stderr, "hangar-agent: %v\n", err)
		return 1
	}
	dir := filepath.Join(home, ".hangar-agent")
	switch args[0] {
	case "ask":
		if len(args) < 2 {
			fmt.Fprintln(stderr, "usage: hangar-agent ask QUESTION")
			return 2
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fmt.Fprintf(stderr, "hangar-agent: %v\n", err)
			return 1
		}
		if err := os.WriteFile(filepath.Join(dir, "question"), []byte(strings.Join(args[1:], " ")), 0o644); err != nil {
			fmt.Fprintf(stderr, "hangar-agent: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout, "hangar: your question is recorded. End your turn now; the answer comes as the next message.")
		return 0
	case "artifact":
		if len(args) < 2 {
			fmt.Fprintln(stderr, "usage: hangar-agent artifact PATH...")
			return 2
		}
		for _, f := range args[1:] {
			if st, err := os.Stat(f); err != nil || !st.Mode().IsRegular() {
				fmt.Fprintf(stderr, "hangar-agent: %s is not a file\n", f)
				return 1
			}
			rel := f
			if filepath.IsAbs(f) {
				rel = filepath.Base(f)
			}
			if err := copyFile(f, filepath.Join(dir, "artifacts", rel)); err != nil {
				fmt.Fprintf(stderr, "hangar-agent: %v\n", err)
				return 1
			}
			fmt.Fprintf(stdout, "hangar: handed back %s\n", rel)
		}
		return 0
	default:
		return usage()
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
