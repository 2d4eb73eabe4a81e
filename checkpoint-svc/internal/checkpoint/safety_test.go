package checkpoint_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/checkpoint"
	"github.com/hangar-dev/hangar/platform/blob"
	"github.com/hangar-dev/hangar/platform/fault"
)

func reason(err error) string {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return fe.Reason
	}
	return ""
}

func objectFiles(t *testing.T, s blob.Store) []blob.Info {
	list, err := s.List(context.Background(), "objects/")
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// rewrite replaces a stored blob with f of its bytes.
func rewrite(t *testing.T, s blob.Store, key string, f func([]byte) []byte) {
	t.Helper()
	rc, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if err := s.Put(context.Background(), key, bytes.NewReader(f(b))); err != nil {
		t.Fatal(err)
	}
}

func TestTamperTruncateWrongKey(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	work, home := w.sandbox()
	conv := messUp(t, work, home)
	cp := w.capture("s1", work, conv...).Checkpoint
	objs := objectFiles(t, w.store)
	if len(objs) < 4 {
		t.Fatalf("only %d objects", len(objs))
	}
	// Objects only the patch part holds are not read by a restore (the
	// patch is for GetCheckpointPatch); Verify still catches them.
	patchOnly := map[string]bool{}
	for _, p := range cp.GetParts() {
		if p.GetKind() == checkpointv1.PartKind_PART_KIND_PATCH {
			for _, o := range p.GetObjects() {
				patchOnly[o] = true
			}
		}
	}
	for _, p := range cp.GetParts() {
		if p.GetKind() != checkpointv1.PartKind_PART_KIND_PATCH {
			for _, o := range p.GetObjects() {
				delete(patchOnly, o)
			}
		}
	}
	for i, o := range objs {
		for _, mode := range []string{"flip", "truncate"} {
			orig, _ := w.store.Get(context.Background(), o.Key)
			saved, _ := io.ReadAll(orig)
			orig.Close()
			rewrite(t, w.store, o.Key, func(b []byte) []byte {
				if mode == "flip" {
					b = bytes.Clone(b)
					b[len(b)/2] ^= 1
					return b
				}
				return b[:len(b)-5]
			})
			if !patchOnly[path.Base(o.Key)] {
				work2, _ := w.sandbox()
				head := git(t, work2, "rev-parse", "HEAD")
				_, err := w.restore(cp.GetId(), work2, "")
				if reason(err) != checkpoint.ReasonTampered {
					t.Fatalf("object %d %s: err = %v", i, mode, err)
				}
				if git(t, work2, "rev-parse", "HEAD") != head || git(t, work2, "status", "--porcelain") != "" {
					t.Fatalf("object %d %s: work tree touched by a failed restore", i, mode)
				}
			}
			if _, err := w.eng.Verify(context.Background(), cp.GetId()); reason(err) != checkpoint.ReasonTampered {
				t.Fatalf("verify after %s: %v", mode, err)
			}
			w.store.Put(context.Background(), o.Key, bytes.NewReader(saved))
		}
	}
	// The manifest itself.
	list, _ := w.store.List(context.Background(), "checkpoints/")
	rewrite(t, w.store, list[0].Key, func(b []byte) []byte { b = bytes.Clone(b); b[len(b)-3] ^= 1; return b })
	if _, err := w.eng.Get(context.Background(), cp.GetId()); reason(err) != checkpoint.ReasonTampered {
		t.Fatalf("tampered manifest: %v", err)
	}
	// A missing object.
	w2 := newWorld(t)
	work, _ = w2.sandbox()
	write(t, work, "x.txt", "x\n", 0o644)
	cp = w2.capture("s1", work).Checkpoint
	for _, p := range cp.GetParts() {
		if p.GetKind() == checkpointv1.PartKind_PART_KIND_UNTRACKED {
			w2.store.Delete(context.Background(), "objects/"+p.GetObjects()[0][:2]+"/"+p.GetObjects()[0])
		}
	}
	work2, _ := w2.sandbox()
	if _, err := w2.restore(cp.GetId(), work2, ""); reason(err) != checkpoint.ReasonTampered {
		t.Fatalf("missing object: %v", err)
	}
	// A wrong key.
	w3 := newWorld(t)
	work, _ = w3.sandbox()
	cp = w3.capture("s1", work).Checkpoint
	w3.opts.Keys = newKeys(t)
	w3.reopen()
	if _, err := w3.eng.Get(context.Background(), cp.GetId()); reason(err) != checkpoint.ReasonUnknownKey {
		t.Fatalf("wrong key: %v", err)
	}
}

// evilExec replaces what a capture command writes to stdout.
type evilExec struct {
	checkpoint.Executor
	match   string
	payload []byte
}

func (e *evilExec) Exec(ctx context.Context, id string, tok uint64, argv []string, env map[string]string, cwd string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	key := strings.Join(argv, " ")
	if argv[0] == sandboxtool.Binary && stdin != nil {
		// The tool's request line says what it is asked for.
		br := bufio.NewReader(stdin)
		line, _ := br.ReadBytes('\n')
		key += " " + string(line)
		stdin = io.MultiReader(bytes.NewReader(line), br)
	}
	if strings.Contains(key, e.match) {
		_, err := stdout.Write(e.payload)
		return 0, err
	}
	return e.Executor.Exec(ctx, id, tok, argv, env, cwd, stdin, stdout, stderr)
}

func tarOf(t *testing.T, entries ...*tar.Header) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range entries {
		if h.Typeflag == tar.TypeReg {
			h.Size = 4
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte("evil"))
		}
	}
	tw.Close()
	return b.Bytes()
}

func TestPathEscapesRefused(t *testing.T) {
	t.Parallel()
	reg := func(n string) *tar.Header { return &tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644} }
	link := func(n, to string) *tar.Header {
		return &tar.Header{Name: n, Typeflag: tar.TypeSymlink, Linkname: to, Mode: 0o777}
	}
	outside := t.TempDir()
	cases := []struct {
		name, match string
		payload     []byte
		phase2      bool
	}{
		{"dotdot", "hangar-sandbox untracked", tarOf(t, reg("../escape.txt")), false},
		{"nested dotdot", "hangar-sandbox untracked", tarOf(t, reg("a/../../escape.txt")), false},
		{"absolute", "hangar-sandbox untracked", tarOf(t, reg(filepath.Join(outside, "escape.txt"))), false},
		{"into .git", "hangar-sandbox untracked", tarOf(t, reg(".git/hooks/post-checkout")), false},
		{"symlink then write through", "hangar-sandbox untracked", tarOf(t, link("out", outside), reg("out/escape.txt")), false},
		{"hard link out", "hangar-sandbox untracked", tarOf(t, &tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}), false},
		{"device", "hangar-sandbox untracked", tarOf(t, &tar.Header{Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}), false},
		{"through a tracked symlink", "hangar-sandbox untracked", tarOf(t, reg("link-a/escape.txt")), true},
		{"diff dotdot", `"paths":["README.md"]`, []byte("diff --git a/../escape.txt b/../escape.txt\nnew file mode 100644\n"), false},
		{"diff absolute quoted", `"paths":["README.md"]`, []byte("diff --git \"a//etc/x\" \"b//etc/x\"\n"), false},
		{"diff rename", `"paths":["README.md"]`, []byte("diff --git a/x b/y\nrename from x\nrename to ../y\n"), false},
		{"conversation outside its roots", "hangar-sandbox archive", tarOf(t, reg(filepath.Join(outside, "escape.txt"))), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			work, home := w.sandbox()
			write(t, work, "ok.txt", "ok\n", 0o644)
			write(t, work, "README.md", "changed\n", 0o644) // a tracked change: the work tree diff runs
			conv := filepath.Join(home, "conv")
			write(t, conv, "c.jsonl", "{}\n", 0o644)
			real := w.exec
			w.opts.Exec = &evilExec{Executor: real, match: c.match, payload: c.payload}
			w.reopen()
			cp := w.capture("s1", work, conv).Checkpoint
			w.opts.Exec = real
			w.reopen()
			work2, _ := w.sandbox()
			_, err := w.restore(cp.GetId(), work2, "")
			if err == nil {
				t.Fatal("restore succeeded")
			}
			var fe *fault.Error
			if !errors.As(err, &fe) || fe.Kind != fault.KindFailedPrecondition || !strings.Contains(err.Error(), "unsafe path") {
				t.Fatalf("err = %v", err)
			}
			if !c.phase2 && git(t, work2, "status", "--porcelain") != "" {
				t.Fatal("work tree touched")
			}
			if _, err := os.Lstat(filepath.Join(outside, "escape.txt")); err == nil {
				t.Fatal("a file escaped")
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(work2), "escape.txt")); err == nil {
				t.Fatal("a file escaped")
			}
		})
	}
}

func TestLimitsWarn(t *testing.T) {
	t.Parallel()
	w := newWorld(t, func(o *checkpoint.Options) { o.MaxUntrackedBytes = 64 << 10 })
	work, _ := w.sandbox()
	write(t, work, "src/a.go", "package a // edited\n", 0o644)
	big := strings.Repeat("0123456789abcdef", 16<<10) // 256 KiB untracked
	write(t, work, "big.txt", big, 0o644)
	res := w.capture("s1", work)
	if len(res.Warnings) != 1 || res.Warnings[0].GetCode() != "UNTRACKED_TOO_LARGE" || len(res.Checkpoint.GetWarnings()) != 1 {
		t.Fatalf("warnings: %v", res.Warnings)
	}
	for _, p := range res.Checkpoint.GetParts() {
		if p.GetKind() == checkpointv1.PartKind_PART_KIND_UNTRACKED && (!p.GetSkipped() || len(p.GetObjects()) != 0) {
			t.Fatalf("untracked part kept: %v", p)
		}
	}
	// The stored manifest carries the warning and a restore of the rest
	// is verified against the tracked files.
	got, err := w.eng.Get(context.Background(), res.Checkpoint.GetId())
	if err != nil || len(got.GetWarnings()) != 1 {
		t.Fatalf("get: %v %v", got.GetWarnings(), err)
	}
	work2, _ := w.sandbox()
	if _, err := w.restore(res.Checkpoint.GetId(), work2, ""); err != nil {
		t.Fatalf("restore without untracked: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(work2, "src/a.go")); string(b) != "package a // edited\n" {
		t.Fatal("tracked edit not restored")
	}

	w = newWorld(t, func(o *checkpoint.Options) { o.MaxPartBytes = 64 << 10 })
	work, _ = w.sandbox()
	write(t, work, "src/a.go", big, 0o644)
	res = w.capture("s1", work)
	if len(res.Warnings) == 0 || res.Warnings[0].GetCode() != "PART_TOO_LARGE" || res.Warnings[0].GetPart() != checkpointv1.PartKind_PART_KIND_DIFF {
		t.Fatalf("warnings: %v", res.Warnings)
	}
	work2, _ = w.sandbox()
	if _, err := w.restore(res.Checkpoint.GetId(), work2, ""); reason(err) != checkpoint.ReasonIncomplete {
		t.Fatalf("restore of an incomplete checkpoint: %v", err)
	}
}

// failingStore fails object writes after a budget of bytes.
type failingStore struct {
	blob.Store
	budget atomic.Int64
}

func (f *failingStore) Put(ctx context.Context, key string, r io.Reader) error {
	if !strings.HasPrefix(key, "objects/") {
		return f.Store.Put(ctx, key, r)
	}
	return f.Store.Put(ctx, key, &budgetReader{r: r, f: f})
}

type budgetReader struct {
	r io.Reader
	f *failingStore
}

func (b *budgetReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if b.f.budget.Add(-int64(n)) < 0 {
		return 0, errors.New("disk on fire")
	}
	return n, err
}

func TestCrashMidCaptureKeepsPrevious(t *testing.T) {
	t.Parallel()
	for _, budget := range []int64{0, 1000, 300 << 10} {
		w := newWorld(t)
		work, _ := w.sandbox()
		write(t, work, "one.txt", "one\n", 0o644)
		first := w.capture("s1", work).Checkpoint
		fs := &failingStore{Store: w.store}
		fs.budget.Store(budget)
		w.opts.Store = fs
		w.reopen()
		noise := make([]byte, 2<<20)
		for i := range noise {
			noise[i] = byte(i*7 + i/251)
		}
		write(t, work, "two.bin", string(noise), 0o644)
		_, err := w.eng.Capture(context.Background(), &checkpointv1.CaptureCheckpointRequest{
			SandboxId: "sb", Session: "s1", WorkDir: work, BaseCommit: w.base})
		if err == nil {
			t.Fatalf("budget %d: capture succeeded", budget)
		}
		w.opts.Store = w.store
		w.reopen()
		list, _, err := w.eng.List(context.Background(), "s1", 0, 0)
		if err != nil || len(list) != 1 || list[0].GetId() != first.GetId() {
			t.Fatalf("budget %d: list after crash: %v %v", budget, list, err)
		}
		work2, _ := w.sandbox()
		if _, err := w.restore(first.GetId(), work2, ""); err != nil {
			t.Fatalf("budget %d: previous checkpoint: %v", budget, err)
		}
		// Orphans of the failed capture go with the next collection.
		if _, err := w.eng.Archive(context.Background(), "s1"); err != nil {
			t.Fatal(err)
		}
		if n := len(objectFiles(t, w.store)); n != 0 {
			t.Fatalf("budget %d: %d objects left after archive", budget, n)
		}
	}
}
