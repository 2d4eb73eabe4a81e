package local

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// netNS is a network namespace held by an open file descriptor (it lives as
// long as the descriptor or a process inside it does). Its loopback is up;
// it has no other interface, so any non-loopback connect fails at once.
type netNS struct {
	fd int
}

// onThread runs fn on a fresh locked OS thread. fn reports whether the
// thread is back in its original namespace; if not, the thread stays locked
// and the runtime discards it when the goroutine ends, so no goroutine ever
// runs in the wrong namespace by accident.
func onThread(fn func() (restored bool, err error)) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restored, err := fn()
		if restored {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

func openCurrentNetNS() (int, error) {
	return unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
}

// newNetNS creates a namespace with loopback up, without changing the
// process's own.
func newNetNS() (*netNS, error) {
	var ns *netNS
	err := onThread(func() (bool, error) {
		orig, err := openCurrentNetNS()
		if err != nil {
			return true, fmt.Errorf("open current netns: %w", err)
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return true, fmt.Errorf("unshare net: %w", err)
		}
		fd, openErr := openCurrentNetNS()
		var upErr error
		if openErr == nil {
			upErr = loopbackUp()
		}
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			if openErr == nil {
				unix.Close(fd)
			}
			return false, fmt.Errorf("restore netns: %w", err)
		}
		switch {
		case openErr != nil:
			return true, fmt.Errorf("open new netns: %w", openErr)
		case upErr != nil:
			unix.Close(fd)
			return true, fmt.Errorf("loopback up: %w", upErr)
		}
		ns = &netNS{fd: fd}
		return true, nil
	})
	return ns, err
}

func loopbackUp() error {
	sock, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(sock)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(sock, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(sock, unix.SIOCSIFFLAGS, ifr)
}

// Do runs fn with the calling thread inside the namespace. Sockets created
// and processes started in fn belong to it for life.
func (n *netNS) Do(fn func() error) error {
	var fnErr error
	err := onThread(func() (bool, error) {
		orig, err := openCurrentNetNS()
		if err != nil {
			return true, fmt.Errorf("open current netns: %w", err)
		}
		defer unix.Close(orig)
		if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
			return true, fmt.Errorf("enter netns: %w", err)
		}
		fnErr = fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			return false, fmt.Errorf("restore netns: %w", err)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	return fnErr
}

func (n *netNS) Close() error {
	return unix.Close(n.fd)
}
