package security

import (
	"archive/tar"
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// TestSeccompSandboxdSymlinkIntoVolume: an image whose /.sandboxd is a symlink into a volume
// (/.sandboxd -> /data), or whose /.sandboxd/seccomp.bpf is (-> /data/f.bpf), with the
// volume (written earlier by a sandbox of the same org) holding bin/sandbox-agent and an
// allow-all seccomp program. runc resolves mount destinations following symlinks and
// mounts volumes after the agent's files, so without the backend making /.sandboxd
// itself the volume would hide the real agent (runc executing the planted one as pid 1,
// with no filter) or the real program (the agent installing the planted one). Each
// sandbox must run the real agent under the real filter: pid 1 is sandbox-agent with
// Seccomp 2 and one filter, unshare -U is refused, the planted agent never ran.
// (The images are pushed to the platform registry: busybox plus one layer of
// symlinks; a sandbox of the default profile first, so that the later ones get the
// agent-installed program.)
func TestSeccompSandboxdSymlinkIntoVolume(t *testing.T) {
	d := needDev(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	admin, err := d.NewKey("org-a", "admin")
	if err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(d.API, "http://")
	imgs, err := testimage.StandardImages()
	if err != nil {
		t.Fatal(err)
	}
	push := func(repo string, entries ...tar.Header) string {
		t.Helper()
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			if err := tw.WriteHeader(&h); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		l, err := testimage.LayerFromTar(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		img, err := mutate.AppendLayers(imgs.Busybox, l)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := testimage.PushAuth(host, repo, img, &image.Credentials{Username: "x", Password: admin}); err != nil {
			t.Fatalf("push %s: %v", repo, err)
		}
		return host + "/" + repo
	}
	dirImage := push("org-a/sandboxd-dir-link:v1", tar.Header{Name: ".sandboxd", Typeflag: tar.TypeSymlink, Linkname: "/data", Mode: 0o777})
	fileImage := push("org-a/sandboxd-file-link:v1",
		tar.Header{Name: ".sandboxd/", Typeflag: tar.TypeDir, Mode: 0o755},
		tar.Header{Name: ".sandboxd/seccomp.bpf", Typeflag: tar.TypeSymlink, Linkname: "/data/f.bpf", Mode: 0o777})

	vc := sandboxv1connect.NewVolumeServiceClient(&http.Client{}, d.API, connect.WithInterceptors(connecttest.Bearer(admin)))
	if _, err := vc.CreateVolume(ctx, connect.NewRequest(&sandboxv1.CreateVolumeRequest{Volume: &sandboxv1.Volume{VolumeId: "sbdlink",
		Spec: &sandboxv1.VolumeSpec{Source: &sandboxv1.VolumeSpec_Pvc{Pvc: &sandboxv1.PvcVolumeSource{RunnerId: "*", Namespace: "default", ClaimName: "sbdlink"}}}}})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = vc.DeleteVolume(context.Background(), connect.NewRequest(&sandboxv1.DeleteVolumeRequest{VolumeId: "sbdlink", Force: true, AllowMissing: true}))
	})
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		v, err := vc.GetVolume(ctx, connect.NewRequest(&sandboxv1.GetVolumeRequest{VolumeId: "sbdlink"}))
		if err != nil {
			t.Fatal(err)
		}
		if st := v.Msg.GetStatus().GetState(); st == sandboxv1.VolumeState_VOLUME_STATE_READY {
			break
		} else if st != sandboxv1.VolumeState_VOLUME_STATE_VALIDATING || time.Now().After(deadline) {
			t.Fatalf("volume: %v", v.Msg.GetStatus())
		}
	}
	c := limClient(d, admin)
	spec := func(img string, volume bool) *sandboxv1.SandboxSpec {
		s := limSpec()
		s.Containers[0].Image = img
		if volume {
			s.Volumes = []*sandboxv1.SandboxVolume{{Name: "v", Source: &sandboxv1.SandboxVolume_VolumeId{VolumeId: "sbdlink"}}}
			s.Containers[0].VolumeMounts = []*sandboxv1.VolumeMount{{Volume: "v", MountPath: "/data"}}
		}
		return s
	}
	run := func(img string, volume bool) string {
		t.Helper()
		id := limCreate(t, c, &sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec(img, volume)}})
		limWaitRunning(t, c, id)
		return id
	}
	del := func(id string) {
		_, _ = c.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
	}

	// The planter: the volume gets an agent of its own (a script leaving a mark) and an
	// allow-all program (BPF_RET|BPF_K SECCOMP_RET_ALLOW).
	planter := run("busybox", true)
	limMustExec(t, c, planter, "sh", "-c", `mkdir -p /data/bin && printf '#!/bin/sh\ngrep -E "^Seccomp:" /proc/self/status > /data/ran\nexec sleep 3600\n' > /data/bin/sandbox-agent && chmod 755 /data/bin/sandbox-agent && printf '\006\000\000\000\000\000\377\177' > /data/f.bpf && rm -f /data/ran`)
	del(planter)
	// A sandbox of the profile, so that the filter is compiled and kept.
	del(run("busybox", false))

	for _, img := range []string{dirImage, fileImage} {
		id := run(img, true)
		status := limMustExec(t, c, id, "sh", "-c", "cat /proc/1/comm; grep -E '^(NoNewPrivs|Seccomp|Seccomp_filters):' /proc/1/status | tr -s '\\t' ' '")
		for _, w := range []string{"sandbox-agent", "NoNewPrivs: 1", "Seccomp: 2", "Seccomp_filters: 1"} {
			if !strings.Contains(status, w) {
				t.Errorf("%s (%s): %q missing from\n%s", img, id, w, status)
			}
		}
		r, err := limExec(t, c, id, "unshare", "-U", "-m", "true")
		if err != nil {
			t.Fatal(err)
		}
		if r.GetExitCode() == 0 || !strings.Contains(string(r.GetStderr()), "Operation not permitted") {
			t.Errorf("%s (%s): unshare (refused by the profile): exit %d, stderr %q", img, id, r.GetExitCode(), r.GetStderr())
		}
		if out := limMustExec(t, c, id, "sh", "-c", "test -L /.sandboxd || test -L /.sandboxd/seccomp.bpf && echo link; test -e /data/ran && echo ran; echo done"); strings.TrimSpace(out) != "done" {
			t.Errorf("%s (%s): %q (a symlink left at /.sandboxd, or the planted agent ran)", img, id, out)
		}
		del(id)
	}

	// An image symlink elsewhere pointing at /.sandboxd, a volume mounted there: runc
	// mounts the volume over /.sandboxd after the agent's files and executes the planted
	// "agent". A sandbox with volumes keeps runc's own filter (agentFilterable), so the
	// planted program is the sandbox's own code under the profile: it must find itself
	// filtered (it records its Seccomp line in the volume).
	linkImage := push("org-a/data-link:v1", tar.Header{Name: "data", Typeflag: tar.TypeSymlink, Linkname: "/.sandboxd", Mode: 0o777})
	id := limCreate(t, c, &sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec(linkImage, true)}})
	// The planted "agent" runs at once and never answers: the sandbox stays CREATING.
	// Deleting it detaches the volume (a GLOBAL one is synced then), and a reader
	// mounting it afterwards sees what the planted program wrote.
	time.Sleep(5 * time.Second)
	del(id)
	var ran string
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		res, err := c.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec("busybox", true)}}))
		if err != nil { // the deleted sandbox still holds the volume
			continue
		}
		reader := res.Msg.GetSandboxId()
		limWaitRunning(t, c, reader)
		ran = strings.TrimSpace(limMustExec(t, c, reader, "sh", "-c", "cat /data/ran 2>/dev/null; true"))
		del(reader)
		break
	}
	if ran == "" {
		t.Log("the planted agent never ran")
	} else if !strings.Contains(ran, "Seccomp:\t2") {
		t.Errorf("a planted agent ran outside the seccomp profile: %q", ran)
	}
}
