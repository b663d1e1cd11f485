package security

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
)

// TestVolumeSizeAttacks: a volume's size (the sandboxd extension spec.size) is the
// caller's: sizes out of bounds, huge, negative, fractional or not quantities at all are
// refused naming the field before anything is stored or asked of a runner; a volume
// cannot shrink (which would cut its data); another organization cannot grow a volume it
// does not own (NOT_FOUND), and a user key cannot grow one (PERMISSION_DENIED).
func TestVolumeSizeAttacks(t *testing.T) {
	d := needDev(t)
	ctx := context.Background()
	vc := sandboxv1connect.NewVolumeServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(d.Admin)))
	foreignAdmin, err := d.NewKey("org-b", "admin")
	if err != nil {
		t.Fatal(err)
	}
	foreign := sandboxv1connect.NewVolumeServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(foreignAdmin)))
	runners, err := sandboxv1connect.NewDiscoveryServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(d.Admin))).
		ListAvailableRunners(ctx, connect.NewRequest(&sandboxv1.ListAvailableRunnersRequest{}))
	if err != nil || len(runners.Msg.GetRunners()) == 0 {
		t.Fatalf("runners: %v", err)
	}
	runnerID := runners.Msg.GetRunners()[0].GetRunnerId()
	vol := func(id, size string) *sandboxv1.Volume {
		return &sandboxv1.Volume{VolumeId: id, Spec: &sandboxv1.VolumeSpec{Size: size,
			Source: &sandboxv1.VolumeSpec_Pvc{Pvc: &sandboxv1.PvcVolumeSource{RunnerId: runnerID, Namespace: "default", ClaimName: id}}}}
	}
	for _, size := range []string{"1", "1Ki", "15Mi", "1025Gi", "2Ti", "1Ei", "9223372036854775807", "-1Gi", "1.5Mi", "10GB!", "0x10Gi", strings.Repeat("9", 64) + "Gi"} {
		_, err := vc.CreateVolume(ctx, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: vol("sized-attack", size)}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "volume.spec.size") {
			t.Errorf("size %q = %v", size, err)
		}
	}
	if _, err := vc.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "sized-attack"})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Fatalf("a refused volume was stored: %v", err)
	}
	if _, err := vc.CreateVolume(ctx, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: vol("sized-attack", "32Mi")})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = vc.DeleteVolume(context.Background(), connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "sized-attack", Force: true, AllowMissing: true}))
	})
	grow := func(c sandboxv1connect.VolumeServiceClient, size string) error {
		_, err := c.UpdateVolume(ctx, connect.NewRequest(&sandboxv1.UpdateVolumeRequest{VolumeId: "sized-attack",
			Volume: &sandboxv1.Volume{Spec: &sandboxv1.VolumeSpec{Size: size}}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec.size"}}}))
		return err
	}
	if err := grow(foreign, "64Mi"); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Fatalf("another organization grows it: %v", err)
	}
	user := sandboxv1connect.NewVolumeServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(d.KeyA)))
	if err := grow(user, "64Mi"); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("a user key grows it: %v", err)
	}
	for _, size := range []string{"16Mi", "2Ti", "-32Mi"} {
		if err := grow(vc, size); connect.CodeOf(err) != connect.CodeInvalidArgument && apierr.Reason(err) != apierr.VolumeNotReady {
			t.Errorf("grow to %q = %v", size, err)
		}
	}
	v, err := vc.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "sized-attack"}))
	if err != nil || v.Msg.GetSpec().GetSize() != "32Mi" {
		t.Fatalf("after the attempts: %v, %v", v, err)
	}
}
