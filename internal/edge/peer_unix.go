//go:build unix

package edge

import (
	"net"
	"syscall"
)

// peerProbe reports whether an idle connection has neither been closed by its peer nor
// received anything: a non-blocking peek at the socket, one system call. The raw
// connection and the callback are made once per connection (init), so that a probe
// before every reuse allocates nothing.
type peerProbe struct {
	rc     syscall.RawConn // nil: cannot probe, assume open
	peek   func(fd uintptr) bool
	isOpen bool
}

func (p *peerProbe) init(c net.Conn) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	p.rc = rc
	p.peek = func(fd uintptr) bool {
		var b [1]byte
		_, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// EAGAIN: nothing to read, the connection is as it was. Data (an idle HTTP
		// connection has none to expect), EOF or an error: do not use it.
		p.isOpen = rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK
		return true
	}
}

func (p *peerProbe) open() bool {
	if p.rc == nil {
		return true
	}
	p.isOpen = false
	err := p.rc.Read(p.peek)
	return err == nil && p.isOpen
}
