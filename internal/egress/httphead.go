package egress

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The HTTP/1.1 request side of an intercepted connection (inject.go): each request head
// is read (bounded), checked and rewritten, then its body is copied as its framing says.
// Only what is needed to find request boundaries is parsed; anything ambiguous is refused
// rather than guessed (request smuggling lives in the differences between parsers).

const (
	// MaxHeadBytes bounds a request head (request line and headers) as the sandbox sent it.
	MaxHeadBytes = 64 << 10
	// maxHeaderLines bounds a head's header fields.
	maxHeaderLines = 128
	// maxChunkLine bounds a chunk-size line (with extensions) and a trailer line.
	maxChunkLine = 4 << 10
	// maxTrailerBytes bounds a chunked body's trailer section.
	maxTrailerBytes = 16 << 10
)

// headError is a request the proxy refuses, with the HTTP status it answers.
type headError struct {
	status int
	msg    string
}

func (e *headError) Error() string { return e.msg }

func refuse(status int, format string, args ...any) error {
	return &headError{status: status, msg: fmt.Sprintf(format, args...)}
}

// bodyKind is how a request's body is framed.
type bodyKind int

const (
	bodyNone bodyKind = iota
	bodyLength
	bodyChunked
)

// headRewrite is what rewriteHead made of one request head.
type headRewrite struct {
	out     []byte   // the head to send upstream
	kind    bodyKind // the body's framing
	length  int64    // bodyLength: its size
	upgrade bool     // an Upgrade request: after it, the connection is copied as it is
	used    []int    // indices of the injections whose placeholder was replaced
	method  string
}

// headInjection is one header to fill: the placeholder in header Header (canonical or
// not: compared case-insensitively) becomes Value.
type headInjection struct {
	Header, Placeholder, Value string
}

// readHead reads one request head, up to and including its empty line, of at most max
// bytes. io.EOF: the client closed between requests.
func readHead(br *bufio.Reader, max int) ([]byte, error) {
	var head []byte
	for {
		line, err := br.ReadSlice('\n')
		if len(head)+len(line) > max {
			return nil, refuse(431, "request head larger than %d bytes", max)
		}
		head = append(head, line...)
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				continue // a long line: keep reading it (bounded by max above)
			}
			if errors.Is(err, io.EOF) && len(head) == 0 {
				return nil, io.EOF
			}
			if errors.Is(err, io.EOF) {
				return nil, refuse(400, "request head cut short")
			}
			return nil, err
		}
		// Empty line ends the head (a leading empty line before the request line is
		// refused by the parser: RFC 9112 allows ignoring it, refusing is simpler).
		if len(head) >= 2 && bytes.HasSuffix(head, []byte("\r\n\r\n")) || bytes.Equal(head, []byte("\r\n")) {
			return head, nil
		}
	}
}

// rewriteHead checks a request head (as readHead returns it) for host (the TLS server
// name, lower-case) and fills the injections' headers. Refused: anything but an
// origin-form HTTP/1.0 or 1.1 request with exactly one Host header naming host (port 443
// or none); CONNECT; obsolete line folding; bare CR or LF, NUL or other control bytes;
// a Transfer-Encoding other than chunked, or with a Content-Length; differing
// Content-Lengths; more than maxHeaderLines fields. A value that would put a control
// byte into the head is refused too.
func rewriteHead(head []byte, host string, injs []headInjection) (*headRewrite, error) {
	if !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		return nil, refuse(400, "request head does not end with an empty line")
	}
	lines := strings.Split(string(head[:len(head)-4]), "\r\n")
	reqLine := lines[0]
	if strings.ContainsAny(reqLine, "\x00\r\n\t") || hasCTL(reqLine) {
		return nil, refuse(400, "control byte in the request line")
	}
	method, rest, ok1 := strings.Cut(reqLine, " ")
	target, version, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || !isToken(method) || target == "" || strings.Contains(version, " ") {
		return nil, refuse(400, "malformed request line")
	}
	if version != "HTTP/1.1" && version != "HTTP/1.0" {
		return nil, refuse(505, "only HTTP/1.1 and HTTP/1.0 are relayed")
	}
	if method == "CONNECT" {
		return nil, refuse(405, "CONNECT is not relayed")
	}
	if target != "*" && !strings.HasPrefix(target, "/") {
		return nil, refuse(400, "request target must be a path (origin form), not a URL")
	}
	if len(lines)-1 > maxHeaderLines {
		return nil, refuse(431, "more than %d header fields", maxHeaderLines)
	}
	r := &headRewrite{method: method}
	var (
		out        bytes.Buffer
		hosts      int
		cl         string
		te         string
		teSeen     bool
		usedByInj  = make([]bool, len(injs))
		hostHeader string
	)
	out.Grow(len(head))
	out.WriteString(reqLine)
	out.WriteString("\r\n")
	for _, line := range lines[1:] {
		if line == "" {
			return nil, refuse(400, "empty line inside the head")
		}
		if line[0] == ' ' || line[0] == '\t' {
			return nil, refuse(400, "obsolete line folding")
		}
		if strings.ContainsAny(line, "\r\n\x00") || hasCTL(line) {
			return nil, refuse(400, "control byte in a header field")
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || !isToken(name) {
			return nil, refuse(400, "malformed header field")
		}
		value = strings.Trim(value, " \t")
		switch {
		case strings.EqualFold(name, "Host"):
			hosts++
			hostHeader = value
		case strings.EqualFold(name, "Content-Length"):
			if !allDigits(value) || len(value) > 18 {
				return nil, refuse(400, "malformed Content-Length")
			}
			if cl != "" && strings.TrimLeft(cl, "0") != strings.TrimLeft(value, "0") {
				return nil, refuse(400, "differing Content-Length fields")
			}
			cl = value
		case strings.EqualFold(name, "Transfer-Encoding"):
			if teSeen {
				return nil, refuse(400, "more than one Transfer-Encoding field")
			}
			teSeen, te = true, value
		case strings.EqualFold(name, "Upgrade"):
			r.upgrade = true
		}
		for i, inj := range injs {
			if !strings.EqualFold(name, inj.Header) || !strings.Contains(value, inj.Placeholder) {
				continue
			}
			if hasCTL(inj.Value) || strings.ContainsAny(inj.Value, "\r\n\x00") {
				return nil, refuse(500, "the secret for %s is not a valid header value", inj.Header)
			}
			line = name + ": " + strings.ReplaceAll(value, inj.Placeholder, inj.Value)
			value = line[len(name)+2:] // a second injection into the same header sees the first's result
			usedByInj[i] = true
		}
		out.WriteString(line)
		out.WriteString("\r\n")
	}
	out.WriteString("\r\n")
	if hosts != 1 {
		return nil, refuse(400, "%d Host fields: exactly one is required", hosts)
	}
	if !hostMatches(hostHeader, host) {
		return nil, refuse(421, "Host %q is not the TLS server name %s", clipStr(hostHeader, 64), host)
	}
	switch {
	case teSeen && cl != "":
		return nil, refuse(400, "both Transfer-Encoding and Content-Length")
	case teSeen && !strings.EqualFold(te, "chunked"):
		return nil, refuse(501, "Transfer-Encoding %q is not relayed (only chunked)", clipStr(te, 32))
	case teSeen && version == "HTTP/1.0":
		return nil, refuse(400, "Transfer-Encoding in an HTTP/1.0 request")
	case teSeen:
		r.kind = bodyChunked
	case cl != "":
		n, err := strconv.ParseInt(cl, 10, 64)
		if err != nil {
			return nil, refuse(400, "malformed Content-Length")
		}
		r.kind, r.length = bodyLength, n
	}
	for i, u := range usedByInj {
		if u {
			r.used = append(r.used, i)
		}
	}
	r.out = out.Bytes()
	return r, nil
}

// hostMatches: a Host field naming host, with port 443 or none, case ignored.
func hostMatches(field, host string) bool {
	h := strings.TrimSuffix(strings.TrimSuffix(field, ":443"), ".")
	return h != "" && strings.EqualFold(h, host)
}

func hasCTL(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return true
		}
	}
	return false
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// isToken: an RFC 9110 token (method, field name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

func clipStr(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// copyBody copies one request body framed as r says from br to w.
func copyBody(w io.Writer, br *bufio.Reader, r *headRewrite) error {
	switch r.kind {
	case bodyLength:
		_, err := io.CopyN(w, br, r.length)
		return err
	case bodyChunked:
		return copyChunked(w, br)
	}
	return nil
}

// copyChunked copies a chunked body as it is, checking its framing: chunk-size lines
// (with extensions) and trailer lines of at most maxChunkLine bytes, trailers of at most
// maxTrailerBytes.
func copyChunked(w io.Writer, br *bufio.Reader) error {
	for {
		line, err := readLine(br, maxChunkLine)
		if err != nil {
			return err
		}
		sz, _, _ := strings.Cut(line, ";")
		sz = strings.TrimRight(sz, " \t")
		// 1-15 hex digits and nothing else: strconv would take a sign ("+5"), which a
		// strict upstream may read otherwise (a framing disagreement smuggles requests).
		if sz == "" || len(sz) > 15 || strings.Trim(sz, "0123456789abcdefABCDEF") != "" {
			return refuse(400, "malformed chunk size")
		}
		n, err := strconv.ParseInt(sz, 16, 64)
		if err != nil || n < 0 || hasCTL(line) {
			return refuse(400, "malformed chunk size")
		}
		if _, err := io.WriteString(w, line+"\r\n"); err != nil {
			return err
		}
		if n == 0 {
			total := 0
			for {
				t, err := readLine(br, maxChunkLine)
				if err != nil {
					return err
				}
				if total += len(t) + 2; total > maxTrailerBytes {
					return refuse(431, "chunked trailers larger than %d bytes", maxTrailerBytes)
				}
				if hasCTL(t) {
					return refuse(400, "control byte in a trailer")
				}
				if _, err := io.WriteString(w, t+"\r\n"); err != nil {
					return err
				}
				if t == "" {
					return nil
				}
			}
		}
		if _, err := io.CopyN(w, br, n); err != nil {
			return err
		}
		crlf, err := readLine(br, 2)
		if err != nil {
			return err
		}
		if crlf != "" {
			return refuse(400, "chunk not followed by CRLF")
		}
		if _, err := io.WriteString(w, "\r\n"); err != nil {
			return err
		}
	}
}

// readLine reads a CRLF-terminated line of at most max bytes (without the CRLF).
func readLine(br *bufio.Reader, max int) (string, error) {
	var b []byte
	for {
		part, err := br.ReadSlice('\n')
		if len(b)+len(part) > max+2 {
			return "", refuse(400, "line longer than %d bytes", max)
		}
		b = append(b, part...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return "", io.ErrUnexpectedEOF
			}
			return "", err
		}
		if !bytes.HasSuffix(b, []byte("\r\n")) || bytes.IndexByte(b[:len(b)-2], '\r') >= 0 {
			return "", refuse(400, "line not ended by CRLF")
		}
		return string(b[:len(b)-2]), nil
	}
}
