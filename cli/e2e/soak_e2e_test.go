package e2e_test

// The soak: one session suspended and resumed again and again while a
// seeded random churn changes its tree between cycles (edits, renames,
// deletes, mode changes, binaries, commits, staged changes, untracked and
// ignored files). After every resume the tree must be exactly what it was
// before the suspend. HANGAR_SOAK_CYCLES sets the cycles (default 100;
// the full run is 1,000).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// soakManifestCmd prints what a resume must keep: the branch, HEAD, the
// index, and every file git does not ignore with its type, mode and
// content hash. Ignored files are not kept by design.
const soakManifestCmd = `set -e
git symbolic-ref HEAD
git rev-parse HEAD
git ls-files -s
git ls-files -co --exclude-standard -z | xargs -0 -r sh -c 'for f; do
  if [ -L "$f" ]; then echo "L $f -> $(readlink "$f")"
  elif [ -f "$f" ]; then echo "F $f $(stat -c %a "$f") $(sha256sum < "$f" | cut -c1-16)"
  else echo "- $f"; fi
done' sh | sort`

// soakChurn is one cycle's random change of the tree, as a shell script.
func soakChurn(rng *rand.Rand, cycle int) string {
	var b strings.Builder
	b.WriteString("set -e\nmkdir -p src docs bin\n")
	for range 1 + rng.IntN(6) {
		n := rng.IntN(12)
		switch rng.IntN(11) {
		case 0, 1:
			fmt.Fprintf(&b, "printf 'cycle %d line %d\\n' >> src/f%d.txt\n", cycle, rng.IntN(1000), n)
		case 2:
			fmt.Fprintf(&b, "head -c %d /dev/urandom > bin/blob%d.bin\n", 1+rng.IntN(40000), n)
		case 3:
			fmt.Fprintf(&b, "[ -f src/f%d.txt ] && mv src/f%d.txt docs/moved%d-%d.txt || true\n", n, n, n, cycle)
		case 4:
			fmt.Fprintf(&b, "rm -f src/f%d.txt bin/blob%d.bin\n", n, n)
		case 5:
			fmt.Fprintf(&b, "[ -f src/f%d.txt ] && chmod %s src/f%d.txt || true\n", n, []string{"+x", "-x"}[rng.IntN(2)], n)
		case 6:
			fmt.Fprintf(&b, "printf 'ignored %d\\n' > build-%d.log\n", cycle, n)
		case 7:
			b.WriteString("git add -A && git commit -qm 'cycle " + strconv.Itoa(cycle) + "' || true\n")
		case 8:
			fmt.Fprintf(&b, "[ -f src/f%d.txt ] && git add src/f%d.txt || true\n", n, n)
		case 9:
			fmt.Fprintf(&b, "ln -sfn ../src/f%d.txt docs/link%d\n", n, n)
		case 10:
			fmt.Fprintf(&b, "mkdir -p deep/d%d/e && printf 'x%d' > deep/d%d/e/n.txt\n", n, cycle, n)
		}
	}
	return b.String()
}

func TestSoakSuspendResume(t *testing.T) {
	cycles := 100
	if v := os.Getenv("HANGAR_SOAK_CYCLES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("HANGAR_SOAK_CYCLES=%q: want a positive number", v)
		}
		cycles = n
	}
	// The sandbox cache off: every resume is a restore from the checkpoint,
	// which is what the soak checks.
	h := newHangarProcess(t, "HANGAR_SANDBOX_CACHE=0")
	h.start(t)
	h.applyEnvironment(t, "e2e", gitRepo(t, map[string]string{"README.md": "base\n", ".gitignore": "*.log\n"}), 0, sandboxv1.Egress_EGRESS_FULL)
	ctx := context.Background()
	if _, err := h.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "soak", Environment: "e2e"}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 1000))
	differences := 0
	want := ""
	for cycle := range cycles {
		if _, err := h.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "soak"}); err != nil {
			t.Fatalf("cycle %d: open: %v", cycle, err)
		}
		sandbox := h.get(t, "soak").GetSandboxId()
		if cycle > 0 {
			if got := h.mustExec(t, sandbox, soakManifestCmd); got != want {
				differences++
				t.Errorf("cycle %d: the resumed tree differs from the suspended one\nbefore:\n%s\nafter:\n%s", cycle, want, got)
			}
		}
		h.mustExec(t, sandbox, soakChurn(rng, cycle))
		want = h.mustExec(t, sandbox, soakManifestCmd)
		if _, err := h.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: "soak"}); err != nil {
			t.Fatalf("cycle %d: suspend: %v", cycle, err)
		}
		if (cycle+1)%100 == 0 {
			t.Logf("%d cycles: %d manifest differences so far", cycle+1, differences)
		}
	}
	if _, err := h.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "soak"}); err != nil {
		t.Fatalf("last open: %v", err)
	}
	if got := h.mustExec(t, h.get(t, "soak").GetSandboxId(), soakManifestCmd); got != want {
		differences++
		t.Errorf("last cycle: the resumed tree differs from the suspended one\nbefore:\n%s\nafter:\n%s", want, got)
	}
	t.Logf("%d suspend/resume cycles with a random churn: %d manifest differences", cycles, differences)
}
