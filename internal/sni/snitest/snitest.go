// Package snitest makes real TLS ClientHellos for tests of what reads them (the edge's
// router, the egress proxy, the sni parser).
package snitest

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
)

// ClientHello returns the first TLS record crypto/tls sends as a client with cfg: a
// ClientHello in one record.
func ClientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() { _ = tls.Client(a, cfg).Handshake() }()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, 5+(int(hdr[3])<<8|int(hdr[4])))
	copy(rec, hdr)
	if _, err := io.ReadFull(b, rec[5:]); err != nil {
		t.Fatal(err)
	}
	return rec
}
