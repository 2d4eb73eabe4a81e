package tool

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hangar-dev/hangar/api/sandboxtool"
)

func runTool(t *testing.T, argv []string, stdin string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Main(context.Background(), argv, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestVersionAndRefusals(t *testing.T) {
	code, out, _ := runTool(t, []string{"hangar-sandbox", "version"}, "")
	var v sandboxtool.VersionResponse
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.Protocol != sandboxtool.Version {
		t.Fatalf("version: %d %q", code, out)
	}
	code, _, errOut := runTool(t, []string{"hangar-sandbox", "probe"}, `{"version":99,"args":{}}`+"\n")
	if code != sandboxtool.ExitVersion || !strings.Contains(sandboxtool.FailureOf([]byte(errOut)), "request is version 99") {
		t.Errorf("version 99: %d %q", code, errOut)
	}
	code, _, errOut = runTool(t, []string{"hangar-sandbox", "frobnicate"}, "")
	if code != sandboxtool.ExitUsage || !strings.Contains(errOut, `no command \"frobnicate\"`) {
		t.Errorf("unknown command: %d %q", code, errOut)
	}
	req, _ := sandboxtool.Request(sandboxtool.ProbeRequest{WorkDir: t.TempDir(), Base: "HEAD"})
	code, _, errOut = runTool(t, []string{"hangar-sandbox", "probe"}, string(req))
	if code != sandboxtool.ExitNotARepo {
		t.Errorf("probe outside a repository: %d %q", code, errOut)
	}
}

func TestParseTreeDiffs(t *testing.T) {
	h := strings.Repeat("1", 40)
	z := strings.Repeat("0", 40)
	entry := func(status, mode, p string) string {
		return ":000000 " + mode + " " + z + " " + h + " " + status + "\x00" + p + "\x00"
	}
	out := h + " " + h + "\n" +
		h + " " + h + "\n" + entry("A", "100644", "untracked") + entry("M", "100644", "a\nb "+h) +
		h + " " + h + "\n" + entry("A", "160000", "vendor/lib") + entry("D", "100644", "gone/x")
	got, err := parseTreeDiffs([]byte(out), 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(got[0]) != 0 || len(got[1]) != 2 || got[1][1].Path != sandboxtool.Name("a\nb "+h) || got[2][0].NewMode != "160000" || got[2][1].Status != "D" {
		t.Fatalf("changes %+v", got)
	}
	for _, cut := range []int{len(out) - 5, 30} {
		if _, err := parseTreeDiffs([]byte(out[:cut]), 3); err == nil {
			t.Errorf("truncated at %d: no error", cut)
		}
	}
}

// Nothing is unpacked through a symbolic link; a link or file in the way
// of an entry is replaced.
func TestExtractRefusesLinks(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "replaced")); err != nil {
		t.Fatal(err)
	}
	tarball := func(hdrs ...*tar.Header) *bytes.Buffer {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range hdrs {
			tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg {
				tw.Write(make([]byte, h.Size))
			}
		}
		tw.Close()
		return &b
	}
	err := extract(tarball(&tar.Header{Name: "out/escape", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}), root)
	if err == nil || !strings.Contains(err.Error(), "unsafe path") {
		t.Fatalf("through a link: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(outside, "escape")); err == nil {
		t.Fatal("a file escaped")
	}
	if err := extract(tarball(&tar.Header{Name: "replaced", Typeflag: tar.TypeReg, Size: 3, Mode: 0o600},
		&tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o750}), root); err != nil {
		t.Fatal(err)
	}
	st, err := os.Lstat(filepath.Join(root, "replaced"))
	if err != nil || !st.Mode().IsRegular() || st.Size() != 3 || st.Mode().Perm() != 0o600 {
		t.Errorf("replaced: %v %v", st, err)
	}
	if st, err := os.Stat(filepath.Join(root, "d")); err != nil || st.Mode().Perm() != 0o750 {
		t.Errorf("dir: %v %v", st, err)
	}
}

// hangar-agent, by argv[0]: ask records the question, artifact copies
// files back, under $HOME/.hangar-agent.
func TestAgent(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	work := t.TempDir()
	t.Chdir(work)
	if err := os.WriteFile("report.md", []byte("# done\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runTool(t, []string{"/x/bin/hangar-agent", "ask", "which", "db?"}, "")
	if b, err := os.ReadFile(filepath.Join(home, ".hangar-agent", "question")); code != 0 || err != nil || string(b) != "which db?" || !strings.Contains(out, "question is recorded") {
		t.Errorf("ask: %d %q %q %v", code, out, b, err)
	}
	code, out, _ = runTool(t, []string{"hangar-sandbox", "agent", "artifact", "report.md"}, "")
	if b, err := os.ReadFile(filepath.Join(home, ".hangar-agent", "artifacts", "report.md")); code != 0 || err != nil || string(b) != "# done\n" || !strings.Contains(out, "handed back report.md") {
		t.Errorf("artifact: %d %q %q %v", code, out, b, err)
	}
	if code, _, errOut := runTool(t, []string{"hangar-agent", "artifact", "missing"}, ""); code != 1 || !strings.Contains(errOut, "missing is not a file") {
		t.Errorf("missing artifact: %d %q", code, errOut)
	}
	if code, _, _ := runTool(t, []string{"hangar-agent"}, ""); code != 2 {
		t.Errorf("no command: %d", code)
	}
}
