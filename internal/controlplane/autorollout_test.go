package controlplane_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/enroll"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/rollout"
	"github.com/sandboxd/sandboxd/internal/store"
)

// fakeRunner is a registered runner that heartbeats over mTLS and "restarts" into the
// version the control plane asks for; on the bad version it never becomes ready.
type fakeRunner struct {
	id      string
	hb      *enroll.Heartbeater
	version string
	bad     string
}

func (r *fakeRunner) beat(t *testing.T) {
	t.Helper()
	if err := r.hb.Beat(t.Context()); err != nil {
		t.Fatalf("%s heartbeat: %v", r.id, err)
	}
	if d := r.hb.DesiredVersion(); d != "" && d != r.version {
		r.version = d
		if err := r.hb.Beat(t.Context()); err != nil {
			t.Fatalf("%s heartbeat after restart: %v", r.id, err)
		}
	}
}

// TestAutomaticRolloutOverRegistration drives the controller with real registrations and
// heartbeats over mTLS and the admin API over TLS: RAPID runners move one at a time and
// STABLE's does not; a version that never becomes ready is rolled back, halts RAPID with
// the reason shown in ListReleases and the runners' status, and a resume lets it go on.
func TestAutomaticRolloutOverRegistration(t *testing.T) {
	ctx := t.Context()
	b := newRegistrationBed(t, 3*time.Second)
	admin, releases, rollouts, ctl, advance := b.admin, b.releases, b.rollouts, b.ctl, b.advance

	var runners []*fakeRunner
	for _, spec := range []struct {
		id string
		ch controlplanev1.ReleaseChannel
	}{{"ra", controlplanev1.ReleaseChannel_RAPID}, {"rb", controlplanev1.ReleaseChannel_RAPID}, {"sa", controlplanev1.ReleaseChannel_STABLE}} {
		id, cache := b.enroll(t, spec.id, spec.ch)
		fr := &fakeRunner{id: spec.id, version: "v1.0.0", bad: "v1.2.0"}
		var err error
		fr.hb, err = enroll.NewHeartbeater(enroll.HeartbeatConfig{Identity: id, Cache: cache, Logger: slog.New(slog.DiscardHandler),
			Status: func(context.Context) (*enroll.Status, error) {
				return &enroll.Status{Version: fr.version, Ready: fr.version != fr.bad, SelfUpdate: true}, nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		runners = append(runners, fr)
	}
	get := func(id string) *controlplanev1.ManagedRunnerStatus {
		t.Helper()
		r, err := admin.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.GetStatus()
	}
	// step: a second passes, every runner heartbeats (restarting into what it is told), the
	// controller ticks; it returns the RAPID runners with a step in flight.
	step := func() []string {
		t.Helper()
		advance(time.Second)
		for _, r := range runners {
			r.beat(t)
		}
		if err := ctl.Tick(ctx); err != nil {
			t.Fatal(err)
		}
		var moving []string
		for _, id := range []string{"ra", "rb"} {
			if get(id).GetRolloutInProgress() {
				moving = append(moving, id)
			}
		}
		return moving
	}
	if got := step(); len(got) != 0 {
		t.Fatalf("nothing to roll out, yet %v move", got)
	}
	if !get("ra").GetSelfUpdate() {
		t.Fatal("self_update from the heartbeat not shown")
	}

	// Publish v1.1.0 (RAPID): ra then rb, never both at once; sa (STABLE) stays.
	if _, err := releases.PublishRelease(ctx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Release: releaseMsg("v1.1.0")})); err != nil {
		t.Fatal(err)
	}
	var order []string
	for range 10 {
		moving := step()
		if len(moving) > 1 {
			t.Fatalf("two RAPID runners in flight at once: %v", moving)
		}
		if len(moving) == 1 && (len(order) == 0 || order[len(order)-1] != moving[0]) {
			order = append(order, moving[0])
		}
	}
	if strings.Join(order, ",") != "ra,rb" {
		t.Fatalf("update order %v, want ra then rb", order)
	}
	for _, id := range []string{"ra", "rb"} {
		s := get(id)
		lu := s.GetLastUpdateResult()
		if s.GetVersion() != "v1.1.0" || s.GetDesiredVersion() != "" || lu.GetState() != controlplanev1.UpdateState_UPDATE_STATE_SUCCEEDED ||
			lu.GetFromVersion() != "v1.0.0" || lu.GetToVersion() != "v1.1.0" || lu.GetEndTime() == nil {
			t.Fatalf("%s after the rollout: %v", id, s)
		}
	}
	if s := get("sa"); s.GetVersion() != "v1.0.0" || s.GetLastUpdateResult() != nil || s.GetDesiredVersion() != "" {
		t.Fatalf("STABLE runner moved: %v", s)
	}

	// v1.2.0 never becomes ready: ra is rolled back after 3 s, RAPID halts, rb stays.
	if _, err := releases.PublishRelease(ctx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Release: releaseMsg("v1.2.0")})); err != nil {
		t.Fatal(err)
	}
	for range 8 {
		if moving := step(); len(moving) > 1 {
			t.Fatalf("two in flight: %v", moving)
		}
	}
	ra := get("ra")
	lu := ra.GetLastUpdateResult()
	if lu.GetState() != controlplanev1.UpdateState_UPDATE_STATE_ROLLED_BACK || lu.GetToVersion() != "v1.2.0" ||
		lu.GetReason() != "did not report ready on v1.2.0 within 3s (reports it, not ready)" {
		t.Fatalf("ra's failed step: %v", lu)
	}
	if ra.GetVersion() != "v1.1.0" || ra.GetDesiredVersion() != "" || ra.GetRolloutInProgress() {
		t.Fatalf("ra is back on v1.1.0 with nothing desired: %v", ra)
	}
	for _, id := range []string{"ra", "rb"} {
		if h := get(id).GetRolloutHaltReason(); !strings.Contains(h, "rollout of v1.2.0 on RAPID halted") || !strings.Contains(h, "org-a/ra did not report ready") {
			t.Fatalf("%s halt reason %q", id, h)
		}
	}
	if s := get("rb"); s.GetVersion() != "v1.1.0" || s.GetLastUpdateResult().GetToVersion() != "v1.1.0" {
		t.Fatalf("rb moved while RAPID was halted: %v", s)
	}
	if h := get("sa").GetRolloutHaltReason(); h != "" {
		t.Fatalf("STABLE runner shows RAPID's halt: %q", h)
	}
	ls, err := releases.ListReleases(ctx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	ro := ls.Msg.GetRollouts()
	if len(ro) != 2 || ro[0].GetChannel() != controlplanev1.ReleaseChannel_STABLE || ro[0].GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_ACTIVE ||
		ro[1].GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_HALTED || ro[1].GetTargetVersion() != "v1.2.0" ||
		ro[1].GetHaltedByRunner() != "org-a/ra" || !strings.Contains(ro[1].GetHaltReason(), "within 3s") {
		t.Fatalf("ListReleases rollouts: %v", ro)
	}

	// An admin resumes RAPID: it moves again (and fails again, here).
	res, err := rollouts.ResumeRollout(ctx, connect.NewRequest(&controlplanev1.ResumeRolloutRequest{Channel: controlplanev1.ReleaseChannel_RAPID}))
	if err != nil || res.Msg.GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_ACTIVE {
		t.Fatalf("resume: %v %v", res, err)
	}
	if moving := step(); len(moving) != 1 {
		t.Fatalf("after resume: %v in flight, want one", moving)
	}
	if _, err := rollouts.ResumeRollout(ctx, connect.NewRequest(&controlplanev1.ResumeRolloutRequest{})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("resume without a channel: %v", err)
	}
}

// TestResumeRolloutOnlyPlatformAdmins: resuming a halted channel decides what every
// organization's runners move to, like publishing; a tenant's admin or a platform user is
// refused and the halt stays.
func TestResumeRolloutOnlyPlatformAdmins(t *testing.T) {
	b := newReleaseBed(t)
	ctx := t.Context()
	if err := b.st.Rollouts().Halt(ctx, store.RolloutHalt{Channel: store.ChannelRapid, Version: "v1.0.0", Reason: "broken", Org: b.org, RunnerID: "rapid"}); err != nil {
		t.Fatal(err)
	}
	req := connect.NewRequest(&controlplanev1.ResumeRolloutRequest{Channel: controlplanev1.ReleaseChannel_RAPID})
	for _, p := range []auth.Principal{{KeyID: "t", Org: "tenant", Role: auth.RoleAdmin}, {KeyID: "u", Org: b.org, Role: auth.RoleUser}} {
		_, err := b.svc.ResumeRollout(auth.WithPrincipal(ctx, p), req)
		wantReason(t, "resume by "+p.Org+"/"+string(p.Role), err, connect.CodePermissionDenied, apierr.PermissionDenied)
	}
	if hs, _ := b.st.Rollouts().Halts(ctx, ""); len(hs) != 1 {
		t.Fatalf("halt lifted by a refused call: %v", hs)
	}
	ls, err := b.svc.ListReleases(b.actx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
	if err != nil || ls.Msg.GetRollouts()[1].GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_HALTED || ls.Msg.GetRollouts()[1].GetHaltReason() != "broken" {
		t.Fatalf("list: %v %v", ls, err)
	}
	if out, err := b.svc.ResumeRollout(b.actx, req); err != nil || out.Msg.GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_ACTIVE {
		t.Fatalf("platform admin resumes: %v %v", out, err)
	}
	if hs, _ := b.st.Rollouts().Halts(ctx, ""); len(hs) != 0 {
		t.Fatalf("halt not lifted: %v", hs)
	}
}

// TestHaltsAreEachOrganizationsOwn (review S2 of issue 18): a halt is its organization's.
// ListReleases and the runner calls show a caller its own organization's halt only (the
// reason and the runner come from that organization's runner); a platform admin also sees
// how many organizations are halted, not their reasons; ResumeRollout lifts one
// organization's halt (organization_id) or all.
func TestHaltsAreEachOrganizationsOwn(t *testing.T) {
	b := newReleaseBed(t)
	ctx := t.Context()
	for _, o := range []string{"ta", "tb"} {
		if err := controlplane.EnsureOrg(ctx, b.st, o); err != nil {
			t.Fatal(err)
		}
		if _, err := b.st.Runners().Create(ctx, store.Runner{Org: o, RunnerID: "r-" + o, ClusterID: "c", Zone: "z", ReleaseChannel: store.ChannelRapid}); err != nil {
			t.Fatal(err)
		}
		if err := b.st.Runners().RecordHeartbeat(ctx, o, "r-"+o, store.RunnerStatus{Version: "v0.9.0", Ready: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.st.Rollouts().Halt(ctx, store.RolloutHalt{Channel: store.ChannelRapid, Version: "v1.0.0", Reason: "runner ta/r-ta reports: A's words", Org: "ta", RunnerID: "r-ta"}); err != nil {
		t.Fatal(err)
	}
	as := func(org string) context.Context {
		return auth.WithPrincipal(ctx, auth.Principal{KeyID: "k-" + org, Org: org, Role: auth.RoleAdmin})
	}
	rapid := func(actx context.Context) *controlplanev1.ChannelRollout {
		t.Helper()
		ls, err := b.svc.ListReleases(actx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		return ls.Msg.GetRollouts()[1]
	}
	haltOf := func(actx context.Context, id string) string {
		t.Helper()
		g, err := b.svc.GetManagedRunner(actx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: id}))
		if err != nil {
			t.Fatal(err)
		}
		l, err := b.svc.ListManagedRunners(actx, connect.NewRequest(&controlplanev1.ListManagedRunnersRequest{}))
		if err != nil || len(l.Msg.GetManagedRunners()) == 0 || l.Msg.GetManagedRunners()[0].GetStatus().GetRolloutHaltReason() != g.Msg.GetStatus().GetRolloutHaltReason() {
			t.Fatalf("list %v %v", l, err)
		}
		return g.Msg.GetStatus().GetRolloutHaltReason()
	}
	if r := rapid(as("ta")); r.GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_HALTED || r.GetHaltedByRunner() != "ta/r-ta" ||
		!strings.Contains(r.GetHaltReason(), "A's words") || r.GetHaltedOrganizations() != 0 {
		t.Errorf("ta sees %v", r)
	}
	if h := haltOf(as("ta"), "r-ta"); !strings.Contains(h, "A's words") {
		t.Errorf("ta's runner: %q", h)
	}
	if r := rapid(as("tb")); r.GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_ACTIVE || r.GetHaltReason() != "" || r.GetHaltedByRunner() != "" || r.GetHaltedOrganizations() != 0 {
		t.Errorf("tb sees %v", r)
	}
	if h := haltOf(as("tb"), "r-tb"); h != "" {
		t.Errorf("tb's runner shows %q", h)
	}
	// The platform admin: its own organization is not halted; one organization is.
	if r := rapid(b.actx); r.GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_ACTIVE || r.GetHaltReason() != "" || r.GetHaltedOrganizations() != 1 {
		t.Errorf("platform admin sees %v", r)
	}
	if h := haltOf(b.actx, "rapid"); h != "" {
		t.Errorf("platform's runner shows %q", h)
	}
	if err := b.st.Rollouts().Halt(ctx, store.RolloutHalt{Channel: store.ChannelRapid, Version: "v1.0.0", Reason: "platform's own", Org: b.org, RunnerID: "rapid"}); err != nil {
		t.Fatal(err)
	}
	if r := rapid(b.actx); r.GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_HALTED || r.GetHaltReason() != "platform's own" || r.GetHaltedOrganizations() != 2 {
		t.Errorf("platform admin sees %v", r)
	}

	// Resume validates organization_id, then lifts ta's halt only.
	for _, org := range []string{"nope", strings.Repeat("x", 129)} {
		_, err := b.svc.ResumeRollout(b.actx, connect.NewRequest(&controlplanev1.ResumeRolloutRequest{Channel: controlplanev1.ReleaseChannel_RAPID, OrganizationId: org}))
		wantReason(t, "resume "+org[:4], err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	}
	res, err := b.svc.ResumeRollout(b.actx, connect.NewRequest(&controlplanev1.ResumeRolloutRequest{Channel: controlplanev1.ReleaseChannel_RAPID, OrganizationId: "ta"}))
	if err != nil || res.Msg.GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_HALTED || res.Msg.GetHaltedOrganizations() != 1 {
		t.Fatalf("resume ta: %v %v", res, err)
	}
	if r := rapid(as("ta")); r.GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_ACTIVE {
		t.Errorf("ta after resume: %v", r)
	}
	if hs, _ := b.st.Rollouts().Halts(ctx, ""); len(hs) != 1 || hs[0].Org != b.org {
		t.Errorf("halts after resume of ta: %+v", hs)
	}
}

// registrationBed is a control plane served over TLS on loopback (its clock advanced by
// hand), admin clients with the platform admin's key, and the automatic rollout's
// controller ticked by the test; runners enroll through real bootstrap tokens.
type registrationBed struct {
	addr     string
	admin    controlplanev1connect.RunnerManagementServiceClient
	releases controlplanev1connect.ReleaseServiceClient
	rollouts controlplanev1connect.RolloutServiceClient
	ctl      *rollout.Controller
	// clock is the control plane's and the controller's time; advance moves it on.
	clock   func() time.Time
	advance func(time.Duration)
}

// newRegistrationBed starts one, whose update steps have deadline.
func newRegistrationBed(t *testing.T, deadline time.Duration) *registrationBed {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ca, err := pki.LoadOrCreateCA(filepath.Join(dir, "pki"), "test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.EnsureOrg(ctx, st, "org-a"); err != nil {
		t.Fatal(err)
	}
	adminKey, err := controlplane.EnsureAdminKey(ctx, st, "org-a")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Now().UTC() // bootstrap tokens expire by the store's clock too
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	authn := auth.NewStoreAuthenticator(st, nil)
	t.Cleanup(authn.Wait)
	svc, err := controlplane.New(controlplane.Config{Store: st, Auth: authn, PlatformOrg: "org-a", CA: ca, HeartbeatInterval: time.Second,
		Logger: slog.New(slog.DiscardHandler), Now: clock, UpdateDeadline: deadline,
		TargetVersions: map[string]string{store.ChannelStable: "v1.0.0", store.ChannelRapid: "v1.0.0"}})
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := controlplane.TLSConfig(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: svc.TLSHandler(), TLSConfig: tlsCfg}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := ln.Addr().String()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientTLSConfig(nil, ca.Pool(), "127.0.0.1"), ForceAttemptHTTP2: true}}
	bearer := connect.WithInterceptors(connecttest.Bearer(adminKey))
	ctl, err := rollout.New(rollout.Config{Store: rollout.FromStore(st), Targets: svc.ChannelTargets, Deadline: deadline,
		HeartbeatInterval: time.Second, Now: clock, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return &registrationBed{addr: addr, ctl: ctl, clock: clock,
		admin:    controlplanev1connect.NewRunnerManagementServiceClient(hc, "https://"+addr, bearer),
		releases: controlplanev1connect.NewReleaseServiceClient(hc, "https://"+addr, bearer),
		rollouts: controlplanev1connect.NewRolloutServiceClient(hc, "https://"+addr, bearer),
		advance:  func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() },
	}
}

// enroll creates runner id on channel ch and registers it with a bootstrap token, as
// `sandboxd runner --bootstrap-token` does; it returns the runner's identity and policy cache.
func (b *registrationBed) enroll(t *testing.T, id string, ch controlplanev1.ReleaseChannel) (*enroll.Identity, *enroll.PolicyCache) {
	t.Helper()
	ctx := t.Context()
	if _, err := b.admin.CreateManagedRunner(ctx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: id, ClusterId: "c-" + id, Zone: "z1", ReleaseChannel: ch, Policy: &structpb.Struct{}}})); err != nil {
		t.Fatal(err)
	}
	tok, err := b.admin.CreateBootstrapToken(ctx, connect.NewRequest(&controlplanev1.CreateBootstrapTokenRequest{RunnerId: id}))
	if err != nil {
		t.Fatal(err)
	}
	rdir := t.TempDir()
	ident, err := enroll.Register(ctx, rdir, b.addr, tok.Msg.GetBootstrapToken(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cache, err := enroll.OpenPolicyCache(rdir)
	if err != nil {
		t.Fatal(err)
	}
	return ident, cache
}
