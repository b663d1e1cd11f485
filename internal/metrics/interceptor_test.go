package metrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/metrics/counters"
)

type stubService struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler
}

func (stubService) CreateSandbox(context.Context, *connect.Request[sandboxv1.CreateSandboxRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	return nil, apierr.New(apierr.InvalidRequest, "no spec", nil)
}

func (stubService) DeleteSandbox(context.Context, *connect.Request[sandboxv1.DeleteSandboxRequest]) (*connect.Response[sandboxv1.DeleteSandboxResponse], error) {
	return connect.NewResponse(&sandboxv1.DeleteSandboxResponse{}), nil
}

func (stubService) Exec(context.Context, *connect.Request[sandboxv1.ExecRequest]) (*connect.Response[sandboxv1.ExecResponse], error) {
	return connect.NewResponse(&sandboxv1.ExecResponse{}), nil
}

// TestInterceptor: calls through a real Connect handler are counted by procedure with the
// error's CWSANDBOX_* reason; other procedures are not.
func TestInterceptor(t *testing.T) {
	m := New()
	m.Created("x", time.Now())
	path, h := sandboxv1connect.NewSandboxServiceHandler(stubService{}, connect.WithInterceptors(m.Interceptor(PathGateway)))
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := sandboxv1connect.NewSandboxServiceClient(srv.Client(), srv.URL)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{})); apierr.Reason(err) != apierr.InvalidRequest {
		t.Fatalf("create: %v", err)
	}
	if _, err := c.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: "x"})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: "x"})); err != nil {
		t.Fatal(err)
	}
	_, _ = c.GetSandbox(ctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: "x"})) // unimplemented, not recorded
	want := `
# HELP cwsandbox_sandbox_creates_total CreateSandbox calls by result (ok or the gRPC code) and CWSANDBOX_* reason.
# TYPE cwsandbox_sandbox_creates_total counter
cwsandbox_sandbox_creates_total{reason="CWSANDBOX_INVALID_REQUEST",result="invalid_argument"} 1
# HELP cwsandbox_sandbox_deletes_total DeleteSandbox calls by result (ok or the gRPC code) and CWSANDBOX_* reason.
# TYPE cwsandbox_sandbox_deletes_total counter
cwsandbox_sandbox_deletes_total{reason="",result="ok"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "cwsandbox_sandbox_creates_total", "cwsandbox_sandbox_deletes_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m.Registry(), "cwsandbox_exec_duration_seconds"); n != 1 {
		t.Errorf("exec_duration series: %d, want 1", n)
	}
	if scrape := gather(t, m); !strings.Contains(scrape, "cwsandbox_sandbox_create_to_first_exec_seconds_count 1\n") {
		t.Errorf("the exec of a sandbox created here is not its first exec:\n%s", grepLines(scrape, "first_exec"))
	}
}

type stubDataPlane struct {
	sandboxv1connect.UnimplementedSandboxDataPlaneServiceHandler
	open, release chan struct{}
}

func (stubDataPlane) Exec(context.Context, *connect.Request[sandboxv1.ExecRequest]) (*connect.Response[sandboxv1.ExecResponse], error) {
	return connect.NewResponse(&sandboxv1.ExecResponse{}), nil
}

func (stubDataPlane) ReadFile(context.Context, *connect.Request[sandboxv1.ReadFileRequest]) (*connect.Response[sandboxv1.ReadFileResponse], error) {
	return connect.NewResponse(&sandboxv1.ReadFileResponse{Content: []byte("hello")}), nil
}

func (stubDataPlane) WriteFile(_ context.Context, req *connect.Request[sandboxv1.WriteFileRequest]) (*connect.Response[sandboxv1.WriteFileResponse], error) {
	if req.Msg.GetPath() == "/denied" {
		return nil, apierr.New(apierr.InvalidRequest, "no", nil)
	}
	return connect.NewResponse(&sandboxv1.WriteFileResponse{}), nil
}

func (s stubDataPlane) StreamLogs(context.Context, *connect.Request[sandboxv1.StreamLogsRequest], *connect.ServerStream[sandboxv1.LogEntry]) error {
	s.open <- struct{}{}
	<-s.release
	return nil
}

// TestInterceptorDirect: on the direct data plane (path direct), exec, file reads and
// writes (latency by result, content bytes of successes) and open streams are recorded.
func TestInterceptorDirect(t *testing.T) {
	m := New()
	stub := stubDataPlane{open: make(chan struct{}), release: make(chan struct{})}
	path, h := sandboxv1connect.NewSandboxDataPlaneServiceHandler(stub, connect.WithInterceptors(m.Interceptor(PathDirect)))
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := sandboxv1connect.NewSandboxDataPlaneServiceClient(srv.Client(), srv.URL)
	ctx := context.Background()
	if _, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: "x"})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: "x", Path: "/a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: "x", Path: "/b", Content: []byte("0123456789")})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: "x", Path: "/denied", Content: []byte("0123456789")})); err == nil {
		t.Fatal("denied write succeeded")
	}
	done := make(chan error, 1)
	go func() {
		s, err := c.StreamLogs(ctx, connect.NewRequest(&sandboxv1.StreamLogsRequest{SandboxId: "x"}))
		if err == nil {
			for s.Receive() {
			}
			err = s.Err()
		}
		done <- err
	}()
	<-stub.open
	scrape := gather(t, m)
	for _, want := range []string{
		`cwsandbox_exec_duration_seconds_count{path="direct",result="ok"} 1`,
		`cwsandbox_file_operation_duration_seconds_count{op="read",path="direct",result="ok"} 1`,
		`cwsandbox_file_operation_duration_seconds_count{op="write",path="direct",result="ok"} 1`,
		`cwsandbox_file_operation_duration_seconds_count{op="write",path="direct",result="invalid_argument"} 1`,
		`cwsandbox_file_bytes_total{op="read",path="direct"} 5`,
		`cwsandbox_file_bytes_total{op="write",path="direct"} 10`,
		`cwsandbox_streams{kind="logs",path="direct"} 1`,
		`cwsandbox_streams{kind="exec",path="direct"} 0`,
	} {
		if !strings.Contains(scrape, want+"\n") {
			t.Errorf("missing %s in:\n%s", want, grepLines(scrape, "cwsandbox_"))
		}
	}
	close(stub.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if scrape := gather(t, m); !strings.Contains(scrape, `cwsandbox_streams{kind="logs",path="direct"} 0`+"\n") {
		t.Errorf("stream still counted after it ended:\n%s", grepLines(scrape, "cwsandbox_streams"))
	}
	lint(t, m)
}

// TestRecordingOff: with recording switched off (counters.SetRecording, what the
// overhead benchmark's off mode uses) calls through the interceptor, the Observe* hooks
// and the counters package record nothing; switched on again, they record as before.
func TestRecordingOff(t *testing.T) {
	m := New()
	path, h := sandboxv1connect.NewSandboxServiceHandler(stubService{}, connect.WithInterceptors(m.Interceptor(PathGateway)))
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := sandboxv1connect.NewSandboxServiceClient(srv.Client(), srv.URL)
	ctx := context.Background()
	calls := func() {
		t.Helper()
		m.Created("x", time.Now())
		if _, err := c.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: "x"})); err != nil {
			t.Fatal(err)
		}
		if _, err := c.DeleteSandbox(ctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: "x"})); err != nil {
			t.Fatal(err)
		}
		m.ObserveFile(OpRead, PathGateway, time.Millisecond, 3, nil)
		counters.StoreOp(counters.StoreExec, time.Millisecond)
	}
	const store = `cwsandbox_store_operation_duration_seconds_count{op="exec"}`
	before := counters.Values()[store]
	counters.SetRecording(false)
	t.Cleanup(func() { counters.SetRecording(true) })
	calls()
	scrape := gather(t, m)
	for _, absent := range []string{"cwsandbox_exec_duration_seconds_count", "cwsandbox_sandbox_deletes_total{", "cwsandbox_file_bytes_total{", "cwsandbox_sandbox_create_to_first_exec_seconds_count 1"} {
		if strings.Contains(scrape, absent) {
			t.Errorf("recorded while off: %s in:\n%s", absent, grepLines(scrape, "cwsandbox_"))
		}
	}
	if got := counters.Values()[store]; got != before {
		t.Errorf("store op recorded while off: %v, was %v", got, before)
	}
	counters.SetRecording(true)
	calls()
	scrape = gather(t, m)
	for _, want := range []string{
		`cwsandbox_exec_duration_seconds_count{path="gateway",result="ok"} 1`,
		`cwsandbox_sandbox_deletes_total{reason="",result="ok"} 1`,
		`cwsandbox_file_bytes_total{op="read",path="gateway"} 3`,
		`cwsandbox_sandbox_create_to_first_exec_seconds_count 1`,
	} {
		if !strings.Contains(scrape, want+"\n") {
			t.Errorf("missing %s once recording is on again:\n%s", want, grepLines(scrape, "cwsandbox_"))
		}
	}
	if got := counters.Values()[store]; got != before+1 {
		t.Errorf("store ops: %v, want %v", got, before+1)
	}
}

// BenchmarkObserveExec: what an exec's metrics cost the gateway (ObserveExec and
// Executed with no create clock running), against the label lookup per call that
// ObserveExec made before its result="ok" child was bound once.
func BenchmarkObserveExec(b *testing.B) {
	m := New()
	b.Run("label-lookup", func(b *testing.B) {
		for range b.N {
			m.execDuration.WithLabelValues(PathGateway, ResultOK).Observe(0.002)
		}
	})
	b.Run("ObserveExec+Executed", func(b *testing.B) {
		for range b.N {
			m.ObserveExec(PathGateway, 2*time.Millisecond, nil)
			m.Executed("sandbox-1", nil)
		}
	})
}
