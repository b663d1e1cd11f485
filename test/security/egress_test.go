package security

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/egress/egresstest"
	"github.com/sandboxd/sandboxd/internal/reserved"
)

type sandboxJSON struct {
	SandboxID string `json:"sandboxId"`
	Status    struct {
		State string `json:"state"`
	} `json:"status"`
}

// create asks for a sandbox of image running sleep with egress rules (nil: the
// default); it returns the HTTP status, the body and the ID (when created), and deletes
// the sandbox at cleanup.
func (d *Dev) create(t *testing.T, key, image string, egress []map[string]any) (int, []byte, string) {
	t.Helper()
	spec := map[string]any{
		"containers":         []any{map[string]any{"image": image, "command": "sleep", "args": []string{"600"}}},
		"maxLifetimeSeconds": 300,
	}
	if egress != nil {
		spec["network"] = map[string]any{"egress": egress}
	}
	code, body := d.rest(t, key, "POST", "/v1/sandboxes", map[string]any{"spec": spec})
	var sb sandboxJSON
	_ = json.Unmarshal(body, &sb)
	if sb.SandboxID != "" {
		id := sb.SandboxID
		t.Cleanup(func() { d.rest(t, key, "DELETE", "/v1/sandboxes/"+id, nil) })
	}
	return code, body, sb.SandboxID
}

// wait polls the sandbox until its state is not CREATING and returns it and the body.
func (d *Dev) wait(t *testing.T, key, id string) (string, []byte) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		code, body := d.rest(t, key, "GET", "/v1/sandboxes/"+id, nil)
		var sb sandboxJSON
		_ = json.Unmarshal(body, &sb)
		if code != http.StatusOK {
			t.Fatalf("get %s: HTTP %d %s", id, code, body)
		}
		if sb.Status.State != "STATE_CREATING" && sb.Status.State != "" {
			return sb.Status.State, body
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still CREATING: %s", id, body)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// exec runs sh -c script in the sandbox and returns its stdout.
func (d *Dev) exec(t *testing.T, key, id, script string) string {
	t.Helper()
	code, body := d.rest(t, key, "POST", "/v1/sandboxes/"+id+":exec", map[string]any{"command": []string{"sh", "-c", script}})
	if code != http.StatusOK {
		t.Fatalf("exec in %s: HTTP %d %s", id, code, body)
	}
	var r struct {
		Stdout []byte `json:"stdout"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("exec: %v: %s", err, body)
	}
	return string(r.Stdout)
}

// countingListener accepts on l, answers a minimal HTTP response and counts accepts.
func countingListener(t *testing.T, l net.Listener) *atomic.Int32 {
	t.Helper()
	var n atomic.Int32
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(2 * time.Second))
				_, _ = c.Read(make([]byte, 512))
				_, _ = io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
			}()
		}
	}()
	return &n
}

// hostAddr is the host's first global IPv4 address (not loopback, link-local, nor the
// sandbox bridge's).
func hostAddr(t *testing.T) netip.Addr {
	t.Helper()
	for _, a := range reserved.HostAddrs() {
		if a.Is4() && !a.IsLoopback() && !a.IsLinkLocalUnicast() && !sandboxSubnet().Contains(a) && !netip.MustParsePrefix("10.88.0.0/16").Contains(a) {
			return a
		}
	}
	t.Skip("the host has no global IPv4 address")
	return netip.Addr{}
}

func cidrRule(cidr string) []map[string]any {
	return []map[string]any{{"cidr": map[string]any{"cidr": cidr}}}
}

// TestEgressReservedCIDRRefused: a sandbox asking for egress wholly inside the
// platform's reserved ranges (cloud metadata, private ranges, loopback, the host's own
// address, the sandbox subnet) is refused at create with a field violation naming the
// rule. Before: each got an nftables accept under the empty policy.
func TestEgressReservedCIDRRefused(t *testing.T) {
	d := needDev(t)
	for _, cidr := range []string{"169.254.169.254/32", "192.168.0.0/16", "10.0.0.0/8", "127.0.0.0/8", "172.16.0.0/12",
		"100.64.0.0/10", "10.88.0.0/16", d.Subnet.String(), hostAddr(t).String() + "/32"} {
		code, body, id := d.create(t, d.KeyA, "busybox", cidrRule(cidr))
		if code != http.StatusBadRequest || id != "" {
			t.Errorf("egress %s: HTTP %d %s, want 400", cidr, code, body)
			continue
		}
		if !strings.Contains(string(body), "sandbox.spec.network.egress[0].cidr") || !strings.Contains(string(body), "reserved") {
			t.Errorf("egress %s: the refusal does not name the rule: %s", cidr, body)
		}
	}
}

// TestEgressWideCIDRCutsReserved: 0.0.0.0/0 is accepted, but from inside the sandbox
// the host (its own address and the bridge's, where a listener waits), cloud metadata
// and a private address routed from the host stay unreachable, while a public-looking
// address in a namespace of the test's (the positive control) answers.
func TestEgressWideCIDRCutsReserved(t *testing.T) {
	d := needDev(t)
	in := egresstest.New(t)
	pub := in.Addr(t)
	pl, err := in.Listen("tcp", pub.String()+":8080")
	if err != nil {
		t.Fatal(err)
	}
	pubHits := countingListener(t, pl)

	// A private address in the same namespace, routed from the host: only the egress
	// rules stand between a sandbox and it.
	priv := netip.AddrFrom4([4]byte{192, 168, 200 + byte(time.Now().UnixNano()%50), byte(2 + time.Now().UnixNano()%250)})
	if out, err := exec.Command("ip", "-n", in.NS, "addr", "add", priv.String()+"/32", "dev", "eth0").CombinedOutput(); err != nil {
		t.Fatalf("ip addr: %v %s", err, out)
	}
	if out, err := exec.Command("ip", "route", "add", priv.String()+"/32", "via", pub.String()).CombinedOutput(); err != nil {
		t.Fatalf("ip route: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "route", "del", priv.String()+"/32").Run() })
	vl, err := in.Listen("tcp", priv.String()+":8080")
	if err != nil {
		t.Fatal(err)
	}
	privHits := countingListener(t, vl)

	// The host: a listener on every address (its own, the bridge's, loopback).
	hl, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	hostHits := countingListener(t, hl)
	hostPort := hl.Addr().(*net.TCPAddr).Port

	code, body, id := d.create(t, d.KeyA, "busybox", cidrRule("0.0.0.0/0"))
	if code != http.StatusOK || id == "" {
		t.Fatalf("create with 0.0.0.0/0: HTTP %d %s", code, body)
	}
	if state, body := d.wait(t, d.KeyA, id); state != "STATE_RUNNING" {
		t.Fatalf("sandbox %s: %s", state, body)
	}
	probe := func(addr string) string {
		host, port, _ := net.SplitHostPort(addr)
		out := d.exec(t, d.KeyA, id, fmt.Sprintf("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 %s %s 2>&1", host, port))
		if strings.Contains(out, "hello") {
			return "hello"
		}
		return "UNREACHABLE (" + strings.TrimSpace(out) + ")"
	}
	if got := probe(pub.String() + ":8080"); got != "hello" || pubHits.Load() == 0 {
		t.Errorf("positive control %s: %q (%d connections): an allowed internet address must answer", pub, got, pubHits.Load())
	}
	for _, target := range []string{
		fmt.Sprintf("%s:%d", hostAddr(t), hostPort),    // the host's own address
		fmt.Sprintf("%s:%d", d.bridgeAddr(), hostPort), // the bridge (the sandbox's gateway)
		priv.String() + ":8080",                        // a private range, routed
		"169.254.169.254:80",                           // cloud metadata
	} {
		if got := probe(target); !strings.HasPrefix(got, "UNREACHABLE") {
			t.Errorf("%s from the sandbox: %q, want unreachable", target, got)
		}
	}
	if n := hostHits.Load(); n != 0 {
		t.Errorf("%d connections reached the host's listener", n)
	}
	if n := privHits.Load(); n != 0 {
		t.Errorf("%d connections reached the private address %s", n, priv)
	}
}

// TestImageRefAtHostPortsRefused: image references naming the host's ports (loopback,
// localhost, IPv6 loopback, the host's address, the bridge, cloud metadata) make the
// puller dial nothing, and the failure says nothing of what (if anything) listens.
// Before: the puller dialled and the reason told "connection refused", "server gave
// HTTP response to HTTPS client" or an x509 error.
func TestImageRefAtHostPortsRefused(t *testing.T) {
	d := needDev(t)
	hl, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	hits := countingListener(t, hl)
	port := hl.Addr().(*net.TCPAddr).Port
	refs := []string{
		fmt.Sprintf("127.0.0.1:%d/x:1", port), fmt.Sprintf("localhost:%d/x", port), "localhost:1/x",
		fmt.Sprintf("[::1]:%d/x", port), fmt.Sprintf("%s:%d/x:1", hostAddr(t), port), fmt.Sprintf("%s:%d/x", d.bridgeAddr(), port),
		"169.254.169.254/x", fmt.Sprintf("0.0.0.0:%d/x", port),
	}
	for _, ref := range refs {
		code, body, id := d.create(t, d.KeyA, ref, nil)
		var answer []byte
		switch {
		case code == http.StatusBadRequest:
			answer = body
		case code == http.StatusOK && id != "":
			var state string
			state, answer = d.wait(t, d.KeyA, id)
			if state != "STATE_FAILED" {
				t.Errorf("%s: %s, want FAILED: %s", ref, state, answer)
			}
			if !strings.Contains(string(answer), "not allowed") {
				t.Errorf("%s: the failure does not say the registry is not allowed: %s", ref, answer)
			}
		default:
			t.Errorf("%s: HTTP %d %s", ref, code, body)
			continue
		}
		// The random sandbox ID may hold a word looked for (a CI run's had "tls"): it is
		// not what the puller said.
		said := string(answer)
		if id != "" {
			said = strings.ReplaceAll(said, id, "<sandbox id>")
		}
		for _, leak := range []string{"refused", "HTTP response", "x509", "certificate", "tls", "dial", "timeout", "EOF"} {
			if strings.Contains(said, leak) {
				t.Errorf("%s: the answer tells the caller %q: %s", ref, leak, answer)
			}
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("%d connections reached the host's listener", n)
	}
}
