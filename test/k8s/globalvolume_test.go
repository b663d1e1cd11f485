package k8s

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/store"
)

// globalEnv is a gateway over one Kubernetes runner with GLOBAL volume "shared" of
// org-a READY (generation 0, empty), the gateway and the runner sharing one blob store.
type globalEnv struct {
	api    sandboxv1connect.SandboxServiceClient
	vc     sandboxv1connect.VolumeServiceClient
	s      *stack.KubernetesStack
	blobs  blob.Store
	prefix string
}

func newGlobalEnv(t *testing.T) *globalEnv {
	t.Helper()
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
	return &globalEnv{api: api, vc: vc, s: s, blobs: blobs, prefix: runner.GlobalVolumePrefix("org-a", "shared")}
}

// TestGlobalVolumeReadOnly: a GLOBAL volume (its content in the blob store,
// docs/volumes.md) on a Kubernetes runner: a read-only mount works (the copy is restored
// from the committed generation through the runner-owned filler container before the
// workload starts; the workload reads it and cannot write it; the filler has exited 0).
// Read-write mounts: TestGlobalVolumeWriter; sub_path mounts: TestGlobalVolumeSubPath.
func TestGlobalVolumeReadOnly(t *testing.T) {
	e := newGlobalEnv(t)
	ctx := context.Background()
	api, s, blobs := e.api, e.s, e.blobs
	// Generation 1, as a writer on a local runner would have committed it.
	var arch bytes.Buffer
	if err := fsarchive.WriteFiles(&arch, map[string][]byte{"hello.txt": []byte("from the blob store\n")}); err != nil {
		t.Fatal(err)
	}
	prefix := e.prefix
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

}

// waitGeneration waits (up to a minute) until the volume's committed generation is gen.
func (e *globalEnv) waitGeneration(t *testing.T, gen int64) runner.GlobalManifest {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		m, err := runner.ReadGlobalManifest(context.Background(), e.blobs, e.prefix)
		if err == nil && m.Generation == gen {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("generation %d not committed: %+v, %v", gen, m, err)
		}
	}
}

// generationFiles extracts the committed generation m as a local runner restores a copy
// (fsarchive.Extract, bounded by the volume's size) and reads the named files.
func (e *globalEnv) generationFiles(t *testing.T, m runner.GlobalManifest, names ...string) map[string]string {
	t.Helper()
	rc, err := e.blobs.Get(context.Background(), m.BlobKey)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	dst := t.TempDir()
	root, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if _, err := fsarchive.Extract(context.Background(), rc, root, runtime.ArchiveLimits{MaxBytes: runner.DefaultGlobalVolumeBytes}, fsarchive.IDMap{}); err != nil {
		t.Fatalf("generation %d's archive: %v", m.Generation, err)
	}
	out := map[string]string{}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dst, n))
		if err != nil {
			out[n] = "<" + err.Error() + ">"
			continue
		}
		out[n] = string(b)
	}
	return out
}

// TestGlobalVolumeWriter: read-write GLOBAL mounts on a Kubernetes runner (docs/volumes.md
// "On a Kubernetes runner"): a writer of the empty volume writes, is deleted, and its
// copy is committed as generation 1 (archived through the filler after the workload
// stopped, before the Pod went); a second writer meanwhile is refused (the lease); a
// reader on the Kubernetes runner then sees generation 1, and so does a local runner's
// restore of its archive; a writer whose command exits (restored from generation 1)
// commits generation 2 on top of it; its Pod is gone afterwards.
func TestGlobalVolumeWriter(t *testing.T) {
	e := newGlobalEnv(t)
	ctx := context.Background()
	c := needCluster(t)
	create := func(readOnly bool, script string) (*connect.Response[sandboxv1.Sandbox], error) {
		return e.api.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Name: "main", Image: busybox, Command: "/bin/sh", Args: []string{"-c", script},
				VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "data", MountPath: "/data", ReadOnly: readOnly}}}},
			Volumes: []*sandboxv1.SandboxVolume{{Name: "data", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "shared"}}},
		}}}))
	}
	exec := func(id, script string) (int32, string) {
		t.Helper()
		ex, err := e.api.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"sh", "-c", script}}))
		if err != nil {
			t.Fatal(err)
		}
		return ex.Msg.GetExitCode(), string(ex.Msg.GetStdout()) + string(ex.Msg.GetStderr())
	}
	const idle = `trap "exit 0" TERM; sleep 3600 & wait`

	// Writer 1, of the empty volume (nothing to restore: the filler is there to archive).
	res, err := create(false, idle)
	if err != nil {
		t.Fatalf("read-write GLOBAL mount on the Kubernetes runner: %v", err)
	}
	w1 := res.Msg.GetSandboxId()
	t.Cleanup(func() {
		_, _ = e.api.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: w1}))
	})
	gwWait(t, e.api, w1, sandboxv1.State_STATE_RUNNING)
	if code, out := exec(w1, "echo one > /data/a.txt && mkdir -p /data/d && echo deep > /data/d/b.txt && chmod 600 /data/d/b.txt"); code != 0 {
		t.Fatalf("write the GLOBAL copy: exit %d, %s", code, out)
	}
	pod, err := e.s.Client.CoreV1().Pods(c.namespace).Get(ctx, "sbx-"+w1, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ct := range pod.Spec.Containers {
		switch ct.Name {
		case "gate":
			if !slices.Contains(ct.Command, "--hold") {
				t.Errorf("the writer's gate command %v, want it held for the filler", ct.Command)
			}
		case "cw-object-store-agent-volumes":
			if ct.Image != c.agentImage {
				t.Errorf("the filler runs %q", ct.Image)
			}
		}
	}
	// The lease: a second writer is refused while the first lives.
	if res, err := create(false, idle); err == nil {
		_, _ = e.api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: res.Msg.GetSandboxId()}))
		t.Error("a second writer was created while the first holds the lease")
	} else if apierr.Reason(err) != apierr.VolumeBusy {
		t.Errorf("a second writer: %v, want %s", err, apierr.VolumeBusy)
	}
	t0 := time.Now()
	if _, err := e.api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: w1})); err != nil {
		t.Fatal(err)
	}
	m1 := e.waitGeneration(t, 1)
	t.Logf("writer deleted to generation 1 committed: %s (archive %d bytes, %d files)", time.Since(t0).Round(time.Millisecond), m1.SizeBytes, m1.Files)
	if m1.SandboxID != w1 || m1.ContentBytes != int64(len("one\ndeep\n")) {
		t.Errorf("generation 1 %+v, want writer %s's 9 bytes", m1, w1)
	}
	if got := e.generationFiles(t, m1, "a.txt", "d/b.txt"); got["a.txt"] != "one\n" || got["d/b.txt"] != "deep\n" {
		t.Errorf("generation 1 restored as a local runner does: %v", got)
	}

	// A reader on the Kubernetes runner sees generation 1 (the mount right after the
	// delete: the gateway waits for a TERMINATING writer's upload).
	res, err = create(true, idle)
	if err != nil {
		t.Fatal(err)
	}
	r1 := res.Msg.GetSandboxId()
	t.Cleanup(func() {
		_, _ = e.api.DeleteSandbox(context.Background(), connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: r1}))
	})
	gwWait(t, e.api, r1, sandboxv1.State_STATE_RUNNING)
	if code, out := exec(r1, "cat /data/a.txt /data/d/b.txt"); code != 0 || out != "one\ndeep\n" {
		t.Errorf("the reader: exit %d, %q; want generation 1", code, out)
	}
	if _, err := e.api.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: r1})); err != nil {
		t.Fatal(err)
	}

	// Writer 2, whose command exits: restored from generation 1, commits generation 2.
	res, err = create(false, `cat /data/a.txt > /data/copied.txt && echo two >> /data/a.txt`)
	if err != nil {
		t.Fatal(err)
	}
	w2 := res.Msg.GetSandboxId()
	gwWait(t, e.api, w2, sandboxv1.State_STATE_COMPLETED)
	m2 := e.waitGeneration(t, 2)
	if got := e.generationFiles(t, m2, "a.txt", "copied.txt", "d/b.txt"); got["a.txt"] != "one\ntwo\n" || got["copied.txt"] != "one\n" || got["d/b.txt"] != "deep\n" {
		t.Errorf("generation 2: %v", got)
	}
	if m2.SandboxID != w2 {
		t.Errorf("generation 2 by %s, want %s", m2.SandboxID, w2)
	}
	// The writer's Pod goes once its copy is committed.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		_, err := e.s.Client.CoreV1().Pods(c.namespace).Get(ctx, "sbx-"+w2, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writer's Pod is still there: %v", err)
		}
	}

	// A group writer (a sidecar beside the primary): the primary's exit stops the
	// sidecar through its agent (the Pod stays), then the copy is committed.
	res, err = e.api.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{
			{Name: "main", Image: busybox, Command: "/bin/sh", Args: []string{"-c", `sleep 1; echo group >> /data/a.txt`},
				VolumeMounts: []*sandboxv1.VolumeMount{{Volume: "data", MountPath: "/data"}}},
			{Name: "side", Image: busybox, Command: "/bin/sh", Args: []string{"-c", idle}},
		},
		Volumes: []*sandboxv1.SandboxVolume{{Name: "data", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "shared"}}},
	}}}))
	if err != nil {
		t.Fatalf("group writer: %v", err)
	}
	gwWait(t, e.api, res.Msg.GetSandboxId(), sandboxv1.State_STATE_COMPLETED)
	m3 := e.waitGeneration(t, 3)
	if got := e.generationFiles(t, m3, "a.txt"); got["a.txt"] != "one\ntwo\ngroup\n" {
		t.Errorf("generation 3 (the group writer's): %v", got)
	}

	// A hostile writer: a file far over the volume's size (sparse: it takes no disk, and
	// all zeros it compresses to nothing) and a symlink to the Pod's root. The archive
	// made in its Pod is refused by the runner's check at that file's header: nothing is
	// committed, generation 3 stays, and the lease is released (the next writer runs).
	res, err = create(false, `ln -s / /data/escape && truncate -s 20G /data/sparse && ls -ls /data/sparse`)
	if err != nil {
		t.Fatal(err)
	}
	gwWait(t, e.api, res.Msg.GetSandboxId(), sandboxv1.State_STATE_COMPLETED)
	res, err = create(false, `cat /data/a.txt; test ! -e /data/sparse`)
	if err != nil {
		t.Fatalf("the writer after a refused commit: %v", err)
	}
	gwWait(t, e.api, res.Msg.GetSandboxId(), sandboxv1.State_STATE_COMPLETED)
	if m := e.waitGeneration(t, 4); m.SandboxID != res.Msg.GetSandboxId() {
		t.Errorf("generation 4 by %s, want the writer after the refused one", m.SandboxID)
	} else if got := e.generationFiles(t, m, "a.txt", "sparse"); got["a.txt"] != "one\ntwo\ngroup\n" || !strings.HasPrefix(got["sparse"], "<") {
		t.Errorf("generation 4: %v, want generation 3's content and no sparse file", got)
	}
}
