package k8s

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestGlobalVolumeReadOnly: what a GLOBAL volume (its content in the blob store,
// docs/volumes.md) does on a Kubernetes runner today: nothing. Its backend cannot fill a
// read-only copy (it fills restored volumes through a writable mount) nor capture a
// writer's copy once its Pod stopped, so the runner says it mounts no GLOBAL volume
// (Support.NoGlobalVolumes): the gateway's placement leaves it out (read-only and
// read-write mounts alike: CWSANDBOX_NO_SUITABLE_RUNNER naming
// placement.ConstraintGlobalVolumes), and the runner refuses such a create itself
// (CWSANDBOX_VOLUME_TYPE_NOT_SUPPORTED) instead of failing the sandbox later. "Not yet"
// in docs/volumes.md.
func TestGlobalVolumeReadOnly(t *testing.T) {
	needCluster(t)
	d := t.TempDir()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(d, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.Orgs().Create(ctx, store.Org{ID: "org-a", Name: "org-a"}); err != nil {
		t.Fatal(err)
	}
	blobs, err := dir.Open(filepath.Join(d, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	s := snapshotStackWith(t, blobs)
	keys, err := auth.OpenKeyring(filepath.Join(d, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	admin, _, err := keys.Create("org-a", auth.RoleAdmin, "")
	if err != nil {
		t.Fatal(err)
	}
	g, err := gateway.New(gateway.Config{Auth: keys, Runners: []runner.Handle{runner.NewLocal("k8s-runner", s.Runner)},
		Index: st.Sandboxes(), Orgs: st.Orgs(), Volumes: st.Volumes(), Blobs: blobs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	bearer := connect.WithInterceptors(connecttest.Bearer(admin))
	api := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, srv.URL, bearer)
	vc := sandboxv1connect.NewVolumeServiceClient(http.DefaultClient, srv.URL, bearer)

	if _, err := vc.CreateVolume(ctx, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: &sandboxv1.Volume{VolumeId: "shared",
		Spec: &sandboxv1.VolumeSpec{Source: &sandboxv1.VolumeSpec_Pvc{Pvc: &sandboxv1.PvcVolumeSource{RunnerId: "*", Namespace: "default", ClaimName: "shared"}}}}})); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		v, err := vc.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "shared"}))
		if err != nil {
			t.Fatal(err)
		}
		if state := v.Msg.GetStatus().GetState(); state == sandboxv1.VolumeState_VOLUME_STATE_READY {
			break
		} else if state != sandboxv1.VolumeState_VOLUME_STATE_VALIDATING || time.Now().After(deadline) {
			t.Fatalf("volume %v", v.Msg.GetStatus())
		}
	}
	// Generation 1, as a writer on a local runner would have committed it.
	var arch bytes.Buffer
	if err := fsarchive.WriteFiles(&arch, map[string][]byte{"hello.txt": []byte("from the blob store\n")}); err != nil {
		t.Fatal(err)
	}
	prefix := runner.GlobalVolumePrefix("org-a", "shared")
	key := runner.GlobalArchiveKey(prefix, 1, "writer")
	if _, err := blobs.Put(ctx, key, bytes.NewReader(arch.Bytes()), int64(arch.Len())); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(arch.Bytes())
	if err := runner.WriteGlobalManifest(ctx, blobs, prefix, runner.GlobalManifest{Generation: 1, BlobKey: key, Digest: hex.EncodeToString(sum[:]),
		SizeBytes: int64(arch.Len()), ContentBytes: int64(len("from the blob store\n")), Files: 1, SandboxID: "writer", CommitTime: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}

	create := func(readOnly bool) (*connect.Response[sandboxv1.Sandbox], error) {
		return api.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "/bin/sh", Args: []string{"-c", `trap "exit 0" TERM; sleep 3600 & wait`},
				VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "data", MountPath: "/data", ReadOnly: readOnly}}}},
			Volumes: []*sandboxv1.SandboxVolume{{Name: "data", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "shared"}}},
		}}}))
	}
	// Not yet: the Kubernetes backend fills a restored volume through the agent of a
	// container that mounts it writable, and cannot capture a volume once its Pod stopped
	// (docs/volumes.md). Its runner says so (Support.NoGlobalVolumes, global_volumes on
	// the runner wire), so placement leaves it out: with no other runner, both mounts are
	// refused at create, before any Pod is made.
	for _, readOnly := range []bool{true, false} {
		res, err := create(readOnly)
		if err == nil {
			id := res.Msg.GetSandboxId()
			_, _ = api.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
			t.Fatalf("read-only %v: sandbox %s created on a Kubernetes runner, want it refused at placement", readOnly, id)
		}
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner ||
			!strings.Contains(err.Error(), placement.ConstraintGlobalVolumes) {
			t.Errorf("read-only %v: %v, want FAILED_PRECONDITION %s naming %s", readOnly, err, apierr.NoSuitableRunner, placement.ConstraintGlobalVolumes)
		}
		want := "runner[k8s-runner].sandbox.spec.volumes[0].volume_id"
		if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != want {
			t.Errorf("read-only %v: violations %v, want one on %s", readOnly, vs, want)
		}
	}

	// The runner itself refuses a GLOBAL mount at create too (a placement made on a stale
	// view), read-only included: CWSANDBOX_VOLUME_TYPE_NOT_SUPPORTED naming the volume,
	// and nothing is made.
	for _, commit := range []int64{0, 2} { // a reader's copy; a writer's
		_, err := s.Runner.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
			Container: runtime.Container{Name: "main", Image: busybox, Command: "/bin/sh", Args: []string{"-c", "sleep 3600"},
				VolumeMounts: []runtime.VolumeMount{{Volume: "data", Path: "/data", ReadOnly: commit == 0}}},
			Volumes: []runtime.Volume{{Name: "data", SizeBytes: runner.DefaultGlobalVolumeBytes,
				Global: &runtime.GlobalVolume{BlobPrefix: prefix, CommitGeneration: commit, MaxSizeBytes: runner.DefaultGlobalVolumeBytes}}},
		}})
		if apierr.Reason(err) != apierr.VolumeTypeNotSupported || !strings.Contains(err.Error(), `volume "data"`) {
			t.Errorf("runner create, commit generation %d: %v, want %s naming the volume", commit, err, apierr.VolumeTypeNotSupported)
		}
	}
	if sbs := s.Runner.List(); len(sbs) != 0 {
		t.Errorf("the runner made %d sandboxes for refused GLOBAL mounts", len(sbs))
	}
}
