package kubernetes

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// warmAgent is a warm Pod's agent: in standby until a Start; its Start fails (after
// starting the main command when startAnyway), and Status can be made to fail.
type warmAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	mu          sync.Mutex
	state       agentv1.MainState
	startAnyway bool
	startOK     bool // Start succeeds
	statusDown  bool // Status fails after the Start
	started     bool
	starts      int
}

func (a *warmAgent) Status(context.Context, *connect.Request[agentv1.StatusRequest]) (*connect.Response[agentv1.StatusResponse], error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.statusDown && a.starts > 0 {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("down"))
	}
	return connect.NewResponse(&agentv1.StatusResponse{State: a.state}), nil
}

func (a *warmAgent) Start(context.Context, *connect.Request[agentv1.StartRequest]) (*connect.Response[agentv1.StartResponse], error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.starts++
	if a.startOK {
		a.started, a.state = true, agentv1.MainState_MAIN_STATE_RUNNING
		return connect.NewResponse(&agentv1.StartResponse{}), nil
	}
	if a.startAnyway {
		a.started, a.state = true, agentv1.MainState_MAIN_STATE_RUNNING
	}
	return nil, connect.NewError(connect.CodeUnavailable, errors.New("stream reset"))
}

// claimWithAgent reserves a warm Pod served by a (an in-process agent) and claims it.
func claimWithAgent(t *testing.T, a *warmAgent, cancelled ...bool) (claimed bool, st WarmStats, err error) {
	t.Helper()
	r := claimAgent(t, a, nil, cancelled...)
	return r.claimed, r.st, r.err
}

// claimResult is what claimAgent did.
type claimResult struct {
	b       *Backend
	cs      *fake.Clientset
	id      string
	info    runtime.Info
	claimed bool
	st      WarmStats
	err     error
}

// claimAgent is claimWithAgent; setup (when set) changes the backend first (reactors).
func claimAgent(t *testing.T, a *warmAgent, setup func(*Backend, *fake.Clientset), cancelled ...bool) claimResult {
	t.Helper()
	b, cs := newFakeBackend(t, Config{MaxWarm: 1, MaxPrepull: -1})
	if setup != nil {
		setup(b, cs)
	}
	return claimOn(t, b, cs, a, len(cancelled) > 0 && cancelled[0])
}

// claimOn is claimAgent on b (its fake cluster cs): the claimed Pod has a UID (the
// claim's Pod patch carries it) and the claim a caller (the caller's label goes onto
// the NetworkPolicy and pull Secret too).
func claimOn(t *testing.T, b *Backend, cs *fake.Clientset, a *warmAgent, cancelled bool) claimResult {
	t.Helper()
	f := &fakeWarm{}
	f.install(b)
	_, h := agentv1connect.NewAgentServiceHandler(a)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	}
	oneWarmReady(t, b)
	spec := warmSpec("org-a")
	id, ok := b.ReserveWarm(&spec)
	if !ok {
		t.Fatal("no reservation")
	}
	b.warm.mu.Lock()
	w := b.warm.reserved[id]
	w.hc, w.dial = agent.NewHTTPClient(dial), dial
	b.warm.mu.Unlock()
	b.mu.Lock()
	w.s.uid = "u-warm"
	b.mu.Unlock()
	for _, o := range []func() error{
		func() error {
			_, err := cs.CoreV1().Pods("sbx").Create(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "sbx", UID: "u-warm"}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().Secrets("sbx").Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName(id), Namespace: "sbx"}}, metav1.CreateOptions{})
			return err
		},
	} {
		if err := o(); err != nil {
			t.Fatal(err)
		}
	}
	spec.ID = id
	spec.Meta[runtime.MetaCaller] = "alice"
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if cancelled {
		cancel()
	}
	info, claimed, err := b.claimWarm(ctx, &spec)
	return claimResult{b: b, cs: cs, id: id, info: info, claimed: claimed, st: b.WarmStats(), err: err}
}

// TestWarmClaimStartFailure: a Start that fails is judged by the agent's state, so the
// main command never runs twice: started → claimed; still in standby → cold; unknown →
// the Create fails. An agent not in standby before the Start → cold, nothing started.
func TestWarmClaimStartFailure(t *testing.T) {
	t.Run("started", func(t *testing.T) {
		a := &warmAgent{state: agentv1.MainState_MAIN_STATE_STANDBY, startAnyway: true}
		claimed, st, err := claimWithAgent(t, a)
		if !claimed || err != nil || st.Claims != 1 {
			t.Fatalf("claimed %v err %v stats %+v: want claimed", claimed, err, st)
		}
	})
	t.Run("standby", func(t *testing.T) {
		a := &warmAgent{state: agentv1.MainState_MAIN_STATE_STANDBY}
		claimed, st, err := claimWithAgent(t, a)
		if claimed || err != nil || st.Fallback != 1 {
			t.Fatalf("claimed %v err %v stats %+v: want the cold path", claimed, err, st)
		}
	})
	t.Run("unknown", func(t *testing.T) {
		a := &warmAgent{state: agentv1.MainState_MAIN_STATE_STANDBY, startAnyway: true, statusDown: true}
		claimed, _, err := claimWithAgent(t, a)
		if !claimed || !errors.Is(err, errWarmStartUnknown) {
			t.Fatalf("claimed %v err %v: want the Create failed, no cold create", claimed, err)
		}
	})
	t.Run("not in standby", func(t *testing.T) {
		a := &warmAgent{state: agentv1.MainState_MAIN_STATE_RUNNING}
		claimed, _, err := claimWithAgent(t, a)
		a.mu.Lock()
		starts := a.starts
		a.mu.Unlock()
		if claimed || err != nil || starts != 0 {
			t.Fatalf("claimed %v err %v starts %d: want the cold path before any Start", claimed, err, starts)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		a := &warmAgent{state: agentv1.MainState_MAIN_STATE_STANDBY}
		claimed, _, err := claimWithAgent(t, a, true)
		if !claimed || !errors.Is(err, context.Canceled) {
			t.Fatalf("claimed %v err %v: want the caller's cancellation, no cold create", claimed, err)
		}
	})
}

// TestWarmClaimFailureDestroysPod: a claim that fails without a cold create (the Start's
// outcome unknown, the caller gone, the unusable warm Pod not removed) leaves no Pod
// behind: it is destroyed (its Pod deleted, the sandbox forgotten), never started again.
func TestWarmClaimFailureDestroysPod(t *testing.T) {
	gone := func(t *testing.T, r claimResult) {
		t.Helper()
		waitFor(t, "the warm pod destroyed", func() bool {
			_, err := r.cs.CoreV1().Pods("sbx").Get(t.Context(), podName(r.id), metav1.GetOptions{})
			r.b.mu.Lock()
			defer r.b.mu.Unlock()
			return apierrors.IsNotFound(err) && r.b.sandboxes[r.id] == nil
		})
	}
	t.Run("unknown", func(t *testing.T) {
		a := &warmAgent{state: agentv1.MainState_MAIN_STATE_STANDBY, startAnyway: true, statusDown: true}
		r := claimAgent(t, a, nil)
		if !r.claimed || !errors.Is(r.err, errWarmStartUnknown) {
			t.Fatalf("claimed %v err %v: want the Create failed", r.claimed, r.err)
		}
		gone(t, r)
		if n := a.startCount(); n != 1 {
			t.Errorf("%d Starts, want 1", n)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		a := &warmAgent{state: agentv1.MainState_MAIN_STATE_STANDBY}
		r := claimAgent(t, a, nil, true)
		if !r.claimed || !errors.Is(r.err, context.Canceled) {
			t.Fatalf("claimed %v err %v: want the caller's cancellation", r.claimed, r.err)
		}
		gone(t, r)
	})
	t.Run("removal failed", func(t *testing.T) {
		// Not in standby: the cold path removes the warm Pod first; that delete fails
		// once.
		a := &warmAgent{state: agentv1.MainState_MAIN_STATE_RUNNING}
		var failed atomic.Bool
		r := claimAgent(t, a, func(_ *Backend, cs *fake.Clientset) {
			cs.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
				if failed.CompareAndSwap(false, true) {
					return true, nil, apierrors.NewInternalError(errors.New("etcd down"))
				}
				return false, nil, nil
			})
		})
		if !r.claimed || r.err == nil {
			t.Fatalf("claimed %v err %v: want the Create failed", r.claimed, r.err)
		}
		gone(t, r)
		if n := a.startCount(); n != 0 {
			t.Errorf("%d Starts, want none", n)
		}
	})
}

// TestWarmClaimStartedAt: a claim records its time on the Pod (the annotation's value);
// the sandbox's StartedAt is that time, also as read back from the Pod after a runner
// restart (infoOf), not its warm container's start.
func TestWarmClaimStartedAt(t *testing.T) {
	a := &warmAgent{state: agentv1.MainState_MAIN_STATE_STANDBY, startAnyway: true}
	before := time.Now().UTC()
	r := claimAgent(t, a, nil)
	if !r.claimed || r.err != nil {
		t.Fatalf("claimed %v err %v", r.claimed, r.err)
	}
	pod, err := r.cs.CoreV1().Pods("sbx").Get(t.Context(), podName(r.id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	at, ok := warmClaimedAt(pod)
	if !ok || at.Before(before) || at.After(time.Now()) {
		t.Fatalf("annotation %q: want the claim's time", pod.Annotations[annotationWarmClaimed])
	}
	if !r.info.StartedAt.Equal(at) {
		t.Errorf("Create's StartedAt %s, want the claim's %s", r.info.StartedAt, at)
	}
	// As Recover sees it: the warm container started 10 minutes before.
	early := metav1.NewTime(time.Now().Add(-10 * time.Minute))
	pod.Status = corev1.PodStatus{StartTime: &early, ContainerStatuses: []corev1.ContainerStatus{
		{Name: containerMain, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: early}}}}}
	if got := infoOf(&sandbox{id: r.id, pod: pod}).StartedAt; !got.Equal(at) {
		t.Errorf("recovered StartedAt %s, want the claim's %s", got, at)
	}
	// A claim recorded before the time was (value "true"): the container's start.
	pod.Annotations[annotationWarmClaimed] = "true"
	if got := infoOf(&sandbox{id: r.id, pod: pod}).StartedAt; !got.Equal(early.UTC()) {
		t.Errorf("old annotation: StartedAt %s, want the container's %s", got, early.UTC())
	}
}

func (a *warmAgent) startCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.starts
}

// TestWarmClaimHandsOverConnection: the sandbox's first DialAgent after a claim (the
// runner's first command) takes a verified connection the claim made, through a real
// gate: no new dial, TLS or identity handshake on the way to the first command.
func TestWarmClaimHandsOverConnection(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	dir := t.TempDir()
	client, server := gateCerts(t, dir)
	ident := agent.NewIdentity("x")
	a := &warmAgent{state: agentv1.MainState_MAIN_STATE_STANDBY, startOK: true}
	mux := http.NewServeMux()
	mux.Handle(agentv1connect.NewAgentServiceHandler(a))
	srv := &http.Server{Handler: mux, Protocols: new(http.Protocols)}
	srv.Protocols.SetUnencryptedHTTP2(true)
	ln := agentListener(t, filepath.Join(dir, "primary.sock"), ident)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	gdial := startGate(t, ctx, dir, gate.ServeOptions{})
	var dials atomic.Int32
	b, cs := newFakeBackend(t, Config{MaxWarm: 1, MaxPrepull: -1, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return gdial(ctx, network, addr)
	}})
	b.warm.makeFn = func(spec *runtime.Spec, key string) (*warmPod, error) {
		s := &sandbox{id: spec.ID, spec: *spec, client: client, server: server.Certificate[0], ident: ident,
			pod:     &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.0.0.1"}},
			changed: make(chan struct{}), done: make(chan struct{})}
		b.mu.Lock()
		b.sandboxes[spec.ID] = s
		b.mu.Unlock()
		w := &warmPod{id: spec.ID, key: key, s: s}
		w.hc = agent.NewHTTPClient(func(ctx context.Context) (net.Conn, error) { return b.dialAgent(ctx, w.id, "", false) })
		return w, nil
	}
	if err := b.SetWarmPools(ctx, []runtime.WarmTarget{{Key: "org-a/t1", Spec: warmSpec("org-a"), Size: 1}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a ready warm pod", func() bool { return b.WarmStats().Ready == 1 })
	spec := warmSpec("org-a")
	id, ok := b.ReserveWarm(&spec)
	if !ok {
		t.Fatal("no reservation")
	}
	for _, err := range []error{
		func() error {
			_, err := cs.CoreV1().Pods("sbx").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "sbx"}}, metav1.CreateOptions{})
			return err
		}(),
		func() error {
			_, err := cs.CoreV1().Secrets("sbx").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secretName(id), Namespace: "sbx"}}, metav1.CreateOptions{})
			return err
		}(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	spec.ID = id
	if _, claimed, err := b.claimWarm(ctx, &spec); !claimed || err != nil {
		t.Fatalf("claimed %v err %v", claimed, err)
	}
	before := dials.Load()
	c, err := b.DialAgent(ctx, id, "")
	if err != nil {
		t.Fatal(err)
	}
	if n := dials.Load() - before; n != 0 {
		t.Errorf("the first DialAgent after the claim made %d new dials, want 0 (the claim's connection)", n)
	}
	// The connection is the agent's: a Status over it answers (the main command runs).
	hc := agent.NewHTTPClient(func(context.Context) (net.Conn, error) { return c, nil })
	defer hc.CloseIdleConnections()
	st, err := agentv1connect.NewAgentServiceClient(hc, "http://sandbox-agent", connect.WithGRPC()).Status(ctx, connect.NewRequest(&agentv1.StatusRequest{}))
	if err != nil || st.Msg.GetState() != agentv1.MainState_MAIN_STATE_RUNNING {
		t.Fatalf("Status over the handed-over connection: %v %v", st, err)
	}
}
