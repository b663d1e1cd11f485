package fssbench

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/klauspost/compress/zstd"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/testenv"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

const (
	image  = "busybox"
	mount  = "/work"
	volume = "work"
	mib    = 1 << 20
)

// server is the package's `sandboxd dev`, started by the first benchmark that needs it
// and stopped (its sandboxes deleted, its network removed) by TestMain.
type server struct {
	dir, dataDir, log    string
	bridge, cgroupParent string
	subnet               netip.Prefix
	proc                 *exec.Cmd
	exited               chan struct{} // closed once proc has been waited for
	c                    *sandbox.Client
}

var (
	setupOnce sync.Once
	srv       *server
	setupErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if srv != nil {
		if leaks := srv.stop(); len(leaks) > 0 {
			fmt.Println("fss bench: left behind:\n  " + strings.Join(leaks, "\n  "))
			code = 1
		}
	}
	os.Exit(code)
}

func dev(b *testing.B) *server {
	b.Helper()
	testenv.RequireRoot(b, "sandboxd dev runs containers")
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
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s: %w (run make build, or set SANDBOXD_BIN)", bin, err)
	}
	dir, err := os.MkdirTemp("", "sandboxd-fss-bench-")
	if err != nil {
		return nil, err
	}
	pid := os.Getpid()
	s := &server{dir: dir, dataDir: filepath.Join(dir, "data"), log: filepath.Join(dir, "sandboxd.log"),
		bridge:       fmt.Sprintf("sbxfss%04x", pid&0xffff),
		subnet:       netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(200 + pid%50), byte(pid / 50 % 256), 0}), 24),
		cgroupParent: fmt.Sprintf("sandboxd-fss-bench-%d", pid)}
	logf, err := os.Create(s.log)
	if err != nil {
		return s, err
	}
	api := freeAddr()
	s.proc = exec.Command(bin, "dev", "--data-dir", s.dataDir, "--listen", api, "--edge-listen", freeAddr(),
		"--data-plane-listen", freeAddr(), "--warm-pool", "0",
		"--bridge", s.bridge, "--subnet", s.subnet.String(), "--cgroup-parent", s.cgroupParent)
	s.proc.Stdout, s.proc.Stderr = logf, logf
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
	key, err := os.ReadFile(filepath.Join(s.dataDir, "admin-api-key"))
	if err != nil {
		return s, err
	}
	// The gateway path for everything: the measured exec is the raw unary RPC, which
	// waits on the server until the sandbox runs (no client-side poll interval in it).
	s.c, err = sandbox.New("http://"+api, strings.TrimSpace(string(key)), sandbox.WithDataPlane(sandbox.DataPlaneGateway))
	return s, err
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

// box creates a sandbox with the scratch volume "work" of volSize at /work, restored from
// restore unless it is "".
func (s *server) box(ctx context.Context, volSize int64, restore string) (*sandbox.Sandbox, error) {
	return s.c.Create(ctx, sandbox.Spec{Image: image, Tags: []string{"fss-bench"}, Volumes: []sandbox.ScratchVolume{
		{Name: volume, Size: fmt.Sprintf("%dMi", volSize/mib), MountPath: mount, RestoreFrom: restore}}})
}

// volFor is a volume size that holds size bytes of files with room to spare.
func volFor(size int64) int64 { return (size*5/4 + 64*mib) / mib * mib }

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
func stopAll(b *testing.B, sbs ...*sandbox.Sandbox) {
	b.Helper()
	var wg sync.WaitGroup
	for _, sb := range sbs {
		if sb == nil || sb.State().Terminal() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := sb.Stop(ctx, 0); err != nil {
				b.Errorf("stop %s: %v", sb.ID(), err)
			}
		}()
	}
	wg.Wait()
}

// source is a running sandbox whose volume holds size random bytes in /work/data.
func (s *server) source(b *testing.B, size int64) *sandbox.Sandbox {
	b.Helper()
	ctx := context.Background()
	sb, err := s.box(ctx, volFor(size), "")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stopAll(b, sb) })
	if _, err := s.exec(ctx, sb.ID(), "sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > %s/data && sync", size, mount)); err != nil {
		b.Fatal(err)
	}
	return sb
}

// snapshot takes a snapshot of sb's volume and polls it every 10 ms until READY; it
// returns the snapshot and create → READY.
func (s *server) snapshot(b *testing.B, sb *sandbox.Sandbox) (*sandbox.Snapshot, time.Duration) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	t0 := time.Now()
	snap, err := sb.Snapshot(ctx, volume, sandbox.NoWait())
	if err != nil {
		b.Fatal(err)
	}
	for {
		got, err := s.c.GetSnapshot(ctx, snap.ID)
		if err != nil {
			b.Fatal(err)
		}
		switch got.State {
		case sandbox.SnapshotReady:
			d := time.Since(t0)
			b.Cleanup(func() { _ = s.c.DeleteSnapshot(context.Background(), got.ID, true) })
			return got, d
		case sandbox.SnapshotFailed, sandbox.SnapshotDeleting:
			b.Fatalf("snapshot %s: %s: %s", got.ID, got.State, got.Reason)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pauseRE finds a pause duration in a log line: pause=12ms, "pause":"1.2ms", pause_ms=3.
var pauseRE = regexp.MustCompile(`pause(_ms)?"?[=:]\s*"?([0-9.]+(ns|µs|us|ms|s)?)`)

// pauseOf is the workload pause the server logged for snapshot id, if it did.
func (s *server) pauseOf(id string) (time.Duration, bool) {
	data, _ := os.ReadFile(s.log)
	for line := range strings.SplitSeq(string(data), "\n") {
		if !strings.Contains(line, id) {
			continue
		}
		m := pauseRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		v := m[2]
		if m[1] != "" && m[3] == "" {
			v += "ms"
		}
		if d, err := time.ParseDuration(strings.Replace(v, "us", "µs", 1)); err == nil {
			return d, true
		}
	}
	return 0, false
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

// floors writes size random bytes to the data dir's disk and measures, on that disk, a
// plain copy of them (+fsync) and tar | zstd -1 of the tree holding them (+fsync).
func (s *server) floors(b *testing.B, size int64) (cp, tarZstd time.Duration) {
	b.Helper()
	dir, err := os.MkdirTemp(s.dir, "floor-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "data")
	f, err := os.Create(src)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	syncClose := func(f *os.File) {
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}

	t0 := time.Now()
	in, err := os.Open(src)
	if err != nil {
		b.Fatal(err)
	}
	out, err := os.Create(filepath.Join(dir, "copy"))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		b.Fatal(err)
	}
	syncClose(out)
	in.Close()
	cp = time.Since(t0)

	t0 = time.Now()
	in, err = os.Open(src)
	if err != nil {
		b.Fatal(err)
	}
	out, err = os.Create(filepath.Join(dir, "archive.tar.zst"))
	if err != nil {
		b.Fatal(err)
	}
	zw, err := zstd.NewWriter(out, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		b.Fatal(err)
	}
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: "data", Mode: 0o644, Size: size, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(tw, in); err != nil {
		b.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		b.Fatal(err)
	}
	syncClose(out)
	in.Close()
	return cp, time.Since(t0)
}

// BenchmarkSnapshot: create → READY of a snapshot of a volume holding 100 MiB and 1 GiB
// of random bytes (4 and 16 MiB under -benchtime below 10x), the workload pause when the
// server logs it, and the floors of the same bytes on the same disk.
func BenchmarkSnapshot(b *testing.B) {
	s := dev(b)
	full := b.N >= 10
	type size struct {
		name  string
		bytes int64
		reps  int
	}
	sizes := []size{{"4MiB", 4 * mib, 1}, {"16MiB", 16 * mib, 1}}
	if full {
		sizes = []size{{"100MiB", 100 * mib, 5}, {"1GiB", 1024 * mib, 2}}
	}
	for _, sz := range sizes {
		src := s.source(b, sz.bytes)
		var ready, pauses []time.Duration
		var archived int64
		for range sz.reps {
			snap, d := s.snapshot(b, src)
			ready = append(ready, d)
			archived = snap.SizeBytes
			if p, ok := s.pauseOf(snap.ID); ok {
				pauses = append(pauses, p)
			}
			_ = s.c.DeleteSnapshot(context.Background(), snap.ID, true)
		}
		// The workload ran through every snapshot.
		if _, err := s.exec(context.Background(), src.ID(), "true"); err != nil {
			b.Fatal(err)
		}
		cp, tz := s.floors(b, sz.bytes)
		r := median(ready)
		b.ReportMetric(ms(r), sz.name+"-ready-ms")
		b.ReportMetric(ms(r)/ms(tz), sz.name+"-ready/tar-zstd")
		pause := "not reported (neither the API nor the server log has it; the backend benchmark measures it)"
		if len(pauses) > 0 {
			p := median(pauses)
			b.ReportMetric(ms(p), sz.name+"-pause-ms")
			pause = fmt.Sprintf("%.1f ms (target ≤ 50 ms)", ms(p))
		}
		target := ""
		if sz.bytes == 100*mib {
			target = " (target ≤ 1500 ms)"
		}
		fmt.Printf("snapshot of %s (%d runs, archive %d bytes): create → READY %.0f ms%s; floors on this disk: copy+fsync %.0f ms, tar|zstd-1+fsync %.0f ms (READY/tar|zstd %.2fx); workload pause %s\n",
			sz.name, len(ready), archived, ms(r), target, ms(cp), ms(tz), ms(r)/ms(tz), pause)
	}
}

// fanout creates n sandboxes at once (restored from restore, or not) and returns the time
// until the first exec of every one has returned; that exec checks the restored file.
func (s *server) fanout(b *testing.B, n int, volSize int64, restore string, want int64) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sbs := make([]*sandbox.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := s.box(ctx, volSize, restore)
			if err != nil {
				errs[i] = err
				return
			}
			sbs[i] = sb
			argv := []string{"true"}
			if restore != "" {
				argv = []string{"stat", "-c", "%s", mount + "/data"}
			}
			out, err := s.exec(ctx, sb.ID(), argv...)
			if err == nil && restore != "" && strings.TrimSpace(out) != fmt.Sprint(want) {
				err = fmt.Errorf("%s: restored file has %q bytes, want %d", sb.ID(), strings.TrimSpace(out), want)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	d := time.Since(t0)
	stopAll(b, sbs...)
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return d
}

// BenchmarkRestoreFanout: a snapshot of 100 MiB (4 MiB below 10x) restored into 1 and 20
// (1 and 3) sandboxes created at once: create → every first exec has read the restored
// file, next to the same number of sandboxes without a restore. The first restore, which
// downloads the archive into the runner's cache, is reported on its own.
func BenchmarkRestoreFanout(b *testing.B) {
	s := dev(b)
	size, counts := int64(4*mib), []int{1, 3}
	if b.N >= 10 {
		size, counts = 100*mib, []int{1, 20}
	}
	vol := volFor(size)
	src := s.source(b, size)
	snap, _ := s.snapshot(b, src)
	stopAll(b, src)
	first := s.fanout(b, 1, vol, snap.ID, size)
	b.ReportMetric(ms(first), "first-restore-ms")
	fmt.Printf("restore of %d MiB: the first (downloads into the runner's cache) create → first exec %.0f ms\n", size/mib, ms(first))
	for _, n := range counts {
		plain := s.fanout(b, n, vol, "", 0)
		restored := s.fanout(b, n, vol, snap.ID, size)
		b.ReportMetric(ms(restored), fmt.Sprintf("restore-x%d-all-first-exec-ms", n))
		b.ReportMetric(ms(plain), fmt.Sprintf("plain-x%d-all-first-exec-ms", n))
		fmt.Printf("restore of %d MiB into %d sandboxes at once: all first execs after %.0f ms; without a restore %.0f ms (the restore adds %.0f ms, %.2fx)\n",
			size/mib, n, ms(restored), ms(plain), ms(restored-plain), ms(restored)/ms(plain))
	}
}

// BenchmarkCachedRestoreFirstExec: create → first exec of one sandbox whose volume is
// restored from a snapshot the runner has cached, against one without a restore,
// alternating; reports the p50 of each and what the restore adds (target ≤ 50 ms).
func BenchmarkCachedRestoreFirstExec(b *testing.B) {
	s := dev(b)
	size, reps := int64(4*mib), 1
	if b.N >= 10 {
		size, reps = 100*mib, 10
	}
	vol := volFor(size)
	src := s.source(b, size)
	snap, _ := s.snapshot(b, src)
	stopAll(b, src)
	s.fanout(b, 1, vol, snap.ID, size) // caches it on the runner, warms the image
	var plain, restored []time.Duration
	for range reps {
		plain = append(plain, s.fanout(b, 1, vol, "", 0))
		restored = append(restored, s.fanout(b, 1, vol, snap.ID, size))
	}
	p, r := median(plain), median(restored)
	b.ReportMetric(ms(p), "plain-first-exec-p50-ms")
	b.ReportMetric(ms(r), "cached-restore-first-exec-p50-ms")
	b.ReportMetric(ms(r-p), "restore-added-p50-ms")
	fmt.Printf("create → first exec over %d runs each, %d MiB snapshot cached on the runner: with the restore p50 %.0f ms, without %.0f ms: the restore adds %.0f ms (target ≤ 50 ms)\n",
		reps, size/mib, ms(r), ms(p), ms(r-p))
}
