package kubernetes

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/errdefs"
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
	if _, rel, err := b.planRestores(b.imageWorkDirs(context.Background(), huge)); !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "containers[].working_dir (or, when unset, the image's working directory)") {
		t.Errorf("a 300-byte name below the mount: %v, want ErrInvalidSpec naming the image's working directory too", err)
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

	b, cs := newFakeBackend(t, Config{})
	var dials atomic.Int32
	b.cfg.Dial = func(context.Context, string, string) (net.Conn, error) {
		dials.Add(1)
		return nil, errors.New("refused")
	}
	ctx := context.Background()
	add := func(name string, spec *runtime.Spec) *sandbox {
		t.Helper()
		sp := *spec
		sp.ID = name
		s := &sandbox{id: name, spec: sp, helloIP: "10.0.0.9", changed: make(chan struct{}), done: make(chan struct{})}
		b.mu.Lock()
		b.sandboxes[name] = s
		b.mu.Unlock()
		// Its Pod in the cluster (unlabelled: the informer leaves it to the test).
		if _, err := cs.CoreV1().Pods(b.cfg.Namespace).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(name), Namespace: b.cfg.Namespace}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	sOnly, sBoth := add("only", only), add("both", both)
	add("fresh", fresh)

	// The fill done, the kept filler is not started with noop (no agent dialled); a
	// filler not kept is.
	if err := b.endFiller(ctx, sOnly); err != nil || dials.Load() != 0 {
		t.Errorf("endFiller of a filler kept for captures: %v, %d dials, want nothing started", err, dials.Load())
	}
	if err := b.endFiller(ctx, sBoth); err == nil || dials.Load() == 0 {
		t.Errorf("endFiller of a filler not kept: %v, %d dials, want its noop start tried", err, dials.Load())
	}

	// The kept filler's CPU limit: one core, or the sandbox's own when smaller; a filler
	// not kept has none.
	sc, _ := securityFor(nil, "")
	for _, tc := range []struct {
		spec *runtime.Spec
		cpu  int64
		want string
	}{{only, 0, "1"}, {only, 250, "250m"}, {only, 4000, "1"}, {both, 0, ""}} {
		sp := *tc.spec
		sp.Resources.MilliCPU = tc.cpu
		pod := b.podFor(&sp, "", b.labels(&sp), nil, sc)
		b.addFiller(pod, &sp)
		q, has := containerNamed(pod, containerFiller).Resources.Limits[corev1.ResourceCPU]
		if got := map[bool]string{true: q.String()}[has]; got != tc.want {
			t.Errorf("filler's CPU limit %q for a sandbox of %dm (kept %v), want %q", got, tc.cpu, keepsFillerForCaptures(&sp), tc.want)
		}
	}

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
	if _, err := b.CaptureVolume(ctx, "fresh", "w"); !errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), "sub-path") {
		t.Errorf("fresh sub_path only: %v, want refused naming the sub-path", err)
	}

	term := func(code int32, reason, msg string) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, Message: msg, FinishedAt: metav1.Now()}}
	}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	podOf := func(name string, main, filler, gate corev1.ContainerState) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(name)}, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.9", ContainerStatuses: []corev1.ContainerStatus{
			{Name: containerMain, State: main}, {Name: containerFiller, State: filler}, {Name: containerGate, State: gate},
		}}}
	}
	observe := func(s *sandbox, p *corev1.Pod) {
		b.mu.Lock()
		s.pod = p
		b.evaluateLocked(s)
		b.mu.Unlock()
	}
	ended := func(s *sandbox) bool {
		select {
		case <-s.done:
			return true
		default:
			return false
		}
	}
	podGone := func(name string, within time.Duration) bool {
		for end := time.Now().Add(within); ; time.Sleep(10 * time.Millisecond) {
			if _, err := cs.CoreV1().Pods(b.cfg.Namespace).Get(ctx, podName(name), metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return true
			}
			if time.Now().After(end) {
				return false
			}
		}
	}

	// The kept filler terminated (OOM-killed at its limit, crashed, or ended by an older
	// runner): a capture is refused as a precondition, saying so, not dialled.
	observe(sOnly, podOf("only", running, term(137, "OOMKilled", `{"x":1}`), running))
	before := dials.Load()
	if _, err := b.CaptureVolume(ctx, "only", "w"); !errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), "filler container") || !strings.Contains(err.Error(), "has terminated (OOMKilled, exit code 137)") || strings.Contains(err.Error(), `{"x"`) {
		t.Errorf("capture through a terminated filler: %v, want refused saying the filler terminated", err)
	}
	if dials.Load() != before {
		t.Error("a capture through a terminated filler dialled it")
	}

	// The end: main terminated, the gate not yet (it copies the agent's final status):
	// running. The gate terminated while main runs (a crash, or a termination message
	// exitOf cannot read with main's own termination not reported yet): running, the Pod
	// kept. Both terminated: ended, with main's exit when the gate's message says nothing
	// readable, and the Pod deleted (the kept filler held it up).
	for _, p := range []*corev1.Pod{
		podOf("only", term(0, "Completed", ""), running, running),
		podOf("only", running, running, term(2, "Error", "")),
		podOf("only", running, running, term(0, "Completed", "not a status")),
		podOf("only", corev1.ContainerState{}, running, term(0, "Completed", "not a status")),
	} {
		observe(sOnly, p)
		if ended(sOnly) {
			t.Fatalf("ended with main %+v, gate %+v: %+v", p.Status.ContainerStatuses[0].State, p.Status.ContainerStatuses[2].State, sOnly.exit)
		}
	}
	if podGone("only", 200*time.Millisecond) {
		t.Fatal("the Pod was deleted while its main container runs")
	}
	observe(sOnly, podOf("only", term(5, "Error", ""), running, term(0, "Completed", "not a status")))
	if !ended(sOnly) {
		t.Fatal("a sub_path-only restored sandbox whose main container and gate terminated has not ended (its kept filler holds the Pod up)")
	}
	if sOnly.exit.ExitCode == nil || *sOnly.exit.ExitCode != 5 || sOnly.exit.Reason == "Vanished" {
		t.Errorf("exit %+v, want main's 5", sOnly.exit)
	}
	if !podGone("only", 5*time.Second) {
		t.Error("the Pod of an ended sandbox whose filler was kept was not deleted")
	}

	// The gate's copy of the agent's final status is the exit.
	s2 := add("only2", only)
	observe(s2, podOf("only2", term(0, "Completed", ""), running, term(0, "Completed", `{"state":"MAIN_STATE_FAILED","exitCode":3}`)))
	if !ended(s2) || s2.exit.ExitCode == nil || *s2.exit.ExitCode != 3 {
		t.Errorf("ended %v, exit %+v, want the agent's 3", ended(s2), s2.exit)
	}
	if !podGone("only2", 5*time.Second) {
		t.Error("the Pod of an ended sandbox whose filler was kept was not deleted")
	}

	// Not so for a single sandbox without a kept filler: its Pod's end ends it.
	observe(sBoth, podOf("both", term(0, "Completed", ""), term(0, "Completed", ""), term(0, "Completed", `{"state":"MAIN_STATE_FAILED","exitCode":3}`)))
	if ended(sBoth) {
		t.Error("a single sandbox without a kept filler ended before its Pod")
	}
	if podGone("both", 200*time.Millisecond) {
		t.Error("the Pod of a single sandbox without a kept filler was deleted before it ended")
	}
}
