package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// volumeBenchMiB is how much each sequential pass writes and reads.
const volumeBenchMiB = 256

// BenchmarkVolumeThroughput: sequential write (dd conv=fsync) and read (iflag=direct,
// else cached) of 256 MiB in 1 MiB blocks inside a sandbox on a registered volume (the
// local backend's managed ext4 image, loop-mounted, bind-mounted into the sandbox), and
// the same with the host's dd on the filesystem the image lives on; reported in MiB/s
// and as volume/host ratios (issue 23 target: >= 0.8).
func BenchmarkVolumeThroughput(b *testing.B) {
	s := newStack(b, 0)
	ctx := context.Background()
	v := runner.RegisteredVolume{Org: "bench", ClaimName: "bench", Namespace: runner.VolumeNamespace}
	if _, err := s.Runner.EnsureVolume(ctx, v); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Runner.DeleteVolume(context.Background(), v, true) })
	spec := sleeper()
	spec.Volumes = []runtime.Volume{{Name: "v", Managed: v.ManagedName()}}
	spec.VolumeMounts = []runtime.VolumeMount{{Volume: "v", Path: "/data"}}
	sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: spec})
	if err != nil {
		b.Fatal(err)
	}
	c, err := s.Runner.Agent(ctx, sb.ID, "")
	if err != nil {
		b.Fatal(err)
	}
	inSandbox := func(script string) string {
		res, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"sh", "-c", script}}))
		if err != nil {
			b.Fatal(err)
		}
		out := string(res.Msg.GetStdout()) + string(res.Msg.GetStderr())
		if res.Msg.GetExitCode() != 0 {
			b.Fatalf("%s: exit %d: %s", script, res.Msg.GetExitCode(), out)
		}
		return out
	}
	hostDir := b.TempDir() // on the filesystem of the runner's state dir, where the image lives
	onHost := func(script string) string {
		out, err := exec.Command("sh", "-c", script).CombinedOutput()
		if err != nil {
			b.Fatalf("%s: %v: %s", script, err, out)
		}
		return string(out)
	}
	// Seconds of a dd run: as dd reports it ("copied, 1.23 s" / "copied, 1.23 seconds"),
	// else the wall clock around the call (an exec's few ms more).
	copied := regexp.MustCompile(`copied, ([0-9.]+) s`)
	timed := func(run func(string) string, cmd string) float64 {
		t0 := time.Now()
		out := run(cmd + " 2>&1")
		wall := time.Since(t0).Seconds()
		if m := copied.FindStringSubmatch(out); m != nil {
			if sec, err := strconv.ParseFloat(m[1], 64); err == nil && sec > 0 {
				return sec
			}
		}
		return wall
	}
	mibps := func(sec float64) float64 { return volumeBenchMiB / sec }
	direct := func(run func(string) string, file string) string {
		if strings.Contains(run(fmt.Sprintf("dd if=%s of=/dev/null bs=1M count=1 iflag=direct 2>&1 && echo DIRECT-OK || true", file)), "DIRECT-OK") {
			return " iflag=direct"
		}
		return ""
	}
	b.ResetTimer()
	var volW, volR, hostW, hostR float64
	var volDirect, hostDirect string
	for i := 0; i < b.N; i++ {
		vf, hf := "/data/bench.bin", filepath.Join(hostDir, "bench.bin")
		volW = mibps(timed(inSandbox, fmt.Sprintf("dd if=/dev/zero of=%s bs=1M count=%d conv=fsync", vf, volumeBenchMiB)))
		volDirect = direct(inSandbox, vf)
		volR = mibps(timed(inSandbox, fmt.Sprintf("dd if=%s of=/dev/null bs=1M%s", vf, volDirect)))
		hostW = mibps(timed(onHost, fmt.Sprintf("dd if=/dev/zero of=%s bs=1M count=%d conv=fsync", hf, volumeBenchMiB)))
		hostDirect = direct(onHost, hf)
		hostR = mibps(timed(onHost, fmt.Sprintf("dd if=%s of=/dev/null bs=1M%s", hf, hostDirect)))
		inSandbox("rm -f " + vf)
		_ = os.Remove(hf)
	}
	b.StopTimer()
	b.ReportMetric(volW, "vol-write-MiB/s")
	b.ReportMetric(volR, "vol-read-MiB/s")
	b.ReportMetric(hostW, "host-write-MiB/s")
	b.ReportMetric(hostR, "host-read-MiB/s")
	b.ReportMetric(volW/hostW, "write-ratio")
	b.ReportMetric(volR/hostR, "read-ratio")
	fs := regexp.MustCompile(`\s+`).Split(strings.TrimSpace(onHost("df -T "+hostDir+" | tail -1")), -1)
	fstype := "?"
	if len(fs) > 1 {
		fstype = fs[1]
	}
	fmt.Printf("volume throughput (%d MiB, 1 MiB blocks; host fs %s): write %.0f vs host %.0f MiB/s (%.2fx), read%s %.0f vs host%s %.0f MiB/s (%.2fx)\n",
		volumeBenchMiB, fstype, volW, hostW, volW/hostW, volDirect, volR, hostDirect, hostR, volR/hostR)
}
