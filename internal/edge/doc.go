// Package edge is a runner's public entry point: one TCP listener (443 in production)
// that reads each connection's TLS ClientHello, takes the server name (SNI) and routes
// by host name <port>-<sandbox-id>.<runner-id>.<base-domain> to a sandbox port.
//
// Two kinds of route (Route.Kind):
//
//   - KindHTTPS: TLS ends here with the runner's wildcard certificate
//     *.<runner-id>.<base-domain>; HTTP/1.1 and HTTP/2 (ALPN) are served to the client and
//     plain HTTP/1.1 is proxied to the sandbox, WebSocket upgrades and server-sent events
//     included. Requests are routed by their Host (:authority), not by the SNI, so that
//     HTTP/2 connection reuse across names covered by the wildcard works; a request for a
//     passthrough name on a terminated connection gets 421 Misdirected Request so the
//     client retries on a connection of its own. WebSocket over HTTP/2 (RFC 8441) is not
//     offered (net/http's default), so clients upgrade on an HTTP/1.1 connection.
//     HTTP/2 is served by net/http; HTTP/1.1 by a keep-alive loop of the edge's own with
//     pooled connections to the sandboxes (h1.go), which hands a connection to net/http
//     at the first request it does not handle itself (upgrades, chunked uploads, Expect,
//     malformed or oversized requests). The fast path parses strictly (RFC 9112): a
//     request with an ambiguous head or framing — a field name that is not a token,
//     obs-fold, a bare CR, Content-Length with Transfer-Encoding, two Content-Lengths —
//     gets 400 and the connection is closed (after a hand-over, net/http's parser reads
//     the connection's further requests and re-frames what it forwards); a chunked
//     upload's first 64 KiB are read and checked before
//     anything goes to the sandbox. The client's forwarding fields (Forwarded,
//     X-Forwarded-*, X-Real-IP, True-Client-IP, X-Original-URL ..., see
//     forwardingHeader) are dropped; the edge sets X-Forwarded-For, -Host and -Proto.
//   - KindPassthrough: nothing is decrypted. The ClientHello bytes already read are
//     replayed to the sandbox and the TCP connection is spliced both ways, half-closes
//     passed on, so the workload sees the client's SNI and owns its certificates.
//
// Request timeout (HTTPS): Route.Timeout (default 15 s, valid 15–900 s) bounds the time
// from the request having been sent to the sandbox (its body included) to the sandbox's
// response headers; past it the client gets 504. Once the headers arrived the response
// is not cut, so WebSocket connections and event streams live as long as both ends
// want, and a slow upload is not the sandbox's fault. A request body that stops
// arriving for Config.HandshakeTimeout ends the request and its sandbox connection.
//
// Auth (HTTPS): AuthOpen lets everyone through; AuthToken (the wire's SHARE_TOKEN) needs
// the sandbox's share token (sharetoken.go) or "Authorization: Bearer <key>" that
// Config.Authorize accepts for the route's organization: 401 without either, with a
// wrong token, or when Authorize says ErrUnauthenticated; 403 for a key that may not use
// the sandbox. The credentials are removed before the request reaches the sandbox.
// Browsers sign in once at /.sandboxd/login (or bring the share token in the URL) and
// get a signed session cookie instead (login.go).
//
// Unknown names do not reveal which sandboxes exist. A name of one label under
// .<runner-id>.<base-domain> without a route — malformed, a sandbox that does not exist,
// or a port of an existing sandbox that has no endpoint — is handled exactly like an
// HTTPS route: the handshake completes with the wildcard certificate and every request
// gets the same 404 body. Any other name (another domain, deeper names the wildcard does
// not cover) or no SNI at all gets a TLS unrecognized_name alert and the connection is
// closed, before any certificate is sent.
//
// Bytes that are not a TLS ClientHello, or a ClientHello not complete within
// Config.HandshakeTimeout (slowloris), close the connection. At most Config.MaxConns
// connections are open at once; further ones wait in the kernel's accept queue.
package edge
