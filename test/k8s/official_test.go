package k8s

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// TestOfficialClient drives a Kubernetes runner through the gateway with the official
// Python client: create, wait, exec, streaming exec with stdin, files, logs, a PTY shell
// (terminal size, exit code), delete.
func TestOfficialClient(t *testing.T) {
	if _, err := osexec.Command("python3", "-c", "import cwsandbox").CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the official client (pip install cwsandbox) is required in CI: %v", err)
		}
		t.Skip("the official client is not installed (pip install cwsandbox)")
	}
	_, s, runnerID := setup(t)
	url, _, key := serveGateway(t, gateway.Config{Runners: []runner.Handle{runner.NewLocal(runnerID, s.Runner)}})

	script := `
import json, sys
from cwsandbox import Sandbox
out = {}
sb = Sandbox.run("sh", "-c", "echo logline; exec sleep 600", container_image=sys.argv[1])
sb.wait(timeout=120)
out["runner"] = sb.runner_id
r = sb.exec(["sh", "-c", "echo out; echo err >&2; exit 3"]).result(timeout=60)
out["exec"] = [r.returncode, r.stdout, r.stderr]
p = sb.exec(["cat"], stdin=True)
p.stdin.write(b"piped\n").result(timeout=30)
p.stdin.close().result(timeout=30)
out["stdin"] = p.result(timeout=60).stdout
sb.write_file("/tmp/f.txt", b"on a pod").result(timeout=60)
out["file"] = sb.read_file("/tmp/f.txt").result(timeout=60).decode()
out["logs"] = "".join(sb.stream_logs(timeout_seconds=20))
t = sb.shell(["/bin/sh"], width=100, height=30)
t.stdin.write(b"stty size; tty; exit 7\n").result(timeout=30)
raw = b"".join(t.output)
out["pty"] = [t.wait(), raw.decode(errors="replace")]
sb.stop().result(timeout=120)
print(json.dumps(out))
`
	cmd := osexec.Command("python3", "-c", script, busybox)
	cmd.Env = append(os.Environ(), "CWSANDBOX_BASE_URL="+url, "CWSANDBOX_API_KEY="+key)
	stdout, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*osexec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("official client: %v\n%s\n%s", err, stdout, stderr)
	}
	lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
	var got struct {
		Runner string `json:"runner"`
		Exec   []any  `json:"exec"`
		Stdin  string `json:"stdin"`
		File   string `json:"file"`
		Logs   string `json:"logs"`
		PTY    []any  `json:"pty"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if got.Runner != runnerID || len(got.Exec) != 3 || got.Exec[0] != float64(3) || got.Exec[1] != "out\n" || got.Exec[2] != "err\n" ||
		got.Stdin != "piped\n" || got.File != "on a pod" || !strings.Contains(got.Logs, "logline") {
		t.Errorf("official client saw %+v", got)
	}
	// PTY: a shell on a terminal of the asked size, its exit code.
	if len(got.PTY) != 2 || got.PTY[0] != float64(7) || !strings.Contains(fmt.Sprint(got.PTY[1]), "30 100") || !strings.Contains(fmt.Sprint(got.PTY[1]), "/dev/pts/") {
		t.Errorf("official client's shell (PTY) saw %q", got.PTY)
	}
}
