// Package splice joins two TCP connections both ways, as the edge's TLS passthrough and
// the egress proxy do once they have decided where a connection goes.
package splice

import (
	"errors"
	"io"
	"net"
)

// Join copies a to b and b to a until both directions have ended. Each direction passes
// its end on as a half-close (FIN), so the other can still finish; an error in either (a
// reset, a closed peer) closes both connections. Between two *net.TCPConn the copies use
// splice(2): the payload stays in the kernel.
func Join(a, b net.Conn) { JoinCounted(a, b, nil, nil) }

// Counter takes the bytes a joined direction moved.
type Counter interface{ Add(n int64) }

// Chunk is how many bytes a counted direction copies between two adds to its Counter.
const Chunk = 256 << 10

// JoinCounted is Join that adds the bytes copied a to b to ab and b to a to ba (either
// may be nil): after each Chunk, and at the direction's end before its half-close is
// passed on. The copies still use splice(2): io.CopyN's limit is handed to it.
func JoinCounted(a, b net.Conn, ab, ba Counter) {
	done := make(chan struct{})
	go func() {
		half(a, b, ba)
		close(done)
	}()
	half(b, a, ab)
	<-done
}

// half copies src to dst until src ends, then half-closes dst.
func half(dst, src net.Conn, count Counter) {
	if err := copyCounted(dst, src, count); err != nil {
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

// copyCounted copies src to dst until src's EOF (nil) or an error.
func copyCounted(dst io.Writer, src io.Reader, count Counter) error {
	if count == nil {
		_, err := io.Copy(dst, src)
		return err
	}
	for {
		n, err := io.CopyN(dst, src, Chunk)
		count.Add(n)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
