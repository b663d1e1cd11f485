package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/gateway/gatewaytest"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/sbxcli"
	"github.com/sandboxd/sandboxd/internal/store"
)

// cp is the control plane and the gateway on one port, as `sandboxd dev` serves them,
// over a SQLite store.
type cp struct {
	url               string
	st                store.Store
	adminKey, userKey string
	runners           func(key string) controlplanev1connect.RunnerManagementServiceClient
	keys              func(key string) controlplanev1connect.ApiKeyServiceClient
	sandboxes         func(key string) sandboxv1connect.SandboxServiceClient
	now               func() time.Time
	mu                sync.Mutex
	offset            time.Duration
}

func startControlPlane(t *testing.T) *cp {
	t.Helper()
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	c := &cp{st: st}
	for _, org := range []string{"org-a", "org-b"} {
		if err := controlplane.EnsureOrg(ctx, st, org); err != nil {
			t.Fatal(err)
		}
	}
	if c.adminKey, err = controlplane.EnsureAdminKey(ctx, st, "org-a"); err != nil || c.adminKey == "" {
		t.Fatalf("admin key: %q %v", c.adminKey, err)
	}
	if c.userKey, _, err = auth.IssueKey(ctx, st, "org-a", auth.RoleUser, "user"); err != nil {
		t.Fatal(err)
	}
	authn := auth.NewStoreAuthenticator(st, nil)
	t.Cleanup(authn.Wait)
	c.now = func() time.Time {
		c.mu.Lock()
		defer c.mu.Unlock()
		return time.Now().Add(c.offset)
	}
	svc, err := controlplane.New(controlplane.Config{Store: st, Auth: authn, PlatformOrg: "org-a", Now: c.now, Logger: slog.New(slog.DiscardHandler),
		TargetVersions: map[string]string{store.ChannelStable: "v2"}})
	if err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(gateway.Config{Auth: authn, Runners: []runner.Handle{gatewaytest.IdleRunner{RunnerID: "idle", GroupID: "default"}}, Policies: controlplane.NewPolicySource(st, "org-a")})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(controlplane.Route(svc.Handler(), g.Handler()))
	srv.EnableHTTP2 = true
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	c.url = srv.URL
	hc := &http.Client{Transport: &http.Transport{Protocols: func() *http.Protocols {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		return p
	}()}}
	opts := func(key string) []connect.ClientOption {
		o := []connect.ClientOption{connect.WithGRPC()}
		if key != "" {
			o = append(o, connect.WithInterceptors(connecttest.Bearer(key)))
		}
		return o
	}
	c.runners = func(key string) controlplanev1connect.RunnerManagementServiceClient {
		return controlplanev1connect.NewRunnerManagementServiceClient(hc, srv.URL, opts(key)...)
	}
	c.keys = func(key string) controlplanev1connect.ApiKeyServiceClient {
		return controlplanev1connect.NewApiKeyServiceClient(hc, srv.URL, opts(key)...)
	}
	c.sandboxes = func(key string) sandboxv1connect.SandboxServiceClient {
		return sandboxv1connect.NewSandboxServiceClient(hc, srv.URL, opts(key)...)
	}
	return c
}

func (c *cp) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

func newRunner(id, cluster string, policy *structpb.Struct) *controlplanev1.CreateManagedRunnerRequest {
	return &controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
		RunnerId: id, ClusterId: cluster, Zone: "us-east-04a", Policy: policy}}
}

func wantCode(t *testing.T, what string, err error, code connect.Code, reason string) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("%s: %v, want %v", what, err, code)
	}
	if reason != "" && apierr.Reason(err) != reason {
		t.Fatalf("%s: reason %q, want %q (%v)", what, apierr.Reason(err), reason, err)
	}
}

func TestControlPlaneRunners(t *testing.T) {
	c := startControlPlane(t)
	ctx := t.Context()
	rs := c.runners(c.adminKey)

	created, err := rs.CreateManagedRunner(ctx, connect.NewRequest(newRunner("r1", "c1", &structpb.Struct{})))
	if err != nil {
		t.Fatal(err)
	}
	r1 := created.Msg
	if r1.GetEtag() == "" || r1.GetPolicy() == nil || r1.GetPolicyRevision() != 1 || r1.GetRunnerGroupId() != "default" ||
		r1.GetReleaseChannel() != controlplanev1.ReleaseChannel_STABLE || r1.GetStatus().GetConnection() != controlplanev1.ConnectionStatus_DISCONNECTED {
		t.Fatalf("created: %v", r1)
	}
	got, err := rs.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "r1"}))
	if err != nil || got.Msg.GetEtag() != r1.GetEtag() || got.Msg.GetClusterId() != "c1" {
		t.Fatalf("get: %v %v", got, err)
	}

	// One runner per id, one per cluster.
	_, err = rs.CreateManagedRunner(ctx, connect.NewRequest(newRunner("r1", "c9", &structpb.Struct{})))
	wantCode(t, "duplicate runner_id", err, connect.CodeAlreadyExists, apierr.AlreadyExists)
	if !strings.Contains(err.Error(), "runner_id r1") {
		t.Errorf("duplicate runner_id: %v does not name it", err)
	}
	_, err = rs.CreateManagedRunner(ctx, connect.NewRequest(newRunner("r9", "c1", &structpb.Struct{})))
	wantCode(t, "duplicate cluster_id", err, connect.CodeAlreadyExists, apierr.AlreadyExists)
	if !strings.Contains(err.Error(), "cluster c1") {
		t.Errorf("duplicate cluster_id: %v does not name it", err)
	}
	_, err = rs.CreateManagedRunner(ctx, connect.NewRequest(newRunner("r2", "c2", nil)))
	wantCode(t, "create without policy", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "managed_runner.policy" {
		t.Errorf("create without policy: violations %v", vs)
	}
	if _, err := rs.CreateManagedRunner(ctx, connect.NewRequest(newRunner("r2", "c2", &structpb.Struct{}))); err != nil {
		t.Fatal(err)
	}

	// Paginated list.
	var ids []string
	token := ""
	for {
		page, err := rs.ListManagedRunners(ctx, connect.NewRequest(&controlplanev1.ListManagedRunnersRequest{PageSize: 1, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Msg.GetManagedRunners()) != 1 {
			t.Fatalf("page of %d", len(page.Msg.GetManagedRunners()))
		}
		ids = append(ids, page.Msg.GetManagedRunners()[0].GetRunnerId())
		if token = page.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	if strings.Join(ids, ",") != "r1,r2" {
		t.Errorf("list: %v", ids)
	}

	// Update with a mask: only the named field changes; the etag moves.
	upd, err := rs.UpdateManagedRunner(ctx, connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
		ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: "r1", DisplayName: "first", RunnerGroupId: "ignored", Etag: r1.GetEtag()},
		UpdateMask:    &fieldmaskpb.FieldMask{Paths: []string{"display_name"}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if upd.Msg.GetDisplayName() != "first" || upd.Msg.GetRunnerGroupId() != "default" || upd.Msg.GetEtag() == r1.GetEtag() || upd.Msg.GetPolicyRevision() != 1 {
		t.Fatalf("update display_name: %v", upd.Msg)
	}
	// The old etag is stale now.
	_, err = rs.UpdateManagedRunner(ctx, connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
		ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: "r1", Policy: &structpb.Struct{}, Etag: r1.GetEtag()},
		UpdateMask:    &fieldmaskpb.FieldMask{Paths: []string{"policy"}},
	}))
	wantCode(t, "stale etag", err, connect.CodeAborted, apierr.EtagMismatch)
	_, err = rs.DeleteManagedRunner(ctx, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1", Etag: r1.GetEtag()}))
	wantCode(t, "delete with stale etag", err, connect.CodeAborted, apierr.EtagMismatch)
	// Policy replaced whole; the revision counts.
	strict, _ := structpb.NewStruct(map[string]any{"constraints": map[string]any{"lifetime": map[string]any{"max_seconds": 3600}}})
	pol, err := rs.UpdateManagedRunner(ctx, connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
		ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: "r1", Policy: strict, Etag: upd.Msg.GetEtag()},
		UpdateMask:    &fieldmaskpb.FieldMask{Paths: []string{"policy"}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if pol.Msg.GetPolicyRevision() != 2 || pol.Msg.GetDisplayName() != "first" ||
		pol.Msg.GetPolicy().GetFields()["constraints"] == nil {
		t.Fatalf("update policy: %v", pol.Msg)
	}
	// An invalid policy is refused with field violations.
	bad, _ := structpb.NewStruct(map[string]any{"constraints": map[string]any{"lifetime": map[string]any{"max_seconds": -1}}})
	_, err = rs.UpdateManagedRunner(ctx, connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
		ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: "r1", Policy: bad},
		UpdateMask:    &fieldmaskpb.FieldMask{Paths: []string{"policy"}},
	}))
	wantCode(t, "invalid policy", err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	if vs := apierr.Violations(err); len(vs) == 0 || vs[0].Field != "managed_runner.policy.constraints.lifetime.max_seconds" {
		t.Errorf("invalid policy: violations %v", vs)
	}

	// Delete is refused while the runner owns a live sandbox, unless forced.
	if _, err := c.st.Sandboxes().Create(ctx, store.Sandbox{ID: "sb-1", Org: "org-a", RunnerID: "r1", Spec: json.RawMessage(`{}`), State: "RUNNING"}); err != nil {
		t.Fatal(err)
	}
	_, err = rs.DeleteManagedRunner(ctx, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1"}))
	wantCode(t, "delete with a live sandbox", err, connect.CodeFailedPrecondition, apierr.RunnerInUse)
	if _, err := rs.DeleteManagedRunner(ctx, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1", Force: true, Etag: pol.Msg.GetEtag()})); err != nil {
		t.Fatalf("forced delete: %v", err)
	}
	_, err = rs.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "r1"}))
	wantCode(t, "get deleted", err, connect.CodeNotFound, apierr.RunnerNotFound)
	if _, err := rs.DeleteManagedRunner(ctx, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r2"})); err != nil {
		t.Fatalf("delete an unused runner: %v", err)
	}

	// Another organization sees none of it.
	_, err = rs.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "r2"}))
	wantCode(t, "get deleted r2", err, connect.CodeNotFound, "")
}

func TestControlPlaneRequiresAdmin(t *testing.T) {
	c := startControlPlane(t)
	ctx := t.Context()
	if _, err := c.runners(c.adminKey).CreateManagedRunner(ctx, connect.NewRequest(newRunner("r1", "c1", &structpb.Struct{}))); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key    string
		code   connect.Code
		reason string
	}{
		{c.userKey, connect.CodePermissionDenied, apierr.PermissionDenied},
		{"", connect.CodeUnauthenticated, apierr.Unauthenticated},
		{"sbx_0000000000000000_nope", connect.CodeUnauthenticated, apierr.Unauthenticated},
	} {
		rs, ks := c.runners(tc.key), c.keys(tc.key)
		calls := map[string]func() error{
			"create": func() error {
				_, err := rs.CreateManagedRunner(ctx, connect.NewRequest(newRunner("r2", "c2", &structpb.Struct{})))
				return err
			},
			"get": func() error {
				_, err := rs.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "r1"}))
				return err
			},
			"list": func() error {
				_, err := rs.ListManagedRunners(ctx, connect.NewRequest(&controlplanev1.ListManagedRunnersRequest{}))
				return err
			},
			"update": func() error {
				_, err := rs.UpdateManagedRunner(ctx, connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
					ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: "r1", Policy: &structpb.Struct{}},
					UpdateMask:    &fieldmaskpb.FieldMask{Paths: []string{"policy"}}}))
				return err
			},
			"delete": func() error {
				_, err := rs.DeleteManagedRunner(ctx, connect.NewRequest(&controlplanev1.DeleteManagedRunnerRequest{RunnerId: "r1", Force: true}))
				return err
			},
			"applyAvailableUpdate": func() error {
				_, err := rs.ApplyAvailableUpdate(ctx, connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: "r1"}))
				return err
			},
			"createApiKey": func() error {
				_, err := ks.CreateApiKey(ctx, connect.NewRequest(&controlplanev1.CreateApiKeyRequest{Role: controlplanev1.Role_SANDBOX_ADMIN}))
				return err
			},
			"listApiKeys": func() error {
				_, err := ks.ListApiKeys(ctx, connect.NewRequest(&controlplanev1.ListApiKeysRequest{}))
				return err
			},
			"revokeApiKey": func() error {
				_, err := ks.RevokeApiKey(ctx, connect.NewRequest(&controlplanev1.RevokeApiKeyRequest{KeyId: "x"}))
				return err
			},
		}
		for name, call := range calls {
			wantCode(t, name, call(), tc.code, tc.reason)
		}
	}
	// The runner is untouched.
	r, err := c.runners(c.adminKey).GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "r1"}))
	if err != nil || r.Msg.GetPolicyRevision() != 1 {
		t.Fatalf("r1 after refused calls: %v %v", r, err)
	}
}

// restCall sends an HTTP/JSON request as curl would.
func restCall(t *testing.T, base, method, path, key, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var out map[string]any
	if len(b) > 0 {
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("%s %s: %d %q is not JSON", method, path, res.StatusCode, b)
		}
	}
	return res.StatusCode, out
}

func TestControlPlaneREST(t *testing.T) {
	c := startControlPlane(t)
	call := func(method, path, key, body string) (int, map[string]any) {
		t.Helper()
		return restCall(t, c.url, method, path, key, body)
	}
	if code, _ := call("GET", "/v1/sandbox/managedRunners", "", ""); code != http.StatusUnauthorized {
		t.Errorf("list without a key: %d, want 401", code)
	}
	if code, _ := call("GET", "/v1/sandbox/managedRunners", c.userKey, ""); code != http.StatusForbidden {
		t.Errorf("list with a user key: %d, want 403", code)
	}
	code, r := call("POST", "/v1/sandbox/managedRunners", c.adminKey, `{"runnerId":"rest-1","clusterId":"6f1c1d2e-0000-4000-8000-000000000001","zone":"us-east-04a","policy":{}}`)
	if code != http.StatusOK || r["etag"] == "" {
		t.Fatalf("create: %d %v", code, r)
	}
	// {} comes back as {}.
	code, r = call("GET", "/v1/sandbox/managedRunners/rest-1", c.adminKey, "")
	if p, ok := r["policy"].(map[string]any); code != http.StatusOK || !ok || len(p) != 0 {
		t.Fatalf("get: %d policy %#v", code, r["policy"])
	}
	// A runner whose policy was never set has none (null), unlike {}.
	if _, err := c.st.Runners().Create(t.Context(), store.Runner{Org: "org-a", RunnerID: "unset", ClusterID: "c-unset", Zone: "us-east-04a"}); err != nil {
		t.Fatal(err)
	}
	code, r = call("GET", "/v1/sandbox/managedRunners/unset", c.adminKey, "")
	if _, has := r["policy"]; code != http.StatusOK || (has && r["policy"] != nil) {
		t.Fatalf("never-set policy: %d %#v", code, r["policy"])
	}
	code, bad := call("POST", "/v1/sandbox/managedRunners", c.adminKey, `{"runnerId":"Bad_Id","clusterId":"c2","zone":"us-east-04a"}`)
	if code != http.StatusBadRequest || !strings.Contains(mustJSON(t, bad), "managed_runner.runner_id") || !strings.Contains(mustJSON(t, bad), "managed_runner.policy") {
		t.Errorf("invalid create: %d %v", code, bad)
	}
	_, r = call("GET", "/v1/sandbox/managedRunners/rest-1", c.adminKey, "")
	etag := r["etag"].(string)
	code, upd := call("PATCH", "/v1/sandbox/managedRunners/rest-1?updateMask=displayName", c.adminKey, `{"displayName":"via REST","etag":"`+etag+`"}`)
	if code != http.StatusOK || upd["displayName"] != "via REST" || upd["etag"] == etag {
		t.Fatalf("patch: %d %v", code, upd)
	}
	if code, _ := call("PATCH", "/v1/sandbox/managedRunners/rest-1?updateMask=displayName", c.adminKey, `{"displayName":"again","etag":"`+etag+`"}`); code != http.StatusConflict {
		t.Errorf("patch with a stale etag: %d, want 409 (ABORTED)", code)
	}
	code, list := call("GET", "/v1/sandbox/managedRunners?pageSize=1", c.adminKey, "")
	if code != http.StatusOK || len(list["managedRunners"].([]any)) != 1 || list["nextPageToken"] == "" {
		t.Errorf("list: %d %v", code, list)
	}
	if code, _ := call("POST", "/v1/sandbox/managedRunners/rest-1:applyAvailableUpdate", c.adminKey, `{}`); code != http.StatusBadRequest {
		t.Errorf("applyAvailableUpdate without a heartbeat: %d, want 400 (FAILED_PRECONDITION)", code)
	}
	if code, _ := call("DELETE", "/v1/sandbox/managedRunners/rest-1", c.adminKey, ""); code != http.StatusOK {
		t.Errorf("delete: %d", code)
	}
	if code, _ := call("GET", "/v1/sandbox/managedRunners/rest-1", c.adminKey, ""); code != http.StatusNotFound {
		t.Errorf("get deleted: %d", code)
	}
	// The gateway's REST routes still answer on the same port.
	if code, _ := call("GET", "/v1/sandboxes", c.userKey, ""); code != http.StatusOK {
		t.Errorf("gateway list on the shared port: %d", code)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestControlPlaneHeartbeatAndUpdate(t *testing.T) {
	c := startControlPlane(t)
	ctx := t.Context()
	rs := c.runners(c.adminKey)
	created, err := rs.CreateManagedRunner(ctx, connect.NewRequest(newRunner("hb", "c-hb", &structpb.Struct{})))
	if err != nil {
		t.Fatal(err)
	}
	beat := func(version string) {
		t.Helper()
		if err := controlplane.Beat(ctx, c.st, "org-a", "hb", controlplane.Status{Version: version, Ready: true,
			Capacity: controlplane.Resources{MilliCPU: 4000, MemoryBytes: 8 << 30},
			Usage:    controlplane.Resources{MilliCPU: 500, Sandboxes: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	beat("v1")
	get := func() *controlplanev1.ManagedRunner {
		t.Helper()
		r, err := rs.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "hb"}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg
	}
	r := get()
	st := r.GetStatus()
	if st.GetConnection() != controlplanev1.ConnectionStatus_CONNECTED || !st.GetReady() || st.GetVersion() != "v1" ||
		st.GetCapacity().GetMilliCpu() != 4000 || st.GetUsage().GetSandboxes() != 1 || st.GetLastHeartbeatTime() == nil {
		t.Fatalf("after a heartbeat: %v", st)
	}
	if r.GetEtag() != created.Msg.GetEtag() {
		t.Errorf("a heartbeat changed the etag: %s -> %s", created.Msg.GetEtag(), r.GetEtag())
	}
	if !st.GetUpdateAvailable() || st.GetTargetVersion() != "v2" {
		t.Errorf("update available: %v", st)
	}
	// Three intervals without a heartbeat: disconnected.
	c.advance(3*controlplane.DefaultHeartbeatInterval + time.Second)
	if got := get().GetStatus(); got.GetConnection() != controlplanev1.ConnectionStatus_DISCONNECTED || got.GetReady() {
		t.Errorf("after silence: %v", got)
	}
	c.advance(-(3*controlplane.DefaultHeartbeatInterval + time.Second))

	// applyAvailableUpdate records the desired version (an administrative write).
	_, err = rs.ApplyAvailableUpdate(ctx, connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: "hb", Etag: "stale"}))
	wantCode(t, "apply with a stale etag", err, connect.CodeAborted, apierr.EtagMismatch)
	up, err := rs.ApplyAvailableUpdate(ctx, connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: "hb", Etag: r.GetEtag()}))
	if err != nil {
		t.Fatal(err)
	}
	if up.Msg.GetStatus().GetDesiredVersion() != "v2" || up.Msg.GetEtag() == r.GetEtag() {
		t.Errorf("applied: %v", up.Msg)
	}
	beat("v2")
	if got := get().GetStatus(); got.GetUpdateAvailable() {
		t.Errorf("at the target version: %v", got)
	}
	_, err = rs.ApplyAvailableUpdate(ctx, connect.NewRequest(&controlplanev1.ApplyAvailableUpdateRequest{RunnerId: "hb"}))
	wantCode(t, "apply with nothing to apply", err, connect.CodeFailedPrecondition, apierr.NoUpdateAvailable)

	// The policy source the gateway reads.
	doc, rev, err := controlplane.NewPolicySource(c.st, "org-a").Policy(ctx, "hb")
	if err != nil || string(doc) != "{}" || rev != 1 {
		t.Errorf("policy source: %s %d %v", doc, rev, err)
	}
	if _, _, err := controlplane.NewPolicySource(c.st, "org-a").Policy(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("policy of an unknown runner: %v", err)
	}
}

func TestControlPlaneAPIKeys(t *testing.T) {
	c := startControlPlane(t)
	ctx := t.Context()
	ks := c.keys(c.adminKey)
	created, err := ks.CreateApiKey(ctx, connect.NewRequest(&controlplanev1.CreateApiKeyRequest{DisplayName: "ci"}))
	if err != nil {
		t.Fatal(err)
	}
	secret, id := created.Msg.GetSecret(), created.Msg.GetApiKey().GetKeyId()
	if !strings.HasPrefix(secret, "sbx_"+id+"_") || created.Msg.GetApiKey().GetRole() != controlplanev1.Role_SANDBOX_USER {
		t.Fatalf("created: %v", created.Msg)
	}
	// The new key works on the gateway, and is not an admin.
	if _, err := c.sandboxes(secret).ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{})); err != nil {
		t.Fatalf("gateway with the new key: %v", err)
	}
	_, err = c.runners(secret).ListManagedRunners(ctx, connect.NewRequest(&controlplanev1.ListManagedRunnersRequest{}))
	wantCode(t, "runners with the new user key", err, connect.CodePermissionDenied, apierr.PermissionDenied)

	list, err := ks.ListApiKeys(ctx, connect.NewRequest(&controlplanev1.ListApiKeysRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var found *controlplanev1.ApiKey
	for _, k := range list.Msg.GetApiKeys() {
		if k.GetKeyId() == id {
			found = k
		}
	}
	if len(list.Msg.GetApiKeys()) != 3 || found == nil || found.GetDisplayName() != "ci" {
		t.Fatalf("list: %v", list.Msg)
	}
	page, err := ks.ListApiKeys(ctx, connect.NewRequest(&controlplanev1.ListApiKeysRequest{PageSize: 2}))
	if err != nil || len(page.Msg.GetApiKeys()) != 2 || page.Msg.GetNextPageToken() == "" {
		t.Fatalf("first page: %v %v", page, err)
	}
	page, err = ks.ListApiKeys(ctx, connect.NewRequest(&controlplanev1.ListApiKeysRequest{PageSize: 2, PageToken: page.Msg.GetNextPageToken()}))
	if err != nil || len(page.Msg.GetApiKeys()) != 1 || page.Msg.GetNextPageToken() != "" {
		t.Fatalf("second page: %v %v", page, err)
	}

	revoked, err := ks.RevokeApiKey(ctx, connect.NewRequest(&controlplanev1.RevokeApiKeyRequest{KeyId: id}))
	if err != nil || revoked.Msg.GetRevokeTime() == nil {
		t.Fatalf("revoke: %v %v", revoked, err)
	}
	_, err = c.sandboxes(secret).ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
	wantCode(t, "gateway with a revoked key", err, connect.CodeUnauthenticated, apierr.Unauthenticated)
	_, err = ks.RevokeApiKey(ctx, connect.NewRequest(&controlplanev1.RevokeApiKeyRequest{KeyId: "missing"}))
	wantCode(t, "revoke unknown", err, connect.CodeNotFound, apierr.APIKeyNotFound)
	// Another organization's key cannot be revoked from here.
	other, _, err := auth.IssueKey(ctx, c.st, "org-b", auth.RoleUser, "")
	if err != nil {
		t.Fatal(err)
	}
	otherID, _ := auth.KeyID(other)
	_, err = ks.RevokeApiKey(ctx, connect.NewRequest(&controlplanev1.RevokeApiKeyRequest{KeyId: otherID}))
	wantCode(t, "revoke another organization's key", err, connect.CodeNotFound, apierr.APIKeyNotFound)
}

// TestControlPlaneSbxAdmin drives `sbx admin` in-process.
func TestControlPlaneSbxAdmin(t *testing.T) {
	c := startControlPlane(t)
	sbx := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		var out, errb bytes.Buffer
		code := sbxcli.Execute(append([]string{"--base-url", c.url, "--api-key", c.adminKey}, args...), strings.NewReader(stdin), &out, &errb)
		return out.String(), errb.String(), code
	}
	if out, errs, code := sbx("", "admin", "runner", "create", "cli-1", "--cluster-id", "c-cli", "--zone", "us-east-04a"); code != 0 {
		t.Fatalf("create: %d %s %s", code, out, errs)
	}
	if out, _, code := sbx("", "admin", "runner", "policy", "get", "cli-1"); code != 0 || strings.TrimSpace(out) != "{}" {
		t.Errorf("policy get of {}: %d %q", code, out)
	}
	if _, err := c.st.Runners().Create(t.Context(), store.Runner{Org: "org-a", RunnerID: "cli-unset", ClusterID: "c-unset", Zone: "us-east-04a"}); err != nil {
		t.Fatal(err)
	}
	if out, _, code := sbx("", "admin", "runner", "policy", "get", "cli-unset"); code != 0 || strings.TrimSpace(out) != "null" {
		t.Errorf("policy get of never-set: %d %q", code, out)
	}
	if out, errs, code := sbx(`{"constraints":{"lifetime":{"max_seconds":600}}}`, "admin", "runner", "policy", "set", "cli-1", "-f", "-"); code != 0 || !strings.Contains(out, "revision 2") {
		t.Fatalf("policy set: %d %s %s", code, out, errs)
	}
	if out, _, _ := sbx("", "admin", "runner", "policy", "get", "cli-1"); !strings.Contains(out, `"max_seconds": 600`) {
		t.Errorf("policy after set: %s", out)
	}
	if _, errs, code := sbx(`{}`, "admin", "runner", "policy", "set", "cli-1", "-f", "-", "--etag", "stale-1"); code == 0 || !strings.Contains(errs, apierr.EtagMismatch) {
		t.Errorf("policy set with a stale etag: %d %s", code, errs)
	}
	if _, errs, code := sbx(`{"constraints":{"lifetime":{"max_seconds":-5}}}`, "admin", "runner", "policy", "set", "cli-1", "-f", "-"); code == 0 || !strings.Contains(errs, "policy.constraints.lifetime.max_seconds") {
		t.Errorf("invalid policy set: %d %s", code, errs)
	}
	// YAML from a file, and `policy edit` through an editor that rewrites the document.
	yamlFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(yamlFile, []byte("# strict\nconstraints:\n  lifetime:\n    max_seconds: 900 # fifteen minutes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := sbx("", "admin", "runner", "policy", "set", "cli-1", "-f", yamlFile); code != 0 || !strings.Contains(out, "set") {
		t.Fatalf("policy set from YAML: %d %s %s", code, out, errs)
	}
	if out, _, _ := sbx("", "admin", "runner", "policy", "get", "cli-1"); !strings.Contains(out, `"max_seconds": 900`) {
		t.Errorf("policy after YAML set: %s", out)
	}
	t.Setenv("EDITOR", `sed -i 's/max_seconds: 900/max_seconds: 1200/'`)
	if out, errs, code := sbx("", "admin", "runner", "policy", "edit", "cli-1"); code != 0 || !strings.Contains(out, "set") {
		t.Fatalf("policy edit: %d %s %s", code, out, errs)
	}
	if out, _, _ := sbx("", "admin", "runner", "policy", "get", "cli-1"); !strings.Contains(out, `"max_seconds": 1200`) {
		t.Errorf("policy after edit: %s", out)
	}
	if out, _, code := sbx("", "admin", "runner", "ls"); code != 0 || !strings.Contains(out, "cli-1") || !strings.Contains(out, "cli-unset") {
		t.Errorf("ls: %d %s", code, out)
	}
	if out, _, code := sbx("", "-o", "json", "admin", "runner", "get", "cli-1"); code != 0 || !strings.Contains(out, `"runnerId"`) || !strings.Contains(out, `"cli-1"`) {
		t.Errorf("get -o json: %d %s", code, out)
	}
	key, _, code := sbx("", "admin", "apikey", "create", "--name", "from-cli")
	if code != 0 || !strings.HasPrefix(key, "sbx_") {
		t.Fatalf("apikey create: %d %q", code, key)
	}
	id, _ := auth.KeyID(strings.TrimSpace(key))
	if out, _, code := sbx("", "admin", "apikey", "ls"); code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "from-cli") {
		t.Errorf("apikey ls: %d %s", code, out)
	}
	if _, errs, code := sbx("", "admin", "apikey", "revoke", id); code != 0 {
		t.Errorf("apikey revoke: %d %s", code, errs)
	}
	if _, errs, code := sbx("", "admin", "runner", "delete", "cli-1"); code != 0 {
		t.Errorf("delete: %d %s", code, errs)
	}
	var out, errb bytes.Buffer
	if code := sbxcli.Execute([]string{"--base-url", c.url, "--api-key", c.userKey, "admin", "runner", "ls"}, strings.NewReader(""), &out, &errb); code == 0 || !strings.Contains(errb.String(), apierr.PermissionDenied) {
		t.Errorf("ls with a user key: %d %s", code, errb.String())
	}
}

// TestControlPlanePolicyReachesGateway: a policy written through the control plane is the
// one the gateway enforces on the next create.
func TestControlPlanePolicyReachesGateway(t *testing.T) {
	c := startControlPlane(t)
	ctx := t.Context()
	strict := mustStructE2E(t, map[string]any{"constraints": map[string]any{"lifetime": map[string]any{"max_seconds": 60}}})
	if _, err := c.runners(c.adminKey).CreateManagedRunner(ctx, connect.NewRequest(newRunner("idle", "c-idle", strict))); err != nil {
		t.Fatal(err)
	}
	sp := &sandboxv1.SandboxSpec{MaxLifetimeSeconds: 3600, Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}}
	_, err := c.sandboxes(c.userKey).CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
	wantCode(t, "create beyond the policy", err, connect.CodeInvalidArgument, apierr.PlacementRejected)
	if vs := apierr.Violations(err); len(vs) == 0 || vs[0].Field != "sandbox.spec.max_lifetime_seconds" {
		t.Errorf("violations: %v", vs)
	}
	// Relax it: the same create passes the policy (and reaches the idle runner, which refuses).
	if _, err := c.runners(c.adminKey).UpdateManagedRunner(ctx, connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
		ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: "idle", Policy: &structpb.Struct{}},
		UpdateMask:    &fieldmaskpb.FieldMask{Paths: []string{"policy"}}})); err != nil {
		t.Fatal(err)
	}
	_, err = c.sandboxes(c.userKey).CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
	if apierr.Reason(err) == apierr.PlacementRejected {
		t.Errorf("create after relaxing the policy: %v", err)
	}
}

func mustStructE2E(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
