// Package apifront is the HTTP front of the public API port (gRPC h2c, gRPC-Web, Connect
// and REST/JSON on one port). Before any byte of a request body is read it authenticates
// the API key from the headers and answers UNAUTHENTICATED at once otherwise; it caps the
// memory that request bodies being buffered may take together (RESOURCE_EXHAUSTED when
// full); it refuses REST requests no route takes or whose query names no field, and
// records the path variables of REST routes so that PathVars can refuse a query parameter
// or body field that contradicts them.
package apifront

import (
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/semaphore"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
)

// Defaults of Config.
const (
	DefaultMaxBodyBytesInFlight = 512 << 20
	DefaultBodyReadTimeout      = 5 * time.Minute
)

// Config configures a Front.
type Config struct {
	Auth auth.Authenticator
	// Public lists the "METHOD /path" patterns served without a key (e.g. "GET /readyz").
	Public []string
	// MaxBodyBytesInFlight caps the bytes of request bodies being buffered at once, over
	// all requests (default DefaultMaxBodyBytesInFlight). One message may take at most
	// MaxMessageBytes of it (default: all of it).
	MaxBodyBytesInFlight int64
	MaxMessageBytes      int64
	// Routes are the REST routes served (Routes()). A REST request (under /v1/) that none
	// takes, or with a query parameter that names no field of its request, or with a body
	// where its route takes none, is refused here, as AIP-193 JSON; the path variables
	// of the others must not be overridden (PathVars). Empty: REST requests go on unchecked.
	Routes []Route
	// BodyReadTimeout bounds the time an authenticated client may take to send a request
	// body (default DefaultBodyReadTimeout; < 0: unbounded), except on the paths of
	// ClientStreaming (StreamExec's input lasts as long as the command). Unauthenticated
	// bodies are never read at all.
	BodyReadTimeout time.Duration
	ClientStreaming []string
	Logger          *slog.Logger
}

// Front is an http.Handler in front of the API.
type Front struct {
	next   http.Handler
	auth   auth.Authenticator
	public map[string]bool
	budget *semaphore.Weighted
	max    int64
	maxMsg int64
	routes []Route
	// bodyTimeout: see Config.BodyReadTimeout; streaming the paths exempt from it.
	bodyTimeout time.Duration
	streaming   map[string]bool
	log         *slog.Logger
}

// New returns a Front serving next.
func New(next http.Handler, cfg Config) *Front {
	if cfg.MaxBodyBytesInFlight <= 0 {
		cfg.MaxBodyBytesInFlight = DefaultMaxBodyBytesInFlight
	}
	if cfg.MaxMessageBytes <= 0 || cfg.MaxMessageBytes > cfg.MaxBodyBytesInFlight {
		cfg.MaxMessageBytes = cfg.MaxBodyBytesInFlight
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.BodyReadTimeout == 0 {
		cfg.BodyReadTimeout = DefaultBodyReadTimeout
	}
	f := &Front{next: next, auth: cfg.Auth, public: map[string]bool{}, budget: semaphore.NewWeighted(cfg.MaxBodyBytesInFlight),
		max: cfg.MaxBodyBytesInFlight, maxMsg: cfg.MaxMessageBytes, routes: sortRoutes(cfg.Routes), log: cfg.Logger}
	for _, p := range cfg.Public {
		f.public[p] = true
	}
	f.bodyTimeout, f.streaming = cfg.BodyReadTimeout, map[string]bool{}
	for _, p := range cfg.ClientStreaming {
		f.streaming[p] = true
	}
	return f
}

// errBusy: the bodies in flight already take the whole budget. (A new error each time:
// connect adds to the errors it writes.)
func errBusy() error {
	return apierr.WithRetry(apierr.Newf(apierr.ServerBusy,
		"the server is buffering as many request bytes as it may: retry shortly"), time.Second)
}

func (f *Front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.public[r.Method+" "+r.URL.Path] {
		f.next.ServeHTTP(w, r)
		return
	}
	// Headers only: the body is not read before the key is known good.
	p, err := auth.Check(f.auth, r.Header)
	if err != nil {
		f.refuse(w, r, err)
		return
	}
	ctx := auth.WithVerified(r.Context(), p)
	var noBody *Route
	if isREST(r) && len(f.routes) > 0 {
		rt, vars, err := routeREST(f.routes, r)
		if err != nil {
			f.refuse(w, r, err)
			return
		}
		if len(vars) > 0 {
			ctx = contextWithVars(ctx, vars)
		}
		if rt.body == "" {
			noBody = rt // a body of unknown length is refused at its first byte
		}
		w = jsonErrors{w}
	} else if !isREST(r) {
		assumeConnect(r)
	}
	if r.Body != nil && r.Body != http.NoBody {
		b := &budgeted{f: f, rc: r.Body, enveloped: enveloped(r.Header.Get("Content-Type")), noBody: noBody}
		if n := r.ContentLength; n > 0 && !b.enveloped {
			// A body of known size reserves it all now (up to one message: the handler
			// refuses more), or is refused before it is read.
			if !b.acquire(min(n, f.maxMsg)) {
				f.refuse(w, r, errBusy())
				return
			}
		}
		defer b.release()
		if f.bodyTimeout > 0 && !f.streaming[r.URL.Path] {
			// The whole body must arrive in time; once it has, the deadline goes (a
			// server stream of logs then lasts as long as it likes).
			rc := http.NewResponseController(w)
			if rc.SetReadDeadline(time.Now().Add(f.bodyTimeout)) == nil {
				b.done = func() { _ = rc.SetReadDeadline(time.Time{}) }
				defer b.finish()
			}
		}
		r.Body = b
	}
	f.next.ServeHTTP(w, r.WithContext(ctx))
}

// refuse answers err in the request's protocol without reading its body; an HTTP/1 client
// that has a body on the way gets its connection closed after the answer.
func (f *Front) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if r.ProtoMajor == 1 && r.Body != nil && r.Body != http.NoBody {
		w.Header().Set("Connection", "close")
	}
	if isRPC(r) {
		_ = errWriter.Write(w, r, err)
		return
	}
	WriteRESTError(w, err)
}

// jsonErrors labels a REST error answer JSON, which its body always is (google.rpc.Status):
// the transcoder leaves some of its own refusals (a query value of the wrong type) with
// the content type of the protocol it speaks to the handler, application/proto.
type jsonErrors struct{ http.ResponseWriter }

func (w jsonErrors) WriteHeader(code int) {
	if code >= http.StatusBadRequest {
		w.Header().Set("Content-Type", "application/json")
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController and the transcoder reach the flusher beneath.
func (w jsonErrors) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// isREST: RPC paths are /package.Service/Method, REST ones start with /v1/.
func isREST(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/v1/") }

// assumeConnect marks a unary POST to an RPC path in JSON or binary protobuf as Connect.
// The Connect protocol lets a client leave out Connect-Protocol-Version (connect-go servers
// do not require it, and curl users do not send it), but the transcoder takes such a call
// for REST, finds no route and answers a bare 404. No REST route lies outside /v1/.
func assumeConnect(r *http.Request) {
	if r.Method != http.MethodPost || r.Header.Get("Connect-Protocol-Version") != "" {
		return
	}
	ct, _, _ := strings.Cut(strings.ToLower(r.Header.Get("Content-Type")), ";")
	if ct = strings.TrimSpace(ct); ct == "application/json" || ct == "application/proto" {
		r.Header.Set("Connect-Protocol-Version", "1")
	}
}

// enveloped: gRPC, gRPC-Web and Connect streaming bodies are a sequence of
// length-prefixed messages.
func enveloped(ct string) bool {
	ct = strings.ToLower(ct)
	return strings.HasPrefix(ct, "application/grpc") && !strings.HasPrefix(ct, "application/grpc-web-text") ||
		strings.HasPrefix(ct, "application/connect+")
}

// WriteRESTError writes err as REST/JSON does (google.rpc.Status, HTTP status by code).
func WriteRESTError(w http.ResponseWriter, err error) {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		ce = connect.NewError(connect.CodeUnknown, err)
	}
	code := HTTPStatus(ce.Code())
	var rs restStatus
	if errors.As(err, &rs) {
		code = rs.status
		w.Header().Set("Allow", rs.allow)
	}
	st := &status.Status{Code: int32(ce.Code()), Message: ce.Message()} //nolint:gosec // codes are small
	for _, d := range ce.Details() {
		st.Details = append(st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	b, merr := protojson.Marshal(st)
	if merr != nil {
		b = []byte(`{"code":13,"message":"cannot encode the error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// HTTPStatus maps a code to its HTTP status (google.rpc.Code's table).
func HTTPStatus(c connect.Code) int {
	switch c {
	case connect.CodeCanceled:
		return 499
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeAlreadyExists, connect.CodeAborted:
		return http.StatusConflict
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnimplemented:
		return http.StatusNotImplemented
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// budgeted is a request body whose bytes are taken from the Front's budget as they are
// read and given back when the request ends. An enveloped (streaming) body reserves each
// message's announced size when its prefix arrives and gives back the previous message's,
// so a long-lived stream holds at most one message's worth.
type budgeted struct {
	f         *Front
	rc        io.ReadCloser
	enveloped bool

	mu   sync.Mutex
	held int64 // taken from the budget
	// Raw bodies: bytes read beyond held need more budget.
	read int64
	// Enveloped bodies: the prefix being read and the bytes left of the current message.
	prefix    [5]byte
	prefixN   int
	remaining int64
	err       error
	// done clears the body's read deadline, once (finish).
	done func()
	// noBody, when set, is the REST route (without a body) any byte of this body violates.
	noBody *Route
}

func (b *budgeted) finish() {
	b.mu.Lock()
	done := b.done
	b.done = nil
	b.mu.Unlock()
	if done != nil {
		done()
	}
}

func (b *budgeted) acquire(n int64) bool {
	if n > b.f.maxMsg || !b.f.budget.TryAcquire(n) {
		return false
	}
	b.held += n
	return true
}

func (b *budgeted) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held > 0 {
		b.f.budget.Release(b.held)
		b.held = 0
	}
}

func (b *budgeted) Close() error { return b.rc.Close() }

func (b *budgeted) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.rc.Read(p)
	if berr := b.account(p[:n]); berr != nil {
		b.err = berr
		return 0, berr
	}
	if errors.Is(err, io.EOF) && b.done != nil {
		b.done()
		b.done = nil
	}
	return n, err
}

func (b *budgeted) account(p []byte) error {
	if !b.enveloped {
		if b.noBody != nil && len(p) > 0 {
			return errNoBody(b.noBody)
		}
		b.read += int64(len(p))
		if b.read > b.held && !b.acquire(b.read-b.held) {
			return errBusy()
		}
		return nil
	}
	for len(p) > 0 {
		if b.remaining > 0 {
			k := min(int64(len(p)), b.remaining)
			b.remaining -= k
			p = p[k:]
			continue
		}
		c := copy(b.prefix[b.prefixN:], p)
		b.prefixN += c
		p = p[c:]
		if b.prefixN < len(b.prefix) {
			return nil
		}
		b.prefixN = 0
		size := int64(binary.BigEndian.Uint32(b.prefix[1:]))
		// The previous message has been handed on: its budget is free again.
		if b.held > 0 {
			b.f.budget.Release(b.held)
			b.held = 0
		}
		if size > b.f.maxMsg {
			return apierr.Newf(apierr.ServerBusy,
				"message of %d bytes is larger than the %d bytes the server buffers for one message", size, b.f.maxMsg)
		}
		if !b.acquire(size) {
			return errBusy()
		}
		b.remaining = size
	}
	return nil
}
