package edge

import (
	"context"
	"io"
	"net"
)

// passthrough connects to r's backend, replays the ClientHello bytes already read, and
// splices the connections both ways. Between two *net.TCPConn, io.Copy uses splice(2),
// so the payload does not pass through user space.
func (e *Edge) passthrough(c *conn, hello []byte, r Route) {
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.DialTimeout)
	b, err := e.dialer.DialContext(ctx, "tcp", r.Backend.String())
	cancel()
	if err != nil {
		e.log.Info("passthrough: sandbox port unreachable", "sandbox", r.SandboxID, "port", r.Port, "err", err)
		return
	}
	defer b.Close()
	if _, err := b.Write(hello); err != nil {
		e.log.Info("passthrough: write ClientHello", "sandbox", r.SandboxID, "port", r.Port, "err", err)
		return
	}
	done := make(chan struct{})
	go func() {
		pipe(b, c.Conn)
		close(done)
	}()
	pipe(c.Conn, b)
	<-done
}

// pipe copies src to dst until src ends, then passes the half-close on (FIN) so the
// other direction can still finish. An error (a reset, a closed peer) ends both directions.
func pipe(dst, src net.Conn) {
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
