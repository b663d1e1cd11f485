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
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// TestGlobalVolumeReadOnly: a GLOBAL volume (its content in the blob store,
// docs/volumes.md) on a Kubernetes runner: a read-only mount works (the copy is restored
// from the committed generation through the runner-owned filler container before the
// workload starts; the workload reads it and cannot write it; the filler has exited 0).
// A read-only mount of a sub_path is refused (Support.NoGlobalVolumeSubPaths).
// A read-write mount does not yet: the backend cannot commit a writer's copy, so the
// runner says so (Support.NoGlobalVolumeWriters): the gateway's placement leaves it out
// for writers (CWSANDBOX_NO_SUITABLE_RUNNER naming
// placement.ConstraintGlobalVolumeWriters), and the runner refuses a writer's copy
// itself (CWSANDBOX_VOLUME_TYPE_NOT_SUPPORTED). "Not yet" in docs/volumes.md.
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
	// Read-only: the copy is filled from generation 1 through the runner-owned filler
	// container before the workload starts (internal/runtime/kubernetes/globalvol.go);
	// the workload reads it and cannot write it; the filler has exited.
	t0 := time.Now()
	res, err := create(true)
	if err != nil {
		t.Fatalf("read-only GLOBAL mount on the Kubernetes runner: %v", err)
	}
	id := res.Msg.GetSandboxId()
	t.Cleanup(func() {
		_, _ = api.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
	})
	gwWait(t, api, id, sandboxv1.State_STATE_RUNNING)
	t.Logf("read-only GLOBAL copy: create to RUNNING in %s", time.Since(t0).Round(time.Millisecond))
	run := func(script string) (int32, string) {
		t.Helper()
		ex, err := api.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"sh", "-c", script}}))
		if err != nil {
			t.Fatal(err)
		}
		return ex.Msg.GetExitCode(), string(ex.Msg.GetStdout()) + string(ex.Msg.GetStderr())
	}
	if code, out := run("cat /data/hello.txt"); code != 0 || out != "from the blob store\n" {
		t.Errorf("read the GLOBAL copy: exit %d, %q; want generation 1's file", code, out)
	}
	if code, out := run("echo x > /data/new.txt"); code == 0 {
		t.Errorf("a read-only GLOBAL mount took a write (%q)", out)
	} else if !strings.Contains(out, "Read-only file system") {
		t.Errorf("write to the read-only mount: exit %d, %q; want Read-only file system", code, out)
	}
	pod, err := s.Client.CoreV1().Pods(needCluster(t).namespace).Get(ctx, "sbx-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	filler := false
	for _, c := range pod.Spec.Containers {
		if c.Name == "cw-object-store-agent-volumes" {
			filler = true
			if c.Image != needCluster(t).agentImage {
				t.Errorf("the filler runs image %q, not the agent image", c.Image)
			}
		}
		for _, m := range c.VolumeMounts {
			if m.MountPath == "/data" && (c.Name != "sandbox" || !m.ReadOnly) {
				t.Errorf("container %s mounts /data (read-only %v)", c.Name, m.ReadOnly)
			}
		}
	}
	if !filler {
		t.Errorf("no filler container in the Pod: %v", pod.Spec.Containers)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		pod, err = s.Client.CoreV1().Pods(needCluster(t).namespace).Get(ctx, "sbx-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var st *corev1.ContainerStatus
		for i := range pod.Status.ContainerStatuses {
			if pod.Status.ContainerStatuses[i].Name == "cw-object-store-agent-volumes" {
				st = &pod.Status.ContainerStatuses[i]
			}
		}
		if st != nil && st.State.Terminated != nil {
			if st.State.Terminated.ExitCode != 0 {
				t.Errorf("the filler ended with %d (%s)", st.State.Terminated.ExitCode, st.State.Terminated.Message)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the filler still runs beside the workload: %+v", st)
		}
	}
	// Its command exits: the sandbox ends, as one without a filler does.
	if _, err := api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id})); err != nil {
		t.Fatal(err)
	}

	// A sandbox whose command ends (one container, and a group with a sidecar that also
	// mounts the copy read-only) ends as one without a filler: COMPLETED once its command
	// exits 0, which it does only when it found generation 1's file.
	for _, group := range []bool{false, true} {
		c := &sandboxv1.Container{Name: "main", Image: busybox, Command: "/bin/sh", Args: []string{"-c", `grep -q "from the blob store" /data/hello.txt`},
			VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "data", MountPath: "/data", ReadOnly: true}}}
		containers := []*sandboxv1.Container{c}
		if group {
			containers = append(containers, &sandboxv1.Container{Name: "side", Image: busybox, Command: "/bin/sh", Args: []string{"-c", `test -f /data/hello.txt && sleep 3600`},
				VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "data", MountPath: "/data", ReadOnly: true}}})
		}
		res, err := api.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: containers,
			Volumes:    []*sandboxv1.SandboxVolume{{Name: "data", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "shared"}}},
		}}}))
		if err != nil {
			t.Fatalf("group %v: %v", group, err)
		}
		gwWait(t, api, res.Msg.GetSandboxId(), sandboxv1.State_STATE_COMPLETED)
	}

	// A read-only mount of a sub-directory (sub_path) of the copy: the kubelet would make
	// the sub-directory before the filler fills the copy, whose extract then finds its
	// target not empty, so the runner refuses it at create (Support.NoGlobalVolumeSubPaths,
	// CWSANDBOX_VOLUME_TYPE_NOT_SUPPORTED naming sub_path), with no other runner to try.
	before := len(s.Runner.List())
	if res, err := api.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "/bin/sh", Args: []string{"-c", "sleep 3600"},
			VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "data", MountPath: "/data", ReadOnly: true, SubPath: "sub"}}}},
		Volumes: []*sandboxv1.SandboxVolume{{Name: "data", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "shared"}}},
	}}})); err == nil {
		sid := res.Msg.GetSandboxId()
		_, _ = api.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: sid}))
		t.Errorf("sandbox %s mounting a GLOBAL volume's sub_path created on a Kubernetes runner, want it refused", sid)
	} else if apierr.Reason(err) != apierr.VolumeTypeNotSupported || !strings.Contains(err.Error(), "sub_path") {
		t.Errorf("sub_path: %v, want %s naming sub_path", err, apierr.VolumeTypeNotSupported)
	}
	if n := len(s.Runner.List()); n != before {
		t.Errorf("the runner made a sandbox for a refused sub_path mount (%d, was %d)", n, before)
	}

	// Read-write: the writer's copy would have to be committed when the sandbox ends,
	// which this runner cannot do (no container outlives the workload to archive it).
	// Its runner says so (Support.NoGlobalVolumeWriters, no_global_volume_writers on the
	// runner wire), so placement leaves it out: with no other runner, the create is
	// refused before any Pod is made.
	if res, err := create(false); err == nil {
		wid := res.Msg.GetSandboxId()
		_, _ = api.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: wid}))
		t.Fatalf("sandbox %s mounting a GLOBAL volume read-write created on a Kubernetes runner, want it refused at placement", wid)
	} else {
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner ||
			!strings.Contains(err.Error(), placement.ConstraintGlobalVolumeWriters) {
			t.Errorf("read-write: %v, want FAILED_PRECONDITION %s naming %s", err, apierr.NoSuitableRunner, placement.ConstraintGlobalVolumeWriters)
		}
		want := "runner[k8s-runner].sandbox.spec.volumes[0].volume_id"
		if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != want {
			t.Errorf("read-write: violations %v, want one on %s", vs, want)
		}
	}

	// The runner itself refuses a writer's copy at create too (a placement made on a
	// stale view): CWSANDBOX_VOLUME_TYPE_NOT_SUPPORTED naming the volume, nothing made.
	before = len(s.Runner.List())
	_, err = s.Runner.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Name: "main", Image: busybox, Command: "/bin/sh", Args: []string{"-c", "sleep 3600"},
			VolumeMounts: []runtime.VolumeMount{{Volume: "data", Path: "/data"}}},
		Volumes: []runtime.Volume{{Name: "data", SizeBytes: runner.DefaultGlobalVolumeBytes,
			Global: &runtime.GlobalVolume{BlobPrefix: prefix, CommitGeneration: 2, MaxSizeBytes: runner.DefaultGlobalVolumeBytes}}},
	}})
	if apierr.Reason(err) != apierr.VolumeTypeNotSupported || !strings.Contains(err.Error(), `volume "data"`) || !strings.Contains(err.Error(), "read-only only") {
		t.Errorf("runner create of a writer's copy: %v, want %s naming the volume", err, apierr.VolumeTypeNotSupported)
	}
	if n := len(s.Runner.List()); n != before {
		t.Errorf("the runner made a sandbox for a refused GLOBAL writer (%d, was %d)", n, before)
	}
}
