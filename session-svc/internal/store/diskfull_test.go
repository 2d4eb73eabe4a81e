package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// TestDiskFullIsENOSPC: on a full disk, a write to the SQLite store fails
// with syscall.ENOSPC in its chain (the RPC edge then says "no space left
// on the data volume"), not as an anonymous database error.
func TestDiskFullIsENOSPC(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("the full-disk test mounts a small tmpfs, which needs root; run it as root (CI does)")
	}
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size=2m,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v)", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, 0) })
	ctx := context.Background()
	st, err := store.Open(ctx, store.Options{SQLitePath: filepath.Join(dir, "sessions.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Fill what is left.
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()
	var last error
	for i := range 200 {
		last = st.CreateSession(ctx, &store.Session{Name: fmt.Sprintf("s%d", i), Environment: "local", Harness: "claude",
			Branch: "b", State: store.StateIdle, StateReason: string(make([]byte, 4096))})
		if last != nil {
			break
		}
	}
	if !errors.Is(last, syscall.ENOSPC) {
		t.Fatalf("write on a full disk: %v, want ENOSPC in the chain", last)
	}
}
