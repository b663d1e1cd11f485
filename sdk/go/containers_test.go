package sandbox

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
)

// recorder is a SandboxService that records the requests the SDK sends and answers
// with a running two-container sandbox. It checks the client's end of the wire; the
// server's end (the gateway routing the container field) has its own tests.
type recorder struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler

	mu       sync.Mutex
	created  *sandboxv1.CreateSandboxRequest
	fromFile *sandboxv1.CreateSandboxFromFileRequest
	execs    []*sandboxv1.ExecRequest
	streams  []*sandboxv1.ExecStreamInit
	logs     []*sandboxv1.StreamLogsRequest
	writes   []*sandboxv1.WriteFileRequest
	reads    []*sandboxv1.ReadFileRequest
}

func (r *recorder) sandbox(spec *sandboxv1.SandboxSpec) *sandboxv1.Sandbox {
	return &sandboxv1.Sandbox{SandboxId: "sb-1", Spec: spec, Status: &sandboxv1.SandboxStatus{
		State: sandboxv1.State_STATE_RUNNING, CreateTime: timestamppb.Now(),
		ContainerStatuses: []*sandboxv1.ContainerStatus{
			{Name: "app", State: sandboxv1.State_STATE_RUNNING},
			{Name: "redis", State: sandboxv1.State_STATE_FAILED, ExitCode: 137, RestartCount: 2},
		}}}
}

func (r *recorder) CreateSandbox(_ context.Context, req *connect.Request[sandboxv1.CreateSandboxRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.created = req.Msg
	return connect.NewResponse(r.sandbox(req.Msg.GetSandbox().GetSpec())), nil
}

func (r *recorder) CreateSandboxFromFile(_ context.Context, req *connect.Request[sandboxv1.CreateSandboxFromFileRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fromFile = req.Msg
	return connect.NewResponse(r.sandbox(&sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{
		{Name: "redis", Image: "redis"}, {Name: "app", Image: "app", Primary: proto.Bool(true)}}})), nil
}

func (r *recorder) GetSandbox(context.Context, *connect.Request[sandboxv1.GetSandboxRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	return connect.NewResponse(r.sandbox(&sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{
		{Name: "app", Image: "app", Primary: proto.Bool(true)}, {Name: "redis", Image: "redis"}}})), nil
}

func (r *recorder) Exec(_ context.Context, req *connect.Request[sandboxv1.ExecRequest]) (*connect.Response[sandboxv1.ExecResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.execs = append(r.execs, req.Msg)
	return connect.NewResponse(&sandboxv1.ExecResponse{Stdout: []byte("in " + req.Msg.GetContainer()), ExitCode: 3,
		StdoutTruncated: true, StdoutBytesProduced: 99}), nil
}

func (r *recorder) StreamExec(_ context.Context, st *connect.BidiStream[sandboxv1.ExecStreamRequest, sandboxv1.ExecStreamResponse]) error {
	m, err := st.Receive()
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.streams = append(r.streams, m.GetInit())
	r.mu.Unlock()
	return st.Send(&sandboxv1.ExecStreamResponse{Message: &sandboxv1.ExecStreamResponse_Exit{Exit: &sandboxv1.ExecStreamExit{ExitCode: 0}}})
}

func (r *recorder) StreamLogs(_ context.Context, req *connect.Request[sandboxv1.StreamLogsRequest], st *connect.ServerStream[sandboxv1.LogEntry]) error {
	r.mu.Lock()
	r.logs = append(r.logs, req.Msg)
	r.mu.Unlock()
	return st.Send(&sandboxv1.LogEntry{Data: []byte("log of " + req.Msg.GetContainer() + "\n")})
}

func (r *recorder) WriteFile(_ context.Context, req *connect.Request[sandboxv1.WriteFileRequest]) (*connect.Response[sandboxv1.WriteFileResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes = append(r.writes, req.Msg)
	return connect.NewResponse(&sandboxv1.WriteFileResponse{}), nil
}

func (r *recorder) ReadFile(_ context.Context, req *connect.Request[sandboxv1.ReadFileRequest]) (*connect.Response[sandboxv1.ReadFileResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads = append(r.reads, req.Msg)
	return connect.NewResponse(&sandboxv1.ReadFileResponse{Content: []byte(req.Msg.GetContainer())}), nil
}

// newRecorder serves a recorder over h2c and returns a gateway-only client of it.
func newRecorder(t *testing.T) (*recorder, *Client) {
	t.Helper()
	r := &recorder{}
	mux := http.NewServeMux()
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(r))
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: p}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	c, err := New("http://"+ln.Addr().String(), "k", WithDataPlane(DataPlaneGateway))
	if err != nil {
		t.Fatal(err)
	}
	return r, c
}

func TestSDKMultiContainerSpecProto(t *testing.T) {
	p := Spec{Tags: []string{"t"}, Containers: []Container{
		{Name: "redis", Image: "redis:7", CPU: "250m", StartupProbe: &Probe{Exec: []string{"redis-cli", "ping"},
			Period: 1500 * time.Millisecond, Timeout: time.Second, FailureThreshold: 30, InitialDelay: 0}},
		{Name: "app", Image: "busybox", Command: "sh", Args: []string{"-c", "sleep 1"}, Env: map[string]string{"A": "1"},
			Memory: "64Mi", Primary: true, Files: map[string][]byte{"/etc/app": []byte("x")}, WorkingDir: "/w"},
	}}.Proto()
	cs := p.GetContainers()
	if len(cs) != 2 || p.GetTags()[0] != "t" {
		t.Fatalf("spec %v", p)
	}
	redis, app := cs[0], cs[1]
	if redis.GetName() != "redis" || redis.Primary != nil || redis.GetCommand() != "" || len(redis.GetArgs()) != 0 {
		t.Errorf("a container without a command must run its entrypoint and not be primary: %v", redis)
	}
	pr := redis.GetStartupProbe()
	if !slices.Equal(pr.GetExec(), []string{"redis-cli", "ping"}) || pr.GetPeriodSeconds() != 2 || pr.GetTimeoutSeconds() != 1 || pr.GetFailureThreshold() != 30 {
		t.Errorf("probe %v", pr)
	}
	if redis.GetResourceRequirements().GetLimits().GetCpu() != "250m" || redis.GetResourceRequirements().GetRequests().GetMemory() != "" {
		t.Errorf("redis resources %v", redis.GetResourceRequirements())
	}
	if !app.GetPrimary() || app.GetCommand() != "sh" || app.GetEnvironmentVariables()["A"] != "1" || app.GetWorkingDir() != "/w" ||
		len(app.GetFiles()) != 1 || app.GetResourceRequirements().GetLimits().GetMemory() != "64Mi" {
		t.Errorf("app %v", app)
	}
	// Without a Primary the first container is marked.
	p = Spec{Containers: []Container{{Name: "a", Image: "x"}, {Name: "b", Image: "y"}}}.Proto()
	if !p.GetContainers()[0].GetPrimary() || p.GetContainers()[1].Primary != nil {
		t.Errorf("default primary %v", p.GetContainers())
	}
}

func TestSDKMultiContainerSpecRefused(t *testing.T) {
	r, c := newRecorder(t)
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{Image: "busybox", Containers: []Container{{Name: "a", Image: "x"}}}, "single-container fields"},
		{Spec{CPU: "1", Containers: []Container{{Name: "a", Image: "x"}}}, "single-container fields"},
		{Spec{Containers: []Container{{Image: "x"}}}, "Name is required"},
		{Spec{Containers: []Container{{Name: "a", Image: "x"}, {Name: "a", Image: "y"}}}, `"a" is used twice`},
		{Spec{Containers: []Container{{Name: "a"}}}, "Image is required"},
		{Spec{Containers: []Container{{Name: "a", Image: "x", Primary: true}, {Name: "b", Image: "y", Primary: true}}}, "more than one"},
		{Spec{Containers: []Container{{Name: "a", Image: "x", StartupProbe: &Probe{}}}}, "StartupProbe.Exec"},
	} {
		if _, err := c.Create(context.Background(), tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.spec, err, tc.want)
		}
	}
	if r.created != nil {
		t.Errorf("a refused spec was sent: %v", r.created)
	}
}

// Create, exec (streaming and unary), files and logs each carry the container the
// caller named, InContainer's by default and an option's over it; the sandbox's
// containers come back joined with their statuses.
func TestSDKContainerTargeting(t *testing.T) {
	ctx := context.Background()
	r, c := newRecorder(t)
	sb, err := c.Create(ctx, Spec{Containers: []Container{{Name: "app", Image: "app", Primary: true}, {Name: "redis", Image: "redis"}}})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(r.created.GetSandbox().GetSpec().GetContainers()); n != 2 || r.created.GetRequestId() == "" {
		t.Fatalf("create sent %v", r.created)
	}
	in := sb.Info()
	if in.Image != "app" || len(in.Containers) != 2 {
		t.Fatalf("info %+v", in)
	}
	app, redis := in.Containers[0], in.Containers[1]
	if app.Name != "app" || !app.Primary || app.State != StateRunning || app.ExitCode != nil || app.Image != "app" {
		t.Errorf("app %+v", app)
	}
	if redis.Name != "redis" || redis.Primary || redis.State != StateFailed || redis.ExitCode == nil || *redis.ExitCode != 137 || redis.Restarts != 2 {
		t.Errorf("redis %+v", redis)
	}
	if in.Restarts != 2 {
		t.Errorf("restarts %d", in.Restarts)
	}

	// The primary: no container on the wire.
	if _, err := sb.Exec(ctx, []string{"true"}, ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	// An option names one.
	if _, err := sb.Exec(ctx, []string{"true"}, ExecOptions{Container: "redis"}); err != nil {
		t.Fatal(err)
	}
	rs := sb.InContainer("redis")
	if rs.Container() != "redis" || rs.ID() != sb.ID() || sb.Container() != "" {
		t.Fatalf("InContainer handle %q %q", rs.Container(), rs.ID())
	}
	if _, err := rs.Exec(ctx, []string{"true"}, ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.Exec(ctx, []string{"true"}, ExecOptions{Container: "app"}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range r.streams {
		got = append(got, s.GetContainer())
	}
	if !slices.Equal(got, []string{"", "redis", "redis", "app"}) {
		t.Errorf("StreamExec containers %q", got)
	}

	res, err := rs.ExecUnary(ctx, []string{"redis-cli", "ping"}, UnaryExecOptions{MaxOutputBytes: 10})
	if err != nil || string(res.Stdout) != "in redis" || res.ExitCode != 3 || !res.StdoutTruncated || res.StdoutBytes != 99 {
		t.Errorf("unary exec %+v %v", res, err)
	}
	if _, err := sb.ExecUnary(ctx, []string{"x"}, UnaryExecOptions{Container: "app"}); err != nil {
		t.Fatal(err)
	}
	if len(r.execs) != 2 || r.execs[0].GetContainer() != "redis" || r.execs[0].GetMaxOutputBytes() != 10 || r.execs[1].GetContainer() != "app" {
		t.Errorf("Exec requests %v", r.execs)
	}
	if _, err := sb.ExecUnary(ctx, nil, UnaryExecOptions{}); err == nil {
		t.Error("unary exec without a command")
	}

	if err := rs.WriteFile(ctx, "/f", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if b, err := rs.ReadFile(ctx, "/f"); err != nil || string(b) != "redis" {
		t.Errorf("read %q %v", b, err)
	}
	if b, err := sb.ReadFile(ctx, "/f"); err != nil || string(b) != "" {
		t.Errorf("read from the primary %q %v", b, err)
	}
	if r.writes[0].GetContainer() != "redis" || r.reads[0].GetContainer() != "redis" || r.reads[1].GetContainer() != "" {
		t.Errorf("file requests %v %v", r.writes, r.reads)
	}

	var out bytes.Buffer
	if err := rs.Logs(ctx, LogOptions{Tail: 5}, &out); err != nil {
		t.Fatal(err)
	}
	if err := sb.Logs(ctx, LogOptions{Container: "app"}, &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != "log of redis\nlog of app\n" || r.logs[0].GetTailLines() != 5 {
		t.Errorf("logs %q, requests %v", out.String(), r.logs)
	}
}

func TestSDKCreateFromFile(t *testing.T) {
	ctx := context.Background()
	r, c := newRecorder(t)
	compose := []byte("services:\n  app:\n    image: app\n  redis:\n    image: redis\n")
	sb, err := c.CreateFromFile(ctx, FileSpec{Contents: compose, PrimaryService: "app", ImageOverrides: map[string]string{"redis": "redis:7"},
		CPU: "500m", Memory: "128Mi", Lifetime: 90 * time.Second, Tags: []string{"t"}, RunnerIDs: []string{"r1"}, DenyEgress: true, Engine: true})
	if err != nil {
		t.Fatal(err)
	}
	m := r.fromFile
	if m.GetType() != sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_COMPOSE || !bytes.Equal(m.GetContents(), compose) || m.GetPrimaryService() != "app" ||
		m.GetImageOverrides()["redis"] != "redis:7" || m.GetDefaultResources().GetLimits().GetCpu() != "500m" ||
		m.GetDefaultResources().GetRequests().GetMemory() != "128Mi" || m.GetMaxLifetimeSeconds() != 90 || m.GetTags()[0] != "t" ||
		m.GetRunnerIds()[0] != "r1" || m.GetMode() != sandboxv1.SandboxMode_SANDBOX_MODE_CKS || !m.GetNetwork().GetDenyEgress() ||
		m.GetControl() != sandboxv1.Control_CONTROL_CONTAINER_ENGINE || m.GetRequestId() == "" {
		t.Errorf("request %v", m)
	}
	// The primary is the one the server marked, wherever it is.
	if in := sb.Info(); in.Image != "app" || len(in.Containers) != 2 || in.Containers[0].Primary || !in.Containers[1].Primary {
		t.Errorf("info %+v", in)
	}
	if (FileSpec{Contents: compose}).Proto().GetControl() != sandboxv1.Control_CONTROL_UNSPECIFIED {
		t.Error("engine mode without Engine")
	}

	r.fromFile = nil
	if _, err := c.CreateFromFile(ctx, FileSpec{}); err == nil {
		t.Error("an empty file was accepted")
	}
	if _, err := c.CreateFromFile(ctx, FileSpec{Contents: make([]byte, MaxSandboxFileBytes+1)}); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("an oversized file: %v", err)
	}
	if r.fromFile != nil {
		t.Error("a refused file was sent")
	}
}

// A status naming a container the spec does not still lists it; a single-container
// sandbox has one entry, primary.
func TestSDKContainerInfos(t *testing.T) {
	got := containerInfos(&sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}},
		Status: &sandboxv1.SandboxStatus{ContainerStatuses: []*sandboxv1.ContainerStatus{
			{Name: "main", State: sandboxv1.State_STATE_COMPLETED, ExitCode: 0}, {Name: "init", State: sandboxv1.State_STATE_COMPLETED}}}})
	if len(got) != 2 || !got[0].Primary || got[0].ExitCode == nil || *got[0].ExitCode != 0 || got[1].Name != "init" || got[1].Primary {
		t.Errorf("infos %+v", got)
	}
	if containerInfos(&sandboxv1.Sandbox{}) != nil {
		t.Error("no containers")
	}
}
