package security

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	nodeagentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/nodeagent/v1/nodeagentv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/nodeagent"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/nodeagentdial"
)

// leakyAgent is a node agent (a genuine agent certificate: a compromised or buggy node)
// whose every answer is an error of code carrying what must never reach an API caller:
// host paths and secret-looking text in its message, a DebugInfo and an ErrorInfo of our
// domain with its own reason in its details, and response metadata.
type leakyAgent struct {
	nodeagentv1connect.UnimplementedNodeAgentServiceHandler
	code connect.Code
}

const leakText = "open /var/lib/sandboxd/checkpoints/c-1/key: AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG sk_live_leak"

func (a leakyAgent) fail() error {
	ce := connect.NewError(a.code, errors.New(leakText))
	if d, err := connect.NewErrorDetail(&errdetails.DebugInfo{Detail: leakText, StackEntries: []string{"/root/.ssh/id_rsa"}}); err == nil {
		ce.AddDetail(d)
	}
	// An ErrorInfo in our domain: were it passed on, the caller would take the agent's
	// reason for the API's.
	if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Domain: apierr.Domain, Reason: apierr.SandboxNotFound, Metadata: map[string]string{"leak": leakText}}); err == nil {
		ce.AddDetail(d)
	}
	ce.Meta().Set("X-Leak", leakText)
	return ce
}

func (a leakyAgent) Checkpoint(context.Context, *connect.Request[nodeagentv1.CheckpointRequest]) (*connect.Response[nodeagentv1.CheckpointResponse], error) {
	return nil, a.fail()
}

func (a leakyAgent) DeleteCheckpoint(context.Context, *connect.Request[nodeagentv1.DeleteCheckpointRequest]) (*connect.Response[nodeagentv1.DeleteCheckpointResponse], error) {
	return nil, a.fail()
}

// TestSecurityNodeAgentErrorsHidden: runner-a's real dialer (DialConfig with its
// --node-agent-tls-dir) reaching an agent that answers errors full of secret-looking text,
// details and metadata: the backend's error is no *connect.Error (the agent's code and
// details are not the API's), and what the API caller gets for it (runner.APIError, as the
// gateway relays it) is the fixed sentence under CWSANDBOX_NODE_AGENT_UNAVAILABLE or
// _REFUSED (a checkpoint refused RESOURCE_EXHAUSTED: CWSANDBOX_CHECKPOINT_SPACE_EXHAUSTED)
// with only its own ErrorInfo (and RetryInfo): none of the agent's text, its
// details, its reason (SANDBOX_NOT_FOUND) or its metadata.
func TestSecurityNodeAgentErrorsHidden(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "node-agent CA of runner-a")
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.IssueServer("node-agent", []string{nodeagent.ServerName}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.IssueClient("runner-a", []*url.URL{pki.NodeAgentClientURI("runner-a")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := nodeagent.WriteTLSDir(dir, client, ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		code     connect.Code
		reason   string
		ckReason string // the checkpoint's, when not reason
	}{
		{connect.CodeUnavailable, apierr.NodeAgentUnavailable, ""},
		{connect.CodeNotFound, apierr.NodeAgentRefused, ""},
		{connect.CodeAlreadyExists, apierr.NodeAgentRefused, ""},
		{connect.CodeInternal, apierr.NodeAgentRefused, ""},
		{connect.CodeResourceExhausted, apierr.NodeAgentRefused, apierr.CheckpointSpaceExhausted},
	} {
		_, h := nodeagentv1connect.NewNodeAgentServiceHandler(leakyAgent{code: tc.code})
		addr := serveAgentHandler(t, server, h)
		d, err := nodeagentdial.DialConfig{Addrs: map[string]string{"node-1": addr}, TLSDir: dir, RunnerID: "runner-a"}.Dialer(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		ag, err := d.Agent(ctx, "node-1")
		if err != nil {
			t.Fatal(err)
		}
		_, cerr := ag.Checkpoint(ctx, kubernetes.NodeCheckpointRequest{Namespace: "sbx", Name: "sbx-mine", UID: "00000000-0000-4000-8000-000000000001", SandboxID: "mine"})
		derr := ag.DeleteCheckpoint(ctx, "c-00000000-00000000000000000000")
		for op, err := range map[string]error{"checkpoint": cerr, "delete": derr} {
			what := tc.code.String() + " " + op
			reason := tc.reason
			if op == "checkpoint" && tc.ckReason != "" {
				reason = tc.ckReason
			}
			var ce *connect.Error
			if err == nil {
				t.Errorf("%s: no error", what)
				continue
			}
			if errors.As(err, &ce) {
				t.Errorf("%s: backend error %T %v, want one that is no *connect.Error", what, err, err)
			}
			// What the API caller gets (the runner's wrapping as the backend and runner add it).
			ae := runner.APIError("mine", err, runner.SpecField)
			if !errors.As(ae, &ce) {
				t.Fatalf("%s: %v is no API error", what, ae)
			}
			if apierr.Reason(ae) != reason || ce.Code() != apierr.Code(reason) {
				t.Errorf("%s: %v %s, want %s", what, ce.Code(), apierr.Reason(ae), reason)
			}
			if msg := ce.Message(); msg != err.Error() || !strings.Contains(msg, "node agent of node node-1") {
				t.Errorf("%s: message %q, want the fixed sentence %q", what, msg, err.Error())
			}
			seen := []string{ce.Message()}
			for _, d := range ce.Details() {
				v, derr := d.Value()
				if derr != nil {
					t.Errorf("%s: undecodable detail %s", what, d.Type())
					continue
				}
				switch v := v.(type) {
				case *errdetails.ErrorInfo:
					if v.GetReason() != reason || len(v.GetMetadata()) != 1 || v.GetMetadata()["sandbox_id"] != "mine" {
						t.Errorf("%s: ErrorInfo %v, want only the API's", what, v)
					}
					for k, val := range v.GetMetadata() {
						seen = append(seen, k, val)
					}
				case *errdetails.RetryInfo:
					if reason != apierr.NodeAgentUnavailable {
						t.Errorf("%s: RetryInfo on a refusal", what)
					}
				default:
					t.Errorf("%s: the agent's detail %T reached the caller: %v", what, v, v)
				}
			}
			for k, vs := range ce.Meta() {
				seen = append(seen, k+"="+strings.Join(vs, ","))
			}
			for _, s := range seen {
				for _, leak := range []string{"wJalrXUtnFEMI", "sk_live_leak", "/var/lib/sandboxd", "id_rsa", "X-Leak", "leak"} {
					if strings.Contains(s, leak) {
						t.Errorf("%s: %q reached the caller in %q", what, leak, s)
					}
				}
			}
		}
	}
}
