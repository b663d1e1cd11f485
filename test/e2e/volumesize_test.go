package e2e

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestRegisteredVolumeSizeAndGrow: a volume of spec.size 64Mi on the local runner: a
// sandbox writing 100 MiB into it gets ENOSPC; a grow to 256Mi (online where the runner
// may, else refused while the sandbox mounts it and made once it ended) lets the next
// sandbox write them, the earlier content kept; status.capacity follows; a grow past
// the organization's max_volume_bytes is refused naming the limit.
func TestRegisteredVolumeSizeAndGrow(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	for _, o := range []string{"org-a", "org-b"} {
		if _, err := st.Orgs().Create(context.Background(), store.Org{ID: o}); err != nil {
			t.Fatal(err)
		}
	}
	var keys *auth.Keyring
	limit := int64(512 << 20)
	g := startGateway(t, func(c *gateway.Config) {
		c.Volumes = st.Volumes()
		c.Index = st.Sandboxes()
		c.Orgs = st.Orgs()
		c.Quota = gateway.QuotaOptions{Store: st.Quotas(), Defaults: store.QuotaLimits{MaxVolumeBytes: &limit}}
		keys = c.Auth.(*auth.Keyring)
	})
	admin, _, err := keys.Create("org-a", auth.RoleAdmin, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	vc := sandboxv1connect.NewVolumeServiceClient(http.DefaultClient, g.url, connect.WithInterceptors(connecttest.Bearer(admin)))
	pvc := &sandboxv1.PvcVolumeSource{RunnerId: "local", Namespace: "default", ClaimName: "e2e-sized"}
	if _, err := vc.CreateVolume(ctx, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: &sandboxv1.Volume{VolumeId: "sized",
		Spec: &sandboxv1.VolumeSpec{Source: &sandboxv1.VolumeSpec_Pvc{Pvc: pvc}, Size: "1Gi"}}})); apierr.Reason(err) != apierr.QuotaExceeded {
		t.Fatalf("create past the quota = %v", err)
	}
	if _, err := vc.CreateVolume(ctx, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: &sandboxv1.Volume{VolumeId: "sized",
		Spec: &sandboxv1.VolumeSpec{Source: &sandboxv1.VolumeSpec_Pvc{Pvc: pvc}, Size: "64Mi"}}})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = vc.DeleteVolume(context.Background(), connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "sized", Force: true, AllowMissing: true}))
	})
	waitReady := func() *sandboxv1.Volume {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			got, err := vc.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "sized"}))
			if err != nil {
				t.Fatal(err)
			}
			if got.Msg.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_VALIDATING || time.Now().After(deadline) {
				return got.Msg
			}
		}
	}
	if v := waitReady(); v.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_READY || v.GetStatus().GetCapacity() != "64Mi" || v.GetSpec().GetSize() != "64Mi" {
		t.Fatalf("volume = %v", v)
	}
	spec := &sandboxv1.SandboxSpec{
		Volumes: []*sandboxv1.SandboxVolume{{Name: "v", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "sized"}}},
		Containers: []*sandboxv1.Container{{Name: "main", Image: busybox(), Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`},
			VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/data"}}}},
	}
	start := func() string {
		t.Helper()
		out, err := g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec}}))
		if err != nil {
			t.Fatal(err)
		}
		id := out.Msg.GetSandboxId()
		t.Cleanup(func() {
			_, _ = g.sandboxes.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
		})
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
	grow := func(size string) (*sandboxv1.Volume, error) {
		res, err := vc.UpdateVolume(ctx, connect.NewRequest(&sandboxv1.UpdateVolumeRequest{VolumeId: "sized",
			Volume: &sandboxv1.Volume{Spec: &sandboxv1.VolumeSpec{Size: size}}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec.size"}}}))
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}

	a := start()
	if out, code := sh(a, "echo kept > /data/keep && dd if=/dev/zero of=/data/big bs=1M count=100 2>&1; echo rc=$?"); code != 0 || !strings.Contains(out, "No space left") {
		t.Fatalf("100 MiB into 64Mi: %d %s", code, out)
	}
	_, _ = sh(a, "rm -f /data/big")
	if _, err := grow("1Gi"); apierr.Reason(err) != apierr.QuotaExceeded || !strings.Contains(err.Error(), "max_volume_bytes") {
		t.Fatalf("grow past the quota = %v", err)
	}
	v, err := grow("256Mi")
	switch {
	case err == nil:
		t.Logf("grown online while mounted")
		del(a)
	case apierr.Reason(err) == apierr.VolumeInUse:
		t.Logf("grow refused while mounted (no CAP_SYS_RESOURCE): %v", err)
		if got := waitReady(); got.GetSpec().GetSize() != "64Mi" || got.GetStatus().GetCapacity() != "64Mi" {
			t.Fatalf("after a refused grow: %v", got)
		}
		del(a)
		if v, err = grow("256Mi"); err != nil {
			t.Fatalf("grow once unmounted: %v", err)
		}
	default:
		t.Fatalf("grow = %v", err)
	}
	if v.GetSpec().GetSize() != "256Mi" || v.GetStatus().GetCapacity() != "256Mi" {
		t.Fatalf("grown = %v", v)
	}
	b := start()
	if out, code := sh(b, "cat /data/keep && dd if=/dev/zero of=/data/big bs=1M count=100 2>&1 && df -k /data"); code != 0 || !strings.Contains(out, "kept") {
		t.Fatalf("100 MiB into 256Mi: %d %s", code, out)
	} else {
		t.Logf("%s", out)
	}
	if _, err := grow("128Mi"); apierr.Reason(err) != apierr.InvalidRequest {
		t.Fatalf("shrink = %v", err)
	}
	del(b)

	// The CLI: sbx volume create --size, sbx volume grow, sbx quota.
	if out, errOut, code := sbxAs(g, admin, "", "volume", "create", "cli-vol", "--runner", "local", "--size", "32Mi"); code != 0 || !strings.Contains(out, "32Mi") {
		t.Fatalf("sbx volume create --size: %d %s %s", code, out, errOut)
	}
	t.Cleanup(func() {
		_, _ = vc.DeleteVolume(context.Background(), connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "cli-vol", Force: true, AllowMissing: true}))
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got, err := vc.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "cli-vol"}))
		if err != nil {
			t.Fatal(err)
		}
		if got.Msg.GetStatus().GetState() == sandboxv1.VolumeState_VOLUME_STATE_READY || time.Now().After(deadline) {
			break
		}
	}
	if out, errOut, code := sbxAs(g, admin, "", "volume", "grow", "cli-vol", "48Mi"); code != 0 || !strings.Contains(out, "48Mi") {
		t.Fatalf("sbx volume grow: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := sbxAs(g, admin, "", "volume", "grow", "cli-vol", "1Gi"); code == 0 || !strings.Contains(errOut, "max_volume_bytes") {
		t.Fatalf("sbx volume grow past the quota: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := sbxAs(g, admin, "", "quota"); code != 0 || !strings.Contains(strings.Join(strings.Fields(out), " "), "volume bytes 304Mi (2 volumes) 512Mi") {
		t.Fatalf("sbx quota: %d %s %s", code, out, errOut)
	}
}
