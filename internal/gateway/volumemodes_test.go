package gateway

import (
	"slices"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// TestVolumeAccessModes: status.access_modes are what the volume's runner reported of
// its claim when it made and checked it (a Kubernetes runner's ReadWriteOnce or
// ReadWriteOncePod), kept in the store, refreshed by a grow; a runner reporting none (the
// local backend) gives ReadWriteMany; modes that are no access mode are dropped.
func TestVolumeAccessModes(t *testing.T) {
	r1 := &volumeRunner{acceptingRunner: acceptingRunner{id: "r1"}, modes: map[string][]string{
		"rwo":   {"ReadWriteOnce"},
		"rwop":  {"ReadWriteOncePod", "ReadWriteOnce"},
		"bogus": {"Everything", "ReadWriteOnce", "ReadWriteOnce"},
	}}
	s := newVolumeGateway(t, r1)
	admin := tmplAdmin(testOrg)
	modesOf := func(id string) []string {
		t.Helper()
		v := waitVolume(t, s, admin, id)
		if v.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_READY {
			t.Fatalf("%s: %v", id, v.GetStatus())
		}
		return v.GetStatus().GetAccessModes()
	}
	for claim, want := range map[string][]string{
		"local": {"ReadWriteMany"},
		"rwo":   {"ReadWriteOnce"},
		"rwop":  {"ReadWriteOncePod", "ReadWriteOnce"},
		"bogus": {"ReadWriteOnce"},
	} {
		if _, err := s.CreateVolume(admin, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: pvcVolume(claim, "r1", claim)})); err != nil {
			t.Fatal(err)
		}
		if got := modesOf(claim); !slices.Equal(got, want) {
			t.Errorf("%s: access modes %q, want %q", claim, got, want)
		}
	}
	// ListVolumes reads them from the store too.
	l, err := s.ListVolumes(admin, connect.NewRequest(&sandboxv1.ListVolumesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range l.Msg.GetVolumes() {
		if v.GetVolumeId() == "rwo" && !slices.Equal(v.GetStatus().GetAccessModes(), []string{"ReadWriteOnce"}) {
			t.Errorf("list: rwo access modes %q", v.GetStatus().GetAccessModes())
		}
	}
	// A grow takes what the runner reports then (here: the claim now ReadWriteMany).
	r1.vmu.Lock()
	r1.modes["rwo"] = []string{"ReadWriteMany"}
	r1.vmu.Unlock()
	res, err := s.UpdateVolume(admin, connect.NewRequest(&sandboxv1.UpdateVolumeRequest{VolumeId: "rwo",
		Volume: &sandboxv1.Volume{Spec: &sandboxv1.VolumeSpec{Size: "20Gi"}}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec.size"}}}))
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Msg.GetStatus().GetAccessModes(); !slices.Equal(got, []string{"ReadWriteMany"}) {
		t.Errorf("after grow: access modes %q", got)
	}
}
