package gateway

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	quotav1 "github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// volumeQuotaGateways are n gateway replicas over one store (dsn) with registered
// volumes and quotas, and one volume-holding runner.
func volumeQuotaGateways(t *testing.T, dsn string, n int, r runner.Handle, defaults store.QuotaLimits) ([]*Server, store.Store) {
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
			for _, o := range []string{testOrg, "platform"} {
				if _, err := st.Orgs().Create(ctx, store.Org{ID: o, Name: o}); err != nil {
					t.Fatal(err)
				}
			}
		}
		keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Config{Auth: keys, Runners: []runner.Handle{r}, Index: st.Sandboxes(), Orgs: st.Orgs(), Volumes: st.Volumes(),
			Quota: QuotaOptions{Store: st.Quotas(), Defaults: defaults, PlatformOrg: "platform"}, Logger: quietLog()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		out = append(out, s)
	}
	return out, first
}

func sizedVolume(id, claim, size string) *sandboxv1.Volume {
	v := pvcVolume(id, "r1", claim)
	v.Spec.Size = size
	return v
}

// TestVolumeBytesTwoGatewaysRace: two gateway replicas sharing one store (SQLite, and
// PostgreSQL when available) take concurrent CreateVolume calls of 1Gi each against a
// max_volume_bytes of 5Gi: exactly five are admitted, the rest are RESOURCE_EXHAUSTED
// CWSANDBOX_QUOTA_EXCEEDED naming volume_bytes and its limit; usage reports them; a
// delete frees its bytes.
func TestVolumeBytesTwoGatewaysRace(t *testing.T) {
	dsns := map[string]string{"sqlite": filepath.Join(t.TempDir(), "shared.db")}
	if dsn := quotaPostgres(t); dsn != "" {
		dsns["postgres"] = dsn
	}
	for name, dsn := range dsns {
		t.Run(name, func(t *testing.T) {
			r := &volumeRunner{acceptingRunner: acceptingRunner{id: "r1"}}
			gws, _ := volumeQuotaGateways(t, dsn, 2, r, store.QuotaLimits{})
			platform := asKey(t.Context(), "platform", auth.RoleAdmin)
			limit := int64(5 << 30)
			if _, err := gws[0].SetQuota(platform, connect.NewRequest(&quotav1.SetQuotaRequest{OrgId: testOrg, Limits: &quotav1.QuotaLimits{MaxVolumeBytes: &limit}})); err != nil {
				t.Fatal(err)
			}
			admin := tmplAdmin(testOrg)
			const tries = 16
			var ok, refused atomic.Int64
			var wg sync.WaitGroup
			for i := range tries {
				wg.Add(1)
				go func() {
					defer wg.Done()
					id := fmt.Sprintf("v%d", i)
					_, err := gws[i%2].CreateVolume(admin, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: sizedVolume(id, id, "1Gi")}))
					switch {
					case err == nil:
						ok.Add(1)
					case apierr.Reason(err) == apierr.QuotaExceeded:
						md := errorMetadata(err)
						if connect.CodeOf(err) != connect.CodeResourceExhausted || md["quota"] != "volume_bytes" || md["limit"] != fmt.Sprint(limit) ||
							md["requested"] != fmt.Sprint(1<<30) || !strings.Contains(err.Error(), "max_volume_bytes") {
							t.Errorf("refusal = %v %v", err, md)
						}
						refused.Add(1)
					default:
						t.Errorf("create %s: %v", id, err)
					}
				}()
			}
			wg.Wait()
			if ok.Load() != 5 || refused.Load() != tries-5 {
				t.Fatalf("admitted %d, refused %d; want 5 and %d", ok.Load(), refused.Load(), tries-5)
			}
			u, err := gws[1].GetQuotaUsage(tmplUser(testOrg), connect.NewRequest(&quotav1.GetQuotaUsageRequest{}))
			if err != nil || u.Msg.GetVolumes() != 5 || u.Msg.GetVolumeBytes() != 5<<30 || u.Msg.GetEffective().GetMaxVolumeBytes() != limit {
				t.Fatalf("usage = %v, %v", u.Msg, err)
			}
			l, err := gws[0].ListVolumes(admin, connect.NewRequest(&sandboxv1.ListVolumesRequest{}))
			if err != nil || len(l.Msg.GetVolumes()) != 5 {
				t.Fatalf("list = %v, %v", l, err)
			}
			victim := l.Msg.GetVolumes()[0].GetVolumeId()
			waitVolume(t, gws[0], admin, victim)
			if _, err := gws[0].DeleteVolume(admin, connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: victim})); err != nil {
				t.Fatal(err)
			}
			if _, err := gws[1].CreateVolume(admin, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: sizedVolume("again", "again", "1Gi")})); err != nil {
				t.Fatalf("create after a delete: %v", err)
			}
			_, err = gws[1].CreateVolume(admin, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: sizedVolume("more", "more", "16Mi")}))
			wantQuotaExceeded(t, err, "volume_bytes", fmt.Sprint(limit))
		})
	}
}

// TestVolumeSizeAndGrow: spec.size is checked (a quantity, 16Mi..1Ti, whole Mi), sent to
// the runner and reported (spec.size, status.capacity); "" is 10Gi; UpdateVolume with
// update_mask spec.size grows a READY volume within max_volume_bytes, never shrinks it,
// and a runner that cannot grow it leaves the size as it was.
func TestVolumeSizeAndGrow(t *testing.T) {
	r := &volumeRunner{acceptingRunner: acceptingRunner{id: "r1"}}
	four := int64(4 << 30)
	gws, st := volumeQuotaGateways(t, filepath.Join(t.TempDir(), "v.db"), 1, r, store.QuotaLimits{MaxVolumeBytes: &four})
	s := gws[0]
	admin := tmplAdmin(testOrg)
	for _, size := range []string{"1Ki", "15Mi", "2Ti", "abc", "1.5Mi", "-1Gi", strings.Repeat("9", 40)} {
		_, err := s.CreateVolume(admin, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: sizedVolume("x", "x", size)}))
		if apierr.Reason(err) != apierr.InvalidRequest || !strings.Contains(err.Error(), "volume.spec.size") {
			t.Errorf("size %q = %v", size, err)
		}
	}
	// The default (10Gi) is over the default quota of 4Gi.
	_, err := s.CreateVolume(admin, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: pvcVolume("big", "r1", "big")}))
	wantQuotaExceeded(t, err, "volume_bytes", fmt.Sprint(four))
	v, err := s.CreateVolume(admin, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: sizedVolume("data", "data", "1Gi")}))
	if err != nil || v.Msg.GetSpec().GetSize() != "1Gi" {
		t.Fatalf("create = %v, %v", v, err)
	}
	got := waitVolume(t, s, admin, "data")
	if got.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_READY || got.GetStatus().GetCapacity() != "1Gi" || got.GetSpec().GetSize() != "1Gi" {
		t.Fatalf("ready = %v", got)
	}
	r.vmu.Lock()
	if last := r.ensured[len(r.ensured)-1]; last.SizeBytes != 1<<30 {
		t.Fatalf("runner got %+v", last)
	}
	r.vmu.Unlock()
	grow := func(id, size string) (*sandboxv1.Volume, error) {
		res, err := s.UpdateVolume(admin, connect.NewRequest(&sandboxv1.UpdateVolumeRequest{VolumeId: id,
			Volume: &sandboxv1.Volume{Spec: &sandboxv1.VolumeSpec{Size: size}}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec.size"}}}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	if _, err := grow("data", "512Mi"); apierr.Reason(err) != apierr.InvalidRequest || !strings.Contains(err.Error(), "only grows") {
		t.Fatalf("shrink = %v", err)
	}
	if _, err := grow("data", ""); apierr.Reason(err) != apierr.InvalidRequest {
		t.Fatalf("empty size = %v", err)
	}
	_, err = grow("data", "5Gi")
	wantQuotaExceeded(t, err, "volume_bytes", fmt.Sprint(four))
	out, err := grow("data", "3Gi")
	if err != nil || out.GetSpec().GetSize() != "3Gi" || out.GetStatus().GetCapacity() != "3Gi" {
		t.Fatalf("grow = %v, %v", out, err)
	}
	if u, _ := st.Quotas().Usage(t.Context(), testOrg, time.Now()); u.VolumeBytes != 3<<30 {
		t.Fatalf("usage after grow = %+v", u)
	}
	// A runner that cannot grow it: refused with its reason, the size put back.
	if _, err := s.CreateVolume(admin, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: sizedVolume("ng", "nogrow", "16Mi")})); err != nil {
		t.Fatal(err)
	}
	waitVolume(t, s, admin, "ng")
	if _, err := grow("ng", "512Mi"); apierr.Reason(err) != apierr.VolumeInUse {
		t.Fatalf("runner refusal = %v", err)
	}
	if g, _ := s.GetVolume(admin, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "ng"})); g.Msg.GetSpec().GetSize() != "16Mi" {
		t.Fatalf("size after a failed grow = %v", g.Msg)
	}
	// Another path is still refused, naming it.
	_, err = s.UpdateVolume(admin, connect.NewRequest(&sandboxv1.UpdateVolumeRequest{VolumeId: "data", Volume: &sandboxv1.Volume{},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec.read_only"}}}))
	if apierr.Reason(err) != apierr.InvalidRequest || !strings.Contains(err.Error(), "update_mask.paths[0]") {
		t.Fatalf("read_only = %v", err)
	}
}

// TestSnapshotLimitsPerOrg: an organization's max_snapshots and max_snapshot_bytes
// override the gateway's --fss-max-* flags (-1: unlimited, 0: none), and usage reports
// the effective ones.
func TestSnapshotLimitsPerOrg(t *testing.T) {
	r := &volumeRunner{acceptingRunner: acceptingRunner{id: "r1"}}
	gws, st := volumeQuotaGateways(t, filepath.Join(t.TempDir(), "v.db"), 1, r, store.QuotaLimits{})
	s := gws[0]
	s.fss.Limits = SnapshotLimits{MaxPerOrg: 10, MaxBytesPerOrg: 1 << 30}
	ctx := t.Context()
	l, zero, err := s.orgSnapshotLimits(ctx, testOrg)
	if err != nil || zero != "" || l.MaxPerOrg != 10 || l.MaxBytesPerOrg != 1<<30 {
		t.Fatalf("defaults = %+v %q %v", l, zero, err)
	}
	put := func(n, b *int64) {
		if _, err := st.Quotas().Put(ctx, store.Quota{Org: testOrg, QuotaLimits: store.QuotaLimits{MaxSnapshots: n, MaxSnapshotBytes: b}}); err != nil {
			t.Fatal(err)
		}
	}
	two, unl, zeroV := int64(2), int64(-1), int64(0)
	put(&two, &unl)
	l, zero, _ = s.orgSnapshotLimits(ctx, testOrg)
	if zero != "" || l.MaxPerOrg != 2 || l.MaxBytesPerOrg < 1<<50 {
		t.Fatalf("override = %+v %q", l, zero)
	}
	usage := func(n int) UsageFunc {
		return func(context.Context, string) (int, int64, error) { return n, 100, nil }
	}
	if _, err := checkSnapshotAdmission(ctx, usage(1), testOrg, 0, l); err != nil {
		t.Fatalf("second snapshot: %v", err)
	}
	if _, err := checkSnapshotAdmission(ctx, usage(2), testOrg, 0, l); apierr.Reason(err) != apierr.FSSQuotaExceeded || errorMetadata(err)["limit"] != "2" {
		t.Fatalf("third snapshot = %v", err)
	}
	put(&zeroV, nil)
	if _, zero, _ = s.orgSnapshotLimits(ctx, testOrg); zero != "snapshots" {
		t.Fatalf("zero = %q", zero)
	}
	put(&two, nil)
	u, err := s.GetQuotaUsage(tmplUser(testOrg), connect.NewRequest(&quotav1.GetQuotaUsageRequest{}))
	if err != nil || u.Msg.GetEffective().GetMaxSnapshots() != 2 || u.Msg.GetEffective().GetMaxSnapshotBytes() != 1<<30 {
		t.Fatalf("usage = %v, %v", u, err)
	}
	// SetQuota takes the new limits and refuses below -1, naming the field.
	platform := asKey(ctx, "platform", auth.RoleAdmin)
	bad := int64(-5)
	_, err = s.SetQuota(platform, connect.NewRequest(&quotav1.SetQuotaRequest{OrgId: testOrg, Limits: &quotav1.QuotaLimits{MaxSnapshotBytes: &bad}}))
	if apierr.Reason(err) != apierr.InvalidRequest || !strings.Contains(err.Error(), "limits.max_snapshot_bytes") {
		t.Fatalf("bad = %v", err)
	}
	q, err := s.SetQuota(platform, connect.NewRequest(&quotav1.SetQuotaRequest{OrgId: testOrg, Limits: &quotav1.QuotaLimits{MaxSnapshots: &unl, MaxVolumeBytes: &two}}))
	if err != nil || q.Msg.GetLimits().GetMaxSnapshots() != -1 || q.Msg.GetLimits().GetMaxVolumeBytes() != 2 || q.Msg.GetEffective().MaxSnapshots != nil ||
		q.Msg.GetEffective().GetMaxSnapshotBytes() != 1<<30 {
		t.Fatalf("set = %v, %v", q, err)
	}
}

// TestVolumeGrowUndoCompareAndSet: a grow whose runner fails puts the size back only while
// it is still the size that grow set. Deterministic: while the runner works on the grow to
// 2Gi, another replica (the store directly) grows the volume to 3Gi, then the runner fails:
// the volume stays 3Gi (an unconditional undo wrote 1Gi back over it), and the quota
// counts 3Gi. Without a concurrent change, a failed grow still puts the size back.
func TestVolumeGrowUndoCompareAndSet(t *testing.T) {
	r := &volumeRunner{acceptingRunner: acceptingRunner{id: "r1"}}
	gws, st := volumeQuotaGateways(t, filepath.Join(t.TempDir(), "v.db"), 1, r, store.QuotaLimits{})
	s := gws[0]
	admin := tmplAdmin(testOrg)
	ctx := t.Context()
	if _, err := s.CreateVolume(admin, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: sizedVolume("data", "data", "1Gi")})); err != nil {
		t.Fatal(err)
	}
	waitVolume(t, s, admin, "data")
	grow := func(size string) error {
		_, err := s.UpdateVolume(admin, connect.NewRequest(&sandboxv1.UpdateVolumeRequest{VolumeId: "data",
			Volume: &sandboxv1.Volume{Spec: &sandboxv1.VolumeSpec{Size: size}}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec.size"}}}))
		return err
	}
	raced := false
	r.during = func(v runner.RegisteredVolume) error {
		if v.SizeBytes != 2<<30 || raced {
			return nil
		}
		raced = true
		if _, _, err := st.Volumes().Resize(ctx, testOrg, "data", 3<<30, nil); err != nil {
			t.Errorf("concurrent grow: %v", err)
		}
		return apierr.New(apierr.VolumeInUse, "cannot grow on purpose", nil)
	}
	if err := grow("2Gi"); apierr.Reason(err) != apierr.VolumeInUse || !raced {
		t.Fatalf("failed grow = %v (raced %v)", err, raced)
	}
	if v, _ := st.Volumes().Get(ctx, testOrg, "data"); v.SizeBytes != 3<<30 {
		t.Fatalf("size after the undo = %d, want the concurrent grow's %d", v.SizeBytes, int64(3<<30))
	}
	if u, _ := st.Quotas().Usage(ctx, testOrg, time.Now()); u.VolumeBytes != 3<<30 {
		t.Fatalf("usage = %+v", u)
	}
	// Nothing concurrent: the failed grow's size is put back.
	r.during = func(runner.RegisteredVolume) error {
		return apierr.New(apierr.VolumeInUse, "cannot grow on purpose", nil)
	}
	if err := grow("4Gi"); apierr.Reason(err) != apierr.VolumeInUse {
		t.Fatalf("failed grow = %v", err)
	}
	if v, _ := st.Volumes().Get(ctx, testOrg, "data"); v.SizeBytes != 3<<30 {
		t.Fatalf("size after a failed grow = %d", v.SizeBytes)
	}
}
