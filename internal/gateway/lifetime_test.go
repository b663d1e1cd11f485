package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// staticPolicy is one policy document for every runner.
type staticPolicy string

func (p staticPolicy) Policy(context.Context, string) ([]byte, int64, error) {
	return []byte(p), 1, nil
}

// TestUpdateSandboxLifetime: over the gateway's Connect handler, with a real runner on a
// fake backend: an extension is visible in GetSandbox; bad requests get field
// violations; the runner policy's maximum holds; another organization's sandbox is
// NOT_FOUND; an ended sandbox is NOT_RUNNING; shortening into the past ends it.
func TestUpdateSandboxLifetime(t *testing.T) {
	be := runtimetest.NewFake()
	t.Cleanup(be.Close)
	rr, err := runner.New(context.Background(), runner.Config{Backend: be, DataDir: t.TempDir(), ExpiryGrace: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rr.Close)
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	acme, _, err := keys.Create("acme", auth.RoleUser, "acme")
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := keys.Create("other", auth.RoleUser, "other")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{runner.NewLocal("r1", rr)},
		Policies: staticPolicy(`{"constraints":{"lifetime":{"max_seconds":7200}}}`), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	sc := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, srv.URL)
	lc := statev1connect.NewSandboxStateServiceClient(http.DefaultClient, srv.URL)
	ctx := context.Background()
	withKey := func(h http.Header, key string) { h.Set("Authorization", "Bearer "+key) }

	create := func() string {
		t.Helper()
		req := connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			MaxLifetimeSeconds: 600, Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}}}})
		withKey(req.Header(), acme)
		res, err := sc.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetSandboxId()
	}
	update := func(key string, m *statev1.UpdateSandboxLifetimeRequest) (*statev1.UpdateSandboxLifetimeResponse, error) {
		req := connect.NewRequest(m)
		withKey(req.Header(), key)
		res, err := lc.UpdateSandboxLifetime(ctx, req)
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	get := func(id string) *sandboxv1.Sandbox {
		t.Helper()
		req := connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id})
		withKey(req.Header(), acme)
		res, err := sc.GetSandbox(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg
	}
	wantErr := func(what string, err error, code connect.Code, reason, field string) {
		t.Helper()
		if connect.CodeOf(err) != code || apierr.Reason(err) != reason {
			t.Errorf("%s: %v, want %s %s", what, err, code, reason)
			return
		}
		if field != "" {
			vs := apierr.Violations(err)
			if len(vs) != 1 || vs[0].Field != field {
				t.Errorf("%s: violations %v, want one on %s", what, vs, field)
			}
		}
	}

	id := create()
	res, err := update(acme, &statev1.UpdateSandboxLifetimeRequest{SandboxId: id, Change: &statev1.UpdateSandboxLifetimeRequest_ExtendBySeconds{ExtendBySeconds: 3000}})
	if err != nil {
		t.Fatal(err)
	}
	sb := get(id)
	created := sb.GetStatus().GetCreateTime().AsTime()
	if res.GetMaxLifetimeSeconds() != 3600 || !res.GetDeadline().AsTime().Equal(created.Add(time.Hour)) {
		t.Errorf("extend: %d s, deadline %s, want 3600 s, %s", res.GetMaxLifetimeSeconds(), res.GetDeadline().AsTime(), created.Add(time.Hour))
	}
	if got := sb.GetStatus().GetEffectiveMaxLifetimeSeconds(); got != 3600 {
		t.Errorf("GetSandbox after the extension: effective_max_lifetime_seconds %d, want 3600", got)
	}
	if res, err := update(acme, &statev1.UpdateSandboxLifetimeRequest{SandboxId: id, Change: &statev1.UpdateSandboxLifetimeRequest_MaxLifetimeSeconds{MaxLifetimeSeconds: 1800}}); err != nil || res.GetMaxLifetimeSeconds() != 1800 {
		t.Errorf("set 1800: %v %v", res, err)
	}

	// REST, per the google.api.http annotation.
	hreq, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/sandboxes/"+id+":updateLifetime", strings.NewReader(`{"extendBySeconds": 60}`))
	hreq.Header.Set("Content-Type", "application/json")
	withKey(hreq.Header, acme)
	hres, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(hres.Body)
	hres.Body.Close()
	if hres.StatusCode != http.StatusOK || !strings.Contains(string(body), `"maxLifetimeSeconds":"1860"`) {
		t.Errorf("REST: %d %s", hres.StatusCode, body)
	}

	_, err = update(acme, &statev1.UpdateSandboxLifetimeRequest{SandboxId: id})
	wantErr("no change", err, connect.CodeInvalidArgument, apierr.InvalidRequest, "max_lifetime_seconds")
	_, err = update(acme, &statev1.UpdateSandboxLifetimeRequest{SandboxId: id, Change: &statev1.UpdateSandboxLifetimeRequest_MaxLifetimeSeconds{MaxLifetimeSeconds: 7201}})
	wantErr("above the policy", err, connect.CodeInvalidArgument, apierr.InvalidRequest, "max_lifetime_seconds")
	_, err = update(acme, &statev1.UpdateSandboxLifetimeRequest{SandboxId: id, Change: &statev1.UpdateSandboxLifetimeRequest_MaxLifetimeSeconds{MaxLifetimeSeconds: 0}})
	wantErr("zero", err, connect.CodeInvalidArgument, apierr.InvalidRequest, "max_lifetime_seconds")
	_, err = update(acme, &statev1.UpdateSandboxLifetimeRequest{SandboxId: id, Change: &statev1.UpdateSandboxLifetimeRequest_ExtendBySeconds{ExtendBySeconds: 6000}})
	wantErr("extended above the policy", err, connect.CodeInvalidArgument, apierr.InvalidRequest, "extend_by_seconds")
	_, err = update(acme, &statev1.UpdateSandboxLifetimeRequest{SandboxId: id, Change: &statev1.UpdateSandboxLifetimeRequest_ExtendBySeconds{ExtendBySeconds: -1860}})
	wantErr("shortened to 0", err, connect.CodeInvalidArgument, apierr.InvalidRequest, "extend_by_seconds")
	_, err = update(acme, &statev1.UpdateSandboxLifetimeRequest{SandboxId: id, Change: &statev1.UpdateSandboxLifetimeRequest_ExtendBySeconds{ExtendBySeconds: -1 << 62}})
	wantErr("huge", err, connect.CodeInvalidArgument, apierr.InvalidRequest, "extend_by_seconds")
	_, err = update(other, &statev1.UpdateSandboxLifetimeRequest{SandboxId: id, Change: &statev1.UpdateSandboxLifetimeRequest_ExtendBySeconds{ExtendBySeconds: 60}})
	wantErr("another organization's", err, connect.CodeNotFound, apierr.SandboxNotFound, "")
	_, err = update("nope", &statev1.UpdateSandboxLifetimeRequest{SandboxId: id, Change: &statev1.UpdateSandboxLifetimeRequest_ExtendBySeconds{ExtendBySeconds: 60}})
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("without a valid key: %v", err)
	}

	// Shortened into the past: it ends as on expiry, and then cannot change.
	if _, err := update(acme, &statev1.UpdateSandboxLifetimeRequest{SandboxId: id, Change: &statev1.UpdateSandboxLifetimeRequest_MaxLifetimeSeconds{MaxLifetimeSeconds: 1}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ended, err := rr.WaitTerminal(wctx, id)
	if err != nil || ended.Reason != runner.ReasonLifetimeExceeded {
		t.Fatalf("after shortening into the past: %s %s %v", ended.State, ended.Reason, err)
	}
	_, err = update(acme, &statev1.UpdateSandboxLifetimeRequest{SandboxId: id, Change: &statev1.UpdateSandboxLifetimeRequest_ExtendBySeconds{ExtendBySeconds: 60}})
	wantErr("ended", err, connect.CodeFailedPrecondition, apierr.SandboxNotRunning, "")
}
