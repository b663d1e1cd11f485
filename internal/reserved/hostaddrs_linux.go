package reserved

import (
	"errors"
	"net/netip"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// interfaceAddrs is the host's interface addresses from one RTM_GETADDR dump: what
// net.InterfaceAddrs returns, without the dump of every link it makes first (to name
// each address's interface, which is not needed here). On a runner each sandbox adds a
// link to the host, so that dump grew with the sandboxes running and was read on every
// create.
func interfaceAddrs() ([]netip.Addr, error) {
	for try := 0; ; try++ {
		tab, err := syscall.NetlinkRIB(syscall.RTM_GETADDR, syscall.AF_UNSPEC)
		if err != nil {
			return nil, os.NewSyscallError("netlinkrib", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(tab)
		if err != nil {
			return nil, os.NewSyscallError("parsenetlinkmessage", err)
		}
		out, err := parseAddrDump(msgs)
		if errors.Is(err, errDumpInterrupted) && try == 0 {
			continue // an address changed during the dump: once more
		}
		return out, err
	}
}

// errDumpInterrupted: the kernel marked the dump NLM_F_DUMP_INTR (an address was added
// or removed while it was read in parts), so it may miss addresses.
var errDumpInterrupted = errors.New("reserved: RTM_GETADDR dump interrupted by an address change")

// parseAddrDump is the addresses of an RTM_GETADDR dump's messages; an error when the
// dump failed or was interrupted (a partial list would let IsHostAddr answer false for
// a host address).
func parseAddrDump(msgs []syscall.NetlinkMessage) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, m := range msgs {
		if m.Header.Flags&unix.NLM_F_DUMP_INTR != 0 {
			return nil, errDumpInterrupted
		}
		switch m.Header.Type {
		case syscall.NLMSG_DONE:
			return out, nil
		case syscall.NLMSG_ERROR:
			return nil, errors.New("reserved: RTM_GETADDR dump failed")
		case syscall.RTM_NEWADDR:
			if len(m.Data) < syscall.SizeofIfAddrmsg {
				continue
			}
			ifam := (*syscall.IfAddrmsg)(unsafe.Pointer(&m.Data[0]))
			attrs, err := syscall.ParseNetlinkRouteAttr(&m)
			if err != nil {
				return nil, os.NewSyscallError("parsenetlinkrouteattr", err)
			}
			if a, ok := ifaAddr(ifam.Family, attrs); ok {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

// ifaAddr is the local address of one RTM_NEWADDR message, as net.InterfaceAddrs reads
// it: IFA_LOCAL when there is one (on a point-to-point link IFA_ADDRESS is the peer's),
// else IFA_ADDRESS.
func ifaAddr(family uint8, attrs []syscall.NetlinkRouteAttr) (netip.Addr, bool) {
	var local, addr []byte
	for _, a := range attrs {
		switch a.Attr.Type {
		case syscall.IFA_LOCAL:
			local = a.Value
		case syscall.IFA_ADDRESS:
			addr = a.Value
		}
	}
	v := addr
	if local != nil {
		v = local
	}
	switch {
	case family == syscall.AF_INET && len(v) >= 4:
		return netip.AddrFrom4([4]byte(v[:4])), true
	case family == syscall.AF_INET6 && len(v) >= 16:
		return netip.AddrFrom16([16]byte(v[:16])), true
	}
	return netip.Addr{}, false
}
