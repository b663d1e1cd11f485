package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	blobdir "github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/store"
)

// GLOBAL registered volumes end to end (docs/volumes.md): two real local stacks (r1, r2)
// in this process behind one gateway, all three on ONE directory blob store. A sandbox on
// r1 writes the volume; a second writer is refused CWSANDBOX_VOLUME_BUSY while it lives;
// it is deleted (its copy uploaded as generation 1 before it ends); a sandbox pinned to r2
// reads what it wrote, and a read-only one on r1 too.
func TestGlobalVolumes(t *testing.T) {
	blobs, err := blobdir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s1, s2 := globalStack(t, blobs, 0), globalStack(t, blobs, 1)
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	var keys *auth.Keyring
	g := startGatewayOn(t, s1, func(c *gateway.Config) {
		c.Runners = []runner.Handle{runner.NewLocal("r1", s1.Runner), runner.NewLocal("r2", s2.Runner)}
		c.Volumes, c.Index, c.Orgs, c.Blobs = st.Volumes(), st.Sandboxes(), st.Orgs(), blobs
		keys = c.Auth.(*auth.Keyring)
	})
	admin, _, err := keys.Create("org-a", auth.RoleAdmin, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	vc := sandboxv1connect.NewVolumeServiceClient(http.DefaultClient, g.url, connect.WithInterceptors(connecttest.Bearer(admin)))
	if _, err := vc.CreateVolume(ctx, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: &sandboxv1.Volume{VolumeId: "shared",
		Spec: &sandboxv1.VolumeSpec{Source: &sandboxv1.VolumeSpec_Pvc{Pvc: &sandboxv1.PvcVolumeSource{RunnerId: "*", Namespace: "default", ClaimName: "shared"}}}}})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = vc.DeleteVolume(context.Background(), connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "shared", Force: true, AllowMissing: true}))
	})
	var vol *sandboxv1.Volume
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got, err := vc.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "shared"}))
		if err != nil {
			t.Fatal(err)
		}
		vol = got.Msg
		if vol.GetStatus().GetState() != sandboxv1.VolumeState_VOLUME_STATE_VALIDATING || time.Now().After(deadline) {
			break
		}
	}
	if s := vol.GetStatus(); s.GetState() != sandboxv1.VolumeState_VOLUME_STATE_READY || s.GetLocality() != sandboxv1.VolumeLocality_VOLUME_LOCALITY_GLOBAL || s.GetCapacity() != "10Gi" {
		t.Fatalf("volume = %v", vol)
	}

	mounting := func(ro bool, runnerID string) *sandboxv1.SandboxSpec {
		return &sandboxv1.SandboxSpec{RunnerIds: []string{runnerID},
			Volumes: []*sandboxv1.SandboxVolume{{Name: "v", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "shared"}}},
			Containers: []*sandboxv1.Container{{Name: "main", Image: busybox(), Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep infinity & wait`},
				VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/data", ReadOnly: ro}}}},
		}
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
		if r := out.Msg.GetStatus().GetRunnerId(); r != sp.GetRunnerIds()[0] {
			t.Fatalf("sandbox %s on %s, want %s", id, r, sp.GetRunnerIds()[0])
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

	// The writer on r1.
	w := start(mounting(false, "r1"))
	if out, code := sh(w, "echo hello > /data/greeting && mkdir -p /data/sub && head -c 4194304 /dev/urandom > /data/sub/blob && md5sum /data/sub/blob && ln -s /etc/passwd /data/link && sync"); code != 0 {
		t.Fatalf("write: %d %s", code, out)
	}
	sum, _ := sh(w, "md5sum < /data/sub/blob")
	// A second writer, on either runner, is refused naming the holder; a reader is not.
	if _, err := g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: mounting(false, "r2")}})); apierr.Reason(err) != apierr.VolumeBusy ||
		connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), w) {
		t.Fatalf("second writer = %v", err)
	}
	early := start(mounting(true, "r2"))
	if out, code := sh(early, "ls -A /data"); code != 0 || strings.TrimSpace(out) != "" {
		t.Fatalf("a reader before the commit sees %q (%d), want the empty generation 0", out, code)
	}
	// Delete the writer: its copy is uploaded before it is reported ended.
	t0 := time.Now()
	if _, err := g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: w})); err != nil {
		t.Fatal(err)
	}
	// The next mount waits for that upload, then sees it: a writer pinned to r2.
	w2 := start(mounting(false, "r2"))
	t.Logf("delete of the writer to the next writer's create: %v", time.Since(t0).Round(time.Millisecond))
	if out, _ := sh(w2, "cat /data/greeting"); strings.TrimSpace(out) != "hello" {
		t.Fatalf("sandbox on r2 reads %q", out)
	}
	if out, _ := sh(w2, "md5sum < /data/sub/blob"); out != sum {
		t.Fatalf("the 4 MiB file on r2: %q, want %q", out, sum)
	}
	if out, _ := sh(w2, "readlink /data/link"); strings.TrimSpace(out) != "/etc/passwd" {
		t.Fatalf("the symlink on r2 reads %q (a symlink is content, never followed on the host)", out)
	}
	if out, code := sh(w2, "echo again >> /data/greeting"); code != 0 {
		t.Fatalf("append: %d %s", code, out)
	}
	// The early reader still sees generation 0; a new reader on r1 sees generation 1.
	if out, _ := sh(early, "ls -A /data"); strings.TrimSpace(out) != "" {
		t.Fatalf("the early reader now sees %q", out)
	}
	r := start(mounting(true, "r1"))
	if out, _ := sh(r, "cat /data/greeting"); strings.TrimSpace(out) != "hello" {
		t.Fatalf("reader on r1 reads %q", out)
	}
	if out, code := sh(r, "echo x > /data/new"); code == 0 {
		t.Fatalf("a read-only mount took a write: %s", out)
	}
	// w2 ends (generation 2); the next writer on r1 sees both lines.
	t0 = time.Now()
	if _, err := g.sandboxes.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: w2})); err != nil {
		t.Fatal(err)
	}
	w3 := start(mounting(false, "r1"))
	t.Logf("second hand-over: %v", time.Since(t0).Round(time.Millisecond))
	if out, _ := sh(w3, "cat /data/greeting"); strings.TrimSpace(out) != "hello\nagain" {
		t.Fatalf("third writer reads %q", out)
	}
	m, err := runner.ReadGlobalManifest(ctx, blobs, runner.GlobalVolumePrefix("org-a", "shared"))
	if err != nil || m.Generation != 2 || m.SandboxID != w2 {
		t.Fatalf("manifest = %+v, %v", m, err)
	}
	// The manifest, generation 2's archive (the one it names) and generation 1's, kept
	// for copies still restoring from it; older ones go (generation 0 had none).
	var objs []string
	for info, err := range blobs.List(ctx, runner.GlobalVolumePrefix("org-a", "shared")) {
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, info.Key)
	}
	prefix := runner.GlobalVolumePrefix("org-a", "shared")
	if len(objs) != 3 || !slices.Contains(objs, m.BlobKey) || !slices.Contains(objs, prefix+runner.GlobalManifestName) {
		t.Fatalf("objects under the volume's prefix: %v, want the manifest and generations 1 and 2", objs)
	}
}

// globalStack starts this process's n-th stack with blobs as its blob store; like
// crossStack, nothing of it may be left when the test ends.
func globalStack(t *testing.T, blobs blob.Store, n int) *stack.Stack {
	t.Helper()
	dir := t.TempDir()
	cfg := env.StackConfigN(dir, n)
	cfg.Blobs = blobs
	s, err := stack.NewLocal(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start stack %d: %v", n, err)
	}
	t.Cleanup(func() {
		var ids []string
		for _, sb := range s.Runner.List() {
			ids = append(ids, sb.ID)
		}
		deleteAll(t, s)
		s.Close()
		assertNoLeaks(t, dir, ids)
		if left := stacktest.Leftovers(dir); len(left) > 0 {
			t.Errorf("stack %d left behind: %q", n, left)
			stacktest.ForceClean(dir)
		}
		if err := s.Network.Cleanup(); err != nil {
			t.Errorf("network cleanup: %v", err)
		}
		if n > 0 {
			parents, _ := filepath.Glob("/sys/fs/cgroup/*/" + cfg.CgroupParent)
			for _, p := range parents {
				_ = os.Remove(p)
			}
		}
	})
	return s
}
