package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
)

// identityPair serves one connection on an identity listener of server and returns the
// client end.
func identityPair(t *testing.T, server string) (net.Conn, func() string) {
	t.Helper()
	ln, err := net.Listen("unix", t.TempDir()+"/s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	id := identSecrets[server]
	wl, err := WithIdentity(ln, &id)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		c, err := wl.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		b := make([]byte, 5)
		if _, err := io.ReadFull(c, b); err != nil {
			got <- "read: " + err.Error()
			return
		}
		_, _ = c.Write([]byte("pong!"))
		got <- string(b)
	}()
	c, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, func() string {
		select {
		case s := <-got:
			return s
		case <-time.After(5 * time.Second):
			return "timeout"
		}
	}
}

var identSecrets = map[string]agentconfig.Identity{
	"a": {ID: "sandbox-a", Secret: "00112233445566778899aabbccddeeff"},
	"b": {ID: "sandbox-b", Secret: "ffeeddccbbaa99887766554433221100"},
}

func TestIdentityHandshake(t *testing.T) {
	ctx := context.Background()
	t.Run("the expected agent", func(t *testing.T) {
		c, served := identityPair(t, "a")
		want := identSecrets["a"]
		if err := VerifyIdentity(ctx, c, &want); err != nil {
			t.Fatal(err)
		}
		// After the handshake the connection carries the protocol as usual.
		if _, err := c.Write([]byte("ping!")); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 5)
		if _, err := io.ReadFull(c, b); err != nil || string(b) != "pong!" {
			t.Fatalf("after the handshake: %q %v", b, err)
		}
		if s := served(); s != "ping!" {
			t.Errorf("the agent read %q", s)
		}
	})
	t.Run("another sandbox's agent", func(t *testing.T) {
		c, _ := identityPair(t, "b")
		want := identSecrets["a"]
		err := VerifyIdentity(ctx, c, &want)
		if !errors.Is(err, ErrIdentity) {
			t.Fatalf("reached b expecting a: %v, want ErrIdentity", err)
		}
	})
	t.Run("an agent with the right ID and another secret", func(t *testing.T) {
		c, _ := identityPair(t, "a")
		want := identSecrets["a"]
		want.Secret = identSecrets["b"].Secret
		if err := VerifyIdentity(ctx, c, &want); !errors.Is(err, ErrIdentity) {
			t.Fatalf("wrong secret: %v, want ErrIdentity", err)
		}
	})
	t.Run("a peer that sends no handshake", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		go func() {
			buf := make([]byte, 64)
			_, _ = b.Read(buf)
			_, _ = b.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			b.Close()
		}()
		want := identSecrets["a"]
		if err := VerifyIdentity(ctx, a, &want); !errors.Is(err, ErrIdentity) {
			t.Fatalf("a non-agent: %v, want ErrIdentity", err)
		}
	})
	t.Run("a client that sends garbage gets nothing served", func(t *testing.T) {
		c, served := identityPair(t, "a")
		_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789abcdef0123456789"))
		if s := served(); s == "GET /" || s == "ping!" {
			t.Errorf("the agent served a connection without the handshake: %q", s)
		}
	})
}

// BenchmarkDial measures a new agent connection over a unix socket with the identity
// handshake against the floor of the same dial without it (the handshake is paid once per
// connection; calls reuse connections).
func BenchmarkDial(b *testing.B) {
	for _, withID := range []bool{false, true} {
		name := "plain"
		if withID {
			name = "identity"
		}
		b.Run(name, func(b *testing.B) {
			ln, err := net.Listen("unix", b.TempDir()+"/s")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			id := identSecrets["a"]
			srv := ln
			if withID {
				if srv, err = WithIdentity(ln, &id); err != nil {
					b.Fatal(err)
				}
			}
			go func() {
				for {
					c, err := srv.Accept()
					if err != nil {
						return
					}
					go func() {
						buf := make([]byte, 1)
						_, _ = c.Read(buf)
						_, _ = c.Write(buf)
						c.Close()
					}()
				}
			}()
			ctx := context.Background()
			b.ResetTimer()
			for range b.N {
				c, err := net.Dial("unix", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				if withID {
					if err := VerifyIdentity(ctx, c, &id); err != nil {
						b.Fatal(err)
					}
				}
				// One byte each way: the first exchange of any call.
				if _, err := c.Write([]byte{1}); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}
