package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/metrics/promtest"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

// TestMetricsScrapedByPrometheus starts `sandboxd dev` with a metrics listener, creates
// a sandbox and runs an exec, checks the scrape with `promtool check metrics`, and has a
// real Prometheus server (scripts/build-prometheus.sh) scrape the listener: it finds the
// sandbox's cwsandbox_sandbox_info series with its placement, the create and the exec,
// and the series goes once the sandbox is deleted. The API port serves no /metrics.
func TestMetricsScrapedByPrometheus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sandboxd dev and Prometheus")
	}
	testenv.RequireRoot(t, "sandboxd dev runs containers")
	withProm := promtest.Have()
	if !withProm {
		t.Log("promtool and Prometheus are not built (make prometheus): checking the scrape directly only")
	}
	dir := t.TempDir()
	bin, data := filepath.Join(dir, "bin"), filepath.Join(dir, "data")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(bin, "sandboxd"), "github.com/sandboxd/sandboxd/cmd/sandboxd")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build sandboxd: %v\n%s", err, out)
	}
	if _, err := testenv.Agent(bin); err != nil {
		t.Fatal(err)
	}
	free := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	api, metricsAddr := free(), free()
	pid := os.Getpid()
	logPath := filepath.Join(dir, "sandboxd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	bridge, cgroupParent := fmt.Sprintf("sbxmet%04x", pid&0xffff), fmt.Sprintf("sandboxd-metrics-%d", pid)
	subnet := netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 100+pid%50, pid/50%256))
	cmd := exec.Command(filepath.Join(bin, "sandboxd"), "dev", "--data-dir", data, "--listen", api,
		"--metrics-listen", metricsAddr, "--edge-listen", "", "--data-plane-listen", "", "--warm-pool", "0",
		"--bridge", bridge, "--subnet", subnet.String(), "--cgroup-parent", cgroupParent)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		stacktest.ForceClean(data)
		// The server's bridge, nftables table and cgroup parent (kept for a next start).
		if m, err := network.New(network.Config{Bridge: bridge, Subnet: subnet, Table: "sandboxd_" + bridge,
			StateDir: filepath.Join(data, "network")}); err == nil {
			if err := m.Cleanup(); err != nil {
				t.Logf("network cleanup: %v", err)
			}
		}
		parents, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupParent)
		for _, p := range parents {
			_ = os.Remove(p) // rmdir: fails if a sandbox's cgroup is still inside
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("sandboxd dev log (tail):\n%s", b[max(0, len(b)-4000):])
		}
	})
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get("http://" + api + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("sandboxd dev not ready after 90 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	key, err := os.ReadFile(filepath.Join(data, "admin-api-key"))
	if err != nil {
		t.Fatal(err)
	}
	c := sandboxv1connect.NewSandboxServiceClient(&http.Client{}, "http://"+api, connect.WithInterceptors(connecttest.Bearer(strings.TrimSpace(string(key)))))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	spec := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", Command: "sleep", Args: []string{"600"}}}}
	res, err := c.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec}}))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	id := res.Msg.GetSandboxId()
	for {
		st, err := c.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		if st.Msg.GetStatus().GetState() == sandboxv1.State_STATE_RUNNING {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("sandbox %s not running: %v", id, st.Msg.GetStatus())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"true"}})); err != nil {
		t.Fatalf("exec: %v", err)
	}

	// /livez and /readyz on the metrics listener and on the API port (sandboxd dev).
	for _, u := range []string{"http://" + metricsAddr + "/livez", "http://" + metricsAddr + "/readyz", "http://" + api + "/livez", "http://" + api + "/readyz"} {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(b) != "ok\n" {
			t.Errorf("%s: %d %q", u, resp.StatusCode, b)
		}
	}
	// The runner's health series: healthy after a successful create.
	if scrape := scrapeOnce(t, metricsAddr); !strings.Contains(scrape, `cwsandbox_runner_health{runner_id="local",state="healthy"} 1`) {
		t.Errorf("scrape lacks the runner's health series")
	}
	// The API port has no /metrics.
	if resp, err := http.Get("http://" + api + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("GET /metrics on the API port: %d, want none", resp.StatusCode)
		}
	}
	// The runtime class is the resolved spec's (the runner's default, runc, here).
	info := fmt.Sprintf(`cwsandbox_sandbox_info{organization="default",runner_id="local",runtime_class="runc",sandbox_id=%q,state="RUNNING"} 1`, id)
	scrape := awaitScrape(t, metricsAddr, func(s string) bool { return strings.Contains(s, info) })
	for _, want := range []string{`cwsandbox_sandbox_creates_total{reason="",result="ok"} 1`, `cwsandbox_sandbox_time_to_running_seconds_count 1`,
		`cwsandbox_exec_duration_seconds_count{path="gateway",result="ok"} 1`, `cwsandbox_sandbox_create_to_first_exec_seconds_count 1`,
		`cwsandbox_runner_heartbeat_age_seconds{organization="default",runner_id="local"}`,
		`cwsandbox_sandboxes{organization="default",state="RUNNING"} 1`, "go_goroutines", "process_cpu_seconds_total"} {
		if !strings.Contains(scrape, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	// Runner-side series: the image pull (fresh data dir: a miss that fetched bytes), the
	// one placement, and the running sandbox's cgroup usage.
	vals := parseScrape(scrape)
	if vals[`cwsandbox_image_pulls_total{cache="miss",result="ok"}`] < 1 || vals["cwsandbox_image_pull_bytes_total"] <= 0 ||
		vals[`cwsandbox_image_pull_duration_seconds_count{cache="miss",result="ok"}`] < 1 {
		t.Errorf("image pull series: %s", grepScrape(scrape, "cwsandbox_image_pull"))
	}
	if vals[`cwsandbox_placement_decisions_total{result="ok"}`] != 1 {
		t.Errorf("placement decisions: %s", grepScrape(scrape, "cwsandbox_placement"))
	}
	usage := fmt.Sprintf(`{organization="default",sandbox_id=%q}`, id)
	if _, ok := vals["cwsandbox_sandbox_cpu_usage_seconds_total"+usage]; !ok || vals["cwsandbox_sandbox_memory_bytes"+usage] <= 0 {
		t.Errorf("sandbox usage series: %s", grepScrape(scrape, "cwsandbox_sandbox_"))
	}
	if !withProm {
		deleteAndAwaitGone(t, ctx, c, id, func() bool {
			return !strings.Contains(scrapeOnce(t, metricsAddr), id)
		})
		return
	}
	// A scrape of the listener passes promtool.
	if out := promtest.CheckMetrics(t, []byte(scrape)); out != "" {
		t.Errorf("promtool check metrics:\n%s", out)
	}

	// A real Prometheus sees the sandbox, the create and the exec.
	prom := promtest.Start(t, metricsAddr, time.Second)
	prom.Await(t, "cwsandbox_sandbox_info", map[string]string{"sandbox_id": id, "organization": "default", "runner_id": "local", "state": "RUNNING"}, 60*time.Second)
	prom.Await(t, "cwsandbox_sandbox_creates_total", map[string]string{"result": "ok"}, 30*time.Second)
	prom.Await(t, "cwsandbox_sandboxes", map[string]string{"organization": "default", "state": "RUNNING"}, 30*time.Second)
	prom.Await(t, `sum by (path) (cwsandbox_exec_duration_seconds_count) > 0`, map[string]string{"path": "gateway"}, 30*time.Second)
	prom.Await(t, "cwsandbox_sandbox_time_to_running_seconds_count > 0", nil, 30*time.Second)
	prom.Await(t, "cwsandbox_runner_heartbeat_age_seconds", map[string]string{"runner_id": "local"}, 30*time.Second)
	prom.Await(t, "go_goroutines", nil, 30*time.Second)
	prom.Await(t, "cwsandbox_sandbox_memory_bytes > 0", map[string]string{"sandbox_id": id, "organization": "default"}, 30*time.Second)
	prom.Await(t, "cwsandbox_placement_decisions_total > 0", map[string]string{"result": "ok"}, 30*time.Second)

	// Deleted, the sandbox drops out (its series goes stale at the next scrape).
	deleteAndAwaitGone(t, ctx, c, id, func() bool {
		s, err := prom.Query(ctx, fmt.Sprintf("cwsandbox_sandbox_info{sandbox_id=%q}", id))
		return err == nil && len(s) == 0
	})
	prom.Await(t, "cwsandbox_sandbox_deletes_total", map[string]string{"result": "ok"}, 30*time.Second)
}

// deleteAndAwaitGone deletes sandbox id and waits up to a minute for gone.
func deleteAndAwaitGone(t *testing.T, ctx context.Context, c sandboxv1connect.SandboxServiceClient, id string, gone func() bool) {
	t.Helper()
	if _, err := c.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
		t.Fatalf("delete: %v", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for !gone() {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox_info of the deleted sandbox %s still there after 60 s", id)
		}
		time.Sleep(time.Second)
	}
}

func scrapeOnce(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// awaitScrape scrapes addr until ok holds (up to 30 s) and returns that scrape.
func awaitScrape(t *testing.T, addr string, ok func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := scrapeOnce(t, addr)
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("scrape of %s never matched; last:\n%s", addr, s)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// parseScrape maps each sample line of a text-format scrape ("name{labels}" as printed)
// to its value.
func parseScrape(s string) map[string]float64 {
	out := map[string]float64{}
	for _, l := range strings.Split(s, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
			out[l[:i]] = v
		}
	}
	return out
}

// grepScrape is the lines of s containing sub.
func grepScrape(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
