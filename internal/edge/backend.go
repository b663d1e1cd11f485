package edge

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"sync"
	"time"
)

// The HTTP/1.1 fast path's connections to sandbox ports: plain HTTP/1.1 with keep-alive,
// kept idle per backend address between requests.
const (
	maxIdlePerBackend  = 256              // as the net/http path's MaxIdleConnsPerHost
	backendIdleTimeout = 90 * time.Second // as the net/http path's IdleConnTimeout
)

// backendConn is a connection to a sandbox port with its buffers.
type backendConn struct {
	net.Conn
	br        *bufio.Reader
	bw        *bufio.Writer
	idleSince time.Time
	peer      peerProbe // made once per connection: no allocation per probe
}

// backendPool holds idle backendConns by address. Most recently used first out: the
// others age and get closed.
type backendPool struct {
	mu     sync.Mutex
	idle   map[netip.AddrPort][]*backendConn
	closed bool
}

// get returns an idle connection to addr that still looks open, or nil.
func (p *backendPool) get(addr netip.AddrPort) *backendConn {
	now := time.Now()
	for {
		p.mu.Lock()
		l := p.idle[addr]
		if len(l) == 0 {
			p.mu.Unlock()
			return nil
		}
		bc := l[len(l)-1]
		l[len(l)-1] = nil
		if len(l) == 1 {
			delete(p.idle, addr)
		} else {
			p.idle[addr] = l[:len(l)-1]
		}
		p.mu.Unlock()
		idle := now.Sub(bc.idleSince)
		// Every connection is checked before it is used again, one system call: servers
		// close idle keep-alive connections after seconds (Node 5 s, uvicorn 5 s,
		// gunicorn 2 s), and a request sent on such a connection fails (one with a body
		// or a method that is not idempotent cannot be retried); and a connection that
		// received anything while idle is out of step with its requests — what it
		// received would be taken for the next client's response.
		if idle < backendIdleTimeout && bc.peer.open() {
			return bc
		}
		_ = bc.Close()
	}
}

// put keeps bc for the next request to addr, or closes it if there are enough.
func (p *backendPool) put(addr netip.AddrPort, bc *backendConn) {
	bc.idleSince = time.Now()
	p.mu.Lock()
	if p.closed || len(p.idle[addr]) >= maxIdlePerBackend {
		p.mu.Unlock()
		_ = bc.Close()
		return
	}
	if p.idle == nil {
		p.idle = make(map[netip.AddrPort][]*backendConn)
	}
	p.idle[addr] = append(p.idle[addr], bc)
	p.mu.Unlock()
}

// reap closes the connections idle for longer than backendIdleTimeout.
func (p *backendPool) reap(now time.Time) {
	var old []*backendConn
	p.mu.Lock()
	for addr, l := range p.idle {
		i := 0 // l is oldest first
		for i < len(l) && now.Sub(l[i].idleSince) >= backendIdleTimeout {
			i++
		}
		if i == 0 {
			continue
		}
		old = append(old, l[:i]...)
		if i == len(l) {
			delete(p.idle, addr)
		} else {
			p.idle[addr] = append(l[:0:0], l[i:]...)
		}
	}
	p.mu.Unlock()
	for _, bc := range old {
		_ = bc.Close()
	}
}

// close closes every idle connection and the ones put back from now on.
func (p *backendPool) close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, l := range idle {
		for _, bc := range l {
			_ = bc.Close()
		}
	}
}

// reapIdleBackends runs until the edge closes.
func (e *Edge) reapIdleBackends() {
	t := time.NewTicker(backendIdleTimeout / 3)
	defer t.Stop()
	for {
		select {
		case now := <-t.C:
			e.backends.reap(now)
		case <-e.done:
			e.backends.close()
			return
		}
	}
}

// backendConn returns a connection to addr: an idle one if there is one (reused true)
// and fresh is false, else a new one.
func (e *Edge) backendConn(addr netip.AddrPort, fresh bool) (bc *backendConn, reused bool, err error) {
	if !fresh {
		if bc := e.backends.get(addr); bc != nil {
			return bc, true, nil
		}
	}
	c, err := e.dialer.DialContext(context.Background(), "tcp", addr.String())
	if err != nil {
		return nil, false, err
	}
	bc = &backendConn{Conn: c, br: bufio.NewReaderSize(c, 16<<10), bw: bufio.NewWriterSize(c, 4<<10)}
	bc.peer.init(c)
	return bc, false, nil
}
