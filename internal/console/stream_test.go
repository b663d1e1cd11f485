package console

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

// fakeExec is a SandboxService whose StreamExec echoes stdin back and records resizes
// and the key it was called with; other sandboxes than "sb1" are not found.
type fakeExec struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler
	mu      sync.Mutex
	authz   string
	init    *sandboxv1.ExecStreamInit
	resizes [][2]uint32
	// ended gets one value when the context of a StreamExec of sb1 ends (if it has room).
	ended chan struct{}
	// xff and peer are the X-Forwarded-For lines and peer address of the last call.
	xff  []string
	peer string
}

func (f *fakeExec) StreamExec(ctx context.Context, s *connect.BidiStream[sandboxv1.ExecStreamRequest, sandboxv1.ExecStreamResponse]) error {
	m, err := s.Receive()
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.authz, f.init = s.RequestHeader().Get("Authorization"), m.GetInit()
	f.xff, f.peer = s.RequestHeader().Values("X-Forwarded-For"), s.Peer().Addr
	f.mu.Unlock()
	if m.GetInit().GetSandboxId() != "sb1" {
		return apierr.Newf(apierr.SandboxNotFound, "sandbox %s not found", m.GetInit().GetSandboxId())
	}
	if f.ended != nil {
		go func() {
			<-ctx.Done()
			select {
			case f.ended <- struct{}{}:
			default:
			}
		}()
	}
	for {
		m, err := s.Receive()
		if err != nil {
			return nil
		}
		switch {
		case m.GetResize() != nil:
			f.mu.Lock()
			f.resizes = append(f.resizes, [2]uint32{m.GetResize().GetWidth(), m.GetResize().GetHeight()})
			f.mu.Unlock()
		case string(m.GetStdin()) == "exit\r":
			return s.Send(&sandboxv1.ExecStreamResponse{Message: &sandboxv1.ExecStreamResponse_Exit{Exit: &sandboxv1.ExecStreamExit{ExitCode: 7}}})
		case m.GetStdin() != nil:
			if err := s.Send(&sandboxv1.ExecStreamResponse{Message: &sandboxv1.ExecStreamResponse_Output{Output: &sandboxv1.ExecStreamOutput{Data: m.GetStdin()}}}); err != nil {
				return err
			}
		}
	}
}

func terminalServer(t *testing.T) (*httptest.Server, *fakeExec, *http.Cookie) {
	t.Helper()
	fake := &fakeExec{ended: make(chan struct{}, 1)}
	mux := http.NewServeMux()
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(fake))
	clk := &clock{t: time.Now()}
	c := New(Config{Auth: keys{goodKey: {KeyID: "key1", Org: "org-a"}}, API: mux, Now: clk.now})
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	ck, _ := signIn(t, c)
	return srv, fake, ck
}

func dialTerminal(t *testing.T, srv *httptest.Server, ck *http.Cookie, id, origin string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	h := http.Header{"Cookie": {ck.Name + "=" + ck.Value}}
	if origin != "" {
		h.Set("Origin", origin)
	}
	return websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/console/api/sandboxes/"+id+"/terminal", &websocket.DialOptions{HTTPHeader: h})
}

func TestTerminalBridgesStreamExec(t *testing.T) {
	srv, fake, ck := terminalServer(t)
	ws, _, err := dialTerminal(t, srv, ck, "sb1", srv.URL) //nolint:bodyclose // the upgraded connection is ws
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"type":"resize","cols":120,"rows":40}`)); err != nil {
		t.Fatal(err)
	}
	if err := ws.Write(ctx, websocket.MessageBinary, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	typ, b, err := ws.Read(ctx)
	if err != nil || typ != websocket.MessageBinary || string(b) != "hello" {
		t.Fatalf("echo: %v %q %v", typ, b, err)
	}
	if err := ws.Write(ctx, websocket.MessageBinary, []byte("exit\r")); err != nil {
		t.Fatal(err)
	}
	typ, b, err = ws.Read(ctx)
	var ctl termControl
	if err != nil || typ != websocket.MessageText || json.Unmarshal(b, &ctl) != nil || ctl.Type != "exit" || ctl.Code != 7 {
		t.Fatalf("exit: %v %s %v", typ, b, err)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if fake.authz != "Bearer "+goodKey || !fake.init.GetTty() || fake.init.GetSandboxId() != "sb1" {
		t.Fatalf("StreamExec got authz %q init %v", fake.authz, fake.init)
	}
	if len(fake.resizes) != 1 || fake.resizes[0] != [2]uint32{120, 40} {
		t.Fatalf("resizes %v", fake.resizes)
	}
}

func TestTerminalRefusals(t *testing.T) {
	srv, _, ck := terminalServer(t)

	// The API's error (here: not found) ends the terminal, with its reason.
	ws, _, err := dialTerminal(t, srv, ck, "other", srv.URL) //nolint:bodyclose // the upgraded connection is ws
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, b, err := ws.Read(ctx)
	var ctl termControl
	if err != nil || json.Unmarshal(b, &ctl) != nil || ctl.Type != "error" || ctl.Reason != apierr.SandboxNotFound {
		t.Fatalf("other sandbox: %s %v", b, err)
	}
	ws.CloseNow()

	// Another origin is refused before the upgrade.
	if _, res, err := dialTerminal(t, srv, ck, "sb1", "http://evil.example"); err == nil || res == nil || res.StatusCode != 403 { //nolint:bodyclose // refused handshake
		t.Fatalf("cross-origin terminal: %v", err)
	}

	// A message over the bound and a bad control message close the socket.
	for name, msg := range map[string]struct {
		typ websocket.MessageType
		b   []byte
	}{
		"too big":     {websocket.MessageBinary, make([]byte, MaxTerminalMessage+1)},
		"bad control": {websocket.MessageText, []byte(`{"type":"resize","cols":0,"rows":0}`)},
	} {
		ws, _, err := dialTerminal(t, srv, ck, "sb1", srv.URL) //nolint:bodyclose // the upgraded connection is ws
		if err != nil {
			t.Fatal(err)
		}
		_ = ws.Write(ctx, msg.typ, msg.b)
		_, _, err = ws.Read(ctx)
		var ce websocket.CloseError
		if !errors.As(err, &ce) || (ce.Code != websocket.StatusMessageTooBig && ce.Code != websocket.StatusPolicyViolation) {
			t.Fatalf("%s: the socket goes on: %v", name, err)
		}
		ws.CloseNow()
	}
}

func (f *fakeExec) StreamLogs(ctx context.Context, req *connect.Request[sandboxv1.StreamLogsRequest], s *connect.ServerStream[sandboxv1.LogEntry]) error {
	f.mu.Lock()
	f.xff, f.peer = req.Header().Values("X-Forwarded-For"), req.Peer().Addr
	f.mu.Unlock()
	if req.Msg.GetSandboxId() != "sb1" || req.Header().Get("Authorization") != "Bearer "+goodKey {
		return apierr.Newf(apierr.SandboxNotFound, "sandbox %s not found", req.Msg.GetSandboxId())
	}
	for _, l := range []string{"line one\n", "line two\n"} {
		if err := s.Send(&sandboxv1.LogEntry{Data: []byte(l)}); err != nil {
			return err
		}
	}
	return nil
}

func TestLogsStreamAsText(t *testing.T) {
	srv, _, ck := terminalServer(t)
	get := func(id string) (int, string, string) {
		req, _ := http.NewRequest("GET", srv.URL+"/console/api/sandboxes/"+id+"/logs", nil)
		req.AddCookie(ck)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, res.Body)
		return res.StatusCode, res.Header.Get("Content-Type"), b.String()
	}
	if code, ct, body := get("sb1"); code != 200 || !strings.HasPrefix(ct, "text/plain") || body != "line one\nline two\n" {
		t.Fatalf("logs: %d %s %q", code, ct, body)
	}
	if code, _, body := get("other"); code != 404 || !strings.Contains(body, apierr.SandboxNotFound) {
		t.Fatalf("other sandbox's logs: %d %s", code, body)
	}
}

// TestTerminalBadControlEndsExec: a bad control message closes the socket and ends the
// command's stream too (its context), so no shell is left running for nobody.
func TestTerminalBadControlEndsExec(t *testing.T) {
	for name, msg := range map[string]struct {
		typ websocket.MessageType
		b   []byte
	}{
		"bad control": {websocket.MessageText, []byte(`{"type":"resize","cols":0,"rows":0}`)},
		"not JSON":    {websocket.MessageText, []byte(`resize`)},
		"too big":     {websocket.MessageBinary, make([]byte, MaxTerminalMessage+1)},
	} {
		t.Run(name, func(t *testing.T) {
			srv, fake, ck := terminalServer(t)
			ws, _, err := dialTerminal(t, srv, ck, "sb1", srv.URL) //nolint:bodyclose // the upgraded connection is ws
			if err != nil {
				t.Fatal(err)
			}
			defer ws.CloseNow()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// The shell is up (it echoes) before the bad message.
			if err := ws.Write(ctx, websocket.MessageBinary, []byte("hi")); err != nil {
				t.Fatal(err)
			}
			if _, b, err := ws.Read(ctx); err != nil || string(b) != "hi" {
				t.Fatalf("echo: %q %v", b, err)
			}
			_ = ws.Write(ctx, msg.typ, msg.b)
			var ce websocket.CloseError
			if _, _, err := ws.Read(ctx); !errors.As(err, &ce) {
				t.Fatalf("the socket goes on: %v", err)
			}
			// The browser keeps its side open: only the server may end the command.
			select {
			case <-fake.ended:
			case <-ctx.Done():
				t.Fatal("StreamExec's context was not cancelled after the socket closed")
			}
		})
	}
}

// TestStreamsForwardXFF: the terminal and the log stream reach the API as the browser's
// request did, X-Forwarded-For included (as the REST proxy's calls do), so the API's front
// judges a caller behind a trusted proxy by its own address.
func TestStreamsForwardXFF(t *testing.T) {
	srv, fake, ck := terminalServer(t)
	xff := []string{"203.0.113.7, 198.51.100.2", "192.0.2.9"}
	check := func(what string) {
		t.Helper()
		fake.mu.Lock()
		defer fake.mu.Unlock()
		if strings.Join(fake.xff, "|") != strings.Join(xff, "|") || !strings.HasPrefix(fake.peer, "127.0.0.1:") {
			t.Fatalf("%s: the API got X-Forwarded-For %q from %q, want %q from the browser's address", what, fake.xff, fake.peer, xff)
		}
	}

	req, _ := http.NewRequest("GET", srv.URL+"/console/api/sandboxes/sb1/logs", nil)
	req.AddCookie(ck)
	req.Header["X-Forwarded-For"] = xff
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	check("logs")

	fake.mu.Lock()
	fake.xff = nil
	fake.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := http.Header{"Cookie": {ck.Name + "=" + ck.Value}, "Origin": {srv.URL}, "X-Forwarded-For": xff}
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/console/api/sandboxes/sb1/terminal", &websocket.DialOptions{HTTPHeader: h}) //nolint:bodyclose // the upgraded connection is ws
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageBinary, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, b, err := ws.Read(ctx); err != nil || string(b) != "hi" {
		t.Fatalf("echo: %q %v", b, err)
	}
	check("terminal")
}
