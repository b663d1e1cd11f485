package controlplane_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/structpb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/pgtest"
	"github.com/sandboxd/sandboxd/internal/store"
)

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func fields(err error) []string {
	var out []string
	for _, v := range apierr.Violations(err) {
		out = append(out, v.Field)
	}
	slices.Sort(out)
	return out
}

func TestValidateCreate(t *testing.T) {
	ok := func() *controlplanev1.ManagedRunner {
		return &controlplanev1.ManagedRunner{RunnerId: "r-1", ClusterId: "6f1c1d2e-0000-4000-8000-000000000001", Zone: "us-east-04a", Policy: &structpb.Struct{}}
	}
	for _, tc := range []struct {
		name   string
		edit   func(r *controlplanev1.ManagedRunner)
		fields []string // nil: valid
	}{
		{"valid", func(*controlplanev1.ManagedRunner) {}, nil},
		{"valid with everything", func(r *controlplanev1.ManagedRunner) {
			r.RunnerGroupId, r.DisplayName, r.ReleaseChannel = "gpu", "GPU pool", controlplanev1.ReleaseChannel_RAPID
		}, nil},
		{"runner_id missing", func(r *controlplanev1.ManagedRunner) { r.RunnerId = "" }, []string{"managed_runner.runner_id"}},
		{"runner_id uppercase", func(r *controlplanev1.ManagedRunner) { r.RunnerId = "Runner" }, []string{"managed_runner.runner_id"}},
		{"runner_id starts with a digit", func(r *controlplanev1.ManagedRunner) { r.RunnerId = "1r" }, []string{"managed_runner.runner_id"}},
		{"runner_id ends with -", func(r *controlplanev1.ManagedRunner) { r.RunnerId = "r-" }, []string{"managed_runner.runner_id"}},
		{"runner_id too long", func(r *controlplanev1.ManagedRunner) { r.RunnerId = "r" + strings.Repeat("a", 63) }, []string{"managed_runner.runner_id"}},
		{"cluster_id missing", func(r *controlplanev1.ManagedRunner) { r.ClusterId = "" }, []string{"managed_runner.cluster_id"}},
		{"cluster_id with a slash", func(r *controlplanev1.ManagedRunner) { r.ClusterId = "a/b" }, []string{"managed_runner.cluster_id"}},
		{"zone missing", func(r *controlplanev1.ManagedRunner) { r.Zone = "" }, []string{"managed_runner.zone"}},
		{"zone uppercase", func(r *controlplanev1.ManagedRunner) { r.Zone = "US-EAST" }, []string{"managed_runner.zone"}},
		{"group invalid", func(r *controlplanev1.ManagedRunner) { r.RunnerGroupId = "-x" }, []string{"managed_runner.runner_group_id"}},
		{"display name too long", func(r *controlplanev1.ManagedRunner) { r.DisplayName = strings.Repeat("x", 257) }, []string{"managed_runner.display_name"}},
		{"unknown channel", func(r *controlplanev1.ManagedRunner) { r.ReleaseChannel = 7 }, []string{"managed_runner.release_channel"}},
		{"policy missing", func(r *controlplanev1.ManagedRunner) { r.Policy = nil }, []string{"managed_runner.policy"}},
		{"policy unknown field", func(r *controlplanev1.ManagedRunner) { r.Policy = mustStruct(t, map[string]any{"nope": 1}) }, []string{"managed_runner.policy"}},
		{"policy invalid value", func(r *controlplanev1.ManagedRunner) {
			r.Policy = mustStruct(t, map[string]any{"constraints": map[string]any{"lifetime": map[string]any{"max_seconds": -1}}})
		}, []string{"managed_runner.policy.constraints.lifetime.max_seconds"}},
		{"several at once", func(r *controlplanev1.ManagedRunner) { r.RunnerId, r.Zone, r.Policy = "", "Z", nil },
			[]string{"managed_runner.policy", "managed_runner.runner_id", "managed_runner.zone"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok()
			tc.edit(r)
			rec, err := controlplane.ValidateCreate(r)
			if tc.fields == nil {
				if err != nil {
					t.Fatalf("valid runner refused: %v", err)
				}
				if rec.RunnerID != r.RunnerId || string(rec.Policy) == "" {
					t.Fatalf("record: %+v", rec)
				}
				return
			}
			if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.InvalidRequest {
				t.Fatalf("err = %v, want INVALID_ARGUMENT", err)
			}
			if got := fields(err); !slices.Equal(got, tc.fields) {
				t.Fatalf("violations on %v, want %v (%v)", got, tc.fields, err)
			}
		})
	}
	if _, err := controlplane.ValidateCreate(nil); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("nil runner: %v", err)
	}
}

func TestValidateUpdate(t *testing.T) {
	req := func(r *controlplanev1.ManagedRunner, paths ...string) *controlplanev1.UpdateManagedRunnerRequest {
		if r.RunnerId == "" {
			r.RunnerId = "r1"
		}
		return &controlplanev1.UpdateManagedRunnerRequest{ManagedRunner: r, UpdateMask: &fieldmaskpb.FieldMask{Paths: paths}}
	}
	for _, tc := range []struct {
		name   string
		req    *controlplanev1.UpdateManagedRunnerRequest
		fields []string
		check  func(t *testing.T, u store.RunnerUpdate)
	}{
		{"policy", req(&controlplanev1.ManagedRunner{Policy: &structpb.Struct{}}, "policy"), nil, func(t *testing.T, u store.RunnerUpdate) {
			if string(u.Policy) != "{}" || u.DisplayName != nil {
				t.Errorf("update %+v", u)
			}
		}},
		{"display name only, other fields ignored", req(&controlplanev1.ManagedRunner{DisplayName: "x", RunnerGroupId: "g"}, "display_name"), nil, func(t *testing.T, u store.RunnerUpdate) {
			if u.DisplayName == nil || *u.DisplayName != "x" || u.RunnerGroupID != nil || u.Policy != nil {
				t.Errorf("update %+v", u)
			}
		}},
		{"JSON path names", req(&controlplanev1.ManagedRunner{DisplayName: "x"}, "displayName", "runnerGroupId"), nil, func(t *testing.T, u store.RunnerUpdate) {
			if u.DisplayName == nil || u.RunnerGroupID == nil || *u.RunnerGroupID != store.DefaultRunnerGroup {
				t.Errorf("update %+v (an empty group resets to default)", u)
			}
		}},
		{"release channel", req(&controlplanev1.ManagedRunner{ReleaseChannel: controlplanev1.ReleaseChannel_RAPID}, "release_channel"), nil, func(t *testing.T, u store.RunnerUpdate) {
			if u.ReleaseChannel == nil || *u.ReleaseChannel != store.ChannelRapid {
				t.Errorf("update %+v", u)
			}
		}},
		{"no mask", req(&controlplanev1.ManagedRunner{Policy: &structpb.Struct{}}), []string{"update_mask"}, nil},
		{"policy unset", req(&controlplanev1.ManagedRunner{}, "policy"), []string{"managed_runner.policy"}, nil},
		{"immutable field", req(&controlplanev1.ManagedRunner{ClusterId: "c2"}, "cluster_id"), []string{"update_mask"}, nil},
		{"unknown path", req(&controlplanev1.ManagedRunner{}, "status"), []string{"update_mask"}, nil},
		{"bad runner id", req(&controlplanev1.ManagedRunner{RunnerId: "Bad"}, "display_name"), []string{"managed_runner.runner_id"}, nil},
		{"invalid policy", req(&controlplanev1.ManagedRunner{Policy: mustStruct(t, map[string]any{"version": 99})}, "policy"), []string{"managed_runner.policy.version"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := controlplane.ValidateUpdate(tc.req)
			if tc.fields == nil {
				if err != nil {
					t.Fatal(err)
				}
				tc.check(t, u)
				return
			}
			if got := fields(err); !slices.Equal(got, tc.fields) {
				t.Fatalf("violations on %v, want %v (%v)", got, tc.fields, err)
			}
		})
	}
}

// backends are the stores the service tests run on: SQLite always, PostgreSQL when
// SANDBOXD_TEST_POSTGRES_DSN names one (each test in a schema of its own there: runner
// IDs are unique across organizations).
func backends(t *testing.T) map[string]store.Store {
	t.Helper()
	out := map[string]store.Store{}
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	out["sqlite"] = st
	if admin := os.Getenv("SANDBOXD_TEST_POSTGRES_DSN"); admin != "" {
		dsn, drop, err := pgtest.NewSchema(t.Context(), admin, "cp")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(drop)
		pg, err := store.Open(t.Context(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pg.Close() })
		out["postgres"] = pg
	}
	return out
}

func randomOrg(t *testing.T) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "org-" + hex.EncodeToString(b)
}

func TestServiceOverStore(t *testing.T) {
	for name, st := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			org := randomOrg(t)
			if err := controlplane.EnsureOrg(ctx, st, org); err != nil {
				t.Fatal(err)
			}
			if err := controlplane.EnsureOrg(ctx, st, org); err != nil {
				t.Fatalf("EnsureOrg twice: %v", err)
			}
			key, err := controlplane.EnsureAdminKey(ctx, st, org)
			if err != nil || key == "" {
				t.Fatalf("admin key: %q %v", key, err)
			}
			if again, err := controlplane.EnsureAdminKey(ctx, st, org); err != nil || again != "" {
				t.Fatalf("second EnsureAdminKey: %q %v", again, err)
			}
			a := auth.NewStoreAuthenticator(st, nil)
			defer a.Wait()
			p, err := a.Authenticate(key)
			if err != nil || p.Org != org || p.Role != auth.RoleAdmin {
				t.Fatalf("authenticate: %+v %v", p, err)
			}
			svc, err := controlplane.New(controlplane.Config{Store: st, Auth: a, PlatformOrg: org, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			actx := auth.WithPrincipal(ctx, p)
			cluster := org + "-c"
			_, err = svc.CreateManagedRunner(actx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
				RunnerId: "r1", ClusterId: cluster, Zone: "z1", Policy: &structpb.Struct{}}}))
			if err != nil {
				t.Fatal(err)
			}
			_, err = svc.CreateManagedRunner(actx, connect.NewRequest(&controlplanev1.CreateManagedRunnerRequest{ManagedRunner: &controlplanev1.ManagedRunner{
				RunnerId: "r2", ClusterId: cluster, Zone: "z1", Policy: &structpb.Struct{}}}))
			if connect.CodeOf(err) != connect.CodeAlreadyExists || !strings.Contains(err.Error(), cluster) {
				t.Fatalf("same cluster: %v", err)
			}
			r, created, err := controlplane.EnsureRunner(ctx, st, store.Runner{Org: org, RunnerID: "r1", ClusterID: cluster, Zone: "z1"})
			if err != nil || created || r.PolicyRevision != 1 {
				t.Fatalf("EnsureRunner of an existing runner: %+v %v %v", r, created, err)
			}
			upd, err := svc.UpdateManagedRunner(actx, connect.NewRequest(&controlplanev1.UpdateManagedRunnerRequest{
				ManagedRunner: &controlplanev1.ManagedRunner{RunnerId: "r1", Policy: mustStruct(t, map[string]any{"constraints": map[string]any{}})},
				UpdateMask:    &fieldmaskpb.FieldMask{Paths: []string{"policy"}}}))
			if err != nil || upd.Msg.GetPolicyRevision() != 2 {
				t.Fatalf("update without etag: %v %v", upd, err)
			}
			doc, rev, err := controlplane.NewPolicySource(st, org).Policy(ctx, "r1")
			if err != nil || rev != 2 || !strings.Contains(string(doc), "constraints") {
				t.Fatalf("policy source: %s %d %v", doc, rev, err)
			}
			if _, err := st.APIKeys().Revoke(ctx, org, p.KeyID); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Authenticate(key); !errors.Is(err, auth.ErrInvalidKey) {
				t.Fatalf("revoked key: %v", err)
			}
			// Revoked: a new admin key is issued on the next start.
			if again, err := controlplane.EnsureAdminKey(ctx, st, org); err != nil || again == "" {
				t.Fatalf("EnsureAdminKey after revocation: %q %v", again, err)
			}
		})
	}
}

func TestRoute(t *testing.T) {
	var hit string
	cp := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hit = "cp" })
	gw := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hit = "gw" })
	h := controlplane.Route(cp, gw)
	for path, want := range map[string]string{
		"/sandboxd.controlplane.v1.RunnerManagementService/GetManagedRunner": "cp",
		"/v1/sandbox/managedRunners":                                         "cp",
		"/v1/sandbox/managedRunners/r1:applyAvailableUpdate":                 "cp",
		"/v1/sandbox/apiKeys":                                                "cp",
		"/v1/sandboxes":                                                      "gw",
		"/coreweave.sandbox.v1.SandboxService/ListSandboxes":                 "gw",
		"/readyz": "gw",
	} {
		hit = ""
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", path, nil))
		if hit != want {
			t.Errorf("%s went to %q, want %q", path, hit, want)
		}
	}
}

func TestPolicySourceKeepsLastKnown(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.EnsureOrg(ctx, st, "o"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := controlplane.EnsureRunner(ctx, st, store.Runner{Org: "o", RunnerID: "r", ClusterID: "c", Zone: "z"}); err != nil {
		t.Fatal(err)
	}
	ps := controlplane.NewPolicySource(st, "o")
	if doc, rev, err := ps.Policy(ctx, "r"); err != nil || string(doc) != "{}" || rev != 1 {
		t.Fatalf("policy: %s %d %v", doc, rev, err)
	}
	_ = st.Close() // the store goes away
	if doc, rev, err := ps.Policy(ctx, "r"); err != nil || string(doc) != "{}" || rev != 1 {
		t.Fatalf("last-known policy: %s %d %v", doc, rev, err)
	}
	if _, _, err := ps.Policy(ctx, "other"); err == nil {
		t.Fatal("a runner never read has no last-known policy")
	}
}
