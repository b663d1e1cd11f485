package gate

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSendHellos: nothing is sent before the agent's socket exists; then the hellos
// arrive, name the sandbox and the sender's address, and verify under the key.
func TestSendHellos(t *testing.T) {
	dir := t.TempDir()
	key := bytes.Repeat([]byte{3}, HelloKeyLen)
	keyFile := filepath.Join(dir, HelloKeyFile)
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	sock := filepath.Join(dir, Socket)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go SendHellos(ctx, pc.LocalAddr().String(), "sbx1", keyFile, sock, slog.New(slog.DiscardHandler))
	buf := make([]byte, 512)
	_ = pc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, _, err := pc.ReadFromUDP(buf); err == nil {
		t.Fatal("a hello before the agent's socket exists")
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for i := range helloAt {
		_ = pc.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, src, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("hello %d: %v", i, err)
		}
		h, err := ParseHello(buf[:n])
		if err != nil || h.ID != "sbx1" || h.IP != src.Addr().Unmap() || !h.Verify(key) || time.Since(h.At) > time.Second {
			t.Fatalf("hello %d from %s: %+v %v", i, src, h, err)
		}
	}
}

// TestServeHelloLate: the gate sends its hello however late the agent's socket appears
// (a large image's pull), not only within its upstream dial timeout.
func TestServeHelloLate(t *testing.T) {
	dir := t.TempDir()
	keyPair(t, dir, "server")
	keyPair(t, dir, "client")
	key := bytes.Repeat([]byte{5}, HelloKeyLen)
	keyFile := filepath.Join(dir, HelloKeyFile)
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	sock := filepath.Join(dir, "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = Serve(ctx, ServeOptions{
			Listen: addr, CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key"),
			ClientCertFile: filepath.Join(dir, "client.crt"), Upstream: sock, StatusFile: filepath.Join(dir, "status.json"),
			TerminationLog: filepath.Join(dir, "termination-log"), DialTimeout: 50 * time.Millisecond,
			HelloAddr: pc.LocalAddr().String(), HelloID: "late1", HelloKeyFile: keyFile,
		})
	}()
	time.Sleep(500 * time.Millisecond) // 10x the dial timeout
	up, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	buf := make([]byte, 512)
	_ = pc.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, _, err := pc.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("no hello after the socket appeared late: %v", err)
	}
	if h, err := ParseHello(buf[:n]); err != nil || h.ID != "late1" || !h.Verify(key) {
		t.Fatalf("hello %+v %v", h, err)
	}
}
