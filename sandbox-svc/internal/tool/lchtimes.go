package tool

import (
	"time"

	"golang.org/x/sys/unix"
)

// lchtimes sets a file's (or a symbolic link's own) access and
// modification times.
func lchtimes(p string, t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}
