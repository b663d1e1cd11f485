package edge

import (
	"net"
	"sync"
	"sync/atomic"
)

// States of a connection the HTTP/1.1 fast path serves (conn.state), for Shutdown: it
// closes idle connections at once and leaves the others to finish their request. A
// connection that has not had its first request yet stays stateNew, as net/http spares
// new connections: its client is about to send on it.
const (
	stateNew int32 = iota
	stateActive
	stateIdle
	stateClosing
)

// conn is an accepted connection. It holds one of the edge's connection slots until
// closed, stays in the edge's set (so Close reaches hijacked and spliced connections,
// which net/http no longer tracks), and replays the ClientHello bytes the router read
// before reading on.
type conn struct {
	net.Conn
	edge    *Edge
	pending []byte
	once    sync.Once
	state   atomic.Int32 // HTTP/1.1 fast path only; see stateNew
}

func (c *conn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

func (c *conn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		err = c.Conn.Close()
		c.edge.untrack(c)
	})
	return err
}

// queue is the net.Listener the edge's http.Server serves: connections the router
// decided to terminate are handed over through it.
type queue struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
	addr net.Addr
}

func newQueue() *queue {
	return &queue{ch: make(chan net.Conn), done: make(chan struct{}), addr: &net.TCPAddr{IP: net.IPv4zero}}
}

func (q *queue) Accept() (net.Conn, error) {
	select {
	case c := <-q.ch:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

// deliver hands c to the server; false once the queue is closed.
func (q *queue) deliver(c net.Conn) bool {
	select {
	case q.ch <- c:
		return true
	case <-q.done:
		return false
	}
}

func (q *queue) Close() error {
	q.once.Do(func() { close(q.done) })
	return nil
}

func (q *queue) Addr() net.Addr { return q.addr }

// replayConn is a terminated connection the HTTP/1.1 fast path hands to net/http: its
// reads start with the bytes the fast path had already read (pending).
type replayConn struct {
	net.Conn // the *tls.Conn
	pending  []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
