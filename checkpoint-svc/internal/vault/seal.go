package vault

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// SegmentSize is the plaintext size of every segment but the last, which is
// always shorter (possibly empty), so a reader knows where the data ends.
const SegmentSize = 64 << 10

var magic = [4]byte{'H', 'G', 'V', '1'}

const (
	prefixSize  = 8
	wrapNonceSz = 12
	wrappedSize = KeySize + 16
	tagSize     = 16
)

// Errors from opening sealed data.
var (
	// ErrTampered: the data is not what was sealed: modified, truncated,
	// extended, reordered or not sealed data at all.
	ErrTampered = errors.New("sealed data failed authentication")
	// ErrUnknownKey: the data was sealed with a vault key not in the keyring.
	ErrUnknownKey = errors.New("sealed with a vault key not in the keyring")
)

// DataKey is a random AES-256 key for one checkpoint, with its wrapped form
// (sealed by the active vault key) that goes into every header.
type DataKey struct {
	KeyID  string
	aead   cipher.AEAD
	header []byte // magic, key id, wrap nonce, wrapped key
}

// NewDataKey makes a random data key wrapped by the active vault key.
func (kr *Keyring) NewDataKey() (*DataKey, error) {
	var dk [KeySize]byte
	if _, err := rand.Read(dk[:]); err != nil {
		return nil, err
	}
	wrap, err := newGCM(kr.active.secret[:])
	if err != nil {
		return nil, err
	}
	id := kr.active.ID
	if len(id) > 255 {
		return nil, fmt.Errorf("vault key id too long")
	}
	h := make([]byte, 0, 4+1+len(id)+wrapNonceSz+wrappedSize)
	h = append(h, magic[:]...)
	h = append(h, byte(len(id)))
	h = append(h, id...)
	nonce := make([]byte, wrapNonceSz)
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	h = append(h, nonce...)
	h = wrap.Seal(h, nonce, dk[:], wrapAD(id))
	aead, err := newGCM(dk[:])
	if err != nil {
		return nil, err
	}
	return &DataKey{KeyID: id, aead: aead, header: h}, nil
}

func wrapAD(id string) []byte { return []byte("hangar data key v1\x00" + id) }

func newGCM(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// Writer seals what is written to it into an underlying writer. Close
// writes the last segment; without it the data is unreadable (truncated).
type Writer struct {
	dst     io.Writer
	aead    cipher.AEAD
	prefix  [prefixSize]byte
	hhash   [32]byte
	buf     []byte
	out     []byte
	counter uint64
	started bool
	closed  bool
	err     error
	hdr     []byte
}

// NewWriter returns a Writer sealing into dst with dk. Each Writer uses a
// fresh random nonce prefix, so one data key seals many objects.
func NewWriter(dst io.Writer, dk *DataKey) (*Writer, error) {
	w := &Writer{dst: dst, aead: dk.aead, buf: make([]byte, 0, SegmentSize)}
	if _, err := rand.Read(w.prefix[:]); err != nil {
		return nil, err
	}
	w.hdr = append(append([]byte(nil), dk.header...), w.prefix[:]...)
	w.hhash = sha256.Sum256(w.hdr)
	return w, nil
}

// Write buffers p and seals every full segment.
func (w *Writer) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if w.closed {
		return 0, errors.New("vault: write after close")
	}
	n := 0
	for len(p) > 0 {
		// A full buffer is sealed only once more data arrives: the last
		// segment must be shorter than SegmentSize.
		if len(w.buf) == SegmentSize {
			if err := w.flush(false); err != nil {
				return n, err
			}
		}
		k := min(SegmentSize-len(w.buf), len(p))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		n += k
	}
	return n, nil
}

// Close seals the last segment. It does not close the underlying writer.
func (w *Writer) Close() error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return nil
	}
	if len(w.buf) == SegmentSize {
		if err := w.flush(false); err != nil {
			return err
		}
	}
	if err := w.flush(true); err != nil {
		return err
	}
	w.closed = true
	return nil
}

func (w *Writer) flush(final bool) error {
	if !w.started {
		if _, err := w.dst.Write(w.hdr); err != nil {
			w.err = err
			return err
		}
		w.started = true
	}
	var nonce [12]byte
	copy(nonce[:], w.prefix[:])
	if w.counter > 0xFFFFFFFF {
		w.err = errors.New("vault: too many segments")
		return w.err
	}
	binary.BigEndian.PutUint32(nonce[prefixSize:], uint32(w.counter))
	w.out = w.aead.Seal(w.out[:0], nonce[:], w.buf, segmentAD(w.hhash, w.counter, final))
	if _, err := w.dst.Write(w.out); err != nil {
		w.err = err
		return err
	}
	w.counter++
	w.buf = w.buf[:0]
	return nil
}

func segmentAD(hhash [32]byte, counter uint64, final bool) []byte {
	ad := make([]byte, 0, 32+8+1)
	ad = append(ad, hhash[:]...)
	ad = binary.BigEndian.AppendUint64(ad, counter)
	if final {
		return append(ad, 1)
	}
	return append(ad, 0)
}

// Reader opens sealed data. Every byte it returns has been authenticated;
// it returns io.EOF only after the authenticated last segment, so a
// truncated object is an error, never a short success.
type Reader struct {
	src     io.Reader
	kr      *Keyring
	aead    cipher.AEAD
	prefix  [prefixSize]byte
	hhash   [32]byte
	keyID   string
	counter uint64
	in      []byte
	plain   []byte
	off     int
	done    bool
	err     error
	started bool
}

// NewReader returns a Reader opening src with the keys in kr.
func NewReader(src io.Reader, kr *Keyring) *Reader {
	return &Reader{src: src, kr: kr}
}

// KeyID returns the vault key id of the data, after the first Read.
func (r *Reader) KeyID() string { return r.keyID }

func (r *Reader) readHeader() error {
	var fixed [5]byte
	if _, err := io.ReadFull(r.src, fixed[:]); err != nil {
		return tampered(err)
	}
	if [4]byte(fixed[:4]) != magic {
		return fmt.Errorf("%w: bad magic", ErrTampered)
	}
	rest := make([]byte, int(fixed[4])+wrapNonceSz+wrappedSize+prefixSize)
	if _, err := io.ReadFull(r.src, rest); err != nil {
		return tampered(err)
	}
	id := string(rest[:fixed[4]])
	k, ok := r.kr.Lookup(id)
	if !ok {
		return fmt.Errorf("%w (key %s)", ErrUnknownKey, id)
	}
	r.keyID = id
	p := rest[fixed[4]:]
	wrap, err := newGCM(k.secret[:])
	if err != nil {
		return err
	}
	dk, err := wrap.Open(nil, p[:wrapNonceSz], p[wrapNonceSz:wrapNonceSz+wrappedSize], wrapAD(id))
	if err != nil {
		return fmt.Errorf("%w: data key does not unwrap", ErrTampered)
	}
	if r.aead, err = newGCM(dk); err != nil {
		return err
	}
	copy(r.prefix[:], p[wrapNonceSz+wrappedSize:])
	h := sha256.New()
	h.Write(fixed[:])
	h.Write(rest)
	copy(r.hhash[:], h.Sum(nil))
	r.in = make([]byte, SegmentSize+tagSize)
	return nil
}

func tampered(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated", ErrTampered)
	}
	return err
}

// Read returns authenticated plaintext.
func (r *Reader) Read(p []byte) (int, error) {
	for r.off == len(r.plain) {
		if r.err != nil {
			return 0, r.err
		}
		if r.done {
			return 0, io.EOF
		}
		if r.err = r.next(); r.err != nil {
			r.plain, r.off = r.plain[:0], 0
		}
	}
	n := copy(p, r.plain[r.off:])
	r.off += n
	return n, nil
}

func (r *Reader) next() error {
	if !r.started {
		r.started = true
		if err := r.readHeader(); err != nil {
			return err
		}
	}
	n, err := io.ReadFull(r.src, r.in)
	final := false
	switch {
	case err == nil:
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		final = true
	default:
		return err
	}
	if n < tagSize {
		return fmt.Errorf("%w: truncated", ErrTampered)
	}
	var nonce [12]byte
	copy(nonce[:], r.prefix[:])
	binary.BigEndian.PutUint32(nonce[prefixSize:], uint32(r.counter))
	plain, oerr := r.aead.Open(r.plain[:0], nonce[:], r.in[:n], segmentAD(r.hhash, r.counter, final))
	if oerr != nil {
		return fmt.Errorf("%w: segment %d", ErrTampered, r.counter)
	}
	r.plain, r.off = plain, 0
	r.counter++
	if final {
		r.done = true
		// Anything after the last segment is tampering too.
		var extra [1]byte
		if k, _ := r.src.Read(extra[:]); k > 0 {
			return fmt.Errorf("%w: data after the last segment", ErrTampered)
		}
	}
	return nil
}
