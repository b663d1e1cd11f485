package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/egress/egresstest"
	rt "github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
)

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// testNet is a test network and the Manager in charge of it (replaced by restart).
type testNet struct {
	m   *network.Manager
	cfg network.Config
}

// restart closes the Manager and makes a new one on the same state, as a restarted
// runner does.
func (n *testNet) restart(tb testing.TB) {
	n.m.Close()
	m, err := network.New(n.cfg)
	if err != nil {
		tb.Fatal(err)
	}
	n.m = m
}

// withRulesNetwork gives e's backend a test network with a random bridge, table and
// /24 (so runs from several checkouts at once do not collide), removed when tb ends.
func (e *env) withRulesNetwork(tb testing.TB, mutate func(*network.Config)) *testNet {
	tb.Helper()
	h := randHex(3)
	cfg := network.Config{
		Bridge: "sbxr" + h, Subnet: freeSubnet(tb), StateDir: tb.TempDir(), Nameservers: []string{},
		Table: "sbxrtest_" + h, Egress: true,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := network.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	n := &testNet{m: m, cfg: cfg}
	tb.Cleanup(func() {
		if err := n.m.Cleanup(); err != nil {
			tb.Errorf("network cleanup: %v", err)
		}
		n.m.Close()
	})
	e.b.cfg.Network = netAdapter{m}
	return n
}

func nftList(tb testing.TB, table string) string {
	out, err := exec.Command("nft", "list", "table", "inet", table).CombinedOutput()
	if err != nil {
		tb.Fatalf("nft list table %s: %v %s", table, err, out)
	}
	return string(out)
}

// freeSubnet picks a /24 in 10.235.0.0/16 that no host route overlaps.
func freeSubnet(tb testing.TB) netip.Prefix {
	routes, err := netlink.RouteList(nil, unix.AF_INET)
	if err != nil {
		tb.Fatal(err)
	}
	for range 100 {
		b := make([]byte, 1)
		_, _ = rand.Read(b)
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 235, b[0], 0}), 24)
		clash := false
		for _, r := range routes {
			if r.Dst != nil {
				rp, err := netip.ParsePrefix(r.Dst.String())
				clash = clash || err == nil && rp.Bits() > 0 && rp.Overlaps(p)
			}
		}
		if !clash {
			return p
		}
	}
	tb.Fatal("no free test subnet")
	return netip.Prefix{}
}

// testWorld is a network namespace standing for the outside: HTTP servers on a public
// address (203.0.113.x), a second public one (198.51.100.x) and a private one (10.x),
// reached from the sandboxes through the host (masqueraded). Only the test subnet is
// routed to it, by a policy-routing rule of its own; the host's routes are untouched.
type testWorld struct {
	ns              string     // named netns
	hostAddr, addr  netip.Addr // the link: host side, world side
	pub, pub2, priv netip.Addr
}

func newTestWorld(t *testing.T, m *network.Manager) *testWorld {
	t.Helper()
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	w := &testWorld{
		ns:       "sbxrw" + randHex(4),
		hostAddr: netip.AddrFrom4([4]byte{198, 18, b[0], 1}),
		addr:     netip.AddrFrom4([4]byte{198, 18, b[0], 2}),
		pub:      netip.AddrFrom4([4]byte{203, 0, 113, b[1]}),
		pub2:     netip.AddrFrom4([4]byte{198, 51, 100, b[1]}),
		priv:     netip.AddrFrom4([4]byte{10, 199, b[0], b[1]}),
	}
	// NewNamed switches the calling thread: do it on one that is then thrown away.
	errc := make(chan error, 1)
	var nsh netns.NsHandle
	go func() {
		runtime.LockOSThread()
		var err error
		nsh, err = netns.NewNamed(w.ns)
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		nsh.Close()
		if err := netns.DeleteNamed(w.ns); err != nil {
			t.Error(err)
		}
	})
	link := "sbxrwl" + randHex(3)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: link, Flags: net.FlagUp, TxQLen: -1}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(nsh)), PeerTxQLen: -1}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	ipnet := func(a netip.Addr, bits int) *net.IPNet {
		return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
	}
	if err := netlink.AddrAdd(veth, &netlink.Addr{IPNet: ipnet(w.hostAddr, 24)}); err != nil {
		t.Fatal(err)
	}
	nh, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	eth, err := nh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []*net.IPNet{ipnet(w.addr, 24), ipnet(w.pub, 32), ipnet(w.pub2, 32), ipnet(w.priv, 32)} {
		if err := nh.AddrAdd(eth, &netlink.Addr{IPNet: a}); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"lo", "eth0"} {
		if l, err := nh.LinkByName(l); err == nil {
			_ = nh.LinkSetUp(l)
		}
	}
	if err := nh.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: w.hostAddr.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	_, _ = nh.LinkByIndex(eth.Attrs().Index) // apply the carrier change now (see network.syncLink)
	hl, err := netlink.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	br, err := netlink.LinkByName(m.Bridge())
	if err != nil {
		t.Fatal(err)
	}
	table := 30000 + int(b[0])<<8 + int(b[1])
	sub := &net.IPNet{IP: m.Subnet().Addr().AsSlice(), Mask: net.CIDRMask(m.Subnet().Bits(), 32)}
	for _, r := range []*netlink.Route{
		{LinkIndex: br.Attrs().Index, Dst: sub, Table: table, Scope: netlink.SCOPE_LINK},
		{LinkIndex: hl.Attrs().Index, Gw: w.addr.AsSlice(), Table: table},
	} {
		if err := netlink.RouteAdd(r); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netlink.RouteDel(r) })
	}
	rule := netlink.NewRule()
	rule.Src, rule.Table, rule.Priority = sub, table, 100
	if err := netlink.RuleAdd(rule); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.RuleDel(rule) })
	// HTTP on 80 of every address: the answer names the address asked.
	w.listen(t, "0.0.0.0:80", http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "world %s\n", r.Context().Value(http.LocalAddrContextKey))
	}))
	return w
}

// inNS runs fn on a thread in the world's namespace (thrown away afterwards).
func (w *testWorld) inNS(fn func() error) error {
	return inNamespace("/var/run/netns/"+w.ns, unix.CLONE_NEWNET, fn)
}

func (w *testWorld) listen(t *testing.T, addr string, h http.Handler) net.Listener {
	var ln net.Listener
	if err := w.inNS(func() (err error) { ln, err = net.Listen("tcp4", addr); return err }); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return ln
}

// get fetches http://addr/ from the world (a client outside the host) and returns the
// body. The socket is made on a thread in the world's namespace (an http.Client would
// dial from any thread, i.e. from the host).
func (w *testWorld) get(addr string) (string, error) {
	var c net.Conn
	if err := w.inNS(func() (err error) { c, err = net.DialTimeout("tcp4", addr, time.Second); return err }); err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.0\r\n\r\n"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	_, body, _ := strings.Cut(string(b), "\r\n\r\n")
	return body, nil
}

// wget fetches url (http://ip:port/) inside the sandbox and returns the body, "" when
// it failed. (busybox nc: Debian's static busybox wget crashes looking up "http" in NSS.)
// Safe to call from any goroutine.
func wget(e *env, id, url string) string {
	hostport := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")
	host, port, _ := net.SplitHostPort(hostport)
	out, code := run(e, id, "sh", "-c", `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 1 "$0" "$1"`, host, port)
	if code != 0 || !strings.HasPrefix(out, "HTTP/1.") {
		return ""
	}
	_, body, _ := strings.Cut(out, "\r\n\r\n")
	return body
}

// TestSandboxNetworkRules: a real sandbox under each runtime class reaches exactly what
// its spec's network rules allow, whatever it does inside; its CUSTOM port opens to the
// sources its ingress rules name; the rules hold after a runner restart.
func TestSandboxNetworkRules(t *testing.T) {
	for _, class := range []string{"runc", GVisorClass} {
		t.Run(class, func(t *testing.T) {
			e := newEnv(t)
			if e.b.runtimes[class] == nil {
				t.Skipf("no %s runtime", class)
			}
			tn := e.withRulesNetwork(t, nil)
			w := newTestWorld(t, tn.m)
			org := map[string]string{rt.MetaOrg: "org-1"}
			www := []rt.File{{Path: "/www/index.html", Content: []byte("sandbox\n")}}
			link := netip.PrefixFrom(w.addr, 24).Masked().String()
			srv := e.create(rt.Spec{ID: "srv-" + class, RuntimeClass: class, Meta: org, Container: rt.Container{Files: www, Command: "sh", Args: []string{"-c", "httpd -p 8080 -h /www && httpd -p 7070 -h /www && exec httpd -f -p 9090 -h /www"}},
				Services: []rt.Service{{Port: 8080, Visibility: "private"}, {Port: 9090, Visibility: "custom"}},
				Network:  &rt.Network{Ingress: []rt.IngressRule{{CIDR: link}, {Tenant: rt.TenantSameOrg, Ports: []rt.PortRange{{Port: 9090}}}}}})
			cli := e.create(rt.Spec{ID: "cli-" + class, RuntimeClass: class, Meta: org, Container: rt.Container{Command: "sleep", Args: []string{"3600"}},
				Network: &rt.Network{Egress: []rt.EgressRule{
					{CIDR: w.pub.String() + "/32", Ports: []rt.PortRange{{Port: 80}}},
					{Tenant: rt.TenantSameOrg, Ports: []rt.PortRange{{Port: 8080}}},
				}}})
			peer := e.create(rt.Spec{ID: "peer-" + class, RuntimeClass: class, Meta: org, Container: rt.Container{Command: "sleep", Args: []string{"3600"}},
				Network: &rt.Network{Egress: []rt.EgressRule{{Tenant: rt.TenantSameOrg}}}})
			deny := e.create(rt.Spec{ID: "deny-" + class, RuntimeClass: class, Meta: org, Container: rt.Container{Command: "sleep", Args: []string{"3600"}},
				Network: &rt.Network{DenyEgress: true}})
			old := e.create(rt.Spec{ID: "old-" + class, RuntimeClass: class, Container: rt.Container{Command: "sleep", Args: []string{"3600"}}}) // no rules: as before

			url := func(ip string, port int) string {
				return fmt.Sprintf("http://%s/", net.JoinHostPort(ip, fmt.Sprint(port)))
			}
			type probe struct {
				from, url string
				ok        bool
			}
			probes := []probe{
				{cli.ID, url(w.pub.String(), 80), true},
				{cli.ID, url(w.pub2.String(), 80), false},
				{cli.ID, url(w.priv.String(), 80), false},
				{cli.ID, url(srv.IP, 8080), true},   // private port, same_org egress on 8080
				{cli.ID, url(srv.IP, 9090), false},  // its egress does not cover 9090
				{cli.ID, url(srv.IP, 7070), false},  // undeclared
				{peer.ID, url(srv.IP, 9090), true},  // CUSTOM port, srv's same_org ingress rule
				{peer.ID, url(srv.IP, 7070), false}, // undeclared
				{peer.ID, url(w.pub.String(), 80), false},
				{deny.ID, url(w.pub.String(), 80), false},
				{deny.ID, url(srv.IP, 8080), false},
				{old.ID, url(w.priv.String(), 80), true},
				{old.ID, url(srv.IP, 8080), false}, // no organization
			}
			check := func(t *testing.T) {
				// srv's httpd may still be starting.
				for i := 0; i < 50 && wget(e, cli.ID, url(srv.IP, 8080)) == ""; i++ {
					time.Sleep(50 * time.Millisecond)
				}
				got := make([]string, len(probes))
				var wg sync.WaitGroup
				for i, p := range probes {
					wg.Go(func() { got[i] = wget(e, p.from, p.url) })
				}
				wg.Wait()
				for i, p := range probes {
					if (got[i] != "") != p.ok {
						t.Errorf("%s -> %s: got %q, want allowed=%v", p.from, p.url, got[i], p.ok)
					}
				}
				// From outside the host: the CUSTOM port by the CIDR rule, not the PRIVATE one.
				if body, err := w.get(net.JoinHostPort(srv.IP, "9090")); err != nil || body != "sandbox\n" {
					t.Errorf("world -> custom port: %q %v", body, err)
				}
				if body, err := w.get(net.JoinHostPort(srv.IP, "8080")); err == nil {
					t.Errorf("world reached the private port: %q", body)
				}
			}
			t.Run("rules", check)

			// A runner restart: a new network Manager and a new Backend on the same state.
			tn.restart(t)
			e.b = e.backend()
			e.b.cfg.Network = netAdapter{tn.m}
			if _, err := e.b.Recover(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Run("after restart", check)
			for _, id := range []string{srv.ID, cli.ID, peer.ID, deny.ID, old.ID} {
				if err := e.b.Destroy(context.Background(), id); err != nil {
					t.Fatal(err)
				}
			}
			out := nftList(t, tn.cfg.Table)
			for _, ip := range []string{srv.IP, cli.IP, peer.IP, deny.IP, old.IP} {
				if strings.Contains(out, ip+" ") {
					t.Errorf("rules of %s left after destroy:\n%s", ip, out)
				}
			}
		})
	}
}

var (
	probeOnce  sync.Once
	probeLayer string // a layer with /bin/tlsprobe (testdata/tlsprobe)
	probeErr   error
)

// probeImages serves "probe": busybox plus the tlsprobe layer.
type probeImages struct{ testImages }

func (pi probeImages) Pull(ctx context.Context, ref string, creds *rt.Credentials) (*Image, error) {
	img, err := pi.testImages.Pull(ctx, strings.Replace(ref, "probe", "busybox", 1), creds)
	if err == nil && ref == "probe" {
		img.Ref, img.Digest = ref, "sha256:9e0be"
		img.Layers = append(append([]string(nil), img.Layers...), probeLayer)
	}
	return img, err
}

func buildProbe(t *testing.T) {
	probeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sbxl-probe-")
		if err != nil {
			probeErr = err
			return
		}
		probeLayer = dir
		if out, err := goBuild(filepath.Join(dir, "bin", "tlsprobe"), "./testdata/tlsprobe"); err != nil {
			probeErr = fmt.Errorf("build tlsprobe: %w\n%s", err, out)
		}
	})
	if probeErr != nil {
		t.Fatal(probeErr)
	}
}

// TestSandboxDNSNameEgress: under each runtime class, a sandbox with a dns_name grant
// resolves names through the platform DNS and reaches the granted name's HTTPS server
// through the egress proxy, and nothing else on 443; the platform DNS answers a
// deny_egress sandbox too. The "internet" is internal/egress's test fixture.
func TestSandboxDNSNameEgress(t *testing.T) {
	for _, class := range []string{"runc", GVisorClass} {
		t.Run(class, func(t *testing.T) {
			e := newEnv(t)
			if e.b.runtimes[class] == nil {
				t.Skipf("no %s runtime", class)
			}
			buildProbe(t)
			in := egresstest.New(t)
			tn := e.withRulesNetwork(t, func(c *network.Config) {
				c.Nameservers = []string{in.DNS.String()}
				c.ProxyPort = 20000 + int(randByte())<<5
			})
			if err := tn.m.StartEgress(nil); err != nil {
				t.Fatal(err)
			}
			e.b.cfg.Images = probeImages{testImages{layers: []string{busyboxDir}}}
			api, other := in.Addr(t), in.Addr(t)
			in.SetA("api.example.test", api)
			in.SetA("other.example.test", other)
			in.ServeHTTPS(t, api, "api.example.test")
			in.ServeHTTPS(t, other, "other.example.test")
			ca := []rt.File{{Path: "/etc/test-ca.pem", Content: in.CA.CertPEM()}}
			mk := func(name string, n *rt.Network) string {
				id := name + "-" + class
				e.create(rt.Spec{ID: id, Container: rt.Container{Image: "probe", Command: "sleep", Args: []string{"3600"}, Files: ca}, RuntimeClass: class, Network: n})
				return id
			}
			grant := mk("grant", &rt.Network{Egress: []rt.EgressRule{{DNSName: "api.example.test"}}})
			wild := mk("wild", &rt.Network{Egress: []rt.EgressRule{{DNSName: "*.example.test"}}})
			deny := mk("deny", &rt.Network{DenyEgress: true})
			cidr := mk("cidr", &rt.Network{Egress: []rt.EgressRule{{CIDR: other.String() + "/32"}}})

			probe := func(args ...string) string {
				return "tlsprobe -ca /etc/test-ca.pem -timeout 2s " + strings.Join(args, " ")
			}
			cases := []struct {
				from, cmd, want string // want: a prefix of the output; "error:" for a failure
			}{
				{grant, probe("-name api.example.test"), "server=" + api.String() + " host=api.example.test"},
				{grant, probe("-name other.example.test"), "error:"},
				// Sent to another address, the connection still reaches the granted name.
				{grant, probe("-name api.example.test -addr " + other.String()), "server=" + api.String()},
				{wild, probe("-name other.example.test"), "server=" + other.String()},
				{grant, probe("-resolve -name other.example.test"), "[" + other.String() + "]"},
				{deny, probe("-resolve -name api.example.test"), "[" + api.String() + "]"},
				{deny, probe("-name api.example.test"), "error:"},
				{cidr, probe("-name other.example.test"), "server=" + other.String()},
				{cidr, probe("-name api.example.test"), "error:"},
			}
			outs := make([]string, len(cases))
			var wg sync.WaitGroup
			for i, c := range cases {
				wg.Go(func() { outs[i], _ = run(e, c.from, "sh", "-c", c.cmd) })
			}
			wg.Wait()
			for i, c := range cases {
				if !strings.HasPrefix(outs[i], c.want) {
					t.Errorf("%s: %s: %q, want %q…", c.from, c.cmd, outs[i], c.want)
				}
			}
		})
	}
}

// run execs argv in sandbox id and returns its stdout and exit code (-1: exec failed).
// Safe to call from any goroutine.
func run(e *env, id string, argv ...string) (string, int32) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := agentClient(e.b, id).Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: argv}))
	if err != nil {
		return "exec: " + err.Error(), -1
	}
	return string(resp.Msg.Stdout), resp.Msg.ExitCode
}

func randByte() byte {
	b := make([]byte, 1)
	_, _ = rand.Read(b)
	return b[0]
}
