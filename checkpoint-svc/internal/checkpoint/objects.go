package checkpoint

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/vault"
	"github.com/hangar-dev/hangar/platform/blob"
)

// Parts are cut into content-defined chunks (a gear rolling hash, as in
// FastCDC) so equal content is stored once even when bytes before it
// shift: a conversation file that grew by one turn, or an untracked
// tarball with one new file, re-stores only the chunks around the change.
// Each chunk is one object named by an HMAC of its plaintext under a key
// derived from the vault key, so the store learns nothing from the names.
//
// Chunk sizes are per part kind. Diffs and patches are text that changes
// a little between checkpoints: small chunks (~3 KiB) keep what a small
// edit re-stores small. Tarballs of untracked and conversation files grow
// by appends: medium chunks (~40 KiB) keep the manifest's object list
// short for tens of MB. Bundles are new content every time: large chunks
// (~320 KiB) mean few objects.
type chunking struct{ min, mask, max int }

var (
	smallChunks  = chunking{min: 1 << 10, mask: 1<<11 - 1, max: 32 << 10}
	mediumChunks = chunking{min: 8 << 10, mask: 1<<15 - 1, max: 256 << 10}
	largeChunks  = chunking{min: 64 << 10, mask: 1<<18 - 1, max: 1 << 20}
)

func chunkingFor(kind checkpointv1.PartKind) chunking {
	switch kind {
	case checkpointv1.PartKind_PART_KIND_BUNDLE:
		return largeChunks
	case checkpointv1.PartKind_PART_KIND_UNTRACKED, checkpointv1.PartKind_PART_KIND_CONVERSATION:
		return mediumChunks
	}
	return smallChunks
}

var gear = func() (g [256]uint64) {
	x := uint64(0x9E3779B97F4A7C15)
	for i := range g {
		// splitmix64: fixed, so chunk boundaries never change.
		x += 0x9E3779B97F4A7C15
		z := x
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		g[i] = z ^ (z >> 31)
	}
	return g
}()

func objectKey(id string) string { return "objects/" + id[:2] + "/" + id }

// errPartTooLarge stops a part's stream when it crosses its limit.
var errPartTooLarge = errors.New("part over its size limit")

// partWriter takes a part's plaintext as it streams out of the sandbox,
// cuts it into chunks and stores each chunk not already in the store,
// sealed. Memory is bounded by one chunk.
type partWriter struct {
	ctx   context.Context
	store blob.Store
	dk    *vault.DataKey
	idKey []byte
	limit int64
	cut   chunking

	size    int64
	sum     hash.Hash
	buf     []byte
	h       uint64
	objects []string
	stored  int64 // sealed bytes newly written
	known   *objectSet
	// dry: only hash and size the part (a reuse check), store nothing.
	dry bool
}

func newPartWriter(ctx context.Context, store blob.Store, dk *vault.DataKey, idKey []byte, kind checkpointv1.PartKind, limit int64, known *objectSet) *partWriter {
	cut := chunkingFor(kind)
	return &partWriter{ctx: ctx, store: store, dk: dk, idKey: idKey, limit: limit, cut: cut, sum: sha256.New(),
		buf: make([]byte, 0, cut.max), known: known}
}

// objectSet remembers objects known to be in the store, so a chunk seen
// before costs no Stat (a round trip on GCS). Safe for concurrent use.
// The engine forgets what its collector deletes.
type objectSet struct {
	mu  sync.Mutex
	ids map[string]bool
	max int
}

func newObjectSet(max int) *objectSet { return &objectSet{ids: map[string]bool{}, max: max} }

func (s *objectSet) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ids[id]
}

func (s *objectSet) add(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.max > 0 && len(s.ids) >= s.max {
		clear(s.ids) // a cache: forgetting costs a Stat later
	}
	s.ids[id] = true
}

func (s *objectSet) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ids, id)
}

func (w *partWriter) Write(p []byte) (int, error) {
	if w.limit > 0 && w.size+int64(len(p)) > w.limit {
		w.size += int64(len(p))
		return 0, errPartTooLarge
	}
	w.size += int64(len(p))
	w.sum.Write(p)
	n := len(p)
	for len(p) > 0 {
		if need := w.cut.min - len(w.buf); need > 0 {
			k := min(need, len(p))
			w.buf = append(w.buf, p[:k]...)
			p = p[k:]
			continue
		}
		limit := min(len(p), w.cut.max-len(w.buf))
		cut, h := -1, w.h
		for i := 0; i < limit; i++ {
			h = h<<1 + gear[p[i]]
			if h&uint64(w.cut.mask) == 0 {
				cut = i + 1
				break
			}
		}
		if cut < 0 {
			w.buf = append(w.buf, p[:limit]...)
			p = p[limit:]
			w.h = h
			if len(w.buf) >= w.cut.max {
				if err := w.emit(); err != nil {
					return 0, err
				}
			}
			continue
		}
		w.buf = append(w.buf, p[:cut]...)
		p = p[cut:]
		if err := w.emit(); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// Close stores the last chunk.
func (w *partWriter) Close() error {
	if len(w.buf) > 0 {
		return w.emit()
	}
	return nil
}

func (w *partWriter) sha() string { return hex.EncodeToString(w.sum.Sum(nil)) }

func (w *partWriter) emit() error {
	m := hmac.New(sha256.New, w.idKey)
	m.Write(w.buf)
	id := hex.EncodeToString(m.Sum(nil))
	w.objects = append(w.objects, id)
	chunk := w.buf
	w.buf, w.h = w.buf[:0], 0
	if w.dry || w.known.has(id) {
		return nil
	}
	key := objectKey(id)
	if _, err := w.store.Stat(w.ctx, key); err == nil {
		w.known.add(id)
		return nil
	} else if !errors.Is(err, blob.ErrNotFound) {
		return fmt.Errorf("stat object: %w", err)
	}
	n, err := putSealed(w.ctx, w.store, key, w.dk, bytes.NewReader(chunk))
	if err != nil {
		return err
	}
	w.known.add(id)
	w.stored += n
	return nil
}

// putSealed seals src with dk on its way into the store through a pipe:
// the sealed form is never held whole. It returns the sealed size.
func putSealed(ctx context.Context, store blob.Store, key string, dk *vault.DataKey, src io.Reader) (int64, error) {
	pr, pw := io.Pipe()
	cw := &countWriter{w: pw}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sw, err := vault.NewWriter(cw, dk)
		if err == nil {
			_, err = io.Copy(sw, src)
		}
		if err == nil {
			err = sw.Close()
		}
		pw.CloseWithError(err)
	}()
	err := store.Put(ctx, key, pr)
	pr.CloseWithError(errors.New("put ended")) // unblock the sealer if Put stopped early
	<-done
	if err != nil {
		return 0, fmt.Errorf("put %s: %w", key, err)
	}
	return cw.n, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// errDamaged: an object is missing, fails authentication, or a part's
// bytes do not match its recorded size and hash.
var errDamaged = errors.New("checkpoint data damaged")

// partReader streams a part's plaintext: its objects in order, each
// authenticated, and at the end the total size and SHA-256 checked
// against the manifest. Every error is errDamaged or vault.ErrUnknownKey
// (or the context's).
type partReader struct {
	ctx     context.Context
	store   blob.Store
	keys    *vault.Keyring
	objects []string
	size    int64
	want    string

	cur  io.ReadCloser
	r    io.Reader
	n    int64
	sum  hash.Hash
	done bool
}

func openPart(ctx context.Context, store blob.Store, keys *vault.Keyring, objects []string, size int64, sha string) *partReader {
	return &partReader{ctx: ctx, store: store, keys: keys, objects: objects, size: size, want: sha, sum: sha256.New()}
}

func (r *partReader) Read(p []byte) (int, error) {
	for {
		if r.done {
			return 0, io.EOF
		}
		if r.r == nil {
			if len(r.objects) == 0 {
				if r.n != r.size || hex.EncodeToString(r.sum.Sum(nil)) != r.want {
					return 0, fmt.Errorf("%w: part size or hash differs from the manifest", errDamaged)
				}
				r.done = true
				return 0, io.EOF
			}
			rc, err := r.store.Get(r.ctx, objectKey(r.objects[0]))
			if errors.Is(err, blob.ErrNotFound) {
				return 0, fmt.Errorf("%w: object %s missing", errDamaged, r.objects[0])
			}
			if err != nil {
				return 0, fmt.Errorf("get object: %w", err)
			}
			r.objects = r.objects[1:]
			r.cur, r.r = rc, vault.NewReader(rc, r.keys)
		}
		n, err := r.r.Read(p)
		r.n += int64(n)
		r.sum.Write(p[:n])
		if r.n > r.size {
			return 0, fmt.Errorf("%w: part longer than recorded", errDamaged)
		}
		if errors.Is(err, io.EOF) {
			r.cur.Close()
			r.cur, r.r = nil, nil
			err = nil
		}
		if err != nil {
			return n, mapOpenErr(err)
		}
		if n > 0 {
			return n, nil
		}
	}
}

func (r *partReader) Close() error {
	if r.cur != nil {
		return r.cur.Close()
	}
	return nil
}

func mapOpenErr(err error) error {
	switch {
	case errors.Is(err, vault.ErrUnknownKey):
		return err
	case errors.Is(err, vault.ErrTampered):
		return fmt.Errorf("%w: %w", errDamaged, err)
	}
	return err
}
