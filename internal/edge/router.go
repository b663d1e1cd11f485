package edge

import (
	"crypto/tls"
	"errors"
	"io"
	"time"

	"github.com/sandboxd/sandboxd/internal/sni"
)

// alertUnrecognizedName is a fatal TLS alert record unrecognized_name(112) (RFC 6066 §3).
var alertUnrecognizedName = []byte{21, 3, 3, 0, 2, 2, 112}

// route reads c's ClientHello and sends c on: spliced to a passthrough backend, handed
// to the HTTP server to be terminated, or refused.
func (e *Edge) route(c *conn) {
	_ = c.SetReadDeadline(time.Now().Add(e.cfg.HandshakeTimeout))
	raw, name, err := sni.Read(c.Conn)
	if err != nil {
		if !errors.Is(err, io.EOF) { // EOF: a port probe or health check, not worth a line
			e.log.Debug("no ClientHello", "remote", c.RemoteAddr(), "err", err)
		}
		_ = c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	label, ok := endpointLabel(name, e.cfg.RunnerID, e.cfg.BaseDomain)
	if !ok {
		e.log.Debug("refused server name", "remote", c.RemoteAddr(), "sni", name)
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(alertUnrecognizedName)
		_ = c.Close()
		return
	}
	if id, port, ok := parseLabel(label); ok {
		if r, ok := e.cfg.Routes.Lookup(id, port); ok && r.Kind == KindPassthrough {
			e.passthrough(c, raw, r)
			return
		}
	}
	// An HTTPS route, or a name under the wildcard without one: the HTTP handler answers
	// both, the latter with the one 404 that does not tell which sandboxes exist.
	c.pending = raw
	tc := tls.Server(c, e.tls)
	_ = c.SetDeadline(time.Now().Add(e.cfg.HandshakeTimeout))
	if err := tc.Handshake(); err != nil {
		e.log.Debug("TLS handshake failed", "remote", c.RemoteAddr(), "err", err)
		_ = c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	if tc.ConnectionState().NegotiatedProtocol == "h2" {
		if !e.q.deliver(tc) {
			_ = c.Close()
		}
		return
	}
	e.serveH1(c, tc) // HTTP/1.1 (ALPN http/1.1, or none)
}
