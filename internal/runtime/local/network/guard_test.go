//go:build linux

package network

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/sandboxd/sandboxd/internal/sockmark"
)

// udpFromHost sends payload from the host to addr with mark and returns the reply.
func udpFromHost(addr string, mark uint32, timeout time.Duration) ([]byte, error) {
	d := net.Dialer{Timeout: timeout, Control: sockmark.Control(mark)}
	c, err := d.Dial("udp4", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping")); err != nil {
		return nil, err
	}
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	return buf[:n], err
}

// pingFromHost sends an ICMP echo request from the host to ip on a raw socket with mark
// and waits for the reply.
func pingFromHost(ip netip.Addr, mark uint32, timeout time.Duration) error {
	c, err := net.ListenPacket("ip4:icmp", "0.0.0.0")
	if err != nil {
		return err
	}
	defer c.Close()
	if ctl := sockmark.Control(mark); ctl != nil {
		raw, err := c.(*net.IPConn).SyscallConn()
		if err != nil {
			return err
		}
		if err := ctl("ip4", "", raw); err != nil {
			return err
		}
	}
	id := int(randByte())<<8 | int(randByte())
	req, err := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("guard")}}).Marshal(nil)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(req, &net.IPAddr{IP: ip.AsSlice()}); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1500)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return err
		}
		msg, err := icmp.ParseMessage(1, buf[:n])
		if err != nil || msg.Type != ipv4.ICMPTypeEchoReply || from.String() != ip.String() {
			continue
		}
		if echo, ok := msg.Body.(*icmp.Echo); ok && echo.ID == id {
			return nil
		}
	}
}

// TestHostGuard: a host process opens nothing into the bridge without the Manager's
// mark: TCP is refused at once (reset), UDP and ICMP echo fail at the send (EPERM);
// with the mark all work, and the sandbox's own exchanges with the platform DNS on the gateway (whose
// replies leave the host into the bridge) are untouched. The guard is part of every way
// the table is built: New, a rule change, a full rebuild, and New again on the same
// state (a restarted runner).
func TestHostGuard(t *testing.T) {
	m := newTestManager(t, true)
	a := setup(t, m, "guard-"+randHex(4))
	serve(t, a.NetNSPath, ":8080", "sandbox")
	var pc net.PacketConn
	if err := inNetNS(a.NetNSPath, func() (err error) { pc, err = net.ListenPacket("udp4", ":5353"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go echoUDP(pc)
	if err := m.StartServices(echoDNS{}, nil); err != nil {
		t.Fatal(err)
	}
	gw := m.Gateway().String()
	tcpAddr := netip.AddrPortFrom(a.IP, 8080).String()
	udpAddr := netip.AddrPortFrom(a.IP, 5353).String()

	phases := []struct {
		name    string
		prepare func(t *testing.T)
		guarded bool
	}{
		{"as New built it", func(*testing.T) {}, true},
		{"after a rule change", func(t *testing.T) {
			if err := m.SetRules(a.ID, Rules{Org: "o", Private: []Port{{"tcp", 8080}}}); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"after a full rebuild", func(t *testing.T) {
			if err := applyRules(m.table()); err != nil {
				t.Fatal(err)
			}
		}, true},
		// Control: without the table the same unmarked dials succeed, so the refusals
		// above are the guard's and not a routing accident.
		{"table deleted: control", func(t *testing.T) {
			if err := deleteTable(m.cfg.Table); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"after New on the same state", func(t *testing.T) {
			m2, err := New(m.cfg)
			if err != nil {
				t.Fatal(err)
			}
			m2.Close()
		}, true},
	}
	for _, ph := range phases {
		t.Run(ph.name, func(t *testing.T) {
			ph.prepare(t)
			for _, c := range []struct {
				name    string
				mark    uint32
				allowed bool
			}{
				{"no mark", 0, !ph.guarded},
				{"another mark", m.HostMark() + 1, !ph.guarded},
				{"the host mark", m.HostMark(), true},
			} {
				t0 := time.Now()
				line, err := dialWith("", tcpAddr, 5*time.Second, c.mark)
				took := time.Since(t0)
				switch {
				case c.allowed && (err != nil || !strings.HasPrefix(line, "sandbox "+gw+":")):
					t.Errorf("TCP, %s: %q %v", c.name, line, err)
				case !c.allowed && err == nil:
					t.Errorf("TCP, %s: reached the sandbox: %q", c.name, line)
				case !c.allowed && (!errors.Is(err, syscall.ECONNREFUSED) || took > time.Second):
					// A reset, not a drop: the host client learns at once.
					t.Errorf("TCP, %s: %v after %v, want connection refused at once", c.name, err, took)
				}
				switch err := pingFromHost(a.IP, c.mark, time.Second); {
				case c.allowed && err != nil:
					t.Errorf("ping, %s: %v", c.name, err)
				case !c.allowed && !errors.Is(err, syscall.EPERM):
					t.Errorf("ping, %s: %v, want EPERM at the send", c.name, err)
				}
				reply, err := udpFromHost(udpAddr, c.mark, time.Second)
				switch {
				case c.allowed && (err != nil || string(reply) != "ping"):
					t.Errorf("UDP, %s: %q %v", c.name, reply, err)
				case !c.allowed && !errors.Is(err, syscall.EPERM):
					t.Errorf("UDP, %s: %q %v, want EPERM at the send", c.name, reply, err)
				}
			}
			// The sandbox's exchanges with the platform DNS: the replies pass unmarked.
			if got, err := udpExchange(a.NetNSPath, gw+":53", []byte("query"), time.Second); err != nil || string(got) != "query" {
				t.Errorf("sandbox DNS over UDP: %q %v", got, err)
			}
			if line, err := dial(a.NetNSPath, gw+":53", time.Second); err != nil || !strings.HasPrefix(line, gw+":53 "+a.IP.String()+":") {
				t.Errorf("sandbox DNS over TCP: %q %v", line, err)
			}
		})
	}
}
