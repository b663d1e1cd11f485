package agent

import (
	"context"
	"io"
	"net"
	"net/http"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
)

// NewClient returns an AgentService client (gRPC protocol, HTTP/2 cleartext) whose
// connections come from dial, e.g. a unix socket or an mTLS connection to the agent.
// Messages may be up to MaxMessageBytes. Extra options are appended.
func NewClient(dial func(ctx context.Context) (net.Conn, error), opts ...connect.ClientOption) agentv1connect.AgentServiceClient {
	return agentv1connect.NewAgentServiceClient(NewHTTPClient(dial), "http://sandbox-agent",
		append([]connect.ClientOption{
			connect.WithGRPC(),
			// No gzip on a local link: it costs CPU on every large file and exec output,
			// and hides how much output really waits (so backpressure acts late).
			connect.WithAcceptCompression("gzip", nil, nil),
			connect.WithReadMaxBytes(MaxMessageBytes),
			connect.WithSendMaxBytes(MaxMessageBytes),
		}, opts...)...)
}

// NewHTTPClient is the h2c HTTP client under NewClient.
func NewHTTPClient(dial func(ctx context.Context) (net.Conn, error)) *http.Client {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: cancelBodyTransport{&http.Transport{
		Protocols:   &protos,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		HTTP2:       HTTP2Config(),
	}}}
}

// HTTP2Config is the HTTP/2 tuning of every hop that carries agent traffic — the agent's
// server, its clients, and the runner and data-plane servers that relay to it: 4 MiB
// windows and 1 MiB frames (instead of net/http's 64 KiB / 16 KiB), so a file or a
// stream is not throttled by a hop in between.
func HTTP2Config() *http.HTTP2Config {
	return &http.HTTP2Config{
		MaxReceiveBufferPerConnection: 4<<20 - 1,
		MaxReceiveBufferPerStream:     4<<20 - 1,
		MaxReadFrameSize:              1 << 20,
	}
}

// cancelBodyTransport makes cancelling a call's context abort the HTTP/2 stream even
// while the transport is blocked reading a streaming request body (an idle bidi stream):
// without it the agent would not learn that the client went away.
type cancelBodyTransport struct{ base http.RoundTripper }

func (t cancelBodyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return t.base.RoundTrip(req)
	}
	r2 := *req
	b := &cancelBody{ReadCloser: req.Body}
	b.stop = context.AfterFunc(req.Context(), func() { b.ReadCloser.Close() })
	r2.Body = b
	return t.base.RoundTrip(&r2)
}

type cancelBody struct {
	io.ReadCloser
	stop func() bool
}

func (b *cancelBody) Close() error {
	b.stop()
	return b.ReadCloser.Close()
}
