package nodeagentdial_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	nodeagentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1/nodeagentv1connect"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/nodeagentdial"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testenv/logbuf"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// secretText is what a failing agent (or one compromised) puts in its answers: none of
// it may reach the backend's error text.
const secretText = "/var/lib/sandboxd/ckpt/sk_live_SECRET123 token=hunter2"

// failingAgent answers Checkpoint and DeleteCheckpoint with err (a fresh copy each call,
// with secretText in a detail and in its metadata), running in the SandboxRunningMeta.
type failingAgent struct {
	nodeagentv1connect.UnimplementedNodeAgentServiceHandler
	code    connect.Code
	running string
}

func (f failingAgent) fail() error {
	ce := connect.NewError(f.code, errors.New("agent says: "+secretText))
	if d, err := connect.NewErrorDetail(&errdetails.DebugInfo{Detail: secretText}); err == nil {
		ce.AddDetail(d)
	}
	ce.Meta().Set("x-secret", secretText)
	if f.running != "" {
		ce.Meta().Set(nodeagent.SandboxRunningMeta, f.running)
	}
	return ce
}

func (f failingAgent) Checkpoint(context.Context, *connect.Request[nodeagentv1.CheckpointRequest]) (*connect.Response[nodeagentv1.CheckpointResponse], error) {
	return nil, f.fail()
}

func (f failingAgent) DeleteCheckpoint(context.Context, *connect.Request[nodeagentv1.DeleteCheckpointRequest]) (*connect.Response[nodeagentv1.DeleteCheckpointResponse], error) {
	return nil, f.fail()
}

// checkAgentError fails unless err is an *AgentError of sentinel with exactly the text
// want, no *connect.Error in its chain and nothing of secretText in it. It is
// runtime.ErrCheckpointSpaceExhausted exactly when space says so.
func checkAgentError(t *testing.T, what string, err, sentinel error, want string, space bool) {
	t.Helper()
	var ae *nodeagentdial.AgentError
	var ce *connect.Error
	other := runtime.ErrNodeAgentRefused
	if errors.Is(sentinel, runtime.ErrNodeAgentRefused) {
		other = runtime.ErrNodeAgentUnavailable
	}
	switch {
	case err == nil:
		t.Errorf("%s: no error", what)
	case !errors.As(err, &ae):
		t.Errorf("%s: %T %v, want an *AgentError", what, err, err)
	case !errors.Is(err, sentinel) || errors.Is(err, other):
		t.Errorf("%s: %v, want %v (only)", what, err, sentinel)
	case errors.Is(err, runtime.ErrCheckpointSpaceExhausted) != space:
		t.Errorf("%s: %v is ErrCheckpointSpaceExhausted: %v, want %v", what, err, !space, space)
	case errors.As(err, &ce):
		t.Errorf("%s: a *connect.Error (%v) in the chain of %v", what, ce.Code(), err)
	case err.Error() != want:
		t.Errorf("%s: %q, want %q", what, err.Error(), want)
	case strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "hunter2"):
		t.Errorf("%s: the agent's text in %q", what, err)
	}
}

// TestAgentErrors: each kind of failure at a node agent reaches the backend as an
// *AgentError with its fixed sentence (operation and node), wrapping the right sentinel:
// the agent's answers of UNAVAILABLE and DEADLINE_EXCEEDED are ErrNodeAgentUnavailable,
// its other answers (quota, not found, invalid, a failed checkpoint, internal)
// ErrNodeAgentRefused, and its checkpoint refused RESOURCE_EXHAUSTED (its quota or free
// space) is ErrCheckpointSpaceExhausted too (a deletion's is not: no space is wanted);
// no *connect.Error is in the chain, nothing of the agent's text, details or metadata is
// in the message, and the runner's log has the agent's text.
func TestAgentErrors(t *testing.T) {
	for _, tc := range []struct {
		code     connect.Code
		running  string
		sentinel error
		want     string
	}{
		{connect.CodeUnavailable, "", runtime.ErrNodeAgentUnavailable, "the node agent of node node-1 could not be reached for the %s: retry later"},
		{connect.CodeDeadlineExceeded, "", runtime.ErrNodeAgentUnavailable, "the node agent of node node-1 could not be reached for the %s: retry later"},
		{connect.CodeResourceExhausted, "", runtime.ErrNodeAgentRefused, "the node agent of node node-1 refused the %s: the node's checkpoint space is used up (the agent's reason is in the runner's log)"},
		{connect.CodeNotFound, "", runtime.ErrNodeAgentRefused, "the node agent of node node-1 refused the %s: it does not find the sandbox or the checkpoint on its node (the agent's reason is in the runner's log)"},
		{connect.CodeInvalidArgument, "", runtime.ErrNodeAgentRefused, "the node agent of node node-1 refused the %s: the request is invalid (the agent's reason is in the runner's log)"},
		{connect.CodePermissionDenied, "", runtime.ErrNodeAgentRefused, "the node agent of node node-1 refused the %s: it does not take this runner's calls for the sandbox (the agent's reason is in the runner's log)"},
		{connect.CodeFailedPrecondition, "unknown", runtime.ErrNodeAgentRefused, "the node agent of node node-1 refused the %s: the sandbox cannot be checkpointed on its node now (the agent's reason is in the runner's log)"},
		{connect.CodeInternal, "", runtime.ErrNodeAgentRefused, "the node agent of node node-1 refused the %s: it failed on the node (the agent's reason is in the runner's log)"},
		{connect.CodeAlreadyExists, "", runtime.ErrNodeAgentRefused, "the node agent of node node-1 refused the %s: it failed on the node (the agent's reason is in the runner's log)"},
	} {
		_, h := nodeagentv1connect.NewNodeAgentServiceHandler(failingAgent{code: tc.code, running: tc.running})
		addr, tlsCfg := serveHandler(t, h)
		var log logbuf.Buffer
		d := nodeagentdial.BackendDialer(&nodeagent.StaticDialer{Addrs: map[string]string{"node-1": addr}, TLS: tlsCfg},
			nodeagentdial.Options{RunnerID: joinRunner, Log: slog.New(slog.NewTextHandler(&log, nil))})
		a, err := d.Agent(t.Context(), "node-1")
		if err != nil {
			t.Fatal(err)
		}
		_, err = a.Checkpoint(t.Context(), joinReq(false))
		want := strings.Replace(tc.want, "%s", "checkpoint", 1)
		if tc.running == "unknown" {
			want += " (the agent could not tell whether the sandbox still runs)"
		}
		checkAgentError(t, tc.code.String()+" checkpoint", err, tc.sentinel, want, tc.code == connect.CodeResourceExhausted)
		if connect.CodeOf(nodeagentdial.Cause(err)) != tc.code {
			t.Errorf("%s: cause %v", tc.code, nodeagentdial.Cause(err))
		}
		err = a.DeleteCheckpoint(t.Context(), "c-00000000-00000000000000000000")
		checkAgentError(t, tc.code.String()+" delete", err, tc.sentinel, strings.Replace(tc.want, "%s", "checkpoint deletion", 1), false)
		if got := log.String(); strings.Count(got, "sk_live_SECRET123") < 2 || !strings.Contains(got, "node=node-1") {
			t.Errorf("%s: the runner's log lacks the agent's errors: %s", tc.code, got)
		}
	}
}

// TestAgentErrorsUnreachable: an agent that cannot be reached (nothing listens at its
// address), a node the static map does not name and one the API server misses (within
// the grace) are ErrNodeAgentUnavailable with their fixed sentences; a node gone is
// errdefs.ErrNotFound beside it (the backend's checkpoint lost), never a refusal.
func TestAgentErrorsUnreachable(t *testing.T) {
	closed, err := testenv.FreeAddr() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	_, tlsCfg := serveHandler(t, http.NotFoundHandler())
	d := nodeagentdial.BackendDialer(&nodeagent.StaticDialer{Addrs: map[string]string{"node-1": closed}, TLS: tlsCfg},
		nodeagentdial.Options{RunnerID: joinRunner, Log: slog.New(slog.DiscardHandler)})
	a, err := d.Agent(t.Context(), "node-1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Checkpoint(t.Context(), joinReq(false))
	checkAgentError(t, "closed port", err, runtime.ErrNodeAgentUnavailable, "the node agent of node node-1 could not be reached for the checkpoint: retry later", false)
	var ne *net.OpError
	if !errors.As(nodeagentdial.Cause(err), &ne) {
		t.Errorf("closed port: cause %v, want the dial's *net.OpError", nodeagentdial.Cause(err))
	}

	_, err = d.Agent(t.Context(), "node-2")
	checkAgentError(t, "unknown node", err, runtime.ErrNodeAgentUnavailable,
		"no node agent is known on node node-2 (the node has no usable address, or the runner's --node-agent-addrs does not name it)", false)
	if !errors.Is(err, nodeagent.ErrNoAgent) || errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown node: %v, want ErrNoAgent, not errdefs.ErrNotFound", err)
	}

	md := nodeagentdial.BackendDialer(missingDialer{}, nodeagentdial.Options{RunnerID: joinRunner, Log: slog.New(slog.DiscardHandler)})
	_, err = md.Agent(t.Context(), "node-3")
	checkAgentError(t, "missing node", err, runtime.ErrNodeAgentUnavailable, "node node-3 is missing from the cluster (not yet taken as gone): retry later", false)
	if !errors.Is(err, nodeagentdial.ErrNodeMissing) || errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing node: %v, want ErrNodeMissing, not errdefs.ErrNotFound", err)
	}
}

// missingDialer misses every node (NodeDialer's answer within the grace).
type missingDialer struct{}

func (missingDialer) Agent(_ context.Context, node string) (*nodeagent.Client, error) {
	return nil, errors.Join(nodeagentdial.ErrNodeMissing, errors.New("node "+node+": "+secretText))
}

// hugeAgent answers Checkpoint INTERNAL with msg.
type hugeAgent struct {
	nodeagentv1connect.UnimplementedNodeAgentServiceHandler
	msg string
}

func (h hugeAgent) Checkpoint(context.Context, *connect.Request[nodeagentv1.CheckpointRequest]) (*connect.Response[nodeagentv1.CheckpointResponse], error) {
	return nil, connect.NewError(connect.CodeInternal, errors.New(h.msg))
}

// TestAgentErrorLoggedClipped: an agent's error text of a megabyte (as much as it likes:
// a gRPC trailer carries it) reaches the runner whole (Cause), but the runner's log has
// only its first MaxLoggedCause bytes, valid UTF-8 and marked as cut.
func TestAgentErrorLoggedClipped(t *testing.T) {
	const tail = "END-OF-THE-AGENT-TEXT"
	msg := "agent says: " + strings.Repeat("é", 512<<10) + tail
	_, h := nodeagentv1connect.NewNodeAgentServiceHandler(hugeAgent{msg: msg})
	addr, tlsCfg := serveHandler(t, h)
	var log logbuf.Buffer
	d := nodeagentdial.BackendDialer(&nodeagent.StaticDialer{Addrs: map[string]string{"node-1": addr}, TLS: tlsCfg},
		nodeagentdial.Options{RunnerID: joinRunner, Log: slog.New(slog.NewJSONHandler(&log, nil))})
	a, err := d.Agent(t.Context(), "node-1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Checkpoint(t.Context(), joinReq(false))
	checkAgentError(t, "huge message", err, runtime.ErrNodeAgentRefused,
		"the node agent of node node-1 refused the checkpoint: it failed on the node (the agent's reason is in the runner's log)", false)
	if c := nodeagentdial.Cause(err); c == nil || !strings.HasSuffix(c.Error(), tail) {
		t.Fatalf("the agent's whole text did not reach the runner (so its log could not hold it): %.200v", c)
	}
	var logged []string
	sc := bufio.NewScanner(strings.NewReader(log.String()))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var rec struct{ Msg, Err string }
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("log line %.200q: %v", sc.Text(), err)
		}
		if rec.Msg == "node agent call failed" {
			logged = append(logged, rec.Err)
		}
	}
	if len(logged) != 1 {
		t.Fatalf("%d log lines of the failed call, want 1: %.500s", len(logged), log.String())
	}
	got := logged[0]
	if len(got) > nodeagentdial.MaxLoggedCause || !strings.HasSuffix(got, textclip.Marker) || strings.Contains(got, tail) ||
		!strings.Contains(got, "agent says: éé") || !textclip.AllPrintable(got) {
		t.Errorf("logged err is %d bytes (at most %d), ends %q, printable %v; want the agent's text clipped and marked",
			len(got), nodeagentdial.MaxLoggedCause, got[max(len(got)-40, 0):], textclip.AllPrintable(got))
	}
	if n := len(log.String()); n > 2*nodeagentdial.MaxLoggedCause {
		t.Errorf("the runner's log holds %d bytes for one failed call", n)
	}
}
