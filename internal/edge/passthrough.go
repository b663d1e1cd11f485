package edge

import (
	"context"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
	"github.com/sandboxd/sandboxd/internal/splice"
)

// passthrough connects to r's backend, replays the ClientHello bytes already read, and
// splices the connections both ways. Between two *net.TCPConn, io.Copy uses splice(2),
// so the payload does not pass through user space; the bytes each way (the ClientHello
// included) are counted as they pass (cwsandbox_edge_bytes_total).
func (e *Edge) passthrough(c *conn, hello []byte, r Route) {
	defer func() { _ = c.Close() }()
	r, done, err := e.wake(context.Background(), r)
	if err != nil {
		counters.EdgePassthrough(false)
		return
	}
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.DialTimeout)
	b, err := e.dialer.DialContext(ctx, "tcp", r.Backend.String())
	cancel()
	if err != nil {
		counters.EdgePassthrough(false)
		e.log.Info("passthrough: sandbox port unreachable", "sandbox", r.SandboxID, "port", r.Port, "err", err)
		return
	}
	defer b.Close()
	counters.EdgePassthrough(true)
	n, err := b.Write(hello)
	counters.EdgePassthroughIn.Add(int64(n))
	if err != nil {
		e.log.Info("passthrough: write ClientHello", "sandbox", r.SandboxID, "port", r.Port, "err", err)
		return
	}
	splice.JoinCounted(c.Conn, b, counters.EdgePassthroughIn, counters.EdgePassthroughOut)
}
