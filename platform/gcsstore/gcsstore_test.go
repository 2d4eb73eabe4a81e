package gcsstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"cloud.google.com/go/storage"
	"github.com/fsouza/fake-gcs-server/fakestorage"
	"google.golang.org/api/option"

	"github.com/hangar-dev/hangar/platform/blob"
	"github.com/hangar-dev/hangar/platform/gcsstore"
)

// flaky fails the next n requests whose method is method with 503.
type flaky struct {
	h      http.Handler
	method atomic.Value
	n      atomic.Int32
	failed atomic.Int32
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if m, _ := f.method.Load().(string); m == r.Method && f.n.Add(-1) >= 0 {
		f.failed.Add(1)
		io.Copy(io.Discard, r.Body)
		http.Error(w, `{"error":{"code":503,"message":"try again"}}`, http.StatusServiceUnavailable)
		return
	}
	f.h.ServeHTTP(w, r)
}

func newStore(t *testing.T) (*gcsstore.Store, *flaky) {
	t.Helper()
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{NoListener: true, Scheme: "http"})
	if err != nil {
		t.Fatal(err)
	}
	srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: "bkt"})
	f := &flaky{h: srv.HTTPHandler()}
	ts := httptest.NewServer(f)
	t.Cleanup(ts.Close)
	client, err := storage.NewClient(context.Background(), option.WithEndpoint(ts.URL+"/storage/v1/"),
		option.WithoutAuthentication(), storage.WithJSONReads())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	s, err := gcsstore.New(client, "gs://bkt/some/prefix")
	if err != nil {
		t.Fatal(err)
	}
	return s, f
}

func TestStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, f := newStore(t)
	if _, err := s.Get(ctx, "nope"); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("get missing: %v", err)
	}
	if _, err := s.Stat(ctx, "nope"); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("stat missing: %v", err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	// The first two upload requests fail with 503 and are retried.
	f.method.Store(http.MethodPost)
	f.n.Store(2)
	if err := s.Put(ctx, "a/one", bytes.NewReader(big)); err != nil {
		t.Fatalf("put through 503s: %v", err)
	}
	if f.failed.Load() != 2 {
		t.Fatalf("injected failures = %d, want 2", f.failed.Load())
	}
	f.method.Store(http.MethodGet)
	f.n.Store(1)
	rc, err := s.Get(ctx, "a/one")
	if err != nil {
		t.Fatalf("get through 503: %v", err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("get: %d bytes, %v", len(got), err)
	}
	f.n.Store(0)
	if err := s.Put(ctx, "a/two", strings.NewReader("2")); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "b/three", strings.NewReader("3")); err != nil {
		t.Fatal(err)
	}
	if in, err := s.Stat(ctx, "a/two"); err != nil || in.Size != 1 || in.Key != "a/two" {
		t.Fatalf("stat: %+v %v", in, err)
	}
	list, err := s.List(ctx, "a/")
	if err != nil || len(list) != 2 || list[0].Key != "a/one" || list[1].Key != "a/two" {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := s.Delete(ctx, "a/one"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "a/one"); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	// A failed upload leaves nothing visible.
	if err := s.Put(ctx, "a/broken", io.MultiReader(strings.NewReader("half"), errReader{})); err == nil {
		t.Fatal("put with a failing reader succeeded")
	}
	if _, err := s.Stat(ctx, "a/broken"); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("half upload visible: %v", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("boom") }

func TestParseURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][2]string{
		"gs://b": {"b", ""}, "gs://b/": {"b", ""}, "gs://b/p/q": {"b", "p/q/"},
	} {
		b, p, err := gcsstore.ParseURL(in)
		if err != nil || b != want[0] || p != want[1] {
			t.Errorf("%s: %q %q %v", in, b, p, err)
		}
	}
	for _, bad := range []string{"s3://b", "gs://", "gs:///p"} {
		if _, _, err := gcsstore.ParseURL(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
