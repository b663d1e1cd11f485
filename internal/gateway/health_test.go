package gateway

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/health"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// failingRunner is an acceptingRunner whose creates fail as a broken runtime's do while
// failing is set: sync (the RPC answers INTERNAL) or async (accepted, then FAILED with
// BackendError).
type failingRunner struct {
	acceptingRunner
	mu      sync.Mutex
	failing bool
	async   bool
	creates int
	// reason and message of async failures (default: BackendError).
	reason, message string
}

func (r *failingRunner) set(failing, async bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failing, r.async = failing, async
}

func (r *failingRunner) Create(ctx context.Context, req runner.CreateRequest) (runner.Sandbox, error) {
	r.mu.Lock()
	r.creates++
	failing, async := r.failing, r.async
	reason, message := r.reason, r.message
	r.mu.Unlock()
	if reason == "" {
		reason, message = runner.ReasonBackendError, "runc: container init failed"
	}
	if failing && !async {
		return runner.Sandbox{}, connect.NewError(connect.CodeInternal, errors.New("runc create: exec failed"))
	}
	sb, err := r.acceptingRunner.Create(ctx, req)
	if err == nil && failing {
		r.acceptingRunner.mu.Lock()
		sb.State, sb.Reason, sb.Message = runner.StateFailed, reason, message
		r.acceptingRunner.got[sb.ID] = sb
		r.acceptingRunner.mu.Unlock()
		sb.State, sb.Reason, sb.Message = runner.StateCreating, "", "" // the RPC answers before the start fails
	}
	return sb, err
}

func (r *failingRunner) run(id string) {
	r.acceptingRunner.mu.Lock()
	defer r.acceptingRunner.mu.Unlock()
	sb := r.acceptingRunner.got[id]
	sb.State, sb.StartedAt = runner.StateRunning, time.Now()
	r.acceptingRunner.got[id] = sb
}

func (r *failingRunner) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.creates
}

type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *stepClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *stepClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newHealthGateway(t *testing.T, clk *stepClock, cfg health.Config, runners ...runner.Handle) *Server {
	t.Helper()
	return newHealthGatewayWith(t, clk, cfg, nil, runners...)
}

// newHealthGatewayWith is newHealthGateway with mod applied to the gateway's Config.
func newHealthGatewayWith(t *testing.T, clk *stepClock, cfg health.Config, mod func(*Config), runners ...runner.Handle) *Server {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, org := range []string{testOrg, "org-b"} {
		if _, err := st.Orgs().Create(t.Context(), store.Org{ID: org, Name: org}); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := auth.OpenKeyring(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	gc := Config{Auth: keys, Runners: runners, Index: st.Sandboxes(), Orgs: st.Orgs(), Health: cfg, healthClock: clk.now}
	if mod != nil {
		mod(&gc)
	}
	s, err := New(gc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func asOrgID(org string) context.Context {
	return auth.WithPrincipal(context.Background(), auth.Principal{KeyID: "k-" + org, Org: org, Role: auth.RoleUser})
}

func createOnRunners(ctx context.Context, s *Server, pins ...string) (*sandboxv1.Sandbox, error) {
	res, err := s.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Image: "busybox:latest"}}, RunnerIds: pins}}}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// TestRunnerHealthPlacement: a runner whose creates keep failing (INTERNAL from the
// runtime) is placed after a healthy one once degraded, not at all once quarantined (a
// create pinned to it is refused, retryably, with UNAVAILABLE
// CWSANDBOX_RUNNER_UNAVAILABLE and RetryInfo naming the quarantine, without asking it), and visible in discovery; after the cooldown one probe
// create goes to it, and its sandbox reaching RUNNING heals it.
func TestRunnerHealthPlacement(t *testing.T) {
	clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	good := &acceptingRunner{id: "good"}
	bad := &failingRunner{acceptingRunner: acceptingRunner{id: "bad"}}
	bad.set(true, false)
	s := newHealthGateway(t, clk, health.Config{MinOrgs: 1}, good, bad)
	ctx := asOrgID(testOrg)

	for i := range 3 {
		if _, err := createOnRunners(ctx, s, "bad"); connect.CodeOf(err) != connect.CodeInternal {
			t.Fatalf("failing create %d: %v", i, err)
		}
	}
	if v := s.health.Global("bad"); v.State != health.Degraded {
		t.Fatalf("after 3 failures: %+v", v)
	}
	// Degraded: every unpinned create goes to the healthy runner, whatever the load.
	before := bad.count()
	for i := range 6 {
		sb, err := createOnRunners(ctx, s)
		if err != nil || runnerOfSandbox(s, sb) != "good" {
			t.Fatalf("create %d on a degraded pair: %v %v", i, runnerOfSandbox(s, sb), err)
		}
	}
	if bad.count() != before {
		t.Fatal("the degraded runner was asked while a healthy one had room")
	}
	// Three more failures, now async (accepted, then FAILED for a runner-side reason,
	// seen when the caller looks): quarantined.
	bad.set(true, true)
	for i := range 3 {
		sb, err := createOnRunners(ctx, s, "bad")
		if err != nil {
			t.Fatalf("async failing create %d: %v", i, err)
		}
		if _, err := s.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: sb.GetSandboxId()})); err != nil {
			t.Fatal(err)
		}
	}
	v := s.health.Global("bad")
	if v.State != health.Quarantined {
		t.Fatalf("after 6 failures: %+v", v)
	}
	before = bad.count()
	_, err := createOnRunners(ctx, s, "bad")
	if apierr.Reason(err) != apierr.RunnerUnavailable || connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "quarantined until") {
		t.Fatalf("create pinned to a quarantined runner: %v", err)
	}
	if d := apierr.RetryInfo(err).GetRetryDelay().AsDuration(); d <= 0 {
		t.Fatalf("create pinned to a quarantined runner: no RetryInfo: %v", err)
	}
	if bad.count() != before {
		t.Fatal("a quarantined runner was asked")
	}
	if sb, err := createOnRunners(ctx, s); err != nil || runnerOfSandbox(s, sb) != "good" {
		t.Fatalf("unpinned create while one runner is quarantined: %v %v", runnerOfSandbox(s, sb), err)
	}
	// Discovery: healthy=false with the state and reason as tags.
	ar, err := s.GetAvailableRunner(ctx, connect.NewRequest(&sandboxv1.GetAvailableRunnerRequest{RunnerId: "bad", OrganizationId: testOrg}))
	if err != nil {
		t.Fatal(err)
	}
	if ar.Msg.GetHealthy() || !slices.Contains(ar.Msg.GetTags(), TagHealth+"quarantined") ||
		!slices.ContainsFunc(ar.Msg.GetTags(), func(s string) bool { return strings.HasPrefix(s, TagHealthReason+"quarantined until") }) {
		t.Fatalf("discovery of the quarantined runner: healthy=%v tags=%v", ar.Msg.GetHealthy(), ar.Msg.GetTags())
	}
	list, err := s.ListAvailableRunners(ctx, connect.NewRequest(&sandboxv1.ListAvailableRunnersRequest{HealthyOnly: true}))
	if err != nil || len(list.Msg.GetRunners()) != 1 || list.Msg.GetRunners()[0].GetRunnerId() != "good" {
		t.Fatalf("healthy_only discovery: %v %v", list.Msg.GetRunners(), err)
	}

	// After the cooldown: one probe create; the runner is fixed, its sandbox runs.
	clk.add(health.DefaultCooldown)
	bad.set(false, false)
	probe, err := createOnRunners(ctx, s, "bad")
	if err != nil {
		t.Fatalf("probe create: %v", err)
	}
	if _, err := createOnRunners(ctx, s, "bad"); apierr.Reason(err) != apierr.RunnerUnavailable || !strings.Contains(err.Error(), "probe") {
		t.Fatalf("second create while the probe is out: %v", err)
	}
	// A create placed before the probe went out and refused by the tracker at its turn
	// (createOn) gets the same retryable answer.
	if _, _, _, _, err := s.createOn(ctx, []placement.Candidate{{Index: 1, RunnerID: "bad"}}, testOrg, "k", nil, nil, nil); apierr.Reason(err) != apierr.RunnerUnavailable ||
		apierr.RetryInfo(err) == nil || !strings.Contains(err.Error(), "probe") {
		t.Fatalf("createOn refused by the tracker: %v", err)
	}
	bad.run(probe.GetSandboxId())
	if _, err := s.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: probe.GetSandboxId()})); err != nil {
		t.Fatal(err)
	}
	if v := s.health.Global("bad"); v.State != health.Healthy {
		t.Fatalf("after a successful probe: %+v", v)
	}
	if _, err := createOnRunners(ctx, s, "bad"); err != nil {
		t.Fatalf("create on the healed runner: %v", err)
	}
}

// TestRunnerHealthCallerFaultsDoNotCount: creates the caller's input fails (policy,
// image not found, the workload failing) leave the runner healthy; and with the default
// MinOrgs one organization's failures degrade the runner for it alone.
func TestRunnerHealthCallerFaultsDoNotCount(t *testing.T) {
	for _, tc := range []struct {
		sb   runner.Sandbox
		want health.Outcome
	}{
		{runner.Sandbox{State: runner.StateFailed, Reason: runner.ReasonImagePullFailed, Message: "image not found: docker.io/library/nope"}, health.Ignored},
		{runner.Sandbox{State: runner.StateFailed, Reason: runner.ReasonImagePullFailed, Message: "image pull unauthorized"}, health.Ignored},
		{runner.Sandbox{State: runner.StateFailed, Reason: runner.ReasonImagePullFailed, Message: "registry unreachable: registry.invalid: DNS"}, health.Ignored},
		{runner.Sandbox{State: runner.StateFailed, Reason: runner.ReasonStartError, Message: "invalid sandbox spec: bad mount"}, health.Ignored},
		{runner.Sandbox{State: runner.StateFailed, Reason: runner.ReasonStartError, Message: "runc: exec format error"}, health.Ignored},
		{runner.Sandbox{State: runner.StateFailed, Reason: runner.ReasonStartError, Message: "chdir /nope: no such file or directory"}, health.Ignored},
		{runner.Sandbox{State: runner.StateFailed, Reason: runner.ReasonStartError, Message: "exec: \"nope\": executable file not found in $PATH"}, health.Ignored},
		{runner.Sandbox{State: runner.StateFailed, Reason: "InitContainerFailed", Message: "init container exited with code 1"}, health.Ignored},
		{runner.Sandbox{State: runner.StateFailed, Reason: runner.ReasonRestartLimit}, health.Ignored},
		{runner.Sandbox{State: runner.StateFailed, Reason: runner.ReasonBackendError}, health.Failure},
		{runner.Sandbox{State: runner.StateCompleted, StartedAt: time.Now()}, health.Success},
	} {
		if got, _, final := sandboxOutcome(tc.sb); got != tc.want || !final {
			t.Errorf("%s %q: %v (final %v), want %v", tc.sb.Reason, tc.sb.Message, got, final, tc.want)
		}
	}
	ctx := context.Background()
	for _, tc := range []struct {
		err  error
		want health.Outcome
	}{
		{apierr.New(apierr.RunnerUnavailable, "gone", nil), health.Failure},
		{connect.NewError(connect.CodeDeadlineExceeded, errors.New("slow")), health.Failure},
		{connect.NewError(connect.CodeUnavailable, errors.New("connection refused")), health.Failure},
		{connect.NewError(connect.CodeInternal, errors.New("runc create")), health.Failure},
		{connect.NewError(connect.CodeUnknown, errors.New("?")), health.Failure},
		{connect.NewError(connect.CodeDataLoss, errors.New("torn")), health.Failure},
		{apierr.New(apierr.BackendUnavailable, "backend down", nil), health.Failure},
		{apierr.Invalid(apierr.PlacementRejected, "policy", nil), health.Ignored},
		{apierr.New(apierr.QuotaExceeded, "quota", nil), health.Ignored},
		{connect.NewError(connect.CodeInvalidArgument, runtime.ErrInvalidImageRef), health.Ignored},
		{connect.NewError(connect.CodeNotFound, runtime.ErrImageNotFound), health.Ignored},
	} {
		if got, _ := createOutcome(ctx, tc.err); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.err, got, tc.want)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if got, _ := createOutcome(cancelled, apierr.New(apierr.RunnerUnavailable, "gone", nil)); got != health.Ignored {
		t.Errorf("a cancelled caller's failure counted")
	}

	clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	bad := &failingRunner{acceptingRunner: acceptingRunner{id: "bad"}}
	bad.set(true, false)
	s := newHealthGateway(t, clk, health.Config{}, bad)
	for range 10 {
		_, _ = createOnRunners(asOrgID("org-b"), s)
	}
	if _, err := createOnRunners(asOrgID("org-b"), s); apierr.Reason(err) != apierr.RunnerUnavailable || apierr.RetryInfo(err) == nil {
		t.Fatalf("org-b's own creates after its 10 failures: %v", err)
	}
	bad.set(false, false)
	if _, err := createOnRunners(asOrgID(testOrg), s); err != nil {
		t.Fatalf("org-a's create on the runner org-b failed on: %v", err)
	}
}

// TestRunnerHealthCollusionDoesNotDegrade: two organizations making creates that fail
// in their own sandbox (a working directory that does not exist, an image on a registry
// that does not answer) far beyond the thresholds leave the shared runner healthy for
// everyone, and for themselves.
func TestRunnerHealthCollusionDoesNotDegrade(t *testing.T) {
	for _, tc := range []struct{ reason, message string }{
		{runner.ReasonStartError, "chdir /does/not/exist: no such file or directory"},
		{runner.ReasonImagePullFailed, "registry unreachable: attacker.invalid: dial tcp: i/o timeout"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			shared := &failingRunner{acceptingRunner: acceptingRunner{id: "shared"}, reason: tc.reason, message: tc.message}
			shared.set(true, true)
			s := newHealthGateway(t, clk, health.Config{}, shared)
			for _, org := range []string{testOrg, "org-b"} {
				ctx := asOrgID(org)
				for i := range 2 * health.DefaultQuarantineAfter {
					sb, err := createOnRunners(ctx, s)
					if err != nil {
						t.Fatalf("%s create %d: %v", org, i, err)
					}
					if _, err := s.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: sb.GetSandboxId()})); err != nil {
						t.Fatal(err)
					}
				}
			}
			if v := s.health.Global("shared"); v.State != health.Healthy {
				t.Fatalf("the shared runner after two organizations' failing starts: %+v", v)
			}
			for _, org := range []string{testOrg, "org-b", "org-c"} {
				if v := s.health.View("shared", org); v.State != health.Healthy {
					t.Fatalf("%s's view: %+v", org, v)
				}
			}
		})
	}
}

// quarantine fails creates on the runner "bad" until it is quarantined, then lets the
// cooldown pass and makes it accept creates again.
func quarantine(t *testing.T, s *Server, clk *stepClock, bad *failingRunner) {
	t.Helper()
	bad.set(true, false)
	for range health.DefaultQuarantineAfter {
		_, _ = createOnRunners(asOrgID(testOrg), s, "bad")
	}
	if v := s.health.Global("bad"); v.State != health.Quarantined {
		t.Fatalf("after %d failures: %+v", health.DefaultQuarantineAfter, v)
	}
	clk.add(health.DefaultCooldown)
	bad.set(false, false)
}

// awaitHealth waits (bounded) for the runner "bad" to reach want for everyone.
func awaitHealth(t *testing.T, s *Server, want health.State) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for s.health.Global("bad").State != want {
		if time.Now().After(deadline) {
			t.Fatalf("runner health %+v, want %s", s.health.Global("bad"), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRunnerHealthProbeJudgedUnwatched: the probe create's sandbox is judged by the
// gateway itself when nobody asks about it: its reaching RUNNING heals the runner; a
// probe still starting after the bound frees the half-open slot (the runner is probing
// again, not quarantined for the probe timeout); and Close ends the watch.
func TestRunnerHealthProbeJudgedUnwatched(t *testing.T) {
	t.Run("runs", func(t *testing.T) {
		clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		bad := &failingRunner{acceptingRunner: acceptingRunner{id: "bad"}}
		s := newHealthGatewayWith(t, clk, health.Config{MinOrgs: 1}, func(c *Config) { c.probeJudgeEvery = time.Millisecond }, bad)
		quarantine(t, s, clk, bad)
		probe, err := createOnRunners(asOrgID(testOrg), s, "bad")
		if err != nil {
			t.Fatalf("probe create: %v", err)
		}
		if v := s.health.Global("bad"); v.State != health.Quarantined {
			t.Fatalf("while the probe starts: %+v", v)
		}
		bad.run(probe.GetSandboxId()) // nobody calls GetSandbox
		awaitHealth(t, s, health.Healthy)
	})
	t.Run("fails", func(t *testing.T) {
		clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		bad := &failingRunner{acceptingRunner: acceptingRunner{id: "bad"}}
		s := newHealthGatewayWith(t, clk, health.Config{MinOrgs: 1}, func(c *Config) { c.probeJudgeEvery = time.Millisecond }, bad)
		quarantine(t, s, clk, bad)
		bad.set(true, true) // accepted, then BackendError
		if _, err := createOnRunners(asOrgID(testOrg), s, "bad"); err != nil {
			t.Fatalf("probe create: %v", err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for s.health.Global("bad").Until != clk.now().Add(2*health.DefaultCooldown) {
			if time.Now().After(deadline) {
				t.Fatalf("after a failed unwatched probe: %+v, want quarantined for %s", s.health.Global("bad"), 2*health.DefaultCooldown)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	t.Run("still starting", func(t *testing.T) {
		clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		bad := &failingRunner{acceptingRunner: acceptingRunner{id: "bad"}}
		s := newHealthGatewayWith(t, clk, health.Config{MinOrgs: 1}, func(c *Config) {
			c.probeJudgeEvery, c.probeJudgeFor = time.Millisecond, 20*time.Millisecond
		}, bad)
		quarantine(t, s, clk, bad)
		if _, err := createOnRunners(asOrgID(testOrg), s, "bad"); err != nil {
			t.Fatalf("probe create: %v", err)
		}
		awaitHealth(t, s, health.Probing) // released unjudged: the next create probes
		if _, err := createOnRunners(asOrgID(testOrg), s, "bad"); err != nil {
			t.Fatalf("next probe create: %v", err)
		}
	})
	t.Run("close", func(t *testing.T) {
		clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		bad := &failingRunner{acceptingRunner: acceptingRunner{id: "bad"}}
		s := newHealthGatewayWith(t, clk, health.Config{MinOrgs: 1}, func(c *Config) { c.probeJudgeEvery = time.Millisecond }, bad)
		quarantine(t, s, clk, bad)
		probe, err := createOnRunners(asOrgID(testOrg), s, "bad")
		if err != nil {
			t.Fatalf("probe create: %v", err)
		}
		s.Close() // returns once the watch ended
		bad.run(probe.GetSandboxId())
		if !s.pendingOf(probe.GetSandboxId()) || s.health.Global("bad").State != health.Quarantined {
			t.Fatal("the probe was judged after Close")
		}
	})
}

func runnerOfSandbox(s *Server, sb *sandboxv1.Sandbox) string {
	if sb == nil {
		return ""
	}
	rec, ok := s.index.get(context.Background(), testOrg, sb.GetSandboxId())
	if !ok {
		return ""
	}
	return s.index.runnerOf(rec)
}

// stallingRunner is an acceptingRunner whose creates wait, once started (each start
// sent on started), until release is closed (then they are accepted) or their context
// ends (a hung runner: never released).
type stallingRunner struct {
	acceptingRunner
	started chan struct{}
	release chan struct{}
	mu      sync.Mutex
	deleted []string
	ended   int // creates that returned
}

func (r *stallingRunner) endedCreates() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended
}

func (r *stallingRunner) Create(ctx context.Context, req runner.CreateRequest) (runner.Sandbox, error) {
	defer func() {
		r.mu.Lock()
		r.ended++
		r.mu.Unlock()
	}()
	r.started <- struct{}{}
	select {
	case <-r.release:
		return r.acceptingRunner.Create(ctx, req)
	case <-ctx.Done():
		return runner.Sandbox{}, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
}

func (r *stallingRunner) Delete(ctx context.Context, id string, grace time.Duration) (runner.Sandbox, error) {
	r.mu.Lock()
	r.deleted = append(r.deleted, id)
	r.mu.Unlock()
	return r.acceptingRunner.Delete(ctx, id, grace)
}

func (r *stallingRunner) deletes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.deleted)
}

// cancelledCreate makes a create pinned to runner "bad" whose caller goes away once the
// runner got it; it returns the caller's error.
func cancelledCreate(s *Server, r *stallingRunner) error {
	ctx, cancel := context.WithCancel(asOrgID(testOrg))
	go func() {
		<-r.started
		cancel()
	}()
	_, err := createOnRunners(ctx, s, "bad")
	cancel()
	return err
}

// TestRunnerHealthHungRunnerCounted: a runner that never answers a create fails it once
// the attempt's own bound (CreateTimeout) passes, although each caller went away first:
// the gateway keeps judging the attempt, and the runner ends quarantined.
func TestRunnerHealthHungRunnerCounted(t *testing.T) {
	clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	hung := &stallingRunner{acceptingRunner: acceptingRunner{id: "bad"}, started: make(chan struct{}), release: make(chan struct{})}
	s := newHealthGateway(t, clk, health.Config{MinOrgs: 1, CreateTimeout: 20 * time.Millisecond}, hung)
	for i := range health.DefaultQuarantineAfter {
		if err := cancelledCreate(s, hung); connect.CodeOf(err) != connect.CodeCanceled {
			t.Fatalf("create %d whose caller went away: %v", i, err)
		}
	}
	awaitHealth(t, s, health.Quarantined)
	if v := s.health.Global("bad"); !strings.Contains(v.Reason, "DEADLINE_EXCEEDED") {
		t.Fatalf("quarantine reason: %+v", v)
	}
}

// TestRunnerHealthCallerCancelNotCounted: callers that go away while a healthy (slow)
// runner creates their sandbox, far beyond the thresholds, leave it healthy; each
// sandbox accepted after its caller left is deleted on the runner.
func TestRunnerHealthCallerCancelNotCounted(t *testing.T) {
	clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	slow := &stallingRunner{acceptingRunner: acceptingRunner{id: "bad"}, started: make(chan struct{}), release: make(chan struct{})}
	s := newHealthGateway(t, clk, health.Config{MinOrgs: 1}, slow)
	n := 2 * health.DefaultQuarantineAfter
	for i := range n {
		if err := cancelledCreate(s, slow); connect.CodeOf(err) != connect.CodeCanceled {
			t.Fatalf("create %d whose caller went away: %v", i, err)
		}
	}
	close(slow.release) // the runner answers them all: accepted
	deadline := time.Now().Add(30 * time.Second)
	for slow.deletes() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d abandoned sandboxes deleted", slow.deletes(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.Close() // the attempts ended
	if v := s.health.View("bad", testOrg); v.State != health.Healthy {
		t.Fatalf("after %d cancelled callers: %+v", n, v)
	}
}

// TestRunnerHealthForksAndMovesJudged: forks a runner fails internally, moves whose
// import the target fails and moves whose export the source fails count against those
// runners as failed creates do (the
// organization's own view degrades: the default MinOrgs needs two organizations for
// everyone's); a fork the runner makes heals it; a fork refused for the caller's reason
// (a source that cannot be forked) does not count.
func TestRunnerHealthForksAndMovesJudged(t *testing.T) {
	t.Run("fork", func(t *testing.T) {
		r := newPauseRunner("r1")
		r.maxSandboxes = 16
		e := newPauseEnv(t, "", r)
		id := e.create(t, publicService(8082, https, share, 0))
		r.setState(id, runner.StateRunning)
		fork := func(n int32) {
			t.Helper()
			if _, err := e.pc.ForkSandbox(t.Context(), withKey(e.acme, &statev1.ForkSandboxRequest{SandboxId: id, Count: n})); err != nil {
				t.Fatal(err)
			}
		}
		r.forkErrs = map[int]error{0: runner.ErrNotRunning}
		fork(1)
		if v := e.s.health.View("r1", "acme"); v.State != health.Healthy {
			t.Fatalf("after a fork refused for its source: %+v", v)
		}
		internal := connect.NewError(connect.CodeInternal, errors.New("runsc restore: exec failed"))
		r.forkErrs = map[int]error{0: internal, 1: internal, 2: internal}
		fork(3)
		if v := e.s.health.View("r1", "acme"); v.State != health.Degraded || !strings.Contains(v.Reason, "INTERNAL") {
			t.Fatalf("after 3 forks failed internally: %+v", v)
		}
		r.forkErrs = nil
		fork(1)
		if v := e.s.health.View("r1", "acme"); v.State != health.Healthy {
			t.Fatalf("after a fork made: %+v", v)
		}
	})
	t.Run("move", func(t *testing.T) {
		plat := "gvisor runsc-1 linux/amd64"
		r1, r2 := newPortRunner("r1", plat), newPortRunner("r2", plat)
		r2.importErr = connect.NewError(connect.CodeInternal, errors.New("runsc restore: exec failed"))
		e := newPauseEnv(t, "", r1, r2)
		id := e.createOn(t, r1)
		e.pause(t, id, true)
		r1.full = true
		for i := range health.DefaultDegradedAfter {
			if _, err := e.resume(t, id); connect.CodeOf(err) != connect.CodeInternal {
				t.Fatalf("move %d: %v", i, err)
			}
		}
		if v := e.s.health.View("r2", "acme"); v.State != health.Degraded {
			t.Fatalf("after %d failed imports: %+v", health.DefaultDegradedAfter, v)
		}
		if v := e.s.health.View("r1", "acme"); v.State != health.Healthy {
			t.Fatalf("the source runner: %+v", v)
		}
		// Exports the source runner fails internally count against it; exports
		// refused for the source's state, and successful ones, do not.
		r2.importErr = nil
		r1.exportErr = runner.ErrNotRunning
		for range health.DefaultDegradedAfter + 1 {
			if _, err := e.resume(t, id); err == nil {
				t.Fatal("a move whose export was refused succeeded")
			}
		}
		if v := e.s.health.View("r1", "acme"); v.State != health.Healthy {
			t.Fatalf("after exports refused for the source: %+v", v)
		}
		r1.exportErr = connect.NewError(connect.CodeInternal, errors.New("runsc checkpoint: exit status 128"))
		for i := range health.DefaultDegradedAfter {
			if _, err := e.resume(t, id); connect.CodeOf(err) != connect.CodeInternal {
				t.Fatalf("move %d with a failing export: %v", i, err)
			}
		}
		if v := e.s.health.View("r1", "acme"); v.State != health.Degraded || !strings.Contains(v.Reason, "INTERNAL") {
			t.Fatalf("the source runner after %d failed exports: %+v", health.DefaultDegradedAfter, v)
		}
		if v := e.s.health.Global("r1"); v.State != health.Healthy {
			t.Fatalf("one organization's failed exports degraded r1 for everyone: %+v", v)
		}
		r1.exportErr = nil
		if res, err := e.resume(t, id); err != nil || res.GetRunnerId() != "r2" {
			t.Fatalf("move: %v %v", res, err)
		}
		if v := e.s.health.View("r2", "acme"); v.State != health.Healthy {
			t.Fatalf("after a move made: %+v", v)
		}
	})
}

// TestRunnerHealthDetachedBounded: beyond the bound of abandoned creates followed at once,
// a create whose caller goes away is cancelled with it, unjudged; the followed one ends
// with the server, unjudged too.
func TestRunnerHealthDetachedBounded(t *testing.T) {
	clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	hung := &stallingRunner{acceptingRunner: acceptingRunner{id: "bad"}, started: make(chan struct{}), release: make(chan struct{})}
	s := newHealthGatewayWith(t, clk, health.Config{MinOrgs: 1, CreateTimeout: time.Hour}, func(c *Config) { c.maxDetached = 1 }, hung)
	n := health.DefaultQuarantineAfter + 1
	for i := range n {
		if err := cancelledCreate(s, hung); connect.CodeOf(err) != connect.CodeCanceled {
			t.Fatalf("create %d whose caller went away: %v", i, err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for hung.endedCreates() < n-1 { // all but the one followed were cancelled
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d creates beyond the bound ended", hung.endedCreates(), n-1)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.Close()
	if hung.endedCreates() != n {
		t.Fatalf("%d of %d creates ended after Close", hung.endedCreates(), n)
	}
	if v := s.health.View("bad", testOrg); v.State != health.Healthy {
		t.Fatalf("after creates cancelled beyond the bound and at Close: %+v", v)
	}
}

// TestAbandonedCreateKeepsItsRoom: a create whose caller went away keeps its room on the
// runner (and with it its quota reservation and GLOBAL leases, released the same way)
// until the runner has answered and the sandbox is deleted: released at once, a retry
// could take them while the abandoned sandbox is still being made.
func TestAbandonedCreateKeepsItsRoom(t *testing.T) {
	clk := &stepClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	slow := &stallingRunner{acceptingRunner: acceptingRunner{id: "bad"}, started: make(chan struct{}), release: make(chan struct{})}
	s := newHealthGateway(t, clk, health.Config{MinOrgs: 1}, slow)
	if err := cancelledCreate(s, slow); connect.CodeOf(err) != connect.CodeCanceled {
		t.Fatalf("create whose caller went away: %v", err)
	}
	if _, n := s.reserved.Held("bad"); n != 1 {
		t.Fatalf("after the caller went away, %d creates hold room on the runner, want 1 (the attempt still runs)", n)
	}
	close(slow.release)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, n := s.reserved.Held("bad")
		if n == 0 && slow.deletes() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the runner answered: %d holds, %d deletes; want 0 and 1", n, slow.deletes())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
