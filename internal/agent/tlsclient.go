package agent

import (
	"crypto/tls"
	"net/http"
)

// NewTLSHTTPClient is NewHTTPClient over TLS: HTTP/2 (ALPN h2) with the same 4 MiB flow
// control windows, and a cancelled call aborts its stream even while the request body
// blocks. cfg verifies the server (and carries the client certificate for mTLS).
func NewTLSHTTPClient(cfg *tls.Config) *http.Client {
	var protos http.Protocols
	protos.SetHTTP2(true)
	return &http.Client{Transport: cancelBodyTransport{&http.Transport{
		Protocols:       &protos,
		TLSClientConfig: cfg,
		HTTP2:           HTTP2Config(),
	}}}
}
