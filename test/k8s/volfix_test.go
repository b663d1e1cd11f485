package k8s

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// deepWorkDirImage has testimage.DeepWorkDir as its config's working directory: below
// testimage.VolumeParent, where these tests mount the volume.
const deepWorkDirImage = "localhost/" + testimage.BusyboxDeepWorkDir

// TestVolumeSnapshotImageWorkDir: a container that sets no working_dir, whose image's
// working directory lies below the mount of a volume restored from a snapshot, starts
// in that directory with the snapshot's content and owner, whether a workload agent
// fills the volume (the root mounted writable) or the runner's filler does (a sub_path
// mount too), and also when the snapshot lacks the directory (made as the runtime makes
// it); a read-only mount of it is refused before any Pod, naming the image's working
// directory. Without the runner resolving the image's working directory, runc makes it
// in the empty volume and the fill finds the volume not empty.
func TestVolumeSnapshotImageWorkDir(t *testing.T) {
	s := snapshotStack(t)
	r := s.Runner
	ctx := context.Background()
	src := volumeSpec("")
	src.VolumeMounts = []runtime.VolumeMount{{Volume: "work", Path: testimage.VolumeParent}}
	sb, err := r.Create(ctx, runner.CreateRequest{Spec: src})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{sb.ID}
	defer func() {
		for _, id := range ids {
			_, _ = r.Delete(id, time.Second)
		}
	}()
	waitState(t, r, sb.ID, 2*time.Minute, running)
	if res := exec(t, r, sb.ID, "sh", "-c", "echo top > "+testimage.VolumeParent+"/top && echo ok"); strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Fatalf("write: %q %q", res.Stdout, res.Stderr)
	}
	without := snapshotOf(t, r, sb.ID, "imgwd-without")
	script := "set -e; mkdir -p " + testimage.DeepWorkDir + "; echo wd > " + testimage.DeepWorkDir + "/f; chown 1234:1234 " + testimage.DeepWorkDir + "; chmod 0770 " + testimage.DeepWorkDir + "; echo ok"
	if res := exec(t, r, sb.ID, "sh", "-c", script); strings.TrimSpace(string(res.Stdout)) != "ok" {
		t.Fatalf("write: %q %q", res.Stdout, res.Stderr)
	}
	with := snapshotOf(t, r, sb.ID, "imgwd-with")

	spec := func(mounts ...runtime.VolumeMount) runtime.Spec {
		sp := volumeSpec("")
		sp.Image = deepWorkDirImage
		sp.VolumeMounts = mounts
		// The main command's working directory, as it started (/proc/1/cwd is the
		// agent's).
		sp.Command, sp.Args = "sh", []string{"-c", "pwd > /tmp/main-cwd; exec sleep 3600"}
		return sp
	}
	root := runtime.VolumeMount{Volume: "work", Path: testimage.VolumeParent}
	sub := runtime.VolumeMount{Volume: "work", Path: "/sub", SubPath: "app"}
	for _, tc := range []struct {
		name string
		spec runtime.Spec
		src  runner.SnapshotSource
		want string
	}{
		{"root mounted writable", spec(root), with, testimage.DeepWorkDir + "\nwd\ntop\n1234 770\n"},
		{"through the filler", spec(root, sub), with, testimage.DeepWorkDir + "\nwd\ntop\n1234 770\n"},
		{"not in the snapshot", spec(root), without, testimage.DeepWorkDir + "\ntop\n0 755\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb, err := r.Create(ctx, runner.CreateRequest{Spec: tc.spec, Restores: map[string]runner.SnapshotSource{"work": tc.src}})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, sb.ID)
			if got := waitState(t, r, sb.ID, 2*time.Minute, running); got.State != runner.StateRunning {
				t.Fatalf("%s (%s: %s)", got.State, got.Reason, got.Message)
			}
			// The main command's working directory, and an exec's.
			main := ""
			for end := time.Now().Add(30 * time.Second); main == "" && time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
				main = string(exec(t, r, sb.ID, "sh", "-c", "cat /tmp/main-cwd 2>/dev/null; true").Stdout)
			}
			if want := testimage.DeepWorkDir + "\n"; main != want {
				t.Errorf("main command's working directory %q, want %q", main, want)
			}
			res := exec(t, r, sb.ID, "sh", "-c", "pwd; cat f 2>/dev/null; cat ../../top; stat -c '%u %a' .")
			if got := string(res.Stdout); got != tc.want {
				t.Errorf("exec: got %q, want %q (stderr %q)", got, tc.want, res.Stderr)
			}
		})
	}
	// Read-only only: the runtime cannot make the directory through it before the fill:
	// refused before any Pod (the runner's Create fails, or the sandbox does, with the
	// backend's refusal).
	ro := root
	ro.ReadOnly = true
	why := ""
	if sb, err := r.Create(ctx, runner.CreateRequest{Spec: spec(ro), Restores: map[string]runner.SnapshotSource{"work": with}}); err == nil {
		ids = append(ids, sb.ID)
		end := waitState(t, r, sb.ID, 2*time.Minute, running)
		if end.State != runner.StateFailed {
			t.Errorf("read-only mount: %s, want refused", end.State)
		}
		why = end.Reason + ": " + end.Message
	} else {
		why = err.Error()
	}
	if !strings.Contains(why, "invalid sandbox spec") || !strings.Contains(why, "image's working directory") || !strings.Contains(why, testimage.DeepWorkDir) {
		t.Errorf("read-only mount: %s; want refused as an invalid spec naming the image's working directory", why)
	}
}

// TestVolumeSnapshotSubPathRecapture: a scratch volume restored into a sandbox that
// mounts it by sub_path only can be snapshotted again (through the runner's filler,
// which mounts its root and stays for that), twice in a row, and the last snapshot
// restored at the root holds everything written on the way; such a sandbox still ends
// with its main command, with its exit code.
func TestVolumeSnapshotSubPathRecapture(t *testing.T) {
	s := snapshotStack(t)
	r := s.Runner
	ctx := context.Background()
	var ids []string
	defer func() {
		for _, id := range ids {
			_, _ = r.Delete(id, time.Second)
		}
	}()
	up := func(what string, spec runtime.Spec, from *runner.SnapshotSource) string {
		t.Helper()
		req := runner.CreateRequest{Spec: spec}
		if from != nil {
			req.Restores = map[string]runner.SnapshotSource{"work": *from}
		}
		sb, err := r.Create(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		ids = append(ids, sb.ID)
		if got := waitState(t, r, sb.ID, 2*time.Minute, running); got.State != runner.StateRunning {
			t.Fatalf("%s: %s (%s: %s)", what, got.State, got.Reason, got.Message)
		}
		return sb.ID
	}
	write := func(id, script string) {
		t.Helper()
		if res := exec(t, r, id, "sh", "-c", "set -e; "+script+"; echo ok"); strings.TrimSpace(string(res.Stdout)) != "ok" {
			t.Fatalf("%s: %q %q", script, res.Stdout, res.Stderr)
		}
	}
	src := up("source", volumeSpec(""), nil)
	write(src, "mkdir -p /work/a/b; echo inner > /work/a/b/f; echo top > /work/top")
	s1 := snapshotOf(t, r, src, "recap1")

	only := volumeSpec("")
	only.VolumeMounts = []runtime.VolumeMount{{Volume: "work", Path: "/ab", SubPath: "a/b"}}
	a := up("sub_path only", only, &s1)
	write(a, "echo g > /ab/g")
	s2 := snapshotOf(t, r, a, "recap2")
	b := up("sub_path only, again", only, &s2)
	write(b, "test \"$(cat /ab/g)\" = g; echo h > /ab/h")
	s3 := snapshotOf(t, r, b, "recap3")
	c := up("at the root", volumeSpec(""), &s3)
	res := exec(t, r, c, "sh", "-c", "cat /work/top /work/a/b/f /work/a/b/g /work/a/b/h")
	if got, want := string(res.Stdout), "top\ninner\ng\nh\n"; got != want {
		t.Errorf("after two sub_path-only generations: %q, want %q (stderr %q)", got, want, res.Stderr)
	}

	// Not restored: no filler, nothing mounting the root: refused, saying why.
	fresh := up("fresh sub_path only", only, nil)
	_, err := r.SnapshotVolume(ctx, fresh, runner.SnapshotTarget{Volume: "work", SnapshotID: "recap-fresh", BlobKey: "fss/org/recap-fresh.tar.zst"})
	if apierr.Reason(err) != apierr.FSSNotSupported || !strings.Contains(err.Error(), "no container mounts its root") || !strings.Contains(err.Error(), `sub-path "a/b"`) {
		t.Errorf("a fresh volume mounted by sub_path only: %v, want FSS_NOT_SUPPORTED saying no container mounts its root", err)
	}

	// Its main command's end ends it (the filler kept for captures does not hold it).
	ends := only
	ends.Command, ends.Args = "sh", []string{"-c", "cat /ab/f >/dev/null && sleep 2 && exit 3"}
	sb, err := r.Create(ctx, runner.CreateRequest{Spec: ends, Restores: map[string]runner.SnapshotSource{"work": s1}})
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, sb.ID)
	end := waitState(t, r, sb.ID, 2*time.Minute, func(sb runner.Sandbox) bool { return sb.State.Terminal() })
	if end.ExitCode == nil || *end.ExitCode != 3 {
		t.Errorf("a sub_path-only restored sandbox whose command exits 3: %s (%s: %s), exit %v", end.State, end.Reason, end.Message, end.ExitCode)
	}
}
