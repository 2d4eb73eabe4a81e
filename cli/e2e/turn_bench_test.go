package e2e_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// BenchmarkTurnLatency (issue 16): what a turn costs through hangar against
// the same turn of the real Claude Code alone, side by side in one run, on
// repositories of 1k, 5k and 20k files (HANGAR_BENCH_FILES overrides, e.g.
// "5000"), against the scripted upstream. Per size it reports medians (and
// the slowest, p95 for small samples) of:
//
//   - bare: the CLI run by hand in a clone (no hangar);
//   - open: a turn on an open session;
//   - cached: a turn on a suspended session whose sandbox was kept (the
//     sandbox cache; the resume verifies it against the checkpoint);
//   - pooled: the same with the cache off and a warm pool of one;
//   - cold: the cache off and no pool (clone, restore, verify);
//
// and each one's difference from bare. The cache-off cases run on a second
// hangar in the same process (HANGAR_SANDBOX_CACHE=0). Samples per case:
// HANGAR_BENCH_SAMPLES (5). Run it with -benchtime=1x.
func BenchmarkTurnLatency(b *testing.B) {
	sizes := benchFiles(b, 1000, 5000, 20000)
	samples := 5
	if v := os.Getenv("HANGAR_BENCH_SAMPLES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("HANGAR_BENCH_SAMPLES: %q", v)
		}
		samples = n
	}
	cached := sessionMoreStart(b, nil, true)
	script := sessionMoreScript()
	uncached := &sessionMoreStack{stack: startStack(b, stackOptions{script: &script,
		vars: map[string]string{"HANGAR_SANDBOX_CACHE": "0"}})}
	claude := filepath.Join(os.Getenv("HANGAR_HARNESS_DIR"), harnessClaude)
	modelURL := cached.ctl.vars["HANGAR_ANTHROPIC_URL"]
	ctx := context.Background()
	const message = "Say OK."

	for _, files := range sizes {
		b.Run(fmt.Sprintf("files=%d", files), func(b *testing.B) {
			repo := gitRepo(b, sessionMoreFiles(files, 8<<10))
			env := fmt.Sprintf("bench-%d", files)
			cached.applyEnvironment(b, env, repo, 0, sandboxv1.Egress_EGRESS_FULL)
			uncached.applyEnvironment(b, env, repo, 0, sandboxv1.Egress_EGRESS_FULL)
			uncached.applyEnvironment(b, env+"-pool", repo, 1, sandboxv1.Egress_EGRESS_FULL)
			timings := map[string][]float64{}
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

			// bare: Claude Code alone in a clone of the repository.
			clone := filepath.Join(b.TempDir(), "work")
			if out, err := exec.Command("git", "clone", "-q", repo, clone).CombinedOutput(); err != nil {
				b.Fatalf("clone: %v %s", err, out)
			}
			home := b.TempDir()
			for range samples {
				took, cpu := bareClaude(b, claude, clone, home, modelURL, message)
				timings["bare"] = append(timings["bare"], ms(took))
				timings["bare-cpu"] = append(timings["bare-cpu"], ms(cpu))
			}

			// turn runs one timed turn on a session and checks it completed.
			turn := func(s *sessionMoreStack, name, kind string) {
				b.Helper()
				t0 := time.Now()
				got := s.send(b, name, sessionv1.Harness_HARNESS_CLAUDE, message)
				timings[kind] = append(timings[kind], ms(time.Since(t0)))
				if got.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
					b.Fatalf("%s turn: %v (%s)", kind, got.GetOutcome(), got.GetOutcomeReason())
				}
			}
			suspend := func(s *sessionMoreStack, name string) {
				b.Helper()
				if _, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: name}); err != nil {
					b.Fatal(err)
				}
			}
			start := func(s *sessionMoreStack, name, env string) {
				b.Helper()
				if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
					Name: name, Environment: env, Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: message,
				}); err != nil {
					b.Fatal(err)
				}
				s.waitTurn(b, name, 1)
				// Some work for the checkpoint to hold.
				s.mustExec(b, s.get(b, name).GetSandboxId(), `printf 'x\n' >> d00/f0000.txt && printf 'new\n' > new.txt`)
			}

			open := fmt.Sprintf("open-%d", files)
			start(cached, open, env)
			for range samples {
				turn(cached, open, "open")
			}
			for range samples {
				suspend(cached, open)
				turn(cached, open, "cached")
			}
			cold := fmt.Sprintf("cold-%d", files)
			start(uncached, cold, env)
			for range samples {
				suspend(uncached, cold)
				turn(uncached, cold, "cold")
			}
			pooled := fmt.Sprintf("pooled-%d", files)
			start(uncached, pooled, env+"-pool")
			for range samples {
				suspend(uncached, pooled)
				sessionMoreEventually(b, 5*time.Minute, "the warm pool to be ready", func() bool {
					p, err := uncached.sandboxes.GetPool(ctx, &sandboxv1.GetPoolRequest{Environment: env + "-pool"})
					return err == nil && p.GetPool().GetReady() >= 1 && p.GetPool().GetCreating() == 0
				})
				turn(uncached, pooled, "pooled")
			}

			median := func(v []float64) float64 {
				s := slices.Clone(v)
				slices.Sort(s)
				return s[len(s)/2]
			}
			bare := median(timings["bare"])
			b.ReportMetric(bare, "bare-ms")
			b.ReportMetric(median(timings["bare-cpu"]), "bare-cpu-ms")
			for _, k := range []string{"open", "cached", "pooled", "cold"} {
				m := median(timings[k])
				b.ReportMetric(m, k+"-ms")
				b.ReportMetric(m-bare, k+"-minus-bare-ms")
				b.ReportMetric(slices.Max(timings[k])-bare, k+"-max-minus-bare-ms")
			}
			b.Logf("files=%d samples (ms): %v", files, timings)
		})
	}
}

func newUUID(tb testing.TB) string {
	var u [16]byte
	if _, err := rand.Read(u[:]); err != nil {
		tb.Fatal(err)
	}
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// bareClaude runs one turn of Claude Code by hand in dir (no hangar), with
// home as its HOME, against the model at modelURL, and returns how long it
// took and the CPU time (user and system) it and the children it waited
// for used; the turn must end with a result.
func bareClaude(tb testing.TB, claude, dir, home, modelURL, message string) (took, cpu time.Duration) {
	tb.Helper()
	cmd := exec.Command(claude, "-p", message, "--session-id", newUUID(tb), "--output-format", "stream-json", "--verbose")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+home, "ANTHROPIC_BASE_URL="+modelURL, "ANTHROPIC_API_KEY=upstream-key",
		"DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	err := cmd.Run()
	took = time.Since(t0)
	if ps := cmd.ProcessState; ps != nil {
		cpu = ps.UserTime() + ps.SystemTime()
	}
	switch {
	case err != nil:
		tb.Errorf("bare claude: %v\n%s", err, out.String())
	case !strings.Contains(out.String(), `"type":"result"`):
		tb.Errorf("bare claude gave no result:\n%s", out.String())
	}
	return took, cpu
}

// benchFiles is the repository sizes (files) a benchmark runs at: HANGAR_BENCH_FILES
// (a comma-separated list) or else def.
func benchFiles(b *testing.B, def ...int) []int {
	b.Helper()
	v := os.Getenv("HANGAR_BENCH_FILES")
	if v == "" {
		return def
	}
	var sizes []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("HANGAR_BENCH_FILES: %q is not a number of files", f)
		}
		sizes = append(sizes, n)
	}
	return sizes
}
