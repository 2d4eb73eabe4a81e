// Package blob stores opaque objects (snapshots, recordings) by key.
//
// Keys are slash-separated relative paths such as "sessions/s-1/snap-3.tar":
// not empty, not absolute, without empty, "." or ".." segments, backslashes
// or NUL bytes. Dir keeps objects as files under a local directory; other
// stores (a bucket) implement the same Store interface.
package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// ErrNotFound is returned (wrapped) for a key that holds no object; test
// with errors.Is.
var ErrNotFound = errors.New("blob not found")

// ErrInvalidKey is returned (wrapped) for a key or prefix that breaks the key
// rules.
var ErrInvalidKey = errors.New("invalid blob key")

// Info describes a stored object.
type Info struct {
	Key      string
	Size     int64
	Modified time.Time
}

// Store is an object store. Put replaces an object atomically: readers see
// the old object or the new one, never a part.
type Store interface {
	Put(ctx context.Context, key string, r io.Reader) error
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	Stat(ctx context.Context, key string) (Info, error)
	Delete(ctx context.Context, key string) error
	List(ctx context.Context, prefix string) ([]Info, error)
}

// tmpPrefix starts the names of files being written. Keys may not have a
// segment starting with it, and List skips such files.
const tmpPrefix = ".blob-tmp-"

// Dir is a Store in a local directory. Objects are files named by their key
// below the root, readable by the owner only (0600, directories 0700);
// directories are created as needed and left in place when emptied. Safe for concurrent use; concurrent Puts of one key leave one of
// them whole.
type Dir struct {
	root string
}

var _ Store = (*Dir)(nil)

// NewDir returns a Store rooted at root, creating the directory if needed.
func NewDir(root string) (*Dir, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("blob: root %q: %w", root, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("blob: create root: %w", err)
	}
	return &Dir{root: abs}, nil
}

// Root returns the directory's absolute path.
func (d *Dir) Root() string { return d.root }

// ValidateKey reports whether key follows the key rules.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	return validateSegments(key, false)
}

// validateSegments checks key's segments; a prefix may end with "/" or in a
// partial segment.
func validateSegments(key string, prefix bool) error {
	if strings.HasPrefix(key, "/") {
		return fmt.Errorf("%w %q: absolute", ErrInvalidKey, key)
	}
	if strings.ContainsAny(key, "\\\x00") {
		return fmt.Errorf("%w %q: backslash or NUL", ErrInvalidKey, key)
	}
	segs := strings.Split(key, "/")
	for i, seg := range segs {
		last := i == len(segs)-1
		switch {
		case seg == "" && prefix && last:
			// "a/b/" lists everything under a/b.
		case seg == "":
			return fmt.Errorf("%w %q: empty segment", ErrInvalidKey, key)
		case (seg == "." || seg == "..") && !(prefix && last):
			return fmt.Errorf("%w %q: %q segment", ErrInvalidKey, key, seg)
		case strings.HasPrefix(seg, tmpPrefix):
			return fmt.Errorf("%w %q: segments may not start with %s", ErrInvalidKey, key, tmpPrefix)
		}
	}
	return nil
}

func (d *Dir) file(key string) (string, error) {
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	return filepath.Join(d.root, filepath.FromSlash(key)), nil
}

// Put writes r to key. It streams into a temporary file next to the target,
// syncs it and renames it over the target, so a failed or canceled Put leaves
// any previous object intact and nothing partial visible.
func (d *Dir) Put(ctx context.Context, key string, r io.Reader) (err error) {
	name, err := d.file(key)
	if err != nil {
		return fmt.Errorf("blob: put: %w", err)
	}
	dir := filepath.Dir(name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("blob: put %q: %w", key, err)
	}
	tmp, err := os.CreateTemp(dir, tmpPrefix+"*")
	if err != nil {
		return fmt.Errorf("blob: put %q: %w", key, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, ctxReader{ctx: ctx, r: r}); err != nil {
		return fmt.Errorf("blob: put %q: %w", key, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("blob: put %q: sync: %w", key, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("blob: put %q: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("blob: put %q: %w", key, err)
	}
	if err := os.Rename(tmp.Name(), name); err != nil {
		return fmt.Errorf("blob: put %q: %w", key, err)
	}
	// Make the rename itself durable.
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("blob: put %q: sync dir: %w", key, err)
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// ctxReader stops a copy once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Get opens key for reading. The caller closes it.
func (d *Dir) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	name, err := d.file(key)
	if err != nil {
		return nil, fmt.Errorf("blob: get: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("blob: get %q: %w", key, err)
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, notFound("get", key, err)
	}
	if fi, err := f.Stat(); err != nil || fi.IsDir() {
		_ = f.Close()
		return nil, notFound("get", key, errIsDir(err))
	}
	return f, nil
}

// Stat describes key.
func (d *Dir) Stat(ctx context.Context, key string) (Info, error) {
	name, err := d.file(key)
	if err != nil {
		return Info{}, fmt.Errorf("blob: stat: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return Info{}, fmt.Errorf("blob: stat %q: %w", key, err)
	}
	fi, err := os.Stat(name)
	if err != nil || fi.IsDir() {
		return Info{}, notFound("stat", key, errIsDir(err))
	}
	return Info{Key: key, Size: fi.Size(), Modified: fi.ModTime()}, nil
}

// Delete removes key; a missing key gives ErrNotFound.
func (d *Dir) Delete(ctx context.Context, key string) error {
	name, err := d.file(key)
	if err != nil {
		return fmt.Errorf("blob: delete: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("blob: delete %q: %w", key, err)
	}
	fi, err := os.Stat(name)
	if err != nil || fi.IsDir() {
		return notFound("delete", key, errIsDir(err))
	}
	if err := os.Remove(name); err != nil {
		return notFound("delete", key, err)
	}
	return nil
}

// List returns the objects whose keys start with prefix (a plain string
// prefix: "a/b" matches "a/b/c" and "a/bc"), sorted by key. "" lists all.
func (d *Dir) List(ctx context.Context, prefix string) ([]Info, error) {
	if prefix != "" {
		if err := validateSegments(prefix, true); err != nil {
			return nil, fmt.Errorf("blob: list: %w", err)
		}
	}
	// Walk only the deepest directory the prefix fully names.
	start := d.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = filepath.Join(d.root, filepath.FromSlash(prefix[:i]))
	}
	var out []Info
	err := filepath.WalkDir(start, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // nothing under this prefix (or removed meanwhile)
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if e.IsDir() || strings.HasPrefix(e.Name(), tmpPrefix) || !e.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(d.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // deleted while listing
		}
		if err != nil {
			return err
		}
		out = append(out, Info{Key: key, Size: fi.Size(), Modified: fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("blob: list %q: %w", prefix, err)
	}
	// WalkDir's order is by file name per directory, which is not key order
	// ("a-b" sorts before "a/c" as a key but after it in the walk).
	slices.SortFunc(out, func(a, b Info) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

var errDirectory = errors.New("is a directory")

func errIsDir(err error) error {
	if err == nil {
		return errDirectory
	}
	return err
}

// notFound wraps err with ErrNotFound when it means the key holds nothing.
func notFound(op, key string, err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errDirectory) || errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("blob: %s %q: %w", op, key, ErrNotFound)
	}
	return fmt.Errorf("blob: %s %q: %w", op, key, err)
}
