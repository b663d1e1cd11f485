package security

import (
	"encoding/json"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// spoofARP is run inside the attacking sandbox (python3, CAP_NET_RAW): it sends one ARP
// request for the gateway out of eth0 from its own MAC, claiming sender address argv[1].
const spoofARP = `
import socket, struct, sys
claim, gw = sys.argv[1], sys.argv[2]
try:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
except OSError as e:
    print('refused', e.errno)
    sys.exit(0)
s.bind(('eth0', 0))
mac = s.getsockname()[4]
arp = struct.pack('!HHBBH6s4s6s4s', 1, 0x0800, 6, 4, 1, mac, socket.inet_aton(claim), b'\0' * 6, socket.inet_aton(gw))
for _ in range(3):
    s.send(b'\xff' * 6 + mac + b'\x08\x06' + arp)
print(mac.hex(':'))
`

// addrScript prints the sandbox's IPv4 address and its default gateway.
const addrScript = `import socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("192.0.2.1", 9))
gw = [l.split()[2] for l in open("/proc/net/route") if l.split()[1] == "00000000"][0]
print(s.getsockname()[0], socket.inet_ntoa(struct.pack("<I", int(gw, 16))))`

// TestSandboxCannotSpoofAnotherOnTheBridge: a tenant's sandbox granted CAP_NET_RAW (a
// policy allowing it) tries to send ARP claiming another organization's sandbox's
// address; had the host taken it, its neighbour entry for the victim would point at the
// attacker, which would then receive the victim's traffic. Two defences: the raw socket
// is refused (runc: the sandbox's user namespace does not own its network namespace;
// gVisor: runsc runs without --net-raw), and where a sandbox can send raw frames (a
// container engine inside gVisor) its bridge port is pinned to its own MAC and address
// (internal/runtime/local/network/antispoof.go, TestAntiSpoof). When the frames can be
// sent, the control (the same frame claiming the attacker's own address) must reach the
// host, so the test fails if they never got there at all.
func TestSandboxCannotSpoofAnotherOnTheBridge(t *testing.T) {
	d := needDev(t)
	classes := []string{"runc"}
	if local.FindRunsc() != "" {
		classes = append(classes, local.GVisorClass)
	}
	// An operator's policy that lets containers add NET_RAW (the runner's own allows
	// no added capabilities).
	setPolicy(t, d, `{"constraints": {"security": {"allowed_capabilities": ["NET_RAW"], "allowed_runtime_classes": ["runc", "gvisor"]}}}`)
	for _, class := range classes {
		t.Run(class, func(t *testing.T) { spoofOnBridge(t, d, class) })
	}
}

func spoofOnBridge(t *testing.T, d *Dev, class string) {
	create := func(key string) string {
		t.Helper()
		spec := map[string]any{
			"runtimeClass": class,
			"containers": []any{map[string]any{
				"image": "python:3.11", "command": "sleep", "args": []string{"600"},
				"securityContext": map[string]any{"capabilitiesAdd": []string{"NET_RAW"}},
			}},
			"maxLifetimeSeconds": 300,
		}
		code, body := d.rest(t, key, http.MethodPost, "/v1/sandboxes", map[string]any{"spec": spec})
		if code != http.StatusOK {
			t.Fatalf("create: HTTP %d %s", code, body)
		}
		_, id, _ := strings.Cut(string(body), `"sandboxId":"`)
		id, _, _ = strings.Cut(id, `"`)
		t.Cleanup(func() { d.rest(t, key, http.MethodDelete, "/v1/sandboxes/"+id, nil) })
		if state, b := d.wait(t, key, id); state != "STATE_RUNNING" {
			t.Fatalf("sandbox %s: %s %s", id, state, b)
		}
		return id
	}
	attacker, victim := create(d.KeyA), create(d.KeyB)
	addrOf := func(key, id string) (ip, gw string) {
		t.Helper()
		out := strings.Fields(d.exec(t, key, id, "python3 -c '"+addrScript+"'"))
		if len(out) != 2 {
			t.Fatalf("address and gateway of %s: %q", id, out)
		}
		return out[0], out[1]
	}
	aIP, gw := addrOf(d.KeyA, attacker)
	vIP, _ := addrOf(d.KeyB, victim)
	neigh := func(ip string) string {
		out, _ := exec.Command("ip", "neigh", "show", "to", ip).CombinedOutput()
		return string(out)
	}
	run := func(claim string) string {
		t.Helper()
		script := "cat > /tmp/arp.py <<'EOF'\n" + spoofARP + "EOF\npython3 /tmp/arp.py " + claim + " " + gw
		code, body := d.rest(t, d.KeyA, http.MethodPost, "/v1/sandboxes/"+attacker+":exec", map[string]any{"command": []string{"sh", "-c", script}})
		var r struct {
			Stdout, Stderr []byte
			ExitCode       int
		}
		if err := json.Unmarshal(body, &r); code != http.StatusOK || err != nil || r.ExitCode != 0 {
			t.Fatalf("the attack script: HTTP %d, exit %d: %s%s (%v)", code, r.ExitCode, r.Stdout, r.Stderr, err)
		}
		return strings.TrimSpace(string(r.Stdout))
	}

	// Control: the attacker's ARP for its own address reaches the host.
	mac := run(aIP)
	if strings.HasPrefix(mac, "refused") {
		t.Logf("%s: a sandbox with CAP_NET_RAW gets no packet socket (%s): nothing to spoof with", class, mac)
		return
	}
	if len(mac) != 17 {
		t.Fatalf("the attack script printed %q, want the attacker's MAC", mac)
	}
	deadline := time.Now().Add(3 * time.Second)
	for !strings.Contains(neigh(aIP), mac) {
		if time.Now().After(deadline) {
			t.Fatalf("control: the host did not learn %s at %s from the sandbox's own ARP (%q)", aIP, mac, neigh(aIP))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The attack: claim the victim's address.
	run(vIP)
	time.Sleep(500 * time.Millisecond)
	if n := neigh(vIP); strings.Contains(n, mac) {
		t.Fatalf("the host's neighbour entry for the victim %s is the attacker's MAC %s: %q", vIP, mac, n)
	}
}
