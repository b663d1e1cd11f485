package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runnerapi"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// headerAgent is an agent that records, per call, the container header it was sent.
type headerAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	mu  sync.Mutex
	got []string // "Method=container"
}

func (a *headerAgent) record(method string, h http.Header) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, method+"="+h.Get(runnerapi.ContainerHeader))
}

func (a *headerAgent) calls() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.got
	a.got = nil
	return out
}

func (a *headerAgent) Exec(_ context.Context, req *connect.Request[agentv1.ExecRequest]) (*connect.Response[agentv1.ExecResponse], error) {
	a.record("Exec", req.Header())
	return connect.NewResponse(&agentv1.ExecResponse{}), nil
}

func (a *headerAgent) ReadFile(_ context.Context, req *connect.Request[agentv1.ReadFileRequest]) (*connect.Response[agentv1.ReadFileResponse], error) {
	a.record("ReadFile", req.Header())
	return connect.NewResponse(&agentv1.ReadFileResponse{}), nil
}

func (a *headerAgent) WriteFile(_ context.Context, req *connect.Request[agentv1.WriteFileRequest]) (*connect.Response[agentv1.WriteFileResponse], error) {
	a.record("WriteFile", req.Header())
	return connect.NewResponse(&agentv1.WriteFileResponse{}), nil
}

func (a *headerAgent) Logs(_ context.Context, req *connect.Request[agentv1.LogsRequest], _ *connect.ServerStream[agentv1.LogsResponse]) error {
	a.record("Logs", req.Header())
	return nil
}

func (a *headerAgent) StreamExec(_ context.Context, s *connect.BidiStream[agentv1.StreamExecRequest, agentv1.StreamExecResponse]) error {
	a.record("StreamExec", s.RequestHeader())
	if _, err := s.Receive(); err != nil {
		return err
	}
	return s.Send(&agentv1.StreamExecResponse{Message: &agentv1.StreamExecResponse_Exit{Exit: &agentv1.Exit{}}})
}

// agentRunner is an acceptingRunner whose sandboxes' agent is one headerAgent, reached
// over HTTP as a runner's relay is.
type agentRunner struct {
	acceptingRunner
	srv *httptest.Server
}

// Agent is the agent as a runner's relay reaches it: the container named in
// runnerapi.ContainerHeader, as runnerapi.Client sends it ("" sends none).
func (r *agentRunner) Agent(_ context.Context, _, container string) (agentv1connect.AgentServiceClient, error) {
	hc := &http.Client{Transport: containerTransport{r.srv.Client().Transport, container}}
	return agentv1connect.NewAgentServiceClient(hc, r.srv.URL, connect.WithGRPC()), nil
}

func (r *agentRunner) Logs(ctx context.Context, id, container string, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error {
	a, _ := r.Agent(ctx, id, container)
	return agent.ForwardLogs(ctx, a, req, send)
}

// containerTransport sets runnerapi.ContainerHeader on every request when it names a
// container.
type containerTransport struct {
	rt        http.RoundTripper
	container string
}

func (t containerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.container != "" {
		req = req.Clone(req.Context())
		req.Header.Set(runnerapi.ContainerHeader, t.container)
	}
	return t.rt.RoundTrip(req)
}

// TestContainerReachesTheRunner: the container field of Exec, ReadFile, WriteFile,
// StreamExec and StreamLogs reaches the runner as runnerapi.ContainerHeader on the
// relayed agent call: a sidecar by its name, the primary (by its name, "main" or
// nothing) as no header; an unknown name is NOT_FOUND CWSANDBOX_CONTAINER_NOT_FOUND
// naming it, and reaches no agent.
func TestContainerReachesTheRunner(t *testing.T) {
	ag := &headerAgent{}
	mux := http.NewServeMux()
	mux.Handle(agentv1connect.NewAgentServiceHandler(ag))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	r := &agentRunner{acceptingRunner: acceptingRunner{id: "r1"}, srv: srv}
	s := newTestGateway(t, t.TempDir(), r)
	ctx := asOrg(t.Context())
	created, err := s.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{
			{Name: "app", Primary: proto.Bool(true), Image: "busybox", Resources: &sandboxv1.Resources{Cpu: "1", Memory: "1Gi"}},
			{Name: "side", Image: "python", Resources: &sandboxv1.Resources{Cpu: "1", Memory: "1Gi"}},
		},
	}}}))
	if err != nil {
		t.Fatal(err)
	}
	id := created.Msg.GetSandboxId()
	r.mu.Lock()
	sb := r.got[id]
	sb.State = runner.StateRunning
	r.got[id] = sb
	r.mu.Unlock()

	calls := func(container string) error {
		if _, err := s.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: id, Command: []string{"true"}, Container: container})); err != nil {
			return err
		}
		if _, err := s.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: id, Path: "/f", Container: container})); err != nil {
			return err
		}
		if _, err := s.WriteFile(ctx, connect.NewRequest(&sandboxv1.WriteFileRequest{SandboxId: id, Path: "/f", Container: container})); err != nil {
			return err
		}
		src := gatewaySource{s}
		logs, err := src.DataLogs(ctx, id, container)
		if err != nil {
			return err
		}
		if err := logs(ctx, &agentv1.LogsRequest{}, func(*agentv1.LogsResponse) error { return nil }); err != nil {
			return err
		}
		a, err := src.DataAgent(ctx, sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_STREAM_EXEC, id, container)
		if err != nil {
			return err
		}
		up := a.StreamExec(ctx)
		if err := up.Send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Init{Init: &agentv1.StreamExecInit{Command: []string{"true"}}}}); err != nil {
			return err
		}
		if _, err := up.Receive(); err != nil {
			return err
		}
		return up.CloseResponse()
	}
	for container, want := range map[string]string{"side": "side", "": "", "app": ""} {
		if err := calls(container); err != nil {
			t.Fatalf("container %q: %v", container, err)
		}
		got := ag.calls()
		if len(got) != 5 {
			t.Fatalf("container %q: the agent saw %v, want 5 calls", container, got)
		}
		for _, g := range got {
			if _, h, _ := strings.Cut(g, "="); h != want {
				t.Errorf("container %q: %s, want header %q", container, g, want)
			}
		}
	}

	err = calls("nope")
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("unknown container: %v, want NOT_FOUND", err)
	}
	info := apierr.Info(err)
	if info.GetReason() != apierr.ContainerNotFound || info.GetMetadata()["container"] != "nope" || info.GetMetadata()["sandbox_id"] != id {
		t.Errorf("unknown container: ErrorInfo %v", info)
	}
	if got := ag.calls(); len(got) != 0 {
		t.Errorf("an unknown container reached the agent: %v", got)
	}
}

func TestContainerOfUnnamedPrimary(t *testing.T) {
	sp := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Image: "busybox"}}}
	for _, c := range []string{"", "main"} {
		if got, err := containerOf("x", sp, c); got != "" || err != nil {
			t.Errorf("%q: %q, %v; want the primary", c, got, err)
		}
	}
	if _, err := containerOf("x", sp, "other"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("other: %v, want NOT_FOUND", err)
	}
}

// TestContainerStatuses: one row per container of the spec, in its order; a reported
// container has its report's state (waiting CREATING, running RUNNING, exited 0
// COMPLETED, else FAILED), exit code and restarts; init containers have no row; a
// single-container sandbox (no reports) has one row, its primary's, with the sandbox's
// state, exit code and restarts.
func TestContainerStatuses(t *testing.T) {
	code := func(n int32) *int32 { return &n }
	sp := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "db"}, {Name: "app", Primary: proto.Bool(true)}, {Name: "web"}, {Name: "done"}}}
	sb := runner.Sandbox{State: runner.StateRunning, Containers: []runtime.ContainerStatus{
		{Name: "setup", Init: true, State: runtime.ContainerExited, ExitCode: code(0)},
		{Name: "app", State: runtime.ContainerRunning},
		{Name: "db", State: runtime.ContainerExited, ExitCode: code(3), Restarts: 6},
		{Name: "web", State: runtime.ContainerWaiting},
		{Name: "done", State: runtime.ContainerExited, ExitCode: code(0)},
	}}
	got := sandboxProto("x", sp, sb, &acceptingRunner{id: "r1"}).GetStatus().GetContainerStatuses()
	want := []*sandboxv1.ContainerStatus{
		{Name: "db", State: sandboxv1.State_STATE_FAILED, ExitCode: 3, RestartCount: 6},
		{Name: "app", State: sandboxv1.State_STATE_RUNNING},
		{Name: "web", State: sandboxv1.State_STATE_CREATING},
		{Name: "done", State: sandboxv1.State_STATE_COMPLETED},
	}
	if len(got) != len(want) {
		t.Fatalf("rows %v, want %v", got, want)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("row %d: %v, want %v", i, got[i], want[i])
		}
	}

	// Not reported (yet): a sidecar is CREATING with its sandbox, else unknown; the
	// primary has the sandbox's state.
	for st, want := range map[runner.State]sandboxv1.State{runner.StateCreating: sandboxv1.State_STATE_CREATING, runner.StateRunning: sandboxv1.State_STATE_UNSPECIFIED} {
		rows := sandboxProto("x", sp, runner.Sandbox{State: st}, &acceptingRunner{id: "r1"}).GetStatus().GetContainerStatuses()
		if rows[1].GetState() != sandboxv1.State(st) || rows[0].GetState() != want || rows[2].GetState() != want {
			t.Errorf("unreported, sandbox %v: %v", st, rows)
		}
	}

	single := sandboxProto("x", &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Image: "busybox"}}},
		runner.Sandbox{State: runner.StateFailed, ExitCode: code(2), Restarts: 6}, &acceptingRunner{id: "r1"})
	rows := single.GetStatus().GetContainerStatuses()
	if len(rows) != 1 || !proto.Equal(rows[0], &sandboxv1.ContainerStatus{Name: "main", State: sandboxv1.State_STATE_FAILED, ExitCode: 2, RestartCount: 6}) {
		t.Errorf("single container: %v", rows)
	}
}

// TestEchoMarksThePrimary: Get and List echo every container row with its primary
// flag; a group created with none marked has its first row marked (the index's copy is
// left alone).
func TestEchoMarksThePrimary(t *testing.T) {
	sp := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "a"}, {Name: "b"}}}
	p := sandboxProto("x", sp, runner.Sandbox{}, &acceptingRunner{id: "r1"})
	cs := p.GetSpec().GetContainers()
	if len(cs) != 2 || !cs[0].GetPrimary() || cs[1].GetPrimary() {
		t.Errorf("echoed rows %v, want a marked primary", cs)
	}
	if sp.Containers[0].Primary != nil {
		t.Error("the index's spec was modified")
	}
}

// TestContainerStateRestarting: a container waiting to start again (restarts so far,
// or a restart reason as the local backend and the kubelet give) is RUNNING, not
// CREATING; one waiting for its first start is CREATING.
func TestContainerStateRestarting(t *testing.T) {
	code := int32(1)
	for _, tc := range []struct {
		st   runtime.ContainerStatus
		want sandboxv1.State
	}{
		{runtime.ContainerStatus{State: runtime.ContainerWaiting, Reason: "ContainerCreating"}, sandboxv1.State_STATE_CREATING},
		{runtime.ContainerStatus{State: runtime.ContainerWaiting, Reason: "Held"}, sandboxv1.State_STATE_CREATING},
		{runtime.ContainerStatus{State: runtime.ContainerWaiting, Reason: "Restarting", ExitCode: &code}, sandboxv1.State_STATE_RUNNING},
		{runtime.ContainerStatus{State: runtime.ContainerWaiting, Reason: "CrashLoopBackOff"}, sandboxv1.State_STATE_RUNNING},
		{runtime.ContainerStatus{State: runtime.ContainerWaiting, Restarts: 2, ExitCode: &code}, sandboxv1.State_STATE_RUNNING},
		{runtime.ContainerStatus{State: runtime.ContainerExited, Restarts: 2, ExitCode: &code}, sandboxv1.State_STATE_FAILED},
	} {
		if got := containerState(tc.st); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.st, got, tc.want)
		}
	}
}

// TestContainerOfClipsUnknownNames: an unknown container name that is no valid name
// (huge, not UTF-8) is NOT_FOUND CONTAINER_NOT_FOUND quoting it clipped to 64 bytes of
// valid UTF-8, in the message and the metadata.
func TestContainerOfClipsUnknownNames(t *testing.T) {
	sp := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "app"}, {Name: "db"}}}
	for _, name := range []string{strings.Repeat("a", 100<<10), "\xff\xfe" + strings.Repeat("\x80", 100<<10)} {
		_, err := containerOf("x", sp, name)
		if connect.CodeOf(err) != connect.CodeNotFound || apierr.Reason(err) != apierr.ContainerNotFound {
			t.Fatalf("unknown container: %v", err)
		}
		md := apierr.Info(err).GetMetadata()["container"]
		if len(md) > 64 || !utf8.ValidString(md) || len(err.Error()) > 300 || !utf8.ValidString(err.Error()) {
			t.Errorf("unknown container quoted as %d bytes (valid %v), message %d bytes", len(md), utf8.ValidString(md), len(err.Error()))
		}
	}
	// A valid name is quoted as it is.
	if _, err := containerOf("x", sp, "cache"); apierr.Info(err).GetMetadata()["container"] != "cache" || !strings.Contains(err.Error(), `"cache"`) {
		t.Errorf("unknown valid name: %v", err)
	}
}

// TestGroupEffectiveResourcesAreTheSum: a group's effective resources (and requirements)
// are the sum over its containers, what the policy's total ceilings apply to: legacy
// resources count as request and limit, a lone limit is also the request, a container
// without a limit of a quantity makes the sandbox's unlimited (not shown). One container
// reports its own, as before.
func TestGroupEffectiveResourcesAreTheSum(t *testing.T) {
	res := func(cpu, mem string) *sandboxv1.Resources { return &sandboxv1.Resources{Cpu: cpu, Memory: mem} }
	sp := &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{
		{Name: "app", Primary: proto.Bool(true), Resources: res("500m", "256Mi")},
		{Name: "db", ResourceRequirements: &sandboxv1.ResourceRequirements{Requests: res("250m", "128Mi"), Limits: res("1", "512Mi")}},
		{Name: "web", ResourceRequirements: &sandboxv1.ResourceRequirements{Limits: res("250m", "128Mi")}},
	}}
	st := sandboxProto("x", sp, runner.Sandbox{State: runner.StateRunning}, &acceptingRunner{id: "r1"}).GetStatus()
	if got, want := st.GetEffectiveResources(), res("1750m", "896Mi"); !proto.Equal(got, want) {
		t.Errorf("effective resources %v, want the sum %v", got, want)
	}
	wantRR := &sandboxv1.ResourceRequirements{Requests: res("1", "512Mi"), Limits: res("1750m", "896Mi")}
	if got := st.GetEffectiveResourceRequirements(); !proto.Equal(got, wantRR) {
		t.Errorf("effective requirements %v, want %v", got, wantRR)
	}

	// web sets no memory limit: the sandbox's memory is not limited by the sum.
	sp.Containers[2].ResourceRequirements = &sandboxv1.ResourceRequirements{Limits: res("250m", "")}
	st = sandboxProto("x", sp, runner.Sandbox{State: runner.StateRunning}, &acceptingRunner{id: "r1"}).GetStatus()
	if got, want := st.GetEffectiveResources(), res("1750m", ""); !proto.Equal(got, want) {
		t.Errorf("with an unlimited memory: effective resources %v, want %v", got, want)
	}

	one := sandboxProto("x", &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Image: "busybox", Resources: res("2", "1Gi")}}},
		runner.Sandbox{State: runner.StateRunning}, &acceptingRunner{id: "r1"}).GetStatus()
	if !proto.Equal(one.GetEffectiveResources(), res("2", "1Gi")) ||
		!proto.Equal(one.GetEffectiveResourceRequirements(), &sandboxv1.ResourceRequirements{Requests: res("2", "1Gi"), Limits: res("2", "1Gi")}) {
		t.Errorf("one container: %v %v", one.GetEffectiveResources(), one.GetEffectiveResourceRequirements())
	}
}
