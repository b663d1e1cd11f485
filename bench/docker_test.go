package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandboxd/sandboxd/internal/testimage"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// dockerImage is the busybox test image's name in the private Docker Engine.
const dockerImage = "sandboxd-bench/busybox:latest"

// BenchmarkDockerPeer: Docker Engine (Debian's docker.io, what a user would run on one
// host instead) beside sandboxd in the same run, on the same busybox test image running
// the same idle command, and the ratio sandboxd / Docker of each line (below 1: sandboxd
// is ahead):
//   - create → first command: `docker run -d --network none` + `docker exec ID true`
//     vs `sbx run` + `sbx exec ID -- true` (CLI to CLI), and Docker's HTTP API (create,
//     start, exec create, exec start, exec inspect over its unix socket) vs the Go SDK
//     (Create, ExecUnary) through a gateway on loopback;
//   - exec round trip on an idle container: `docker exec` vs `sbx exec`, and the same
//     at API level;
//   - idle memory per container, BENCH_PEER_IDLE (default 10) of each, with the same
//     accounting both sides (hostmem_test.go): the containers' cgroups + per-container
//     host processes (Docker's shims) + the daemons' PSS growth, and the MemAvailable drop.
//
// b.N runs of each latency line, the two sides taking turns. It starts its own dockerd
// and containerd (private sockets, data and state below a temporary directory, no
// iptables, no bridge, no IP forwarding changes, so sandboxd's networking on the same
// host is untouched) and stops them by PID. Without dockerd it skips, or fails when
// SANDBOXD_REQUIRE_DOCKER=1 (CI installs docker.io: scripts/install-deps.sh --test).
func BenchmarkDockerPeer(b *testing.B) {
	d := startDocker(b)
	d.load(b)
	s := newStack(b, 0)
	url, key := servedGateway(b, s)
	sdk, err := sandbox.New(url, key)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	sbx := buildSbx(b)
	sbxEnv := append(os.Environ(), "CWSANDBOX_BASE_URL="+url, "CWSANDBOX_API_KEY="+key)
	sp := sleeper()
	sbxArgs := []string{"run", sp.Image} // the platform's idle command (with CMD, sbx run would exec it)
	dockerArgs := append(append([]string{"run", "-d", "--network", "none"}, d.securityOpts()...), append([]string{dockerImage, sp.Command}, sp.Args...)...)

	// Warm both: image unpacked, page cache, the sbx binary.
	d.rmf(b, d.cli(b, dockerArgs...))
	id := runOut(b, sbxEnv, sbx, sbxArgs...)
	runOut(b, sbxEnv, sbx, "delete", id)
	cleanup(b, s)

	var dFirst, sFirst, dExec, sExec []time.Duration
	for range b.N {
		t0 := time.Now()
		did := d.cli(b, dockerArgs...)
		d.cli(b, "exec", did, "true")
		dFirst = append(dFirst, time.Since(t0))
		t0 = time.Now()
		d.cli(b, "exec", did, "true")
		dExec = append(dExec, time.Since(t0))
		d.rmf(b, did)

		t0 = time.Now()
		sid := runOut(b, sbxEnv, sbx, sbxArgs...)
		runOut(b, sbxEnv, sbx, "exec", sid, "--", "true")
		sFirst = append(sFirst, time.Since(t0))
		t0 = time.Now()
		runOut(b, sbxEnv, sbx, "exec", sid, "--", "true")
		sExec = append(sExec, time.Since(t0))
		runOut(b, sbxEnv, sbx, "delete", sid)
	}
	cleanup(b, s)
	peerLine(b, "create → first command, CLI (docker run -d + docker exec vs sbx run + sbx exec)", "cli-first", sFirst, dFirst)
	peerLine(b, "exec round trip, CLI (docker exec vs sbx exec)", "cli-exec", sExec, dExec)

	dFirst, sFirst, dExec, sExec = nil, nil, nil, nil
	for range b.N {
		t0 := time.Now()
		did := d.apiRun(b)
		d.apiExec(b, did)
		dFirst = append(dFirst, time.Since(t0))
		t0 = time.Now()
		d.apiExec(b, did)
		dExec = append(dExec, time.Since(t0))
		d.rmf(b, did)

		t0 = time.Now()
		sb, err := sdk.Create(ctx, sandbox.Spec{Image: sp.Image, Command: sp.Command, Args: sp.Args})
		if err != nil {
			b.Fatal(err)
		}
		sdkTrue(b, sb)
		sFirst = append(sFirst, time.Since(t0))
		t0 = time.Now()
		sdkTrue(b, sb)
		sExec = append(sExec, time.Since(t0))
		if err := sdk.Delete(ctx, sb.ID()); err != nil {
			b.Fatal(err)
		}
	}
	cleanup(b, s)
	peerLine(b, "create → first command, API (Docker HTTP API vs Go SDK)", "api-first", sFirst, dFirst)
	peerLine(b, "exec round trip, API (Docker HTTP API vs Go SDK)", "api-exec", sExec, dExec)

	// Idle memory, sandboxd first (no container of Docker's runs then), then Docker.
	k := envInt(b, "BENCH_PEER_IDLE", 10)
	avail0, pss0, cg0 := memAvailable(), selfPSS(), cgroupMemory(env.CgroupParent)
	for range k {
		sb, err := sdk.Create(ctx, sandbox.Spec{Image: sp.Image, Command: sp.Command, Args: sp.Args})
		if err != nil {
			b.Fatal(err)
		}
		sdkTrue(b, sb)
	}
	idleSettle()
	sAcct := (float64(cgroupMemory(env.CgroupParent)-cg0) + float64(selfPSS()-pss0)) / float64(k) / (1 << 20)
	sAvail := mib(avail0-memAvailable()) / float64(k)
	cleanup(b, s)

	avail0, daemons0, cg0 := memAvailable(), d.daemonsPSS(), cgroupMemory(d.cgroupParent)
	var dids []string
	for range k {
		id := d.apiRun(b)
		d.apiExec(b, id)
		dids = append(dids, id)
	}
	idleSettle()
	shims := d.shimsPSS()
	cg, daemons := cgroupMemory(d.cgroupParent)-cg0, d.daemonsPSS()-daemons0
	dAcct := float64(cg+shims+daemons) / float64(k) / (1 << 20)
	dAvail := mib(avail0-memAvailable()) / float64(k)
	for _, id := range dids {
		d.rmf(b, id)
	}
	fmt.Printf("docker peer: idle memory per container, %d idle: cgroups + host processes + daemons' growth: sandboxd %.2f MiB vs docker %.2f MiB (cgroups %.2f, shims %.2f, dockerd+containerd %.2f) = %.2fx; MemAvailable drop (noisy on a shared host): sandboxd %.2f vs docker %.2f MiB\n",
		k, sAcct, dAcct, mib(cg)/float64(k), mib(shims)/float64(k), mib(daemons)/float64(k), sAcct/dAcct, sAvail, dAvail)
	b.ReportMetric(sAcct/dAcct, "idle-mem-sandboxd/docker")
}

// peerLine prints and reports one comparison, sandboxd's p50 over Docker's.
func peerLine(b *testing.B, what, metric string, sbx, dock []time.Duration) {
	s50, s99 := quantiles(sbx)
	d50, d99 := quantiles(dock)
	fmt.Printf("docker peer: %s, %d runs: sandboxd p50 %.1f ms p99 %.1f ms vs docker p50 %.1f ms p99 %.1f ms = %.2fx at p50\n",
		what, len(sbx), s50, s99, d50, d99, s50/d50)
	b.ReportMetric(s50/d50, metric+"-sandboxd/docker")
}

func sdkTrue(b *testing.B, sb *sandbox.Sandbox) {
	b.Helper()
	res, err := sb.ExecUnary(context.Background(), []string{"true"}, sandbox.UnaryExecOptions{})
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("exec: %v (exit %d)", err, res.ExitCode)
	}
}

// buildSbx builds the sbx CLI for the run.
func buildSbx(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "sbx")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/sbx").CombinedOutput(); err != nil {
		b.Fatalf("build sbx: %v\n%s", err, out)
	}
	return bin
}

// runOut runs bin args with environ and returns its trimmed standard output.
func runOut(b *testing.B, environ []string, bin string, args ...string) string {
	b.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = environ
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// docker is a private Docker Engine: its own containerd and dockerd.
type docker struct {
	dir, sock, ctrdSock, cgroupParent string
	bin                               string // the docker CLI
	environ                           []string
	hc                                *http.Client
	dockerd, containerd               *exec.Cmd
	// securityOpt is what containers run with besides Docker's defaults: apparmor=unconfined
	// when the kernel has AppArmor but apparmor_parser is missing (docker.io installed
	// without its recommended apparmor package cannot load its docker-default profile,
	// and its containers would not start).
	securityOpt []string
}

func (d *docker) securityOpts() []string {
	var args []string
	for _, o := range d.securityOpt {
		args = append(args, "--security-opt", o)
	}
	return args
}

// startDocker starts containerd and dockerd below a fresh temporary directory, or skips
// (fails under SANDBOXD_REQUIRE_DOCKER=1) without them. Cleanup stops them.
func startDocker(b *testing.B) *docker {
	b.Helper()
	dockerd, err := exec.LookPath("dockerd")
	var ctrd, cli string
	if err == nil {
		ctrd, err = exec.LookPath("containerd")
	}
	if err == nil {
		// The CLI of the same package, not another docker earlier in PATH.
		if cli = filepath.Join(filepath.Dir(dockerd), "docker"); !isExecutable(cli) {
			cli, err = exec.LookPath("docker")
		}
	}
	if err != nil {
		if os.Getenv("SANDBOXD_REQUIRE_DOCKER") == "1" {
			b.Fatalf("Docker Engine peer: %v (apt install docker.io: scripts/install-deps.sh --test)", err)
		}
		b.Skipf("Docker Engine peer skipped: %v (apt install docker.io)", err)
	}
	dir, err := os.MkdirTemp("", "sbxdk-") // short: unix socket paths are bounded
	if err != nil {
		b.Fatal(err)
	}
	d := &docker{dir: dir, sock: filepath.Join(dir, "docker.sock"), ctrdSock: filepath.Join(dir, "ctrd", "containerd.sock"),
		cgroupParent: fmt.Sprintf("/sandboxd-bench-docker-%d", os.Getpid()), bin: cli}
	d.environ = append(os.Environ(), "DOCKER_HOST=unix://"+d.sock, "DOCKER_CONFIG="+filepath.Join(dir, "cli"))
	d.hc = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.sock)
	}}}
	b.Cleanup(func() { d.stop(b) })

	// Its own containerd: dockerd would otherwise use a system one at
	// /run/containerd/containerd.sock if one runs.
	ctrdCfg := filepath.Join(dir, "containerd.toml")
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = ""
[metrics]
  address = ""
`, filepath.Join(dir, "ctrd", "root"), filepath.Join(dir, "ctrd", "state"), d.ctrdSock, d.ctrdSock+".ttrpc")
	if err := os.WriteFile(ctrdCfg, []byte(cfg), 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), []byte("{}\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	d.containerd = d.daemon(b, ctrd, "containerd.log", "--config", ctrdCfg)
	if err := waitFor(func() bool { _, err := os.Stat(d.ctrdSock); return err == nil }); err != nil {
		b.Fatalf("containerd did not start: %v\n%s", err, d.log("containerd.log"))
	}
	d.dockerd = d.daemon(b, dockerd, "dockerd.log",
		"--config-file", filepath.Join(dir, "daemon.json"),
		"--data-root", filepath.Join(dir, "data"),
		"--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "docker.pid"),
		"-H", "unix://"+d.sock,
		"--containerd", d.ctrdSock,
		// Nothing of the host's network: no iptables (dockerd would set FORWARD's policy to
		// DROP, cutting sandboxd's sandboxes off), no docker0, no sysctls.
		"--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
		"--bridge=none", "--userland-proxy=false",
		"--exec-opt", "native.cgroupdriver=cgroupfs", "--cgroup-parent", d.cgroupParent,
		"--log-level", "warn")
	if err := waitFor(func() bool { return d.ping() == nil }); err != nil {
		b.Fatalf("dockerd did not answer: %v\n%s", err, d.log("dockerd.log"))
	}
	if on, _ := os.ReadFile("/sys/module/apparmor/parameters/enabled"); strings.TrimSpace(string(on)) == "Y" {
		if _, err := exec.LookPath("apparmor_parser"); err != nil {
			d.securityOpt = []string{"apparmor=unconfined"}
			fmt.Println("docker peer: AppArmor is on but apparmor_parser is missing (apt install apparmor): Docker's containers run unconfined")
		}
	}
	return d
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// daemon starts bin args in its own process group, its output in logName.
func (d *docker) daemon(b *testing.B, bin, logName string, args ...string) *exec.Cmd {
	b.Helper()
	f, err := os.Create(filepath.Join(d.dir, logName))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = d.environ
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return cmd
}

func (d *docker) log(name string) string {
	data, _ := os.ReadFile(filepath.Join(d.dir, name))
	if len(data) > 4096 {
		data = data[len(data)-4096:]
	}
	return string(data)
}

// waitFor polls ok for up to a minute.
func waitFor(ok func() bool) error {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if ok() {
			return nil
		}
	}
	return fmt.Errorf("timed out")
}

// stop removes every container, stops dockerd then containerd by PID (SIGTERM, SIGKILL
// after 30 s), kills shims of this containerd left behind, unmounts what is left below
// the directory and removes it and the cgroup parents.
func (d *docker) stop(b *testing.B) {
	if d.dockerd != nil && d.ping() == nil {
		if ids, err := d.cliErr("ps", "-aq"); err == nil && ids != "" {
			_, _ = d.cliErr(append([]string{"rm", "-f"}, strings.Fields(ids)...)...)
		}
	}
	for _, c := range []*exec.Cmd{d.dockerd, d.containerd} {
		if c == nil || c.Process == nil {
			continue
		}
		_ = c.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	}
	for _, pid := range pidsWhoseCmdline("containerd-shim", d.ctrdSock) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if data, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		var mnts []string
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) > 4 && strings.HasPrefix(f[4], d.dir+"/") {
				mnts = append(mnts, f[4])
			}
		}
		for i := len(mnts) - 1; i >= 0; i-- {
			_ = syscall.Unmount(mnts[i], syscall.MNT_DETACH)
		}
	}
	if err := os.RemoveAll(d.dir); err != nil {
		b.Errorf("docker peer: %v", err)
	}
	parents, _ := filepath.Glob("/sys/fs/cgroup/*" + d.cgroupParent) // cgroup v1
	if _, err := os.Stat("/sys/fs/cgroup" + d.cgroupParent); err == nil {
		parents = append(parents, "/sys/fs/cgroup"+d.cgroupParent) // v2
	}
	for _, p := range parents {
		_ = os.Remove(p)
	}
}

// load puts the busybox test image into the engine (`docker load` of a docker-archive
// written from the cached image).
func (d *docker) load(b *testing.B) {
	b.Helper()
	imgs, err := testimage.StandardImages()
	if err != nil {
		b.Fatal(err)
	}
	tag, err := name.NewTag(dockerImage)
	if err != nil {
		b.Fatal(err)
	}
	tar := filepath.Join(d.dir, "busybox.tar")
	if err := tarball.WriteToFile(tar, tag, imgs.Busybox); err != nil {
		b.Fatal(err)
	}
	d.cli(b, "load", "-q", "-i", tar)
	_ = os.Remove(tar)
}

func (d *docker) cliErr(args ...string) (string, error) {
	cmd := exec.Command(d.bin, args...)
	cmd.Env = d.environ
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("docker %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

func (d *docker) cli(b *testing.B, args ...string) string {
	b.Helper()
	out, err := d.cliErr(args...)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// api calls Docker's HTTP API; out (if not nil) receives the JSON answer.
func (d *docker) api(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, "http://docker"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := d.hc.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body) // exec start: the output stream, until the command exits
	if err != nil {
		return err
	}
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("docker API %s %s: %s: %s", method, path, res.Status, data)
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

func (d *docker) ping() error { return d.api("GET", "/_ping", nil, nil) }

// apiRun creates and starts an idle container, as `docker run -d` does.
func (d *docker) apiRun(b *testing.B) string {
	b.Helper()
	sp := sleeper()
	var c struct{ Id string } // Docker's field name
	if err := d.api("POST", "/containers/create", map[string]any{
		"Image": dockerImage, "Cmd": append([]string{sp.Command}, sp.Args...),
		"HostConfig": map[string]any{"NetworkMode": "none", "SecurityOpt": d.securityOpt},
	}, &c); err != nil {
		b.Fatal(err)
	}
	if err := d.api("POST", "/containers/"+c.Id+"/start", nil, nil); err != nil {
		b.Fatal(err)
	}
	return c.Id
}

// apiExec runs `true` in container id as `docker exec` does: exec create, exec start
// attached (the stream ends when the command does), exec inspect for the exit code.
func (d *docker) apiExec(b *testing.B, id string) {
	b.Helper()
	var e struct{ Id string } // Docker's field name
	if err := d.api("POST", "/containers/"+id+"/exec", map[string]any{"Cmd": []string{"true"}, "AttachStdout": true, "AttachStderr": true}, &e); err != nil {
		b.Fatal(err)
	}
	if err := d.api("POST", "/exec/"+e.Id+"/start", map[string]any{"Detach": false, "Tty": false}, nil); err != nil {
		b.Fatal(err)
	}
	var st struct {
		Running  bool
		ExitCode int
	}
	if err := d.api("GET", "/exec/"+e.Id+"/json", nil, &st); err != nil {
		b.Fatal(err)
	}
	if st.Running || st.ExitCode != 0 {
		b.Fatalf("docker exec: running %v, exit %d", st.Running, st.ExitCode)
	}
}

func (d *docker) rmf(b *testing.B, id string) {
	b.Helper()
	if err := d.api("DELETE", "/containers/"+id+"?force=1", nil, nil); err != nil {
		b.Fatal(err)
	}
}

// daemonsPSS is dockerd's and containerd's PSS.
func (d *docker) daemonsPSS() int64 {
	return pssOf(d.dockerd.Process.Pid) + pssOf(d.containerd.Process.Pid)
}

// shimsPSS is the PSS of this containerd's shims (one per container).
func (d *docker) shimsPSS() int64 {
	var n int64
	for _, pid := range pidsWhoseCmdline("containerd-shim", d.ctrdSock) {
		n += pssOf(pid)
	}
	return n
}
