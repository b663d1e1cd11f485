package kubernetes

import (
	"bytes"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// helloBackend is a Backend with sandbox "a" (and "b") waiting for its agent, with
// hello keys.
func helloBackend(t *testing.T) (*Backend, map[string][]byte) {
	t.Helper()
	b := &Backend{log: slog.New(slog.DiscardHandler), sandboxes: map[string]*sandbox{}}
	keys := map[string][]byte{}
	for _, id := range []string{"a", "b"} {
		k, err := newHelloKey()
		if err != nil {
			t.Fatal(err)
		}
		keys[id] = k
		b.sandboxes[id] = &sandbox{id: id, spec: runtime.Spec{ID: id}, helloKey: k, steps: &createSteps{},
			changed: make(chan struct{}), done: make(chan struct{})}
	}
	return b, keys
}

func mustHello(t *testing.T, key []byte, id string, ip netip.Addr, at time.Time) []byte {
	t.Helper()
	p, err := gate.MarshalHello(key, id, ip, at)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestHelloParseBounds: only datagrams of the exact shape parse; nothing longer than
// MaxHelloLen (128) is read as a hello.
func TestHelloParseBounds(t *testing.T) {
	key := bytes.Repeat([]byte{7}, gate.HelloKeyLen)
	ip := netip.MustParseAddr("10.0.0.5")
	good := mustHello(t, key, "abc", ip, time.Now())
	h, err := gate.ParseHello(good)
	if err != nil || h.ID != "abc" || h.IP != ip || !h.Verify(key) {
		t.Fatalf("good hello: %+v %v", h, err)
	}
	if gate.MaxHelloLen > 128 {
		t.Errorf("MaxHelloLen %d > 128", gate.MaxHelloLen)
	}
	long := mustHello(t, key, string(bytes.Repeat([]byte{'a'}, gate.MaxHelloIDLen)), ip, time.Now())
	if _, err := gate.ParseHello(long); err != nil || len(long) != gate.MaxHelloLen {
		t.Errorf("longest hello (%d bytes): %v", len(long), err)
	}
	if _, err := gate.MarshalHello(key, string(bytes.Repeat([]byte{'a'}, gate.MaxHelloIDLen+1)), ip, time.Now()); err == nil {
		t.Error("an ID over 63 bytes was marshalled")
	}
	bad := map[string][]byte{
		"empty":         nil,
		"short":         good[:len(good)-1],
		"long":          append(append([]byte{}, good...), 0),
		"version":       append([]byte{2}, good[1:]...),
		"id length 0":   append([]byte{1, 0}, good[2:]...),
		"id length 255": append([]byte{1, 255}, good[2:]...),
		"oversized":     bytes.Repeat([]byte{1}, 256),
		"id not a label": func() []byte {
			p := append([]byte{}, good...)
			p[2] = '/'
			return p
		}(),
	}
	for name, p := range bad {
		if _, err := gate.ParseHello(p); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

// TestTakeHello: a good hello sets the sandbox's IP and wakes its Create once; a bad MAC,
// another sandbox's key, a stale or future time, an unknown ID, a source that is not the
// IP named, a sandbox not creating, and a flood beyond the per-source rate have no effect.
func TestTakeHello(t *testing.T) {
	b, keys := helloBackend(t)
	now := time.Now()
	ip := netip.MustParseAddr("10.0.0.5")
	other := netip.MustParseAddr("10.0.0.6")
	taken := func(id string) string {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.sandboxes[id].helloIP
	}
	flip := mustHello(t, keys["a"], "a", ip, now)
	flip[len(flip)-1] ^= 1
	cases := []struct {
		name string
		p    []byte
		src  netip.Addr
	}{
		{"bad MAC", flip, ip},
		{"another sandbox's key", mustHello(t, keys["b"], "a", ip, now), ip},
		{"stale", mustHello(t, keys["a"], "a", ip, now.Add(-helloWindow-time.Second)), ip},
		{"future", mustHello(t, keys["a"], "a", ip, now.Add(helloWindow+time.Second)), ip},
		{"unknown id", mustHello(t, keys["a"], "zz", ip, now), ip},
		{"source is not the IP named", mustHello(t, keys["a"], "a", ip, now), other},
	}
	for _, c := range cases {
		if b.takeHello(c.p, c.src, now) || taken("a") != "" {
			t.Errorf("%s: taken", c.name)
		}
	}
	ch := b.sandboxes["a"].changed
	if !b.takeHello(mustHello(t, keys["a"], "a", ip, now), ip, now) || taken("a") != "10.0.0.5" {
		t.Fatalf("good hello not taken: %q", taken("a"))
	}
	select {
	case <-ch:
	default:
		t.Error("a taken hello did not wake the create")
	}
	// Once only: a later hello (even a good one, from another address) changes nothing.
	if b.takeHello(mustHello(t, keys["a"], "a", other, now), other, now) || taken("a") != "10.0.0.5" {
		t.Errorf("second hello taken: %q", taken("a"))
	}
	// Not creating (Create returned: steps nil): dropped.
	b.mu.Lock()
	b.sandboxes["b"].steps = nil
	b.mu.Unlock()
	if b.takeHello(mustHello(t, keys["b"], "b", other, now), other, now) {
		t.Error("hello of a sandbox not creating taken")
	}
}

// TestHelloFlood: one source gets helloBurst hellos through at once, then one per
// helloEvery; another source is not held back by it; many other sources do not reset its bucket.
func TestHelloFlood(t *testing.T) {
	b, keys := helloBackend(t)
	now := time.Now()
	flooder := netip.MustParseAddr("10.0.0.9")
	junk := mustHello(t, keys["b"], "a", flooder, now) // wrong key: never taken
	for i := 0; i < 1000; i++ {
		b.takeHello(junk, flooder, now)
	}
	b.helloRate.mu.Lock()
	left := b.helloRate.bucket(flooder).tokens
	b.helloRate.mu.Unlock()
	if left >= 1 {
		t.Fatalf("after a flood the source still has %.1f tokens", left)
	}
	ip := netip.MustParseAddr("10.0.0.5")
	b.helloRate.mu.Lock()
	shared := b.helloRate.bucket(ip) == b.helloRate.bucket(flooder)
	b.helloRate.mu.Unlock()
	if shared { // 1 in helloBuckets: another source
		ip = netip.MustParseAddr("10.0.0.6")
	}
	if !b.takeHello(mustHello(t, keys["a"], "a", ip, now), ip, now) {
		t.Error("another source's good hello was held back by the flood")
	}
	// The flooder's own good hello waits for its bucket to refill.
	if b.takeHello(mustHello(t, keys["b"], "b", flooder, now), flooder, now) {
		t.Error("a flooder's hello got through at once")
	}
	if !b.takeHello(mustHello(t, keys["b"], "b", flooder, now), flooder, now.Add(helloEvery)) {
		t.Error("a flooder's hello after the refill did not get through")
	}
	// Many (spoofed) sources do not reset the flooder's bucket.
	later := now.Add(helloEvery)
	for i := 0; i < 3*helloBuckets; i++ {
		b.helloRate.allow(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), later)
	}
	if b.helloRate.allow(flooder, later) {
		t.Error("after a flood of other sources, the flooder's bucket was full again")
	}
}

// TestWaitInfoLate: a Create that took the hello returns before the kubelet reported the
// container: WaitInfo waits for the status with the image digest (and the IP is the
// hello's until then).
func TestWaitInfoLate(t *testing.T) {
	b, _ := helloBackend(t)
	s := b.sandboxes["a"]
	s.uid = "u1"
	s.helloIP = "10.0.0.5"
	s.pod = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u1", Labels: map[string]string{LabelSandbox: "a"}}}
	if info := b.info(s); info.IP != "10.0.0.5" || info.ImageDigest != "" {
		t.Fatalf("info before the kubelet's report: %+v", info)
	}
	got := make(chan runtime.Info, 1)
	go func() {
		info, _ := b.WaitInfo(t.Context(), "a")
		got <- info
	}()
	select {
	case info := <-got:
		t.Fatalf("WaitInfo returned before the digest: %+v", info)
	case <-time.After(50 * time.Millisecond):
	}
	pod := s.pod.DeepCopy()
	pod.Status.PodIP = "10.0.0.5"
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerMain, ImageID: "docker.io/library/busybox@sha256:abc",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	b.observe(pod, false)
	select {
	case info := <-got:
		if info.ImageDigest != "sha256:abc" || info.StartedAt.IsZero() {
			t.Errorf("late info %+v", info)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitInfo did not return after the kubelet's report")
	}
}

// TestHelloTargetForms: the deployments pass --hello-addr=[$(POD_IP)]:port, brackets for
// an IPv6 Pod IP; a bracketed IPv4 address is taken too, an unbracketed IPv6 one is not
// (its port is ambiguous). The address is checked once, by New (ParseHelloAddr), and
// the NetworkPolicy's hello rule is made from what it kept.
func TestHelloTargetForms(t *testing.T) {
	for addr, want := range map[string]string{
		"[10.0.0.1]:7444": "10.0.0.1/32", "10.0.0.1:7444": "10.0.0.1/32", "[fd00::1]:7444": "fd00::1/128",
		"[::ffff:10.0.0.1]:7444": "10.0.0.1/32",
		"fd00::1:7444":           "", "10.0.0.1": "", "[10.0.0.1]:0": "", "[10.0.0.1]:x": "", "host:7444": "",
	} {
		to, err := ParseHelloAddr(addr)
		if (err == nil) != (want != "") {
			t.Errorf("ParseHelloAddr(%q): %v, %v", addr, to, err)
			continue
		}
		b := &Backend{helloTo: to}
		rule, ok := b.helloEgress()
		got := ""
		if ok {
			got = rule.To[0].IPBlock.CIDR
			if rule.Ports[0].Port.IntValue() != 7444 || *rule.Ports[0].Protocol != corev1.ProtocolUDP {
				t.Errorf("%s: ports %+v", addr, rule.Ports)
			}
		}
		if got != want {
			t.Errorf("HelloAddr %q: egress to %q, want %q", addr, got, want)
		}
	}
}

// TestParseHelloAddrErrors: a bad hello address is refused with an error that says what
// is wrong with it, by ParseHelloAddr and so by New (before it starts anything).
func TestParseHelloAddrErrors(t *testing.T) {
	for addr, want := range map[string]string{
		"10.0.0.1":             "want IP:port",
		"fd00::1:7444":         "want IP:port ([IPv6]:port",
		"runner.example:7444":  `host "runner.example" is not an IP address`,
		":7444":                `host "" is not an IP address`,
		"[fe80::1%eth0]:7444":  `host "fe80::1%eth0" has a zone`,
		"10.0.0.1:0":           `port "0": want 1..65535`,
		"10.0.0.1:65536":       `port "65536": want 1..65535`,
		"[fd00::1]:99999999":   `port "99999999": want 1..65535`,
		"10.0.0.1:-1":          `port "-1": want 1..65535`,
		"10.0.0.1:+7444":       `port "+7444": want 1..65535`,
		"10.0.0.1:http":        `port "http": want 1..65535`,
		"[10.0.0.1]:7444:7444": "want IP:port",
	} {
		if to, err := ParseHelloAddr(addr); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseHelloAddr(%q): %v, %v; want an error saying %q", addr, to, err, want)
		}
		_, err := New(t.Context(), Config{Client: fake.NewSimpleClientset(), Namespace: "sbx", RunnerID: "r1", AgentImage: "agent:1",
			HelloListen: "127.0.0.1:0", HelloAddr: addr})
		if err == nil || !strings.Contains(err.Error(), "HelloAddr") || !strings.Contains(err.Error(), want) {
			t.Errorf("New with HelloAddr %q: %v; want an error saying %q", addr, err, want)
		}
	}
	// 65535 is the last port; the gates get the canonical form.
	b, _ := newFakeBackend(t, Config{HelloListen: "127.0.0.1:0", HelloAddr: "[10.0.0.1]:65535"})
	if b.cfg.HelloAddr != "10.0.0.1:65535" || b.helloTo != netip.MustParseAddrPort("10.0.0.1:65535") {
		t.Errorf("HelloAddr kept as %q (%v), want 10.0.0.1:65535", b.cfg.HelloAddr, b.helloTo)
	}
}
