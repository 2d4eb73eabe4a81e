package command

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// The session formatters take "now" so their output is reproducible: times
// are shown in now's location, and relative to it.

// enumLabel is an enum value as users type it: lower case without the
// prefix; "-" for UNSPECIFIED.
func sessionEnumLabel(s, prefix string) string {
	s = strings.TrimPrefix(s, prefix)
	if s == "UNSPECIFIED" || s == "" {
		return "-"
	}
	return strings.ToLower(s)
}

func sessionStateLabel(s sessionv1.SessionState) string {
	return sessionEnumLabel(s.String(), "SESSION_STATE_")
}

func sessionHarnessLabel(h sessionv1.Harness) string {
	return sessionEnumLabel(h.String(), "HARNESS_")
}

func sessionOutcomeLabel(o sessionv1.TurnOutcome) string {
	if o == sessionv1.TurnOutcome_TURN_OUTCOME_UNSPECIFIED {
		return "running"
	}
	return sessionEnumLabel(o.String(), "TURN_OUTCOME_")
}

func sessionEventKindLabel(k sessionv1.EventKind) string {
	return sessionEnumLabel(k.String(), "EVENT_KIND_")
}

func sessionHoldKindLabel(k sessionv1.HoldKind) string {
	return sessionEnumLabel(k.String(), "HOLD_KIND_")
}

func sessionApprovalStateLabel(s sessionv1.ApprovalState) string {
	return sessionEnumLabel(s.String(), "APPROVAL_STATE_")
}

// sessionDuration is a short human duration: 45s, 12m, 3h, 2d; 1m30s and
// 2h15m keep one more unit below ten of the larger.
func sessionDuration(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Round(time.Second)/time.Second))
	case d < 10*time.Minute:
		d = d.Round(time.Second)
		m, s := int(d/time.Minute), int(d%time.Minute/time.Second)
		if s == 0 {
			return fmt.Sprintf("%dm", m)
		}
		return fmt.Sprintf("%dm%02ds", m, s)
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Round(time.Minute)/time.Minute))
	case d < 10*time.Hour:
		d = d.Round(time.Minute)
		h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
		if m == 0 {
			return fmt.Sprintf("%dh", h)
		}
		return fmt.Sprintf("%dh%02dm", h, m)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Round(time.Hour)/time.Hour))
	default:
		return fmt.Sprintf("%dd", int(d.Round(24*time.Hour)/(24*time.Hour)))
	}
}

// sessionAgo is how long before now t was: "just now", "5m ago", "in 3m".
func sessionAgo(t *timestamppb.Timestamp, now time.Time) string {
	if t == nil || !t.IsValid() || t.AsTime().IsZero() || t.GetSeconds() == 0 {
		return "-"
	}
	d := now.Sub(t.AsTime())
	switch {
	case d < -time.Second:
		return "in " + sessionDuration(-d)
	case d < 10*time.Second:
		return "just now"
	default:
		return sessionDuration(d) + " ago"
	}
}

// sessionClock is t's time of day in now's location, with the date when it is
// not today.
func sessionClock(t *timestamppb.Timestamp, now time.Time) string {
	if t == nil || t.GetSeconds() == 0 {
		return "-"
	}
	at := t.AsTime().In(now.Location())
	y1, m1, d1 := at.Date()
	y2, m2, d2 := now.Date()
	if y1 == y2 && m1 == m2 && d1 == d2 {
		return at.Format("15:04:05")
	}
	if y1 == y2 {
		return at.Format("Jan 02 15:04:05")
	}
	return at.Format("2006-01-02 15:04:05")
}

func sessionMinutesLabel(m int32) string {
	if m >= 60 && m%60 == 0 {
		return fmt.Sprintf("%dm (%dh)", m, m/60)
	}
	return fmt.Sprintf("%dm", m)
}

// sessionTokens is a token count in k and M.
func sessionTokens(n int64) string {
	switch {
	case n < 1000:
		return fmt.Sprintf("%d", n)
	case n < 1_000_000:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", float64(n)/1e3), ".0") + "k"
	default:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", float64(n)/1e6), ".0") + "M"
	}
}

// sessionCost is USD with cents; below a cent with more digits.
func sessionCost(usd float64) string {
	if usd > 0 && usd < 0.01 {
		return fmt.Sprintf("$%.4f", usd)
	}
	return fmt.Sprintf("$%.2f", usd)
}

// sessionSizeLabel is the one size unit every command prints: B, KB, MB,
// GB of 1024 (the MB of HANGAR_SESSION_MAX_UNTRACKED_MB).
func sessionSizeLabel(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%.1f GB", float64(n)/(1<<30))
	}
}

func sessionShortCommit(c string) string {
	if c == "" {
		return "(unknown)"
	}
	if len(c) > 12 {
		return c[:12]
	}
	return c
}

func sessionPlural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// sessionUsage is "3 calls · 12.3k in / 678 out tokens · $0.02", with cache
// tokens when there are any.
func sessionUsage(u *sessionv1.Usage) string {
	parts := []string{sessionPlural(int64(u.GetModelCalls()), "call", "calls")}
	tokens := sessionTokens(u.GetInputTokens()) + " in / " + sessionTokens(u.GetOutputTokens()) + " out tokens"
	if u.GetCacheReadTokens() > 0 || u.GetCacheWriteTokens() > 0 {
		tokens += fmt.Sprintf(" (cache %s read / %s written)", sessionTokens(u.GetCacheReadTokens()), sessionTokens(u.GetCacheWriteTokens()))
	}
	return strings.Join(append(parts, tokens, sessionCost(u.GetCostUsd())), " · ")
}

// sessionTurnTook is how long a turn ran, "" while it runs.
func sessionTurnTook(t *sessionv1.Turn) string {
	if t.GetStartedAt() == nil || t.GetEndedAt() == nil {
		return ""
	}
	return sessionDuration(t.GetEndedAt().AsTime().Sub(t.GetStartedAt().AsTime()))
}

// sessionFormatOutcome is a finished turn in one line:
// "turn 2 completed in 12s · 3 calls · $0.02".
func sessionFormatOutcome(t *sessionv1.Turn) string {
	var b strings.Builder
	fmt.Fprintf(&b, "turn %d %s", t.GetNumber(), sessionOutcomeLabel(t.GetOutcome()))
	if took := sessionTurnTook(t); took != "" {
		fmt.Fprintf(&b, " in %s", took)
	}
	u := t.GetUsage()
	fmt.Fprintf(&b, " · %s · %s", sessionPlural(int64(u.GetModelCalls()), "call", "calls"), sessionCost(u.GetCostUsd()))
	if r := t.GetOutcomeReason(); r != "" {
		fmt.Fprintf(&b, " (%s)", sessionOneLine(r))
	}
	return b.String()
}

// sessionWriteTurnEnd prints a finished turn as -w shows it: the outcome line, then
// the agent's result, its question, artifacts and warnings.
func sessionWriteTurnEnd(w io.Writer, name string, t *sessionv1.Turn) {
	fmt.Fprintln(w, sessionFormatOutcome(t))
	for _, warn := range t.GetWarnings() {
		fmt.Fprintf(w, "warning: %s\n", sessionOneLine(warn))
	}
	if t.GetOutcome() == sessionv1.TurnOutcome_TURN_OUTCOME_NEEDS_INPUT || t.GetQuestion() != nil {
		q := t.GetQuestion().GetText()
		if q == "" {
			q = t.GetResult()
		}
		fmt.Fprintf(w, "\nthe agent asks: %s\n", strings.TrimSpace(q))
		fmt.Fprintf(w, "answer with: hangar session send %s \"...\"\n", name)
	} else if r := strings.TrimRight(t.GetResult(), "\n"); r != "" {
		fmt.Fprintf(w, "\n%s\n", r)
	}
	if sr := t.GetStructuredResult(); sr != nil {
		// encoding/json, not protojson: protojson varies its whitespace on
		// purpose, and this line is read by people and golden files.
		if b, err := json.Marshal(sr.AsMap()); err == nil {
			fmt.Fprintf(w, "\nstructured result: %s\n", b)
		}
	}
	if arts := t.GetArtifacts(); len(arts) > 0 {
		paths := make([]string, 0, len(arts))
		for _, a := range arts {
			paths = append(paths, a.GetPath())
		}
		fmt.Fprintf(w, "\nartifacts: %s (hangar session artifacts %s --get PATH)\n", strings.Join(paths, ", "), name)
	}
}

// sessionWriteCreated prints what session new made.
func sessionWriteCreated(w io.Writer, resp *sessionv1.CreateSessionResponse) {
	s, t := resp.GetSession(), resp.GetTurn()
	fmt.Fprintf(w, "created session %s on %s", s.GetName(), sessionRepoLabel(resp.GetRepository()))
	if c := resp.GetBaseCommit(); c != "" {
		fmt.Fprintf(w, " at %s", sessionShortCommit(c))
	}
	fmt.Fprintf(w, " (environment %s): %s, branch %s\n", s.GetEnvironment(), sessionHarnessLabel(s.GetHarness()), s.GetBranch())
	if t == nil {
		fmt.Fprintf(w, "start its first turn: hangar session send %s MESSAGE\n", s.GetName())
		return
	}
	sessionWriteTurnStarted(w, s, t)
}

// sessionRepoLabel names a repository: a path as it is, a URL without
// credentials.
func sessionRepoLabel(repo string) string {
	if repo == "" {
		return "its environment's repository"
	}
	if u, err := url.Parse(repo); err == nil && u.User != nil {
		u.User = nil
		return u.String()
	}
	return repo
}

// sessionWriteTurnStarted prints that a turn started and how to follow it.
func sessionWriteTurnStarted(w io.Writer, s *sessionv1.Session, t *sessionv1.Turn) {
	fmt.Fprintf(w, "turn %d started", t.GetNumber())
	if h := t.GetHarness(); h != sessionv1.Harness_HARNESS_UNSPECIFIED {
		fmt.Fprintf(w, " (%s)", sessionHarnessLabel(h))
	}
	if st := s.GetState(); st == sessionv1.SessionState_SESSION_STATE_RESUMING {
		if t.GetNumber() == 1 {
			fmt.Fprint(w, ", starting the session's sandbox first")
		} else {
			fmt.Fprint(w, ", resuming the session first")
		}
	}
	fmt.Fprintf(w, "; follow it: hangar session events %s --follow --turn %d\n", s.GetName(), t.GetNumber())
}

// sessionFormatEvent is one event on one line: time, kind, text.
func sessionFormatEvent(e *sessionv1.Event, now time.Time) string {
	return fmt.Sprintf("%s  %-13s %s", sessionClock(e.GetTime(), now), sessionEventKindLabel(e.GetKind()), sessionEventText(e))
}

func sessionEventText(e *sessionv1.Event) string {
	text := sessionOneLine(e.GetText())
	switch e.GetKind() {
	case sessionv1.EventKind_EVENT_KIND_COMMAND:
		if e.GetExitCode() != 0 {
			text += fmt.Sprintf(" (exit %d)", e.GetExitCode())
		}
	case sessionv1.EventKind_EVENT_KIND_FILE_CHANGE:
		if p := e.GetPath(); p != "" && p != text {
			if text == "" {
				text = p
			} else {
				text = p + ": " + text
			}
		}
	case sessionv1.EventKind_EVENT_KIND_USAGE:
		if e.GetUsage() != nil {
			if text == "" {
				text = sessionUsage(e.GetUsage())
			} else {
				text += " (" + sessionUsage(e.GetUsage()) + ")"
			}
		}
	}
	if e.GetTurn() > 0 {
		return fmt.Sprintf("[%d] %s", e.GetTurn(), text)
	}
	return text
}

// sessionFormatSessionList is `session list`: one row per session in the order given.
func sessionFormatSessionList(w io.Writer, sessions []*sessionv1.Session, now time.Time) error {
	if len(sessions) == 0 {
		_, err := fmt.Fprintln(w, "no sessions yet: start one with hangar session new NAME [MESSAGE]")
		return err
	}
	tw := sessionTabs(w)
	fmt.Fprintln(tw, "NAME\tSTATE\tHARNESS\tENV\tLAST ACTIVE\tTURNS\tCOST")
	for _, s := range sessions {
		turns, cost := "-", "-"
		// The list carries turns and usage only when the server fills them.
		if s.GetUsage() != nil || s.GetTurnCount() > 0 {
			turns = fmt.Sprint(s.GetTurnCount())
			cost = sessionCost(s.GetUsage().GetCostUsd())
		}
		active := s.GetLastActiveAt()
		if active == nil {
			active = s.GetCreatedAt()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.GetName(), sessionStateLabel(s.GetState()), sessionHarnessLabel(s.GetHarness()),
			s.GetEnvironment(), sessionAgo(active, now), turns, cost)
	}
	return tw.Flush()
}

// sessionFormatSession is `session get`.
func sessionFormatSession(w io.Writer, s *sessionv1.Session, now time.Time) error {
	tw := sessionTabs(w)
	row := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, a...)) }

	row("name", "%s", s.GetName())
	state := sessionStateLabel(s.GetState())
	if r := s.GetStateReason(); r != "" {
		state += ": " + sessionOneLine(r)
	}
	if s.GetStateChangedAt() != nil {
		state += fmt.Sprintf(" (%s)", sessionAgo(s.GetStateChangedAt(), now))
	}
	row("state", "%s", state)
	if q := s.GetQuestion(); q != nil {
		row("question", "%s (turn %d; answer with hangar session send %s \"...\")", sessionOneLine(q.GetText()), q.GetTurn(), s.GetName())
	}
	h := sessionHarnessLabel(s.GetHarness())
	if s.GetModel() != "" {
		h += ", model " + s.GetModel()
	}
	if s.GetHarnessLock() != "" {
		h += ", from harness lock " + s.GetHarnessLock()
	}
	row("harness", "%s", h)
	row("environment", "%s", s.GetEnvironment())
	if s.GetRepo() != "" {
		row("repo", "%s", s.GetRepo())
	}
	if s.GetBaseCommit() != "" {
		row("branch", "%s (from %s)", s.GetBranch(), sessionShortCommit(s.GetBaseCommit()))
	} else {
		row("branch", "%s", s.GetBranch())
	}
	if s.GetParentId() != "" {
		row("fork of", "%s (checkpoint %s)", s.GetParentId(), s.GetForkedFromCheckpoint())
	}
	if s.GetSandboxId() != "" {
		row("sandbox", "%s (attach: hangar sb attach %s)", s.GetSandboxId(), s.GetSandboxId())
	} else {
		row("sandbox", "none")
	}

	idle := "default (HANGAR_SESSION_IDLE_MINUTES)"
	if s.IdleMinutes != nil {
		if s.GetIdleMinutes() == 0 {
			idle = "0: never suspends by itself"
		} else {
			idle = sessionMinutesLabel(s.GetIdleMinutes())
		}
	}
	row("idle time", "%s", idle)
	for i, hold := range s.GetHolds() {
		k := ""
		if i == 0 {
			k = "held open by"
		}
		desc := sessionHoldKindLabel(hold.GetKind())
		if hold.GetDescription() != "" {
			desc += ": " + sessionOneLine(hold.GetDescription())
		}
		row(k, "%s (%s, since %s, lapses %s unless renewed)", desc, hold.GetOwner(), sessionAgo(hold.GetAcquiredAt(), now), sessionAgo(hold.GetExpiresAt(), now))
	}
	if at := s.GetSuspendAt(); at != nil && len(s.GetHolds()) == 0 {
		row("suspends", "%s (%s) unless something holds it", sessionAgo(at, now), sessionClock(at, now))
	}
	if s.GetResumeCommand() != "" {
		row("resume", "%s", s.GetResumeCommand())
	}
	if b := s.GetBudget(); b != nil && (b.GetMaxCostUsd() > 0 || b.GetMaxTokens() > 0 || b.GetMaxMinutes() > 0) {
		row("budget", "%s per turn", sessionBudgetLabel(b))
	}
	if s.GetApprovals() != sessionv1.ApprovalMode_APPROVAL_MODE_UNSPECIFIED {
		row("approvals", "%s", sessionEnumLabel(s.GetApprovals().String(), "APPROVAL_MODE_"))
	}
	if s.GetCacheTtl() != "" {
		row("cache", "%s", s.GetCacheTtl())
	}
	row("created", "%s (%s)", sessionClock(s.GetCreatedAt(), now), sessionAgo(s.GetCreatedAt(), now))
	row("last active", "%s", sessionAgo(s.GetLastActiveAt(), now))
	row("usage", "%s · %s", sessionPlural(int64(len(s.GetTurns())), "turn", "turns"), sessionUsage(s.GetUsage()))
	if err := tw.Flush(); err != nil {
		return err
	}

	if turns := s.GetTurns(); len(turns) > 0 {
		fmt.Fprintln(w, "\nturns")
		for _, t := range turns {
			line := fmt.Sprintf("  %d  %s", t.GetNumber(), sessionOutcomeLabel(t.GetOutcome()))
			if took := sessionTurnTook(t); took != "" {
				line += " in " + took
			}
			line += " · " + sessionHarnessLabel(t.GetHarness())
			if t.GetInherited() {
				line += " · inherited from the parent"
			} else {
				line += " · " + sessionUsage(t.GetUsage())
			}
			if t.GetStartedAt() != nil {
				line += " · started " + sessionClock(t.GetStartedAt(), now)
			}
			fmt.Fprintln(w, line)
			tw := sessionTabs(w)
			sub := func(k, v string) {
				if v != "" {
					fmt.Fprintf(tw, "     %s\t%s\n", k, v)
				}
			}
			sub("message", sessionOneLine(t.GetMessage()))
			sub("summary", sessionOneLine(t.GetSummary()))
			sub("why", sessionOneLine(t.GetOutcomeReason()))
			if q := t.GetQuestion(); q != nil {
				sub("asked", sessionOneLine(q.GetText()))
			}
			for _, warn := range t.GetWarnings() {
				sub("warning", sessionOneLine(warn))
			}
			for _, d := range t.GetDrift() {
				sub("drift", fmt.Sprintf("%s: locked %s, ran %s", d.GetField(), d.GetLocked(), d.GetActual()))
			}
			sub("checkpoint", t.GetCheckpointId())
			if err := tw.Flush(); err != nil {
				return err
			}
		}
	}

	if cps := s.GetCheckpoints(); len(cps) > 0 {
		fmt.Fprintln(w, "\ncheckpoints")
		tw := sessionTabs(w)
		fmt.Fprintln(tw, "  ID\tREASON\tTURN\tSIZE\tTAKEN")
		for _, c := range cps {
			turn := "-"
			if c.GetTurn() > 0 {
				turn = fmt.Sprint(c.GetTurn())
			}
			reason, size := c.GetReason(), sessionSizeLabel(c.GetSizeBytes())
			if c.GetDamaged() != "" {
				reason, size = "DAMAGED", "-"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", c.GetId(), reason, turn, size, sessionAgo(c.GetCreatedAt(), now))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, c := range cps {
			if c.GetDamaged() != "" {
				fmt.Fprintf(w, "  damaged (%s): %s\n", c.GetId(), sessionOneLine(c.GetDamaged()))
			}
			for _, warn := range c.GetWarnings() {
				fmt.Fprintf(w, "  warning (%s): %s\n", c.GetId(), sessionOneLine(warn))
			}
		}
	}

	if trs := s.GetTransitions(); len(trs) > 0 {
		fmt.Fprintln(w, "\nhistory")
		tw := sessionTabs(w)
		for _, tr := range trs {
			fmt.Fprintf(tw, "  %s\t%s → %s\t%s\n", sessionClock(tr.GetAt(), now), sessionStateLabel(tr.GetFrom()), sessionStateLabel(tr.GetTo()), sessionOneLine(tr.GetReason()))
		}
		return tw.Flush()
	}
	return nil
}

func sessionBudgetLabel(b *sessionv1.Budget) string {
	var parts []string
	if b.GetMaxCostUsd() > 0 {
		parts = append(parts, sessionCost(b.GetMaxCostUsd()))
	}
	if b.GetMaxTokens() > 0 {
		parts = append(parts, sessionTokens(b.GetMaxTokens())+" tokens")
	}
	if b.GetMaxMinutes() > 0 {
		parts = append(parts, sessionMinutesLabel(b.GetMaxMinutes()))
	}
	return strings.Join(parts, ", ")
}

// sessionFormatArtifacts is `session artifacts`.
func sessionFormatArtifacts(w io.Writer, arts []*sessionv1.Artifact) error {
	if len(arts) == 0 {
		_, err := fmt.Fprintln(w, "no artifacts: the agent hands files back with hangar-agent artifact PATH")
		return err
	}
	tw := sessionTabs(w)
	fmt.Fprintln(tw, "PATH\tTURN\tSIZE\tTYPE\tSHA256")
	for _, a := range arts {
		sum := a.GetSha256()
		if len(sum) > 12 {
			sum = sum[:12]
		}
		typ := a.GetContentType()
		if typ == "" {
			typ = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", a.GetPath(), a.GetTurn(), sessionSizeLabel(a.GetSizeBytes()), typ, sum)
	}
	return tw.Flush()
}

// sessionFormatApprovals is `session approvals`.
func sessionFormatApprovals(w io.Writer, approvals []*sessionv1.Approval, now time.Time) error {
	if len(approvals) == 0 {
		_, err := fmt.Fprintln(w, "no tool calls wait for approval")
		return err
	}
	tw := sessionTabs(w)
	fmt.Fprintln(tw, "ID\tTURN\tTOOL\tSTATE\tASKED\tINPUT")
	for _, a := range approvals {
		in := sessionOneLine(a.GetInputJson())
		if r := []rune(in); len(r) > 80 {
			in = string(r[:79]) + "…"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", a.GetId(), a.GetTurn(), a.GetToolName(), sessionApprovalStateLabel(a.GetState()), sessionAgo(a.GetRequestedAt(), now), in)
	}
	return tw.Flush()
}
