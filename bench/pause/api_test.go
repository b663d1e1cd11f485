package pausebench

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// BenchmarkPauseAPI measures what a user of the API sees of an idle Python gVisor
// sandbox, and where the time goes: resume (call → returns), fork ×1 of the running
// source (call → returns, and call → the fork answered an exec) and fork ×10 (wall, all
// answered), p50/p99, each next to its floor measured in the same run: the runner's own
// time for the same operation (its "steps" log line, total), which is the backend plus
// the runner's bookkeeping, without the API call, the gateway and the exec. The
// breakdown is the p50 of each step over the rounds, from the span lines the gateway
// and the runner log (internal/span): gateway steps, runner steps, and the local
// backend's steps inside them (concurrent forks' steps are summed, as sum/count).
//
// Rounds: -benchtime Nx (N execs, resumes and forks ×1, max(1, N/5) forks ×10).
//
// A/B: with $SANDBOXD_BIN_B (and optionally $SANDBOXD_RUNSC_B) a second server runs that
// binary (runsc) beside the first ($SANDBOXD_BIN, bin/sandboxd by default), every
// measure's rounds alternate between the two, and B/A of each p50 is printed: on a
// machine shared with other work, both see the same load.
func BenchmarkPauseAPI(b *testing.B) {
	if b.N == 1 && benchN() > 1 {
		return
	}
	reps := b.N
	fewer := max(1, b.N/5)
	forkN := 10
	if b.N < 10 {
		forkN = 3
	}
	runs := []*apiRun{{name: "A", s: dev(b)}}
	if sb := devB(b); sb != nil {
		runs = append(runs, &apiRun{name: "B", s: sb})
	}
	for _, r := range runs {
		r.idle, _ = r.s.python(b, 0, "")
	}
	// Each measure's rounds alternate between the servers (A/B comparison).
	each := func(n int, f func(r *apiRun)) {
		for i := range n {
			for j := range runs {
				f(runs[(i+j)%len(runs)])
			}
		}
	}
	ctx := context.Background()
	release := true
	each(reps, func(r *apiRun) {
		t0 := time.Now()
		if _, err := r.s.exec(ctx, r.idle, "true"); err != nil {
			b.Fatal(err)
		}
		r.execs = append(r.execs, time.Since(t0))
	})
	each(reps, func(r *apiRun) {
		if _, err := r.s.c.Pause(ctx, r.idle, sandbox.PauseOptions{ReleaseResources: &release}); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if _, err := r.s.c.Resume(ctx, r.idle); err != nil {
			b.Fatal(err)
		}
		r.resumes = append(r.resumes, time.Since(t0))
		if _, err := r.s.exec(ctx, r.idle, "true"); err != nil {
			b.Fatal(err)
		}
		r.resumeExecs = append(r.resumeExecs, time.Since(t0))
	})
	each(reps, func(r *apiRun) {
		call, all := r.s.forkTimed(b, r.idle, 1)
		r.fork1Calls, r.fork1s = append(r.fork1Calls, call), append(r.fork1s, all)
	})
	each(fewer, func(r *apiRun) {
		_, all := r.s.forkTimed(b, r.idle, forkN)
		r.forkNs = append(r.forkNs, all)
	})
	b.StopTimer()

	var tb strings.Builder
	for _, r := range runs {
		r.report(&tb, b.N, forkN)
	}
	if len(runs) == 2 {
		a, bb := runs[0], runs[1]
		fmt.Fprintf(&tb, "A/B (rounds alternated in one run): B/A of p50: resume %.2f, resume → exec %.2f, fork ×1 → exec %.2f, fork ×%d %.2f\n",
			ratio(bb.resumes, a.resumes), ratio(bb.resumeExecs, a.resumeExecs), ratio(bb.fork1s, a.fork1s), forkN, ratio(bb.forkNs, a.forkNs))
	}
	fmt.Print(tb.String())
	r := runs[len(runs)-1]
	b.ReportMetric(ms(pct(r.execs, 50)), "exec-p50-ms")
	b.ReportMetric(ms(pct(r.resumes, 50)), "resume-p50-ms")
	b.ReportMetric(ms(pct(r.resumes, 99)), "resume-p99-ms")
	b.ReportMetric(ms(pct(r.fork1s, 50)), "fork1-p50-ms")
	b.ReportMetric(ms(pct(r.fork1s, 99)), "fork1-p99-ms")
	b.ReportMetric(ms(pct(r.forkNs, 50)), fmt.Sprintf("fork%d-wall-p50-ms", forkN))
}

func ratio(b, a []time.Duration) float64 { return ms(pct(b, 50)) / ms(pct(a, 50)) }

// apiRun is BenchmarkPauseAPI's measures on one server.
type apiRun struct {
	name                                                    string
	s                                                       *server
	idle                                                    string
	execs, resumes, resumeExecs, fork1Calls, fork1s, forkNs []time.Duration
}

// report prints r's table: each measure next to its floor (the runner's own time, from
// its span lines), and the per-step breakdowns.
func (r *apiRun) report(tb *strings.Builder, n, forkN int) {
	lines := r.s.spanLines(r.idle)
	runnerResume := lines.totals("sandbox resumed", false)
	runnerFork := lines.totalsCount("sandbox fork steps", 1)
	runnerForkN := lines.totalsCount("sandbox fork steps", forkN)
	fmt.Fprintf(tb, "pause API [%s: %s], idle %s, gvisor, -benchtime %dx (floor: the runner's own time, same run):\n", r.name, r.s.bin, pyImage, n)
	row := func(what string, d []time.Duration, floor []time.Duration, target string) {
		fmt.Fprintf(tb, "  %-38s %s", what, p5099(d))
		if len(floor) > 0 {
			fmt.Fprintf(tb, "   floor p50 %5.0f ms  ratio %.2fx", ms(pct(floor, 50)), ms(pct(d, 50))/ms(pct(floor, 50)))
		}
		fmt.Fprintf(tb, "  %s\n", target)
	}
	row("exec on the running sandbox", r.execs, nil, "")
	row("resume (API returns)", r.resumes, runnerResume, fmt.Sprintf("p50 ≤ 150 ms: %s", verdict(ms(pct(r.resumes, 50)) <= 150)))
	row("resume → first exec answered", r.resumeExecs, runnerResume, "")
	row("fork ×1 (API returns)", r.fork1Calls, runnerFork, "")
	row("fork ×1 → answers exec", r.fork1s, runnerFork, fmt.Sprintf("p50 ≤ 250 ms: %s", verdict(ms(pct(r.fork1s, 50)) <= 250)))
	target := ""
	if forkN == 10 {
		target = fmt.Sprintf("≤ 1500 ms: %s", verdict(ms(pct(r.forkNs, 50)) <= 1500))
	}
	row(fmt.Sprintf("fork ×%d → all answer (wall)", forkN), r.forkNs, runnerForkN, target)
	for _, c := range []struct {
		what, msg string
		count     int
	}{{"resume", "sandbox resumed", 0}, {"fork ×1", "sandbox fork", 1}, {fmt.Sprintf("fork ×%d", forkN), "sandbox fork", forkN}} {
		fmt.Fprintf(tb, "  breakdown of %s (p50 per step over the rounds):\n", c.what)
		for _, st := range lines.breakdown(c.msg, c.count) {
			fmt.Fprintf(tb, "    %-52s %s\n", st.name, st.value)
		}
	}
}

// forkTimed makes n forks of id: call → returned, and call → every fork answered an
// exec. The forks are stopped untimed.
func (s *server) forkTimed(b *testing.B, id string, n int) (call, all time.Duration) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	forks, err := s.c.Fork(ctx, id, n, sandbox.ForkOptions{})
	call = time.Since(t0)
	ids := make([]string, len(forks))
	for i, f := range forks {
		ids[i] = f.ID()
	}
	defer s.stopAll(b, ids...)
	if err != nil {
		b.Fatalf("fork %s ×%d: %v", id, n, err)
	}
	errs := make(chan error, n)
	for _, f := range ids {
		go func() {
			_, err := s.exec(ctx, f, "true")
			errs <- err
		}()
	}
	for range ids {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	return call, time.Since(t0)
}

// spanLine is one logged span record: its message, whether the gateway logged it, its
// count (forks), and its steps.
type spanLine struct {
	msg     string
	gateway bool
	count   int
	steps   map[string]time.Duration
	order   []string
}

type spanLines []spanLine

var (
	stepsRE = regexp.MustCompile(`steps="([^"]*)"`)
	msgRE   = regexp.MustCompile(`msg="([^"]*)"`)
	countRE = regexp.MustCompile(` (?:count|asked)=([0-9]+)`)
)

// spanLines are the span lines of the server's log about sandbox id.
func (s *server) spanLines(id string) spanLines {
	data, _ := os.ReadFile(s.log)
	var out spanLines
	for line := range strings.SplitSeq(string(data), "\n") {
		m := stepsRE.FindStringSubmatch(line)
		if m == nil || !strings.Contains(line, "sandbox="+id) {
			continue
		}
		sl := spanLine{steps: map[string]time.Duration{}, gateway: strings.Contains(m[1], "gateway:")}
		if mm := msgRE.FindStringSubmatch(line); mm != nil {
			sl.msg = mm[1]
		}
		if mm := countRE.FindStringSubmatch(line); mm != nil {
			fmt.Sscan(mm[1], &sl.count)
		}
		for f := range strings.FieldsSeq(m[1]) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				continue
			}
			v, n, _ := strings.Cut(v, "/")
			d, err := time.ParseDuration(v)
			if err != nil {
				continue
			}
			if n != "" {
				k += " (sum/" + n + ")"
			}
			if k == "total" {
				k = "runner total"
				if sl.gateway {
					k = "gateway total"
				}
			}
			sl.steps[k] = d
			sl.order = append(sl.order, k)
		}
		out = append(out, sl)
	}
	return out
}

func (l spanLines) match(msg string, count int) []spanLine {
	var out []spanLine
	for _, sl := range l {
		if strings.HasPrefix(sl.msg, msg) && (count == 0 || sl.count == count) {
			out = append(out, sl)
		}
	}
	return out
}

// totals are the runner's (gateway false) totals of the lines of msg.
func (l spanLines) totals(msg string, gateway bool) []time.Duration {
	var out []time.Duration
	for _, sl := range l.match(msg, 0) {
		if sl.gateway == gateway {
			out = append(out, sl.steps["runner total"])
		}
	}
	return out
}

func (l spanLines) totalsCount(msg string, count int) []time.Duration {
	var out []time.Duration
	for _, sl := range l.match(msg, count) {
		if !sl.gateway {
			out = append(out, sl.steps["runner total"])
		}
	}
	return out
}

type stepValue struct{ name, value string }

// breakdown is the p50 of each step of the lines of msg (and count), gateway's first.
func (l spanLines) breakdown(msg string, count int) []stepValue {
	var order []string
	vals := map[string][]time.Duration{}
	lines := l.match(msg, count)
	slices.SortStableFunc(lines, func(a, b spanLine) int {
		if a.gateway == b.gateway {
			return 0
		}
		if a.gateway {
			return -1
		}
		return 1
	})
	for _, sl := range lines {
		for _, k := range sl.order {
			if _, ok := vals[k]; !ok {
				order = append(order, k)
			}
			vals[k] = append(vals[k], sl.steps[k])
		}
	}
	var out []stepValue
	for _, k := range order {
		out = append(out, stepValue{k, fmt.Sprintf("%7.1f ms (n=%d)", ms(pct(vals[k], 50)), len(vals[k]))})
	}
	return out
}
