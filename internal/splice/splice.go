// Package splice joins two TCP connections both ways, as the edge's TLS passthrough and
// the egress proxy do once they have decided where a connection goes.
package splice

import (
	"io"
	"net"
)

// Join copies a to b and b to a until both directions have ended. Each direction passes
// its end on as a half-close (FIN), so the other can still finish; an error in either (a
// reset, a closed peer) closes both connections. Between two *net.TCPConn the copies use
// splice(2): the payload stays in the kernel.
func Join(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		half(b, a)
		close(done)
	}()
	half(a, b)
	<-done
}

// half copies src to dst until src ends, then half-closes dst.
func half(dst, src net.Conn) {
	if _, err := io.Copy(dst, src); err != nil {
		_ = dst.Close()
		_ = src.Close()
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		_ = dst.Close()
	}
}
