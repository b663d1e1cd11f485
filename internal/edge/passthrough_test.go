package edge

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/sni/snitest"
)

// workload is a TLS server with a CA of its own, as a sandbox serving passthrough runs.
type workload struct {
	ca   *pki.CA
	addr net.Addr
	sni  chan string // the server name each connection asked for
}

// startWorkload serves host: it reads lines until the client half-closes, answers each
// "got <line>", then says "bye" and closes.
func startWorkload(t *testing.T, host string) *workload {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "workload CA")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.IssueServer(host, []string{host}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	w := &workload{ca: ca, sni: make(chan string, 10)}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		w.sni <- h.ServerName
		return nil, nil
	}}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	w.addr = ln.Addr()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				lines := bufio.NewScanner(c)
				for lines.Scan() {
					if _, err := io.WriteString(c, "got "+lines.Text()+"\n"); err != nil {
						return
					}
				}
				_, _ = io.WriteString(c, "bye\n")
			}()
		}
	}()
	return w
}

func TestPassthroughSplicesTLSToTheWorkload(t *testing.T) {
	te := startEdge(t, nil)
	host := Host(5432, sbxB, testRunner, testDomain)
	w := startWorkload(t, host)
	te.rm.add(Route{SandboxID: sbxB, Port: 5432, Kind: KindPassthrough, Backend: addrPort(t, w.addr)})

	c, err := te.dialTLS(host, w.ca.Pool()) // verifies the workload's certificate, not the edge's
	if err != nil {
		t.Fatalf("handshake through the edge: %v", err)
	}
	defer c.Close()
	if issuer := c.ConnectionState().PeerCertificates[0].Issuer.CommonName; issuer != "workload CA" {
		t.Errorf("client saw a certificate issued by %q, want the workload's", issuer)
	}
	if got := <-w.sni; got != host {
		t.Errorf("workload saw SNI %q, want %q", got, host)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "one\ntwo\n"); err != nil {
		t.Fatal(err)
	}
	// Half-close: the workload sees EOF and still gets its last words through.
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read after half-close: %v", err)
	}
	if want := "got one\ngot two\nbye\n"; string(got) != want {
		t.Errorf("read %q, want %q", got, want)
	}
}

func TestPassthroughToAClosedPortClosesTheConnection(t *testing.T) {
	te := startEdge(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr()
	ln.Close()
	te.rm.add(Route{SandboxID: sbxB, Port: 5432, Kind: KindPassthrough, Backend: addrPort(t, closed)})
	if _, err := te.dialTLS(Host(5432, sbxB, testRunner, testDomain), te.roots); err == nil {
		t.Fatal("handshake succeeded with nothing listening behind the edge")
	}
}

// TestPassthroughIsByteExactAndHalfCloses uses a plain TCP backend to see what the edge
// does on the wire: the ClientHello replayed unchanged, and the client's FIN passed on
// while the other direction stays open.
func TestPassthroughIsByteExactAndHalfCloses(t *testing.T) {
	te := startEdge(t, nil)
	host := Host(5432, sbxB, testRunner, testDomain)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	received := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c) // until the client's FIN arrives through the edge
		received <- b
		_, _ = io.WriteString(c, "bye")
	}()
	te.rm.add(Route{SandboxID: sbxB, Port: 5432, Kind: KindPassthrough, Backend: addrPort(t, ln.Addr())})

	hello := snitest.ClientHello(t, &tls.Config{ServerName: host})
	c, err := net.Dial("tcp", te.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	sent := append(hello, "after the hello"...)
	if _, err := c.Write(sent); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "bye" {
		t.Fatalf("client read %q, %v; want \"bye\" then EOF", got, err)
	}
	if b := <-received; string(b) != string(sent) {
		t.Errorf("backend received %d bytes, want the %d the client sent, unchanged", len(b), len(sent))
	}
}
