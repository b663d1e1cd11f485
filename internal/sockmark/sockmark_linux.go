//go:build linux

package sockmark

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// Control returns a net.Dialer.Control that sets SO_MARK to mark on each socket before
// it connects (which needs CAP_NET_ADMIN), or nil for mark 0 (no mark).
func Control(mark uint32) func(network, address string, c syscall.RawConn) error {
	if mark == 0 {
		return nil
	}
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			// The kernel reads the value as a u32; int32 keeps marks above 1<<31 intact.
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(int32(mark)))
		}); err != nil {
			return fmt.Errorf("sockmark: %w", err)
		}
		if serr != nil {
			return fmt.Errorf("sockmark: set SO_MARK %#x: %w", mark, serr)
		}
		return nil
	}
}
