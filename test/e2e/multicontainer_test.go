package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// TestSbxMultiContainer drives a two-container sandbox and a Compose sandbox through sbx
// and the Go SDK on the local backend: exec, files and logs per container, get's
// container rows, an unknown container refused by name. It needs the server side of
// issue 19 (wire, gateway, runner, local backend, compose).
func TestSbxMultiContainer(t *testing.T) {
	g := startGateway(t)
	img := busybox()
	out, errs, code := sbx(g, "", "run", "--tag", "multi",
		"--container", "name=app,image="+img+",command=sleep,arg=600",
		"--container", "name=side,image="+img+",command=sh,arg=-c,arg=echo side-up; exec sleep 600")
	id := strings.TrimSpace(out)
	if code != 0 || id == "" {
		t.Fatalf("run --container: %d %q %q", code, out, errs)
	}
	defer sbx(g, "", "delete", id)

	// exec goes to the primary by default, to -c's container otherwise; they are
	// separate root filesystems.
	if _, errs, code := sbx(g, "", "exec", id, "--", "touch", "/tmp/in-app"); code != 0 {
		t.Fatalf("exec in app: %d %q", code, errs)
	}
	if _, _, code := sbx(g, "", "exec", "-c", "side", id, "--", "test", "-e", "/tmp/in-app"); code != 1 {
		t.Errorf("side sees app's /tmp: exit %d", code)
	}
	if _, errs, code := sbx(g, "data", "files", "write", "-c", "side", id, "/tmp/f"); code != 0 {
		t.Fatalf("files write -c side: %d %q", code, errs)
	}
	if out, errs, code := sbx(g, "", "files", "read", "-c", "side", id, "/tmp/f"); code != 0 || out != "data" {
		t.Errorf("files read -c side: %d %q %q", code, out, errs)
	}
	if _, errs, code := sbx(g, "", "files", "read", id, "/tmp/f"); code == 0 || !strings.Contains(errs, "CWSANDBOX_FILE_NOT_FOUND") {
		t.Errorf("the primary has side's file: %d %q", code, errs)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _, _ := sbx(g, "", "logs", "-c", "side", id)
		if strings.Contains(out, "side-up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("logs -c side: %q", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, errs, code := sbx(g, "", "exec", "-c", "nosuch", id, "--", "true"); code == 0 || !strings.Contains(errs, "nosuch") {
		t.Errorf("exec -c nosuch: %d %q", code, errs)
	}
	// Container statuses are the runner's last look (at most a second old): poll.
	rows := []*regexp.Regexp{regexp.MustCompile(`(?m)^app\s+yes\s+\S+\s+running\s+-\s+0$`), regexp.MustCompile(`(?m)^side\s+\S+\s+running\s+-\s+0$`)}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, errs, code = sbx(g, "", "get", id)
		if code == 0 && rows[0].MatchString(out) && rows[1].MatchString(out) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("get: want both containers running, got %q (%q)", out, errs)
		}
	}

	// The SDK's view of the same sandbox.
	c := sdkClient(t, g, g.keyA)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := c.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if in := sb.Info(); len(in.Containers) != 2 || in.Containers[1].Name != "side" || in.Containers[1].State != sandbox.StateRunning {
		t.Errorf("SDK containers %+v", in.Containers)
	}
	if res, err := sb.InContainer("side").ExecUnary(ctx, []string{"cat", "/tmp/f"}, sandbox.UnaryExecOptions{}); err != nil || string(res.Stdout) != "data" {
		t.Errorf("unary exec in side: %+v %v", res, err)
	}

	// Compose: two services, the primary named.
	file := filepath.Join(t.TempDir(), "compose.yaml")
	compose := "services:\n  app:\n    image: " + img + "\n    command: [\"sleep\", \"600\"]\n    depends_on: [db]\n" +
		"  db:\n    image: " + img + "\n    command: [\"sleep\", \"600\"]\n"
	if err := os.WriteFile(file, []byte(compose), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errs, code = sbx(g, "", "compose", "up", "-f", file, "--primary", "app", "-o", "json")
	var got struct {
		SandboxID string `json:"sandboxId"`
		Status    struct {
			ContainerStatuses []struct{ Name string } `json:"containerStatuses"`
		} `json:"status"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.SandboxID == "" {
		t.Fatalf("compose up: %d %q %q", code, out, errs)
	}
	defer sbx(g, "", "delete", got.SandboxID)
	if out, errs, code := sbx(g, "", "exec", "-c", "db", got.SandboxID, "--", "grep", "-w", "app", "/etc/hosts"); code != 0 {
		t.Errorf("db does not resolve app: %d %q %q", code, out, errs)
	}
}
