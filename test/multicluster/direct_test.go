package multicluster

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestDirectDataPlaneOnRegisteredRunner: a runner registered with the control plane gets
// its data-plane certificate there, and the official client in DIRECT mode runs exec and
// files on it without the gateway; a runner without a data plane is reached through the
// gateway in AUTO mode.
func TestDirectDataPlaneOnRegisteredRunner(t *testing.T) {
	needOfficialClient(t)
	b := startBed(t)
	script := `
from cwsandbox import Sandbox
sb = Sandbox.run("sleep", "600", container_image="busybox", runner_ids=["open"], data_plane_mode="direct")
sb.wait()
print("exec:", sb.exec(["echo", "direct"]).result(timeout=30).stdout.strip())
sb.write_file("/tmp/f", b"via the data plane").result(timeout=30)
print("file:", sb.read_file("/tmp/f").result(timeout=30).decode())
print("id:", sb.sandbox_id)
sb.stop().result(timeout=60)
other = Sandbox.run("sleep", "600", container_image="busybox", runner_ids=["small"], resources={"cpu": "100m", "memory": "64Mi"})
other.wait()
print("auto:", other.exec(["echo", "gateway"]).result(timeout=30).stdout.strip())
other.stop().result(timeout=60)
`
	cmd := exec.Command("python3", "-c", script)
	cmd.Env = append(os.Environ(), "CWSANDBOX_BASE_URL="+b.GatewayURL(1), "CWSANDBOX_API_KEY="+b.UserKey)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("official client: %v\n%s", err, out)
	}
	s := string(out)
	for _, want := range []string{"exec: direct", "file: via the data plane", "auto: gateway"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	id := ""
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(line, "id: "); ok {
			id = strings.TrimSpace(v)
		}
	}
	log, _ := os.ReadFile(b.Runners[1].Log())
	if id == "" || !strings.Contains(string(log), "direct data-plane client connected") || !strings.Contains(string(log), id) {
		t.Errorf("runner open's log shows no direct client of sandbox %q", id)
	}
}
