package metrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/testutil"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
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
}
