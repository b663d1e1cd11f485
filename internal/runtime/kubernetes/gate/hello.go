package gate

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"time"
)

// The gate's hello: one UDP datagram the gate sends to the runner once the agent's
// socket is there, so the runner dials the agent without waiting for the kubelet to
// report the Pod's IP (the kubelet does that only after its next relist, up to ~1 s
// later). It is a hint, never trust: the runner still dials with its pinned certificates
// and checks the agent's identity; a forged hello can cost the runner one dial.
//
// Wire format (big endian), at most MaxHelloLen bytes:
//
//	version (1) | len(id) (1) | id | IPv6-mapped address (16) | unix nanos (8) | HMAC-SHA256 (32)
//
// The MAC covers everything before it, under the sandbox's hello key (HelloKeyFile in
// TLSDir: only the gate container mounts it).
const (
	HelloVersion = 1
	// HelloKeyFile (in TLSDir) is the sandbox's 32-byte hello key.
	HelloKeyFile = "hello.key"
	// HelloKeyLen is the length of a hello key.
	HelloKeyLen = 32
	// HelloAddrEnv and HelloIDEnv, on the gate container, are where hellos go
	// (host:port, UDP) and the sandbox ID they name.
	HelloAddrEnv = "SANDBOXD_HELLO_ADDR"
	HelloIDEnv   = "SANDBOXD_HELLO_ID"
	// MaxHelloIDLen bounds the ID in a hello (a DNS label).
	MaxHelloIDLen = 63
	// MaxHelloLen is the longest hello.
	MaxHelloLen = 2 + MaxHelloIDLen + 16 + 8 + sha256.Size
	minHelloLen = 2 + 1 + 16 + 8 + sha256.Size
)

// Hello is a parsed hello.
type Hello struct {
	ID   string
	IP   netip.Addr // unmapped
	At   time.Time
	body []byte // what the MAC covers
	mac  []byte
}

var errHello = errors.New("malformed hello")

// MarshalHello is the hello of sandbox id at ip, sent at t, under key.
func MarshalHello(key []byte, id string, ip netip.Addr, t time.Time) ([]byte, error) {
	if len(id) == 0 || len(id) > MaxHelloIDLen || !ip.IsValid() {
		return nil, errHello
	}
	b := make([]byte, 0, MaxHelloLen)
	b = append(b, HelloVersion, byte(len(id)))
	b = append(b, id...)
	a := ip.As16()
	b = append(b, a[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(t.UnixNano()))
	m := hmac.New(sha256.New, key)
	m.Write(b)
	return m.Sum(b), nil
}

// ParseHello parses b with fixed bounds; the MAC is checked by Verify.
func ParseHello(b []byte) (Hello, error) {
	if len(b) < minHelloLen || len(b) > MaxHelloLen || b[0] != HelloVersion {
		return Hello{}, errHello
	}
	n := int(b[1])
	if n == 0 || n > MaxHelloIDLen || len(b) != 2+n+16+8+sha256.Size {
		return Hello{}, errHello
	}
	id := string(b[2 : 2+n])
	if !dnsLabel(id) {
		return Hello{}, errHello
	}
	var a [16]byte
	copy(a[:], b[2+n:2+n+16])
	ns := binary.BigEndian.Uint64(b[2+n+16 : 2+n+24])
	if ns > 1<<62 {
		return Hello{}, errHello
	}
	return Hello{ID: id, IP: netip.AddrFrom16(a).Unmap(), At: time.Unix(0, int64(ns)),
		body: b[:2+n+24], mac: b[2+n+24:]}, nil
}

// Verify reports whether h was made under key.
func (h Hello) Verify(key []byte) bool {
	if len(key) != HelloKeyLen {
		return false
	}
	m := hmac.New(sha256.New, key)
	m.Write(h.body)
	return hmac.Equal(m.Sum(nil), h.mac)
}

// helloAt are the times after the agent's socket appeared at which the hello is sent
// (UDP may drop one; the runner takes the first).
var helloAt = []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond}

// helloPoll is how often SendHellos looks for the agent's socket, helloPollSlow after
// helloPollFast (a main image still pulling: minutes, maybe).
const (
	helloPoll     = 5 * time.Millisecond
	helloPollFast = 10 * time.Second
	helloPollSlow = 50 * time.Millisecond
)

// SendHellos waits until the agent's socket exists (however long: the main container's
// image may take minutes to pull; ctx, the gate's life, bounds it), then sends the hello
// of id to addr (UDP) at helloAt. The Pod IP it names is the local address of its
// socket. Errors are logged: a lost hello leaves the runner on the kubelet's report.
func SendHellos(ctx context.Context, addr, id, keyFile, socket string, log *slog.Logger) {
	key, err := os.ReadFile(keyFile)
	if err != nil || len(key) != HelloKeyLen {
		log.Warn("hello: no key", "err", err)
		return
	}
	slow := time.Now().Add(helloPollFast)
	for {
		if st, err := os.Lstat(socket); err == nil && st.Mode()&os.ModeSocket != 0 {
			break
		}
		wait := helloPoll
		if time.Now().After(slow) {
			wait = helloPollSlow
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		log.Warn("hello", "err", err)
		return
	}
	defer c.Close()
	ua, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok {
		return
	}
	ip, _ := netip.AddrFromSlice(ua.IP)
	start := time.Now()
	for _, at := range helloAt {
		if w := time.Until(start.Add(at)); w > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(w):
			}
		}
		b, err := MarshalHello(key, id, ip.Unmap(), time.Now())
		if err != nil {
			log.Warn("hello", "err", err)
			return
		}
		if _, err := c.Write(b); err != nil {
			log.Debug("hello", "err", err)
		}
	}
}
