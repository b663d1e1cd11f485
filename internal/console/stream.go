package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/apifront"
)

// MaxTerminalMessage bounds a message from the browser's terminal (keystrokes, pastes,
// resizes).
const MaxTerminalMessage = 64 << 10

// maxIDBytes bounds a sandbox ID taken from the path (the API checks it further).
const maxIDBytes = 256

// inproc is an http.RoundTripper that serves a request with a handler in this process,
// full duplex: the response is returned when the handler writes its header, and its body
// streams while the request body still does (a bidirectional Connect stream).
type inproc struct {
	h      http.Handler
	remote string   // the browser's address, as the API's caller
	xff    []string // the browser request's X-Forwarded-For lines, as they came
}

func (t inproc) RoundTrip(req *http.Request) (*http.Response, error) {
	sreq := req.Clone(req.Context())
	if sreq.Body == nil {
		sreq.Body = http.NoBody
	}
	sreq.Proto, sreq.ProtoMajor, sreq.ProtoMinor = "HTTP/2.0", 2, 0
	sreq.RequestURI = req.URL.RequestURI()
	sreq.RemoteAddr = t.remote
	// As the REST proxy does (apiHeaders): the API's front alone decides whether the
	// peer is a trusted proxy whose X-Forwarded-For names the caller.
	sreq.Header.Del("X-Forwarded-For")
	if len(t.xff) > 0 {
		sreq.Header["X-Forwarded-For"] = slices.Clone(t.xff)
	}
	sreq.Host = req.URL.Host
	pr, pw := io.Pipe()
	rw := &pipeResponse{header: http.Header{}, body: pw, ready: make(chan struct{})}
	go func() {
		defer func() {
			if p := recover(); p != nil {
				pw.CloseWithError(fmt.Errorf("console: API handler panicked: %v", p))
				rw.WriteHeader(http.StatusInternalServerError)
				return
			}
			rw.WriteHeader(http.StatusOK)
			_ = pw.Close()
		}()
		t.h.ServeHTTP(rw, sreq)
	}()
	select {
	case <-rw.ready:
	case <-req.Context().Done():
		_ = pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	return &http.Response{Status: http.StatusText(rw.code), StatusCode: rw.code, Proto: "HTTP/2.0", ProtoMajor: 2,
		Header: rw.sent, Body: pr, ContentLength: -1, Request: req}, nil
}

// pipeResponse is the handler's side of inproc.
type pipeResponse struct {
	header http.Header
	sent   http.Header
	code   int
	body   *io.PipeWriter
	once   sync.Once
	ready  chan struct{}
}

func (p *pipeResponse) Header() http.Header { return p.header }

func (p *pipeResponse) WriteHeader(code int) {
	p.once.Do(func() {
		p.code, p.sent = code, p.header.Clone()
		close(p.ready)
	})
}

func (p *pipeResponse) Write(b []byte) (int, error) {
	p.WriteHeader(http.StatusOK)
	return p.body.Write(b)
}

func (p *pipeResponse) Flush() {}

// sandboxClient calls the API in-process with the session's key, as the browser at
// r.RemoteAddr with r's X-Forwarded-For (the API's own front authenticates and scopes
// every call, and judges its source address).
func (c *Console) sandboxClient(r *http.Request) sandboxv1connect.SandboxServiceClient {
	xff := r.Header.Values("X-Forwarded-For")
	return sandboxv1connect.NewSandboxServiceClient(&http.Client{Transport: inproc{h: c.api, remote: r.RemoteAddr, xff: xff}},
		"http://console.invalid")
}

func sandboxID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if id == "" || len(id) > maxIDBytes {
		apifront.WriteRESTError(w, apierr.Invalid(apierr.InvalidRequest, "invalid sandbox ID",
			[]apierr.Violation{{Field: "sandbox_id", Description: fmt.Sprintf("must be 1 to %d bytes", maxIDBytes)}}))
		return "", false
	}
	return id, true
}

// termControl is a text message of the terminal's WebSocket: from the browser, a resize;
// to it, the exit or the error that ended the command.
type termControl struct {
	Type    string `json:"type"` // "resize", "exit", "error"
	Cols    uint32 `json:"cols,omitempty"`
	Rows    uint32 `json:"rows,omitempty"`
	Code    int32  `json:"code"`
	Message string `json:"message,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// terminal bridges a WebSocket to StreamExec of a shell with a TTY: binary messages are
// the terminal's input and output, text messages termControl.
func (c *Console) terminal(w http.ResponseWriter, r *http.Request, ss *session) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	if crossOrigin(r) {
		apifront.WriteRESTError(w, apierr.Newf(apierr.PermissionDenied, "cross-origin terminal refused"))
		return
	}
	// Accept checks too that Origin is this host.
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer func() { _ = ws.CloseNow() }()
	ws.SetReadLimit(MaxTerminalMessage)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stream := c.sandboxClient(r).StreamExec(ctx)
	stream.RequestHeader().Set("Authorization", "Bearer "+ss.key)
	cols, rows := uint32(80), uint32(24)
	if err := stream.Send(&sandboxv1.ExecStreamRequest{Message: &sandboxv1.ExecStreamRequest_Init{Init: &sandboxv1.ExecStreamInit{
		SandboxId: id, Command: []string{"/bin/sh"}, Tty: true, TtyWidth: cols, TtyHeight: rows,
		Env: map[string]string{"TERM": "xterm-256color"}}}}); err != nil && !errors.Is(err, io.EOF) {
		c.termEnd(ctx, ws, err)
		return
	}
	go func() { // browser → command; the browser going away ends the command's stream
		// However this ends (the browser gone, a bad message, the stream ended), the
		// command's stream ends with it: the shell is not left running for nobody.
		defer cancel()
		for {
			typ, b, err := ws.Read(ctx)
			if err != nil {
				return
			}
			var m *sandboxv1.ExecStreamRequest
			if typ == websocket.MessageBinary {
				m = &sandboxv1.ExecStreamRequest{Message: &sandboxv1.ExecStreamRequest_Stdin{Stdin: b}}
			} else {
				var ctl termControl
				if json.Unmarshal(b, &ctl) != nil || ctl.Type != "resize" || ctl.Cols == 0 || ctl.Rows == 0 || ctl.Cols > 1000 || ctl.Rows > 1000 {
					_ = ws.Close(websocket.StatusPolicyViolation, "bad control message")
					return
				}
				m = &sandboxv1.ExecStreamRequest{Message: &sandboxv1.ExecStreamRequest_Resize{Resize: &sandboxv1.ExecStreamResize{Width: ctl.Cols, Height: ctl.Rows}}}
			}
			if err := stream.Send(m); err != nil {
				// The stream ended: Receive below says why, and the handler's return
				// cancels; cancelling first could hide that answer.
				<-ctx.Done()
				return
			}
		}
	}()
	for { // command → browser
		res, err := stream.Receive()
		if err != nil {
			c.termEnd(ctx, ws, err)
			return
		}
		switch m := res.GetMessage().(type) {
		case *sandboxv1.ExecStreamResponse_Output:
			if err := ws.Write(ctx, websocket.MessageBinary, m.Output.GetData()); err != nil {
				return
			}
		case *sandboxv1.ExecStreamResponse_Exit:
			c.termSay(ctx, ws, termControl{Type: "exit", Code: m.Exit.GetExitCode()})
			return
		case *sandboxv1.ExecStreamResponse_Error:
			c.termSay(ctx, ws, termControl{Type: "error", Message: m.Error.GetMessage()})
			return
		}
	}
}

// termEnd tells the browser why the command's stream ended and closes the socket.
func (c *Console) termEnd(ctx context.Context, ws *websocket.Conn, err error) {
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	c.termSay(ctx, ws, termControl{Type: "error", Message: msg, Reason: apierr.Reason(err)})
}

// termSay sends the browser the last control message and closes the socket.
func (c *Console) termSay(ctx context.Context, ws *websocket.Conn, m termControl) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	b, _ := json.Marshal(m)
	_ = ws.Write(ctx, websocket.MessageText, b)
	_ = ws.Close(websocket.StatusNormalClosure, "")
}

// logs streams the sandbox's log (StreamLogs, following, the last 500 lines first) as
// text; an error after the first byte ends it with a line saying why.
func (c *Console) logs(w http.ResponseWriter, r *http.Request, ss *session) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	req := connect.NewRequest(&sandboxv1.StreamLogsRequest{SandboxId: id, Follow: r.URL.Query().Get("follow") != "0", TailLines: 500})
	req.Header().Set("Authorization", "Bearer "+ss.key)
	stream, err := c.sandboxClient(r).StreamLogs(r.Context(), req)
	if err != nil {
		apifront.WriteRESTError(w, err)
		return
	}
	defer func() { _ = stream.Close() }()
	rc := http.NewResponseController(w)
	started := false
	start := func() {
		if !started {
			started = true
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusOK)
		}
	}
	for stream.Receive() {
		m := stream.Msg()
		if e := m.GetError(); e != nil {
			start()
			_, _ = fmt.Fprintf(w, "\n[log stream ended: %s]\n", e.GetMessage())
			return
		}
		start()
		if _, err := w.Write(m.GetData()); err != nil {
			return
		}
		_ = rc.Flush()
	}
	if err := stream.Err(); err != nil {
		if !started {
			apifront.WriteRESTError(w, err)
			return
		}
		var ce *connect.Error
		if errors.As(err, &ce) && r.Context().Err() == nil {
			_, _ = fmt.Fprintf(w, "\n[log stream ended: %s]\n", ce.Message())
		}
		return
	}
	start()
}
