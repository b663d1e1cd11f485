package kubernetes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// writerSpec mounts GLOBAL copy "g" read-write in the primary as its writer (it commits
// generation 3 on top of 2, restored from digest d; "" for an empty volume).
func writerSpec(d string) *runtime.Spec {
	spec := globalSpec(d)
	spec.Container.VolumeMounts[1].ReadOnly = false
	spec.Volumes[1].Global.CommitGeneration = 3
	return spec
}

// TestGlobalVolumeWriterSupport: the Kubernetes backend commits GLOBAL writers (no
// NoGlobalVolumeWriters; a stopped writer's copy is captured), sub_paths too.
func TestGlobalVolumeWriterSupport(t *testing.T) {
	b := &Backend{cfg: Config{Namespace: "ns", RunnerID: "r1", AgentImage: "agent:1", SnapshotCacheDir: t.TempDir()}, sandboxes: map[string]*sandbox{}}
	s := b.Support()
	if s.NoGlobalVolumes || s.NoGlobalVolumeWriters || s.NoGlobalVolumeSubPaths {
		t.Errorf("Support %+v: want GLOBAL volumes and writers, with sub_paths", s)
	}
	var lc runtime.LiveCapturer = b
	var sc runtime.StoppedGlobalCapturer = b
	if !lc.CapturesLive() || !sc.CapturesStoppedGlobals() {
		t.Error("want a live capturer that captures stopped GLOBAL writers")
	}
}

// TestGlobalVolumeWriterPod: a writer's Pod has the filler also for an empty volume
// (nothing to restore, a copy to archive), the gate held for the filler, and the
// primary's agent leaving its status in its own termination message; the filler is not
// ended after the fill. A reader's Pod keeps the read-only shape.
func TestGlobalVolumeWriterPod(t *testing.T) {
	b := snapBackend(t, 0)
	b.cfg.Namespace, b.cfg.RunnerID, b.cfg.AgentImage, b.cfg.TerminationGrace = "ns", "r1", "agent:1", 10e9
	b.cfg.ImageConfig = func(context.Context, string, *runtime.Credentials) (image.Config, error) { return image.Config{}, nil }
	d := digestOfBytes([]byte("x"))
	sc, _ := securityFor(nil, "")
	for name, spec := range map[string]*runtime.Spec{"restored": writerSpec(d), "empty": writerSpec("")} {
		if err := runtime.ValidateSpec(spec, maxIDLen); err != nil {
			t.Fatal(err)
		}
		if !needsFiller(spec) || !commits(spec) || globalIndex(spec, "g") != 1 || globalIndex(spec, "s") != -1 {
			t.Errorf("%s: needsFiller %v, commits %v, globalIndex %d", name, needsFiller(spec), commits(spec), globalIndex(spec, "g"))
		}
		pod := b.podFor(spec, "", b.labels(spec), nil, sc)
		b.addFiller(pod, spec)
		f := containerNamed(pod, containerFiller)
		if f == nil || mountAt(f, "/sandbox-volumes/1") == nil || mountAt(f, "/sandbox-volumes/1").ReadOnly {
			t.Fatalf("%s: filler %v, want it mounting the copy writable", name, f)
		}
		if g := containerNamed(pod, containerGate); !slices.Equal(g.Command, []string{"/sandbox-gate", "serve", gate.FlagHold, containerFiller}) {
			t.Errorf("%s: gate command %v, want it held for the filler", name, g.Command)
		}
		if m := containerNamed(pod, containerMain); !slices.Equal(m.Command, []string{gate.GatePath, "exec-agent", gate.FlagTerminationLog}) {
			t.Errorf("%s: primary command %v, want its agent's status in its termination message", name, m.Command)
		}
		if m := mountAt(containerNamed(pod, containerMain), "/data"); m == nil || m.ReadOnly {
			t.Errorf("%s: the writer's mount %v, want read-write", name, m)
		}
		// The filler stays (no noop start): endFiller does not even dial it.
		if err := b.endFiller(context.Background(), &sandbox{id: "nope", spec: *spec}); err != nil {
			t.Errorf("%s: endFiller of a writer: %v, want nothing done", name, err)
		}
	}
	// A group writer: the primary gets the termination log too, the gate the hold.
	gspec := writerSpec(d)
	gspec.Sidecars = []runtime.Container{{Name: "web", Image: "busybox", Command: "sh"}}
	g, err := b.prepareGroup(context.Background(), gspec, nil)
	if err != nil {
		t.Fatal(err)
	}
	gpod := b.podForGroup(gspec, g, "", b.labels(gspec), nil)
	b.addFiller(gpod, gspec)
	if c := containerNamed(gpod, containerMain); !slices.Contains(c.Command, gate.FlagTerminationLog) {
		t.Errorf("group primary command %v", c.Command)
	}
	if c := containerNamed(gpod, containerGate); !slices.Contains(c.Command, gate.FlagHold) {
		t.Errorf("group gate command %v", c.Command)
	}
	if got := workloadPodNames(gspec); !slices.Equal(got, []string{containerMain, "web"}) {
		t.Errorf("group workload %v", got)
	}

	// A reader: unchanged (the gate ends with the primary, the filler is ended).
	reader := globalSpec(d)
	pod := b.podFor(reader, "", b.labels(reader), nil, sc)
	b.addFiller(pod, reader)
	if c := containerNamed(pod, containerGate); slices.Contains(c.Command, gate.FlagHold) {
		t.Errorf("reader gate command %v", c.Command)
	}
	if c := containerNamed(pod, containerMain); slices.Contains(c.Command, gate.FlagTerminationLog) {
		t.Errorf("reader primary command %v", c.Command)
	}
	if err := b.endFiller(context.Background(), &sandbox{id: "nope", spec: *reader}); err == nil {
		t.Error("endFiller of a reader did nothing")
	}
}

// writerPod is a writer Pod's status: the primary (with its agent's final status in its
// termination message when ended), the gate and the filler running.
func writerPod(mainEnded bool, msg string) *corev1.Pod {
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
	main := corev1.ContainerStatus{Name: containerMain, State: running}
	if mainEnded {
		main.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", Message: msg,
			StartedAt: metav1.NewTime(time.Now().Add(-time.Minute)), FinishedAt: metav1.Now()}}
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sbx-x", Namespace: "ns", UID: "u1", Labels: map[string]string{LabelSandbox: "x"},
		Annotations: map[string]string{annotationWorkloadStarted: "true"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", ContainerStatuses: []corev1.ContainerStatus{
			{Name: containerGate, State: running}, main, {Name: containerFiller, State: running}}}}
}

// behindGateWithFiller is behindGate for a writer: the gate serves the primary's agent
// (primary, a handler) and the filler's (a real agent in standby, its own identity) under
// ContainersDir, held for the filler; the filler's copy is dir/copy.
// Each sidecar (a group writer) gets its own agent handler, at its name under ContainersDir.
func behindGateWithFiller(t *testing.T, ctx context.Context, primary agentv1connect.AgentServiceHandler, sidecars ...sidecarAgent) (*Backend, *sandbox, string) {
	t.Helper()
	dir := t.TempDir()
	client, server := gateCerts(t, dir)
	ident, fident := agent.NewIdentity("x"), agent.NewIdentity("x/"+containerFiller)
	containers := filepath.Join(dir, "containers")
	if err := os.MkdirAll(filepath.Join(containers, containerFiller), 0o755); err != nil {
		t.Fatal(err)
	}
	serve := func(ln net.Listener, h agentv1connect.AgentServiceHandler) {
		mux := http.NewServeMux()
		mux.Handle(agentv1connect.NewAgentServiceHandler(h))
		srv := &http.Server{Handler: mux, Protocols: new(http.Protocols)}
		srv.Protocols.SetUnencryptedHTTP2(true)
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
	serve(agentListener(t, filepath.Join(dir, "primary.sock"), ident), primary)
	idents := map[string]*agentconfig.Identity{containerFiller: fident}
	spec := writerSpec("")
	spec.ID = "x"
	for _, sc := range sidecars {
		if err := os.MkdirAll(filepath.Join(containers, sc.name), 0o755); err != nil {
			t.Fatal(err)
		}
		idents[sc.name] = agent.NewIdentity("x/" + sc.name)
		serve(agentListener(t, filepath.Join(containers, sc.name, gate.Socket), idents[sc.name]), sc.handler)
		spec.Sidecars = append(spec.Sidecars, runtime.Container{Name: sc.name, Image: "busybox", Command: "sh"})
	}
	fln := agentListener(t, filepath.Join(containers, containerFiller, gate.Socket), fident)
	fillerDone := make(chan struct{})
	go func() {
		defer close(fillerDone)
		_, _ = agent.Run(ctx, agent.Options{Config: &agentconfig.Config{Standby: true, WorkingDir: dir}, StateDir: filepath.Join(dir, "filler-run"), Listener: fln})
	}()
	t.Cleanup(func() { <-fillerDone })
	dial := startGate(t, ctx, dir, gate.ServeOptions{ContainersDir: containers, HoldFor: containerFiller})
	b := snapBackend(t, 0)
	b.ctx = ctx
	b.log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	b.cfg.Namespace, b.cfg.StartTimeout, b.cfg.ForceDeleteAfter = "ns", 30*time.Second, time.Second
	b.cfg.Client = fake.NewSimpleClientset()
	b.cfg.Dial = dial
	s := &sandbox{id: "x", spec: *spec, client: client, server: server.Certificate[0], ident: ident, uid: "u1",
		idents: idents,
		pod:    writerPod(false, ""), changed: make(chan struct{}), done: make(chan struct{})}
	b.sandboxes["x"] = s
	return b, s, dir
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// sidecarAgent is a group writer's sidecar agent for behindGateWithFiller.
type sidecarAgent struct {
	name    string
	handler agentv1connect.AgentServiceHandler
}

// stopAgent is a primary agent that records Stop calls.
type stopAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	mu     sync.Mutex
	graces []time.Duration
	called chan struct{}
	refuse bool // answer UNIMPLEMENTED, as an agent older than Stop
}

func (a *stopAgent) Stop(_ context.Context, req *connect.Request[agentv1.StopRequest]) (*connect.Response[agentv1.StopResponse], error) {
	if a.refuse {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("no Stop"))
	}
	a.mu.Lock()
	a.graces = append(a.graces, req.Msg.GetGrace().AsDuration())
	a.mu.Unlock()
	close(a.called)
	return connect.NewResponse(&agentv1.StopResponse{}), nil
}

func podDeletes(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "delete" && a.GetResource().Resource == "pods" {
			n++
		}
	}
	return n
}

// TestGlobalWriterStopAndCommit: Stop ends a writer's workload through its agent (Stop
// with the grace) without deleting the Pod; the sandbox ends once the primary has
// terminated (its exit from the primary's own termination message) while the gate and
// the filler run on; the copy is then captured through the filler (the runner's commit),
// which the runner's own DialAgent still cannot name; once the Pod is going, no capture.
func TestGlobalWriterStopAndCommit(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ag := &stopAgent{called: make(chan struct{})}
	b, _, dir := behindGateWithFiller(t, ctx, ag)
	// The filler's copy (in the Pod, /sandbox-volumes/1).
	copyDir := filepath.Join(dir, "copy")
	if err := os.MkdirAll(filepath.Join(copyDir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(copyDir, "sub", "f.txt"), []byte("written by the writer"), 0o644); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- b.Stop(ctx, "x", 7*time.Second) }()
	select {
	case <-ag.called:
	case err := <-stopped:
		t.Fatalf("Stop returned %v before stopping the agent", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the primary's agent got no Stop")
	}
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned %v while the primary runs", err)
	case <-time.After(200 * time.Millisecond):
	}
	// The kubelet reports the primary's end; its agent's final status in its message.
	b.observe(writerPod(true, `{"state":"MAIN_STATE_STOPPED","exit_code":143,"reason":"Stopped"}`), false)
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not return once the workload ended")
	}
	if ag.graces[0] != 7*time.Second {
		t.Errorf("Stop's grace %v, want 7s", ag.graces[0])
	}
	if n := podDeletes(b.cfg.Client.(*fake.Clientset)); n != 0 {
		t.Errorf("%d Pod deletes: the writer's Pod must stay for the commit", n)
	}
	ex, err := b.Wait(ctx, "x")
	if err != nil || ex.ExitCode == nil || *ex.ExitCode != 143 || ex.Reason != "Stopped" {
		t.Errorf("exit %+v, %v: want the primary's own status (143, Stopped)", ex, err)
	}

	// The commit: through the filler, after the end. The filler mounts the copy at
	// /sandbox-volumes/1 in the Pod; here the test's agent sees it at copyDir.
	c, err := b.CaptureVolume(ctx, "x", "g")
	if err != nil {
		t.Fatal(err)
	}
	cp := c.(*capture)
	if cp.container != containerFiller || cp.path != "/sandbox-volumes/1" || !cp.filler {
		t.Errorf("capture %+v, want the filler's /sandbox-volumes/1", cp)
	}
	cp.path = copyDir
	var buf bytes.Buffer
	if _, err := c.WriteArchive(ctx, &buf); err != nil {
		t.Fatalf("archive through the filler after the workload ended: %v", err)
	}
	c.Close()
	st, err := fsarchive.Check(ctx, bytes.NewReader(buf.Bytes()), runtime.ArchiveLimits{})
	if err != nil || st.Bytes != int64(len("written by the writer")) {
		t.Errorf("the archive: %+v, %v", st, err)
	}
	if _, err := b.DialAgent(ctx, "x", containerFiller); err == nil {
		t.Error("DialAgent reached the filler")
	}
	// Other volumes are captured as before (the sandbox has ended: not at all).
	if _, err := b.CaptureVolume(ctx, "x", "s"); err == nil {
		t.Error("a scratch volume captured after the end")
	}
	// The Pod is being deleted: the copy goes with it.
	going := writerPod(true, "")
	going.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	b.observe(going, false)
	if _, err := b.CaptureVolume(ctx, "x", "g"); err == nil || !strings.Contains(err.Error(), "gone or going") {
		t.Errorf("capture of a going Pod: %v", err)
	}
}

// TestGlobalWriterStopFallback: an agent that cannot stop its workload (older than
// Stop) gets the Pod deleted, as any Pod's Stop does (the writes are lost).
func TestGlobalWriterStopFallback(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, _, _ := behindGateWithFiller(t, ctx, &stopAgent{refuse: true})
	stopped := make(chan error, 1)
	go func() { stopped <- b.Stop(ctx, "x", time.Second) }()
	cs := b.cfg.Client.(*fake.Clientset)
	deadline := time.Now().Add(10 * time.Second)
	for podDeletes(cs) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the Pod was not deleted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.observe(writerPod(true, ""), true)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// TestGlobalWriterEnd: a writer's sandbox ends when its workload has (not with the Pod,
// which runs on for the commit); a reader's only with its Pod. A group writer's sidecars
// are stopped through their agents when the primary ends, and the sandbox ends with the
// last of them.
func TestGlobalWriterEnd(t *testing.T) {
	b := snapBackend(t, 0)
	b.cfg.Client = fake.NewSimpleClientset()
	b.ctx = context.Background()
	mk := func(spec *runtime.Spec) *sandbox {
		return &sandbox{id: "x", spec: *spec, changed: make(chan struct{}), done: make(chan struct{})}
	}
	isDone := func(s *sandbox) bool {
		select {
		case <-s.done:
			return true
		default:
			return false
		}
	}
	w, r := mk(writerSpec("")), mk(globalSpec(""))
	for _, s := range []*sandbox{w, r} {
		b.mu.Lock()
		s.pod = writerPod(false, "")
		b.evaluateLocked(s)
		if isDone(s) {
			t.Errorf("commits %v: ended while the primary runs", commits(&s.spec))
		}
		s.pod = writerPod(true, `{"state":"MAIN_STATE_COMPLETED","exit_code":0}`)
		b.evaluateLocked(s)
		b.mu.Unlock()
	}
	if !isDone(w) || w.exit.ExitCode == nil || *w.exit.ExitCode != 0 || w.exit.Reason == "Killed" {
		t.Errorf("writer: done %v, exit %+v; want ended, exit 0", isDone(w), w.exit)
	}
	if isDone(r) {
		t.Error("a reader's sandbox ended before its Pod")
	}

	// A group writer (registered, behind a real gate, its sidecar's agent a stop agent):
	// the primary's end stops the sidecar through its agent, not by deleting the Pod;
	// the sandbox ends once the sidecar has terminated.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	web := &stopAgent{called: make(chan struct{})}
	gb, g, _ := behindGateWithFiller(t, ctx, &stopAgent{called: make(chan struct{})}, sidecarAgent{"web", web})
	wpod := members(&g.spec)[1].pod
	pod := writerPod(true, `{"state":"MAIN_STATE_COMPLETED","exit_code":0}`)
	pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{Name: wpod,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}})
	gb.observe(pod, false)
	gb.mu.Lock()
	stopping := g.stopping
	gb.mu.Unlock()
	if isDone(g) || !stopping {
		t.Errorf("group writer: done %v, stopping %v; want the sidecar stopped first", isDone(g), stopping)
	}
	select {
	case <-web.called:
	case <-time.After(10 * time.Second):
		t.Fatal("the sidecar's agent got no Stop")
	}
	ended := pod.DeepCopy()
	ended.Status.ContainerStatuses[3].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 143}}
	gb.observe(ended, false)
	select {
	case <-g.done:
	case <-time.After(5 * time.Second):
		t.Error("group writer: not ended once the sidecar terminated")
	}
	// The stop's goroutine returns once it saw the end; a fallback would delete the Pod.
	time.Sleep(500 * time.Millisecond)
	if n := podDeletes(gb.cfg.Client.(*fake.Clientset)); n != 0 {
		t.Errorf("%d Pod deletes: the group writer's sidecar must be stopped through its agent", n)
	}
}

// TestGlobalWriterEmptyVolumeHeld: a writer of an empty volume (nothing to restore) is
// still held in standby, and its workload starts only once the filler's agent answers
// (the gate holds the Pod for that agent, the commit archives through it): with the
// filler not answering, runRestores fails rather than letting a short command end before
// the filler is there; with it answering, it returns.
func TestGlobalWriterEmptyVolumeHeld(t *testing.T) {
	spec := writerSpec("")
	if !holdInStandby(spec, nil) || holdInStandby(globalSpec(""), nil) {
		t.Errorf("holdInStandby: writer %v, reader %v; want only the writer held", holdInStandby(spec, nil), holdInStandby(globalSpec(""), nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, s, _ := behindGateWithFiller(t, ctx, &stopAgent{called: make(chan struct{})})
	if err := b.runRestores(ctx, s, nil); err != nil {
		t.Fatalf("runRestores with the filler answering: %v", err)
	}
	// No filler agent behind the dial: the workload is not started.
	nb := snapBackend(t, 0)
	nb.ctx = ctx
	nb.cfg.Namespace, nb.cfg.StartTimeout = "ns", 500*time.Millisecond
	nb.cfg.Client = fake.NewSimpleClientset()
	nb.cfg.Dial = func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("refused") }
	ns := &sandbox{id: "x", spec: *spec, client: s.client, server: s.server, ident: s.ident, uid: "u1", idents: s.idents,
		pod: writerPod(false, ""), changed: make(chan struct{}), done: make(chan struct{})}
	nb.sandboxes["x"] = ns
	if err := nb.runRestores(ctx, ns, nil); err == nil || !strings.Contains(err.Error(), "filler") {
		t.Errorf("runRestores with no filler agent: %v, want the filler's error", err)
	}
}

// recoverWriter is a writer's Pod and Secret as Recover lists them (runner r1).
func recoverWriter(t *testing.T, b *Backend, spec *runtime.Spec, statuses []corev1.ContainerStatus, annotations map[string]string) []k8sruntime.Object {
	t.Helper()
	_, clientPEM, clientKeyPEM, err := selfSigned("sandboxd-runner")
	if err != nil {
		t.Fatal(err)
	}
	_, serverPEM, _, err := selfSigned("sandbox-" + spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	specJSON, _ := json.Marshal(spec)
	cfg := func(name string) []byte {
		b, _ := json.Marshal(&agentconfig.Config{Standby: true, Identity: agent.NewIdentity(spec.ID + "/" + name)})
		return b
	}
	data := map[string][]byte{secretSpec: specJSON, secretClientCert: clientPEM, secretClientKey: clientKeyPEM,
		gate.TLSCertFile: serverPEM, gate.ConfigFile: cfg(""), fillerConfigKey: cfg(containerFiller)}
	if spec.Multi() {
		for _, m := range members(spec) {
			data[configKey(m)] = cfg(m.name)
		}
	}
	lbls := b.labels(spec)
	return []k8sruntime.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName(spec.ID), Namespace: "sbx", Labels: lbls}, Data: data},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(spec.ID), Namespace: "sbx", UID: types.UID("u-" + spec.ID), Labels: lbls, Annotations: annotations},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: statuses}},
	}
}

// TestGlobalWriterRecover: after a runner restart, a group writer whose primary has
// ended while a sidecar still runs (its stop grace) is alive, not vanished (its copy is
// not committed while the sidecar writes); a writer whose workload never started (its
// image not pulled; the Pod never marked started) has ended (ImagePullFailed) and its
// copy is never captured for a commit.
func TestGlobalWriterRecover(t *testing.T) {
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
	ended := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", Message: `{"state":"MAIN_STATE_COMPLETED","exit_code":0}`}}
	started := map[string]string{annotationWorkloadStarted: "true"}
	// Labels need the backend: a first one only for them.
	lb, _ := newFakeBackend(t, Config{})
	grp := writerSpec("")
	grp.ID = "grp"
	grp.Sidecars = []runtime.Container{{Name: "web", Image: "busybox", Command: "sh"}}
	pull := writerSpec("")
	pull.ID = "pull"
	// A group writer's create cut short: its sidecar runs (in standby), its primary
	// still pulls, the Pod never marked started.
	cut := writerSpec("")
	cut.ID = "cut"
	cut.Sidecars = []runtime.Container{{Name: "web", Image: "busybox", Command: "sh"}}
	var objs []k8sruntime.Object
	objs = append(objs, recoverWriter(t, lb, cut, []corev1.ContainerStatus{
		{Name: containerGate, State: running}, {Name: containerFiller, State: running}, {Name: members(cut)[1].pod, State: running},
		{Name: containerMain, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull"}}}}, nil)...)
	objs = append(objs, recoverWriter(t, lb, grp, []corev1.ContainerStatus{
		{Name: containerGate, State: running}, {Name: containerMain, State: ended}, {Name: containerFiller, State: running},
		{Name: members(grp)[1].pod, State: running}}, started)...)
	objs = append(objs, recoverWriter(t, lb, pull, []corev1.ContainerStatus{
		{Name: containerGate, State: running}, {Name: containerFiller, State: running},
		{Name: containerMain, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}}}, nil)...)
	b, _ := newFakeBackend(t, Config{}, objs...)
	recs, err := b.Recover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]runtime.Recovered{}
	for _, r := range recs {
		got[r.Spec.ID] = r
	}
	if r, ok := got["grp"]; !ok || !r.Alive || r.Exit != nil {
		t.Errorf("group writer with a sidecar running: %+v; want alive", r)
	}
	if r, ok := got["cut"]; !ok || r.Alive {
		t.Errorf("group writer whose create was cut short (sidecar running, never marked started): %+v; want not alive", r)
	}
	// Its image cannot be pulled: said so (startError), as Create would have.
	if r, ok := got["pull"]; !ok || r.Alive || r.Exit == nil || r.Exit.Reason != "ImagePullFailed" {
		t.Errorf("writer never started: %+v; want ended ImagePullFailed", r)
	}
	if _, err := b.CaptureVolume(t.Context(), "pull", "g"); err == nil || !strings.Contains(err.Error(), "never started") {
		t.Errorf("capture of a writer that never started: %v", err)
	}
	// Refused: the sidecar runs (or, its agent not reachable here, the backend's stop
	// fell back to deleting the Pod).
	if _, err := b.CaptureVolume(t.Context(), "grp", "g"); err == nil || !strings.Contains(err.Error(), "not ended") && !strings.Contains(err.Error(), "gone or going") {
		t.Errorf("capture of a group writer whose sidecar runs: %v", err)
	}
}

// TestGlobalWriterCaptureGuards: captureGlobal commits only the copy of a workload that
// was started (the Pod marked, not found in standby by Recover) and has ended.
func TestGlobalWriterCaptureGuards(t *testing.T) {
	b := snapBackend(t, 0)
	spec := writerSpec("")
	mk := func(p *corev1.Pod) *sandbox { return &sandbox{id: "x", spec: *spec, pod: p} }
	unmarked := writerPod(true, "")
	unmarked.Annotations = nil
	held := mk(writerPod(true, ""))
	held.neverStarted = true
	for name, c := range map[string]struct {
		s    *sandbox
		want string
	}{
		"running":       {mk(writerPod(false, "")), "not ended"},
		"not marked":    {mk(unmarked), "never started"},
		"never started": {held, "never started"},
		"ended":         {mk(writerPod(true, "")), ""},
	} {
		cp, err := b.captureGlobal(c.s, "g", 1)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
		if cp != nil {
			cp.Close()
		}
	}
}

// TestPrimaryTerminationLogOnlyForWriters: the primary's own termination message is
// read as the agent's final status only for a GLOBAL writer's Pod (docs/hardening.md):
// any other Pod's primary (whose message its workload could set) is never believed.
func TestPrimaryTerminationLogOnlyForWriters(t *testing.T) {
	p := writerPod(true, `{"state":"MAIN_STATE_COMPLETED","exit_code":42}`)
	if ex := exitOf(p, false, 0, true); ex.ExitCode == nil || *ex.ExitCode != 42 {
		t.Errorf("writer: exit %+v, want the primary's own status (42)", ex)
	}
	if ex := exitOf(p, false, 0, false); ex.ExitCode != nil && *ex.ExitCode == 42 {
		t.Errorf("not a writer: exit %+v read from the primary's own termination message", ex)
	}
}

// TestGlobalWriterGateEnded: a writer whose gate terminated while its workload runs is
// not ended (its copy would be committed while it writes): its workload is stopped as on
// Stop (here its agents are unreachable without the gate: the Pod is deleted), and the
// sandbox ends with the Pod.
func TestGlobalWriterGateEnded(t *testing.T) {
	b := snapBackend(t, 0)
	b.ctx = context.Background()
	b.log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	b.cfg.Namespace, b.cfg.ForceDeleteAfter = "ns", time.Second
	b.cfg.Client = fake.NewSimpleClientset(writerPod(false, ""))
	b.cfg.Dial = func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("refused") }
	spec := writerSpec("")
	spec.ID = "x"
	s := &sandbox{id: "x", spec: *spec, uid: "u1", changed: make(chan struct{}), done: make(chan struct{})}
	b.sandboxes["x"] = s
	p := writerPod(false, "")
	p.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}
	b.observe(p, false)
	select {
	case <-s.done:
		t.Fatal("the writer's sandbox ended with its gate while its workload runs")
	default:
	}
	cs := b.cfg.Client.(*fake.Clientset)
	deadline := time.Now().Add(10 * time.Second)
	for podDeletes(cs) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the workload was not stopped (no Pod delete after its agents were unreachable)")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := b.CaptureVolume(context.Background(), "x", "g"); err == nil {
		t.Error("the copy captured while the workload ran")
	}
}
