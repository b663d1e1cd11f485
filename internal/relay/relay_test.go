package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
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

// fileAgent keeps one file in memory. Its streamed calls answer UNIMPLEMENTED when old
// is set (an agent older than them); lie makes ReadFileStream send chunks forever, after
// a size hint of 1 TiB (sandbox code posing as the agent).
type fileAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	old, lie bool

	mu        sync.Mutex
	content   []byte
	unary     int // unary calls served
	maxChunk  int // the largest streamed chunk received
	streamedN int // streamed calls served
}

func (a *fileAgent) WriteFile(_ context.Context, req *connect.Request[agentv1.WriteFileRequest]) (*connect.Response[agentv1.WriteFileResponse], error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.unary++
	a.content = req.Msg.GetContent()
	return connect.NewResponse(&agentv1.WriteFileResponse{}), nil
}

func (a *fileAgent) ReadFile(context.Context, *connect.Request[agentv1.ReadFileRequest]) (*connect.Response[agentv1.ReadFileResponse], error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.unary++
	return connect.NewResponse(&agentv1.ReadFileResponse{Content: a.content}), nil
}

func (a *fileAgent) WriteFileStream(ctx context.Context, st *connect.ClientStream[agentv1.WriteFileChunk]) (*connect.Response[agentv1.WriteFileResponse], error) {
	if a.old {
		return a.UnimplementedAgentServiceHandler.WriteFileStream(ctx, st)
	}
	var b []byte
	var size int64
	for first := true; st.Receive(); first = false {
		if first {
			size = st.Msg().GetSize()
		}
		a.mu.Lock()
		a.maxChunk = max(a.maxChunk, len(st.Msg().GetContent()))
		a.mu.Unlock()
		b = append(b, st.Msg().GetContent()...)
	}
	if err := st.Err(); err != nil {
		return nil, err
	}
	if int64(len(b)) != size {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("got %d bytes of %d", len(b), size))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.streamedN++
	a.content = b
	return connect.NewResponse(&agentv1.WriteFileResponse{}), nil
}

func (a *fileAgent) ReadFileStream(ctx context.Context, req *connect.Request[agentv1.ReadFileRequest], st *connect.ServerStream[agentv1.ReadFileChunk]) error {
	if a.old {
		return a.UnimplementedAgentServiceHandler.ReadFileStream(ctx, req, st)
	}
	a.mu.Lock()
	a.streamedN++
	content := a.content
	a.mu.Unlock()
	if a.lie {
		chunk := make([]byte, 1<<20)
		for i := 0; ; i++ {
			m := &agentv1.ReadFileChunk{Content: chunk}
			if i == 0 {
				m.Size = 1 << 40
			}
			if err := st.Send(m); err != nil {
				return nil
			}
		}
	}
	if err := st.Send(&agentv1.ReadFileChunk{Size: int64(len(content)), Content: content[:min(len(content), 1000)]}); err != nil {
		return err
	}
	for b := content[min(len(content), 1000):]; len(b) > 0; b = b[min(len(b), 1<<20):] {
		if err := st.Send(&agentv1.ReadFileChunk{Content: b[:min(len(b), 1<<20)]}); err != nil {
			return err
		}
	}
	return nil
}

func fileRelay(t *testing.T, a *fileAgent) sandboxv1connect.SandboxDataPlaneServiceClient {
	t.Helper()
	agentSrv := h2Server(t, func() (string, http.Handler) { return agentv1connect.NewAgentServiceHandler(a) })
	src := &agentSource{agent: agentv1connect.NewAgentServiceClient(agentSrv.Client(), agentSrv.URL, connect.WithGRPC(),
		connect.WithReadMaxBytes(MaxMessageBytes), connect.WithSendMaxBytes(MaxMessageBytes))}
	relaySrv := h2Server(t, func() (string, http.Handler) {
		return sandboxv1connect.NewSandboxDataPlaneServiceHandler(Relay{Src: src}, connect.WithReadMaxBytes(MaxMessageBytes), connect.WithSendMaxBytes(MaxMessageBytes))
	})
	return sandboxv1connect.NewSandboxDataPlaneServiceClient(relaySrv.Client(), relaySrv.URL, connect.WithGRPC(),
		connect.WithReadMaxBytes(MaxMessageBytes), connect.WithSendMaxBytes(MaxMessageBytes))
}

// TestFilesStreamedToTheAgent: WriteFile and ReadFile reach the agent by its streamed
// calls, in chunks of at most 1 MiB, and the bytes come back as they were sent; an empty
// file too. An agent without them (older) is served by the unary calls.
func TestFilesStreamedToTheAgent(t *testing.T) {
	ctx := context.Background()
	data := make([]byte, 5<<20+7)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, old := range []bool{false, true} {
		a := &fileAgent{old: old}
		c := fileRelay(t, a)
		for _, content := range [][]byte{data, {}} {
			if _, err := c.WriteFile(ctx, connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: "sb", Path: "/f", Content: content})); err != nil {
				t.Fatalf("old %v: write: %v", old, err)
			}
			res, err := c.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: "sb", Path: "/f"}))
			if err != nil {
				t.Fatalf("old %v: read: %v", old, err)
			}
			if !bytes.Equal(res.Msg.GetContent(), content) {
				t.Fatalf("old %v: read back %d bytes, want %d", old, len(res.Msg.GetContent()), len(content))
			}
		}
		a.mu.Lock()
		if old && (a.unary != 4 || a.streamedN != 0) || !old && (a.unary != 0 || a.streamedN != 4) {
			t.Errorf("old %v: %d unary calls and %d streamed ones", old, a.unary, a.streamedN)
		}
		if a.maxChunk > fileChunkBytes {
			t.Errorf("a chunk of %d bytes", a.maxChunk)
		}
		a.mu.Unlock()
	}
}

// TestReadFileStreamBounded: an agent (sandbox code) that streams more than a unary read
// may return, after a size hint of 1 TiB, is refused with FILE_TOO_LARGE once the bound
// is passed; the hint is not trusted for the buffer.
func TestReadFileStreamBounded(t *testing.T) {
	c := fileRelay(t, &fileAgent{lie: true})
	_, err := c.ReadFile(context.Background(), connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: "sb", Path: "/f"}))
	if apierr.Reason(err) != apierr.FileTooLarge {
		t.Fatalf("err = %v, want %s", err, apierr.FileTooLarge)
	}
}
