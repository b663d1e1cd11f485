package gateway

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	quotav1 "github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/pgtest"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// quotaRunner is one runner shared by several gateway replicas: it takes every sandbox
// (room for hundreds), fails every failEvery-th create (0: none) after a short while,
// and ends a sandbox on delete.
type quotaRunner struct {
	acceptingRunner
	failEvery int64
	n         atomic.Int64
}

func (r *quotaRunner) Create(ctx context.Context, req runner.CreateRequest) (runner.Sandbox, error) {
	time.Sleep(2 * time.Millisecond) // creates overlap
	if r.failEvery > 0 && r.n.Add(1)%r.failEvery == 0 {
		return runner.Sandbox{}, errors.New("the backend failed this create")
	}
	return r.acceptingRunner.Create(ctx, req)
}

func (r *quotaRunner) Delete(_ context.Context, id string, _ time.Duration) (runner.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.got[id]
	if !ok {
		return runner.Sandbox{}, runtime.ErrNotFound
	}
	sb.State, sb.EndedAt = runner.StateTerminated, time.Now()
	r.got[id] = sb
	return sb, nil
}

func (r *quotaRunner) List(context.Context) ([]runner.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []runner.Sandbox
	for _, sb := range r.got {
		out = append(out, sb)
	}
	return out, nil
}

func (r *quotaRunner) Capacity(context.Context) (runner.Capacity, error) {
	return runner.Capacity{MilliCPU: 1000_000, MemoryBytes: 1 << 40}, nil
}

// quotaGateways are n gateway replicas over one store (dsn) and one runner.
func quotaGateways(t *testing.T, dsn string, n int, r runner.Handle, defaults store.QuotaLimits) ([]*Server, store.Store) {
	t.Helper()
	ctx := t.Context()
	var first store.Store
	var out []*Server
	for i := range n {
		st, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		if i == 0 {
			first = st
			for _, o := range []string{testOrg, "org-b", "platform"} {
				if _, err := st.Orgs().Create(ctx, store.Org{ID: o, Name: o}); err != nil {
					t.Fatal(err)
				}
			}
		}
		keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Config{Auth: keys, Runners: []runner.Handle{r}, Index: st.Sandboxes(), Orgs: st.Orgs(),
			Quota: QuotaOptions{Store: st.Quotas(), Defaults: defaults, PlatformOrg: "platform"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		out = append(out, s)
	}
	return out, first
}

func asKey(ctx context.Context, org string, role auth.Role) context.Context {
	return auth.WithPrincipal(ctx, auth.Principal{KeyID: "k-" + org, Org: org, Role: role})
}

func smallSpec(cpu, mem string) *sandboxv1.CreateSandboxRequest {
	return &sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Image: "python:3.11", Resources: &sandboxv1.Resources{Cpu: cpu, Memory: mem}}}}}}
}

func wantQuotaExceeded(t *testing.T, err error, quota, limit string) {
	t.Helper()
	if connect.CodeOf(err) != connect.CodeResourceExhausted || apierr.Reason(err) != apierr.QuotaExceeded {
		t.Fatalf("err = %v, want RESOURCE_EXHAUSTED %s", err, apierr.QuotaExceeded)
	}
	md := errorMetadata(err)
	if md["quota"] != quota || md["limit"] != limit || md["current"] == "" || md["requested"] == "" {
		t.Fatalf("metadata = %v, want quota %s limit %s with current and requested", md, quota, limit)
	}
}

// TestQuotaTwoGatewaysRaceForTheLastSlots: two gateway replicas sharing one store
// (SQLite file, and PostgreSQL when available) take many concurrent creates of one
// organization with a quota of 5 while the runner fails some: never more than 5 are
// admitted, failed creates give their slot back (no reservation is left), and the
// organization can fill exactly its quota afterwards.
func TestQuotaTwoGatewaysRaceForTheLastSlots(t *testing.T) {
	dsns := map[string]string{"sqlite": filepath.Join(t.TempDir(), "shared.db")}
	if dsn := quotaPostgres(t); dsn != "" {
		dsns["postgres"] = dsn
	}
	for name, dsn := range dsns {
		t.Run(name, func(t *testing.T) {
			const limit = 5
			tries := 40
			if testing.Short() {
				tries = 20
			}
			r := &quotaRunner{acceptingRunner: acceptingRunner{id: "r1"}, failEvery: 3}
			gws, st := quotaGateways(t, dsn, 2, r, store.QuotaLimits{})
			max := int64(limit)
			if _, err := st.Quotas().Put(t.Context(), store.Quota{Org: testOrg, QuotaLimits: store.QuotaLimits{MaxSandboxes: &max}}); err != nil {
				t.Fatal(err)
			}
			ctx := asOrg(t.Context())
			var admitted, refused, failed atomic.Int64
			var wg sync.WaitGroup
			for i := range tries {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := gws[i%2].CreateSandbox(ctx, connect.NewRequest(smallSpec("100m", "64Mi")))
					switch {
					case err == nil:
						admitted.Add(1)
					case apierr.Reason(err) == apierr.QuotaExceeded:
						refused.Add(1)
					default:
						if failed.Add(1) <= 3 {
							t.Logf("create failed: %v", err)
						}
					}
				}()
			}
			wg.Wait()
			t.Logf("admitted %d, refused %d, failed by the runner %d", admitted.Load(), refused.Load(), failed.Load())
			if admitted.Load() > limit || admitted.Load() == 0 || refused.Load() == 0 || failed.Load() == 0 {
				t.Fatalf("admitted %d (quota %d), refused %d, failed %d", admitted.Load(), limit, refused.Load(), failed.Load())
			}
			u, err := st.Quotas().Usage(t.Context(), testOrg, time.Now())
			if err != nil || u.ReservedSandboxes != 0 || u.Sandboxes != admitted.Load() || u.MilliCPU != 100*admitted.Load() || u.MemoryBytes != (64<<20)*admitted.Load() {
				t.Fatalf("usage after the race = %+v, %v (admitted %d)", u, err, admitted.Load())
			}
			// The rest of the quota is usable (failures released their slots), and no more.
			r.failEvery = 0
			for range limit - admitted.Load() {
				if _, err := gws[1].CreateSandbox(ctx, connect.NewRequest(smallSpec("100m", "64Mi"))); err != nil {
					t.Fatalf("create within the quota: %v", err)
				}
			}
			_, err = gws[0].CreateSandbox(ctx, connect.NewRequest(smallSpec("100m", "64Mi")))
			wantQuotaExceeded(t, err, "sandboxes", "5")
			// Another organization is not counted against this one.
			if _, err := gws[0].CreateSandbox(asKey(t.Context(), "org-b", auth.RoleUser), connect.NewRequest(smallSpec("100m", "64Mi"))); err != nil {
				t.Fatalf("org-b create: %v", err)
			}
			// A deleted sandbox frees its slot, through the other replica too.
			l, err := gws[0].ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{}))
			if err != nil || len(l.Msg.GetSandboxes()) != limit {
				t.Fatalf("list = %d, %v", len(l.Msg.GetSandboxes()), err)
			}
			if _, err := gws[0].DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: l.Msg.GetSandboxes()[0].GetSandboxId()})); err != nil {
				t.Fatal(err)
			}
			if _, err := gws[1].CreateSandbox(ctx, connect.NewRequest(smallSpec("100m", "64Mi"))); err != nil {
				t.Fatalf("create after a delete: %v", err)
			}
		})
	}
}

// TestQuotaCPUAndMemory: the CPU and memory limits count the resolved requests of the
// organization's live sandboxes; a sandbox that ended unobserved (its runner ended it, no
// gateway saw it) stops counting when a refusal makes the gateway look.
func TestQuotaCPUAndMemory(t *testing.T) {
	r := &quotaRunner{acceptingRunner: acceptingRunner{id: "r1"}}
	cpu, mem := int64(1500), int64(1<<30)
	gws, _ := quotaGateways(t, filepath.Join(t.TempDir(), "q.db"), 1, r, store.QuotaLimits{MaxMilliCPU: &cpu, MaxMemoryBytes: &mem})
	s := gws[0]
	ctx := asOrg(t.Context())
	first, err := s.CreateSandbox(ctx, connect.NewRequest(smallSpec("1", "256Mi")))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.CreateSandbox(ctx, connect.NewRequest(smallSpec("600m", "256Mi")))
	wantQuotaExceeded(t, err, "cpu_millicores", "1500")
	_, err = s.CreateSandbox(ctx, connect.NewRequest(smallSpec("500m", "900Mi")))
	wantQuotaExceeded(t, err, "memory_bytes", fmt.Sprint(1<<30))
	if _, err := s.CreateSandbox(ctx, connect.NewRequest(smallSpec("500m", "768Mi"))); err != nil {
		t.Fatalf("create that fits exactly: %v", err)
	}
	// The first sandbox ends on its runner; the index still has it live until asked.
	r.mu.Lock()
	sb := r.got[first.Msg.GetSandboxId()]
	sb.State, sb.EndedAt = runner.StateCompleted, time.Now()
	r.got[sb.ID] = sb
	r.mu.Unlock()
	if _, err := s.CreateSandbox(ctx, connect.NewRequest(smallSpec("1", "256Mi"))); err != nil {
		t.Fatalf("create once the first ended: %v", err)
	}
	u, err := s.GetQuotaUsage(ctx, connect.NewRequest(&quotav1.GetQuotaUsageRequest{}))
	if err != nil || u.Msg.GetSandboxes() != 2 || u.Msg.GetCpuMillicores() != 1500 || u.Msg.GetEffective().GetMaxCpuMillicores() != 1500 ||
		u.Msg.GetEffective().MaxSandboxes != nil {
		t.Fatalf("usage = %v, %v", u.Msg, err)
	}
}

// TestQuotaForkTakesOneSlotPerFork: ForkSandbox of N takes N slots; refused whole when
// they do not all fit.
func TestQuotaForkTakesOneSlotPerFork(t *testing.T) {
	r := newPauseRunner("r1")
	three := int64(3)
	gws, st := quotaGateways(t, filepath.Join(t.TempDir(), "q.db"), 1, r, store.QuotaLimits{MaxSandboxes: &three})
	s := gws[0]
	ctx := asOrg(t.Context())
	src, err := s.CreateSandbox(ctx, connect.NewRequest(smallSpec("100m", "")))
	if err != nil {
		t.Fatal(err)
	}
	id := src.Msg.GetSandboxId()
	r.setState(id, runner.StateRunning)
	fork := func(n int32) (*statev1.ForkSandboxResponse, error) {
		res, err := s.ForkSandbox(ctx, connect.NewRequest(&statev1.ForkSandboxRequest{SandboxId: id, Count: n}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	_, err = fork(3) // 1 + 3 > 3
	wantQuotaExceeded(t, err, "sandboxes", "3")
	if len(r.forks) != 0 {
		t.Fatalf("the runner was asked to fork past the quota: %v", r.forks)
	}
	// Two forks, one failing on the runner: its slot is given back.
	r.forkErrs = map[int]error{1: fmt.Errorf("%w: no room for its checkpoint", runner.ErrNotRunning)}
	out, err := fork(2)
	if err != nil || out.GetForks()[0].GetError() != nil || out.GetForks()[1].GetError() == nil {
		t.Fatalf("fork 2 = %v, %v", out, err)
	}
	r.forkErrs = nil
	if u, _ := st.Quotas().Usage(t.Context(), testOrg, time.Now()); u.Sandboxes != 2 || u.ReservedSandboxes != 0 || u.MilliCPU != 200 {
		t.Fatalf("usage after the forks = %+v", u)
	}
	if out, err := fork(1); err != nil || out.GetForks()[0].GetError() != nil {
		t.Fatalf("the last slot: %v, %v", out, err)
	}
	_, err = fork(1)
	wantQuotaExceeded(t, err, "sandboxes", "3")
	// A paused sandbox keeps its slot (it resumes on its runner without the gateway).
	r.setState(id, runner.StatePaused)
	_, err = s.CreateSandbox(ctx, connect.NewRequest(smallSpec("100m", "")))
	wantQuotaExceeded(t, err, "sandboxes", "3")
}

// TestQuotaAdminAPI: only the platform organization's admins set quotas; an
// organization's own admin may not (not even its own), and reads only its own.
func TestQuotaAdminAPI(t *testing.T) {
	r := &quotaRunner{acceptingRunner: acceptingRunner{id: "r1"}}
	gws, _ := quotaGateways(t, filepath.Join(t.TempDir(), "q.db"), 1, r, store.QuotaLimits{})
	s := gws[0]
	one := int64(1)
	set := func(ctx context.Context, org string) error {
		_, err := s.SetQuota(ctx, connect.NewRequest(&quotav1.SetQuotaRequest{OrgId: org, Limits: &quotav1.QuotaLimits{MaxSandboxes: &one}}))
		return err
	}
	tenantAdmin := asKey(t.Context(), testOrg, auth.RoleAdmin)
	for _, org := range []string{testOrg, "org-b"} {
		if err := set(tenantAdmin, org); connect.CodeOf(err) != connect.CodePermissionDenied || apierr.Reason(err) != apierr.PermissionDenied {
			t.Fatalf("tenant admin sets %s's quota: %v", org, err)
		}
	}
	if err := set(asKey(t.Context(), "platform", auth.RoleUser), testOrg); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("platform user key sets a quota: %v", err)
	}
	platform := asKey(t.Context(), "platform", auth.RoleAdmin)
	if err := set(platform, "no-such-org"); apierr.Reason(err) != apierr.InvalidRequest {
		t.Fatalf("quota of an unknown organization: %v", err)
	}
	bad := int64(-5)
	if _, err := s.SetQuota(platform, connect.NewRequest(&quotav1.SetQuotaRequest{OrgId: testOrg, Limits: &quotav1.QuotaLimits{MaxMemoryBytes: &bad}})); apierr.Reason(err) != apierr.InvalidRequest {
		t.Fatalf("limit -5: %v", err)
	}
	if err := set(platform, testOrg); err != nil {
		t.Fatal(err)
	}
	ctx := asOrg(t.Context())
	if _, err := s.CreateSandbox(ctx, connect.NewRequest(smallSpec("", ""))); err != nil {
		t.Fatal(err)
	}
	_, err := s.CreateSandbox(ctx, connect.NewRequest(smallSpec("", "")))
	wantQuotaExceeded(t, err, "sandboxes", "1")
	// Reads: its own, not another's.
	q, err := s.GetQuota(ctx, connect.NewRequest(&quotav1.GetQuotaRequest{OrgId: testOrg}))
	if err != nil || q.Msg.GetLimits().GetMaxSandboxes() != 1 || q.Msg.GetUpdatedBy() != "k-platform" {
		t.Fatalf("own quota = %v, %v", q, err)
	}
	if _, err := s.GetQuotaUsage(ctx, connect.NewRequest(&quotav1.GetQuotaUsageRequest{OrgId: "org-b"})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("usage of another organization: %v", err)
	}
	if u, err := s.GetQuotaUsage(platform, connect.NewRequest(&quotav1.GetQuotaUsageRequest{OrgId: testOrg})); err != nil || u.Msg.GetSandboxes() != 1 {
		t.Fatalf("platform reads org-a's usage: %v, %v", u, err)
	}
	if u, err := s.GetQuotaUsage(asKey(t.Context(), "org-b", auth.RoleUser), connect.NewRequest(&quotav1.GetQuotaUsageRequest{})); err != nil || u.Msg.GetSandboxes() != 0 || u.Msg.GetOrgId() != "org-b" {
		t.Fatalf("org-b's own usage: %v, %v", u, err)
	}
}

// errorMetadata is the ErrorInfo metadata of err.
func errorMetadata(err error) map[string]string {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if info, ok := v.(*errdetails.ErrorInfo); ok {
				return info.GetMetadata()
			}
		}
	}
	return nil
}

// quotaPostgres is a DSN of a fresh PostgreSQL schema (pgtest), "" when there is none.
func quotaPostgres(t *testing.T) string { return pgtest.SchemaFor(t, "quota") }

// TestQuotaReconcileFreesEndedSlots: a sandbox that ended on its runner unobserved is
// recorded ended by the reconciler, and stops counting against the quota.
func TestQuotaReconcileFreesEndedSlots(t *testing.T) {
	r := &quotaRunner{acceptingRunner: acceptingRunner{id: "r1"}}
	gws, st := quotaGateways(t, filepath.Join(t.TempDir(), "q.db"), 1, r, store.QuotaLimits{})
	ctx := asOrg(t.Context())
	sb, err := gws[0].CreateSandbox(ctx, connect.NewRequest(smallSpec("250m", "")))
	if err != nil {
		t.Fatal(err)
	}
	if u, _ := st.Quotas().Usage(t.Context(), testOrg, time.Now()); u.Sandboxes != 1 || u.MilliCPU != 250 {
		t.Fatalf("usage = %+v", u)
	}
	r.mu.Lock()
	x := r.got[sb.Msg.GetSandboxId()]
	x.State, x.EndedAt = runner.StateCompleted, time.Now()
	r.got[x.ID] = x
	r.mu.Unlock()
	gws[0].Reconcile(t.Context())
	if u, _ := st.Quotas().Usage(t.Context(), testOrg, time.Now()); u.Sandboxes != 0 || u.MilliCPU != 0 {
		t.Fatalf("usage after the reconciler = %+v", u)
	}
}
