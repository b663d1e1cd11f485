package bench

import (
	"context"
	"fmt"
	"io"
	"math/bits"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// envInt is the positive integer in environment variable name, or def.
func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// densityResult is one density run's figures (the run happens once per process:
// `-benchtime 50x` calls the benchmark twice, and both report the same run).
type densityResult struct {
	n, conc                        int
	wall                           time.Duration
	rate, lastRate                 float64      // creates/s overall and over the last tenth
	tenths                         []float64    // creates/s in each tenth of n (n ≥ 100)
	cpuTenths                      []float64    // CPU ms per create in each tenth (this process and its reaped children: runc)
	cpuSplit                       [][4]float64 // per tenth, of cpuTenths: runner user, runner sys, children user, children sys
	availPer, cgroupPer, runnerPer float64      // MiB per sandbox
	exec10p50, exec10p99, execNp50 float64
	execNp99, rule10p50, rule10p99 float64
	ruleNp50, ruleNp99             float64
	nftFloor                       float64 // p50 ms of an `nft -f -` process given nothing to do
	// Where the host's CPU went over the 2nd and the last tenth (n ≥ 100): [0] the 2nd, [1] the last.
	hostSplit [2]hostSplit
	// At n: the host's threads, those in the sandboxes' cgroups, the runner's descriptors.
	hostThreads, sandboxThreads, runnerFDs int
}

// hostSplit is where the host's CPU went over a stretch of creates, in ms per second of
// wall time (a host of c CPUs has c×1000) and per create.
type hostSplit struct {
	creates                              int
	secs                                 float64
	busy, idle, runner, sandboxes, other float64 // ms/s; runner: the runner and its reaped children (runc)
}

var (
	densityOnce sync.Once
	density     densityResult
)

// BenchmarkDensity: N idle busybox sandboxes on one runner (N = BENCH_DENSITY_N,
// default 20 so that CI's once-through run is brief; issue 25 asks for 1,000),
// created by BENCH_DENSITY_CONCURRENCY (default 4) callers at once, each create counted
// when the sandbox's first exec has answered. It prints:
//   - sustained creates/s until the N-th, overall and over the last tenth (at least
//     10 creates; target ≥ 30/s); for N ≥ 100, creates/s in each tenth and CPU ms per
//     create in each tenth, split into the runner's (this process's) user and system
//     time and its reaped children's (runc) — with BENCH_DENSITY_PROFILE=PREFIX also
//     CPU profiles of the runner over the 2nd and the last tenth (PREFIX-early.prof,
//     PREFIX-late.prof; not together with -cpuprofile);
//   - for N ≥ 100, where the host's CPU went over the 2nd and the last tenth: busy and
//     idle, and of the busy the runner and runc (as above), the sandboxes' cgroups and
//     the rest, in ms/s and per create. The sandboxes' cgroups hold what the line above
//     leaves out: `runc init` is charged there from its start (it joins the cgroup before
//     it sets up the container: mounts, pivot_root) and becomes the agent, which is never
//     the runner's child — so a create's runc init and its agent's start are counted
//     there, with the first exec and the sandbox's commands. And at N, the threads on the
//     host and in the sandboxes' cgroups, and the runner's open descriptors (what the
//     kernel walks per create: docs/network.md);
//   - host memory per idle sandbox at N, two ways (hostmem_test.go): the drop of the host's
//     MemAvailable / N, and (the sandboxes' cgroups + the runner's PSS growth) / N
//     (target ≤ 5 MiB);
//   - exec of /bin/true through the agent, p50/p99 at 10 sandboxes and at N, and their
//     ratio (target ≤ 1.5);
//   - one network rule change (network.Manager.SetRules: one sandbox's egress rules
//     replaced, one nftables transaction over netlink) at 10 and at N (target ≤ 15 ms),
//     beside the `nft` process such a change ran before (given nothing to do), a floor
//     of that way.
//
// The sandboxes are created on the runner directly, as the other runtime benchmarks do:
// the runner's admission limit (`sandboxd --max-sandboxes`, default 200) is the gateway
// path's and is not in play.
func BenchmarkDensity(b *testing.B) {
	densityOnce.Do(func() { density = runDensity(b) })
	r := density
	b.ReportMetric(r.rate, "creates/s")
	b.ReportMetric(r.availPer, "memavail-MiB/sandbox")
	b.ReportMetric(r.cgroupPer+r.runnerPer, "cgroup+runner-MiB/sandbox")
	b.ReportMetric(r.execNp99/r.exec10p99, "exec-p99-N/10")
	b.ReportMetric(r.ruleNp50, "rule-change-p50-ms")
}

func runDensity(b *testing.B) densityResult {
	n := envInt(b, "BENCH_DENSITY_N", 20)
	conc := envInt(b, "BENCH_DENSITY_CONCURRENCY", 4)
	if n < 10 {
		n = 10
	}
	s := newStackWith(b, 0, func(cfg *stack.Config) {
		if n+16 > 254 { // a /24 is too small: a private range sized for n
			pfx := 32 - bits.Len(uint(n+16))
			cfg.Subnet = netip.PrefixFrom(netip.AddrFrom4([4]byte{172, byte(16 + os.Getpid()%16), 0, 0}), pfx)
		}
	})
	ctx := context.Background()
	warm := createFirstExecOnce(b, s) // the image pulled and unpacked, page cache warm
	_, _ = s.Runner.Delete(warm, 0)
	_, _ = s.Runner.WaitTerminal(ctx, warm)

	r := densityResult{n: n, conc: conc}
	avail0, pss0, cg0 := memAvailable(), selfPSS(), cgroupMemory(env.CgroupParent)
	var (
		mu   sync.Mutex
		ids  []string
		done []time.Time
		cpu  []cpuSample // this process's and its reaped children's CPU at each done
		errs []error
		// marks: the host's CPU at the ends of the tenths hostSplit covers (at done
		// counts n/10, 2n/10, 9n/10 and n), read only there (under mu, ~0.1 ms each).
		marks = map[int]cpuMark{}
	)
	prof := startDensityProfiles(b, n)
	create := func(count int) {
		var wg sync.WaitGroup
		next := make(chan struct{}, count)
		for range count {
			next <- struct{}{}
		}
		close(next)
		for range min(conc, count) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range next {
					id, err := densityCreate(ctx, s)
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					} else {
						ids = append(ids, id)
						done = append(done, time.Now())
						cpu = append(cpu, cpuUsed())
						if d := len(ids); n >= 100 && (d == n/10 || d == 2*n/10 || d == n-n/10 || d == n) {
							marks[d] = markCPU(time.Now())
						}
						prof.at(len(ids))
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(errs) > 0 {
			prof.stop()
			b.Fatalf("%d of the creates failed at %d sandboxes, the first: %v", len(errs), len(ids), errs[0])
		}
		if prof.err != nil {
			prof.stop()
			b.Fatal(prof.err)
		}
	}
	t0 := time.Now()
	create(10)
	at10 := time.Since(t0)
	r.exec10p50, r.exec10p99 = densityExec(b, s, ids)
	r.rule10p50, r.rule10p99 = ruleChange(b, s)
	// The CPU at 10 for the tenth that starts there, without the measurements' (the
	// pause's).
	cpu10 := cpuUsed()
	if n >= 100 && n/10 == 10 { // the 2nd tenth starts here, after the measurements
		marks[10] = markCPU(time.Now())
	}
	prof.afterPause()
	t1 := time.Now()
	create(n - 10)
	r.wall = at10 + time.Since(t1)
	r.rate = float64(n) / r.wall.Seconds()
	// Appended under one lock, done and cpu are in order already.
	k := max(n/10, min(10, n-1)) // the last tenth, at least 10 creates (they finish in clumps of conc)
	r.lastRate = float64(k) / done[n-1].Sub(done[n-k-1]).Seconds()
	if n >= 100 { // where the rate goes as the host fills
		// Completion times from t0, without the pause at 10 (measurements).
		pause := t1.Sub(done[9])
		at := func(i int) time.Duration {
			if i < 0 {
				return 0
			}
			d := done[i].Sub(t0)
			if i >= 10 {
				d -= pause
			}
			return d
		}
		for i := range 10 {
			lo, hi := i*n/10, (i+1)*n/10-1
			r.tenths = append(r.tenths, float64(hi-lo+1)/(at(hi)-at(lo-1)).Seconds())
			if lo > 0 { // the first tenth's start is not sampled
				from := cpu[lo-1]
				if lo == 10 { // n < 110: the 2nd tenth starts at the pause
					from = cpu10
				}
				d := cpu[hi].sub(from)
				per := func(t time.Duration) float64 { return float64(t.Microseconds()) / 1000 / float64(hi-lo+1) }
				r.cpuTenths = append(r.cpuTenths, per(d.total()))
				r.cpuSplit = append(r.cpuSplit, [4]float64{per(d.selfUser), per(d.selfSys), per(d.kidsUser), per(d.kidsSys)})
			}
		}
	}
	if n >= 100 {
		r.hostSplit[0] = splitCPU(marks[n/10], marks[2*n/10], 2*n/10-n/10)
		r.hostSplit[1] = splitCPU(marks[n-n/10], marks[n], n/10)
	}
	r.hostThreads, r.sandboxThreads, r.runnerFDs = hostThreads(), cgroupTasks(env.CgroupParent), openFDs()
	idleSettle()
	avail1, pss1, cg1 := memAvailable(), selfPSS(), cgroupMemory(env.CgroupParent)
	r.availPer = mib(avail0-avail1) / float64(n)
	r.cgroupPer = mib(cg1-cg0) / float64(n)
	r.runnerPer = mib(pss1-pss0) / float64(n)
	r.execNp50, r.execNp99 = densityExec(b, s, ids)
	r.ruleNp50, r.ruleNp99 = ruleChange(b, s)
	r.nftFloor = nftFloor(b)

	fmt.Printf("density: %d idle sandboxes by %d callers in %.1f s: %.1f creates/s overall, %.1f/s over the last tenth (target ≥ 30/s)\n",
		n, conc, r.wall.Seconds(), r.rate, r.lastRate)
	if r.tenths != nil {
		fmt.Printf("density: creates/s in each tenth of the %d: %.1f\n", n, r.tenths)
		fmt.Printf("density: CPU ms per create (the runner and the runc processes it reaped) in the 2nd to the last tenth: %.1f\n", r.cpuTenths)
		var ru, rs, cu, cs []float64
		for _, c := range r.cpuSplit {
			ru, rs, cu, cs = append(ru, c[0]), append(rs, c[1]), append(cu, c[2]), append(cs, c[3])
		}
		fmt.Printf("density: of which the runner user %.1f\n", ru)
		fmt.Printf("density: of which the runner sys  %.1f\n", rs)
		fmt.Printf("density: of which runc etc. user  %.1f\n", cu)
		fmt.Printf("density: of which runc etc. sys   %.1f\n", cs)
		for i, h := range r.hostSplit {
			per := func(v float64) float64 { return v * h.secs / float64(h.creates) }
			fmt.Printf("density: the host's CPU over the %s tenth (%d creates in %.1f s), ms/s [ms per create]: busy %.0f, idle %.0f; "+
				"of the busy: the runner and runc %.0f [%.1f], the sandboxes' cgroups (agents starting, first execs, commands) %.0f [%.1f], the rest (other processes, kernel threads, interrupts) %.0f [%.1f]\n",
				[]string{"2nd", "last"}[i], h.creates, h.secs, h.busy, h.idle, h.runner, per(h.runner), h.sandboxes, per(h.sandboxes), h.other, per(h.other))
		}
	}
	fmt.Printf("density: at %d: %d threads on the host, %d in the sandboxes' cgroups (%.1f per sandbox); the runner holds %d descriptors (%.1f per sandbox)\n",
		n, r.hostThreads, r.sandboxThreads, float64(r.sandboxThreads)/float64(n), r.runnerFDs, float64(r.runnerFDs)/float64(n))
	fmt.Printf("density: host memory per idle sandbox at %d: MemAvailable drop %.2f MiB; cgroups %.2f + runner PSS growth %.2f = %.2f MiB (target ≤ 5 MiB)\n",
		n, r.availPer, r.cgroupPer, r.runnerPer, r.cgroupPer+r.runnerPer)
	fmt.Printf("density: exec of /bin/true at 10: p50 %.2f ms p99 %.2f ms; at %d: p50 %.2f ms p99 %.2f ms; p99 ratio %.2f (target ≤ 1.5)\n",
		r.exec10p50, r.exec10p99, n, r.execNp50, r.execNp99, r.execNp99/r.exec10p99)
	fmt.Printf("density: one network rule change at 10: p50 %.2f ms p99 %.2f ms; at %d: p50 %.2f ms p99 %.2f ms (target ≤ 15 ms); an nft process given nothing to do (how a change ran before): p50 %.2f ms\n",
		r.rule10p50, r.rule10p99, n, r.ruleNp50, r.ruleNp99, r.nftFloor)
	cleanup(b, s)
	return r
}

// densityCreate creates a sleeper and returns its ID once its first exec answered 0.
func densityCreate(ctx context.Context, s *stack.Stack) (string, error) {
	sb, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: sleeper()})
	if err != nil {
		return "", err
	}
	c, err := s.Runner.Agent(ctx, sb.ID, "")
	if err != nil {
		return sb.ID, err
	}
	res, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"/bin/true"}}))
	if err != nil {
		return sb.ID, err
	}
	if res.Msg.ExitCode != 0 {
		return sb.ID, fmt.Errorf("first exec: exit %d", res.Msg.ExitCode)
	}
	return sb.ID, nil
}

// densityExec times 200 execs of /bin/true through the agent, round robin over 10
// sandboxes spread over ids (the oldest to the newest).
func densityExec(b *testing.B, s *stack.Stack, ids []string) (p50, p99 float64) {
	b.Helper()
	ctx := context.Background()
	var cs []agentv1connect.AgentServiceClient
	for i := range 10 {
		c, err := s.Runner.Agent(ctx, ids[i*(len(ids)-1)/9], "")
		if err != nil {
			b.Fatal(err)
		}
		cs = append(cs, c)
	}
	lat := make([]time.Duration, 0, 200)
	for i := range 200 {
		t0 := time.Now()
		res, err := cs[i%len(cs)].Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"/bin/true"}}))
		if err != nil || res.Msg.ExitCode != 0 {
			b.Fatalf("exec: %v", err)
		}
		lat = append(lat, time.Since(t0))
	}
	return quantiles(lat)
}

// ruleChange times 20 changes of one sandbox's egress rules (two CIDR allow lists in
// turn; nothing in the sandbox sends), as a rule update of a running sandbox makes them.
func ruleChange(b *testing.B, s *stack.Stack) (p50, p99 float64) {
	b.Helper()
	ids, err := s.Network.List()
	if err != nil || len(ids) == 0 {
		b.Fatalf("network attachments: %v (%d)", err, len(ids))
	}
	slices.Sort(ids)
	id := ids[0]
	var lat []time.Duration
	for i := range 20 {
		cidr := []string{"203.0.113.0/24", "198.51.100.0/24"}[i%2]
		r := network.Rules{Network: &runtime.Network{Egress: []runtime.EgressRule{{CIDR: cidr}}}}
		t0 := time.Now()
		if err := s.Network.SetRules(id, r); err != nil {
			b.Fatalf("rule change: %v", err)
		}
		lat = append(lat, time.Since(t0))
	}
	return quantiles(lat)
}

// nftFloor is the p50 of 20 runs of `nft -f -` with an empty script: the cost of the
// process a rule change with chains ran before it went over netlink (network.runNft,
// now the fallback), without its work.
func nftFloor(b *testing.B) float64 {
	b.Helper()
	nft, err := exec.LookPath("nft")
	if err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	for range 20 {
		cmd := exec.Command(nft, "-f", "-")
		cmd.Stdin = strings.NewReader("")
		t0 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("nft: %v: %s", err, out)
		}
		lat = append(lat, time.Since(t0))
	}
	p50, _ := quantiles(lat)
	return p50
}

// quantiles is p50 and p99 of d in milliseconds (d is sorted).
func quantiles(d []time.Duration) (p50, p99 float64) {
	slices.Sort(d)
	at := func(q float64) float64 { return float64(d[int(q*float64(len(d)-1))]) / float64(time.Millisecond) }
	return at(0.50), at(0.99)
}

// cpuSample is the CPU time of this process (the runner) and of its children it has
// reaped (runc and other helpers), user and system.
type cpuSample struct{ selfUser, selfSys, kidsUser, kidsSys time.Duration }

func (c cpuSample) total() time.Duration { return c.selfUser + c.selfSys + c.kidsUser + c.kidsSys }

func (c cpuSample) sub(o cpuSample) cpuSample {
	return cpuSample{c.selfUser - o.selfUser, c.selfSys - o.selfSys, c.kidsUser - o.kidsUser, c.kidsSys - o.kidsSys}
}

// cpuUsed is the CPU time of this process and of its children it has reaped.
func cpuUsed() cpuSample {
	var self, kids unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &self)
	_ = unix.Getrusage(unix.RUSAGE_CHILDREN, &kids)
	tv := func(t unix.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return cpuSample{tv(self.Utime), tv(self.Stime), tv(kids.Utime), tv(kids.Stime)}
}

// densityProfiles writes CPU profiles of this process (the runner) over the 2nd and
// the last tenth of the creates to BENCH_DENSITY_PROFILE-early.prof and -late.prof when
// that is set (n ≥ 100), to compare where a create's runner CPU goes as the host fills.
// The early one leaves out the measurements made at 10 sandboxes (at n < 110 the 2nd
// tenth starts there: it starts at afterPause).
type densityProfiles struct {
	prefix string
	n      int
	f      *os.File
	err    error // the first failure to start one; the caller fails on it
}

func startDensityProfiles(b testing.TB, n int) *densityProfiles {
	p := &densityProfiles{prefix: os.Getenv("BENCH_DENSITY_PROFILE"), n: n}
	if n < 100 {
		p.prefix = ""
	}
	b.Cleanup(p.stop)
	return p
}

// at is called (under the caller's lock) when the done-th create has finished; it
// never fails the benchmark itself (it runs on a worker goroutine): see err.
func (p *densityProfiles) at(done int) {
	if p.prefix == "" {
		return
	}
	switch done {
	case p.n / 10:
		if done > 10 { // else at afterPause
			p.start(p.prefix + "-early.prof")
		}
	case p.n - p.n/10:
		p.start(p.prefix + "-late.prof")
	case 2 * p.n / 10, p.n:
		p.stop()
	}
}

// afterPause is called when the measurements at 10 sandboxes are done, before the
// next create.
func (p *densityProfiles) afterPause() {
	if p.prefix != "" && p.n/10 == 10 {
		p.start(p.prefix + "-early.prof")
	}
}

func (p *densityProfiles) start(name string) {
	if p.err != nil || p.f != nil {
		return
	}
	f, err := os.Create(name)
	if err != nil {
		p.err = err
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		p.err = fmt.Errorf("CPU profile %s: %w", name, err) // e.g. -cpuprofile given as well
		return
	}
	p.f = f
}

// stop ends the profile being written, if any.
func (p *densityProfiles) stop() {
	if p.f != nil {
		pprof.StopCPUProfile()
		_ = p.f.Close()
		p.f = nil
	}
}

// TestDensityProfiles: at n < 110 the early profile starts after the measurements at 10
// sandboxes, not before them; a profile that cannot start is an error for the caller
// (at runs on a worker goroutine, where failing the benchmark would hang it).
func TestDensityProfiles(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "p")
	t.Setenv("BENCH_DENSITY_PROFILE", prefix)
	p := startDensityProfiles(t, 100)
	for i := 1; i <= 10; i++ {
		p.at(i)
	}
	if p.f != nil {
		t.Fatal("the early profile started before the measurements at 10")
	}
	p.afterPause()
	if p.f == nil || p.err != nil {
		t.Fatalf("no early profile after the pause: %v", p.err)
	}
	for i := 11; i <= 20; i++ {
		p.at(i)
	}
	if p.f != nil {
		t.Fatal("the early profile still runs after the 2nd tenth")
	}
	if st, err := os.Stat(prefix + "-early.prof"); err != nil || st.Size() == 0 {
		t.Fatalf("early profile: %v", err)
	}

	if err := pprof.StartCPUProfile(io.Discard); err != nil {
		t.Fatal(err)
	}
	defer pprof.StopCPUProfile()
	q := startDensityProfiles(t, 200)
	q.at(20)
	if q.err == nil || q.f != nil {
		t.Fatalf("a profile that cannot start: err %v, running %v", q.err, q.f != nil)
	}
}

// cpuMark is the CPU used so far at a moment: the host's (all CPUs), this process's and
// its reaped children's, and the sandboxes' cgroups'.
type cpuMark struct {
	at        time.Time
	host      hostCPUTimes
	runner    cpuSample
	sandboxes time.Duration
}

func markCPU(at time.Time) cpuMark {
	return cpuMark{at: at, host: hostCPU(), runner: cpuUsed(), sandboxes: cgroupCPU(env.CgroupParent)}
}

// splitCPU is where the host's CPU went from a to b, over creates creates.
func splitCPU(a, b cpuMark, creates int) hostSplit {
	secs := b.at.Sub(a.at).Seconds()
	if secs <= 0 || creates <= 0 || a.at.IsZero() {
		return hostSplit{creates: max(creates, 1), secs: 1}
	}
	rate := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / secs }
	h := hostSplit{creates: creates, secs: secs,
		busy:      rate(b.host.busy - a.host.busy),
		idle:      rate(b.host.idle - a.host.idle),
		runner:    rate(b.runner.sub(a.runner).total()),
		sandboxes: rate(b.sandboxes - a.sandboxes),
	}
	h.other = h.busy - h.runner - h.sandboxes
	return h
}

// hostCPUTimes is the host's CPU time over all CPUs since boot: busy (user, nice,
// system, irq, softirq, steal) and idle (idle, iowait).
type hostCPUTimes struct{ busy, idle time.Duration }

func hostCPU() hostCPUTimes {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostCPUTimes{}
	}
	t, _ := parseProcStat(data)
	return t
}

// parseProcStat reads /proc/stat's "cpu" line (in USER_HZ, 100 on Linux: clock_t units
// of 10 ms).
func parseProcStat(data []byte) (hostCPUTimes, error) {
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return hostCPUTimes{}, fmt.Errorf("/proc/stat: no cpu line: %q", line)
	}
	var v [8]int64 // user nice system idle iowait irq softirq steal
	for i := range v {
		if 1+i >= len(f) {
			break
		}
		n, err := strconv.ParseInt(f[1+i], 10, 64)
		if err != nil {
			return hostCPUTimes{}, fmt.Errorf("/proc/stat field %d: %w", i+1, err)
		}
		v[i] = n
	}
	tick := 10 * time.Millisecond
	return hostCPUTimes{
		busy: time.Duration(v[0]+v[1]+v[2]+v[5]+v[6]+v[7]) * tick,
		idle: time.Duration(v[3]+v[4]) * tick,
	}, nil
}

// hostThreads is the number of threads on the host (/proc/loadavg's "running/total").
func hostThreads() int {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	n, _ := parseLoadavgThreads(data)
	return n
}

func parseLoadavgThreads(data []byte) (int, error) {
	f := strings.Fields(string(data))
	if len(f) < 4 {
		return 0, fmt.Errorf("/proc/loadavg: %q", data)
	}
	_, total, ok := strings.Cut(f[3], "/")
	if !ok {
		return 0, fmt.Errorf("/proc/loadavg field 4: %q", f[3])
	}
	return strconv.Atoi(total)
}

// cgroupTasks is the number of tasks (threads) in the cgroup parent's tree (the pids
// controller's pids.current, cgroup v1 or v2), or 0.
func cgroupTasks(parent string) int {
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/pids", parent, "pids.current"),
		filepath.Join("/sys/fs/cgroup", parent, "pids.current"),
		filepath.Join("/sys/fs/cgroup/unified", parent, "pids.current"),
	} {
		if data, err := os.ReadFile(p); err == nil {
			n, _ := strconv.Atoi(strings.TrimSpace(string(data)))
			return n
		}
	}
	return 0
}

// openFDs is the number of this process's open descriptors.
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(ents)
}

// TestDensityHostCPU: the host CPU split reads /proc/stat's cpu line (busy and idle
// apart), /proc/loadavg's thread total, and divides a stretch's CPU by its seconds.
func TestDensityHostCPU(t *testing.T) {
	h, err := parseProcStat([]byte("cpu  100 5 50 1000 20 3 2 1 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (100 + 5 + 50 + 3 + 2 + 1) * 10 * time.Millisecond; h.busy != want {
		t.Errorf("busy %v, want %v", h.busy, want)
	}
	if want := (1000 + 20) * 10 * time.Millisecond; h.idle != want {
		t.Errorf("idle %v, want %v", h.idle, want)
	}
	if _, err := parseProcStat([]byte("intr 1 2 3\n")); err == nil {
		t.Error("no cpu line: no error")
	}
	if n, err := parseLoadavgThreads([]byte("0.50 0.40 0.30 3/9123 4567\n")); err != nil || n != 9123 {
		t.Errorf("loadavg threads %d, %v; want 9123", n, err)
	}
	if _, err := parseLoadavgThreads([]byte("0.50 0.40\n")); err == nil {
		t.Error("short loadavg: no error")
	}
	t0 := time.Unix(1000, 0)
	a := cpuMark{at: t0, host: hostCPUTimes{busy: time.Second, idle: time.Second},
		runner: cpuSample{selfUser: 100 * time.Millisecond}, sandboxes: 50 * time.Millisecond}
	b := cpuMark{at: t0.Add(2 * time.Second), host: hostCPUTimes{busy: 4 * time.Second, idle: 2 * time.Second},
		runner: cpuSample{selfUser: 900 * time.Millisecond, kidsSys: 1200 * time.Millisecond}, sandboxes: 650 * time.Millisecond}
	s := splitCPU(a, b, 40)
	// 3 s busy, 1 s idle, runner 2 s, sandboxes 0.6 s over 2 s.
	if s.busy != 1500 || s.idle != 500 || s.runner != 1000 || s.sandboxes != 300 || s.other != 200 {
		t.Errorf("split %+v", s)
	}
	if z := splitCPU(cpuMark{}, b, 40); z.busy != 0 || z.secs != 1 {
		t.Errorf("from an unset mark: %+v", z)
	}
	if got := cgroupTasks("no-such-cgroup-parent-for-this-test"); got != 0 {
		t.Errorf("tasks of a missing cgroup: %d", got)
	}
	if openFDs() < 3 {
		t.Errorf("open descriptors %d", openFDs())
	}
}
