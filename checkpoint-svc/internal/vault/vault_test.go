package vault_test

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/hangar-dev/hangar/checkpoint-svc/internal/vault"
)

func newKey(t testing.TB) vault.Key {
	t.Helper()
	b := make([]byte, 32)
	rand.Read(b)
	k, err := vault.NewKey(b)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func seal(t testing.TB, kr *vault.Keyring, plain []byte) []byte {
	t.Helper()
	dk, err := kr.NewDataKey()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w, err := vault.NewWriter(&buf, dk)
	if err != nil {
		t.Fatal(err)
	}
	// Odd write sizes cross segment boundaries.
	for p := plain; len(p) > 0; {
		n := min(len(p), 7001)
		if _, err := w.Write(p[:n]); err != nil {
			t.Fatal(err)
		}
		p = p[n:]
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func open(kr *vault.Keyring, sealed []byte) ([]byte, error) {
	return io.ReadAll(vault.NewReader(bytes.NewReader(sealed), kr))
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	kr := vault.NewKeyring(newKey(t))
	for _, n := range []int{0, 1, vault.SegmentSize - 1, vault.SegmentSize, vault.SegmentSize + 1, 3*vault.SegmentSize + 17} {
		plain := make([]byte, n)
		rand.Read(plain)
		sealed := seal(t, kr, plain)
		if bytes.Contains(sealed, plain[:min(n, 64)]) && n >= 16 {
			t.Fatalf("n=%d: plaintext visible in sealed data", n)
		}
		got, err := open(kr, sealed)
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if !bytes.Equal(got, plain) {
			t.Fatalf("n=%d: round trip differs", n)
		}
	}
}

func TestTamperTruncateExtend(t *testing.T) {
	t.Parallel()
	kr := vault.NewKeyring(newKey(t))
	plain := make([]byte, 2*vault.SegmentSize+100)
	rand.Read(plain)
	sealed := seal(t, kr, plain)
	step := len(sealed) / 97
	for i := 0; i < len(sealed); i += step {
		bad := bytes.Clone(sealed)
		bad[i] ^= 0x40
		if _, err := open(kr, bad); !errors.Is(err, vault.ErrTampered) && !errors.Is(err, vault.ErrUnknownKey) {
			t.Fatalf("flip at %d: err = %v", i, err)
		}
	}
	seg := vault.SegmentSize + 16
	hdr := len(sealed) - (2*seg + 100 + 16)
	for _, n := range []int{0, 3, hdr, hdr + seg, hdr + 2*seg, len(sealed) - 1} {
		if _, err := open(kr, sealed[:n]); !errors.Is(err, vault.ErrTampered) {
			t.Fatalf("truncate to %d: err = %v", n, err)
		}
	}
	if _, err := open(kr, append(bytes.Clone(sealed), 0)); !errors.Is(err, vault.ErrTampered) {
		t.Fatalf("extended: err = %v", err)
	}
	// Swapping two full segments is detected.
	swapped := bytes.Clone(sealed)
	copy(swapped[hdr:], sealed[hdr+seg:hdr+2*seg])
	copy(swapped[hdr+seg:], sealed[hdr:hdr+seg])
	if _, err := open(kr, swapped); !errors.Is(err, vault.ErrTampered) {
		t.Fatalf("reordered: err = %v", err)
	}
}

func TestWrongKeyAndRotation(t *testing.T) {
	t.Parallel()
	oldKey, newK := newKey(t), newKey(t)
	old := vault.NewKeyring(oldKey)
	sealed := seal(t, old, []byte("hello"))
	if _, err := open(vault.NewKeyring(newK), sealed); !errors.Is(err, vault.ErrUnknownKey) {
		t.Fatalf("wrong key: err = %v", err)
	}
	rotated := vault.NewKeyring(newK, oldKey)
	got, err := open(rotated, sealed)
	if err != nil || string(got) != "hello" {
		t.Fatalf("old data after rotation: %q %v", got, err)
	}
	if rotated.ActiveID() != newK.ID {
		t.Fatal("active key is not the new one")
	}
	fresh := seal(t, rotated, []byte("new"))
	if _, err := open(old, fresh); !errors.Is(err, vault.ErrUnknownKey) {
		t.Fatalf("new data with old ring: err = %v", err)
	}
}

func TestLoadKeyFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, b := make([]byte, 32), make([]byte, 32)
	rand.Read(a)
	rand.Read(b)
	path := filepath.Join(dir, "vault.key")
	body := base64.StdEncoding.EncodeToString(a) + "\n# retired\n" + base64.StdEncoding.EncodeToString(b) + "\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	kr, err := vault.LoadKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ka, _ := vault.NewKey(a)
	kb, _ := vault.NewKey(b)
	if kr.ActiveID() != ka.ID {
		t.Fatal("first line is not the active key")
	}
	if _, ok := kr.Lookup(kb.ID); !ok {
		t.Fatal("retired key missing")
	}
	os.Chmod(path, 0o644)
	if _, err := vault.LoadKeyFile(path); err == nil {
		t.Fatal("world-readable key file accepted")
	}
	os.WriteFile(path, []byte("bm90IGEga2V5\n"), 0o600)
	if _, err := vault.LoadKeyFile(path); err == nil {
		t.Fatal("short key accepted")
	}
}
