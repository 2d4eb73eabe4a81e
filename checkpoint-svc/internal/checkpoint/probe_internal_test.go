package checkpoint

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool"
)

const (
	hHead  = "1111111111111111111111111111111111111111"
	hITree = "2222222222222222222222222222222222222222"
	hTree  = "3333333333333333333333333333333333333333"
	hBase  = "4444444444444444444444444444444444444444"
	hPrev  = "5555555555555555555555555555555555555555"
)

// describe renders a plan's steps as "KIND: command args; ..." lines.
func describe(p capturePlan) []string {
	var out []string
	for _, st := range p.steps {
		var calls []string
		for _, c := range st.calls {
			switch r := c.req.(type) {
			case sandboxtool.DiffRequest:
				d := "diff"
				if r.Cached {
					d += " --cached"
				}
				d += " " + strings.Join(r.Revs, " ")
				if r.Paths != nil {
					d += fmt.Sprintf(" -- %q", r.Paths)
				}
				calls = append(calls, d)
			case sandboxtool.BundleRequest:
				calls = append(calls, fmt.Sprintf("bundle %v ^%v", r.Positive, r.Exclude))
			case sandboxtool.UntrackedRequest:
				if r.Scan {
					calls = append(calls, "untracked scan")
				} else {
					calls = append(calls, fmt.Sprintf("untracked files=%q emptied=%q repos=%q dirs=%q", r.Files, r.Emptied, r.Repos, r.Dirs))
				}
			case sandboxtool.ArchiveRequest:
				calls = append(calls, fmt.Sprintf("archive %v", r.Paths))
			default:
				calls = append(calls, c.command)
			}
		}
		out = append(out, partName(st.kind)+": "+strings.Join(calls, "; "))
	}
	return out
}

func prevManifest(head string, bundles int, refs ...ref) *manifest {
	cp := &checkpointv1.Checkpoint{Id: "s-prev", BaseCommit: hBase, HeadCommit: head}
	for range bundles {
		cp.Parts = append(cp.Parts, &checkpointv1.Part{Kind: checkpointv1.PartKind_PART_KIND_BUNDLE, Sha256: "b"})
	}
	return &manifest{cp: cp, Refs: refs}
}

func TestPlanCapture(t *testing.T) {
	main := ref{Name: "main", Commit: hHead}
	clean := probe{head: hHead, base: hBase, tree: hTree, itree: hITree, refs: []ref{main}, changes: map[string][]change{}}
	edited := clean
	edited.changes = map[string][]change{
		"HI": {{"000000", "D", "staged-gone"}},
		"HW": {{"100644", "M", "src/a.go"}, {"100644", "A", "new.txt"}, {"000000", "D", "old/x"}},
		"IW": {{"100644", "A", "new.txt"}, {"160000", "A", "vendor/lib"}, {"000000", "D", "old/x"}, {"100644", "A", "staged-gone"}},
	}
	edited.untracked = []string{"new.txt", "vendor/lib/", "emptydir/"}
	unmerged := clean
	unmerged.itree, unmerged.changes = "-", nil
	var huge []change
	for i := range 3000 {
		huge = append(huge, change{"100644", "M", fmt.Sprintf("%0100d", i)})
	}
	big := clean
	big.changes = map[string][]change{"HW": huge}

	cases := []struct {
		name string
		pr   probe
		prev *manifest
		conv []string
		want []string
		// wantPrev is the checkpoint the bundle builds on.
		wantPrev  string
		wantChain int
	}{{
		name: "first capture, nothing changed",
		pr:   clean,
		want: []string{
			"bundle: bundle [HEAD refs/heads/main] ^[" + hBase + "]",
			"diff: ", "index: ",
			`untracked: untracked files=[] emptied=[] repos=[] dirs=[]`,
			"patch: diff " + hBase + " " + hTree,
		},
	}, {
		name: "edits, untracked files and repositories, conversation",
		pr:   edited,
		conv: []string{"/home/u/.claude/projects/x"},
		want: []string{
			"bundle: bundle [HEAD refs/heads/main] ^[" + hBase + "]",
			`diff: diff ` + hHead + " " + hTree + ` -- ["src/a.go" "old/x"]; diff ` + hHead + " " + hITree + ` -- ["staged-gone"]`,
			"index: diff " + hHead + " " + hITree,
			`untracked: untracked files=["new.txt" "staged-gone"] emptied=["old"] repos=["vendor/lib"] dirs=["emptydir"]`,
			"patch: diff " + hBase + " " + hTree,
			"conversation: archive [/home/u/.claude/projects/x]",
		},
	}, {
		name: "the chain goes on with HEAD and branches where they were: no bundle",
		pr:   clean, prev: prevManifest(hHead, 2, main),
		want: []string{
			"diff: ", "index: ",
			`untracked: untracked files=[] emptied=[] repos=[] dirs=[]`,
			"patch: diff " + hBase + " " + hTree,
		},
		wantPrev: "s-prev", wantChain: 2,
	}, {
		name: "new commits on the chain: a bundle of what the previous lacks",
		pr:   func() probe { p := clean; p.ancestor = true; return p }(), prev: prevManifest(hPrev, 1, ref{Name: "main", Commit: hPrev}),
		want: []string{
			"bundle: bundle [HEAD refs/heads/main] ^[" + hBase + " " + hPrev + " " + hPrev + "]",
			"diff: ", "index: ",
			`untracked: untracked files=[] emptied=[] repos=[] dirs=[]`,
			"patch: diff " + hBase + " " + hTree,
		},
		wantPrev: "s-prev", wantChain: 1,
	}, {
		name: "history rewritten: the chain starts again",
		pr:   clean, prev: prevManifest(hPrev, 1, ref{Name: "main", Commit: hPrev}),
		want: []string{
			"bundle: bundle [HEAD refs/heads/main] ^[" + hBase + "]",
			"diff: ", "index: ",
			`untracked: untracked files=[] emptied=[] repos=[] dirs=[]`,
			"patch: diff " + hBase + " " + hTree,
		},
	}, {
		name: "the chain is full: it starts again",
		pr:   clean, prev: prevManifest(hHead, maxChain, main),
		want: []string{
			"bundle: bundle [HEAD refs/heads/main] ^[" + hBase + "]",
			"diff: ", "index: ",
			`untracked: untracked files=[] emptied=[] repos=[] dirs=[]`,
			"patch: diff " + hBase + " " + hTree,
		},
	}, {
		name: "no index tree (unmerged entries): diffs over the index and the work tree",
		pr:   unmerged,
		want: []string{
			"bundle: bundle [HEAD refs/heads/main] ^[" + hBase + "]",
			"diff: diff HEAD", "index: diff --cached HEAD", "untracked: untracked scan",
			"patch: diff " + hBase + " " + hTree,
		},
	}, {
		name: "too many paths for a command line: the work tree's diff whole",
		pr:   big,
		want: []string{
			"bundle: bundle [HEAD refs/heads/main] ^[" + hBase + "]",
			"diff: diff HEAD", "index: ",
			`untracked: untracked files=[] emptied=[] repos=[] dirs=[]`,
			"patch: diff " + hBase + " " + hTree,
		},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			plan := planCapture(c.pr, c.prev, "/w", c.conv, planLimits{part: 100, untracked: 10})
			if got := describe(plan); !slices.Equal(got, c.want) {
				t.Errorf("plan:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(c.want, "\n  "))
			}
			if plan.prevID != c.wantPrev || len(plan.chain) != c.wantChain {
				t.Errorf("builds on %q with %d bundles, want %q with %d", plan.prevID, len(plan.chain), c.wantPrev, c.wantChain)
			}
			for _, st := range plan.steps {
				want := int64(100)
				if st.kind == checkpointv1.PartKind_PART_KIND_UNTRACKED {
					want = 10
				}
				if st.limit != want {
					t.Errorf("%s limit %d, want %d", partName(st.kind), st.limit, want)
				}
			}
		})
	}
}

func TestIntentToAdd(t *testing.T) {
	pr := probe{
		changes:    map[string][]change{"IW": {{"100644", "A", "planned"}, {"100644", "A", "other"}}},
		emptyBlobs: []string{"planned", "a\tb"},
	}
	// The work tree's tree adds "planned" to the index's, not "a\tb" (a
	// staged empty file): only it is intent to add.
	if got := intentToAdd(pr); len(got) != 1 || string(got[0]) != "planned" {
		t.Fatalf("intent to add %q", got)
	}
}
