package egress

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/sni"
	"github.com/sandboxd/sandboxd/internal/sni/snitest"
)

// TestProxyGrants: real TLS clients through the proxy. A granted name reaches the
// server the name resolves to, which presents its own certificate (nothing decrypts on
// the way); anything else gets an access_denied alert, and no upstream is dialled.
func TestProxyGrants(t *testing.T) {
	e := newProxyEnv(t, nil)
	real, svc := e.real.Addr.Addr().String(), e.svc.Addr.Addr().String()
	for _, tc := range []struct {
		name   string
		src    netip.Addr
		sni    string
		tls12  bool
		server string // address whose server must answer; "" when refused
		why    string // refusal logged
	}{
		{"exact grant", granted, "api.example.test", false, real, ""},
		{"exact grant, other case", granted, "API.Example.TEST", false, real, ""},
		{"exact grant, TLS 1.2", granted, "api.example.test", true, real, ""},
		{"wildcard grant", granted, "a.svc.example.test", false, svc, ""},
		{"wildcard grant, another label", granted, "b.svc.example.test", false, svc, ""},
		{"forbidden address skipped, next one used", granted, "mixed.example.test", false, real, ""},
		{"wildcard does not cover two labels", granted, "a.b.svc.example.test", false, "", "server name not granted"},
		{"wildcard does not cover the apex", granted, "svc.example.test", false, "", "server name not granted"},
		{"name not granted", granted, "other.example.test", false, "", "server name not granted"},
		{"source without grants", stranger, "api.example.test", false, "", "server name not granted"},
		{"no SNI", granted, "", false, "", "no server name"},
		{"granted name resolving to metadata and loopback", granted, "meta.example.test", false, "", "name resolves only to forbidden addresses|169.254.169.254|127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := e.in.ClientConfig(tc.sni)
			if tc.sni == "" {
				cfg.InsecureSkipVerify = true // crypto/tls sends no SNI without a name
			}
			if tc.tls12 {
				cfg.MaxVersion = tls.VersionTLS12
			}
			body, cert, err := e.get(t, tc.src, cfg)
			dials := e.takeDials()
			if tc.server == "" {
				if err == nil || !strings.Contains(err.Error(), "access denied") {
					t.Fatalf("got %q, %v; want an access_denied alert", body, err)
				}
				if len(dials) > 0 {
					t.Errorf("refused connection dialled %v", dials)
				}
				why := strings.Split(tc.why, "|") // the reason, then more the line must have
				waitLog(t, e.log, append(why[1:], "refused: "+why[0], "src="+tc.src.String(), "sni="+tc.sni)...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("server=%s host=%s", tc.server, tc.sni); body != want {
				t.Errorf("body %q, want %q", body, want)
			}
			want := e.real.Cert
			if tc.server == svc {
				want = e.svc.Cert
			}
			if !bytes.Equal(cert.Raw, want.Raw) {
				t.Errorf("client saw certificate %q, want the server's own %q", cert.Subject, want.Subject)
			}
			if last := dials[len(dials)-1]; last != tc.server+":443" {
				t.Errorf("dialled %v, want %s:443 last", dials, tc.server)
			}
		})
	}
}

// TestProxyRefusesRawHellos: what crypto/tls would never send (an IP literal as SNI),
// and what is not TLS at all, never reaches an upstream, even when "granted".
func TestProxyRefusesRawHellos(t *testing.T) {
	e := newProxyEnv(t, nil)
	real := e.real.Addr.Addr().String()
	for _, tc := range []struct {
		name  string
		in    []byte
		reply []byte // what the proxy sends back before closing
		why   string
	}{
		{"IP literal SNI (granted as such)", helloWithName(t, real), alertAccessDenied, "server name is an IP address"},
		{"IPv4 shorthand SNI (granted as such)", helloWithName(t, "10.1"), alertAccessDenied, "server name is an IP address"},
		{"numeric last label", helloWithName(t, "api.example.123"), alertAccessDenied, "server name is an IP address"},
		{"HTTP", []byte("GET / HTTP/1.1\r\nHost: api.example.test\r\n\r\n"), nil, "no TLS ClientHello"},
		{"SSH", []byte("SSH-2.0-OpenSSH_9.6\r\n"), nil, "no TLS ClientHello"},
		{"handshake record that is no ClientHello", []byte{22, 3, 1, 0, 4, 2, 0, 0, 0}, nil, "no TLS ClientHello"},
		{"oversized record", []byte{22, 3, 1, 0xff, 0xff}, nil, "no TLS ClientHello"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.dial(t, granted)
			if _, err := c.Write(tc.in); err != nil {
				t.Fatal(err)
			}
			got, err := readAllUntilClosed(c, 5*time.Second)
			if err != nil {
				t.Fatalf("connection not closed: %v", err)
			}
			if !bytes.Equal(got, tc.reply) {
				t.Errorf("proxy sent %x, want %x", got, tc.reply)
			}
			if d := e.takeDials(); len(d) > 0 {
				t.Errorf("dialled %v", d)
			}
			waitLog(t, e.log, "refused: "+tc.why)
		})
	}
	if n := e.real.Conns() + e.evil.Conns(); n != 0 {
		t.Errorf("servers saw %d connections", n)
	}
}

// TestProxySlowClient: a client that never completes its ClientHello is cut off after
// HandshakeTimeout, holding nothing.
func TestProxySlowClient(t *testing.T) {
	e := newProxyEnv(t, func(p *Proxy) { p.HandshakeTimeout = 300 * time.Millisecond })
	hello := snitest.ClientHello(t, e.in.ClientConfig("api.example.test"))
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"silent", nil},
		{"half a record header", hello[:3]},
		{"half a hello", hello[:len(hello)/2]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.dial(t, granted)
			start := time.Now()
			if _, err := c.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			got, err := readAllUntilClosed(c, 5*time.Second)
			if err != nil {
				t.Fatalf("not cut off: %v", err)
			}
			if el := time.Since(start); el < 250*time.Millisecond || el > 3*time.Second {
				t.Errorf("cut off after %v, want about 300ms", el)
			}
			if len(got) > 0 {
				t.Errorf("proxy sent %x", got)
			}
			if d := e.takeDials(); len(d) > 0 {
				t.Errorf("dialled %v", d)
			}
		})
	}
	waitLog(t, e.log, "refused: no TLS ClientHello", "timeout")
}

// TestProxyForbidden: the caller's Forbidden replaces the default, so a granted name
// resolving into, say, the sandbox subnet is never dialled.
func TestProxyForbidden(t *testing.T) {
	var e *proxyEnv
	e = newProxyEnv(t, func(p *Proxy) {
		p.Forbidden = func(a netip.Addr) bool { return e.in.Prefix.Contains(a) }
	})
	_, _, err := e.get(t, granted, e.in.ClientConfig("api.example.test"))
	if err == nil || !strings.Contains(err.Error(), "access denied") {
		t.Fatalf("got %v, want access denied", err)
	}
	if d := e.takeDials(); len(d) > 0 {
		t.Errorf("dialled %v", d)
	}
	waitLog(t, e.log, "refused: name resolves only to forbidden addresses", e.real.Addr.Addr().String(), "sni=api.example.test")
}

// TestProxyUpstreamFailures: a granted name that does not resolve, or whose server is
// down, ends the connection without an alert (the refusal is not the sandbox's policy).
func TestProxyUpstreamFailures(t *testing.T) {
	e := newProxyEnv(t, nil)
	for _, tc := range []struct{ sni, why string }{
		{"gone.example.test", "resolve"},
		{"dead.example.test", "connect"},
	} {
		t.Run(tc.sni, func(t *testing.T) {
			_, _, err := e.get(t, granted, e.in.ClientConfig(tc.sni))
			if err == nil || strings.Contains(err.Error(), "access denied") {
				t.Fatalf("got %v, want the connection closed", err)
			}
			waitLog(t, e.log, "refused: "+tc.why, "sni="+tc.sni)
		})
	}
}

// TestProxyOriginalDestinationIgnored: as in production, nftables redirects the
// connection to the proxy (here with an OUTPUT DNAT of our own). The client connects to
// evil's address with the granted name; the proxy dials what the name resolves to, so
// the client gets the real server, not evil, though evil has a certificate for the name.
func TestProxyOriginalDestinationIgnored(t *testing.T) {
	e := newProxyEnv(t, nil)
	l, err := net.Listen("tcp", netip.AddrPortFrom(e.in.Gateway, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.proxy.Serve(l) }()
	evil := e.evil.Addr
	cfg := e.in.ClientConfig("api.example.test")

	// Without the redirect the client would reach evil.
	c, err := net.DialTimeout("tcp", evil.String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	body, _, err := getOver(c, cfg)
	c.Close()
	if want := "server=" + evil.Addr().String(); err != nil || !strings.HasPrefix(body, want) {
		t.Fatalf("direct: %q, %v; want %q", body, err, want)
	}

	table := fmt.Sprintf("egtp%d", l.Addr().(*net.TCPAddr).Port)
	rules := fmt.Sprintf(`table ip %s {
	chain out {
		type nat hook output priority -100; policy accept;
		ip daddr %s tcp dport 443 dnat to %s
	}
}`, table, evil.Addr(), l.Addr())
	nft := exec.Command("nft", "-f", "-")
	nft.Stdin = strings.NewReader(rules)
	if out, err := nft.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", "ip", table).Run() })

	c, err = net.DialTimeout("tcp", evil.String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body, cert, err := getOver(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("server=%s host=api.example.test", e.real.Addr.Addr()); body != want {
		t.Errorf("through the proxy: %q, want %q", body, want)
	}
	if !bytes.Equal(cert.Raw, e.real.Cert.Raw) {
		t.Errorf("client saw %q's certificate, want the real server's", cert.Subject)
	}
	if d := e.takeDials(); !slices.Equal(d, []string{e.real.Addr.String()}) {
		t.Errorf("dialled %v, want [%s]", d, e.real.Addr)
	}
	waitLog(t, e.log, "spliced", "src="+e.in.Gateway.String())
}

// TestProxySplice: below TLS, the upstream gets the ClientHello byte for byte and then
// the rest of the stream, and half-closes pass through both ways: the client's FIN
// reaches the upstream, whose answer after it still reaches the client.
func TestProxySplice(t *testing.T) {
	e := newProxyEnv(t, nil)
	a := e.in.Addr(t)
	e.in.SetA("raw.example.test", a)
	e.grants[granted] = append(e.grants[granted], "raw.example.test")
	l, err := e.in.Listen("tcp", netip.AddrPortFrom(a, 443).String())
	if err != nil {
		t.Fatal(err)
	}
	// The upstream reads to EOF, then answers with the length and hash of what it got.
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		fmt.Fprintf(c, "%d %x", len(b), sha256.Sum256(b))
	}()
	hello := snitest.ClientHello(t, e.in.ClientConfig("raw.example.test"))
	rest := bytes.Repeat([]byte("0123456789"), 100_000) // 1 MB after the hello
	sent := append(append([]byte(nil), hello...), rest...)

	c := e.dial(t, granted)
	go func() {
		_, _ = c.Write(sent)
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	got, err := readAllUntilClosed(c, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d %x", len(sent), sha256.Sum256(sent)); string(got) != want {
		t.Errorf("upstream got %q, want %q", got, want)
	}
}

// TestProxyClose: Close ends connections being spliced and Serve returns nil; Shutdown
// waits for them until its context ends.
func TestProxyClose(t *testing.T) {
	e := newProxyEnv(t, nil)
	c := e.dial(t, granted)
	tc := tls.Client(c, e.in.ClientConfig("api.example.test"))
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	// Shutdown gives up when its context does: the connection is idle, not finishing.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := e.proxy.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown: %v, want deadline exceeded", err)
	}
	_ = tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := tc.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		t.Errorf("read after shutdown: %v, want the connection closed", err)
	}
	select {
	case err := <-e.serveErr:
		e.serveErr <- err // for the cleanup
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
	if err := e.proxy.Serve(mustListen(t)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Serve after Close: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func mustListen(t testing.TB) net.Listener {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// FuzzSNIPath: whatever bytes a sandbox sends first, the proxy splices only for a
// server name that is neither empty nor IP-like and that a grant matches.
func FuzzSNIPath(f *testing.F) {
	for _, n := range []string{"api.example.test", "a.svc.example.test", "a.b.svc.example.test", "198.51.100.7", "10.1"} {
		f.Add(helloWithName(f, n))
	}
	f.Add(snitest.ClientHello(f, &tls.Config{InsecureSkipVerify: true}))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	grants := []string{"api.example.test", "*.svc.example.test", "198.51.100.7", "10.1"}
	f.Fuzz(func(t *testing.T, in []byte) {
		raw, name, err := sni.Read(bytes.NewReader(in))
		if !bytes.HasPrefix(in, raw) {
			t.Fatal("raw is not a prefix of the input")
		}
		if err != nil {
			return
		}
		if refusal(name, grants) != "" {
			return
		}
		if name == "" || isIPLike(name) {
			t.Fatalf("would splice for %q", name)
		}
		if _, err := netip.ParseAddr(name); err == nil {
			t.Fatalf("would splice for IP %q", name)
		}
		n := strings.ToLower(name)
		if n != "api.example.test" && (!strings.HasSuffix(n, ".svc.example.test") || strings.Count(n, ".") != 3) {
			t.Fatalf("would splice for ungranted %q", name)
		}
	})
}

// TestProxyMaxConnsPerSource: one sandbox's connections beyond the cap are closed at
// once; another sandbox is not affected.
func TestProxyMaxConnsPerSource(t *testing.T) {
	e := newProxyEnv(t, func(p *Proxy) { p.MaxConnsPerSource = 2 })
	// Two silent connections hold granted's slots (for the 2 s handshake timeout).
	e.dial(t, granted)
	e.dial(t, granted)
	waitFor(t, "two connections from granted", func() bool {
		e.proxy.mu.Lock()
		defer e.proxy.mu.Unlock()
		return e.proxy.perSource[granted] == 2
	})
	start := time.Now()
	got, err := readAllUntilClosed(e.dial(t, granted), 5*time.Second)
	if err != nil || len(got) > 0 || time.Since(start) > time.Second {
		t.Errorf("third connection: read %x, %v after %v; want closed at once", got, err, time.Since(start))
	}
	waitLog(t, e.log, "refused: 2 connections from this source already", "src="+granted.String())
	// Another source still gets through, and so does granted once a slot is free.
	if _, _, err := e.get(t, stranger, &tls.Config{InsecureSkipVerify: true, ServerName: "x.example.test"}); err == nil || !strings.Contains(err.Error(), "access denied") {
		t.Errorf("other source: %v, want its own refusal (access denied), not the cap", err)
	}
	waitFor(t, "granted's slots to free", func() bool {
		e.proxy.mu.Lock()
		defer e.proxy.mu.Unlock()
		return e.proxy.perSource[granted] == 0
	})
	if _, _, err := e.get(t, granted, e.in.ClientConfig("api.example.test")); err != nil {
		t.Errorf("after the slots freed: %v", err)
	}
}

// TestProxyShutdownGraceful: Shutdown stops accepting but lets a spliced connection
// finish its exchange, then returns nil.
func TestProxyShutdownGraceful(t *testing.T) {
	e := newProxyEnv(t, nil)
	c := e.dial(t, granted)
	tc := tls.Client(c, e.in.ClientConfig("api.example.test"))
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- e.proxy.Shutdown(ctx)
	}()
	waitFor(t, "the listener to close", func() bool {
		c, err := net.DialTimeout("tcp", e.addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a connection open", err)
	default:
	}
	if _, err := io.WriteString(tc, "GET / HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := io.ReadAll(tc)
	if want := "server=" + e.real.Addr.Addr().String(); err != nil || !strings.Contains(string(resp), want) {
		t.Fatalf("response %q, %v; want one with %q", resp, err, want)
	}
	// The server's FIN reached the client; the connection ends when the client's does.
	_ = tc.Close()
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// TestProxyCloseWhileDialling: Close does not wait out an upstream that does not answer.
func TestProxyCloseWhileDialling(t *testing.T) {
	e := newProxyEnv(t, nil)
	nowhere := e.in.Prefix.Addr().As4()
	nowhere[3] = 250 // routed into the Internet, but no one has it: the dial hangs
	e.in.SetA("api.example.test", netip.AddrFrom4(nowhere))
	c := e.dial(t, granted)
	if _, err := c.Write(snitest.ClientHello(t, e.in.ClientConfig("api.example.test"))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the dial", func() bool { return len(e.takeDials()) > 0 })
	start := time.Now()
	_ = e.proxy.Close()
	if el := time.Since(start); el > time.Second {
		t.Errorf("Close took %v", el)
	}
	if got, err := readAllUntilClosed(c, 5*time.Second); err != nil || len(got) > 0 {
		t.Errorf("client read %x, %v; want the connection closed", got, err)
	}
}

// TestProxyKnownSources: with Known set, a connection from a source that is no sandbox is
// closed at once, before its ClientHello is read (not after the handshake timeout, and
// without a TLS alert); a known source is served as before.
func TestProxyKnownSources(t *testing.T) {
	e := newProxyEnv(t, func(p *Proxy) { p.Known = func(src netip.Addr) bool { return src == granted } })
	start := time.Now()
	c := e.dial(t, stranger)
	if _, err := c.Write(helloWithName(t, "api.example.test")); err != nil {
		t.Logf("write: %v", err) // the proxy may have closed it already
	}
	got, err := readAllUntilClosed(c, 5*time.Second)
	if err != nil || len(got) > 0 || time.Since(start) > time.Second {
		t.Errorf("unknown source: read %x, %v after %v; want closed at once with nothing sent", got, err, time.Since(start))
	}
	waitLog(t, e.log, "refused: the source is no sandbox", "src="+stranger.String())
	if len(e.takeDials()) != 0 {
		t.Error("an upstream was dialled for an unknown source")
	}
	if _, _, err := e.get(t, granted, e.in.ClientConfig("api.example.test")); err != nil {
		t.Errorf("known source: %v", err)
	}
}

// TestForbiddenWith: the default reserved ranges and the extra ones are forbidden, other
// public addresses are not.
func TestForbiddenWith(t *testing.T) {
	f := ForbiddenWith(netip.MustParsePrefix("34.118.224.0/20"), netip.MustParsePrefix("198.18.7.9/32"))
	for a, want := range map[string]bool{
		"10.96.0.1": true, "169.254.169.254": true, "127.0.0.1": true, // reserved
		"64:ff9b::a9fe:a9fe": true, "64:ff9b:1::a00:1": true, // NAT64 of metadata and 10.0.0.1
		"34.118.230.4": true, "::ffff:34.118.230.4": true, "198.18.7.9": true, // extra
		"34.118.240.1": false, "198.18.7.10": false, "93.184.216.34": false,
	} {
		if got := f(netip.MustParseAddr(a)); got != want {
			t.Errorf("%s: forbidden %v, want %v", a, got, want)
		}
	}
}

// TestProxyMaxConns: with MaxConns, connections beyond it from any source are closed at
// once; a slot freed is taken again.
func TestProxyMaxConns(t *testing.T) {
	e := newProxyEnv(t, func(p *Proxy) { p.MaxConns = 1 })
	e.dial(t, granted) // silent: holds the one slot for the 2 s handshake timeout
	waitFor(t, "one connection", func() bool {
		e.proxy.mu.Lock()
		defer e.proxy.mu.Unlock()
		return e.proxy.total == 1
	})
	start := time.Now()
	got, err := readAllUntilClosed(e.dial(t, stranger), 5*time.Second)
	if err != nil || len(got) > 0 || time.Since(start) > time.Second {
		t.Errorf("second connection: read %x, %v after %v; want closed at once", got, err, time.Since(start))
	}
	waitLog(t, e.log, "refused: 1 connections in all already", "src="+stranger.String())
	waitFor(t, "the slot to free", func() bool {
		e.proxy.mu.Lock()
		defer e.proxy.mu.Unlock()
		return e.proxy.total == 0
	})
	if _, _, err := e.get(t, granted, e.in.ClientConfig("api.example.test")); err != nil {
		t.Errorf("after the slot freed: %v", err)
	}
}

// TestProxyMaxConnsPerGroup: with Group, one organization's sources together hold at
// most MaxConnsPerGroup connections; another source of that organization is closed at
// once, another organization's is taken; the counts go when the connections do.
func TestProxyMaxConnsPerGroup(t *testing.T) {
	otherOrg := netip.MustParseAddr("127.0.0.4")
	e := newProxyEnv(t, func(p *Proxy) {
		p.MaxConnsPerGroup = 1
		p.Group = func(src netip.Addr) string {
			if src == otherOrg {
				return "org-b"
			}
			return "org-a"
		}
	})
	groupCount := func(g string) int {
		e.proxy.mu.Lock()
		defer e.proxy.mu.Unlock()
		return e.proxy.perGroup[g]
	}
	e.dial(t, granted) // silent: holds org-a's one slot for the 2 s handshake timeout
	waitFor(t, "org-a's connection", func() bool { return groupCount("org-a") == 1 })
	start := time.Now()
	got, err := readAllUntilClosed(e.dial(t, stranger), 5*time.Second)
	if err != nil || len(got) > 0 || time.Since(start) > time.Second {
		t.Errorf("org-a's second source: read %x, %v after %v; want closed at once", got, err, time.Since(start))
	}
	waitLog(t, e.log, "refused: 1 connections of this source's organization already", "src="+stranger.String())
	e.dial(t, otherOrg)
	waitFor(t, "org-b's connection", func() bool { return groupCount("org-b") == 1 })
	waitFor(t, "the slots to free", func() bool {
		e.proxy.mu.Lock()
		defer e.proxy.mu.Unlock()
		return len(e.proxy.perGroup) == 0 && len(e.proxy.groupOf) == 0 && e.proxy.total == 0
	})
}
