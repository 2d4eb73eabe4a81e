// Package vault encrypts checkpoint data with the vault key.
//
// Every sealed object carries a header naming the vault key that wraps its
// data key, the wrapped data key itself (AES-256-GCM) and a random nonce
// prefix, followed by the plaintext in 64 KiB segments, each sealed with
// AES-256-GCM. A segment's nonce is the prefix plus its counter, and its
// additional data binds the header, the counter and whether it is the last
// segment, so truncation, reordering, splicing between objects and tampering
// are all detected. A Keyring holds one active key (new data) and retired
// keys (reading old data only), which is how the vault key rotates.
package vault

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// KeySize is the size of a vault key and of a data key: AES-256.
const KeySize = 32

// Key is one vault key.
type Key struct {
	// ID names the key in sealed headers; derived from the key bytes.
	ID     string
	secret [KeySize]byte
}

// NewKey returns the key for 32 secret bytes.
func NewKey(secret []byte) (Key, error) {
	if len(secret) != KeySize {
		return Key{}, fmt.Errorf("vault key: want %d bytes, got %d", KeySize, len(secret))
	}
	var k Key
	copy(k.secret[:], secret)
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("hangar vault key id v1"))
	k.ID = "vk1-" + hex.EncodeToString(m.Sum(nil)[:8])
	return k, nil
}

// Keyring is the active vault key plus retired keys still accepted for
// reading.
type Keyring struct {
	active Key
	byID   map[string]Key
}

// NewKeyring returns a keyring that seals with active and opens data sealed
// with active or any of retired.
func NewKeyring(active Key, retired ...Key) *Keyring {
	kr := &Keyring{active: active, byID: map[string]Key{active.ID: active}}
	for _, k := range retired {
		kr.byID[k.ID] = k
	}
	return kr
}

// ActiveID is the id of the key new data is sealed with.
func (kr *Keyring) ActiveID() string { return kr.active.ID }

// Lookup returns the key with the given id.
func (kr *Keyring) Lookup(id string) (Key, bool) {
	k, ok := kr.byID[id]
	return k, ok
}

// Derive returns a 32-byte secret derived from the active key for purpose
// (e.g. the key that turns plaintext into content-addressed object names).
func (kr *Keyring) Derive(purpose string) []byte {
	m := hmac.New(sha256.New, kr.active.secret[:])
	m.Write([]byte("hangar vault derive v1\x00" + purpose))
	return m.Sum(nil)
}

// LoadKeyFile reads a vault key file: the first non-empty line is the active
// key, standard base64 of 32 bytes (what `hangar up` writes to
// HANGAR_HOME/vault.key with mode 0600); further lines are retired keys kept
// for reading older checkpoints. Lines starting with '#' are comments. The
// file must not be readable by group or others.
func LoadKeyFile(path string) (*Keyring, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("vault key file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("vault key file %s: mode %04o is readable by others; want 0600", path, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("vault key file: %w", err)
	}
	kr, err := ParseKeys(data)
	if err != nil {
		return nil, fmt.Errorf("vault key file %s: %w", path, err)
	}
	return kr, nil
}

// ParseKeys parses the contents of a vault key file (see LoadKeyFile).
func ParseKeys(data []byte) (*Keyring, error) {
	var keys []Key
	sc := bufio.NewScanner(bytes.NewReader(data))
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("line %d: not standard base64", line)
		}
		k, err := NewKey(raw)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		keys = append(keys, k)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, errors.New("no key")
	}
	return NewKeyring(keys[0], keys[1:]...), nil
}
