package command

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// job run -w prints each change once: the state, each attempt as it
// starts, ends its turn and is checked.
func TestJobProgress(t *testing.T) {
	var b bytes.Buffer
	p := jobProgress(Streams{Out: &b})
	j := &sessionv1.Job{Id: "job-1", State: sessionv1.JobState_JOB_STATE_RUNNING}
	p(j)
	p(j)
	j.Attempts = []*sessionv1.Attempt{{Session: "s-1", Branch: "hangar/session/s-fork-1"}, {Session: "s-2", Branch: "hangar/session/s-fork-2"}}
	p(j)
	j.Attempts[0].Outcome = sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED
	p(j)
	j.Attempts[0].Score = proto.Float64(0.9)
	j.Attempts[1].Outcome, j.Attempts[1].CheckExitCode = sessionv1.TurnOutcome_TURN_OUTCOME_FAILED, 1
	j.State = sessionv1.JobState_JOB_STATE_DELIVERED
	p(j)
	got := regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d  `).ReplaceAllString(b.String(), "")
	want := strings.Join([]string{
		"job job-1 running",
		"attempt s-1 running on branch hangar/session/s-fork-1",
		"attempt s-2 running on branch hangar/session/s-fork-2",
		"attempt s-1 turn completed",
		"job job-1 delivered",
		"attempt s-1 checked: exit 0, score 0.9",
		"attempt s-2 checked: exit 1, score -",
	}, "\n") + "\n"
	if got != want {
		t.Errorf("progress:\n%s\nwant:\n%s", got, want)
	}
}
