//go:build unix

package edge

import (
	"net"
	"syscall"
)

// peerOpen reports whether an idle connection has neither been closed by its peer nor
// received anything: a non-blocking peek at the socket, one system call.
func peerOpen(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// EAGAIN: nothing to read, the connection is as it was. Data (an idle HTTP
		// connection has none to expect), EOF or an error: do not use it.
		open = rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK
		return true
	})
	return err == nil && open
}
