package tool

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
)

// gitIndex is what restore reads of a git index file: each entry's path,
// modification second and owner, and the tree its cache-tree extension
// vouches for ("" when it has none or its root is invalidated).
type gitIndex struct {
	entries []indexEntry
	tree    string
}

type indexEntry struct {
	name     string
	mtime    int64
	uid, gid uint32
}

var errIndexFormat = errors.New("index: a format this reader does not know")

// readIndex reads a version 2 or 3 index whose object names are hashLen
// bytes (20 for SHA-1, 32 for SHA-256). Anything else (version 4's
// compressed paths, a split index, a short file) is errIndexFormat: the
// caller then asks git.
func readIndex(path string, hashLen int) (*gitIndex, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(data) < 12+hashLen || string(data[:4]) != "DIRC" {
		return nil, errIndexFormat
	}
	version := binary.BigEndian.Uint32(data[4:8])
	if version != 2 && version != 3 {
		return nil, errIndexFormat
	}
	n := int(binary.BigEndian.Uint32(data[8:12]))
	body := data[:len(data)-hashLen] // the trailing checksum
	idx := &gitIndex{entries: make([]indexEntry, 0, n)}
	off := 12
	odd := false
	fixed := 40 + hashLen + 2 // stat data, object name, flags
	for range n {
		if off+fixed > len(body) {
			return nil, errIndexFormat
		}
		e := body[off:]
		// Stat data: ctime, mtime (seconds, nanoseconds each), dev,
		// ino, mode, uid, gid, size; 4 bytes each.
		mtime := int64(binary.BigEndian.Uint32(e[8:12]))
		uid, gid := binary.BigEndian.Uint32(e[28:32]), binary.BigEndian.Uint32(e[32:36])
		flags := binary.BigEndian.Uint16(e[40+hashLen:])
		start := fixed
		if flags&0x4000 != 0 {
			if version < 3 {
				return nil, errIndexFormat
			}
			start += 2
		}
		if off+start > len(body) {
			return nil, errIndexFormat
		}
		end := bytes.IndexByte(body[off+start:], 0)
		if end < 0 {
			return nil, errIndexFormat
		}
		name := string(body[off+start : off+start+end])
		if flags&0xf000 != 0 {
			// Unmerged, assumed unchanged, or with extended flags (intent-to-add,
			// skip-worktree): not an index that is its tree.
			odd = true
		}
		idx.entries = append(idx.entries, indexEntry{name: name, mtime: mtime, uid: uid, gid: gid})
		// Entries are padded with NULs to a multiple of 8 bytes.
		off += (start + end + 8) &^ 7
	}
	// Extensions: a 4-byte signature and a 4-byte size each.
	for off+8 <= len(body) {
		sig := string(body[off : off+4])
		size := int(binary.BigEndian.Uint32(body[off+4 : off+8]))
		off += 8
		if size < 0 || off+size > len(body) {
			return nil, errIndexFormat
		}
		ext := body[off : off+size]
		off += size
		switch {
		case sig == "link":
			return nil, errIndexFormat // a split index: entries live elsewhere
		case sig == "TREE":
			idx.tree = cacheTreeRoot(ext, hashLen)
		}
	}
	if odd {
		idx.tree = ""
	}
	return idx, nil
}

// cacheTreeRoot is the object name of the root of a TREE extension when
// it is valid: "<path>\0<entry count> <subtrees>\n<name>", the path empty
// and the count not -1.
func cacheTreeRoot(ext []byte, hashLen int) string {
	if len(ext) == 0 || ext[0] != 0 {
		return ""
	}
	nl := bytes.IndexByte(ext, '\n')
	if nl < 0 || bytes.HasPrefix(ext[1:], []byte("-")) || len(ext) < nl+1+hashLen {
		return ""
	}
	return hex.EncodeToString(ext[nl+1 : nl+1+hashLen])
}
