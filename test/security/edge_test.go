package security

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The edge's HTTP/1.1 request smuggling (issue 15 §6): a workload on Python's
// http.server behind a TOKEN endpoint, an attacker's smuggling payloads interleaved
// with a victim's requests, the header-stripping bypasses and the login open redirect,
// all through the real edge of `sandboxd dev`.

// edgeEcho is the workload: http.server with keep-alive (HTTP/1.1, as an application
// server would), answering every request with its id, path and header as JSON.
const edgeEcho = `
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def handle_one(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        out = json.dumps({"id": self.headers.get("X-Id", ""), "path": self.path,
                          "headers": [[k, v] for k, v in self.headers.items()]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = do_PUT = handle_one
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
`

type echoed struct {
	ID, Path string
	Headers  [][2]string
}

// rest calls the REST API with key.
func (d *Dev) rest(t *testing.T, key, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, d.API+path, r)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// edgeSandbox starts the echo workload in org A's sandbox behind a TOKEN endpoint and
// returns the endpoint's host name once the workload answers.
func edgeSandbox(t *testing.T, d *Dev) string {
	t.Helper()
	return echoSandbox(t, d, d.KeyA, "").Host
}

// echoed is a sandbox running the echo workload behind an HTTPS SHARE_TOKEN endpoint.
type echoBox struct {
	ID, Host string
	Token    string // endpoint_share_token of the create response
	Create   []byte // the create response, as sent
}

// createEcho creates the echo sandbox with key (and requestID, when not "") and returns
// the create response; it is deleted at the test's end.
func createEcho(t *testing.T, d *Dev, key, requestID string) echoBox {
	t.Helper()
	spec := map[string]any{"spec": map[string]any{
		"containers": []any{map[string]any{
			"image": "python:3.11", "command": "python3", "args": []string{"/app/echo.py"},
			"files": []any{map[string]any{"path": "/app/echo.py", "content": []byte(edgeEcho)}},
		}},
		"services": []any{map[string]any{"port": 8080, "visibility": "VISIBILITY_PUBLIC",
			"endpoint": map[string]any{"kind": "ENDPOINT_KIND_HTTPS", "auth": "ENDPOINT_AUTH_SHARE_TOKEN", "requestTimeoutSeconds": 30}}},
	}}
	path := "/v1/sandboxes"
	if requestID != "" {
		path += "?request_id=" + requestID
	}
	code, b := d.rest(t, key, http.MethodPost, path, spec)
	if code != http.StatusOK {
		t.Fatalf("create: HTTP %d %s", code, b)
	}
	var sb struct {
		SandboxID          string `json:"sandboxId"`
		EndpointShareToken string `json:"endpointShareToken"`
	}
	if err := json.Unmarshal(b, &sb); err != nil || sb.SandboxID == "" {
		t.Fatalf("create: %s (%v)", b, err)
	}
	t.Cleanup(func() { d.rest(t, key, http.MethodDelete, "/v1/sandboxes/"+sb.SandboxID, nil) })
	return echoBox{ID: sb.SandboxID, Token: sb.EndpointShareToken, Create: b}
}

// echoSandbox is createEcho once the workload answers on its endpoint (Host set).
func echoSandbox(t *testing.T, d *Dev, key, requestID string) echoBox {
	t.Helper()
	box := createEcho(t, d, key, requestID)
	deadline := time.Now().Add(3 * time.Minute)
	var endpoint string
	for endpoint == "" {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s not running with an endpoint", box.ID)
		}
		time.Sleep(500 * time.Millisecond)
		_, b := d.rest(t, key, http.MethodGet, "/v1/sandboxes/"+box.ID, nil)
		var got struct {
			Status struct {
				State    string
				Services []struct{ Endpoint struct{ URL string } }
			}
		}
		_ = json.Unmarshal(b, &got)
		if got.Status.State == "STATE_RUNNING" && len(got.Status.Services) > 0 {
			endpoint = got.Status.Services[0].Endpoint.URL
		}
		if strings.Contains(got.Status.State, "FAILED") || strings.Contains(got.Status.State, "TERMINATED") {
			t.Fatalf("sandbox ended: %s", b)
		}
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatalf("endpoint %q: %v", endpoint, err)
	}
	box.Host = u.Hostname()
	for {
		c := dialEdge(t, d, box.Host)
		c.send("GET /ready HTTP/1.1\r\nHost: " + box.Host + "\r\nAuthorization: Bearer " + key + "\r\n\r\n")
		res, _ := c.read("GET") //nolint:bodyclose // read closes the body
		_ = c.c.Close()
		if res.StatusCode == http.StatusOK {
			return box
		}
		if time.Now().After(deadline) {
			t.Fatalf("the workload does not answer: %s", res.Status)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

type edgeConn struct {
	t  *testing.T
	c  *tls.Conn
	br *bufio.Reader
}

// dialEdge connects to the edge with host as SNI, trusting the dev platform CA.
func dialEdge(t *testing.T, d *Dev, host string) *edgeConn {
	t.Helper()
	pem, err := os.ReadFile(filepath.Join(d.DataDir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	raw, err := net.DialTimeout("tcp", d.Edge, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(raw, &tls.Config{ServerName: host, RootCAs: roots, NextProtos: []string{"http/1.1"}})
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if err := c.Handshake(); err != nil {
		t.Fatalf("TLS to the edge as %s: %v", host, err)
	}
	t.Cleanup(func() { c.Close() })
	return &edgeConn{t, c, bufio.NewReader(c)}
}

func (e *edgeConn) send(s string) {
	e.t.Helper()
	if _, err := io.WriteString(e.c, s); err != nil {
		e.t.Fatal(err)
	}
}

func (e *edgeConn) read(method string) (*http.Response, string) {
	e.t.Helper()
	res, err := http.ReadResponse(e.br, &http.Request{Method: method})
	if err != nil {
		e.t.Fatalf("read response: %v", err)
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		e.t.Fatalf("read body: %v", err)
	}
	return res, string(b)
}

// closed reports whether the edge closes the connection (nothing more sent) in time.
func (e *edgeConn) closed() (bool, string) {
	_ = e.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(e.br)
	var ne net.Error
	return !(err != nil && errorAs(err, &ne) && ne.Timeout()) && len(b) == 0, string(b)
}

func errorAs(err error, ne *net.Error) bool {
	v, ok := err.(net.Error) //nolint:errorlint // a net.Error directly from the read
	*ne = v
	return ok
}

// smugglePayloads each hide a request with the id "smuggled" behind the one the edge sees.
func smugglePayloads(host, key string) []string {
	h := "Host: " + host + "\r\nAuthorization: Bearer " + key + "\r\nX-Id: attack\r\n"
	hidden := "GET /hidden HTTP/1.1\r\nHost: " + host + "\r\nAuthorization: Bearer " + key + "\r\nX-Id: smuggled\r\n\r\n"
	n := fmt.Sprint(len(hidden))
	z := fmt.Sprint(len(hidden) + 5)
	return []string{
		"POST /a HTTP/1.1\r\n" + h + "Foo Bar: x\r\nContent-Length: " + n + "\r\n\r\n" + hidden,
		"POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding : chunked\r\nContent-Length: " + z + "\r\n\r\n0\r\n\r\n" + hidden,
		"POST /a HTTP/1.1\r\n" + h + "Content-Length : " + n + "\r\n\r\n" + hidden,
		"POST /a HTTP/1.1\r\n" + h + "Content-Length: " + z + "\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + hidden,
		"POST /a HTTP/1.1\r\n" + h + "X-A: 1\r\n Content-Length: " + n + "\r\n\r\n" + hidden,
		"POST /a HTTP/1.1\r\n" + h + "Content-Length: 0\r\nContent-Length: " + n + "\r\n\r\n" + hidden,
		"POST /a HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\nzz\r\n" + hidden,
	}
}

func TestEdgeRequestSmuggling(t *testing.T) {
	d := needDev(t)
	host := edgeSandbox(t, d)

	// The victim, on a connection of its own, checks the id of every response.
	victim := dialEdge(t, d, host)
	_ = victim.c.SetDeadline(time.Time{})
	stop, done := make(chan struct{}), make(chan int)
	go func() {
		n := 0
		defer func() { done <- n }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("victim-%d", i)
			if _, err := io.WriteString(victim.c, "GET /v HTTP/1.1\r\nHost: "+host+"\r\nAuthorization: Bearer "+d.KeyA+"\r\nX-Id: "+id+"\r\nCookie: secret="+id+"\r\n\r\n"); err != nil {
				t.Errorf("victim: %v", err)
				return
			}
			res, err := http.ReadResponse(victim.br, &http.Request{Method: http.MethodGet})
			if err != nil {
				t.Errorf("victim: %v", err)
				return
			}
			var e echoed
			err = json.NewDecoder(res.Body).Decode(&e)
			res.Body.Close()
			if err != nil || e.ID != id {
				t.Errorf("the victim got the response to %q (%v) for its request %s", e.ID, err, id)
			}
			n++
		}
	}()
	for round := range 3 {
		for i, p := range smugglePayloads(host, d.KeyA) {
			a := dialEdge(t, d, host)
			a.send(p)
			if res, body := a.read(http.MethodPost); res.StatusCode != http.StatusBadRequest { //nolint:bodyclose // read closes the body
				t.Errorf("round %d, payload %d: %s %q, want 400", round, i, res.Status, body)
			}
			if ok, rest := a.closed(); !ok {
				t.Errorf("payload %d: the edge did not close the connection after the refusal (then sent %q)", i, rest)
			}
			a = dialEdge(t, d, host)
			for k := range 2 {
				id := fmt.Sprintf("attacker-%d-%d-%d", round, i, k)
				a.send("GET /p HTTP/1.1\r\nHost: " + host + "\r\nAuthorization: Bearer " + d.KeyA + "\r\nX-Id: " + id + "\r\n\r\n")
				_, body := a.read(http.MethodGet) //nolint:bodyclose // read closes the body
				var e echoed
				if err := json.Unmarshal([]byte(body), &e); err != nil || e.ID != id {
					t.Errorf("the attacker got %q for its request %s", body, id)
				}
			}
			_ = a.c.Close()
		}
	}
	close(stop)
	if n := <-done; n == 0 {
		t.Error("the victim made no requests")
	}
}

func TestEdgeCredentialsAndForwardingFieldsStripped(t *testing.T) {
	d := needDev(t)
	host := edgeSandbox(t, d)
	// Spacing variants are not field names: refused outright.
	for _, f := range []string{"Authorization : Bearer " + d.KeyA, "Cookie : __Host-sandboxd=x", "Authorization\t: Bearer " + d.KeyA} {
		c := dialEdge(t, d, host)
		c.send("GET / HTTP/1.1\r\nHost: " + host + "\r\nAuthorization: Bearer " + d.KeyA + "\r\n" + f + "\r\n\r\n")
		if res, body := c.read(http.MethodGet); res.StatusCode != http.StatusBadRequest { //nolint:bodyclose // read closes the body
			t.Errorf("%q: %s %q, want 400", f, res.Status, body)
		}
	}
	// Case variants are the same field: accepted, and stripped.
	spoof := "X-Real-IP: 6.6.6.6\r\nTrue-Client-IP: 6.6.6.6\r\nX-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\n" +
		"X-Forwarded-Port: 6\r\nX-Forwarded-Host: evil.example\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: http\r\nForwarded: for=6.6.6.6\r\n"
	for _, auth := range []string{"authorization: bearer " + d.KeyA, "AUTHORIZATION: BEARER " + d.KeyA} {
		c := dialEdge(t, d, host)
		c.send("GET /h HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "\r\ncookie: a=1; __Host-sandboxd=forged; __host-SANDBOXD =x\r\n" + spoof + "\r\n")
		res, body := c.read(http.MethodGet) //nolint:bodyclose // read closes the body
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%q: %s %q", auth, res.Status, body)
		}
		if strings.Contains(body, d.KeyA) || strings.Contains(strings.ToLower(body), "sandboxd=") || strings.Contains(body, "6.6.6.6") ||
			strings.Contains(body, "evil.example") || strings.Contains(body, "/admin") {
			t.Errorf("%q: the workload got %s", auth, body)
		}
	}
}

func TestEdgeLoginOpenRedirect(t *testing.T) {
	d := needDev(t)
	host := edgeSandbox(t, d)
	for _, next := range []string{"/%09/evil.example/phish", "/%0a/evil.example", "/%5Cevil.example", "//evil.example", "https://evil.example"} {
		c := dialEdge(t, d, host)
		c.send("GET /.sandboxd/login?next=" + next + " HTTP/1.1\r\nHost: " + host + "\r\nAccept: text/html\r\n\r\n")
		if res, page := c.read(http.MethodGet); res.StatusCode != http.StatusOK || !strings.Contains(page, `name="next" value="/"`) { //nolint:bodyclose // read closes the body
			t.Errorf("login page with next=%s: %s, the form's next is not /", next, res.Status)
		}
		dec, _ := url.QueryUnescape(next)
		form := url.Values{"key": {d.KeyA}, "next": {dec}}.Encode()
		c.send("POST /.sandboxd/login HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: " +
			fmt.Sprint(len(form)) + "\r\n\r\n" + form)
		if res, _ := c.read(http.MethodPost); res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/" { //nolint:bodyclose // read closes the body
			t.Errorf("login with next=%q: %s Location %q, want 303 to /", dec, res.Status, res.Header.Get("Location"))
		}
	}
}
