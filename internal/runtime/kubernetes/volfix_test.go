package kubernetes

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestImageWorkDirs: a container that sets no working_dir and mounts a restored volume
// gets its image's working directory as the spec's (a copy: the caller's spec is left
// alone), so the fill knows the directory the runtime makes below the mount: through
// the filler, in place around it, waiting for that container; below a read-only mount it
// is refused naming the image's working directory. The image config is read only for
// such containers; one unreadable, or a working directory that is not absolute, too long
// or holds a NUL, leaves the spec as it was.
func TestImageWorkDirs(t *testing.T) {
	b := snapBackend(t, 0)
	d := prepareEmpty(t, b)
	wds := map[string]string{"deep": "/w/src/../app/work/", "rel": "app", "nul": "/w/a\x00b", "long": "/w/" + strings.Repeat("x", maxImageWorkDir), "root": "/", "dotdot": "/w/../etc/x", "hugename": "/w/" + strings.Repeat("n", 300)}
	var asked []string
	b.cfg.ImageConfig = func(_ context.Context, ref string, _ *runtime.Credentials) (image.Config, error) {
		asked = append(asked, ref)
		if ref == "broken" {
			return image.Config{}, errors.New("registry down")
		}
		return image.Config{WorkingDir: wds[ref]}, nil
	}
	spec := scratchSpec(d, "", wm("/w", "", false))
	spec.Image = "deep"
	spec.Sidecars = []runtime.Container{
		{Name: "side", Image: "deep", Command: "sh", VolumeMounts: []runtime.VolumeMount{wm("/w", "", false)}},
		{Name: "own", Image: "deep", Command: "sh", WorkingDir: "/w/mine", VolumeMounts: []runtime.VolumeMount{wm("/w", "", false)}},
		{Name: "none", Image: "deep", Command: "sh"},
	}
	got := b.imageWorkDirs(context.Background(), spec)
	if got == spec || spec.WorkingDir != "" || spec.Sidecars[0].WorkingDir != "" {
		t.Fatalf("the caller's spec was changed (or not copied): %q %q", spec.WorkingDir, spec.Sidecars[0].WorkingDir)
	}
	if got.WorkingDir != "/w/app/work" || got.Sidecars[0].WorkingDir != "/w/app/work" || got.Sidecars[1].WorkingDir != "/w/mine" || got.Sidecars[2].WorkingDir != "" {
		t.Errorf("working dirs %q %q %q %q, want the image's (cleaned) for the unset ones mounting the volume", got.WorkingDir, got.Sidecars[0].WorkingDir, got.Sidecars[1].WorkingDir, got.Sidecars[2].WorkingDir)
	}
	if len(asked) != 2 {
		t.Errorf("image configs read %d times (%q), want twice: only for containers with no working_dir mounting a restored volume", len(asked), asked)
	}
	plan, rel, err := b.planRestores(got)
	if err != nil || len(plan) != 1 {
		t.Fatalf("plan %+v, %v", plan, err)
	}
	rel()
	if r := plan[0]; r.container != containerFiller || !slices.Equal(r.subDirs, []string{"app/work", "mine"}) || !slices.Equal(r.waitFor, []string{"", "side", "own"}) {
		t.Errorf("plan %+v, want the filler filling around app/work (the image's) and mine (own's working_dir) after the three", r)
	}
	if !needsFiller(got) {
		t.Error("no filler for the image's working directory below the mount")
	}

	// Below a read-only mount: refused, naming it.
	ro := scratchSpec(d, "", wm("/w", "", true))
	ro.Image = "deep"
	if _, rel, err := b.planRestores(b.imageWorkDirs(context.Background(), ro)); !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "image's working directory") || !strings.Contains(err.Error(), "/w/app/work") {
		t.Errorf("below a read-only mount: %v, want ErrInvalidSpec naming the image's working directory", err)
	} else {
		rel()
	}

	// A name fsarchive would not take (the image is the caller's): refused before the Pod.
	huge := scratchSpec(d, "", wm("/w", "", false))
	huge.Image = "hugename"
	if _, rel, err := b.planRestores(b.imageWorkDirs(context.Background(), huge)); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Errorf("a 300-byte name below the mount: %v, want ErrInvalidSpec", err)
	} else {
		rel()
	}

	// Left alone: nothing restored (no image read), an unreadable config, a bad path.
	asked = nil
	fresh := scratchSpec("", "", wm("/w", "", false))
	fresh.Image = "deep"
	if b.imageWorkDirs(context.Background(), fresh) != fresh || len(asked) != 0 {
		t.Errorf("no restored volume: changed, or the image read (%q)", asked)
	}
	for _, img := range []string{"broken", "rel", "nul", "long", "none-set"} {
		sp := scratchSpec(d, "", wm("/w", "", false))
		sp.Image = img
		if out := b.imageWorkDirs(context.Background(), sp); out != sp || sp.WorkingDir != "" {
			t.Errorf("%s: working dir %q, want the spec unchanged", img, out.WorkingDir)
		}
	}
	// The image's working directory above the mount, or one that leaves it once cleaned:
	// nothing is made in the volume, the workload's agent fills it.
	for _, img := range []string{"root", "dotdot"} {
		sp := scratchSpec(d, "", wm("/w", "", false))
		sp.Image = img
		if plan, rel, err := b.planRestores(b.imageWorkDirs(context.Background(), sp)); err != nil || plan[0].container != "" || len(plan[0].subDirs) != 0 {
			t.Errorf("image working dir %q: %+v, %v, want the workload agent filling it", wds[img], plan, err)
		} else {
			rel()
		}
	}
}

// TestSubPathOnlyCapture: a restored scratch volume mounted by sub_path only is captured
// through the filler, which mounts its root and so is kept (not ended after the fill)
// for that; a volume a container mounts at its root is captured through that container
// as before; a fresh sub_path-only volume (no filler) is still refused. Such a sandbox
// ends with its gate (after its primary's agent), not with the Pod, which the kept
// filler holds up, and its exit is the gate's copy of the agent's status.
func TestSubPathOnlyCapture(t *testing.T) {
	d := strings.Repeat("a", 64)
	only := scratchSpec(d, "", wm("/ab", "a/b", false))
	both := scratchSpec(d, "", wm("/w", "", false), wm("/ab", "a/b", true))
	ro := scratchSpec(d, "", wm("/w", "", true))
	fresh := scratchSpec("", "", wm("/ab", "a/b", false))
	writer := scratchSpec(d, "", wm("/ab", "a/b", false))
	writer.Volumes = append(writer.Volumes, runtime.Volume{Name: "g", SizeBytes: 1 << 20, Global: &runtime.GlobalVolume{CommitGeneration: 2}})
	writer.VolumeMounts = append(writer.VolumeMounts, runtime.VolumeMount{Volume: "g", Path: "/g"})
	for _, tc := range []struct {
		name           string
		spec           *runtime.Spec
		captured, kept bool
	}{
		{"sub_path only, restored", only, true, true},
		{"root and sub_path, restored", both, false, false},
		{"read-only root, restored", ro, false, false},
		{"sub_path only, fresh", fresh, false, false},
		{"sub_path only, restored, with a GLOBAL writer", writer, true, false},
	} {
		if got := capturedViaFiller(tc.spec, 0); got != tc.captured {
			t.Errorf("%s: capturedViaFiller %v", tc.name, got)
		}
		if got := keepsFillerForCaptures(tc.spec); got != tc.kept {
			t.Errorf("%s: keepsFillerForCaptures %v", tc.name, got)
		}
	}

	b, _ := newFakeBackend(t, Config{})
	for name, spec := range map[string]*runtime.Spec{"only": only, "both": both, "fresh": fresh} {
		sp := *spec
		sp.ID = name
		b.mu.Lock()
		b.sandboxes[name] = &sandbox{id: name, spec: sp, changed: make(chan struct{}), done: make(chan struct{})}
		b.mu.Unlock()
	}
	ctx := context.Background()
	c, err := b.CaptureVolume(ctx, "only", "w")
	if err != nil {
		t.Fatalf("sub_path only, restored: %v", err)
	}
	if cc := c.(*capture); cc.container != containerFiller || cc.path != fillerPath(0) || !cc.filler {
		t.Errorf("sub_path only, restored: capture through %q at %s (filler %v), want the filler at %s", cc.container, cc.path, cc.filler, fillerPath(0))
	}
	_ = c.Close()
	if c, err := b.CaptureVolume(ctx, "both", "w"); err != nil || c.(*capture).container != "" || c.(*capture).path != "/w" || c.(*capture).filler {
		t.Errorf("root mounted: %+v, %v, want the primary at /w", c, err)
	} else {
		_ = c.Close()
	}
	if _, err := b.CaptureVolume(ctx, "fresh", "w"); err == nil || !strings.Contains(err.Error(), "sub-path") {
		t.Errorf("fresh sub_path only: %v, want refused naming the sub-path", err)
	}

	// The end: the gate ended (after the primary's agent, its status copied), the
	// filler still running, the Pod Running: the sandbox has ended with the agent's exit.
	term := func(msg string) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", Message: msg, FinishedAt: metav1.Now()}}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName("only")}, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.9", ContainerStatuses: []corev1.ContainerStatus{
		{Name: containerMain, State: term("")},
		{Name: containerFiller, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
		{Name: containerGate, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
	}}}
	b.mu.Lock()
	s := b.sandboxes["only"]
	s.pod = pod
	b.evaluateLocked(s)
	b.mu.Unlock()
	select {
	case <-s.done:
		t.Fatal("ended before its gate copied the agent's final status")
	default:
	}
	ended := pod.DeepCopy()
	ended.Status.ContainerStatuses[2].State = term(`{"state":"MAIN_STATE_FAILED","exitCode":3}`)
	b.mu.Lock()
	s.pod = ended
	b.evaluateLocked(s)
	b.mu.Unlock()
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		t.Fatal("a sub_path-only restored sandbox whose primary and gate ended has not ended (its kept filler holds the Pod up)")
	}
	if s.exit.ExitCode == nil || *s.exit.ExitCode != 3 {
		t.Errorf("exit %+v, want the agent's 3", s.exit)
	}
	// Not so for a single sandbox without a kept filler: its Pod's end ends it.
	b.mu.Lock()
	s2 := b.sandboxes["both"]
	s2.pod = ended.DeepCopy()
	b.evaluateLocked(s2)
	b.mu.Unlock()
	select {
	case <-s2.done:
		t.Error("a single sandbox without a kept filler ended before its Pod")
	default:
	}
}
