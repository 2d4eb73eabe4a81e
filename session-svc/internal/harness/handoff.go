package harness

import (
	"fmt"
	"strings"
)

// TurnSummary is one earlier turn, as a handoff tells it.
type TurnSummary struct {
	Number       int
	Harness      Name
	Message      string
	Result       string
	FilesChanged []string
}

// Handoff limits: a handoff is a short account, not a transcript.
const (
	handoffMessageRunes = 600
	handoffResultRunes  = 1200
	handoffFiles        = 20
	// handoffTurns is how many of the latest turns are told; older ones
	// are counted.
	handoffTurns = 20
)

// Handoff is the prompt that starts a conversation in another harness (a
// switch, or a fork into a harness that cannot fork): a short account of
// the earlier turns, then nextMessage. With no earlier turns it is
// nextMessage.
func Handoff(turns []TurnSummary, nextMessage string) string {
	if len(turns) == 0 {
		return nextMessage
	}
	var b strings.Builder
	b.WriteString("You are continuing a session that another coding agent worked on in this same work tree. ")
	b.WriteString("Its conversation is not available to you; here is a short account of the earlier turns. ")
	b.WriteString("The work tree already holds their changes: check it rather than redo them.\n\n")
	if skipped := len(turns) - handoffTurns; skipped > 0 {
		fmt.Fprintf(&b, "(%d earlier turns omitted)\n\n", skipped)
		turns = turns[skipped:]
	}
	for _, t := range turns {
		fmt.Fprintf(&b, "## Turn %d", t.Number)
		if t.Harness != "" {
			fmt.Fprintf(&b, " (%s)", t.Harness)
		}
		b.WriteString("\nRequest: ")
		b.WriteString(oneBlock(t.Message, handoffMessageRunes))
		b.WriteString("\nOutcome: ")
		if strings.TrimSpace(t.Result) == "" {
			b.WriteString("(no final answer)")
		} else {
			b.WriteString(oneBlock(t.Result, handoffResultRunes))
		}
		if n := len(t.FilesChanged); n > 0 {
			files := t.FilesChanged
			if n > handoffFiles {
				files = files[:handoffFiles]
			}
			b.WriteString("\nFiles changed: ")
			b.WriteString(strings.Join(files, ", "))
			if n > handoffFiles {
				fmt.Fprintf(&b, " and %d more", n-handoffFiles)
			}
		}
		b.WriteString("\n\n")
	}
	b.WriteString("## Your task now\n")
	b.WriteString(nextMessage)
	return b.String()
}

// oneBlock trims s and cuts it to at most n runes.
func oneBlock(s string, n int) string {
	s = strings.TrimSpace(s)
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return strings.TrimSpace(string(r[:n])) + " …"
}
