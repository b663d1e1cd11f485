package kubernetes

import (
	"crypto/rand"
	"errors"
	"fmt"
	"hash/maphash"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// The runner's side of the gate's hello (gate/hello.go): a UDP listener that learns a
// creating sandbox's Pod IP from its gate as soon as the agent's socket exists, instead
// of from the kubelet's status (written after its next relist, up to ~1 s later). A hello
// is a hint: it only lets waitRunning start its ping (TLS with the pinned certificates,
// then the agent's identity) earlier. It is dropped unless it is well formed (fixed
// bounds), its sender is within the per-source rate, it names a sandbox of this backend
// whose Create is waiting for its agent, its MAC verifies under that sandbox's hello key
// (made per sandbox, in the gate container's Secret volume only), its time is within
// helloWindow, and it comes from the address it names. So a sandbox that forges hellos
// for another's ID achieves nothing (no key); the worst any hello can do is one extra
// dial of a gate.

// HelloFirstLog is the runner's log message when it takes its first gate hello: the
// sandboxes reach its hello port (test/k8s TestChartRunner looks for it).
const HelloFirstLog = "the first gate hello taken: sandboxes reach the hello port"

// StepHello is the step told to Config.StepHook when a sandbox's hello was taken.
const StepHello = "hello"

// helloWindow bounds how far a hello's time may be from the runner's clock.
const helloWindow = 60 * time.Second

// Per-source rate of hellos: helloBurst at once, then one per helloEvery, in a fixed
// table of helloBuckets buckets a source is hashed to (a key made per process): many
// (spoofed) sources cannot reset anyone's bucket, only share one.
const (
	helloBurst   = 8
	helloEvery   = 50 * time.Millisecond
	helloBuckets = 4096
)

// newHelloKey is a fresh per-sandbox hello key.
func newHelloKey() ([]byte, error) {
	k := make([]byte, gate.HelloKeyLen)
	_, err := rand.Read(k)
	return k, err
}

// helloLimiter is a token bucket per source address (hashed into a fixed table).
type helloLimiter struct {
	mu      sync.Mutex
	seeded  bool
	seed    maphash.Seed
	buckets [helloBuckets]helloBucket
}

type helloBucket struct {
	tokens float64
	at     time.Time // zero: unused (full)
}

// bucket is src's bucket; l.mu held.
func (l *helloLimiter) bucket(src netip.Addr) *helloBucket {
	if !l.seeded {
		l.seed, l.seeded = maphash.MakeSeed(), true
	}
	a := src.As16()
	return &l.buckets[maphash.Bytes(l.seed, a[:])%helloBuckets]
}

func (l *helloLimiter) allow(src netip.Addr, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	bk := l.bucket(src)
	if bk.at.IsZero() {
		bk.tokens, bk.at = helloBurst, now
	}
	bk.tokens = min(helloBurst, bk.tokens+float64(now.Sub(bk.at))/float64(helloEvery))
	bk.at = now
	if bk.tokens < 1 {
		return false
	}
	bk.tokens--
	return true
}

// serveHellos reads hellos from pc until it is closed.
func (b *Backend) serveHellos(pc *net.UDPConn) {
	buf := make([]byte, 256)
	for {
		n, src, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			select {
			case <-b.stop:
				return
			default:
			}
			if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			b.log.Warn("hello listener", "err", err)
			return
		}
		if b.takeHello(buf[:n], src.Addr().Unmap(), time.Now()) && b.helloSeen.CompareAndSwap(false, true) {
			b.log.Info(HelloFirstLog, "listen", pc.LocalAddr().String())
		}
	}
}

// takeHello takes one datagram from src at now; it reports whether the hello was taken.
// Everything that fails a check is dropped without an answer.
func (b *Backend) takeHello(p []byte, src netip.Addr, now time.Time) bool {
	if !b.helloRate.allow(src, now) {
		return false
	}
	h, err := gate.ParseHello(p)
	if err != nil || h.IP != src {
		return false
	}
	if d := now.Sub(h.At); d > helloWindow || d < -helloWindow {
		return false
	}
	// Only a Create waiting for its agent takes one, once. The MAC is checked outside
	// the backend's lock (a flood must not hold it), then the state again under it.
	b.mu.Lock()
	s := b.sandboxes[h.ID]
	var key []byte
	if s != nil && s.steps != nil && s.helloIP == "" {
		key = s.helloKey
	}
	b.mu.Unlock()
	if key == nil || !h.Verify(key) {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sandboxes[h.ID] != s || s.steps == nil || s.helloIP != "" {
		return false
	}
	s.helloIP = h.IP.String()
	s.steps.hello = now
	b.hookLocked(s, StepHello, now)
	close(s.changed)
	s.changed = make(chan struct{})
	return true
}

// ParseHelloAddr is the one check of a hello address (Config.HelloAddr; the runner's
// --hello-addr once its variables expanded): IP:port, the host an IP address (a gate
// resolves no name, and the NetworkPolicy rule is the address's /32 or /128) without a
// zone, bracketed when IPv6 (IPv4 may be too: the deployments pass "[$(POD_IP)]:7444"),
// the port 1..65535 in decimal digits only (no sign: "+7444" is refused). An
// IPv4-mapped IPv6 address is taken as its IPv4 one.
func ParseHelloAddr(s string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("want IP:port ([IPv6]:port for a literal IPv6 address): %w", err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("host %q is not an IP address", host)
	}
	if ip.Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("host %q has a zone: want an IP address without one", host)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return netip.AddrPort{}, fmt.Errorf("port %q: want 1..65535", port)
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(p)), nil
}

// helloEgress is the egress rule a sandbox's NetworkPolicy needs for its hello: UDP to
// the runner's hello port, at the hello address's host only (its /32 or /128) and at
// the runner's Pod selector peers of RunnerPeers (on CNIs that match Pod traffic by
// selector, not ipBlock). RunnerPeers' ipBlocks are NOT copied: a CIDR there is where
// the runner may come from, and as a destination it would open the hello port of every
// address in it (another sandbox listening on it, say) also under deny-all egress.
func (b *Backend) helloEgress() (networkingv1.NetworkPolicyEgressRule, bool) {
	to := b.helloTo
	if !to.IsValid() {
		return networkingv1.NetworkPolicyEgressRule{}, false
	}
	udp := corev1.ProtocolUDP
	p := intstr.FromInt(int(to.Port()))
	rule := networkingv1.NetworkPolicyEgressRule{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &p}}}
	for _, peer := range b.cfg.RunnerPeers {
		if peer.IPBlock != nil || (peer.PodSelector == nil && peer.NamespaceSelector == nil) {
			continue
		}
		rule.To = append(rule.To, *peer.DeepCopy())
	}
	bits := 32
	if to.Addr().Is6() {
		bits = 128
	}
	rule.To = append(rule.To, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(to.Addr(), bits).String()}})
	return rule, true
}
