package checkpoint_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The randomized fidelity suite: a seeded generator of repository states.
// A failing case prints its seed; replay it with
//
//	go test -run TestRandomFidelity -checkpoint.seed=N -checkpoint.cases=1
//
// (or HANGAR_FIDELITY_SEED / HANGAR_FIDELITY_CASES).
var (
	fidelitySeed  = flag.Uint64("checkpoint.seed", 0, "first seed of the randomized fidelity suite (0: from the clock)")
	fidelityCases = flag.Int("checkpoint.cases", 0, "cases of the randomized fidelity suite (0: 200, 20 with -short)")
)

func fidelityParams(t *testing.T) (seed uint64, cases int) {
	seed, cases = *fidelitySeed, *fidelityCases
	if v := os.Getenv("HANGAR_FIDELITY_SEED"); seed == 0 && v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	if v := os.Getenv("HANGAR_FIDELITY_CASES"); cases == 0 && v != "" {
		cases, _ = strconv.Atoi(v)
	}
	if seed == 0 {
		seed = uint64(time.Now().UnixNano()) % 1_000_000_000
	}
	if cases == 0 {
		cases = 200
		if testing.Short() {
			cases = 20
		}
	}
	return seed, cases
}

var oddNames = []string{"with space.txt", "tab\tname", "new\nline", "bad\xffbyte", "-dash", "ünï.txt", `back\slash`, "quote\"d", "star*", "#hash", "a b/c d.txt"}

// gen builds a random repository state in work with its own rand.
type gen struct {
	t    *testing.T
	r    *rand.Rand
	work string
	n    int
}

func (g *gen) name() string {
	g.n++
	dirs := []string{"", "src/", "src/deep/", "docs/", "new/", "new/tree/"}
	if g.r.IntN(6) == 0 {
		return dirs[g.r.IntN(len(dirs))] + oddNames[g.r.IntN(len(oddNames))] + strconv.Itoa(g.n)
	}
	return fmt.Sprintf("%sf%d.txt", dirs[g.r.IntN(len(dirs))], g.n)
}

func (g *gen) content() string {
	if g.r.IntN(4) == 0 {
		b := make([]byte, 1+g.r.IntN(3000))
		for i := range b {
			b[i] = byte(g.r.IntN(256))
		}
		b[0] = 0 // binary
		return string(b)
	}
	var sb strings.Builder
	for range 1 + g.r.IntN(20) {
		fmt.Fprintf(&sb, "line %d\n", g.r.IntN(1000))
	}
	return sb.String()
}

func (g *gen) mode() os.FileMode {
	if g.r.IntN(4) == 0 {
		return 0o755
	}
	return 0o644
}

// tracked lists the regular files git tracks now.
func (g *gen) tracked() []string {
	out := git(g.t, g.work, "ls-files", "-z", "-s")
	var files []string
	for _, e := range strings.Split(out, "\x00") {
		meta, name, ok := strings.Cut(e, "\t")
		if ok && strings.HasPrefix(meta, "100") && name != ".gitignore" {
			files = append(files, name)
		}
	}
	return files
}

func (g *gen) pick(files []string) string { return files[g.r.IntN(len(files))] }

func (g *gen) symlink(name string) {
	targets := []string{"README.md", "../README.md", "nowhere", "/etc/hostname", "src"}
	p := filepath.Join(g.work, name)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.Symlink(targets[g.r.IntN(len(targets))], p); err != nil {
		g.t.Fatal(err)
	}
}

func (g *gen) build() {
	t, r := g.t, g.r
	// Commits on the branch.
	for range r.IntN(3) {
		for range 1 + r.IntN(4) {
			write(t, g.work, g.name(), g.content(), g.mode())
		}
		if r.IntN(3) == 0 {
			g.symlink(g.name())
		}
		if files := g.tracked(); r.IntN(3) == 0 && len(files) > 1 {
			os.Remove(filepath.Join(g.work, g.pick(files)))
		}
		git(t, g.work, "add", "-A")
		git(t, g.work, "commit", "-q", "--allow-empty", "-m", "c")
	}
	if r.IntN(7) == 0 {
		git(t, g.work, "checkout", "-q", "--detach")
	}
	files := g.tracked()
	// Staged and unstaged edits, mode-only changes, deletions, renames.
	for range r.IntN(6) {
		if len(files) == 0 {
			break
		}
		f := g.pick(files)
		p := filepath.Join(g.work, f)
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		switch r.IntN(7) {
		case 0, 1:
			write(t, g.work, f, g.content(), 0o644)
			if r.IntN(2) == 0 {
				git(t, g.work, "add", "--", f)
				if r.IntN(2) == 0 {
					write(t, g.work, f, g.content(), 0o644) // changed again after staging
				}
			}
		case 2:
			fi, _ := os.Stat(p)
			os.Chmod(p, fi.Mode()^0o111)
			if r.IntN(2) == 0 {
				git(t, g.work, "add", "--", f)
			}
		case 3:
			if r.IntN(2) == 0 {
				git(t, g.work, "rm", "-q", "-f", "--ignore-unmatch", "--", f)
			} else {
				os.Remove(p)
			}
		case 4:
			to := g.name()
			os.MkdirAll(filepath.Dir(filepath.Join(g.work, to)), 0o755)
			git(t, g.work, "mv", "-k", "--", f, to)
		case 5:
			write(t, g.work, g.name(), g.content(), g.mode())
			git(t, g.work, "add", "-A")
		case 6:
			// Staged deletion of a file that stays: untracked now.
			git(t, g.work, "rm", "-q", "-f", "--cached", "--ignore-unmatch", "--", f)
			if r.IntN(2) == 0 {
				write(t, g.work, f, g.content(), 0o644)
			}
		}
	}
	// Untracked: files, trees, empty directories, symlinks.
	for range r.IntN(5) {
		switch r.IntN(4) {
		case 0, 1:
			name := g.name()
			write(t, g.work, name, g.content(), []os.FileMode{0o644, 0o600, 0o755}[r.IntN(3)])
			if r.IntN(4) == 0 {
				git(t, g.work, "add", "-N", "--", name) // intent to add
			}
		case 2:
			os.MkdirAll(filepath.Join(g.work, fmt.Sprintf("untracked%d/empty", g.n)), 0o750)
			write(t, g.work, fmt.Sprintf("untracked%d/x/y.txt", g.n), g.content(), 0o644)
		case 3:
			g.symlink(g.name())
		}
	}
	// Ignored: must not come back.
	if r.IntN(2) == 0 {
		write(t, g.work, fmt.Sprintf("debug%d.log", g.n), "noise\n", 0o644)
		write(t, g.work, "node_modules/pkg/index.js", "x\n", 0o644)
	}
}

func TestRandomFidelity(t *testing.T) {
	seed, cases := fidelityParams(t)
	t.Logf("randomized fidelity: %d cases from seed %d", cases, seed)
	w := newWorld(t)
	var mu sync.Mutex // newWorld's helpers share w.t; sandboxes are made per case
	for i := range cases {
		s := seed + uint64(i)
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			t.Parallel()
			mu.Lock()
			cw := *w
			cw.t = t
			mu.Unlock()
			work, _ := cw.sandbox()
			g := &gen{t: t, r: rand.New(rand.NewPCG(s, s^0x5eed)), work: work}
			g.build()
			session := fmt.Sprintf("r%d", s)
			res := cw.capture(session, work)
			work2, _ := cw.sandbox()
			tree, err := cw.restore(res.Checkpoint.GetId(), work2, "")
			if err != nil {
				t.Fatalf("seed %d: restore: %v (replay: -checkpoint.seed=%d -checkpoint.cases=1)", s, err, s)
			}
			if tree != res.Checkpoint.GetTreeHash() {
				t.Fatalf("seed %d: tree %s, want %s", s, tree, res.Checkpoint.GetTreeHash())
			}
			diffSnap(t, snapshot(t, work, ignored), snapshot(t, work2, nil))
			for _, args := range [][]string{
				{"rev-parse", "HEAD"}, {"ls-files", "-s", "-z"}, {"status", "--porcelain=v2", "-z"},
				{"for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/"},
			} {
				if a, b := git(t, work, args...), git(t, work2, args...); a != b {
					t.Errorf("seed %d: git %v differs:\n%q\nrestored:\n%q", s, args, a, b)
				}
			}
			if t.Failed() {
				t.Logf("replay: go test -run TestRandomFidelity -checkpoint.seed=%d -checkpoint.cases=1", s)
			}
		})
	}
}
