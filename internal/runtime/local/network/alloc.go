//go:build linux

package network

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Address allocation: ips/<addr> exists while addr is taken and contains the
// sandbox id. A file is claimed atomically with link(2) from a temporary file
// already holding the id, so two goroutines or processes can never claim the
// same address and a crash never leaves a claimed address without an owner.

func (m *Manager) allocIP(id string) (netip.Addr, error) {
	tmp, err := os.CreateTemp(m.ipsDir, ".claim-")
	if err != nil {
		return netip.Addr{}, fmt.Errorf("allocate address: %w", err)
	}
	_, werr := tmp.WriteString(id)
	cerr := tmp.Close()
	defer os.Remove(tmp.Name())
	if werr != nil || cerr != nil {
		return netip.Addr{}, fmt.Errorf("allocate address: %w", errors.Join(werr, cerr))
	}
	size := m.rangeSize()
	for range size {
		a := m.advance()
		err := unix.Link(tmp.Name(), filepath.Join(m.ipsDir, a.String()))
		if err == nil {
			return a, nil
		}
		if err != unix.EEXIST {
			return netip.Addr{}, fmt.Errorf("allocate address: %w", err)
		}
	}
	return netip.Addr{}, ErrExhausted
}

// advance returns the cursor and moves it on, wrapping within the range.
func (m *Manager) advance() netip.Addr {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.next
	if !a.IsValid() || a.Less(m.first) || m.last.Less(a) {
		a = m.first
	}
	n := a.Next()
	if m.last.Less(n) {
		n = m.first
	}
	m.next = n
	return a
}

func (m *Manager) rangeSize() int {
	return 1<<(32-m.cfg.Subnet.Bits()) - 3 // minus network, gateway, broadcast
}

// initialCursor starts allocation after the highest address in use, so that a
// restarted runner does not immediately reuse recently freed addresses.
func (m *Manager) initialCursor() netip.Addr {
	ents, err := os.ReadDir(m.ipsDir)
	if err != nil {
		return m.first
	}
	var hi netip.Addr
	for _, e := range ents {
		a, err := netip.ParseAddr(e.Name())
		if err != nil || !m.cfg.Subnet.Contains(a) {
			continue
		}
		if !hi.IsValid() || hi.Less(a) {
			hi = a
		}
	}
	if !hi.IsValid() || !hi.Less(m.last) {
		return m.first
	}
	return hi.Next()
}

// freeIP releases addr if it is still owned by id.
func (m *Manager) freeIP(addr netip.Addr, id string) {
	p := filepath.Join(m.ipsDir, addr.String())
	b, err := os.ReadFile(p)
	if err == nil && string(b) == id {
		os.Remove(p)
	}
}

// freeIPsOf releases every address owned by id (slow path, for state without a record).
func (m *Manager) freeIPsOf(id string) {
	ents, err := os.ReadDir(m.ipsDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if a, err := netip.ParseAddr(e.Name()); err == nil {
			m.freeIP(a, id)
		}
	}
}

// lastAddr is the highest address of p (the broadcast address for IPv4).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := 32 - p.Bits()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v |= 1<<host - 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
