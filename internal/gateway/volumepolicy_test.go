package gateway

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// runnerPolicies is a policy document per runner ID (none: the empty policy).
type runnerPolicies map[string]string

func (p runnerPolicies) Policy(_ context.Context, id string) ([]byte, int64, error) {
	return []byte(p[id]), 1, nil
}

// TestVolumePolicyMaxSize: a runner's constraints.volumes.max_size bounds the volumes
// made and grown on it (INVALID_ARGUMENT CWSANDBOX_PLACEMENT_REJECTED naming the
// constraint, a violation of volume.spec.size, nothing stored or grown); another runner's
// volumes are not bound by it; up to the bound is fine.
func TestVolumePolicyMaxSize(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "v.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	keys, err := auth.OpenKeyring(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Orgs().Create(t.Context(), store.Org{ID: testOrg, Name: testOrg}); err != nil {
		t.Fatal(err)
	}
	r1 := &volumeRunner{acceptingRunner: acceptingRunner{id: "r1"}}
	r2 := &volumeRunner{acceptingRunner: acceptingRunner{id: "r2"}}
	s, err := New(Config{Auth: keys, Runners: []runner.Handle{r1, r2}, Index: st.Sandboxes(), Orgs: st.Orgs(), Volumes: st.Volumes(),
		Policies: runnerPolicies{"r1": `{"constraints": {"volumes": {"max_size": "20Gi"}}}`}, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	admin := tmplAdmin(testOrg)
	sized := func(id, runnerID, size string) *sandboxv1.Volume {
		v := pvcVolume(id, runnerID, id)
		v.Spec.Size = size
		return v
	}
	create := func(v *sandboxv1.Volume) error {
		_, err := s.CreateVolume(admin, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: v}))
		return err
	}
	wantRefused := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.PlacementRejected ||
			!strings.Contains(err.Error(), policy.ConstraintVolumeMaxSize) || !strings.Contains(err.Error(), "runner r1") {
			t.Fatalf("%s: %v (reason %q), want INVALID_ARGUMENT %s naming %s", what, err, apierr.Reason(err), apierr.PlacementRejected, policy.ConstraintVolumeMaxSize)
		}
		if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != "volume.spec.size" {
			t.Fatalf("%s: violations %+v", what, vs)
		}
	}
	wantRefused("30Gi on r1", create(sized("big", "r1", "30Gi")))
	if _, err := s.GetVolume(admin, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "big"})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Fatalf("refused volume stored: %v", err)
	}
	if err := create(sized("big", "r2", "30Gi")); err != nil {
		t.Fatalf("30Gi on r2 (no bound): %v", err)
	}
	if err := create(sized("edge", "r1", "20Gi")); err != nil {
		t.Fatalf("20Gi on r1 (the bound): %v", err)
	}
	if err := create(sized("data", "r1", "")); err != nil {
		t.Fatalf("the default size on r1: %v", err)
	}
	waitVolume(t, s, admin, "data")
	grow := func(id, size string) (*sandboxv1.Volume, error) {
		res, err := s.UpdateVolume(admin, connect.NewRequest(&sandboxv1.UpdateVolumeRequest{VolumeId: id,
			Volume: &sandboxv1.Volume{Spec: &sandboxv1.VolumeSpec{Size: size}}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec.size"}}}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}
	_, err = grow("data", "21Gi")
	wantRefused("grow to 21Gi on r1", err)
	if g, _ := s.GetVolume(admin, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "data"})); g.Msg.GetSpec().GetSize() != "10Gi" {
		t.Fatalf("size after a refused grow: %v", g.Msg.GetSpec())
	}
	if out, err := grow("data", "20Gi"); err != nil || out.GetSpec().GetSize() != "20Gi" {
		t.Fatalf("grow to the bound: %v %v", out, err)
	}
	waitVolume(t, s, admin, "big")
	if out, err := grow("big", "40Gi"); err != nil || out.GetSpec().GetSize() != "40Gi" {
		t.Fatalf("grow on r2: %v %v", out, err)
	}
}
