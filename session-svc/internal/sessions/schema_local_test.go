package sessions

import (
	"archive/tar"
	"bytes"
	"strings"
	"testing"
)

func TestStructuredResult(t *testing.T) {
	t.Parallel()
	schema := `{"type":"object","required":["status","count"]}`
	for _, tc := range []struct {
		name, text, want, warning string
	}{
		{"fenced", "Done.\n```json\n{\"status\": \"ok\", \"count\": 2}\n```", `{"count":2,"status":"ok"}`, ""},
		{"last of several", `first {"status":"a","count":1} then {"status":"b","count":2}`, `{"count":2,"status":"b"}`, ""},
		{"nested", `{"status":"ok","count":3,"more":{"x":1}}`, `{"count":3,"more":{"x":1},"status":"ok"}`, ""},
		{"braces before", `a {not json} b {"status":"ok","count":1}`, `{"count":1,"status":"ok"}`, ""},
		{"none", "no json", "", "no JSON object"},
		{"missing key", `{"status":"ok"}`, "", "lacks the required count"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, warning := structuredResult(tc.text, schema)
			if got != tc.want || (tc.warning == "") != (warning == "") || !strings.Contains(warning, tc.warning) {
				t.Errorf("structuredResult(%q) = %q, %q; want %q, %q", tc.text, got, warning, tc.want, tc.warning)
			}
		})
	}
	if err := validOutputSchema("[1]"); err == nil {
		t.Errorf("a schema that is not an object was accepted")
	}
}

func TestCheckUntrackedTar(t *testing.T) {
	t.Parallel()
	type entry struct {
		name string
		kind byte
		link string
	}
	build := func(entries ...entry) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range entries {
			if err := tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: e.kind, Linkname: e.link, Mode: 0o644}); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	for _, tc := range []struct {
		name    string
		tarball []byte
		ok      bool
	}{
		{"files and dirs", build(entry{"a.txt", tar.TypeReg, ""}, entry{"d/", tar.TypeDir, ""}, entry{"d/b.txt", tar.TypeReg, ""}), true},
		{"symlink", build(entry{"l", tar.TypeSymlink, "a.txt"}), true},
		{"absolute", build(entry{"/etc/passwd", tar.TypeReg, ""}), false},
		{"dotdot", build(entry{"../x", tar.TypeReg, ""}), false},
		{"inner dotdot", build(entry{"d/../../x", tar.TypeReg, ""}), false},
		{"git dir", build(entry{".git/config", tar.TypeReg, ""}), false},
		{"through a symlink", build(entry{"l", tar.TypeSymlink, "/tmp"}, entry{"l/x", tar.TypeReg, ""}), false},
		{"device", build(entry{"dev", tar.TypeChar, ""}), false},
		{"not a tarball", []byte("garbage that is not a tar file at all, long enough to read a header maybe"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkUntrackedTar(tc.tarball); (err == nil) != tc.ok {
				t.Errorf("checkUntrackedTar: %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
