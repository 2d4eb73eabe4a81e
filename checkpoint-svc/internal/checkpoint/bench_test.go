package checkpoint_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkCheckpoint measures, on generated repositories, a full capture,
// a tree-hash-verified restore, and an incremental capture after a
// one-line edit in three files, reporting the bytes each stores.
func BenchmarkCheckpoint(b *testing.B) {
	// The repositories: 1k, 5k and 20k files of 10 to 400 MB, as
	// lines of hex text (like source code: short lines, so a diff's context
	// is small; git compresses it about as well).
	for _, size := range []struct{ files, bytes int }{{1000, 10 << 10}, {5000, 10 << 10}, {20000, 20 << 10}} {
		files := size.files
		b.Run(fmt.Sprintf("files=%d/MB=%d", files, files*size.bytes>>20), func(b *testing.B) {
			w := newWorld(b)
			rng := rand.New(rand.NewPCG(uint64(files), 1))
			raw := make([]byte, size.bytes/2)
			for i := range files {
				for j := range raw {
					raw[j] = byte(rng.Uint32())
				}
				write(b, w.origin, fmt.Sprintf("pkg%03d/file%05d.txt", i%100, i), fmt.Sprintf("file %d\n%s", i, hexLines(raw)), 0o644)
			}
			git(b, w.origin, "add", "-A")
			// Packed, as a repository cloned from a remote is; and no
			// automatic gc left running in the background of the timings.
			git(b, w.origin, "-c", "gc.auto=0", "commit", "-q", "-m", "big")
			git(b, w.origin, "gc", "-q")
			w.base = git(b, w.origin, "rev-parse", "HEAD")
			work, _ := w.sandbox()
			for i := range 20 {
				write(b, work, fmt.Sprintf("pkg000/new%02d.txt", i), fmt.Sprintf("%01000d\n", i), 0o644)
			}
			git(b, work, "add", "-A")
			git(b, work, "-c", "gc.auto=0", "commit", "-q", "-m", "work")
			write(b, work, "pkg001/file00001.txt", "edited\n", 0o644)
			write(b, work, "untracked.txt", "u\n", 0o644)
			// The clones write hundreds of MB: flush them outside the
			// timed parts, or their writeback is what gets measured.
			syscall.Sync()
			b.ResetTimer()
			var incrCPU, full, incr, restore, settle, restoreCPU float64
			var fullBytes, incrBytes int64
			for n := 0; n < b.N; n++ {
				session := fmt.Sprintf("bench%d", n)
				t0 := nowMono()
				first := w.capture(session, work).Checkpoint
				full += sinceMono(t0)
				fullBytes = first.GetStoredBytes()
				for k := range 3 {
					p := filepath.Join(work, fmt.Sprintf("pkg%03d/file%05d.txt", 10+k, 10+k))
					f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
					fmt.Fprintf(f, "one more line %d\n", n)
					f.Close()
				}
				t0 = nowMono()
				cpu0 := childCPU()
				second := w.capture(session, work).Checkpoint
				incr += sinceMono(t0)
				incrCPU += childCPU() - cpu0
				incrBytes = second.GetStoredBytes()
				b.StopTimer()
				work2, _ := w.sandbox()
				settle += settleClone(b, work2)
				syscall.Sync()
				b.StartTimer()
				t0 = nowMono()
				cpu0 = childCPU()
				if _, err := w.restore(second.GetId(), work2, ""); err != nil {
					b.Fatal(err)
				}
				restore += sinceMono(t0)
				restoreCPU += childCPU() - cpu0
				b.StopTimer()
				w.eng.Archive(context.Background(), session)
				syscall.Sync()
				b.StartTimer()
			}
			b.ReportMetric(full/float64(b.N), "full-capture-ms")
			b.ReportMetric(float64(fullBytes), "full-stored-B")
			b.ReportMetric(incr/float64(b.N), "incr-capture-ms")
			b.ReportMetric(float64(incrBytes), "incr-stored-B")
			// The CPU the small-edit capture's processes used.
			b.ReportMetric(incrCPU/float64(b.N), "incr-capture-cpu-ms")
			b.ReportMetric(restore/float64(b.N), "restore-ms")
			// The CPU the restore's processes (hangar-sandbox and its
			// git commands) used: what a loaded machine's wait for a
			// core does not inflate.
			b.ReportMetric(restoreCPU/float64(b.N), "restore-cpu-ms")
			// Untimed: what the driver's clone spends settling the index.
			b.ReportMetric(settle/float64(b.N), "clone-settle-ms")
		})
	}
}

// settleClone does what the local driver does after a large clone
// (sandbox-svc's settleIndex): once the second the index was written in
// has passed, one refresh, so the sandbox has no racily clean entries.
func settleClone(b *testing.B, work string) float64 {
	st, err := os.Stat(filepath.Join(work, ".git", "index"))
	if err != nil {
		b.Fatal(err)
	}
	next := st.ModTime().Truncate(time.Second).Add(time.Second)
	for time.Now().Before(next) {
		<-time.After(time.Until(next))
	}
	t0 := nowMono()
	git(b, work, "update-index", "-q", "--refresh")
	return sinceMono(t0)
}

// childCPU is the user and system CPU, in ms, of the process's children
// that ended (each with its own children's).
func childCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e6
}

// hexLines is raw as lines of 64 hex digits.
func hexLines(raw []byte) string {
	h := hex.EncodeToString(raw)
	var b strings.Builder
	for len(h) > 0 {
		n := min(64, len(h))
		b.WriteString(h[:n])
		b.WriteByte('\n')
		h = h[n:]
	}
	return b.String()
}
