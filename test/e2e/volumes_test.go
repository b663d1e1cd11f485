package e2e

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestRegisteredVolumes: a CLUSTER_LOCAL volume of the local runner (a managed ext4
// image): a file one sandbox writes is read by the next, a read-only mount refuses
// writes, sub_path mounts a dir of it, two live sandboxes share it, deleting it while
// mounted is refused, and deleting it afterwards removes its image.
func TestRegisteredVolumes(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	var keys *auth.Keyring
	g := startGateway(t, func(c *gateway.Config) {
		c.Volumes = st.Volumes()
		keys = c.Auth.(*auth.Keyring)
	})
	admin, _, err := keys.Create("org-a", auth.RoleAdmin, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	vc := sandboxv1connect.NewVolumeServiceClient(http.DefaultClient, g.url, connect.WithInterceptors(connecttest.Bearer(admin)))
	user := sandboxv1connect.NewVolumeServiceClient(http.DefaultClient, g.url, connect.WithInterceptors(connecttest.Bearer(g.keyA)))
	other := sandboxv1connect.NewVolumeServiceClient(http.DefaultClient, g.url, connect.WithInterceptors(connecttest.Bearer(g.keyB)))

	pvc := &sandboxv1.PvcVolumeSource{RunnerId: "local", Namespace: "default", ClaimName: "e2e-data"}
	if _, err := user.CreateVolume(ctx, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: &sandboxv1.Volume{VolumeId: "data",
		Spec: &sandboxv1.VolumeSpec{Source: &sandboxv1.VolumeSpec_Pvc{Pvc: pvc}}}})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("create with a user key = %v", err)
	}
	created, err := vc.CreateVolume(ctx, connect.NewRequest(&sandboxv1.CreateVolumeRequest{RequestId: "vol-1", Volume: &sandboxv1.Volume{VolumeId: "data",
		Spec: &sandboxv1.VolumeSpec{Source: &sandboxv1.VolumeSpec_Pvc{Pvc: pvc}, Description: "e2e"}}}))
	if err != nil {
		t.Fatal(err)
	}
	if s := created.Msg.GetStatus(); s.GetState() != sandboxv1.VolumeState_VOLUME_STATE_VALIDATING || s.GetLocality() != sandboxv1.VolumeLocality_VOLUME_LOCALITY_CLUSTER_LOCAL {
		t.Fatalf("created = %v", created.Msg)
	}
	t.Cleanup(func() {
		_, _ = vc.DeleteVolume(context.Background(), connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "data", Force: true, AllowMissing: true}))
	})
	var vol *sandboxv1.Volume
	for deadline := time.Now().Add(30 * time.Second); ; {
		got, err := user.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "data"}))
		if err != nil {
			t.Fatal(err)
		}
		vol = got.Msg
		if vol.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_VALIDATING || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if vol.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_READY || vol.GetStatus().GetCapacity() != "10Gi" {
		t.Fatalf("volume = %v", vol)
	}
	if out, errOut, code := sbxAs(g, g.keyA, "", "volume", "ls"); code != 0 || !strings.Contains(out, "data") || !strings.Contains(out, "READY") {
		t.Fatalf("sbx volume ls: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := sbxAs(g, g.keyA, "", "volume", "get", "data"); code != 0 || !strings.Contains(out, "10Gi") {
		t.Fatalf("sbx volume get: %d %s %s", code, out, errOut)
	}
	// Another organization does not see it, nor can it mount it.
	if _, err := other.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "data"})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Fatalf("other org get = %v", err)
	}
	mounting := func(mp, sub string, ro bool) *sandboxv1.SandboxSpec {
		return &sandboxv1.SandboxSpec{
			Volumes: []*sandboxv1.SandboxVolume{{Name: "v", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "data"}}},
			Containers: []*sandboxv1.Container{{Name: "main", Image: busybox(), Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`},
				VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "v", MountPath: mp, SubPath: sub, ReadOnly: ro}}}},
		}
	}
	if _, err := g.other.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: mounting("/data", "", false)}})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Fatalf("other org mounts = %v", err)
	}
	pinned := mounting("/data", "", false)
	pinned.RunnerIds = []string{"elsewhere"}
	if _, err := g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: pinned}})); apierr.Reason(err) != apierr.VolumePlacementConflict ||
		!strings.Contains(err.Error(), "data") {
		t.Fatalf("pinned elsewhere = %v", err)
	}
	start := func(sp *sandboxv1.SandboxSpec) string {
		t.Helper()
		out, err := g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
		if err != nil {
			t.Fatal(err)
		}
		id := out.Msg.GetSandboxId()
		t.Cleanup(func() {
			_, _ = g.sandboxes.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
		})
		if ids := out.Msg.GetStatus().GetAttachedVolumeIds(); len(ids) != 1 || ids[0] != "data" {
			t.Fatalf("attached_volume_ids = %v", ids)
		}
		return id
	}
	sh := func(id, script string) (string, int32) {
		t.Helper()
		res, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"sh", "-c", script}}))
		if err != nil {
			t.Fatalf("exec %q in %s: %v", script, id, err)
		}
		return string(res.Msg.GetStdout()) + string(res.Msg.GetStderr()), res.Msg.GetExitCode()
	}
	del := func(id string) {
		t.Helper()
		if _, err := g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			got, err := g.sandboxes.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
			if err != nil || got.Msg.GetStatus().GetState() == sandboxv1.State_STATE_TERMINATED || got.Msg.GetStatus().GetState() == sandboxv1.State_STATE_COMPLETED {
				return
			}
		}
		t.Fatalf("sandbox %s did not end", id)
	}

	// One sandbox writes; it ends; the next reads.
	a := start(mounting("/data", "", false))
	if out, code := sh(a, "echo hello > /data/greeting && mkdir -p /data/sub && echo inner > /data/sub/f && sync"); code != 0 {
		t.Fatalf("write: %d %s", code, out)
	}
	del(a)
	b := start(mounting("/data", "", false))
	if out, _ := sh(b, "cat /data/greeting"); strings.TrimSpace(out) != "hello" {
		t.Fatalf("next sandbox reads %q", out)
	}
	// Read-only and sub_path mounts; a live sandbox shares the volume with b.
	c := start(mounting("/ro", "sub", true))
	if out, _ := sh(c, "cat /ro/f"); strings.TrimSpace(out) != "inner" {
		t.Fatalf("sub_path mount reads %q", out)
	}
	if out, code := sh(c, "echo x > /ro/new"); code == 0 {
		t.Fatalf("read-only mount accepted a write: %s", out)
	}
	if out, code := sh(b, "echo live > /data/sub/shared"); code != 0 {
		t.Fatalf("shared write: %d %s", code, out)
	}
	if out, _ := sh(c, "cat /ro/shared"); strings.TrimSpace(out) != "live" {
		t.Fatalf("concurrent sandbox reads %q", out)
	}
	// attached count, the volume_ids filter, delete while in use.
	got, err := user.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "data"}))
	if err != nil || got.Msg.GetStatus().GetAttachedSandboxCount() != 2 {
		t.Fatalf("attached = %v %v", got.Msg.GetStatus(), err)
	}
	list, err := g.sandboxes.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{VolumeIds: []string{"data"}}))
	if err != nil || len(list.Msg.GetSandboxes()) != 2 {
		t.Fatalf("list by volume = %v %v", list.Msg, err)
	}
	if _, err := vc.DeleteVolume(ctx, connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "data"})); apierr.Reason(err) != apierr.VolumeInUse ||
		!strings.Contains(err.Error(), b) {
		t.Fatalf("delete in use = %v", err)
	}
	del(b)
	del(c)
	if out, errOut, code := sbxAs(g, admin, "", "volume", "rm", "data"); code != 0 {
		t.Fatalf("sbx volume rm: %d %s %s", code, out, errOut)
	}
	if _, err := user.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "data"})); apierr.Reason(err) != apierr.VolumeNotFound {
		t.Fatalf("get after delete = %v", err)
	}
}
