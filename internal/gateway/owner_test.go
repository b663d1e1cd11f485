package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/testenv/logbuf"
)

// ownedRunner is an accepting runner whose owner is vouched for (runner.OwnedHandle),
// as a runnerapi.Client's certificate does.
type ownedRunner struct {
	*warmRunner
	mu    sync.Mutex
	org   string
	known bool
}

func (r *ownedRunner) Owner() (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.org, r.known
}

func newOwned(id, org string, known bool) *ownedRunner {
	return &ownedRunner{warmRunner: &warmRunner{acceptingRunner: acceptingRunner{id: id}}, org: org, known: known}
}

func (r *ownedRunner) count() int {
	r.acceptingRunner.mu.Lock()
	defer r.acceptingRunner.mu.Unlock()
	return len(r.got)
}

// TestRunnerOwnerTenancy: a runner whose certificate names an organization other than
// the platform's takes that organization's sandboxes only, is listed to it only, and
// holds no other organization's volume; one naming the platform organization, and an
// in-process runner, serve everyone; one whose owner is not verified yet takes nothing.
func TestRunnerOwnerTenancy(t *testing.T) {
	inproc := newOwned("inproc", "", true)
	platform := newOwned("platform-1", "platform", true)
	tenant := newOwned("b-runner", "org-b", true)
	unverified := newOwned("unverified", "", false)
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{inproc.warmRunner, platform, tenant, unverified}, PlatformOrg: "platform", Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := t.Context()

	views := s.views.snapshot(ctx)
	for i, want := range []struct {
		owner          string
		unknown, ready bool
	}{{"", false, true}, {"", false, true}, {"org-b", false, true}, {"", true, false}} {
		if v := views[i]; v.Owner != want.owner || v.OwnerUnknown != want.unknown || v.Ready != want.ready {
			t.Errorf("runner %s: owner %q (unknown %v) ready %v, want %q %v %v", v.ID, v.Owner, v.OwnerUnknown, v.Ready, want.owner, want.unknown, want.ready)
		}
	}

	as := func(org string) context.Context {
		return auth.WithPrincipal(ctx, auth.Principal{KeyID: "k-" + org, Org: org, Role: auth.RoleAdmin})
	}
	create := func(org string, pins ...string) error {
		_, err := s.CreateSandbox(as(org), connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Image: "python:3.11"}}, RunnerIds: pins}}}))
		return err
	}
	for i := range 30 {
		if err := create("org-a"); err != nil {
			t.Fatalf("create %d of org-a: %v", i, err)
		}
	}
	if n := tenant.count(); n != 0 {
		t.Fatalf("org-b's runner got %d of org-a's sandboxes", n)
	}
	if n := unverified.count(); n != 0 {
		t.Fatalf("the unverified runner got %d sandboxes", n)
	}
	if inproc.count() == 0 || platform.count() == 0 {
		t.Errorf("platform runners got %d and %d of org-a's sandboxes, want both some", inproc.count(), platform.count())
	}
	// Pinned to org-b's runner: as unknown.
	if err := create("org-a", "b-runner"); err == nil || strings.Contains(err.Error(), "org-b") || !strings.Contains(err.Error(), "available runners are [inproc platform-1]") {
		t.Fatalf("org-a pinned to org-b's runner: %v", err)
	}
	// The owner's own sandboxes go there.
	if err := create("org-b", "b-runner"); err != nil || tenant.count() != 1 {
		t.Fatalf("org-b pinned to its runner: %v (it has %d)", err, tenant.count())
	}

	// Discovery lists another organization's runner to nobody else.
	list := func(org string) []string {
		res, err := s.ListAvailableRunners(as(org), connect.NewRequest(&sandboxv1.ListAvailableRunnersRequest{View: sandboxv1.RunnerView_RUNNER_VIEW_BASIC}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range res.Msg.GetRunners() {
			out = append(out, r.GetRunnerId())
		}
		return out
	}
	if got := strings.Join(list("org-a"), ","); got != "inproc,platform-1" {
		t.Errorf("org-a lists %s", got)
	}
	if got := strings.Join(list("org-b"), ","); got != "inproc,platform-1,b-runner" {
		t.Errorf("org-b lists %s", got)
	}
	if _, err := s.GetAvailableRunner(as("org-a"), connect.NewRequest(&sandboxv1.GetAvailableRunnerRequest{OrganizationId: "org-a", RunnerId: "b-runner"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("org-a gets org-b's runner: %v, want NOT_FOUND", err)
	}
}

// An owned runner is sent only the templates (and the registry pull credentials minted
// for them) of the organization it serves; a platform runner gets every one.
func TestWarmDesiredRunnerOwner(t *testing.T) {
	tmpls := warmTemplates([]store.Template{
		storedTemplate(t, "a-app", "org-a", "reg.example:8080/org-a/app:v1", `{"sandboxd.warmPool": {"size": 1}}`, false),
		storedTemplate(t, "b-app", "org-b", "reg.example:8080/org-b/app:v1", `{"sandboxd.warmPool": {"size": 1}}`, false),
	})
	minted := map[string]int{}
	mint := func(org, image string) (string, string, bool) {
		minted[org]++
		return "sandboxd", fmt.Sprintf("tok-%s", org), true
	}
	got := warmDesired(tmpls, []placement.Runner{{ID: "b-runner", Ready: true, Owner: "org-b"}}, policy.RunnerPlatform(nil), mint)[0]
	if len(got) != 1 || got[0].Key != "org-b/b-app" || got[0].Spec.PullCredentials.Password != "tok-org-b" {
		t.Fatalf("org-b's runner is sent %+v, want org-b's template only", got)
	}
	if minted["org-a"] != 0 {
		t.Errorf("%d pull tokens of org-a minted for org-b's runner", minted["org-a"])
	}
	all := warmDesired(tmpls, []placement.Runner{{ID: "platform", Ready: true}}, policy.RunnerPlatform(nil), mint)[0]
	if len(all) != 2 {
		t.Errorf("the platform runner is sent %d targets, want both organizations'", len(all))
	}
}

// ownedBuilder is a building runner that belongs to an organization.
type ownedBuilder struct {
	*buildingRunner
	org string
}

func (r ownedBuilder) Owner() (string, bool) { return r.org, true }

// A build runs only on a runner that serves its organization: another organization's
// runner is passed over even when it comes first, and when it is the only builder the
// build fails without naming it.
func TestBuildPlacementRunnerOwner(t *testing.T) {
	ctx := t.Context()
	tenant := ownedBuilder{&buildingRunner{acceptingRunner: acceptingRunner{id: "b-runner"}, builderImage: "b", build: okBuild(testDigest)}, "org-b"}
	shared := &buildingRunner{acceptingRunner: acceptingRunner{id: "shared"}, builderImage: "b", build: okBuild(testDigest)}
	e := newBuildEnv(t, t.TempDir(), nil, tenant, shared)
	start := func(key string) string {
		res, err := e.c.StartBuild(ctx, as(key, &buildv1.StartBuildRequest{Target: &buildv1.StartBuildRequest_Repository{Repository: "x"}, Context: []byte("c")}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetBuild().GetBuildId()
	}
	for range 3 {
		if b := e.waitBuild(t, start(e.admin), buildv1.BuildState_BUILD_STATE_SUCCEEDED); b.GetRunnerId() != "shared" {
			t.Fatalf("%s's build ran on %q, want shared", testOrg, b.GetRunnerId())
		}
	}
	if reqs, _ := tenant.requests(); len(reqs) != 0 {
		t.Fatalf("org-b's runner got %d builds of %s", len(reqs), testOrg)
	}

	only := newBuildEnv(t, t.TempDir(), nil, tenant)
	b := only.waitBuild(t, func() string {
		res, err := only.c.StartBuild(ctx, as(only.admin, &buildv1.StartBuildRequest{Target: &buildv1.StartBuildRequest_Repository{Repository: "x"}, Context: []byte("c")}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetBuild().GetBuildId()
	}(), buildv1.BuildState_BUILD_STATE_FAILED)
	if msg := b.GetFailureMessage(); !strings.Contains(msg, placement.ConstraintRunnerOwner) || strings.Contains(msg, "b-runner") {
		t.Errorf("failure message %q: want %s, not the runner", msg, placement.ConstraintRunnerOwner)
	}
	if reqs, _ := tenant.requests(); len(reqs) != 0 {
		t.Fatalf("org-b's runner got %d builds of %s", len(reqs), testOrg)
	}
	// Its own organization's build runs there.
	res, err := only.c.StartBuild(ctx, as(only.otherAdmin, &buildv1.StartBuildRequest{Target: &buildv1.StartBuildRequest_Repository{Repository: "x"}, Context: []byte("c")}))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		g, err := only.c.GetBuild(ctx, as(only.otherAdmin, &buildv1.GetBuildRequest{BuildId: res.Msg.GetBuild().GetBuildId()}))
		if err != nil {
			t.Fatal(err)
		}
		if st := g.Msg.GetBuild().GetState(); st == buildv1.BuildState_BUILD_STATE_SUCCEEDED {
			if id := g.Msg.GetBuild().GetRunnerId(); id != "b-runner" {
				t.Fatalf("org-b's build ran on %q", id)
			}
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("org-b's build is %s: %v", st, g.Msg.GetBuild())
		}
	}
}

// ownedVolumeRunner is a volume runner that belongs to an organization.
type ownedVolumeRunner struct {
	*volumeRunner
	org string
}

func (r ownedVolumeRunner) Owner() (string, bool) { return r.org, true }

// Another organization's runner holds no volume of the caller's: registering one on it
// is answered as for an unknown runner, and the runner is never asked to make it; its
// own organization's volume is made there.
func TestVolumeOnAnotherOrganizationsRunner(t *testing.T) {
	tenant := ownedVolumeRunner{&volumeRunner{acceptingRunner: acceptingRunner{id: "b-runner"}}, "org-b"}
	s := newVolumeGateway(t, tenant)
	_, err := s.CreateVolume(tmplAdmin(testOrg), connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: pvcVolume("data", "b-runner", "c1")}))
	if apierr.Reason(err) != apierr.VolumeRunnerIneligible || strings.Contains(err.Error(), "org-b") {
		t.Fatalf("%s's volume on org-b's runner: %v, want %s as an unknown runner", testOrg, err, apierr.VolumeRunnerIneligible)
	}
	if _, err := s.CreateVolume(tmplAdmin("org-b"), connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: pvcVolume("data", "b-runner", "c1")})); err != nil {
		t.Fatalf("org-b's volume on its runner: %v", err)
	}
	if v := waitVolume(t, s, tmplAdmin("org-b"), "data"); v.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_READY {
		t.Fatalf("org-b's volume: %v", v)
	}
	tenant.vmu.Lock()
	defer tenant.vmu.Unlock()
	for _, v := range tenant.ensured {
		if v.Org != "org-b" {
			t.Errorf("org-b's runner was asked to make %+v", v)
		}
	}
}

// ownedPort is a portRunner whose owner is vouched for (runner.OwnedHandle).
type ownedPort struct {
	*portRunner
	org string
}

func (r ownedPort) Owner() (string, bool) { return r.org, true }

// TestMoveStaysWithItsOwner: a checkpoint moves only between runners of one owner. A
// sandbox paused on acme's own runner, which has no room to resume it, moves to acme's
// other runner, never to a platform runner (which serves acme too): what an exporting
// runner writes is its own word, which no runner of another owner acts on. The moved
// sandbox's organization is the gateway's record's, whatever the export says.
func TestMoveStaysWithItsOwner(t *testing.T) {
	plat := "gvisor runsc-1 linux/amd64"
	mine, platform, mine2 := newPortRunner("a-1", plat), newPortRunner("p-1", plat), newPortRunner("a-2", plat)
	e := newPauseEnv(t, "", ownedPort{mine, "acme"}, ownedPort{platform, ""}, ownedPort{mine2, "acme"})
	id := e.createOn(t, mine)
	e.pause(t, id, true)
	mine.mu.Lock()
	sb := mine.got[id]
	sb.Spec.Meta = maps.Clone(sb.Spec.Meta)
	sb.Spec.Meta[runtime.MetaOrg] = "other" // the exporting runner's word
	mine.got[id] = sb
	mine.full = true
	mine.mu.Unlock()

	res, err := e.resume(t, id)
	if err != nil {
		t.Fatal(err)
	}
	if res.GetRunnerId() != "a-2" {
		t.Errorf("moved to %q, want a-2 (acme's own)", res.GetRunnerId())
	}
	if len(platform.imports) != 0 {
		t.Errorf("the platform runner was asked to import %d checkpoints of a tenant runner", len(platform.imports))
	}
	if len(mine2.imports) != 1 || mine2.imports[0].Targets[0].Meta[runtime.MetaOrg] != "acme" {
		t.Fatalf("a-2's imports %+v, want one with organization acme", mine2.imports)
	}

	// With no runner of its owner left to take it, it is refused, naming no other.
	id2 := e.createOn(t, mine)
	e.pause(t, id2, true)
	mine2.mu.Lock()
	mine2.full = true
	mine2.mu.Unlock()
	mine2.importErr = errors.New("full")
	_, err = e.resume(t, id2)
	if err == nil {
		t.Fatal("resume of a sandbox no runner of its owner can take succeeded")
	}
	if len(platform.imports) != 0 || strings.Contains(err.Error(), "p-1") {
		t.Errorf("the platform runner was asked (%d imports) or named: %v", len(platform.imports), err)
	}
}

// TestNoPlatformOrgWarns: a gateway with remote runners and no platform organization
// starts (sandboxd's modes always set one; one holding only in-process runners needs
// none) but warns once, naming the remote runners; such a gateway fails closed: a runner
// registered to the would-be platform organization serves that organization only.
func TestNoPlatformOrgWarns(t *testing.T) {
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	start := func(platformOrg string, runners ...runner.Handle) (*Server, string) {
		var buf logbuf.Buffer
		s, err := New(Config{Auth: keys, Runners: runners, PlatformOrg: platformOrg, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s, buf.String()
	}
	const warning = "no platform organization"

	_, log := start("", newOwned("inproc", "", true).warmRunner)
	if strings.Contains(log, warning) {
		t.Errorf("in-process runners only: warned: %s", log)
	}
	_, log = start("platform", newOwned("p-1", "platform", true))
	if strings.Contains(log, warning) {
		t.Errorf("platform organization set: warned: %s", log)
	}
	registered := newOwned("p-1", "platform", true)
	s, log := start("", registered, newOwned("b-runner", "org-b", true))
	if strings.Count(log, warning) != 1 || !strings.Contains(log, "level=WARN") || !strings.Contains(log, "p-1") || !strings.Contains(log, "b-runner") {
		t.Fatalf("remote runners, no platform organization: log %q, want one warning naming both runners", log)
	}
	if !s.serves(registered, "platform") || s.serves(registered, "org-a") {
		t.Error("without a platform organization, a runner registered to it serves other organizations")
	}
}
