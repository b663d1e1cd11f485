package security

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestPrepullStatusIsScopedToItsOrg (issue 22): a runner pre-pulls the images of every
// template it may place, of every organization, and reports them in its heartbeats. A
// tenant's admin reading the tenant's runner must not learn another organization's
// image references or template IDs from it (Connect and REST): they are counted in
// hidden only; the platform's admin sees every organization's on the platform's runner.
// A runner cannot push more than the bounds into the store: such a heartbeat is refused
// with the field named.
func TestPrepullStatusIsScopedToItsOrg(t *testing.T) {
	ctx := t.Context()
	tmp := t.TempDir()
	ca, err := pki.LoadOrCreateCA(filepath.Join(tmp, "pki"), "prepull status test CA")
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
	for _, r := range [][2]string{{"platform", "shared"}, {"ta", "ra"}} {
		if _, _, err := controlplane.EnsureRunner(ctx, st, store.Runner{Org: r[0], RunnerID: r[1], ClusterID: "c-" + r[1], Zone: "z"}); err != nil {
			t.Fatal(err)
		}
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

	beat := func(org, id string, p *controlplanev1.PrepullStatus) error {
		t.Helper()
		c, err := ca.IssueClient("runner "+id, []*url.URL{controlplane.RunnerURI(org, id)}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			TLSClientConfig: pki.ClientTLSConfig(&c, ca.Pool(), "localhost"), ForceAttemptHTTP2: true}}
		_, err = controlplanev1connect.NewRunnerRegistrationServiceClient(hc, runnerSrv.URL).Heartbeat(ctx,
			connect.NewRequest(&controlplanev1.HeartbeatRequest{RunnerId: id, Version: "v1.0.0", Ready: true, Prepull: p}))
		return err
	}
	const secretRef = "registry.example/tb/secret-project:v7"
	img := func(ref, org, tmpl string) *controlplanev1.ImagePrepull {
		return &controlplanev1.ImagePrepull{Image: ref, OrganizationId: org, TemplateId: tmpl, State: controlplanev1.PrepullState_PREPULL_PRESENT}
	}
	all := &controlplanev1.PrepullStatus{Images: []*controlplanev1.ImagePrepull{
		img("registry.example/ta/app:1", "ta", "ta-tmpl"), img(secretRef, "tb", "tb-tmpl-secret"), img("busybox:1", "platform", "p-tmpl"),
	}}
	for _, r := range [][2]string{{"platform", "shared"}, {"ta", "ra"}} {
		if err := beat(r[0], r[1], all); err != nil {
			t.Fatalf("heartbeat %s/%s: %v", r[0], r[1], err)
		}
	}
	key := func(org string) string {
		k, _, err := auth.IssueKey(ctx, st, org, auth.RoleAdmin, org+" admin")
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	get := func(k, id string) *controlplanev1.PrepullStatus {
		t.Helper()
		r, err := controlplanev1connect.NewRunnerManagementServiceClient(http.DefaultClient, apiSrv.URL, connect.WithInterceptors(connecttest.Bearer(k))).
			GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.GetStatus().GetPrepull()
	}

	keyA, keyP := key("ta"), key("platform")
	p := get(keyA, "ra")
	if len(p.GetImages()) != 1 || p.GetImages()[0].GetImage() != "registry.example/ta/app:1" || p.GetHidden() != 2 {
		t.Fatalf("ta's admin sees %v", p)
	}
	for _, path := range []string{"/v1/sandbox/managedRunners/ra", "/v1/sandbox/managedRunners?pageSize=10"} {
		code, body := rest(t, &Dev{API: apiSrv.URL}, "GET", path, "Bearer "+keyA, nil)
		if code != http.StatusOK || !strings.Contains(string(body), "registry.example/ta/app:1") {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		for _, leak := range []string{secretRef, "tb-tmpl-secret", `"tb"`, "p-tmpl"} {
			if strings.Contains(string(body), leak) {
				t.Fatalf("GET %s shows ta's admin %s: %s", path, leak, body)
			}
		}
	}
	if p := get(keyP, "shared"); len(p.GetImages()) != 3 || p.GetHidden() != 0 {
		t.Fatalf("the platform's admin sees %v on its runner", p)
	}

	// Over the bounds: refused, with the field; the status stays the last accepted one.
	huge := &controlplanev1.PrepullStatus{}
	for range controlplane.MaxPrepullImages + 1 {
		huge.Images = append(huge.Images, &controlplanev1.ImagePrepull{Image: strings.Repeat("r", controlplane.MaxPrepullImageRef),
			State: controlplanev1.PrepullState_PREPULL_FAILED, LastError: strings.Repeat("e", controlplane.MaxPrepullError)})
	}
	err = beat("ta", "ra", huge)
	if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.InvalidRequest {
		t.Fatalf("a heartbeat with %d images: %v", len(huge.Images), err)
	}
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "prepull.images" {
		t.Fatalf("violations %v", vs)
	}
	if p := get(keyA, "ra"); len(p.GetImages()) != 1 {
		t.Fatalf("after the refused heartbeat ta's admin sees %v", p)
	}
}
