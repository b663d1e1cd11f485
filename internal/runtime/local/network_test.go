package local

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/mountinfo"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/sockmark"
)

// netAdapter is the test's copy of internal/stack's adapter.
type netAdapter struct{ m *network.Manager }

func (n netAdapter) Setup(ctx context.Context, id string) (*Attachment, error) {
	a, err := n.m.Setup(ctx, id)
	if err != nil {
		return nil, err
	}
	return toLocal(a), nil
}

func (n netAdapter) Lookup(id string) (*Attachment, error) {
	a, err := n.m.Lookup(id)
	if err != nil {
		return nil, err
	}
	return toLocal(a), nil
}

func (n netAdapter) Teardown(id string) error { return n.m.Teardown(id) }

func (n netAdapter) WriteEtcFiles(dir, hostname string, a *Attachment) error {
	return network.WriteEtcFiles(dir, hostname, &network.Attachment{
		ID: a.ID, NetNSPath: a.NetNSPath, IP: a.IP, Gateway: a.Gateway, PrefixLen: a.PrefixLen, HostVeth: a.HostVeth,
	}, n.m.Nameservers())
}

func toLocal(a *network.Attachment) *Attachment {
	return &Attachment{ID: a.ID, NetNSPath: a.NetNSPath, IP: a.IP, Gateway: a.Gateway, PrefixLen: a.PrefixLen, HostVeth: a.HostVeth}
}

// TestNetwork runs sandboxes on a bridge of their own: the host reaches a port inside at
// the sandbox IP, Recover rebuilds the IP, Destroy removes veth and netns.
func TestNetwork(t *testing.T) {
	e := newEnv(t)
	m := e.withNetwork(t, 0)

	const id = "net-1"
	start := time.Now()
	info := e.create(runtime.Spec{ID: id, Container: runtime.Container{Command: "httpd", Args: []string{"-f", "-p", "8080", "-h", "/www"}, Files: []runtime.File{{Path: "/www/index.html", Content: []byte("hello\n")}}}})
	c := agentClient(e.b, id)
	execIn(t, c, "true")
	t.Logf("create -> first exec with network: %v, IP %s", time.Since(start), info.IP)
	if !strings.HasPrefix(info.IP, "10.233.77.") {
		t.Fatalf("IP = %q", info.IP)
	}
	if out, _, _ := execIn(t, c, "ip", "-4", "addr", "show", "eth0"); !strings.Contains(out, info.IP+"/24") {
		t.Errorf("eth0 in the sandbox: %q", out)
	}
	if out, _, _ := execIn(t, c, "cat", "/etc/hosts"); !strings.Contains(out, info.IP) {
		t.Errorf("/etc/hosts: %q", out)
	}
	// The sandbox's sysfs (mounted by the backend in its network namespace) shows its
	// eth0, while the host keeps no mount of it: each mount left in the host's table
	// makes every later create slower (runc reads all of /proc/self/mountinfo).
	if out, errOut, code := execIn(t, c, "cat", "/sys/class/net/eth0/operstate"); code != 0 || out != "up\n" {
		t.Errorf("the sandbox's /sys/class/net/eth0/operstate: %q %q (exit %d), want up", out, errOut, code)
	}
	// Nor of its root filesystem: the container's own copy serves it (a file written
	// there reads back).
	if left, err := mountinfo.Under(filepath.Join(e.state, id), e.b.rootfs(filepath.Join(e.b.dir(id), dirBundle), id)); err != nil || len(left) > 0 {
		t.Errorf("mounts of the sandbox left on the host after the start: %q (%v)", left, err)
	}
	if out, errOut, code := execIn(t, c, "sh", "-c", "echo kept > /root-written && cat /root-written"); code != 0 || out != "kept\n" {
		t.Errorf("write and read back in the sandbox's root: %q %q (exit %d)", out, errOut, code)
	}
	// The host reaches the sandbox's port at its IP, with the network's host mark as the
	// edge dials (unmarked, the guard refuses it).
	var body []byte
	hc := markedClient(m)
	for i := 0; i < 50; i++ { // httpd may not listen yet right after create
		resp, err := hc.Get("http://" + net.JoinHostPort(info.IP, "8080") + "/index.html")
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if string(body) != "hello\n" {
		t.Errorf("host -> %s:8080 read %q", info.IP, body)
	}

	// Recover on a new Backend knows the IP.
	b2 := e.backend()
	b2.cfg.Network = netAdapter{m}
	rs, err := b2.Recover(context.Background())
	if err != nil || len(rs) != 1 || !rs[0].Alive || rs[0].Info.IP != info.IP {
		t.Fatalf("recover = %+v, %v", rs, err)
	}
	a, err := m.Lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := b2.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if _, err := net.InterfaceByName(a.HostVeth); err == nil {
		t.Errorf("host veth %s left after destroy", a.HostVeth)
	}
	if _, err := os.Stat(a.NetNSPath); err == nil {
		t.Errorf("netns %s left after destroy", a.NetNSPath)
	}
	checkNoLeaks(t, e.state, id)
}

// markedClient is an HTTP client whose connections carry m's host mark, the only way
// from the host into a sandbox (see network.Config.HostMark).
func markedClient(m *network.Manager) *http.Client {
	d := &net.Dialer{Control: sockmark.Control(m.HostMark())}
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
}

func (n netAdapter) SetRules(id string, r Rules) error {
	conv := func(ps []Port) []network.Port {
		out := make([]network.Port, len(ps))
		for i, p := range ps {
			out[i] = network.Port{Proto: p.Proto, Port: p.Port}
		}
		return out
	}
	return n.m.SetRules(id, network.Rules{Org: r.Org, Caller: r.Caller, Private: conv(r.Private), Custom: conv(r.Custom), Network: r.Network})
}

// withNetwork gives e's backend the n-th test network of this package (a bridge, /24
// and nftables table of its own, so tests and benchmarks never share one), removed when
// tb ends.
func (e *env) withNetwork(tb testing.TB, n int) *network.Manager {
	tb.Helper()
	table := "sbxlocaltest"
	if n > 0 {
		table += strconv.Itoa(n)
	}
	m, err := network.New(network.Config{
		Bridge:   "sbxlocalt" + strconv.Itoa(n),
		Subnet:   netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 233, byte(77 + n), 0}), 24),
		StateDir: tb.TempDir(), Nameservers: []string{}, Table: table,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := m.Cleanup(); err != nil {
			tb.Errorf("network cleanup: %v", err)
		}
	})
	e.b.cfg.Network = netAdapter{m}
	return m
}

// TestGroupNetwork: a group on the bridge (groupns.go: the attachment's namespace is
// joined, each container in a user namespace of its own with the group's mapping): every
// container has the sandbox's eth0 and IP, its sysfs shows eth0 (the backend mounts it,
// mountNetNSSysfs), the hostname is the sandbox's, and the sidecar's port 8080 answers the
// host at the sandbox's IP.
func TestGroupNetwork(t *testing.T) {
	e := newEnv(t)
	m := e.withNetwork(t, 0)
	spec := groupSpec("grp-net")
	// Port 8080: on the bridge, the network namespace belongs to the host's user
	// namespace, where the containers' root may not bind ports below 1024.
	spec.Sidecars[0].Args = []string{"-f", "-p", "8080", "-h", "/data"}
	info := e.create(spec)
	if !strings.HasPrefix(info.IP, "10.233.77.") {
		t.Fatalf("IP = %q", info.IP)
	}
	for _, name := range []string{"", "side"} {
		c := agentClientOf(e.b, spec.ID, name)
		out, errOut, code := execIn(t, c, "sh", "-c", "ip -4 addr show eth0; cat /sys/class/net/eth0/operstate; hostname")
		if code != 0 || !strings.Contains(out, info.IP+"/24") || !strings.Contains(out, "\nup\n") || !strings.HasSuffix(out, runtime.Hostname(spec.ID)+"\n") {
			t.Errorf("container %q: %q %q (exit %d), want eth0 with %s, its sysfs, the sandbox's hostname", name, out, errOut, code, info.IP)
		}
	}
	if _, errOut, c := execIn(t, agentClientOf(e.b, spec.ID, "side"), "sh", "-c", "echo hello > /data/index.html"); c != 0 {
		t.Fatalf("write in side: %s", errOut)
	}
	var body []byte
	hc := markedClient(m)
	for i := 0; i < 100 && string(body) != "hello\n"; i++ {
		resp, err := hc.Get("http://" + net.JoinHostPort(info.IP, "8080") + "/index.html")
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if string(body) != "hello\n" {
		t.Errorf("host -> %s:8080 (the sidecar) read %q", info.IP, body)
	}
	if err := e.b.Destroy(context.Background(), spec.ID); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, spec.ID)
}
