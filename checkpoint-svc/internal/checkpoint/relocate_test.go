package checkpoint_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
)

// TestRestoreRelocatesConversation restores a checkpoint's conversation
// files into another sandbox's home (a fork's), leaving the captured
// sandbox's home untouched.
func TestRestoreRelocatesConversation(t *testing.T) {
	w := newWorld(t)
	work, home := w.sandbox()
	conv := filepath.Join(home, ".claude", "projects", "-work")
	if err := os.MkdirAll(filepath.Join(conv, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"c1.jsonl": "turn one\n", "sub/notes": "n\n"} {
		if err := os.WriteFile(filepath.Join(conv, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	res := w.capture("s1", work, conv)

	// The captured sandbox moves on after the checkpoint.
	if err := os.WriteFile(filepath.Join(conv, "c1.jsonl"), []byte("turn one\nturn two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	work2, home2 := w.sandbox()
	target := filepath.Join(home2, ".claude", "projects", "-fork-work")
	_, _, err := w.eng.Restore(context.Background(), &checkpointv1.RestoreCheckpointRequest{
		CheckpointId: res.Checkpoint.GetId(), SandboxId: "sb2", WorkDir: work2, Branch: "hangar/session/s1-fork-1",
		Relocate: []*checkpointv1.PathRewrite{{From: conv, To: target}},
	})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	for name, want := range map[string]string{"c1.jsonl": "turn one\n", "sub/notes": "n\n"} {
		got, err := os.ReadFile(filepath.Join(target, name))
		if err != nil || string(got) != want {
			t.Errorf("relocated %s = %q, %v; want %q", name, got, err, want)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(conv, "c1.jsonl")); string(got) != "turn one\nturn two\n" {
		t.Errorf("the captured sandbox's conversation was overwritten: %q", got)
	}

	// A rewrite of a path the checkpoint did not capture is refused.
	_, _, err = w.eng.Restore(context.Background(), &checkpointv1.RestoreCheckpointRequest{
		CheckpointId: res.Checkpoint.GetId(), SandboxId: "sb2", WorkDir: work2,
		Relocate: []*checkpointv1.PathRewrite{{From: filepath.Join(home, "elsewhere"), To: target}},
	})
	if err == nil || !strings.Contains(err.Error(), "relocate.from") {
		t.Errorf("restore with an unknown relocate.from: %v", err)
	}
}
