package checkpoint_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hangar-dev/hangar/checkpoint-svc/internal/checkpoint"
	"github.com/hangar-dev/hangar/platform/blob"
	"github.com/hangar-dev/hangar/platform/fault"
)

// manifestKeyOf is the store key of checkpoint id's manifest.
func manifestKeyOf(id string) string {
	i := strings.LastIndexByte(id, '~')
	return "checkpoints/" + id[:i] + "/" + id[i+1:]
}

// captures makes n checkpoints of session, each with a different file.
func (w *world) captures(session string, n int) []string {
	w.t.Helper()
	work, _ := w.sandbox()
	var ids []string
	for i := range n {
		write(w.t, work, "f.txt", fmt.Sprintf("%s %d\n", session, i), 0o644)
		ids = append(ids, w.capture(session, work).Checkpoint.GetId())
	}
	return ids
}

func flipLastByte(b []byte) []byte { b = bytes.Clone(b); b[len(b)-3] ^= 1; return b }

// TestDamageStaysWithItsCheckpoint: one damaged manifest shows as damaged
// in its session's list, hides none of the intact ones, and stops neither
// the collection of unused data nor another session's archive.
func TestDamageStaysWithItsCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, damage := range []string{"flipped byte", "truncated", "garbage"} {
		t.Run(damage, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			ids := w.captures("s1", 3)
			other := w.captures("s2", 2)
			rewrite(t, w.store, manifestKeyOf(ids[1]), func(b []byte) []byte {
				switch damage {
				case "truncated":
					return b[:len(b)/2]
				case "garbage":
					return []byte("not a manifest")
				}
				return flipLastByte(b)
			})

			list, _, err := w.eng.List(ctx, "s1", 0, 0)
			if err != nil || len(list) != 3 {
				t.Fatalf("list: %d entries, %v", len(list), err)
			}
			for i, cp := range list {
				id := ids[2-i]
				if cp.GetId() != id || cp.GetSession() != "s1" || cp.GetCreatedAt() == nil {
					t.Fatalf("list[%d] = %s %s %v, want %s", i, cp.GetId(), cp.GetSession(), cp.GetCreatedAt(), id)
				}
				if wantDamaged := id == ids[1]; wantDamaged != (cp.GetDamaged() != "") || wantDamaged != (cp.GetTreeHash() == "") {
					t.Fatalf("list[%d] %s: damaged %q tree %q", i, id, cp.GetDamaged(), cp.GetTreeHash())
				}
			}
			if _, err := w.eng.Get(ctx, ids[1]); reason(err) != checkpoint.ReasonTampered {
				t.Fatalf("get damaged: %v", err)
			}
			// The older intact checkpoint still restores.
			work2, _ := w.sandbox()
			if _, err := w.restore(ids[0], work2, ""); err != nil {
				t.Fatalf("restore the intact older one: %v", err)
			}

			// An unused object is collected in spite of the damage, by
			// another session's archive, which succeeds whole.
			orphan := "objects/ff/ff" + strings.Repeat("0", 62)
			if err := w.store.Put(ctx, orphan, strings.NewReader("unused")); err != nil {
				t.Fatal(err)
			}
			if n, err := w.eng.Archive(ctx, "s2"); err != nil || n != len(other) {
				t.Fatalf("archive s2: %d, %v", n, err)
			}
			if _, err := w.store.Stat(ctx, orphan); !errors.Is(err, blob.ErrNotFound) {
				t.Fatalf("unused object not collected: %v", err)
			}
			// s1's intact checkpoints lost nothing to that collection.
			for _, id := range []string{ids[0], ids[2]} {
				if _, err := w.eng.Verify(ctx, id); err != nil {
					t.Fatalf("verify %s after collection: %v", id, err)
				}
			}
		})
	}
}

// TestCollectKeepsDataOfAnUnknownKey: a manifest sealed with a key the
// service lacks is not damage (the key file may be wrong): nothing is
// collected while it cannot be read.
func TestCollectKeepsDataOfAnUnknownKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t)
	ids := w.captures("s1", 1)
	w.opts.Keys = newKeys(t)
	w.reopen()
	list, _, err := w.eng.List(ctx, "s1", 0, 0)
	if err != nil || len(list) != 1 || list[0].GetDamaged() == "" {
		t.Fatalf("list under another key: %v %v", list, err)
	}
	before := len(objectFiles(t, w.store))
	w.captures("s2", 1)
	if _, err := w.eng.Archive(ctx, "s2"); err != nil {
		t.Fatal(err)
	}
	if got := len(objectFiles(t, w.store)); got < before {
		t.Fatalf("objects %d -> %d: data of %s collected while its key was unknown", before, got, ids[0])
	}
}

// deleteFailingStore fails manifest deletes after a budget of them.
type deleteFailingStore struct {
	blob.Store
	budget atomic.Int64
}

func (d *deleteFailingStore) Delete(ctx context.Context, key string) error {
	if strings.HasPrefix(key, "checkpoints/") && d.budget.Add(-1) < 0 {
		return errors.New("store unreachable")
	}
	return d.Store.Delete(ctx, key)
}

// TestArchiveAllOrNothing: an archive that fails part way keeps the
// newest checkpoints whole (the session can still be restored) and a retry
// finishes it.
func TestArchiveAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t)
	ids := w.captures("s1", 4)
	ds := &deleteFailingStore{Store: w.store}
	ds.budget.Store(2)
	w.opts.Store = ds
	w.reopen()
	n, err := w.eng.Archive(ctx, "s1")
	if err == nil || n != 2 {
		t.Fatalf("archive with failing deletes: %d, %v", n, err)
	}
	list, _, err := w.eng.List(ctx, "s1", 0, 0)
	if err != nil || len(list) != 2 || list[0].GetId() != ids[3] || list[1].GetId() != ids[2] {
		t.Fatalf("after a failed archive: %v %v (want the newest two)", list, err)
	}
	work2, _ := w.sandbox()
	if _, err := w.restore(ids[3], work2, ""); err != nil {
		t.Fatalf("newest after a failed archive: %v", err)
	}
	ds.budget.Store(100)
	if n, err := w.eng.Archive(ctx, "s1"); err != nil || n != 2 {
		t.Fatalf("retry: %d, %v", n, err)
	}
	if n, err := w.eng.Archive(ctx, "s1"); err != nil || n != 0 {
		t.Fatalf("again: %d, %v", n, err)
	}
	if objs := objectFiles(t, w.store); len(objs) != 0 {
		t.Fatalf("%d objects left after archive", len(objs))
	}
}

// TestRestoreNamedCheckpointOnly: a restore of a checkpoint whose manifest
// is gone fails saying which and what can be restored, never restoring
// another one.
func TestRestoreNamedCheckpointOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t)
	ids := w.captures("s1", 3)
	rewrite(t, w.store, manifestKeyOf(ids[1]), flipLastByte)
	if err := w.store.Delete(ctx, manifestKeyOf(ids[2])); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		prepare    func()
		id         string
		wantCode   fault.Kind
		wantReason string
		want       []string
		notWant    []string
	}{
		{
			name: "newest deleted", id: ids[2], wantCode: fault.KindNotFound, wantReason: checkpoint.ReasonMissing,
			want:    []string{ids[2] + " of session s1 is missing", "can be restored from: " + ids[0] + " (turn 1, "},
			notWant: []string{ids[1]},
		},
		{
			name: "damaged", id: ids[1], wantCode: fault.KindFailedPrecondition, wantReason: checkpoint.ReasonTampered,
			want: []string{ids[1] + " is damaged", "can be restored from: " + ids[0]},
		},
		{
			name:    "all gone",
			prepare: func() { _ = w.store.Delete(ctx, manifestKeyOf(ids[0])) },
			id:      ids[2], wantCode: fault.KindNotFound, wantReason: checkpoint.ReasonMissing,
			want: []string{ids[2] + " of session s1 is missing", "session s1 has no other checkpoint that can be restored"},
		},
	}
	for _, tt := range tests {
		if tt.prepare != nil {
			tt.prepare()
		}
		work, _ := w.sandbox()
		head := git(t, work, "rev-parse", "HEAD")
		_, err := w.restore(tt.id, work, "")
		var fe *fault.Error
		if !errors.As(err, &fe) || fe.Kind != tt.wantCode || fe.Reason != tt.wantReason {
			t.Fatalf("%s: err = %v", tt.name, err)
		}
		for _, s := range tt.want {
			if !strings.Contains(fe.Message, s) {
				t.Errorf("%s: message %q lacks %q", tt.name, fe.Message, s)
			}
		}
		for _, s := range tt.notWant {
			if strings.Contains(fe.Message, s) {
				t.Errorf("%s: message %q names %q", tt.name, fe.Message, s)
			}
		}
		if git(t, work, "rev-parse", "HEAD") != head || git(t, work, "status", "--porcelain") != "" {
			t.Fatalf("%s: the work tree was touched", tt.name)
		}
	}
}
