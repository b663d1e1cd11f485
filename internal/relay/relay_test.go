package relay

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func fields(vs []apierr.Violation) string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Field)
	}
	return strings.Join(out, ",")
}

func TestExecViolations(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []string
		env  map[string]string
		want string
	}{
		{"plain", []string{"sh", "-c", "echo $A"}, map[string]string{"A": "b"}, ""},
		{"no command", nil, nil, "command"},
		{"NUL in argv", []string{"echo", "a\x00b"}, nil, "command[1]"},
		{"NUL in env value", []string{"true"}, map[string]string{"A": "\x00"}, "env[A]"},
		{"= in env name", []string{"true"}, map[string]string{"A=B": "c"}, "env"},
		{"empty env name", []string{"true"}, map[string]string{"": "c"}, "env"},
		{"too many args", make([]string, runtime.MaxArgs+1), nil, "command"},
	} {
		if got := fields(execViolations("command", "env", tc.argv, tc.env)); got != tc.want {
			t.Errorf("%s: violations %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestLineStamper(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)
	ts := t0.Format(time.RFC3339Nano) + " "
	var l lineStamper
	var got []string
	for _, chunk := range []string{"a\nb", "c\n", "", "\n", "d"} {
		got = append(got, string(l.stamp([]byte(chunk), t0)))
	}
	want := []string{ts + "a\n" + ts + "b", "c\n", "", ts + "\n", ts + "d"}
	if !slices.Equal(got, want) {
		t.Errorf("stamped %q, want %q", got, want)
	}
}

// fakeSource serves the log lines; read fails with err after them (if set).
type fakeSource struct {
	lines []string
	err   error
}

func (f *fakeSource) DataAgent(context.Context, sandboxv1.SandboxDataPermission, string, string) (agentv1connect.AgentServiceClient, error) {
	return nil, errors.New("no agent")
}

func (f *fakeSource) DataLogs(_ context.Context, _, _ string) (LogReader, error) {
	return func(_ context.Context, _ *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error {
		for i, l := range f.lines {
			if err := send(&agentv1.LogsResponse{Data: []byte(l), Time: timestamppb.New(time.Unix(0, 0)), NextOffset: uint64(i + 1)}); err != nil {
				return err
			}
		}
		return f.err
	}, nil
}

func streamLogs(t *testing.T, src DataSource, req *sandboxv1.StreamLogsRequest) ([]*sandboxv1.LogEntry, error) {
	t.Helper()
	path, h := sandboxv1connect.NewSandboxDataPlaneServiceHandler(Relay{Src: src})
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := sandboxv1connect.NewSandboxDataPlaneServiceClient(srv.Client(), srv.URL)
	st, err := c.StreamLogs(context.Background(), connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	defer func() { _ = st.Close() }()
	var out []*sandboxv1.LogEntry
	for st.Receive() {
		out = append(out, st.Msg())
	}
	return out, st.Err()
}

// TestStreamLogsErrors: a log that fails before anything was sent is the source's error
// (a stopped sandbox when it is a transport failure); one that fails later ends the
// stream with STREAM_INTERRUPTED.
func TestStreamLogsErrors(t *testing.T) {
	src := &fakeSource{err: errors.New("runner gone")}
	_, err := streamLogs(t, src, &sandboxv1.StreamLogsRequest{SandboxId: "sb"})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.SandboxNotRunning {
		t.Errorf("unsent failure: %v (reason %q)", err, apierr.Reason(err))
	}
	if !strings.Contains(err.Error(), "runner gone") {
		t.Errorf("unsent failure does not say the runner's error: %v", err)
	}
	// A runner's own error keeps its meaning (runner.APIError): an unknown sandbox.
	_, err = streamLogs(t, &fakeSource{err: runtime.ErrNotFound}, &sandboxv1.StreamLogsRequest{SandboxId: "sb"})
	if connect.CodeOf(err) != connect.CodeNotFound || apierr.Reason(err) != apierr.SandboxNotFound {
		t.Errorf("unsent not-found: %v (reason %q)", err, apierr.Reason(err))
	}

	src = &fakeSource{lines: []string{"a\nb"}, err: errors.New("runner gone")}
	got, err := streamLogs(t, src, &sandboxv1.StreamLogsRequest{SandboxId: "sb", Timestamps: true})
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Unix(0, 0).UTC().Format(time.RFC3339Nano) + " "
	if len(got) != 2 || string(got[0].GetData()) != ts+"a\n"+ts+"b" || got[0].GetLogSessionId() != "logs-sb" || got[0].GetNextLogOffset() != 1 ||
		got[1].GetError().GetCode() != "STREAM_INTERRUPTED" || got[1].GetError().GetMessage() != "runner gone" {
		t.Errorf("entries %v", got)
	}

	got, err = streamLogs(t, &fakeSource{}, &sandboxv1.StreamLogsRequest{SandboxId: "sb", Follow: true, ResumeLogSessionId: "logs-other"})
	if err != nil || len(got) != 1 || got[0].GetError().GetCode() != "SESSION_NOT_FOUND" {
		t.Errorf("resume of another session: %v, %v", got, err)
	}
}

// silentAgent ends every exec stream at once, without an exit status: an agent that went
// away under the command.
type silentAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
}

func (silentAgent) StreamExec(context.Context, *connect.BidiStream[agentv1.StreamExecRequest, agentv1.StreamExecResponse]) error {
	return nil
}

// agentSource hands out one agent for every data call.
type agentSource struct {
	fakeSource
	agent agentv1connect.AgentServiceClient
}

func (s *agentSource) DataAgent(context.Context, sandboxv1.SandboxDataPermission, string, string) (agentv1connect.AgentServiceClient, error) {
	return s.agent, nil
}

// h2Server serves h over HTTP/2 (bidirectional streams need it).
func h2Server(t *testing.T, route func() (string, http.Handler)) *httptest.Server {
	t.Helper()
	path, h := route()
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// TestStreamExecEndsWithoutExit: an agent stream that ends without an exit status is the
// table's code for SANDBOX_NOT_RUNNING (FAILED_PRECONDITION), not an internal error.
func TestStreamExecEndsWithoutExit(t *testing.T) {
	agentSrv := h2Server(t, func() (string, http.Handler) { return agentv1connect.NewAgentServiceHandler(silentAgent{}) })
	src := &agentSource{agent: agentv1connect.NewAgentServiceClient(agentSrv.Client(), agentSrv.URL)}
	relaySrv := h2Server(t, func() (string, http.Handler) {
		return sandboxv1connect.NewSandboxDataPlaneServiceHandler(Relay{Src: src})
	})
	c := sandboxv1connect.NewSandboxDataPlaneServiceClient(relaySrv.Client(), relaySrv.URL)

	st := c.StreamExec(context.Background())
	if err := st.Send(&sandboxv1.ExecStreamRequest{Message: &sandboxv1.ExecStreamRequest_Init{Init: &sandboxv1.ExecStreamInit{SandboxId: "sb", Command: []string{"true"}}}}); err != nil {
		t.Fatal(err)
	}
	var err error
	for err == nil {
		_, err = st.Receive()
	}
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.SandboxNotRunning {
		t.Errorf("stream ended without exit: %v (reason %q), want FAILED_PRECONDITION %s", err, apierr.Reason(err), apierr.SandboxNotRunning)
	}
}
