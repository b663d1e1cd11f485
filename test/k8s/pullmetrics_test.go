package k8s

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/metrics"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestPullMetrics: on the real cluster, read by scraping the runner's metrics handler
// over HTTP (docs/observability.md, The Kubernetes backend): a sandbox whose image the
// kubelet pulls from a registry (served by this test on the node's loopback, plain HTTP:
// containerd speaks HTTP to 127.0.0.1) records a miss with the kubelet's duration and the
// image size it reports; a sandbox whose image that registry does not have records a
// failed pull (ErrImagePull) with a duration from the kubelet's Pulling and Failed events
// (the registry answers for it after 2 s);
// the running sandbox reports a memory peak from its node's cAdvisor: the 40 MB it wrote to
// a file and removed, above what it holds now.
func TestPullMetrics(t *testing.T) {
	c := needCluster(t)
	busyboxTar := filepath.Join(testimage.Dir(), "busybox.tar")
	if _, err := os.Stat(busyboxTar); errors.Is(err, os.ErrNotExist) {
		t.Skip(testimage.ErrNoTestImages)
	}
	// The registry answers for the absent image after 2 s: the failed pull takes long
	// enough for the kubelet's second-resolution events to show it.
	mem := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/absent/") {
			select {
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
			}
		}
		mem.ServeHTTP(w, r)
	}))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	img, err := testimage.Build(busyboxTar, image.Config{Cmd: []string{"/bin/sh"}, Env: []string{testimage.DefaultPath}})
	if err != nil {
		t.Fatal(err)
	}
	repo := host + "/" + randomID("pull-")
	good, missing := repo+"/busybox:1", repo+"/absent:1"
	ref, err := name.ParseReference(good, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}

	runnerID := randomID("test-")
	sctx, scancel := context.WithTimeout(t.Context(), time.Minute)
	defer scancel()
	s, err := stack.NewKubernetes(sctx, stack.KubernetesConfig{Kubeconfig: c.kubeconfig, DataDir: t.TempDir(),
		Backend: &kubernetes.Config{Namespace: c.namespace, RunnerID: runnerID, AgentImage: c.agentImage,
			ImagePullPolicy: corev1.PullIfNotPresent, TerminationGrace: 5 * time.Second,
			ImageConfig: func(context.Context, string, *runtime.Credentials) (image.Config, error) {
				return image.Config{Cmd: []string{"/bin/sh"}, Env: []string{testimage.DefaultPath}}, nil
			}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); deleteRunnerObjects(s.Client, c.namespace, runnerID) })
	r := s.Runner

	// The runner's metrics, as `sandboxd runner --metrics-listen` serves them.
	m := metrics.New()
	m.RegisterSandboxUsage(func(limit int) []metrics.SandboxUsage {
		var out []metrics.SandboxUsage
		for _, x := range r.Usages(limit) {
			out = append(out, metrics.SandboxUsage{ID: x.ID, Org: x.Org, CPUUsec: x.CPUUsec, MemoryBytes: x.MemoryBytes, MemoryPeakBytes: x.MemoryPeakBytes})
		}
		return out
	})
	ms := httptest.NewServer(m.Handler())
	t.Cleanup(ms.Close)
	scrape := func() (map[string]float64, string) {
		t.Helper()
		resp, err := http.Get(ms.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("scrape: %d %v", resp.StatusCode, err)
		}
		out := map[string]float64{}
		for _, l := range strings.Split(string(body), "\n") {
			if i := strings.LastIndexByte(l, ' '); i > 0 && !strings.HasPrefix(l, "#") {
				if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
					out[l[:i]] = v
				}
			}
		}
		return out, string(body)
	}
	const (
		okMiss   = `cwsandbox_image_pulls_total{cache="miss",result="ok"}`
		durOK    = `cwsandbox_image_pull_duration_seconds_count{cache="miss",result="ok"}`
		size     = `cwsandbox_kubelet_reported_image_size_bytes_total`
		errMiss  = `cwsandbox_image_pulls_total{cache="miss",result="error"}`
		failures = `cwsandbox_image_pull_failures_total{reason="ErrImagePull"}`
		durErr   = `cwsandbox_image_pull_duration_seconds_count{cache="miss",result="error"}`
		durErrS  = `cwsandbox_image_pull_duration_seconds_sum{cache="miss",result="error"}`
	)
	before, _ := scrape()

	sb, err := r.Create(t.Context(), runner.CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Image: good, Command: "sh", Args: []string{"-c", "head -c 40000000 /dev/zero >/tmp/f && sync && rm /tmp/f; exec sleep 3600"},
			Resources: runtime.Resources{MilliCPU: 500, MemoryBytes: 128 << 20}},
		Meta: map[string]string{runtime.MetaOrg: "org-pull"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitState(t, r, sb.ID, 2*time.Minute, running); got.State != runner.StateRunning {
		t.Fatalf("state %s (%s: %s), want RUNNING", got.State, got.Reason, got.Message)
	}
	bad, err := r.Create(t.Context(), runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: missing, Command: "true"}}})
	if err != nil {
		t.Fatal(err)
	}
	bsb := terminal(t, r, bad.ID)
	t.Logf("missing image: %s %s: %.200s", bsb.State, bsb.Reason, bsb.Message)

	grew := func(now map[string]float64, k string) float64 { return now[k] - before[k] }
	var now map[string]float64
	var text string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		now, text = scrape()
		if grew(now, okMiss) >= 1 && grew(now, durOK) >= 1 && grew(now, durErr) >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pulls not recorded within 30 s:\n%s", grepLines(text, "cwsandbox_image_pull", "cwsandbox_kubelet"))
		}
	}
	t.Logf("scrape:\n%s", grepLines(text, "cwsandbox_image_pulls_total", "cwsandbox_image_pull_failures_total", "_count{", "_sum{", "cwsandbox_kubelet"))
	if g := grew(now, size); g < 1<<20 || g > 64<<20 {
		t.Errorf("reported image size grew by %v, want busybox's (1 to 64 MiB)", g)
	}
	if g := grew(now, errMiss); g != 1 {
		t.Errorf("failed pulls grew by %v, want 1", g)
	}
	if g := grew(now, failures); g != 1 {
		t.Errorf("ErrImagePull failures grew by %v, want 1", g)
	}
	if d := grew(now, durErrS); d < 1 || d > 60 {
		t.Errorf("the failed pull took %v s by the kubelet's events, want 1 to 60 (the registry answered after 2 s)", d)
	}
	if g := grew(now, `cwsandbox_image_pull_bytes_total`); g != 0 {
		t.Errorf("image_pull_bytes_total grew by %v: the kubelet does not say what it fetched", g)
	}

	// The memory peak: the kubelet's cAdvisor (its housekeeping samples every ~10 s, so a
	// first sample may predate the write: wait for one that follows it).
	var u *runner.Usage
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(2 * time.Second) {
		got, err := r.Get(sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if u = got.Usage; u != nil && u.MemoryPeakBytes >= 30<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no memory peak of the write within 90 s: %+v", u)
		}
	}
	t.Logf("usage: %d bytes, peak %d bytes", u.MemoryBytes, u.MemoryPeakBytes)
	// The sandbox wrote 40 MB to a file (page cache, charged to its cgroup) and removed it:
	// its peak is that, well above what it holds now.
	if u.MemoryPeakBytes < 30<<20 || u.MemoryPeakBytes <= u.MemoryBytes || u.MemoryPeakBytes > 128<<20 {
		t.Errorf("peak %d: want at least 30 MiB (the file written), above the usage %d and within the 128 MiB limit", u.MemoryPeakBytes, u.MemoryBytes)
	}
	now, text = scrape()
	if v := now[`cwsandbox_sandbox_memory_peak_bytes{organization="org-pull",sandbox_id="`+sb.ID+`"}`]; v <= 0 {
		t.Errorf("no memory peak series of %s:\n%s", sb.ID, grepLines(text, "cwsandbox_sandbox_memory"))
	}
}

// grepLines is the lines of s holding any of subs.
func grepLines(s string, subs ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, sub := range subs {
			if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
