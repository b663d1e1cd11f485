package splice

import (
	"bytes"
	"io"
	"net"
	"sync/atomic"
	"testing"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t testing.TB) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// TestJoinPassesDataAndHalfCloses: client → a|b → server. The client's half-close reaches
// the server, which can still answer, and the answer reaches the client before its EOF.
func TestJoinPassesDataAndHalfCloses(t *testing.T) {
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	joined := make(chan struct{})
	go func() { Join(a, b); close(joined) }()

	req := bytes.Repeat([]byte("request "), 64<<10) // larger than socket buffers
	go func() { _, _ = client.Write(req); _ = client.CloseWrite() }()
	got, err := io.ReadAll(server)
	if err != nil || !bytes.Equal(got, req) {
		t.Fatalf("server read %d bytes (%v), want the %d sent then EOF", len(got), err, len(req))
	}
	if _, err := server.Write([]byte("answer")); err != nil {
		t.Fatal(err)
	}
	_ = server.CloseWrite()
	ans, err := io.ReadAll(client)
	if err != nil || string(ans) != "answer" {
		t.Fatalf("client read %q (%v), want the answer after its own half-close", ans, err)
	}
	<-joined
}

// TestJoinEndsOnReset: one side going away ends the join rather than leaving it waiting.
func TestJoinEndsOnReset(t *testing.T) {
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	joined := make(chan struct{})
	go func() { Join(a, b); close(joined) }()
	_ = client.SetLinger(0)
	_ = client.Close() // RST
	<-joined           // without the server doing anything
	if _, err := io.ReadAll(server); err != nil {
		t.Logf("server: %v", err) // EOF or reset: either way it learns the client is gone
	}
}

type counter struct{ n, adds atomic.Int64 }

func (c *counter) Add(n int64) { c.n.Add(n); c.adds.Add(1) }

// TestJoinCountedCountsEachWayBeforeItsHalfClose: the bytes each way are counted, in
// chunks, and a direction's count is complete before its end reaches the other side.
func TestJoinCountedCountsEachWayBeforeItsHalfClose(t *testing.T) {
	client, a := tcpPair(t)
	b, server := tcpPair(t)
	var in, out counter
	joined := make(chan struct{})
	go func() { JoinCounted(a, b, &in, &out); close(joined) }()

	req := bytes.Repeat([]byte("r"), 3*Chunk+5)
	go func() { _, _ = client.Write(req); _ = client.CloseWrite() }()
	got, err := io.ReadAll(server)
	if err != nil || len(got) != len(req) {
		t.Fatalf("server read %d bytes (%v), want %d", len(got), err, len(req))
	}
	if n := in.n.Load(); n != int64(len(req)) {
		t.Errorf("client to server counted %d at the server's EOF, want %d", n, len(req))
	}
	if adds := in.adds.Load(); adds < 4 {
		t.Errorf("%d adds for %d bytes, want one per %d-byte chunk and the rest", adds, len(req), Chunk)
	}
	if _, err := server.Write([]byte("answer")); err != nil {
		t.Fatal(err)
	}
	_ = server.CloseWrite()
	if ans, err := io.ReadAll(client); err != nil || string(ans) != "answer" {
		t.Fatalf("client read %q (%v)", ans, err)
	}
	if n := out.n.Load(); n != int64(len("answer")) {
		t.Errorf("server to client counted %d at the client's EOF, want %d", n, len("answer"))
	}
	<-joined
}

// BenchmarkJoin moves 64 MiB client → server through a join, uncounted (the peer) and
// counted in Chunk steps (what the edge's passthrough does): the cost of counting.
func BenchmarkJoin(b *testing.B) {
	payload := make([]byte, 1<<20)
	for _, counted := range []bool{false, true} {
		name := "uncounted"
		if counted {
			name = "counted"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(64 << 20)
			for b.Loop() {
				client, a := tcpPair(b)
				bb, server := tcpPair(b)
				var in, out counter
				go func() {
					if counted {
						JoinCounted(a, bb, &in, &out)
					} else {
						Join(a, bb)
					}
				}()
				go func() {
					for range 64 {
						_, _ = client.Write(payload)
					}
					_ = client.CloseWrite()
				}()
				if n, _ := io.Copy(io.Discard, server); n != 64<<20 {
					b.Fatalf("moved %d bytes", n)
				}
				client.Close()
				server.Close()
			}
		})
	}
}
