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
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestGlobalVolumeReadOnly: what a GLOBAL volume (its content in the blob store,
// docs/volumes.md) does on a Kubernetes runner today: a read-only mount fails the sandbox
// naming the volume (its copy is filled through a writable mount, which it lacks), and a
// read-write mount is refused at create naming the reason (the backend cannot capture a
// volume once its Pod has stopped). Both are "not yet" in docs/volumes.md.
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
	// container that mounts it writable (docs/volumes.md), so a volume every container
	// mounts read-only fails the sandbox, naming the volume and why.
	res, err := create(true)
	if err != nil {
		t.Fatalf("read-only mount: %v", err)
	}
	id := res.Msg.GetSandboxId()
	t.Cleanup(func() {
		_, _ = api.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
	})
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		got, err := api.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: id}))
		if err != nil {
			t.Fatal(err)
		}
		st := got.Msg.GetStatus()
		if st.GetState() == sandboxv1.State_STATE_FAILED {
			if r := st.GetStateReason(); !strings.Contains(r, `volume "data"`) || !strings.Contains(r, "read-only") {
				t.Errorf("the read-only mount's failure: %q, want it to name the volume and why", r)
			}
			break
		}
		if st.GetState() == sandboxv1.State_STATE_RUNNING || time.Now().After(deadline) {
			t.Fatalf("sandbox mounting a GLOBAL volume read-only only: %s (%s), want FAILED naming the volume (until a read-only copy can be filled on Kubernetes)", st.GetState(), st.GetStateReason())
		}
	}

	_, err = create(false)
	if apierr.Reason(err) != apierr.VolumeTypeNotSupported || !strings.Contains(err.Error(), `volume "data"`) {
		t.Errorf("read-write mount on a Kubernetes runner: %v, want %s naming the volume", err, apierr.VolumeTypeNotSupported)
	}
}
