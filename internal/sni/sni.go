// Package sni reads the server name from a TLS ClientHello without terminating TLS. The
// edge routes inbound connections by it and the egress proxy grants outbound ones by it;
// both replay the bytes read, unchanged, to whoever finishes the handshake.
package sni

import (
	"errors"
	"fmt"
	"io"
)

const (
	recordTypeHandshake   = 22
	handshakeClientHello  = 1
	recordHeaderLen       = 5
	maxRecordPayload      = 1 << 14 // TLSPlaintext.length limit (RFC 8446 §5.1)
	extensionServerName   = 0
	serverNameTypeHost    = 0
	maxServerNameLen      = 253
	maxClientHelloMessage = 16 << 10 // real ones are under 2 KiB, post-quantum key shares included
)

var (
	// ErrNotTLS: the stream does not start with a TLS handshake record.
	ErrNotTLS = errors.New("sni: not a TLS handshake")
	// ErrMalformed: a handshake record, but not a well-formed ClientHello within limits.
	ErrMalformed = errors.New("sni: malformed ClientHello")
)

// Read reads the TLS records that carry the first handshake message, which
// must be a ClientHello, and returns every byte it read (to replay to a backend or to
// crypto/tls) and the server name (SNI, "" if none). It reads nothing past the record
// that completes the message, so the rest of the stream can be spliced untouched.
func Read(r io.Reader) (raw []byte, serverName string, err error) {
	raw = make([]byte, 0, 2048)
	var msg []byte // the handshake message, record headers removed
	for {
		start := len(raw)
		raw, err = readN(r, raw, recordHeaderLen)
		if err != nil {
			return raw, "", err
		}
		hdr := raw[start:]
		if hdr[0] != recordTypeHandshake || hdr[1] != 3 {
			return raw, "", ErrNotTLS
		}
		n := int(hdr[3])<<8 | int(hdr[4])
		if n == 0 || n > maxRecordPayload {
			return raw, "", fmt.Errorf("%w: record length %d", ErrMalformed, n)
		}
		if len(msg)+n > maxClientHelloMessage+4 {
			return raw, "", fmt.Errorf("%w: longer than %d bytes", ErrMalformed, maxClientHelloMessage)
		}
		raw, err = readN(r, raw, n)
		if err != nil {
			return raw, "", err
		}
		msg = append(msg, raw[len(raw)-n:]...)
		if len(msg) < 4 {
			continue
		}
		if msg[0] != handshakeClientHello {
			return raw, "", fmt.Errorf("%w: handshake message type %d", ErrMalformed, msg[0])
		}
		size := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
		if size > maxClientHelloMessage {
			return raw, "", fmt.Errorf("%w: length %d", ErrMalformed, size)
		}
		if len(msg) >= 4+size {
			serverName, err = parseClientHello(msg[4 : 4+size])
			return raw, serverName, err
		}
	}
}

// readN appends exactly n bytes from r to buf. A stream that ends early is
// io.ErrUnexpectedEOF (io.EOF if it ended before the first byte of a message).
func readN(r io.Reader, buf []byte, n int) ([]byte, error) {
	l := len(buf)
	buf = append(buf, make([]byte, n)...)
	if _, err := io.ReadFull(r, buf[l:]); err != nil {
		return buf[:l], err
	}
	return buf, nil
}

// parseClientHello returns the host_name of the server_name extension (RFC 6066 §3) of
// a ClientHello body (after the 4-byte handshake header); "" when there is none.
func parseClientHello(b []byte) (string, error) {
	s := cursor(b)
	if !s.skip(2+32) || // legacy_version, random
		!s.skipVector(1, 32) || // legacy_session_id
		!s.skipVector(2, 1<<16-2) || // cipher_suites
		!s.skipVector(1, 255) { // legacy_compression_methods
		return "", ErrMalformed
	}
	if len(s) == 0 {
		return "", nil // TLS 1.2 and older may omit extensions
	}
	exts, ok := s.vector(2)
	if !ok || len(s) != 0 {
		return "", ErrMalformed
	}
	for len(exts) > 0 {
		typ, ok1 := exts.uint16()
		data, ok2 := exts.vector(2)
		if !ok1 || !ok2 {
			return "", ErrMalformed
		}
		if typ == extensionServerName {
			return parseServerName(data)
		}
	}
	return "", nil
}

func parseServerName(data cursor) (string, error) {
	list, ok := data.vector(2)
	if !ok || len(data) != 0 || len(list) == 0 {
		return "", ErrMalformed
	}
	for len(list) > 0 {
		typ, ok1 := list.uint8()
		name, ok2 := list.vector(2)
		if !ok1 || !ok2 {
			return "", ErrMalformed
		}
		if typ != serverNameTypeHost {
			continue
		}
		if !ValidServerName(string(name)) {
			return "", fmt.Errorf("%w: server name is not a host name", ErrMalformed)
		}
		return string(name), nil
	}
	return "", nil
}

// ValidServerName: 1–253 bytes of letters, digits, '-', '_' and '.', no empty label, no
// trailing dot (RFC 6066 forbids it). Anything else cannot be one of our names and must
// not reach logs or backends unchecked.
func ValidServerName(n string) bool {
	if len(n) == 0 || len(n) > maxServerNameLen || n[0] == '.' || n[len(n)-1] == '.' {
		return false
	}
	for i := range len(n) {
		switch c := n[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		case c == '.' && n[i-1] != '.':
		default:
			return false
		}
	}
	return true
}

// cursor reads big-endian TLS wire structures; every method reports false, consuming
// nothing useful, when the input is short.
type cursor []byte

func (c *cursor) skip(n int) bool {
	if len(*c) < n {
		return false
	}
	*c = (*c)[n:]
	return true
}

func (c *cursor) uint8() (int, bool) {
	if len(*c) < 1 {
		return 0, false
	}
	v := int((*c)[0])
	*c = (*c)[1:]
	return v, true
}

func (c *cursor) uint16() (int, bool) {
	if len(*c) < 2 {
		return 0, false
	}
	v := int((*c)[0])<<8 | int((*c)[1])
	*c = (*c)[2:]
	return v, true
}

// vector reads a length-prefixed vector whose length takes lenBytes (1 or 2) bytes.
func (c *cursor) vector(lenBytes int) (cursor, bool) {
	var n int
	var ok bool
	if lenBytes == 1 {
		n, ok = c.uint8()
	} else {
		n, ok = c.uint16()
	}
	if !ok || len(*c) < n {
		return nil, false
	}
	v := (*c)[:n]
	*c = (*c)[n:]
	return v, true
}

// skipVector skips a vector of at most max bytes.
func (c *cursor) skipVector(lenBytes, max int) bool {
	v, ok := c.vector(lenBytes)
	return ok && len(v) <= max
}
