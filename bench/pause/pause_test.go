package pausebench

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

const (
	pyImage = "python:3.11"
	mib     = 1 << 20
	gib     = 1 << 30
	// workload holds argv[1] random bytes in memory, writes their count to /tmp/ready
	// once they are, and sleeps.
	workload = `import os, sys, time
buf = os.urandom(int(sys.argv[1]))
open("/tmp/ready", "w").write(str(len(buf)))
while True:
    time.sleep(3600)
`
)

// server is the package's `sandboxd dev`, started by the first benchmark that needs it
// and stopped (its sandboxes deleted, its network removed) by TestMain.
type server struct {
	bin, dir, dataDir, log string
	bridge, cgroupParent   string
	subnet                 netip.Prefix
	proc                   *exec.Cmd
	exited                 chan struct{} // closed once proc has been waited for
	c                      *sandbox.Client
	admin                  *sandbox.Admin
}

var (
	setupOnce sync.Once
	srv       *server
	setupErr  error
	// srvB is the A/B comparison's second server (devB), or nil.
	setupBOnce sync.Once
	srvB       *server
	setupBErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	for _, s := range []*server{srv, srvB} {
		if s == nil {
			continue
		}
		if leaks := s.stop(); len(leaks) > 0 {
			fmt.Println("pause bench: left behind:\n  " + strings.Join(leaks, "\n  "))
			code = 1
		}
	}
	os.Exit(code)
}

// devB is the server of an A/B comparison, or nil without $SANDBOXD_BIN_B: a second
// `sandboxd dev` of binary $SANDBOXD_BIN_B (and runsc $SANDBOXD_RUNSC_B, default the
// same), beside dev's, on a bridge, subnet and cgroup parent of its own. BenchmarkPauseAPI
// alternates its rounds between the two, so that both see the same load.
func devB(b *testing.B) *server {
	b.Helper()
	bin := os.Getenv("SANDBOXD_BIN_B")
	if bin == "" {
		return nil
	}
	setupBOnce.Do(func() { srvB, setupBErr = startServer(bin, os.Getenv("SANDBOXD_RUNSC_B"), 1) })
	if setupBErr != nil {
		if srvB != nil {
			b.Log(tail(srvB.log, 4000))
		}
		b.Fatal(setupBErr)
	}
	return srvB
}

func dev(b *testing.B) *server {
	b.Helper()
	testenv.RequireRoot(b, "sandboxd dev runs containers")
	if local.FindRunsc() == "" {
		b.Skip("runsc not found (run `make runsc`, or set $SANDBOXD_RUNSC): no gvisor runtime class")
	}
	setupOnce.Do(func() { srv, setupErr = start() })
	if setupErr != nil {
		if srv != nil {
			b.Log(tail(srv.log, 4000))
		}
		b.Fatal(setupErr)
	}
	return srv
}

func freeAddr() string {
	a, err := testenv.FreeAddr()
	if err != nil {
		panic(err)
	}
	return a
}

func start() (*server, error) {
	bin := os.Getenv("SANDBOXD_BIN")
	if bin == "" {
		bin, _ = filepath.Abs("../../bin/sandboxd")
	}
	return startServer(bin, "", 0)
}

// startServer starts `sandboxd dev` of bin (runsc: its runsc, "" the environment's);
// index 1 is the A/B comparison's second server.
func startServer(bin, runsc string, index int) (*server, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s: %w (run make build, or set SANDBOXD_BIN)", bin, err)
	}
	dir, err := os.MkdirTemp("", "sandboxd-pause-bench-")
	if err != nil {
		return nil, err
	}
	pid := os.Getpid()
	s := &server{bin: bin, dir: dir, dataDir: filepath.Join(dir, "data"), log: filepath.Join(dir, "sandboxd.log"),
		bridge:       fmt.Sprintf("sbxpau%d%04x", index, pid&0xffff),
		subnet:       netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(200 + pid%50), byte((pid/50 + index) % 256), 0}), 24),
		cgroupParent: fmt.Sprintf("sandboxd-pause-bench-%d-%d", pid, index)}
	logf, err := os.Create(s.log)
	if err != nil {
		return s, err
	}
	api := freeAddr()
	s.proc = exec.Command(bin, "dev", "--data-dir", s.dataDir, "--listen", api, "--edge-listen", freeAddr(),
		"--data-plane-listen", freeAddr(), "--warm-pool", "0",
		"--bridge", s.bridge, "--subnet", s.subnet.String(), "--cgroup-parent", s.cgroupParent)
	s.proc.Stdout, s.proc.Stderr = logf, logf
	if runsc != "" {
		s.proc.Env = append(os.Environ(), "SANDBOXD_RUNSC="+runsc)
	}
	if err := s.proc.Start(); err != nil {
		return s, err
	}
	s.exited = make(chan struct{})
	go func() { _ = s.proc.Wait(); close(s.exited) }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get("http://" + api + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-s.exited:
			return s, fmt.Errorf("sandboxd dev exited before it was ready")
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("sandboxd dev not ready after 90 s")
		}
	}
	raw, err := os.ReadFile(filepath.Join(s.dataDir, "admin-api-key"))
	if err != nil {
		return s, err
	}
	key := strings.TrimSpace(string(raw))
	// The gateway path for everything: the measured exec is the raw unary RPC, which
	// waits on the server until the sandbox runs (no client-side poll interval in it).
	if s.c, err = sandbox.New("http://"+api, key, sandbox.WithDataPlane(sandbox.DataPlaneGateway)); err != nil {
		return s, err
	}
	if s.admin, err = sandbox.NewAdmin("http://"+api, key); err != nil {
		return s, err
	}
	// The dev runner's empty policy allows no runtime class pin; gvisor is what this
	// package measures.
	pol, err := structpb.NewStruct(map[string]any{"constraints": map[string]any{"security": map[string]any{
		"allowed_runtime_classes": []any{"runc", "gvisor"}}}})
	if err != nil {
		return s, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.admin.Runners.UpdateManagedRunner(ctx, connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
		ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: "local", Policy: pol},
		UpdateMask:    &fieldmaskpb.FieldMask{Paths: []string{"policy"}}})); err != nil {
		return s, fmt.Errorf("allow the gvisor runtime class in the local runner's policy: %w", err)
	}
	return s, nil
}

// stop deletes every sandbox, waits until the runner has torn them down, stops the
// server and removes what it leaves on purpose; it returns what was left behind.
func (s *server) stop() []string {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var left []string
	if s.c != nil {
		_, _ = s.c.Purge(ctx, sandbox.PurgeOptions{All: true})
		for ctx.Err() == nil {
			left = stacktest.Leftovers(s.dataDir)
			if !slices.ContainsFunc(left, func(l string) bool { return strings.HasPrefix(l, "sandbox dir ") }) {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	if s.exited != nil {
		_ = s.proc.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			_ = s.proc.Process.Kill()
			<-s.exited
		}
		// What a stopped server leaves (its volume pool is mounted while it runs).
		left = stacktest.Leftovers(s.dataDir)
	}
	// The floor's (floorBundle removes its dir).
	for _, mp := range stacktest.MountsUnder(filepath.Join(s.dir, "floor")) {
		left = append(left, "mount "+mp)
	}
	stacktest.ForceClean(s.dir)
	if m, err := network.New(network.Config{Bridge: s.bridge, Subnet: s.subnet, Table: "sandboxd_" + s.bridge,
		StateDir: filepath.Join(s.dataDir, "network")}); err == nil {
		if err := m.Cleanup(); err != nil {
			left = append(left, "network: "+err.Error())
		}
	}
	for _, p := range stacktest.RemoveCgroupParent(s.cgroupParent) {
		left = append(left, "cgroup "+p)
	}
	// The floor's runsc containers (runFloor kills and deletes each; this is the check).
	if out, err := exec.Command("pgrep", "-f", "runsc.*--root="+filepath.Join(s.dir, "floor")).Output(); err == nil && len(bytes.TrimSpace(out)) > 0 {
		left = append(left, "floor runsc processes "+strings.Join(strings.Fields(string(out)), ","))
	}
	_ = os.RemoveAll(s.dir)
	return left
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.ToValidUTF8(b, []byte("?")))
}

// exec runs argv with the raw unary Exec, which waits on the server until the sandbox
// runs, and fails on a nonzero exit.
func (s *server) exec(ctx context.Context, id string, argv ...string) (string, error) {
	res, err := s.c.Service().Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: argv}))
	if err != nil {
		return "", fmt.Errorf("exec %v in %s: %w", argv, id, err)
	}
	if res.Msg.GetExitCode() != 0 {
		return "", fmt.Errorf("exec %v in %s: exit %d: %s", argv, id, res.Msg.GetExitCode(), res.Msg.GetStderr())
	}
	return string(res.Msg.GetStdout()), nil
}

// stopAll stops the sandboxes (at once, in parallel) and waits until they have ended.
func (s *server) stopAll(b *testing.B, ids ...string) {
	b.Helper()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := s.c.Sandbox(id).Stop(ctx, 0); err != nil {
				b.Errorf("stop %s: %v", id, err)
			}
		}()
	}
	wg.Wait()
}

// python creates a gvisor sandbox of the python image holding resident random bytes in
// memory (memory its limit, "" the default) and returns its ID once they are held; the
// time until its first exec answered is returned too.
func (s *server) python(b *testing.B, resident int64, memory string) (string, time.Duration) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sp := sandbox.Spec{Image: pyImage, Command: "python3", Args: []string{"-c", workload, strconv.FormatInt(resident, 10)},
		Memory: memory, Tags: []string{"pause-bench"}}.Proto()
	sp.RuntimeClass = local.GVisorClass
	t0 := time.Now()
	var sb *sandbox.Sandbox
	var err error
	// The policy reaches the runner right after the update; give it a moment if not.
	for {
		if sb, err = s.c.CreateProto(ctx, sp); err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "runtime") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := sb.Refresh(context.Background()); err == nil && !sb.State().Terminal() {
			s.stopAll(b, sb.ID())
		}
	})
	if _, err := s.exec(ctx, sb.ID(), "true"); err != nil {
		b.Fatal(err)
	}
	first := time.Since(t0)
	s.waitReady(b, sb.ID(), resident)
	return sb.ID(), first
}

// waitReady waits until the workload of id holds its bytes.
func (s *server) waitReady(b *testing.B, id string, resident int64) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	want := strconv.FormatInt(resident, 10)
	for {
		out, err := s.exec(ctx, id, "cat", "/tmp/ready")
		if err == nil && out == want {
			return
		}
		if ctx.Err() != nil {
			b.Fatalf("the workload of %s is not ready: %q %v", id, out, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pauseResume pauses id (resources released) and resumes it: pause call → returned,
// resume call → returned, resume call → the first exec answered (and the workload's
// memory is what it was), and the checkpoint's size.
func (s *server) pauseResume(b *testing.B, id string, resident int64) (pause, resume, resumeExec time.Duration, size int64) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	release := true
	t0 := time.Now()
	st, err := s.c.Pause(ctx, id, sandbox.PauseOptions{ReleaseResources: &release})
	pause = time.Since(t0)
	if err != nil {
		b.Fatalf("pause %s: %v", id, err)
	}
	if !st.ResourcesReleased || st.CheckpointBytes <= 0 {
		b.Fatalf("pause %s: not checkpointed: %+v", id, st)
	}
	t0 = time.Now()
	if _, err := s.c.Resume(ctx, id); err != nil {
		b.Fatalf("resume %s: %v", id, err)
	}
	resume = time.Since(t0)
	out, err := s.exec(ctx, id, "cat", "/tmp/ready")
	resumeExec = time.Since(t0)
	if err != nil {
		b.Fatal(err)
	}
	if out != strconv.FormatInt(resident, 10) {
		b.Fatalf("resumed %s: the workload says %q, want %d", id, out, resident)
	}
	return pause, resume, resumeExec, st.CheckpointBytes
}

// fork makes n forks of id and returns call → every fork has answered an exec (which
// reads the workload's file: the fork has the source's files). The forks are stopped
// untimed.
func (s *server) fork(b *testing.B, id string, n int, resident int64) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	forks, err := s.c.Fork(ctx, id, n, sandbox.ForkOptions{})
	ids := make([]string, len(forks))
	for i, f := range forks {
		ids[i] = f.ID()
	}
	defer s.stopAll(b, ids...)
	if err != nil {
		b.Fatalf("fork %s ×%d: %v", id, n, err)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, f := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := s.exec(ctx, f, "cat", "/tmp/ready")
			if err == nil && out != strconv.FormatInt(resident, 10) {
				err = fmt.Errorf("fork %s: the workload's file says %q, want %d", f, out, resident)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	d := time.Since(t0)
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return d
}

// tookRE finds the runner's own pause time in its log line.
var tookRE = regexp.MustCompile(`took=([0-9.]+(?:ns|µs|us|ms|s|m[0-9.]+s)+)`)

// runnerPauses are the durations the runner logged for the pauses of id, in order.
func (s *server) runnerPauses(id string) []time.Duration {
	data, _ := os.ReadFile(s.log)
	var out []time.Duration
	for line := range strings.SplitSeq(string(data), "\n") {
		if !strings.Contains(line, "sandbox paused") || !strings.Contains(line, id) {
			continue
		}
		if m := tookRE.FindStringSubmatch(line); m != nil {
			if d, err := time.ParseDuration(strings.Replace(m[1], "us", "µs", 1)); err == nil {
				out = append(out, d)
			}
		}
	}
	return out
}

// floorBundle makes an OCI bundle of the busybox test image's rootfs running sleep,
// for the raw runsc floor.
func (s *server) floorBundle(b *testing.B, runsc string) (bundle, root string) {
	b.Helper()
	base := filepath.Join(s.dir, "floor")
	bundle, root = filepath.Join(base, "bundle"), filepath.Join(base, "root")
	rootfs := filepath.Join(bundle, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		b.Fatal(err)
	}
	tarball := filepath.Join(testimage.Dir(), "busybox.tar")
	if out, err := exec.Command("tar", "-xf", tarball, "-C", rootfs).CombinedOutput(); err != nil {
		b.Fatalf("unpack %s: %v: %s", tarball, err, out)
	}
	if out, err := exec.Command(runsc, "spec", "--bundle", bundle, "--", "/bin/sleep", "100000").CombinedOutput(); err != nil {
		b.Fatalf("runsc spec: %v: %s", err, out)
	}
	b.Cleanup(func() {
		// runsc leaves the bind mount of its empty network namespace in its root dir.
		stacktest.ForceClean(base)
		_ = os.RemoveAll(base)
	})
	return bundle, root
}

// rawRunsc runs a busybox container with runsc directly and measures `runsc checkpoint`
// (the container stops) and `runsc restore` (detached, returns once it runs) of it.
func (s *server) rawRunsc(b *testing.B, runsc, bundle, root string, i int) (ck, rs time.Duration) {
	b.Helper()
	flags := []string{"--root=" + root, "--platform=systrap", "--network=none", "--ignore-cgroups"}
	// Output to a file, not a pipe: a detached sandbox keeps its runsc's stdio open.
	logPath := filepath.Join(filepath.Dir(root), "runsc.log")
	run := func(args ...string) {
		b.Helper()
		logf, err := os.Create(logPath)
		if err != nil {
			b.Fatal(err)
		}
		defer logf.Close()
		cmd := exec.Command(runsc, append(slices.Clone(flags), args...)...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Run(); err != nil {
			b.Fatalf("runsc %v: %v: %s", args, err, tail(logPath, 2000))
		}
	}
	id := fmt.Sprintf("pause-bench-floor-%d", i)
	img := filepath.Join(filepath.Dir(root), "image-"+strconv.Itoa(i))
	run("run", "--detach", "--bundle="+bundle, id)
	defer func() {
		_ = exec.Command(runsc, append(slices.Clone(flags), "delete", "--force", id)...).Run()
		_ = os.RemoveAll(img)
	}()
	t0 := time.Now()
	run("checkpoint", "--image-path="+img, id)
	ck = time.Since(t0)
	run("delete", "--force", id) // restore makes the container anew
	t0 = time.Now()
	run("restore", "--detach", "--image-path="+img, "--bundle="+bundle, id)
	rs = time.Since(t0)
	run("kill", id, "KILL")
	return ck, rs
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pct is the p-th percentile (nearest rank) of d.
func pct(d []time.Duration, p float64) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	i := int(math.Ceil(p/100*float64(len(d)))) - 1
	return d[max(0, min(i, len(d)-1))]
}

// benchN is the N of -benchtime Nx (0 when it is a duration).
func benchN() int {
	f := flag.Lookup("test.benchtime")
	if f == nil {
		return 0
	}
	v := f.Value.String()
	if n, err := strconv.Atoi(strings.TrimSuffix(v, "x")); err == nil && strings.HasSuffix(v, "x") {
		return n
	}
	return 0
}

// row is one line of the table.
type row struct{ what, value, target string }

func p5099(d []time.Duration) string {
	return fmt.Sprintf("p50 %6.0f ms  p99 %6.0f ms  (n=%d)", ms(pct(d, 50)), ms(pct(d, 99)), len(d))
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// BenchmarkPauseResumeFork measures everything of the package in one run and prints one
// table (see the package doc). Under -benchtime 1x the sizes are small.
func BenchmarkPauseResumeFork(b *testing.B) {
	if b.N == 1 && benchN() > 1 {
		// testing runs a benchmark once with N=1 before the N of -benchtime Nx; this
		// one's rounds are all in the second run.
		return
	}
	s := dev(b)
	runsc := local.FindRunsc()
	full := b.N >= 10
	reps := b.N
	fewer := max(1, b.N/5) // rounds of the slow measures
	resident, forkN, memory := int64(64*mib), 3, ""
	if full {
		resident, forkN, memory = 512*mib, 10, "1536Mi"
	}
	var rows []row
	add := func(what, value, target string) { rows = append(rows, row{what, value, target}) }

	// Floors: a fresh create → first exec of the same image and class (what a fork
	// competes with), and raw runsc checkpoint + restore of a busybox container.
	// One untimed first: it pulls the image, which neither a fork nor a resume does.
	warm, _ := s.python(b, 0, "")
	s.stopAll(b, warm)
	var fresh []time.Duration
	for range reps {
		id, d := s.python(b, 0, "")
		fresh = append(fresh, d)
		s.stopAll(b, id)
	}
	bundle, root := s.floorBundle(b, runsc)
	var rawCk, rawRs []time.Duration
	for i := range reps {
		ck, rs := s.rawRunsc(b, runsc, bundle, root, i)
		rawCk, rawRs = append(rawCk, ck), append(rawRs, rs)
	}

	// The idle sandbox.
	idle, _ := s.python(b, 0, "")
	var pauses, resumes, resumeExecs, fork1, forkMany []time.Duration
	var ckBytes int64
	for range reps {
		p, r, re, size := s.pauseResume(b, idle, 0)
		pauses, resumes, resumeExecs = append(pauses, p), append(resumes, r), append(resumeExecs, re)
		ckBytes = size
	}
	for range reps {
		fork1 = append(fork1, s.fork(b, idle, 1, 0))
	}
	for range fewer {
		forkMany = append(forkMany, s.fork(b, idle, forkN, 0))
	}
	runnerIdle := s.runnerPauses(idle) // those of the rounds above only
	// Forks of the paused source start from its checkpoint: no checkpoint in the fork.
	var forkPaused []time.Duration
	release := true
	if _, err := s.c.Pause(context.Background(), idle, sandbox.PauseOptions{ReleaseResources: &release}); err != nil {
		b.Fatal(err)
	}
	for range reps {
		forkPaused = append(forkPaused, s.fork(b, idle, 1, 0))
	}
	if _, err := s.c.Resume(context.Background(), idle); err != nil {
		b.Fatal(err)
	}

	// The sandbox holding resident bytes.
	big, _ := s.python(b, resident, memory)
	var bigPauses, bigResumes, bigResumeExecs, bigFork1 []time.Duration
	var bigBytes int64
	for range fewer {
		p, r, re, size := s.pauseResume(b, big, resident)
		bigPauses, bigResumes, bigResumeExecs = append(bigPauses, p), append(bigResumes, r), append(bigResumeExecs, re)
		bigBytes = size
	}
	for range fewer {
		bigFork1 = append(bigFork1, s.fork(b, big, 1, resident))
	}
	runnerBig := s.runnerPauses(big)
	b.StopTimer()

	perGiB := ms(pct(bigPauses, 50)) * gib / float64(resident)
	forkName := fmt.Sprintf("fork ×%d (wall, all answered)", forkN)
	add("floor: create → first exec (python, gvisor)", p5099(fresh), "")
	add("floor: raw runsc checkpoint (busybox)", p5099(rawCk), "")
	add("floor: raw runsc restore (busybox)", p5099(rawRs), "")
	add("idle: pause (API)", p5099(pauses), "")
	if len(runnerIdle) > 0 {
		add("idle: pause (runner's own, log)", p5099(runnerIdle), "")
	}
	add("idle: resume (API returns)", p5099(resumes), fmt.Sprintf("p50 ≤ 150 ms: %s", verdict(ms(pct(resumes, 50)) <= 150)))
	add("idle: resume → first exec answered", p5099(resumeExecs), "")
	add("idle: fork ×1 → answers exec", p5099(fork1), fmt.Sprintf("p50 ≤ 250 ms: %s", verdict(ms(pct(fork1, 50)) <= 250)))
	add("idle: fork ×1 of the paused source", p5099(forkPaused), "")
	target := ""
	if forkN == 10 {
		target = fmt.Sprintf("≤ 1500 ms: %s", verdict(ms(pct(forkMany, 50)) <= 1500))
	}
	add("idle: "+forkName, p5099(forkMany), target)
	add("idle: checkpoint size", fmt.Sprintf("%.1f MiB", float64(ckBytes)/mib), "")
	add(fmt.Sprintf("%d MiB: pause (API)", resident/mib), p5099(bigPauses), "")
	if len(runnerBig) > 0 {
		add(fmt.Sprintf("%d MiB: pause (runner's own, log)", resident/mib), p5099(runnerBig), "")
	}
	add(fmt.Sprintf("%d MiB: pause per GiB resident", resident/mib), fmt.Sprintf("%.0f ms/GiB", perGiB), fmt.Sprintf("≤ 1000 ms/GiB: %s", verdict(perGiB <= 1000)))
	marginal := (ms(pct(bigPauses, 50)) - ms(pct(pauses, 50))) * gib / float64(resident)
	add(fmt.Sprintf("%d MiB: pause per GiB beyond the idle one", resident/mib), fmt.Sprintf("%.0f ms/GiB", marginal), "")
	add(fmt.Sprintf("%d MiB: resume (API returns)", resident/mib), p5099(bigResumes), "")
	add(fmt.Sprintf("%d MiB: resume → first exec answered", resident/mib), p5099(bigResumeExecs), "")
	add(fmt.Sprintf("%d MiB: fork ×1 → answers exec", resident/mib), p5099(bigFork1), "")
	add(fmt.Sprintf("%d MiB: checkpoint size", resident/mib), fmt.Sprintf("%.1f MiB", float64(bigBytes)/mib), "")
	add("ratio: idle pause / raw checkpoint (p50)", fmt.Sprintf("%.1fx", ms(pct(pauses, 50))/ms(pct(rawCk, 50))), "")
	add("ratio: idle resume / raw restore (p50)", fmt.Sprintf("%.1fx", ms(pct(resumes, 50))/ms(pct(rawRs, 50))), "")
	add("ratio: idle fork ×1 / fresh create (p50)", fmt.Sprintf("%.2fx", ms(pct(fork1, 50))/ms(pct(fresh, 50))), "")

	var tb strings.Builder
	fmt.Fprintf(&tb, "pause/resume/fork, gvisor, %s (runsc %s), -benchtime %dx:\n", pyImage, local.RunscVersion, b.N)
	for _, r := range rows {
		fmt.Fprintf(&tb, "  %-44s %-40s %s\n", r.what, r.value, r.target)
	}
	fmt.Print(tb.String())

	b.ReportMetric(ms(pct(pauses, 50)), "idle-pause-p50-ms")
	b.ReportMetric(ms(pct(resumes, 50)), "idle-resume-p50-ms")
	b.ReportMetric(ms(pct(resumes, 99)), "idle-resume-p99-ms")
	b.ReportMetric(ms(pct(resumeExecs, 50)), "idle-resume-exec-p50-ms")
	b.ReportMetric(ms(pct(fork1, 50)), "idle-fork1-p50-ms")
	b.ReportMetric(ms(pct(fork1, 99)), "idle-fork1-p99-ms")
	b.ReportMetric(ms(pct(forkPaused, 50)), "idle-fork1-paused-p50-ms")
	b.ReportMetric(ms(pct(forkMany, 50)), fmt.Sprintf("idle-fork%d-wall-ms", forkN))
	b.ReportMetric(float64(ckBytes), "idle-checkpoint-bytes")
	b.ReportMetric(perGiB, "pause-ms-per-GiB")
	b.ReportMetric(float64(bigBytes), "resident-checkpoint-bytes")
	b.ReportMetric(ms(pct(fresh, 50)), "fresh-first-exec-p50-ms")
	b.ReportMetric(ms(pct(rawCk, 50)), "raw-checkpoint-p50-ms")
	b.ReportMetric(ms(pct(rawRs, 50)), "raw-restore-p50-ms")
}
