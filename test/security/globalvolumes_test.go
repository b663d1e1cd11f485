package security

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/connecttest"
)

// TestGlobalVolumeAttacks: a GLOBAL volume's content is sandbox-written and travels
// (archive, blob store, another sandbox's copy), so:
//   - symlinks a writer planted are archived as symlinks, never followed by the runner
//     that uploads them, and come back as symlinks;
//   - a sub_path of the next copy is resolved without following them: before this test,
//     a restored volume's sub_path dirs were made, chmod-ed, chowned and bind-mounted by
//     path on the host ("the volume is new and empty"), so a planted symlink to a host
//     directory got that directory chowned to the sandbox and mounted into it. The
//     targets here are a canary directory of the test, never the host's / or /etc;
//   - a second writer is refused CWSANDBOX_VOLUME_BUSY, and another organization cannot
//     mount the volume.
func TestGlobalVolumeAttacks(t *testing.T) {
	d := needDev(t)
	ctx := context.Background()
	canary := t.TempDir()
	if err := os.Chmod(canary, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(canary, "host-secret"), []byte("host only\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(canary)
	if err != nil {
		t.Fatal(err)
	}

	vc := sandboxv1connect.NewVolumeServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(d.Admin)))
	if _, err := vc.CreateVolume(ctx, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: &sandboxv1.Volume{VolumeId: "gattack",
		Spec: &sandboxv1.VolumeSpec{Source: &sandboxv1.VolumeSpec_Pvc{Pvc: &sandboxv1.PvcVolumeSource{RunnerId: "*", Namespace: "default", ClaimName: "gattack"}}}}})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = vc.DeleteVolume(context.Background(), connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "gattack", Force: true, AllowMissing: true}))
	})
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		v, err := vc.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "gattack"}))
		if err != nil {
			t.Fatal(err)
		}
		if st := v.Msg.GetStatus().GetState(); st == sandboxv1.VolumeState_VOLUME_STATE_READY {
			break
		} else if st != sandboxv1.VolumeState_VOLUME_STATE_VALIDATING || time.Now().After(deadline) {
			t.Fatalf("volume: %v", v.Msg.GetStatus())
		}
	}
	spec := func(sub string, ro bool) *sandboxv1.SandboxSpec {
		return &sandboxv1.SandboxSpec{
			Volumes: []*sandboxv1.SandboxVolume{{Name: "v", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "gattack"}}},
			Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`},
				VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/data", SubPath: sub, ReadOnly: ro}}}},
		}
	}
	sbx := d.sandboxes(d.Admin)
	start := func(sp *sandboxv1.SandboxSpec) string {
		t.Helper()
		res, err := sbx.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
		if err != nil {
			t.Fatal(err)
		}
		id := res.Msg.GetSandboxId()
		t.Cleanup(func() {
			_, _ = sbx.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
		})
		return id
	}
	waitRunning := func(id string) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			got, err := sbx.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
			if err != nil {
				t.Fatal(err)
			}
			if st := got.Msg.GetStatus(); st.GetState() == sandboxv1.State_STATE_RUNNING {
				return
			} else if st.GetState() == sandboxv1.State_STATE_FAILED || time.Now().After(deadline) {
				t.Fatalf("sandbox %s: %v", id, st)
			}
		}
	}

	// The writer plants symlinks to the host's canary, directly and through a chain.
	planter := start(spec("", false))
	waitRunning(planter)
	plant := "ln -s " + canary + " /data/canary && mkdir -p /data/d && ln -s ../canary /data/d/up && ln -s " + canary + "/host-secret /data/secret && echo ok"
	if out, err := execOut(ctx, sbx, planter, "sh", "-c", plant); err != nil || !strings.Contains(out, "ok") {
		t.Fatalf("plant: %q %v", out, err)
	}
	if _, err := sbx.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec("", false)}})); apierr.Reason(err) != apierr.VolumeBusy {
		t.Errorf("second writer: %v", err)
	}
	if _, err := d.sandboxes(d.KeyB).CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec("", true)}})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Errorf("foreign mount: %v", err)
	}
	// Its end uploads the volume: the symlinks go as symlinks (the runner reads no
	// host file through them), and the next copy has them as symlinks.
	if _, err := sbx.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: planter})); err != nil {
		t.Fatal(err)
	}
	reader := start(spec("", true))
	waitRunning(reader)
	if out, err := execOut(ctx, sbx, reader, "sh", "-c", "stat -c %F /data/secret; readlink /data/secret; cat /data/secret 2>&1; ls /data/canary/ 2>&1"); err != nil ||
		!strings.Contains(out, "symbolic link") || !strings.Contains(out, canary+"/host-secret") || strings.Contains(out, "host only") {
		t.Fatalf("the copy's symlinks: %q %v", out, err)
	}
	// A sub_path through a planted symlink fails the sandbox instead of mounting the host.
	for _, sub := range []string{"canary", "d/up", "d/up/x"} {
		id := start(spec(sub, true))
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			got, err := sbx.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
			if err != nil {
				t.Fatal(err)
			}
			st := got.Msg.GetStatus()
			if st.GetState() == sandboxv1.State_STATE_RUNNING {
				out, _ := execOut(ctx, sbx, id, "sh", "-c", "ls -la /data")
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
	after, err := os.Stat(canary)
	if err != nil {
		t.Fatal(err)
	}
	if after.Mode() != before.Mode() {
		t.Errorf("the host's canary dir changed mode: %v -> %v", before.Mode(), after.Mode())
	}
	if ents, _ := os.ReadDir(canary); len(ents) != 1 {
		t.Errorf("the host's canary dir holds %d entries, want 1 (host-secret)", len(ents))
	}
}
