// Package connecttest inspects gRPC traffic on the wire for tests.
package connecttest

import (
	"bytes"
	"io"
	"net/http"
	"sync"
)

// EnvelopeFlags is an http.RoundTripper that records the flags byte of each response's
// first gRPC message envelope (bit 0 set: the message is compressed).
type EnvelopeFlags struct {
	Base http.RoundTripper

	mu    sync.Mutex
	flags []byte
}

// RoundTrip implements http.RoundTripper; it reads the whole response body first.
func (e *EnvelopeFlags) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := e.Base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil {
		return nil, err
	}
	if len(b) > 0 {
		e.mu.Lock()
		e.flags = append(e.flags, b[0])
		e.mu.Unlock()
	}
	res.Body = io.NopCloser(bytes.NewReader(b))
	return res, nil
}

// Flags returns the flags recorded so far, one per response.
func (e *EnvelopeFlags) Flags() []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]byte(nil), e.flags...)
}
