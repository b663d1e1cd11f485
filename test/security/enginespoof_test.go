package security

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestEngineSandboxCannotSpoofAnotherOnTheBridge: a container-engine sandbox is the one
// kind of sandbox that can send raw frames (runsc --net-raw, every capability inside
// gVisor: a container of its engine with the host's network gets a packet socket). From
// there a tenant sends gratuitous ARP claiming another organization's sandbox's address;
// had the host taken it, its neighbour entry for the victim would point at the attacker.
// The bridge port is pinned to the engine sandbox's own MAC and address
// (network/antispoof.go), so the host must keep the victim's entry; the control (the
// same frames claiming the attacker's own address) must reach the host, so the test
// fails if no frame got out at all.
func TestEngineSandboxCannotSpoofAnotherOnTheBridge(t *testing.T) {
	d := needDev(t)
	if local.FindRunsc() == "" {
		t.Skip("runsc not built: no engine sandboxes")
	}
	if _, err := testimage.EngineTar(); errors.Is(err, testimage.ErrNoTestImages) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ca := d.sandboxes(d.KeyA)
	res, err := ca.CreateSandboxFromFile(ctx, connect.NewRequest(&sandboxv1.CreateSandboxFromFileRequest{
		Type: sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_COMPOSE, Control: sandboxv1.Control_CONTROL_CONTAINER_ENGINE,
		Contents: []byte("services:\n  idle:\n    image: python:3.11\n    command: [\"sleep\", \"600\"]\n"),
	}))
	if err != nil {
		t.Fatalf("create the engine sandbox: %v", err)
	}
	attacker := res.Msg.GetSandboxId()
	t.Cleanup(func() {
		_, _ = ca.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: attacker}))
	})
	for {
		st, err := ca.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: attacker}))
		if err != nil {
			t.Fatal(err)
		}
		if s := st.Msg.GetStatus().GetState(); s == sandboxv1.State_STATE_RUNNING {
			break
		} else if s == sandboxv1.State_STATE_FAILED || s == sandboxv1.State_STATE_TERMINATED || ctx.Err() != nil {
			t.Fatalf("engine sandbox %s: %v", attacker, st.Msg.GetStatus())
		}
		time.Sleep(200 * time.Millisecond)
	}
	victim := runningSandbox(t, d.sandboxes(d.KeyB), "", nil)

	sh := func(c interface {
		Exec(context.Context, *connect.Request[sandboxv1.ExecRequest]) (*connect.Response[sandboxv1.ExecResponse], error)
	}, id, script string) string {
		t.Helper()
		r, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"sh", "-c", script}}))
		if err != nil || r.Msg.GetExitCode() != 0 {
			t.Fatalf("exec %q in %s: %v %s%s", script, id, err, r.Msg.GetStdout(), r.Msg.GetStderr())
		}
		return strings.TrimSpace(string(r.Msg.GetStdout()))
	}
	const addr = `ip -o -4 addr show eth0 | awk '{print $4}' | cut -d/ -f1`
	aIP, mac := sh(ca, attacker, addr), sh(ca, attacker, `ip -o link show eth0 | awk '{for (i = 1; i < NF; i++) if ($i == "link/ether") print $(i+1)}'`)
	gw := sh(ca, attacker, `ip route | awk '$1 == "default" {print $3}'`)
	vIP := sh(d.sandboxes(d.KeyB), victim, addr)
	if aIP == "" || vIP == "" || gw == "" || len(mac) != 17 {
		t.Fatalf("addresses: attacker %q (%q), victim %q, gateway %q", aIP, mac, vIP, gw)
	}
	var unsent string // gVisor refused to send the frames
	arping := func(claim string) {
		// A container of the engine on the sandbox's own network stack (gVisor's, with
		// raw sockets) asks for the gateway from the sandbox's MAC, claiming address
		// claim (spoofARP: a raw packet socket).
		script := "cat > /tmp/arp.py <<'EOF'\n" + engineSpoofARP + "EOF\n" +
			"docker run --rm --network host -v /tmp/arp.py:/arp.py:ro python:3.11 python3 /arp.py " + claim + " " + gw + " 2>&1"
		out := sh(ca, attacker, script)
		t.Logf("ARP claiming %s: %s", claim, out)
		if strings.HasPrefix(out, "refused") {
			t.Fatalf("the engine's container got no packet socket (%s): the test cannot show the pinning", out)
		}
		if strings.HasPrefix(out, "unsent") {
			unsent = out
		}
	}
	neigh := func(ip string) string {
		out, _ := exec.Command("ip", "neigh", "show", "to", ip).CombinedOutput()
		return string(out)
	}
	// Control: the attacker's ARP for its own address reaches the host. (The host may
	// already know it from ordinary traffic: flush it first.)
	_ = exec.Command("ip", "neigh", "flush", "to", aIP).Run()
	arping(aIP)
	if unsent != "" {
		// Today's gVisor gives the packet socket but does not send on it: nothing
		// reaches the bridge. Check the host learnt nothing, and say so.
		if n := neigh(aIP); strings.Contains(n, mac) {
			t.Fatalf("gVisor said it sent nothing (%s), yet the host learnt %s at %s", unsent, aIP, mac)
		}
		t.Logf("an engine sandbox's packet socket sends no frames under this gVisor (%s): nothing to spoof with; the pinned port (TestAntiSpoof) is the defence once it does", unsent)
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(neigh(aIP), mac) {
		if time.Now().After(deadline) {
			t.Fatalf("control: the host did not learn %s at %s from the engine sandbox's own ARP (%q)", aIP, mac, neigh(aIP))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The attack: claim the victim's address.
	arping(vIP)
	time.Sleep(500 * time.Millisecond)
	if n := neigh(vIP); strings.Contains(n, mac) {
		t.Fatalf("the host's neighbour entry for the victim %s is the engine sandbox's MAC %s: %q", vIP, mac, n)
	}
}

// engineSpoofARP is spoofARP for a container of an engine sandbox: sendto with the
// interface, and "unsent ERRNO" when the packet socket exists but sends nothing.
const engineSpoofARP = `
import socket, struct, sys
claim, gw = sys.argv[1], sys.argv[2]
try:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
except OSError as e:
    print('refused', e.errno)
    sys.exit(0)
s.bind(('eth0', 0x0806))
mac = s.getsockname()[4]
arp = struct.pack('!HHBBH6s4s6s4s', 1, 0x0800, 6, 4, 1, mac, socket.inet_aton(claim), b'\0' * 6, socket.inet_aton(gw))
frame = b'\xff' * 6 + mac + b'\x08\x06' + arp
try:
    for _ in range(3):
        s.sendto(frame, ('eth0', 0x0806))
except OSError as e:
    print('unsent', e.errno)
    sys.exit(0)
print(mac.hex(':'))
`
