package security

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
)

// TestVolumePolicyMaxSizeAttacks: with the runner's constraints.volumes.max_size at 64Mi,
// an organization admin can neither create a larger volume on it (an explicit size, or
// none: the 10Gi default) nor grow one past the bound in one step or after a first
// admitted grow; each refusal is INVALID_ARGUMENT CWSANDBOX_PLACEMENT_REJECTED naming the
// constraint and volume.spec.size, and nothing is stored or grown.
func TestVolumePolicyMaxSizeAttacks(t *testing.T) {
	d := needDev(t)
	setPolicy(t, d, `{"constraints": {"volumes": {"max_size": "64Mi"}}}`)
	ctx := context.Background()
	vc := sandboxv1connect.NewVolumeServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(d.Admin)))
	vol := func(id, size string) *sandboxv1.Volume {
		return &sandboxv1.Volume{VolumeId: id, Spec: &sandboxv1.VolumeSpec{Size: size,
			Source: &sandboxv1.VolumeSpec_Pvc{Pvc: &sandboxv1.PvcVolumeSource{RunnerId: "local", Namespace: "default", ClaimName: id}}}}
	}
	refused := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.PlacementRejected ||
			!strings.Contains(err.Error(), "constraints.volumes.max_size") || !strings.Contains(err.Error(), "volume.spec.size") {
			t.Errorf("%s: %v, want INVALID_ARGUMENT %s naming constraints.volumes.max_size", what, err, apierr.PlacementRejected)
		}
	}
	for _, size := range []string{"65Mi", "128Mi", "1Ti", ""} {
		_, err := vc.CreateVolume(ctx, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: vol("policy-big", size)}))
		refused("create of "+size, err)
	}
	if _, err := vc.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "policy-big"})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Fatalf("a refused volume was stored: %v", err)
	}
	if _, err := vc.CreateVolume(ctx, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: vol("policy-small", "32Mi")})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = vc.DeleteVolume(context.Background(), connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "policy-small", Force: true, AllowMissing: true}))
	})
	grow := func(size string) error {
		_, err := vc.UpdateVolume(ctx, connect.NewRequest(&sandboxv1.UpdateVolumeRequest{VolumeId: "policy-small",
			Volume: &sandboxv1.Volume{Spec: &sandboxv1.VolumeSpec{Size: size}}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec.size"}}}))
		return err
	}
	waitReady := func() *sandboxv1.Volume {
		for range 200 {
			v, err := vc.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "policy-small"}))
			if err != nil {
				t.Fatal(err)
			}
			if v.Msg.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_VALIDATING {
				return v.Msg
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatal("volume still VALIDATING")
		return nil
	}
	if v := waitReady(); v.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_READY {
		t.Fatalf("volume: %v", v.GetStatus())
	}
	refused("grow to 1Ti", grow("1Ti"))
	if err := grow("64Mi"); err != nil {
		t.Fatalf("grow to the bound: %v", err)
	}
	refused("grow past the bound", grow("96Mi"))
	v, err := vc.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "policy-small"}))
	if err != nil || v.Msg.GetSpec().GetSize() != "64Mi" {
		t.Fatalf("after the attempts: %v, %v", v, err)
	}
}
