//go:build linux

package network

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// createNetNS (tests: namespaces of their own, outside a Manager) creates a new
// network namespace and bind-mounts it on path (which
// must not exist). The namespace is created on a dedicated OS thread that is
// never handed back to the Go scheduler: the goroutine exits while still locked,
// so the runtime discards the thread instead of reusing it in the wrong netns.
func createNetNS(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	f.Close()

	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread() // still in the original namespace
			errc <- fmt.Errorf("unshare netns: %w", err)
			return
		}
		src := "/proc/self/task/" + strconv.Itoa(unix.Gettid()) + "/ns/net"
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind-mount netns on %s: %w", path, err)
			return
		}
		errc <- nil
		// No UnlockOSThread: the thread ends with this goroutine.
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// deleteNetNS lazily unmounts and removes a netns file; missing or unmounted
// files are fine. The namespace itself goes away with its last reference
// (processes inside it, open fds).
func deleteNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns file: %w", err)
	}
	return nil
}
