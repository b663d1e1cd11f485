package security

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// k8sEgress is a Kubernetes runner's egress DNS and proxy (as stack.NewKubernetes wires
// them) in front of a recovered sandbox whose Pod holds 127.0.0.2 and whose one rule grants
// api.granted.test; the upstream resolver on loopback reads every query and answers none,
// counting them.
type k8sEgress struct {
	dnsAddr, proxyAddr string
	upstream           *atomic.Int64
}

var (
	egressSandbox  = netip.MustParseAddr("127.0.0.2")
	egressStranger = netip.MustParseAddr("127.0.0.3")
)

func newK8sEgress(t *testing.T) *k8sEgress {
	t.Helper()
	spec := runtime.Spec{ID: "egr1", Container: runtime.Container{Image: "busybox", Command: "sleep"},
		Network: &runtime.Network{Egress: []runtime.EgressRule{{DNSName: "api.granted.test"}}}}
	specJSON, err := json.Marshal(&spec)
	if err != nil {
		t.Fatal(err)
	}
	clientCert, clientKey := selfSignedPEM(t, "sandboxd-runner")
	serverCert, _ := selfSignedPEM(t, "sandbox-"+spec.ID)
	labels := map[string]string{kubernetes.LabelManagedBy: kubernetes.ManagedBy, kubernetes.LabelRunner: "r1", kubernetes.LabelSandbox: spec.ID}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sbx-" + spec.ID, Namespace: "sbx", Labels: labels},
		Data: map[string][]byte{"spec.json": specJSON, "client.crt": clientCert, "client.key": clientKey, "tls.crt": serverCert, "config.json": []byte("{}")}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sbx-" + spec.ID, Namespace: "sbx", Labels: labels, UID: "u1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: egressSandbox.String(), PodIPs: []corev1.PodIP{{IP: egressSandbox.String()}}}}
	b, err := kubernetes.New(t.Context(), kubernetes.Config{Client: fake.NewSimpleClientset(secret, pod), Namespace: "sbx", RunnerID: "r1", AgentImage: "agent:1",
		MaxPrepull: -1,
		Dial:       func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("no gate here") },
		Egress: &kubernetes.EgressConfig{ProxyAddrs: []netip.Addr{netip.MustParseAddr("10.96.0.53")}, DNSAddr: netip.MustParseAddr("10.96.0.53"),
			Peers:     []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.1/32"}}},
			ProxyPort: 15443, DNSPort: 5353}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if _, err := b.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.EgressSource(egressSandbox); !ok {
		t.Fatal("the recovered sandbox's address is not registered")
	}

	// The upstream: reads, never answers.
	up, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	e := &k8sEgress{upstream: new(atomic.Int64)}
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, _, err := up.ReadFrom(buf); err != nil {
				return
			}
			e.upstream.Add(1)
		}
	}()
	d := &egress.DNS{Upstreams: []string{up.LocalAddr().String()}, Timeout: 2 * time.Second,
		Steer: &egress.Steering{Source: b.EgressSource, Proxy: []netip.Addr{netip.MustParseAddr("10.96.0.53")}}}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = d.ServeUDP(pc) }()
	p := &egress.Proxy{Grants: b.EgressGrants, Known: b.EgressKnown}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.Serve(l) }()
	t.Cleanup(func() { _ = d.Close(); _ = p.Close(); pc.Close(); l.Close() })
	e.dnsAddr, e.proxyAddr = pc.LocalAddr().String(), l.Addr().String()
	return e
}

// ask sends raw query bytes from src and returns the reply (nil: none within wait).
func (e *k8sEgress) ask(t *testing.T, src netip.Addr, q []byte, wait time.Duration) *dnsmessage.Message {
	t.Helper()
	c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), net.UDPAddrFromAddrPort(netip.MustParseAddrPort(e.dnsAddr)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(q); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 64<<10)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf[:n]); err != nil {
		t.Fatalf("a reply that does not parse: %x", buf[:n])
	}
	return &m
}

func aQuery(t *testing.T, id uint16, name string) []byte {
	t.Helper()
	m := dnsmessage.Message{Header: dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}}}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSecurityKubernetesEgressStranger: the Kubernetes runner's egress DNS and proxy are
// reachable from the cluster's network, not only from sandboxes. A source that is no
// registered sandbox Pod gets REFUSED for every name (the granted one included) and is
// never relayed (the runner is no open resolver), and the proxy closes its connection
// before reading a byte.
func TestSecurityKubernetesEgressStranger(t *testing.T) {
	e := newK8sEgress(t)
	for _, name := range []string{"api.granted.test.", "www.example.com.", "kubernetes.default.svc.cluster.local."} {
		m := e.ask(t, egressStranger, aQuery(t, 9, name), 2*time.Second)
		if m == nil || m.RCode != dnsmessage.RCodeRefused || len(m.Answers) != 0 {
			t.Errorf("stranger's query for %s: %+v, want REFUSED", name, m)
		}
	}
	if n := e.upstream.Load(); n != 0 {
		t.Errorf("a stranger's queries reached the upstream (%d)", n)
	}
	// The sandbox itself is answered (the setup works).
	if m := e.ask(t, egressSandbox, aQuery(t, 10, "api.granted.test."), 2*time.Second); m == nil || len(m.Answers) != 1 {
		t.Fatalf("the sandbox's query for its granted name: %+v", m)
	}

	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(egressStranger, 0)), Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", e.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	start := time.Now()
	b, err := io.ReadAll(c)
	if len(b) != 0 || time.Since(start) > time.Second {
		t.Errorf("stranger's proxy connection: read %q (%v) after %v; want closed at once", b, err, time.Since(start))
	}
}

// TestSecurityKubernetesEgressHostileDNS: a sandbox's malformed or oversized queries get
// a FORMERR (or nothing) and never reach the upstream or an answer with the proxy; a flood
// from one sandbox keeps at most 64 queries in flight upstream.
func TestSecurityKubernetesEgressHostileDNS(t *testing.T) {
	e := newK8sEgress(t)
	header := func(id, qd uint16, flags uint16) []byte {
		h := make([]byte, 12)
		binary.BigEndian.PutUint16(h[0:], id)
		binary.BigEndian.PutUint16(h[2:], flags)
		binary.BigEndian.PutUint16(h[4:], qd)
		return h
	}
	question := func(labels ...string) []byte {
		var b []byte
		for _, l := range labels {
			b = append(b, byte(len(l)))
			b = append(b, l...)
		}
		return append(b, 0, 0, 1, 0, 1)
	}
	long := make([]string, 0, 6)
	for range 5 {
		long = append(long, string(make([]byte, 60)))
	}
	granted := question("api", "granted", "test")
	for _, tc := range []struct {
		name  string
		q     []byte
		rcode dnsmessage.RCode
	}{
		{"no question", header(1, 0, 0x0100), dnsmessage.RCodeFormatError},
		{"two questions", append(append(header(2, 2, 0x0100), granted...), granted...), dnsmessage.RCodeFormatError},
		{"a count of 65535", append(header(3, 0xffff, 0x0100), granted...), dnsmessage.RCodeFormatError},
		{"a 300-byte name", append(header(4, 1, 0x0100), question(long...)...), dnsmessage.RCodeFormatError},
		{"a pointer loop", append(header(5, 1, 0x0100), 0xc0, 12, 0, 1, 0, 1), dnsmessage.RCodeFormatError},
		{"a dot inside a label", append(header(6, 1, 0x0100), question("api.granted", "test")...), dnsmessage.RCodeFormatError},
		{"a truncated question", append(header(7, 1, 0x0100), granted[:6]...), dnsmessage.RCodeFormatError},
		{"an UPDATE", append(header(8, 1, 0x2800), granted...), dnsmessage.RCodeNotImplemented},
	} {
		m := e.ask(t, egressSandbox, tc.q, 2*time.Second)
		if m == nil || m.RCode != tc.rcode || len(m.Answers) != 0 || m.ID != binary.BigEndian.Uint16(tc.q) {
			t.Errorf("%s: %+v, want %v without answers", tc.name, m, tc.rcode)
		}
	}
	// A reply sent to the DNS is not relayed nor answered.
	if m := e.ask(t, egressSandbox, append(header(9, 1, 0x8180), granted...), 300*time.Millisecond); m != nil {
		t.Errorf("a reply was answered: %+v", m)
	}
	if n := e.upstream.Load(); n != 0 {
		t.Errorf("hostile queries reached the upstream (%d)", n)
	}

	// A flood of queries for names the upstream never answers: at most 64 reach it while
	// the first wait out their timeout.
	c, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(egressSandbox, 0)), net.UDPAddrFromAddrPort(netip.MustParseAddrPort(e.dnsAddr)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 300 {
		if _, err := c.Write(aQuery(t, uint16(100+i), "flood.example.com.")); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second) // under the 2 s upstream timeout: the first 64 still wait
	if n := e.upstream.Load(); n == 0 || n > 64 {
		t.Errorf("the upstream saw %d queries of the flood, want 1..64", n)
	}
	// Another sandbox-less source is still refused at once, not queued behind the flood.
	if m := e.ask(t, egressStranger, aQuery(t, 11, "api.granted.test."), time.Second); m == nil || m.RCode != dnsmessage.RCodeRefused {
		t.Errorf("stranger during the flood: %+v", m)
	}
}

// TestSecurityKubernetesEgressNetRawAnyPod: on a runner that serves host-name rules the
// grants are keyed by source address, so no sandbox Pod of it may forge one: a spec
// adding CAP_NET_RAW is refused even without host-name rules of its own, and a plain
// sandbox's Pod drops NET_RAW (the container runtime's default set holds it).
func TestSecurityKubernetesEgressNetRawAnyPod(t *testing.T) {
	cs := fake.NewSimpleClientset()
	var (
		mu      sync.Mutex
		created []corev1.Pod
	)
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		if p, ok := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod); ok {
			mu.Lock()
			created = append(created, *p.DeepCopy())
			mu.Unlock()
		}
		return false, nil, nil
	})
	b, err := kubernetes.New(t.Context(), kubernetes.Config{Client: cs, Namespace: "sbx", RunnerID: "r1", AgentImage: "agent:1",
		MaxPrepull: -1, StartTimeout: time.Second,
		Dial: func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("no gate here") },
		Egress: &kubernetes.EgressConfig{ProxyAddrs: []netip.Addr{netip.MustParseAddr("10.96.0.53")}, DNSAddr: netip.MustParseAddr("10.96.0.53"),
			Peers:     []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.1/32"}}},
			ProxyPort: 15443, DNSPort: 5353}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	raw := &runtime.Spec{ID: "raw1", Container: runtime.Container{Image: "busybox", Command: "sleep",
		Security: &runtime.Security{CapAdd: []string{"CAP_NET_RAW"}}}}
	if _, err := b.Create(t.Context(), raw); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Errorf("CAP_NET_RAW without host-name rules: %v, want ErrInvalidSpec", err)
	}
	plain := &runtime.Spec{ID: "plain1", Container: runtime.Container{Image: "busybox", Command: "sleep"}}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, _ = b.Create(ctx, plain) // no kubelet: it does not start; the Pod is what matters
	mu.Lock()
	defer mu.Unlock()
	if len(created) != 1 {
		t.Fatalf("%d Pods made, want the plain sandbox's one", len(created))
	}
	for _, p := range created {
		for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
			sc := c.SecurityContext
			if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "NET_RAW") && !slices.Contains(sc.Capabilities.Drop, "ALL") ||
				slices.Contains(sc.Capabilities.Add, "NET_RAW") {
				t.Errorf("Pod %s container %s keeps NET_RAW: %+v", p.Name, c.Name, sc)
			}
		}
	}
}
