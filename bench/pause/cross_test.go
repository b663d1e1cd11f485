package pausebench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/blob/s3"
	"github.com/sandboxd/sandboxd/internal/blob/s3/s3test"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/testenv"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// Across runners: the same idle gVisor Python sandbox resumed on its own runner (the
// floor) and on the other one (export to the blob store, import there), and forked once
// onto the other runner. Two runners need two stacks: unlike BenchmarkPauseResumeFork
// (a `sandboxd dev` process), this benchmark runs them in its own process (each its own
// bridge, subnet and cgroup parent, as test/e2e's two-runner tests do) behind an
// in-process gateway with a SQLite index, both with one SeaweedFS bucket
// (internal/blob/s3/s3test) as their blob store; the Go SDK drives it over h2c. It skips
// without root, runsc or SeaweedFS (SANDBOXD_REQUIRE_S3=1 makes the last a failure).

// allowGVisor is every runner's policy.
type allowGVisor struct{}

func (allowGVisor) Policy(context.Context, string) ([]byte, int64, error) {
	return []byte(`{"constraints": {"security": {"allowed_runtime_classes": ["runc", "gvisor"]}}}`), 1, nil
}

// crossSetup is the two runners behind one gateway, and an SDK client of it.
type crossSetup struct {
	env    *stacktest.Env
	stacks map[string]*stack.Stack
	c      *sandbox.Client
}

func startCrossSetup(b *testing.B) *crossSetup {
	b.Helper()
	testenv.RequireRoot(b, "the runners run containers")
	if local.FindRunsc() == "" {
		b.Skip("runsc not found (run `make runsc`, or set $SANDBOXD_RUNSC): no gvisor runtime class")
	}
	srv := s3test.Start(b) // skips without SeaweedFS (unless SANDBOXD_REQUIRE_S3=1)
	bucket := srv.Bucket(b)
	blobs, err := s3.New(context.Background(), bucket)
	if err != nil {
		b.Fatal(err)
	}
	env, err := stacktest.Setup("pcross")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(env.Close)
	x := &crossSetup{env: env, stacks: map[string]*stack.Stack{}}
	var handles []runner.Handle
	for i, id := range []string{"r1", "r2"} {
		dir := b.TempDir()
		cfg := env.StackConfigN(dir, i+1) // not stack 0: its subnet is the dev server's
		cfg.Blobs, cfg.BlobConfig = blobs, blobconfig.Config{S3: &bucket}
		s, err := stack.NewLocal(context.Background(), cfg)
		if err != nil {
			b.Fatalf("start stack %s: %v", id, err)
		}
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			for _, sb := range s.Runner.List() {
				if _, err := s.Runner.Delete(sb.ID, 0); err == nil {
					_, _ = s.Runner.WaitTerminal(ctx, sb.ID)
				}
			}
			s.Close()
			if left := stacktest.Leftovers(dir); len(left) > 0 {
				b.Errorf("runner %s left behind: %q", id, left)
				stacktest.ForceClean(dir)
			}
			if err := s.Network.Cleanup(); err != nil {
				b.Errorf("network cleanup: %v", err)
			}
			if left := stacktest.RemoveCgroupParent(cfg.CgroupParent); len(left) > 0 {
				b.Errorf("runner %s left cgroups: %q", id, left)
			}
		})
		x.stacks[id] = s
		handles = append(handles, runner.NewLocal(id, s.Runner))
	}
	st, err := store.Open(context.Background(), filepath.Join(b.TempDir(), "sandboxd.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	if _, err := st.Orgs().Create(context.Background(), store.Org{ID: "org-a"}); err != nil {
		b.Fatal(err)
	}
	keys, err := auth.OpenKeyring(filepath.Join(b.TempDir(), "keys.json"))
	if err != nil {
		b.Fatal(err)
	}
	key, _, err := keys.Create("org-a", auth.RoleUser, "")
	if err != nil {
		b.Fatal(err)
	}
	g, err := gateway.New(gateway.Config{Auth: keys, Runners: handles, Policies: allowGVisor{},
		Index: st.Sandboxes(), Orgs: st.Orgs(), Blobs: blobs, BlobConfig: blobconfig.Config{S3: &bucket}})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(g.Handler())
	hs.EnableHTTP2 = true
	hs.Config.Protocols = new(http.Protocols)
	hs.Config.Protocols.SetHTTP1(true)
	hs.Config.Protocols.SetUnencryptedHTTP2(true)
	hs.Start()
	b.Cleanup(hs.Close)
	if x.c, err = sandbox.New(hs.URL, key, sandbox.WithDataPlane(sandbox.DataPlaneGateway)); err != nil {
		b.Fatal(err)
	}
	return x
}

// idle creates an idle gVisor Python sandbox on runner r and returns its ID once it has
// answered an exec.
func (x *crossSetup) idle(b *testing.B, r string) string {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sp := sandbox.Spec{Image: x.env.Python(), Command: "python3", Args: []string{"-c", workload, "0"},
		RunnerIDs: []string{r}, Tags: []string{"pause-bench"}}.Proto()
	sp.RuntimeClass = local.GVisorClass
	sb, err := x.c.CreateProto(ctx, sp)
	if err != nil {
		b.Fatal(err)
	}
	if err := x.waitExec(ctx, sb.ID()); err != nil {
		b.Fatal(err)
	}
	return sb.ID()
}

// waitExec runs `cat /tmp/ready` in id until the workload wrote it ("0").
func (x *crossSetup) waitExec(ctx context.Context, id string) error {
	for {
		// The raw unary Exec, as BenchmarkPauseResumeFork's: it waits on the server until
		// the sandbox runs.
		res, err := x.c.Service().Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"cat", "/tmp/ready"}}))
		if err == nil && res.Msg.GetExitCode() == 0 && string(res.Msg.GetStdout()) == "0" {
			return nil
		}
		if ctx.Err() != nil {
			if err == nil {
				err = fmt.Errorf("it says %q", res.Msg.GetStdout())
			}
			return fmt.Errorf("sandbox %s: the workload is not ready: %w", id, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// resume pauses id (resources released) and resumes it on runners (none: in place):
// call → returned, call → the first exec answered; the runner it runs on after.
func (x *crossSetup) resume(b *testing.B, id string, runners ...string) (call, exec time.Duration, res sandbox.ResumeResult) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	release := true
	if _, err := x.c.Pause(ctx, id, sandbox.PauseOptions{ReleaseResources: &release}); err != nil {
		b.Fatalf("pause %s: %v", id, err)
	}
	t0 := time.Now()
	res, err := x.c.ResumeWith(ctx, id, sandbox.ResumeOptions{RunnerIDs: runners})
	call = time.Since(t0)
	if err != nil {
		b.Fatalf("resume %s on %v: %v", id, runners, err)
	}
	if err := x.waitExec(ctx, id); err != nil {
		b.Fatal(err)
	}
	return call, time.Since(t0), res
}

// fork forks id once onto runner r: call → the fork answered an exec. The fork is
// stopped untimed.
func (x *crossSetup) fork(b *testing.B, id, r string) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	forks, err := x.c.Fork(ctx, id, 1, sandbox.ForkOptions{RunnerIDs: []string{r}})
	if err != nil {
		b.Fatalf("fork %s onto %s: %v", id, r, err)
	}
	f := forks[0]
	if err := x.waitExec(ctx, f.ID()); err != nil {
		b.Fatal(err)
	}
	d := time.Since(t0)
	if got := f.Info().RunnerID; got != r {
		b.Fatalf("fork %s of %s on %q, want %s", f.ID(), id, got, r)
	}
	if err := f.Stop(ctx, 0); err != nil {
		b.Errorf("stop fork %s: %v", f.ID(), err)
	}
	return d
}

// BenchmarkPauseCross: resume on the own runner (the floor), resume on the other runner
// (each round moves the sandbox to the runner it is not on), and fork ×1 onto the other
// runner, of an idle gVisor Python sandbox; p50 and p99 of each.
func BenchmarkPauseCross(b *testing.B) {
	if b.N == 1 && benchN() > 1 {
		return // the rounds are all in the run with the N of -benchtime Nx
	}
	x := startCrossSetup(b)
	reps := b.N
	other := map[string]string{"r1": "r2", "r2": "r1"}
	// One untimed sandbox first: it pulls the image on both runners.
	for _, r := range []string{"r1", "r2"} {
		id := x.idle(b, r)
		if err := x.c.Sandbox(id).Stop(context.Background(), 0); err != nil {
			b.Fatal(err)
		}
	}
	id := x.idle(b, "r1")
	on := "r1"
	var inPlace, inPlaceExec, moved, movedExec, fork1 []time.Duration
	for range reps {
		call, exec, res := x.resume(b, id)
		if res.RunnerID != on || res.MovedFrom != "" {
			b.Fatalf("resume in place: %+v, want on %s, not moved", res, on)
		}
		inPlace, inPlaceExec = append(inPlace, call), append(inPlaceExec, exec)
	}
	for range reps {
		to := other[on]
		call, exec, res := x.resume(b, id, to)
		if res.RunnerID != to || res.MovedFrom != on {
			b.Fatalf("resume on %s: %+v, want moved from %s", to, res, on)
		}
		on = to
		moved, movedExec = append(moved, call), append(movedExec, exec)
	}
	for range reps {
		fork1 = append(fork1, x.fork(b, id, other[on]))
	}
	b.StopTimer()

	var tb strings.Builder
	fmt.Fprintf(&tb, "pause/resume/fork across runners, gvisor, idle python (runsc %s), in-process runners, SeaweedFS blob store, -benchtime %dx:\n", local.RunscVersion, b.N)
	for _, r := range []row{
		{"floor: resume on its runner (API returns)", p5099(inPlace), ""},
		{"floor: resume on its runner → first exec", p5099(inPlaceExec), ""},
		{"resume on the other runner (API returns)", p5099(moved), fmt.Sprintf("%.1fx the floor (p50)", ms(pct(moved, 50))/ms(pct(inPlace, 50)))},
		{"resume on the other runner → first exec", p5099(movedExec), ""},
		{"fork ×1 onto the other runner → exec", p5099(fork1), ""},
	} {
		fmt.Fprintf(&tb, "  %-44s %-40s %s\n", r.what, r.value, r.target)
	}
	fmt.Print(tb.String())
	b.ReportMetric(ms(pct(inPlace, 50)), "resume-in-place-p50-ms")
	b.ReportMetric(ms(pct(moved, 50)), "resume-moved-p50-ms")
	b.ReportMetric(ms(pct(movedExec, 50)), "resume-moved-exec-p50-ms")
	b.ReportMetric(ms(pct(fork1, 50)), "fork1-other-runner-p50-ms")
}
