package kubernetes

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
)

// warmAgent is a warm Pod's agent: in standby until a Start; its Start fails (after
// starting the main command when startAnyway), and Status can be made to fail.
type warmAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	mu          sync.Mutex
	state       agentv1.MainState
	startAnyway bool
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
	if a.startAnyway {
		a.started, a.state = true, agentv1.MainState_MAIN_STATE_RUNNING
	}
	return nil, connect.NewError(connect.CodeUnavailable, errors.New("stream reset"))
}

// claimWithAgent reserves a warm Pod served by a (an in-process agent) and claims it.
func claimWithAgent(t *testing.T, a *warmAgent, cancelled ...bool) (claimed bool, st WarmStats, err error) {
	t.Helper()
	b, cs := newFakeBackend(t, Config{MaxWarm: 1, MaxPrepull: -1})
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
	for _, o := range []func() error{
		func() error {
			_, err := cs.CoreV1().Pods("sbx").Create(t.Context(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: podName(id), Namespace: "sbx"}}, metav1.CreateOptions{})
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
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if len(cancelled) > 0 && cancelled[0] {
		cancel()
	}
	_, claimed, err = b.claimWarm(ctx, &spec)
	return claimed, b.WarmStats(), err
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
