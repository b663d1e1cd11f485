package security

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
)

// TestVolumeAttacks: a registered volume's content is sandbox-written, so a sub_path is
// never resolved through a symlink a sandbox planted (to the host's / or /etc, or back
// inside): the sandbox that asks for it fails instead of mounting the host. Another
// organization can neither see, mount nor delete the volume by its ID.
func TestVolumeAttacks(t *testing.T) {
	d := needDev(t)
	ctx := context.Background()
	vc := sandboxv1connect.NewVolumeServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(d.Admin)))
	foreign := sandboxv1connect.NewVolumeServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(d.KeyB)))
	runners, err := sandboxv1connect.NewDiscoveryServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(d.Admin))).
		ListAvailableRunners(ctx, connect.NewRequest(&sandboxv1.ListAvailableRunnersRequest{}))
	if err != nil || len(runners.Msg.GetRunners()) == 0 {
		t.Fatalf("runners: %v", err)
	}
	runnerID := runners.Msg.GetRunners()[0].GetRunnerId()
	if _, err := vc.CreateVolume(ctx, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: &sandboxv1.Volume{VolumeId: "attack",
		Spec: &sandboxv1.VolumeSpec{Source: &sandboxv1.VolumeSpec_Pvc{Pvc: &sandboxv1.PvcVolumeSource{RunnerId: runnerID, Namespace: "default", ClaimName: "attack"}}}}})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = vc.DeleteVolume(context.Background(), connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "attack", Force: true, AllowMissing: true}))
	})
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		v, err := vc.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "attack"}))
		if err != nil {
			t.Fatal(err)
		}
		if st := v.Msg.GetStatus().GetState(); st == sandboxv1.VolumeState_VOLUME_STATE_READY {
			break
		} else if st != sandboxv1.VolumeState_VOLUME_STATE_VALIDATING || time.Now().After(deadline) {
			t.Fatalf("volume: %v", v.Msg.GetStatus())
		}
	}
	spec := func(sub string) *sandboxv1.SandboxSpec {
		return &sandboxv1.SandboxSpec{
			Volumes: []*sandboxv1.SandboxVolume{{Name: "v", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "attack"}}},
			Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`},
				VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/data", SubPath: sub}}}},
		}
	}
	sbx := d.sandboxes(d.Admin)
	// The attacker plants symlinks in the volume.
	planter, err := sbx.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec("")}}))
	if err != nil {
		t.Fatal(err)
	}
	pid := planter.Msg.GetSandboxId()
	t.Cleanup(func() {
		_, _ = sbx.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: pid}))
	})
	if out, err := execOut(ctx, sbx, pid, "sh", "-c", "ln -s / /data/root && ln -s /etc /data/etc && mkdir -p /data/d && ln -s ../root /data/d/up && echo ok"); err != nil || !strings.Contains(out, "ok") {
		t.Fatalf("plant: %q %v", out, err)
	}
	for _, sub := range []string{"root", "etc", "d/up", "d/up/etc", "root/tmp/x"} {
		res, err := sbx.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec(sub)}}))
		if err != nil {
			// The gateway does not resolve sub_paths (the content is the runner's): any
			// refusal here is for another reason, and would hide the attack.
			t.Errorf("sub_path %q: create refused before reaching the runner: %v", sub, err)
			continue
		}
		id := res.Msg.GetSandboxId()
		t.Cleanup(func() {
			_, _ = sbx.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
		})
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			got, err := sbx.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
			if err != nil {
				t.Fatal(err)
			}
			st := got.Msg.GetStatus()
			if st.GetState() == sandboxv1.State_STATE_RUNNING {
				out, _ := execOut(ctx, sbx, id, "sh", "-c", "ls /data")
				t.Fatalf("sub_path %q through a planted symlink mounted: /data holds %q", sub, out)
			}
			if st.GetState() == sandboxv1.State_STATE_FAILED {
				if !strings.Contains(st.GetStateReason(), "symlink") {
					t.Errorf("sub_path %q failed for another reason: %s", sub, st.GetStateReason())
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sub_path %q: sandbox %v", sub, st)
			}
		}
	}
	// Another organization: not found, whatever it tries.
	if _, err := foreign.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "attack"})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Errorf("foreign get: %v", err)
	}
	if _, err := foreign.ValidateVolume(ctx, connect.NewRequest(&sandboxv1.ValidateVolumeRequest{VolumeId: "attack"})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Errorf("foreign validate: %v", err)
	}
	if _, err := foreign.DeleteVolume(ctx, connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "attack", Force: true})); err == nil {
		t.Errorf("foreign delete succeeded")
	}
	if l, err := foreign.ListVolumes(ctx, connect.NewRequest(&sandboxv1.ListVolumesRequest{})); err != nil || len(l.Msg.GetVolumes()) != 0 {
		t.Errorf("foreign list: %v %v", l, err)
	}
	if _, err := d.sandboxes(d.KeyB).CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec("")}})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Errorf("foreign mount: %v", err)
	}
}
