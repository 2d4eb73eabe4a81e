package checkpoint

import (
	"slices"
	"strings"
	"testing"
)

func TestParseProbeChanges(t *testing.T) {
	h, i, w := "1111111111111111111111111111111111111111", "2222222222222222222222222222222222222222", "3333333333333333333333333333333333333333"
	z := "0000000000000000000000000000000000000000"
	entry := func(status, mode, p string) string {
		return ":000000 " + mode + " " + z + " " + h + " " + status + "\x00" + p + "\x00"
	}
	out := "head " + h + "\nbase " + h + "\ngitdir /w/.git\n" +
		"ref " + h + " refs/heads/main  \nref " + h + " refs/heads/hangar/s *\n" +
		"itree " + i + "\ntree " + w + "\nchanges\n" +
		h + " " + i + "\n" + // HI: nothing
		h + " " + w + "\n" + entry("A", "100644", "untracked") + entry("M", "100644", "a\nb "+h) +
		i + " " + w + "\n" + entry("A", "160000", "vendor/lib") + entry("D", "100644", "gone/x") + entry("A", "100644", "planned") +
		"\x00untracked\x00" + "emptydir/\x00untracked\x00" +
		"/ita\x00" + "100644 e69de29bb2d1d6434b8b29ae775ad8c2e48c5391 0\tplanned\x00" + "100644 e69de29bb2d1d6434b8b29ae775ad8c2e48c5391 0\ta\tb\x00"
	pr, err := parseProbe([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if pr.branch != "hangar/s" || len(pr.refs) != 2 || pr.tree != w || pr.itree != i {
		t.Fatalf("probe %+v", pr)
	}
	if len(pr.changes["HI"]) != 0 || len(pr.changes["HW"]) != 2 || pr.changes["HW"][1].path != "a\nb "+h ||
		pr.changes["IW"][0].newMode != "160000" || pr.changes["IW"][1].status != "D" {
		t.Fatalf("changes %+v", pr.changes)
	}
	if !slices.Equal(pr.untracked, []string{"emptydir/", "untracked"}) {
		t.Fatalf("untracked %q", pr.untracked)
	}
	if !slices.Equal(pr.emptyBlobs, []string{"planned", "a\tb"}) {
		t.Fatalf("empty-blob entries %q", pr.emptyBlobs)
	}
	// The work tree's tree adds "planned" to the index's, not "a\tb" (a
	// staged empty file): only it is intent to add.
	if got := intentToAdd(pr); len(got) != 1 || string(got[0]) != "planned" {
		t.Fatalf("intent to add %q", got)
	}
	marker := strings.Index(out, "\x00untracked\x00")
	for _, cut := range []int{marker - 10, marker - 20} {
		if _, err := parseProbe([]byte(out[:cut])); err == nil {
			t.Errorf("truncated at %d: no error", cut)
		}
	}
}
