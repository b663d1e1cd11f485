//go:build linux

// Package network gives every local sandbox its own network namespace on a host
// bridge: a veth pair (host side on the bridge, marked isolated so sandboxes cannot
// talk to each other at layer 2), one IPv4 address from the bridge's subnet, a
// default route via the bridge's gateway address, and optional outbound NAT. Each
// sandbox's egress and ingress rules (SetRules) are enforced on the host with nftables
// (rules.go); the platform DNS and the egress proxy for dns_name rules answer on the
// gateway address (services.go). Of the host's own processes, only those whose sockets
// carry Config.HostMark (the runner's edge) open connections to sandboxes (nft.go).
//
// Host setup (bridge, one nftables table, ip_forward when Egress) is done once by New and is
// idempotent. Per-sandbox work (Setup/Teardown) uses netlink only: no `ip`
// commands, no sleeps, a few milliseconds; SetRules is one small nft transaction.
//
// Layout under Config.StateDir (persistent, survives runner restarts):
//
//	mntns               bind mount of the holder, the mount namespace where the
//	                    sandboxes' network namespaces are bind-mounted (holder.go)
//	netns               symlink to the holder's dir of them, as seen by the runner:
//	netns/<id>          the sandbox's network namespace
//	ips/<ip>            one file per allocated address, containing the sandbox id
//	sandboxes/<id>.json the Attachment, for Lookup after a restart
//	rules/<id>.json     the sandbox's Rules (SetRules), restored by New
//	ip_forward.orig     the value of net.ipv4.ip_forward before New changed it
package network

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/failpoint"
	"github.com/sandboxd/sandboxd/internal/reserved"
)

// Defaults used when the corresponding Config field is empty.
const (
	DefaultBridge = "sbx0"
	DefaultTable  = "sandboxd"
	// ContainerIface is the name of the sandbox's interface inside its namespace.
	ContainerIface = "eth0"
	// DefaultProxyPort is a good Config.ProxyPort: the gateway port of the egress proxy.
	DefaultProxyPort = 15443
	// DefaultHostMark is the socket mark (SO_MARK) that lets a host process open
	// connections into the bridge (Config.HostMark). 0x5b is sandboxd's byte (sandbox MACs
	// start 02:5b); the low 16 bits, where kube-proxy and flannel (0x4000, 0x8000), Cilium
	// (0x0f00), Istio (0x539) and wg-quick (0xca6c) keep their marks, are zero, and under
	// Tailscale's mask 0xff0000 it reads 0xd00000, neither of its values. So those tools
	// neither route nor filter the edge's marked dials differently.
	DefaultHostMark uint32 = 0x5bd00000
)

// DefaultSubnet is the sandbox subnet used when Config.Subnet is not set.
var DefaultSubnet = netip.MustParsePrefix("10.88.0.0/16")

var (
	// ErrNotFound is returned by Lookup when a sandbox has no (usable) attachment.
	ErrNotFound = fmt.Errorf("network: attachment %w", errdefs.ErrNotFound)
	// ErrExists is returned by Setup when the sandbox already has state on this host.
	ErrExists = fmt.Errorf("network: attachment %w", errdefs.ErrAlreadyExists)
	// ErrExhausted is returned by Setup when the subnet has no free address.
	ErrExhausted = errors.New("network: no free address in subnet")
	// ErrClosed is returned by methods of a closed Manager.
	ErrClosed = errors.New("network: manager closed")
)

// Config configures a Manager. The zero value of each field selects its default,
// except Egress (false means no outbound NAT; the runner turns it on).
type Config struct {
	// Bridge is the host bridge name (default "sbx0", at most 15 bytes).
	Bridge string
	// Subnet is the IPv4 sandbox subnet (default 10.88.0.0/16). The first host
	// address is the gateway, assigned to the bridge.
	Subnet netip.Prefix
	// StateDir holds netns files and IP allocations; it must persist across runner
	// restarts (required).
	StateDir string
	// Nameservers are the upstreams of the platform DNS that answers sandboxes on the
	// gateway address (every sandbox's resolv.conf names the gateway; see
	// StartServices). nil: the host's non-loopback IPv4 nameservers from
	// /etc/resolv.conf. An empty non-nil slice: none.
	Nameservers []string
	// ProxyPort is the gateway port of the egress SNI proxy that dns_name grants send
	// TCP 443 to. 0: no proxy, and rules with dns_name grants are refused.
	ProxyPort int
	// EgressUpstreamCAFile, when set, is a PEM file of the roots the egress proxy
	// verifies the hosts it injects secrets for against, instead of the system roots
	// (tests; a private CA).
	EgressUpstreamCAFile string
	// Egress enables outbound NAT (masquerade) for the subnet leaving through any
	// interface other than the bridge. Without it, forwarded traffic from
	// sandboxes is dropped.
	Egress bool
	// Table is the nftables table (family inet) owned by this Manager
	// (default "sandboxd"). Tests use their own.
	Table string
	// MTU of the bridge and veths; 0 keeps the kernel default (1500).
	MTU int
	// HostMark is the socket mark (SO_MARK) a host process's connections need to enter
	// the bridge (0: DefaultHostMark). Replies to the sandboxes' own connections (the
	// platform DNS, the egress proxy) need none; every other new flow from the host to a
	// sandbox is refused, so that only the runner's edge, which marks its dials, reaches
	// sandbox ports (see rules in nft.go).
	HostMark uint32
	// OpenReserved are reserved ranges (reserved.V4: RFC 1918, CGNAT, link-local, …) the
	// operator opens to explicit cidr egress rules (a policy may then allow them). Every
	// other reserved range, the sandbox subnet and the host's addresses stay out of every
	// rule's reach: a rule's reserved parts are cut out of it. "any" never includes them.
	OpenReserved []netip.Prefix
}

// Attachment describes one sandbox's network.
type Attachment struct {
	ID        string     `json:"id"`
	NetNSPath string     `json:"netnsPath"` // pass to the OCI spec's network namespace path
	IP        netip.Addr `json:"ip"`
	Gateway   netip.Addr `json:"gateway"`
	PrefixLen int        `json:"prefixLen"`
	HostVeth  string     `json:"hostVeth"`
	MAC       string     `json:"mac,omitempty"` // of eth0 inside the sandbox
}

// Manager owns one bridge, its subnet and the sandboxes attached to it.
// All methods are safe for concurrent use.
type Manager struct {
	cfg         Config
	cut         reserved.Set // what a cidr egress rule never reaches (host addresses aside)
	gateway     netip.Addr
	first, last netip.Addr // allocatable range
	nameservers []string

	stateDir, netnsDir, ipsDir, recDir, rulesDir string
	holder                                       *holder

	// secrets are the egress secrets by sandbox address (SetEgressSecrets), in memory only.
	secrets sync.Map // netip.Addr -> *egress.SandboxSecrets

	mu     sync.Mutex
	h      *netlink.Handle // NETLINK_ROUTE socket in the host namespace
	brIdx  int
	next   netip.Addr // allocation cursor (round robin limits early address reuse)
	closed bool
	pol    policyState
	svc    *services // StartServices

	pinMu sync.Mutex     // serializes changes of the bridge table (antispoof.go)
	pins  map[string]pin // sandbox id -> its port's pin
	pinNl nlConn         // netlink socket of pinsOverNetlink, under pinMu
}

// New prepares the host (idempotently) and returns a Manager. It must be called
// from a goroutine whose thread is in the host network namespace.
func New(cfg Config) (*Manager, error) {
	if cfg.Bridge == "" {
		cfg.Bridge = DefaultBridge
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if cfg.HostMark == 0 {
		cfg.HostMark = DefaultHostMark
	}
	if !cfg.Subnet.IsValid() {
		cfg.Subnet = DefaultSubnet
	}
	if err := validIfName(cfg.Bridge); err != nil {
		return nil, err
	}
	if !validTableName(cfg.Table) {
		return nil, fmt.Errorf("network: invalid nftables table name %q", cfg.Table)
	}
	if cfg.StateDir == "" {
		return nil, errors.New("network: Config.StateDir is required")
	}
	p := cfg.Subnet
	if !p.Addr().Is4() || p.Bits() < 8 || p.Bits() > 30 {
		return nil, fmt.Errorf("network: subnet %s: need an IPv4 prefix between /8 and /30", p)
	}
	cfg.Subnet = p.Masked()

	m := &Manager{cfg: cfg}
	m.cut = reserved.Egress(cfg.OpenReserved, cfg.Subnet)
	m.gateway = cfg.Subnet.Addr().Next()
	m.first = m.gateway.Next()
	m.last = lastAddr(cfg.Subnet).Prev() // exclude broadcast
	if cfg.Nameservers != nil {
		m.nameservers = append([]string{}, cfg.Nameservers...)
	} else {
		m.nameservers = HostNameservers("/etc/resolv.conf")
	}

	if err := os.MkdirAll(cfg.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("network: state dir: %w", err)
	}
	sd, err := filepath.EvalSymlinks(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("network: state dir: %w", err)
	}
	if sd, err = filepath.Abs(sd); err != nil {
		return nil, err
	}
	m.stateDir = sd
	m.netnsDir = filepath.Join(sd, "netns")
	m.ipsDir = filepath.Join(sd, "ips")
	m.recDir = filepath.Join(sd, "sandboxes")
	m.rulesDir = filepath.Join(sd, "rules")
	for _, d := range []string{m.ipsDir, m.recDir, m.rulesDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("network: state dir: %w", err)
		}
	}
	if m.holder, err = openHolder(sd); err != nil {
		return nil, err
	}
	// Temporary files of an address claim that a crash interrupted (one Manager owns a
	// state dir, and none of its claims has started yet).
	if stale, err := filepath.Glob(filepath.Join(m.ipsDir, ".claim-*")); err == nil {
		for _, p := range stale {
			_ = os.Remove(p)
		}
	}

	ok := false
	defer func() {
		if !ok {
			m.holder.close()
		}
	}()
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("network: netlink: %w", err)
	}
	m.h = h
	defer func() {
		if !ok {
			h.Close()
		}
	}()
	if err := m.setupBridge(); err != nil {
		return nil, err
	}
	// Forwarding is only needed to route sandboxes' traffic out; host<->sandbox traffic
	// stays on the bridge. Leaving the global sysctl alone otherwise matters on shared hosts.
	if m.cfg.Egress {
		if err := m.enableForwarding(); err != nil {
			return nil, err
		}
	}
	if cfg.ProxyPort < 0 || cfg.ProxyPort > 65535 {
		return nil, fmt.Errorf("network: proxy port %d", cfg.ProxyPort)
	}
	// One transaction with every sandbox's persisted rules: no sandbox is ever without them.
	if err := applyRules(m.rules(m.restoreRules())); err != nil {
		return nil, err
	}
	// Every sandbox port pinned to its MAC and address, in one transaction (antispoof.go).
	if err := m.restorePins(); err != nil {
		return nil, err
	}
	if err := m.enableProxyARP(); err != nil {
		return nil, err
	}
	m.next = m.initialCursor()
	ok = true
	return m, nil
}

// Gateway returns the bridge's address, the sandboxes' default gateway.
func (m *Manager) Gateway() netip.Addr { return m.gateway }

// Subnet returns the sandbox subnet.
func (m *Manager) Subnet() netip.Prefix { return m.cfg.Subnet }

// HostMark returns the socket mark that lets host connections into the bridge (give it
// to the edge's dialer).
func (m *Manager) HostMark() uint32 { return m.cfg.HostMark }

// Bridge returns the bridge name.
func (m *Manager) Bridge() string { return m.cfg.Bridge }

// Nameservers returns the nameservers for sandboxes' resolv.conf: the gateway, where
// the platform DNS answers (see StartServices).
func (m *Manager) Nameservers() []string { return []string{m.gateway.String()} }

// NetNSPath returns where the network namespace file of id lives (whether or not it exists).
func (m *Manager) NetNSPath(id string) string { return filepath.Join(m.netnsDir, id) }

func (m *Manager) handle() (*netlink.Handle, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	return m.h, nil
}

// Setup creates the network of sandbox id: a named netns with lo and eth0 up, an
// address, a default route, and the host veth on the bridge (isolated). On error
// everything done so far is undone. Setup of an id that already has state fails
// with ErrExists (Teardown first).
func (m *Manager) Setup(ctx context.Context, id string) (att *Attachment, err error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	h, err := m.handle()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
			err = fmt.Errorf("network: setup %s: %w", id, err)
		}
	}()

	nsPath := m.NetNSPath(id)
	if err := m.holder.createNetNS(id); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, ErrExists
		}
		return nil, err
	}
	undo = append(undo, func() { _ = m.holder.deleteNetNS(id) })
	failpoint.Hit("network.setup.netns")

	ip, err := m.allocIP(id)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { m.freeIP(ip, id) })
	failpoint.Hit("network.setup.ip")

	if err := ctx.Err(); err != nil {
		return nil, err
	}
	nsh, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("open netns: %w", err)
	}
	defer func() { _ = nsh.Close() }()

	hostName := vethName(m.cfg.Bridge, id)
	mac := macForIP(ip)
	// Made down: its IPv6 goes off (disableIPv6) before it comes up.
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{
			Name:   hostName,
			MTU:    m.cfg.MTU,
			TxQLen: -1,
		},
		PeerName:         ContainerIface,
		PeerNamespace:    netlink.NsFd(int(nsh)),
		PeerHardwareAddr: mac,
		PeerTxQLen:       -1,
	}
	if err := h.LinkAdd(veth); err != nil {
		if !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("add veth: %w", err)
		}
		if err := m.dropStaleVeth(h, id, hostName); err != nil {
			return nil, err
		}
		if err := h.LinkAdd(veth); err != nil {
			if errors.Is(err, unix.EEXIST) {
				return nil, fmt.Errorf("veth %s already exists: %w", hostName, ErrExists)
			}
			return nil, fmt.Errorf("add veth: %w", err)
		}
	}
	undo = append(undo, func() { _ = h.LinkDel(veth) })
	if err := disableIPv6(hostName); err != nil {
		return nil, err
	}
	if err := h.LinkSetUp(veth); err != nil {
		return nil, fmt.Errorf("host veth up: %w", err)
	}
	failpoint.Hit("network.setup.veth")
	// Pinned before it joins the bridge: no sandbox port carries traffic unpinned.
	if err := m.pinPort(id, pin{veth: hostName, mac: mac.String(), ip: ip}); err != nil {
		return nil, err
	}
	undo = append(undo, func() { _ = m.unpinPort(id) })
	// The port has no carrier until eth0 is up, so nothing crosses it before
	// isolation is on.
	if err := h.LinkSetMasterByIndex(veth, m.brIdx); err != nil {
		return nil, fmt.Errorf("attach veth to bridge: %w", err)
	}
	if err := h.LinkSetIsolated(veth, true); err != nil {
		return nil, fmt.Errorf("isolate bridge port: %w", err)
	}

	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := m.configureInside(nsh, ip); err != nil {
		return nil, err
	}
	failpoint.Hit("network.setup.inside")
	// Host side, then the bridge (whose carrier follows its first forwarding
	// port): see syncLink.
	syncLink(h, veth.Attrs().Index)
	syncLink(h, m.brIdx)

	att = &Attachment{
		ID:        id,
		NetNSPath: nsPath,
		IP:        ip,
		Gateway:   m.gateway,
		PrefixLen: m.cfg.Subnet.Bits(),
		HostVeth:  hostName,
		MAC:       mac.String(),
	}
	if err := m.writeRecord(att); err != nil {
		return nil, err
	}
	return att, nil
}

// configureInside brings up lo and eth0 in the namespace, adds the address and
// the default route, using a netlink socket opened in that namespace.
func (m *Manager) configureInside(nsh netns.NsHandle, ip netip.Addr) error {
	nh, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink in netns: %w", err)
	}
	defer nh.Close()
	lo, err := nh.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	if err := nh.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	eth, err := nh.LinkByName(ContainerIface)
	if err != nil {
		return fmt.Errorf("%s: %w", ContainerIface, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{
		IP:   net.IP(ip.AsSlice()),
		Mask: net.CIDRMask(m.cfg.Subnet.Bits(), 32),
	}}
	if err := nh.AddrAdd(eth, addr); err != nil {
		return fmt.Errorf("add address: %w", err)
	}
	if err := nh.LinkSetUp(eth); err != nil {
		return fmt.Errorf("%s up: %w", ContainerIface, err)
	}
	route := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(m.gateway.AsSlice())}
	if err := nh.RouteAdd(route); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	syncLink(nh, eth.Attrs().Index)
	return nil
}

// syncLink makes the kernel apply a pending carrier change of a link now.
//
// When a veth's carrier comes on, the kernel activates its queueing discipline
// only in the deferred "linkwatch" work, which is rate-limited and was seen here
// to lag by up to a second; until then the device drops every packet, and the
// first SYN or ARP request is retransmitted only after a second. A single-link
// RTM_GETLINK runs that pending work synchronously for the device (Linux >= 6.7,
// rtnl_getlink -> linkwatch_sync_dev), so one cheap round trip per device makes
// the sandbox network usable the moment Setup returns. On older kernels this is
// a harmless no-op. Errors are ignored: it is an optimisation only.
func syncLink(h *netlink.Handle, index int) {
	_, _ = h.LinkByIndex(index)
}

// Lookup rebuilds the Attachment of id from persisted state (e.g. after a runner
// restart). It fails with ErrNotFound when there is no record or the netns is
// no longer mounted (e.g. after a host reboot); Teardown then cleans up.
func (m *Manager) Lookup(id string) (*Attachment, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	att, err := m.readRecord(id)
	if err != nil {
		return nil, err
	}
	att.NetNSPath = m.NetNSPath(id) // (a record of the previous layout has the same path)
	if !isNSFS(att.NetNSPath) {
		return nil, fmt.Errorf("%w: netns of %s is not mounted", ErrNotFound, id)
	}
	return att, nil
}

// List returns the ids of all sandboxes with network state under StateDir,
// including partial state left by a crash (Teardown removes it).
func (m *Manager) List() ([]string, error) {
	seen := map[string]bool{}
	var ids []string
	add := func(id string) {
		if validID(id) == nil && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	names, err := m.holder.list()
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		add(n)
	}
	ents, err := os.ReadDir(m.recDir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			add(id)
		}
	}
	return ids, nil
}

// Teardown removes the network of id: host veth (and with it eth0), the netns
// mount and file, the address and the record. It is idempotent and also cleans
// partial state left by a failed Setup or a crash.
func (m *Manager) Teardown(id string) error {
	if err := validID(id); err != nil {
		return err
	}
	h, err := m.handle()
	if err != nil {
		return err
	}
	var errs []error
	att, rerr := m.readRecord(id)
	hostName := vethName(m.cfg.Bridge, id)
	if rerr == nil && att.HostVeth != "" {
		hostName = att.HostVeth
	}
	if l, err := h.LinkByName(hostName); err == nil {
		if l.Type() == "veth" {
			if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("delete veth %s: %w", hostName, err))
			}
		}
	} else if !isLinkNotFound(err) {
		errs = append(errs, fmt.Errorf("find veth %s: %w", hostName, err))
	}
	if err := m.holder.deleteNetNS(id); err != nil {
		errs = append(errs, err)
	}
	var ip netip.Addr
	if rerr == nil {
		ip = att.IP
	}
	if err := m.unpinPort(id); err != nil {
		errs = append(errs, err)
	}
	m.forgetSecrets(ip)
	// The address stays taken while rules for it may remain, so no new sandbox inherits them.
	if err := m.clearRules(id, ip); err != nil {
		errs = append(errs, err)
	} else if ip.IsValid() {
		m.freeIP(ip, id)
	} else {
		m.freeIPsOf(id)
	}
	if len(errs) == 0 {
		// With the temporary files of a write a crash interrupted.
		for _, p := range []string{m.recordPath(id), m.recordPath(id) + ".tmp", m.rulesPath(id) + ".tmp"} {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("network: teardown %s: %w", id, err)
	}
	return nil
}

// Close releases the Manager's resources and stops its services (StartServices). Host
// setup, sandbox networks and their rules stay.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.h.Close()
	m.mu.Unlock()
	m.pol.closeConn()
	m.pinMu.Lock()
	m.pinNl.close()
	m.pinMu.Unlock()
	m.StopServices()
	m.holder.close()
	return nil
}

// Cleanup tears down every sandbox network under StateDir and removes the host
// setup: the nftables table, the bridge and the holder of network namespaces, and it
// restores net.ipv4.ip_forward if New changed it. For tests and uninstall.
func (m *Manager) Cleanup() error {
	h, err := m.handle()
	if err != nil {
		return err
	}
	var errs []error
	ids, err := m.List()
	if err != nil {
		errs = append(errs, err)
	}
	for _, id := range ids {
		if err := m.Teardown(id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := deleteTable(m.cfg.Table); err != nil {
		errs = append(errs, err)
	}
	if err := deletePinTable(m.cfg.Table); err != nil {
		errs = append(errs, err)
	}
	if l, err := h.LinkByName(m.cfg.Bridge); err == nil {
		if err := h.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete bridge: %w", err))
		}
	} else if !isLinkNotFound(err) {
		errs = append(errs, err)
	}
	if err := m.holder.destroy(); err != nil {
		errs = append(errs, err)
	}
	if err := m.restoreForwarding(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("network: cleanup: %w", err)
	}
	return nil
}

// disableIPv6 turns IPv6 off on the host's link name (a sandbox's host veth, still
// down). Sandboxes get no IPv6, and a bridge port needs none; with it on, the kernel gave
// each host veth a link-local address and routes in the host's IPv6 table, and walked that
// whole table at every host veth's carrier change: work per sandbox started that grew with
// the sandboxes running. A link without the file has no IPv6 to turn off: the kernel
// makes no conf/<name> for a link whose MTU is below IPv6's minimum (1280; Config.MTU may
// be lower), nor any conf without IPv6. Other errors fail.
func disableIPv6(name string) error {
	err := os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("disable IPv6 on %s: %w", name, err)
	}
	return nil
}

func (m *Manager) setupBridge() error {
	l, err := m.h.LinkByName(m.cfg.Bridge)
	if err != nil && !isLinkNotFound(err) {
		return fmt.Errorf("network: bridge: %w", err)
	}
	if l == nil {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{
			Name: m.cfg.Bridge,
			// A fixed address keeps the bridge from taking the lowest port MAC,
			// which would change the gateway's MAC as sandboxes come and go.
			HardwareAddr: bridgeMAC(m.cfg.Bridge),
			MTU:          m.cfg.MTU,
			TxQLen:       -1,
		}}
		if err := m.h.LinkAdd(br); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("network: create bridge %s: %w", m.cfg.Bridge, err)
		}
		if l, err = m.h.LinkByName(m.cfg.Bridge); err != nil {
			return fmt.Errorf("network: bridge: %w", err)
		}
	}
	if l.Type() != "bridge" {
		return fmt.Errorf("network: %s exists and is a %s, not a bridge", m.cfg.Bridge, l.Type())
	}
	m.brIdx = l.Attrs().Index
	// Sandboxes get no IPv6; keep the host from talking IPv6 on the bridge.
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+m.cfg.Bridge+"/disable_ipv6", []byte("1"), 0o644)
	// No multicast snooping: with it, every port's carrier change (one per sandbox
	// started) re-armed the snooping timers of every port of the bridge, work that grew
	// with the sandboxes running. The ports are isolated from each other, so multicast
	// only ever reached the host's side of the bridge anyway; and no sandbox can fill the
	// bridge's group database.
	_ = os.WriteFile("/sys/class/net/"+m.cfg.Bridge+"/bridge/multicast_snooping", []byte("0"), 0o644)

	want := &netlink.Addr{IPNet: &net.IPNet{
		IP:   net.IP(m.gateway.AsSlice()),
		Mask: net.CIDRMask(m.cfg.Subnet.Bits(), 32),
	}}
	addrs, err := m.h.AddrList(l, unix.AF_INET)
	if err != nil {
		return fmt.Errorf("network: bridge addresses: %w", err)
	}
	have := false
	for _, a := range addrs {
		if a.IPNet.String() == want.IPNet.String() {
			have = true
		}
	}
	if !have {
		if err := m.h.AddrAdd(l, want); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("network: bridge address: %w", err)
		}
	}
	if err := m.h.LinkSetUp(l); err != nil {
		return fmt.Errorf("network: bridge up: %w", err)
	}
	return nil
}

const ipForwardPath = "/proc/sys/net/ipv4/ip_forward"

func (m *Manager) enableForwarding() error {
	b, err := os.ReadFile(ipForwardPath)
	if err != nil {
		return fmt.Errorf("network: ip_forward: %w", err)
	}
	cur := strings.TrimSpace(string(b))
	if cur == "1" {
		return nil
	}
	orig := filepath.Join(m.stateDir, "ip_forward.orig")
	if _, err := os.Stat(orig); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(orig, []byte(cur+"\n"), 0o644); err != nil {
			return fmt.Errorf("network: %w", err)
		}
	}
	if err := os.WriteFile(ipForwardPath, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("network: enable ip_forward: %w", err)
	}
	return nil
}

func (m *Manager) restoreForwarding() error {
	orig := filepath.Join(m.stateDir, "ip_forward.orig")
	b, err := os.ReadFile(orig)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	if v := strings.TrimSpace(string(b)); v == "0" || v == "1" {
		if err := os.WriteFile(ipForwardPath, []byte(v), 0o644); err != nil {
			return fmt.Errorf("restore ip_forward: %w", err)
		}
	}
	return os.Remove(orig)
}

func (m *Manager) recordPath(id string) string { return filepath.Join(m.recDir, id+".json") }

func (m *Manager) writeRecord(a *Attachment) error {
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	p := m.recordPath(a.ID)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write record: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write record: %w", err)
	}
	return nil
}

func (m *Manager) readRecord(id string) (*Attachment, error) {
	b, err := os.ReadFile(m.recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	} else if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	var a Attachment
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("network: record of %s: %w", id, err)
	}
	return &a, nil
}

// validID accepts ids usable as file names and keeps them short.
func validID(id string) error {
	if id == "" || len(id) > 128 || id == "." || id == ".." || strings.HasPrefix(id, ".") {
		return fmt.Errorf("network: invalid sandbox id %q", id)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("network: invalid sandbox id %q", id)
		}
	}
	return nil
}

func validIfName(n string) error {
	if n == "" || len(n) > unix.IFNAMSIZ-1 || strings.ContainsAny(n, "/ \t\n:") {
		return fmt.Errorf("network: invalid interface name %q", n)
	}
	return nil
}

func validTableName(n string) bool {
	if n == "" || len(n) > 64 {
		return false
	}
	for i, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || i > 0 && (c >= '0' && c <= '9' || c == '-')) {
			return false
		}
	}
	return true
}

// dropStaleVeth deletes the host link named hostName (sandbox id's) that made adding
// id's veth fail with EEXIST. Setup made id's network namespace exclusively just before,
// so id has no attachment on this host: a link by that name is a leftover of an earlier
// life of id (a runner killed between its steps, or the kernel still destroying a
// dropped namespace's pair), unless it is not a veth, hangs off another master, or is
// pinned for another sandbox, which it refuses to touch. No such link: the EEXIST came
// from the peer's side, and the error says so.
func (m *Manager) dropStaleVeth(h *netlink.Handle, id, hostName string) error {
	l, err := h.LinkByName(hostName)
	if err != nil {
		return fmt.Errorf("add veth %s: peer %s taken in the new namespace (no host link by that name: %w): %w",
			hostName, ContainerIface, err, ErrExists)
	}
	if l.Type() != "veth" || (l.Attrs().MasterIndex != 0 && l.Attrs().MasterIndex != m.brIdx) {
		return fmt.Errorf("veth %s already exists (a %s on master %d, not this network's): %w",
			hostName, l.Type(), l.Attrs().MasterIndex, ErrExists)
	}
	m.pinMu.Lock()
	for other, p := range m.pins {
		if p.veth == hostName && other != id {
			m.pinMu.Unlock()
			return fmt.Errorf("veth %s already exists (pinned for %s): %w", hostName, other, ErrExists)
		}
	}
	m.pinMu.Unlock()
	slog.Warn("network: deleting a stale host veth left by an earlier life of the sandbox", "sandbox", id, "veth", hostName)
	if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete stale veth %s: %w", hostName, err)
	}
	return nil
}

// vethName derives the host veth name (13 bytes) from the bridge and the id, so
// that the same id on two bridges does not clash.
// HostVethName is the host side of sandbox id's veth on bridge.
func HostVethName(bridge, id string) string { return vethName(bridge, id) }

func vethName(bridge, id string) string {
	s := sha256.Sum256([]byte(bridge + "\x00" + id))
	return "sbx" + hex.EncodeToString(s[:5])
}

// macForIP derives eth0's MAC from its IPv4 address (locally administered), so a
// reused address keeps its MAC and the host's neighbour entry stays valid.
func macForIP(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x02, 0x5b, b[0], b[1], b[2], b[3]}
}

func bridgeMAC(bridge string) net.HardwareAddr {
	s := sha256.Sum256([]byte("bridge\x00" + bridge))
	return net.HardwareAddr{0x02, 0x5a, s[0], s[1], s[2], s[3]}
}

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// enableProxyARP makes the bridge answer ARP for the sandboxes' addresses and keeps it
// from telling sandboxes to talk directly (which isolation would stop anyway): packets
// between sandboxes are routed through the host and meet the forward chain (rules.go).
func (m *Manager) enableProxyARP() error {
	var errs []error
	// Forwarding on the bridge alone (not the host-wide ip_forward): packets between
	// sandboxes enter and leave through it; everything else is the forward chain's call.
	for name, v := range map[string]string{"conf/%s/forwarding": "1", "conf/%s/proxy_arp": "1", "conf/%s/proxy_arp_pvlan": "1", "conf/%s/send_redirects": "0",
		// Answer at once: the default delays proxy replies by up to 0.8 s.
		"neigh/%s/proxy_delay": "0"} {
		p := filepath.Join("/proc/sys/net/ipv4", fmt.Sprintf(name, m.cfg.Bridge))
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("network: bridge sysctls: %w", err)
	}
	return nil
}
