// Package gcsstore is a blob.Store on Google Cloud Storage.
package gcsstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	"github.com/googleapis/gax-go/v2"
	"google.golang.org/api/iterator"

	"github.com/hangar-dev/hangar/platform/blob"
)

// Store keeps blobs under gs://bucket/prefix/.
type Store struct {
	bucket *storage.BucketHandle
	prefix string
}

// ParseURL splits gs://bucket[/prefix].
func ParseURL(u string) (bucket, prefix string, err error) {
	rest, ok := strings.CutPrefix(u, "gs://")
	if !ok {
		return "", "", fmt.Errorf("%q is not a gs:// URL", u)
	}
	bucket, prefix, _ = strings.Cut(rest, "/")
	if bucket == "" {
		return "", "", fmt.Errorf("%q has no bucket", u)
	}
	prefix = strings.Trim(prefix, "/")
	if prefix != "" {
		prefix += "/"
	}
	return bucket, prefix, nil
}

// New returns a Store for url (gs://bucket[/prefix]) over client. Every
// operation retries on 429 and 5xx with exponential backoff, writes
// included (RetryAlways): each write is made idempotent by its own
// precondition or by writing the same bytes again.
func New(client *storage.Client, url string) (*Store, error) {
	bucket, prefix, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	b := client.Bucket(bucket).Retryer(
		storage.WithPolicy(storage.RetryAlways),
		storage.WithBackoff(gax.Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Multiplier: 2}),
		storage.WithMaxAttempts(6),
	)
	return &Store{bucket: b, prefix: prefix}, nil
}

// Put writes key with r's bytes; readers see the old object or the new
// one, never part of it. The upload is one resumable session, retried
// chunk by chunk (16 MiB buffered at most).
func (s *Store) Put(ctx context.Context, key string, r io.Reader) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := s.bucket.Object(s.prefix + key).NewWriter(ctx)
	w.ChunkSize = 16 << 20
	w.ContentType = "application/octet-stream"
	if _, err := io.Copy(w, r); err != nil {
		cancel() // abandon the upload: nothing becomes visible
		w.Close()
		return fmt.Errorf("gcs put %s: %w", key, err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("gcs put %s: %w", key, err)
	}
	return nil
}

// Get opens key.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	rc, err := s.bucket.Object(s.prefix + key).NewReader(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return nil, blob.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("gcs get %s: %w", key, err)
	}
	return rc, nil
}

// Stat describes key.
func (s *Store) Stat(ctx context.Context, key string) (blob.Info, error) {
	a, err := s.bucket.Object(s.prefix + key).Attrs(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return blob.Info{}, blob.ErrNotFound
	}
	if err != nil {
		return blob.Info{}, fmt.Errorf("gcs stat %s: %w", key, err)
	}
	return blob.Info{Key: key, Size: a.Size, Modified: a.Updated}, nil
}

// Delete removes key (blob.ErrNotFound when absent).
func (s *Store) Delete(ctx context.Context, key string) error {
	err := s.bucket.Object(s.prefix + key).Delete(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return blob.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("gcs delete %s: %w", key, err)
	}
	return nil
}

// List returns the blobs whose keys start with prefix, in key order.
func (s *Store) List(ctx context.Context, prefix string) ([]blob.Info, error) {
	it := s.bucket.Objects(ctx, &storage.Query{Prefix: s.prefix + prefix})
	var out []blob.Info
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("gcs list %s: %w", prefix, err)
		}
		out = append(out, blob.Info{Key: strings.TrimPrefix(a.Name, s.prefix), Size: a.Size, Modified: a.Updated})
	}
}

// CheckStoreSetting checks HANGAR_SESSION_STORE's value, shared by the
// services that keep data there: empty, an absolute directory or
// gs://bucket[/prefix].
func CheckStoreSetting(value string) error {
	switch {
	case value == "", filepath.IsAbs(value):
		return nil
	case strings.HasPrefix(value, "gs://"):
		if _, _, err := ParseURL(value); err != nil {
			return fmt.Errorf("HANGAR_SESSION_STORE=%q: want gs://bucket[/prefix] with a bucket name", value)
		}
		return nil
	}
	return fmt.Errorf("HANGAR_SESSION_STORE=%q: want an absolute directory or gs://bucket[/prefix]", value)
}
