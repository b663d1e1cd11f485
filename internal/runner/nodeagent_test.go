package runner

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"k8s.io/client-go/kubernetes/fake"

	nodeagentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1/nodeagentv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/nodeagentdial"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

// agentFake is a pauseFake whose pause checkpoints, and whose resume first reaches the
// node agent, through agents (the Kubernetes backend's seam, kubernetes.NodeAgentDialer)
// on node-1, wrapping their errors as the Kubernetes backend does (checkpoint.go).
type agentFake struct {
	*pauseFake
	agents kubernetes.NodeAgentDialer
}

func (f *agentFake) Pause(ctx context.Context, id string, release bool) (runtime.PauseInfo, error) {
	if d := f.dialer(); d != nil {
		a, err := d.Agent(ctx, "node-1")
		if err == nil {
			_, err = a.Checkpoint(ctx, kubernetes.NodeCheckpointRequest{Namespace: "sbx", Name: "sbx-" + id, UID: "u1", SandboxID: id})
		}
		if err != nil {
			return runtime.PauseInfo{}, fmt.Errorf("pause %s: node agent of node-1: %w", id, err)
		}
	}
	return f.pauseFake.Pause(ctx, id, release)
}

func (f *agentFake) Resume(ctx context.Context, id string) (runtime.Info, error) {
	if d := f.dialer(); d != nil {
		if _, err := d.Agent(ctx, "node-1"); err != nil {
			return runtime.Info{}, fmt.Errorf("resume %s: node agent of node-1: %w", id, err)
		}
	}
	return f.pauseFake.Resume(ctx, id)
}

func (f *agentFake) dialer() kubernetes.NodeAgentDialer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.agents
}

func (f *agentFake) setDialer(d kubernetes.NodeAgentDialer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.agents = d
}

// refusingAgent answers every Checkpoint with code and a text (and detail) of its own.
type refusingAgent struct {
	nodeagentv1connect.UnimplementedNodeAgentServiceHandler
	code connect.Code
}

func (a refusingAgent) Checkpoint(context.Context, *connect.Request[nodeagentv1.CheckpointRequest]) (*connect.Response[nodeagentv1.CheckpointResponse], error) {
	return nil, connect.NewError(a.code, errors.New("checkpoint quota of /var/lib/sandboxd/checkpoints exceeded (agent-secret-text)"))
}

// agentAt serves h as a node agent over TLS (HTTP/2) and returns a dialer of it as
// node-1's agent through the runner's adapter.
func agentAt(t *testing.T, h http.Handler) kubernetes.NodeAgentDialer {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	tc := srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	return nodeagentdial.BackendDialer(&nodeagent.StaticDialer{Addrs: map[string]string{"node-1": srv.Listener.Addr().String()}, TLS: tc},
		nodeagentdial.Options{RunnerID: "r1", Log: slog.New(slog.DiscardHandler)})
}

// TestPauseFailsAtNodeAgent: a pause (or resume) that fails at the node agent reaches the
// caller with the API's own error, never the agent's: an agent that cannot be reached
// (nothing listens at its address), one that answers UNAVAILABLE, and a node missing
// from the cluster within the grace are UNAVAILABLE CWSANDBOX_NODE_AGENT_UNAVAILABLE with
// RetryInfo; an agent's refusal of the checkpoint for its quota or free space
// (RESOURCE_EXHAUSTED) is RESOURCE_EXHAUSTED CWSANDBOX_CHECKPOINT_SPACE_EXHAUSTED, the
// reason of every backend's full checkpoint store, and its other refusals (here: it does
// not find the sandbox) FAILED_PRECONDITION CWSANDBOX_NODE_AGENT_REFUSED, neither with
// RetryInfo; none of the agent's text is in the message. The sandbox is left as it was (RUNNING after a failed pause, PAUSED after a
// failed resume).
func TestPauseFailsAtNodeAgent(t *testing.T) {
	closed, err := testenv.FreeAddr() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	quiet := nodeagentdial.Options{RunnerID: "r1", Log: slog.New(slog.DiscardHandler)}
	unreachable := nodeagentdial.BackendDialer(&nodeagent.StaticDialer{Addrs: map[string]string{"node-1": closed}, TLS: &tls.Config{MinVersion: tls.VersionTLS13}}, quiet)
	missing := nodeagentdial.BackendDialer(&nodeagentdial.NodeDialer{Client: fake.NewClientset(), Port: 7445, TLS: &tls.Config{MinVersion: tls.VersionTLS13}}, quiet)
	_, unavailableH := nodeagentv1connect.NewNodeAgentServiceHandler(refusingAgent{code: connect.CodeUnavailable})
	_, quotaH := nodeagentv1connect.NewNodeAgentServiceHandler(refusingAgent{code: connect.CodeResourceExhausted})
	_, refusedH := nodeagentv1connect.NewNodeAgentServiceHandler(refusingAgent{code: connect.CodeNotFound})

	be := &agentFake{pauseFake: newPauseFake(checkpointing)}
	l := pauseLocal(t, be, "")
	ctx := context.Background()
	sb := runningSandbox(t, l, nil, time.Hour)

	check := func(what string, err error, reason string) {
		t.Helper()
		ae := APIError(sb.ID, err, SpecField)
		var ce *connect.Error
		if !errors.As(ae, &ce) {
			t.Fatalf("%s: %v is no API error", what, ae)
		}
		ri := apierr.RetryInfo(ae)
		switch {
		case apierr.Reason(ae) != reason || ce.Code() != apierr.Code(reason):
			t.Errorf("%s: %v %s, want %v %s", what, ce.Code(), apierr.Reason(ae), apierr.Code(reason), reason)
		case reason == apierr.NodeAgentUnavailable && ri.GetRetryDelay().AsDuration() != 30*time.Second:
			t.Errorf("%s: RetryInfo %v, want 30s", what, ri)
		case reason != apierr.NodeAgentUnavailable && ri != nil:
			t.Errorf("%s: RetryInfo %v on a refusal", what, ri)
		case strings.Contains(ce.Message(), "agent-secret-text") || strings.Contains(ce.Message(), "/var/lib") || !strings.Contains(ce.Message(), "node-1"):
			t.Errorf("%s: message %q", what, ce.Message())
		case apierr.Info(ae).GetMetadata()["sandbox_id"] != sb.ID:
			t.Errorf("%s: metadata %v", what, apierr.Info(ae).GetMetadata())
		}
	}
	for _, tc := range []struct {
		name   string
		agents kubernetes.NodeAgentDialer
		reason string
	}{
		{"unreachable", unreachable, apierr.NodeAgentUnavailable},
		{"answers unavailable", agentAt(t, unavailableH), apierr.NodeAgentUnavailable},
		{"node missing", missing, apierr.NodeAgentUnavailable},
		{"over the agent's quota", agentAt(t, quotaH), apierr.CheckpointSpaceExhausted},
		{"refused", agentAt(t, refusedH), apierr.NodeAgentRefused},
	} {
		be.setDialer(tc.agents)
		_, err := l.Pause(ctx, sb.ID, PauseOptions{})
		check("pause, "+tc.name, err, tc.reason)
		if got, _ := l.Get(ctx, sb.ID); got.State != StateRunning {
			t.Errorf("pause, %s: the sandbox is %s, want RUNNING", tc.name, got.State)
		}
	}

	be.setDialer(nil)
	if _, err := l.Pause(ctx, sb.ID, PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	be.setDialer(missing)
	_, err = l.Resume(ctx, sb.ID)
	check("resume, node missing", err, apierr.NodeAgentUnavailable)
	if got, _ := l.Get(ctx, sb.ID); got.State != StatePaused {
		t.Errorf("resume, node missing: the sandbox is %s, want PAUSED", got.State)
	}
}
