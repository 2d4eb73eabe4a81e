package checkpoint

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"path"
	"strings"
	"testing"
	"time"
)

// FuzzParseManifest: any plaintext either parses into a manifest naming
// the id or fails as damage; it never panics.
func FuzzParseManifest(f *testing.F) {
	const id = "s1~20260101T000000.000000000Z-00000000"
	f.Add([]byte(`{"version":1,"checkpoint":{"id":"` + id + `","session":"s1","parts":[{"kind":"PART_KIND_BUNDLE","objects":["ab"]}]},"refs":[{"name":"main","commit":"x"}]}`))
	f.Add([]byte(`{"version":2,"checkpoint":{}}`))
	f.Add([]byte(`{"version":1,"checkpoint":"nope"}`))
	f.Add([]byte(`{"version":1,"checkpoint":{"id":"other"}}`))
	f.Add([]byte(``))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := parseManifest(id, body)
		if err != nil {
			if !errors.Is(err, errDamaged) {
				t.Fatalf("error not errDamaged: %v", err)
			}
			return
		}
		if m.cp.GetId() != id || m.Version != 1 {
			t.Fatalf("accepted a manifest of %q version %d", m.cp.GetId(), m.Version)
		}
		_ = m.objects()
	})
}

func tarOf(t testing.TB, entries ...*tar.Header) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range entries {
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(h.Name))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(h.Name))
		}
	}
	tw.Close()
	return b.Bytes()
}

// FuzzFilterTar: whatever the tarball, every entry filterTar lets through
// stays inside the work tree (or the conversation roots), and what it
// writes is a tarball of exactly those entries.
func FuzzFilterTar(f *testing.F) {
	now := time.Unix(1700000000, 0)
	for _, hs := range [][]*tar.Header{
		{{Name: "a.txt", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: now}, {Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now}},
		{{Name: "ln", Typeflag: tar.TypeSymlink, Linkname: "../../etc/passwd", Mode: 0o777, ModTime: now}},
		{{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: now}},
		{{Name: "/abs", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: now}},
		{{Name: ".git/config", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: now}},
		{{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/shadow", ModTime: now}},
		{{Name: "dev", Typeflag: tar.TypeChar, ModTime: now}},
		{{Name: "x/../../y", Typeflag: tar.TypeReg, Mode: 0o4755, ModTime: now}},
	} {
		f.Add(tarOf(f, hs...), false)
	}
	f.Add(tarOf(f, &tar.Header{Name: "/home/u/.claude/projects/c.jsonl", Typeflag: tar.TypeReg, Mode: 0o600, ModTime: now}), true)
	f.Add(tarOf(f, &tar.Header{Name: "/home/u/.claude/projects/../../../etc/x", Typeflag: tar.TypeReg, Mode: 0o600, ModTime: now}), true)
	f.Add([]byte("not a tar at all"), false)
	f.Fuzz(func(t *testing.T, data []byte, absolute bool) {
		pol := tarPolicy{}
		if absolute {
			pol = tarPolicy{absolute: true, roots: []string{"/home/u/.claude/projects"}}
		}
		var out bytes.Buffer
		_, err := filterTar(bytes.NewReader(data), &out, pol)
		if err != nil {
			return
		}
		// The output is a valid tarball of checked entries only.
		tr := tar.NewReader(&out)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("filterTar wrote a bad tarball: %v", err)
			}
			checkInside(t, h.Name, h.Typeflag == tar.TypeDir, pol)
			switch h.Typeflag {
			case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeFifo, tar.TypeLink:
			default:
				t.Fatalf("entry %q of type %q let through", h.Name, h.Typeflag)
			}
			if h.Typeflag == tar.TypeLink {
				checkInside(t, h.Linkname, false, pol)
			}
			if h.Mode&^0o7777 != 0 {
				t.Fatalf("entry %q keeps mode bits %o", h.Name, h.Mode)
			}
		}
	})
}

func checkInside(t *testing.T, name string, dir bool, pol tarPolicy) {
	t.Helper()
	if strings.ContainsRune(name, 0) {
		t.Fatalf("name with NUL let through: %q", name)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			t.Fatalf("name with '..' let through: %q", name)
		}
	}
	if pol.absolute {
		c := path.Clean(name)
		for _, r := range pol.roots {
			if c == r || strings.HasPrefix(c, r+"/") || (dir && strings.HasPrefix(r, c)) {
				return
			}
		}
		t.Fatalf("entry %q outside the roots", name)
	}
	c := path.Clean(strings.TrimPrefix(name, "./"))
	if path.IsAbs(c) || c == ".." || strings.HasPrefix(c, "../") || c == ".git" || strings.HasPrefix(c, ".git/") {
		t.Fatalf("entry %q escapes the work tree", name)
	}
}

// FuzzCheckDiff: a diff checkDiff accepts has no "diff --git" header
// naming a path outside the work tree or inside .git, and no rename or
// copy. ("---"/"+++" lines are not checked: inside a hunk they are content;
// git apply refuses paths outside the work tree itself.)
func FuzzCheckDiff(f *testing.F) {
	f.Add([]byte("diff --git a/x b/x\nindex 0000000000000000000000000000000000000000..1111111111111111111111111111111111111111 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"))
	f.Add([]byte("diff --git a/../x b/../x\n--- a/../x\n+++ b/../x\n"))
	f.Add([]byte("diff --git a/.git/hooks/x b/.git/hooks/x\nnew file mode 100755\n"))
	f.Add([]byte("diff --git \"a/\\303\\251\" \"b/\\303\\251\"\nrename from x\nrename to y\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var out bytes.Buffer
		if err := checkDiff(bytes.NewReader(data), &out); err != nil {
			return
		}
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(line, "rename ") || strings.HasPrefix(line, "copy ") {
				t.Fatalf("accepted %q", line)
			}
			if !strings.HasPrefix(line, "diff --git ") {
				continue
			}
			for _, bad := range []string{" a/../", " b/../", "/../", " a/.git/", " b/.git/", " /"} {
				if strings.Contains(line, bad) && !strings.Contains(line, "/dev/null") {
					t.Fatalf("accepted %q", line)
				}
			}
		}
	})
}
