package edge

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The desync test: smuggling payloads on an attacker's connections, interleaved with a
// victim's ordinary requests on its own, through the real edge to the servers the seed
// document's users run. Every request carries an id the backend echoes; no client may
// ever get a response with an id it did not send, and every attack gets refused.

// echoPy is Python's http.server, keep-alive on (HTTP/1.1) so that a smuggled request
// would stay on the pooled connection.
const echoPy = `
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def handle_one(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        out = ("id=%s path=%s" % (self.headers.get("X-Id", ""), self.path)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = do_PUT = handle_one
    def log_message(self, *a):
        pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
`

const echoNode = `
const http = require('http');
const s = http.createServer((req, res) => {
  req.on('data', () => {});
  req.on('end', () => {
    const out = 'id=' + (req.headers['x-id'] || '') + ' path=' + req.url;
    res.setHeader('Content-Length', Buffer.byteLength(out));
    res.end(out);
  });
});
s.listen(0, '127.0.0.1', () => console.log(s.address().port));
`

// startScript runs a backend script that prints its port; "" and a skip if the
// interpreter is missing.
func startScript(t *testing.T, interp, name, src string) string {
	t.Helper()
	bin, err := exec.LookPath(interp)
	if err != nil {
		t.Skipf("%s not installed", interp)
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return "127.0.0.1:" + strings.TrimSpace(line)
}

var echoGo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	_, _ = fmt.Fprintf(w, "id=%s path=%s", r.Header.Get("X-Id"), r.URL.RequestURI())
})

// smuggling are request-smuggling payloads, each hiding a request with the id
// "smuggled" behind the one the edge sees.
var smuggling = []string{
	"POST /a HTTP/1.1\r\nHost: h\r\nX-Id: attack\r\nFoo Bar: x\r\nContent-Length: 48\r\n\r\nGET /hidden HTTP/1.1\r\nHost: h\r\nX-Id: smuggled\r\n\r\n",
	"POST /a HTTP/1.1\r\nHost: h\r\nX-Id: attack\r\nTransfer-Encoding : chunked\r\nContent-Length: 53\r\n\r\n0\r\n\r\nGET /hidden HTTP/1.1\r\nHost: h\r\nX-Id: smuggled\r\n\r\n",
	"POST /a HTTP/1.1\r\nHost: h\r\nX-Id: attack\r\nContent-Length : 48\r\n\r\nGET /hidden HTTP/1.1\r\nHost: h\r\nX-Id: smuggled\r\n\r\n",
	"POST /a HTTP/1.1\r\nHost: h\r\nX-Id: attack\r\nContent-Length: 53\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /hidden HTTP/1.1\r\nHost: h\r\nX-Id: smuggled\r\n\r\n",
	"POST /a HTTP/1.1\r\nHost: h\r\nX-Id: attack\r\nTransfer-Encoding: chunked\r\nContent-Length: 53\r\n\r\n0\r\n\r\nGET /hidden HTTP/1.1\r\nHost: h\r\nX-Id: smuggled\r\n\r\n",
	"POST /a HTTP/1.1\r\nHost: h\r\nX-Id: attack\r\nX-A: 1\r\n Content-Length: 48\r\n\r\nGET /hidden HTTP/1.1\r\nHost: h\r\nX-Id: smuggled\r\n\r\n",
	"POST /a HTTP/1.1\r\nHost: h\r\nX-Id: attack\r\nX-A: 1\rContent-Length: 48\r\n\r\nGET /hidden HTTP/1.1\r\nHost: h\r\nX-Id: smuggled\r\n\r\n",
	"POST /a HTTP/1.1\r\nHost: h\r\nX-Id: attack\r\nContent-Length: 0\r\nContent-Length: 48\r\n\r\nGET /hidden HTTP/1.1\r\nHost: h\r\nX-Id: smuggled\r\n\r\n",
	"POST /a HTTP/1.1\r\nHost: h\r\nX-Id: attack\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nGET /hidden HTTP/1.1\r\nHost: h\r\nX-Id: smuggled\r\n\r\n",
}

func TestDesyncAgainstRealBackends(t *testing.T) {
	for _, b := range []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"python-http.server", func(t *testing.T) string { return startScript(t, "python3", "echo.py", echoPy) }},
		{"node-http", func(t *testing.T) string { return startScript(t, "node", "echo.js", echoNode) }},
		{"go-net-http", func(t *testing.T) string {
			s := httptest.NewServer(echoGo)
			t.Cleanup(s.Close)
			return s.Listener.Addr().String()
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			te := startEdge(t, nil)
			addr, err := net.ResolveTCPAddr("tcp", b.addr(t))
			if err != nil {
				t.Fatal(err)
			}
			te.rm.add(Route{SandboxID: sbxA, Org: "o", Port: 8080, Kind: KindHTTPS, Auth: AuthOpen, Backend: addrPort(t, addr)})
			host := Host(8080, sbxA, testRunner, testDomain)
			desync(t, te, host)
		})
	}
}

// desync runs the victim and the attacker at once.
func desync(t *testing.T, te *testEdge, host string) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	victims := 0
	r := te.rawH1(t, host)
	_ = r.c.SetDeadline(time.Time{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("victim-%d", i)
			if _, err := io.WriteString(r.c, "GET /v?"+id+" HTTP/1.1\r\nHost: "+host+"\r\nX-Id: "+id+"\r\nCookie: secret="+id+"\r\n\r\n"); err != nil {
				t.Errorf("victim: %v", err)
				return
			}
			res, err := http.ReadResponse(r.br, &http.Request{Method: http.MethodGet})
			if err != nil {
				t.Errorf("victim request %d: %v", i, err)
				return
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if want := "id=" + id + " path=/v?" + id; string(body) != want {
				t.Errorf("victim got %q for its request %s", body, id)
			}
			victims++
		}
	})
	for round := range 5 {
		for i, p := range smuggling {
			a := te.rawH1(t, host)
			a.send(withHost(p, host))
			res, body := a.read(http.MethodPost) //nolint:bodyclose // read closes the body
			if res.StatusCode != http.StatusBadRequest {
				t.Errorf("round %d, payload %d %q: %s %q, want 400", round, i, p, res.Status, body)
			}
			if rest := a.readUntilClosed(); rest != "" {
				t.Errorf("payload %d: the attacker got more after the refusal: %q", i, rest)
			}
			// And on a fresh connection the attacker gets its own responses only.
			a = te.rawH1(t, host)
			for k := range 3 {
				id := fmt.Sprintf("attacker-%d-%d-%d", round, i, k)
				a.send("GET /p?" + id + " HTTP/1.1\r\nHost: " + host + "\r\nX-Id: " + id + "\r\n\r\n")
				_, body := a.read(http.MethodGet) //nolint:bodyclose // read closes the body
				if want := "id=" + id + " path=/p?" + id; body != want {
					t.Errorf("the attacker got %q for its request %s", body, id)
				}
			}
			_ = a.c.Close()
		}
	}
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	if victims == 0 {
		t.Error("the victim made no requests")
	}
}
