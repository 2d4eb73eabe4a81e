package blob_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hangar-dev/hangar/platform/blob"
)

func newDir(t *testing.T) *blob.Dir {
	t.Helper()
	d, err := blob.NewDir(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatalf("NewDir: %v", err)
	}
	return d
}

func put(t *testing.T, d *blob.Dir, key, content string) {
	t.Helper()
	if err := d.Put(t.Context(), key, strings.NewReader(content)); err != nil {
		t.Fatalf("Put %q: %v", key, err)
	}
}

func read(t *testing.T, d *blob.Dir, key string) string {
	t.Helper()
	rc, err := d.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("Get %q: %v", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %q: %v", key, err)
	}
	return string(b)
}

// leftovers returns the temporary files under root.
func leftovers(t *testing.T, root string) []string {
	t.Helper()
	var tmp []string
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(e.Name(), ".blob-tmp-") {
			tmp = append(tmp, p)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk: %v", err)
	}
	return tmp
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	d := newDir(t)
	ctx := t.Context()
	put(t, d, "sessions/s-1/snap-1.tar", "first")
	if got := read(t, d, "sessions/s-1/snap-1.tar"); got != "first" {
		t.Errorf("Get = %q", got)
	}
	put(t, d, "sessions/s-1/snap-1.tar", "second, longer")
	if got := read(t, d, "sessions/s-1/snap-1.tar"); got != "second, longer" {
		t.Errorf("Get after overwrite = %q", got)
	}
	info, err := d.Stat(ctx, "sessions/s-1/snap-1.tar")
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	if info.Key != "sessions/s-1/snap-1.tar" || info.Size != int64(len("second, longer")) || info.Modified.IsZero() {
		t.Errorf("Stat = %+v", info)
	}
	if err := d.Delete(ctx, "sessions/s-1/snap-1.tar"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := d.Get(ctx, "sessions/s-1/snap-1.tar"); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("Get after Delete = %v, want ErrNotFound", err)
	}
	if got := leftovers(t, d.Root()); len(got) != 0 {
		t.Errorf("temporary files left: %v", got)
	}
}

func TestNotFound(t *testing.T) {
	t.Parallel()
	d := newDir(t)
	ctx := t.Context()
	put(t, d, "a/b", "x")
	for _, key := range []string{"missing", "a", "a/b/c", "a/missing"} {
		t.Run(key, func(t *testing.T) {
			t.Parallel()
			if _, err := d.Get(ctx, key); !errors.Is(err, blob.ErrNotFound) {
				t.Errorf("Get = %v, want ErrNotFound", err)
			}
			if _, err := d.Stat(ctx, key); !errors.Is(err, blob.ErrNotFound) {
				t.Errorf("Stat = %v, want ErrNotFound", err)
			}
			if err := d.Delete(ctx, key); !errors.Is(err, blob.ErrNotFound) {
				t.Errorf("Delete = %v, want ErrNotFound", err)
			}
		})
	}
	// Deleting the "directory" key must not remove a/.
	if got := read(t, d, "a/b"); got != "x" {
		t.Errorf("a/b = %q after deleting a", got)
	}
}

func TestInvalidKeys(t *testing.T) {
	t.Parallel()
	d := newDir(t)
	ctx := t.Context()
	for _, key := range []string{"", "/abs", "a//b", "a/", "../escape", "a/../../b", "a/./b", ".", "..", `a\b`, "a\x00b", ".blob-tmp-x", "a/.blob-tmp-y"} {
		t.Run(key, func(t *testing.T) {
			t.Parallel()
			if err := d.Put(ctx, key, strings.NewReader("x")); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("Put = %v, want ErrInvalidKey", err)
			}
			if _, err := d.Get(ctx, key); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("Get = %v, want ErrInvalidKey", err)
			}
			if _, err := d.Stat(ctx, key); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("Stat = %v, want ErrInvalidKey", err)
			}
			if err := d.Delete(ctx, key); !errors.Is(err, blob.ErrInvalidKey) {
				t.Errorf("Delete = %v, want ErrInvalidKey", err)
			}
		})
	}
	for _, prefix := range []string{"/abs", "../", "a//", "a/../"} {
		if _, err := d.List(ctx, prefix); !errors.Is(err, blob.ErrInvalidKey) {
			t.Errorf("List(%q) = %v, want ErrInvalidKey", prefix, err)
		}
	}
	// Nothing escaped the root.
	entries, err := os.ReadDir(filepath.Dir(d.Root()))
	if err != nil || len(entries) != 1 {
		t.Errorf("parent of root holds %v (%v), want only the root", entries, err)
	}
}

func TestList(t *testing.T) {
	t.Parallel()
	d := newDir(t)
	for _, k := range []string{"a/c", "a-b", "a/b/d", "b", "a/bc", ".hidden"} {
		put(t, d, k, k)
	}
	tests := []struct {
		prefix string
		want   []string
	}{
		{"", []string{".hidden", "a-b", "a/b/d", "a/bc", "a/c", "b"}},
		{"a", []string{"a-b", "a/b/d", "a/bc", "a/c"}},
		{"a/", []string{"a/b/d", "a/bc", "a/c"}},
		{"a/b", []string{"a/b/d", "a/bc"}},
		{"a/b/", []string{"a/b/d"}},
		{"nope/", nil},
		{"a/b/d/e", nil},
	}
	for _, tt := range tests {
		t.Run(tt.prefix, func(t *testing.T) {
			t.Parallel()
			infos, err := d.List(t.Context(), tt.prefix)
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			var got []string
			for _, i := range infos {
				got = append(got, i.Key)
				if i.Size != int64(len(i.Key)) {
					t.Errorf("%s size = %d", i.Key, i.Size)
				}
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("List(%q) = %v, want %v", tt.prefix, got, tt.want)
			}
		})
	}
}

// failingReader returns some data, then an error.
type failingReader struct {
	data []byte
	err  error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestPutFailureKeepsOldObject(t *testing.T) {
	t.Parallel()
	d := newDir(t)
	put(t, d, "snap/1", "old object")
	errBroken := errors.New("connection reset")
	err := d.Put(t.Context(), "snap/1", &failingReader{data: bytes.Repeat([]byte("new"), 100_000), err: errBroken})
	if !errors.Is(err, errBroken) {
		t.Fatalf("Put = %v, want the reader's error", err)
	}
	if got := read(t, d, "snap/1"); got != "old object" {
		t.Errorf("object after failed Put = %q..., want the old one", got[:min(len(got), 20)])
	}
	// A failed first Put leaves no object at all.
	err = d.Put(t.Context(), "snap/2", &failingReader{data: []byte("partial"), err: errBroken})
	if !errors.Is(err, errBroken) {
		t.Fatalf("Put = %v", err)
	}
	if _, err := d.Stat(t.Context(), "snap/2"); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("Stat after failed first Put = %v, want ErrNotFound", err)
	}
	infos, err := d.List(t.Context(), "")
	if err != nil || len(infos) != 1 || infos[0].Key != "snap/1" {
		t.Errorf("List = %v, %v; want only snap/1", infos, err)
	}
	if got := leftovers(t, d.Root()); len(got) != 0 {
		t.Errorf("temporary files left: %v", got)
	}
}

// cancelingReader cancels its context after the first read.
type cancelingReader struct {
	cancel context.CancelFunc
	reads  int
}

func (r *cancelingReader) Read(p []byte) (int, error) {
	r.reads++
	if r.reads == 1 {
		r.cancel()
		return copy(p, "partial"), nil
	}
	return copy(p, "more"), nil
}

func TestPutCanceled(t *testing.T) {
	t.Parallel()
	d := newDir(t)
	put(t, d, "k", "old")
	ctx, cancel := context.WithCancel(t.Context())
	err := d.Put(ctx, "k", &cancelingReader{cancel: cancel})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Put = %v, want context.Canceled", err)
	}
	if got := read(t, d, "k"); got != "old" {
		t.Errorf("object after canceled Put = %q, want old", got)
	}
	if got := leftovers(t, d.Root()); len(got) != 0 {
		t.Errorf("temporary files left: %v", got)
	}
}

func TestConcurrentPuts(t *testing.T) {
	t.Parallel()
	d := newDir(t)
	contents := []string{strings.Repeat("a", 1<<16), strings.Repeat("b", 1<<17), strings.Repeat("c", 1<<15)}
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			if err := d.Put(t.Context(), "same/key", strings.NewReader(contents[i%len(contents)])); err != nil {
				t.Errorf("Put: %v", err)
			}
		})
	}
	wg.Wait()
	got := read(t, d, "same/key")
	whole := false
	for _, c := range contents {
		whole = whole || got == c
	}
	if !whole {
		t.Errorf("object is a mix of Puts (len %d)", len(got))
	}
	if left := leftovers(t, d.Root()); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestNewDirCreatesRoot(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "x", "y")
	d, err := blob.NewDir(root)
	if err != nil {
		t.Fatalf("NewDir: %v", err)
	}
	if fi, err := os.Stat(d.Root()); err != nil || !fi.IsDir() {
		t.Errorf("root not created: %v", err)
	}
	// A file in the way is an error.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := blob.NewDir(file); err == nil {
		t.Error("NewDir over a file succeeded")
	}
}
