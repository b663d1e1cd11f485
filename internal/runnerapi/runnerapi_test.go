package runnerapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// fakeRunner answers with err when set, else with sb; its agent is agentClient.
type fakeRunner struct {
	mu          sync.Mutex
	ensured     runner.RegisteredVolume // the last EnsureVolume's
	err         error
	sb          runner.Sandbox
	got         runner.CreateRequest
	agentClient agentv1connect.AgentServiceClient
	awaited     time.Duration // the wait of the last AwaitStart
	containers  []string      // of the Agent and Logs calls: the container each named
	// Snapshots: the targets asked of SnapshotVolume and DeleteWithSnapshots, the job
	// they answer with, and the Delete calls without targets.
	targets      []runner.SnapshotTarget
	job          runner.SnapshotJob
	plainDeletes int
	lifetime     time.Duration // asked of UpdateLifetime
	// Pause, Resume and Fork: what they were asked, and Fork's results.
	pauseOpts   runner.PauseOptions
	forkTargets []runner.ForkTarget
	forkResults []runner.ForkResult
}

// UpdateLifetime records the lifetime and answers f.sb with it.
func (f *fakeRunner) UpdateLifetime(_ context.Context, _ string, d time.Duration) (runner.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lifetime = d
	sb := f.sb
	sb.Lifetime, sb.Deadline = d, sb.CreatedAt.Add(d)
	return sb, f.err
}

func (f *fakeRunner) Create(_ context.Context, req runner.CreateRequest) (runner.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = req
	return f.sb, f.err
}
func (f *fakeRunner) Get(string) (runner.Sandbox, error) { return f.sb, f.err }

// AwaitStart records the wait asked for and answers as Get.
func (f *fakeRunner) AwaitStart(_ context.Context, _ string, wait time.Duration) (runner.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.awaited = wait
	return f.sb, f.err
}
func (f *fakeRunner) List() []runner.Sandbox { return []runner.Sandbox{f.sb} }
func (f *fakeRunner) Delete(string, time.Duration) (runner.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.plainDeletes++
	return f.sb, f.err
}

// DeleteWithSnapshots records the targets and answers one job per target, CREATING.
func (f *fakeRunner) DeleteWithSnapshots(id string, _ time.Duration, ts []runner.SnapshotTarget) (runner.Sandbox, []runner.SnapshotJob, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.targets = append(f.targets, ts...)
	var jobs []runner.SnapshotJob
	for _, t := range ts {
		jobs = append(jobs, runner.SnapshotJob{SnapshotID: t.SnapshotID, SandboxID: id, Volume: t.Volume, State: runner.SnapshotCreating})
	}
	return f.sb, jobs, f.err
}

// SnapshotVolume records the target and answers f.job with its IDs.
func (f *fakeRunner) SnapshotVolume(_ context.Context, id string, t runner.SnapshotTarget) (runner.SnapshotJob, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.targets = append(f.targets, t)
	j := f.job
	j.SnapshotID, j.SandboxID, j.Volume = t.SnapshotID, id, t.Volume
	return j, f.err
}

func (f *fakeRunner) GetSnapshotJob(id string) runner.SnapshotJob {
	f.mu.Lock()
	defer f.mu.Unlock()
	j := f.job
	j.SnapshotID = id
	return j
}

// Agent records the container; one called "nope" the sandbox does not have.
func (f *fakeRunner) Agent(_ context.Context, id, container string) (agentv1connect.AgentServiceClient, error) {
	f.mu.Lock()
	f.containers = append(f.containers, container)
	f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	if container == "nope" {
		return nil, &runner.ContainerNotFoundError{Sandbox: id, Container: container}
	}
	return f.agentClient, nil
}
func (f *fakeRunner) Logs(ctx context.Context, id, container string, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error {
	a, err := f.Agent(ctx, id, container)
	if err != nil {
		return err
	}
	return agent.ForwardLogs(ctx, a, req, send)
}

type testRunner struct {
	addr string
	ca   *pki.CA
	fake *fakeRunner
}

// startRunner serves fake as runner r1 over mTLS on loopback.
func startRunner(t *testing.T, fake *fakeRunner) *testRunner {
	t.Helper()
	r := startRunnerBackend(t, fake)
	r.fake = fake
	return r
}

// startRunnerBackend serves b as runner r1 over mTLS on loopback.
func startRunnerBackend(t *testing.T, fake backend) *testRunner {
	t.Helper()
	ca, err := pki.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ServerTLSConfig(ca, "r1", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	capacity := func(context.Context) (runner.Capacity, error) {
		return runner.Capacity{Support: runtime.Support{NoDNSEgress: true}, CPUOvercommit: 2.5, Defaults: runner.DefaultResources, MilliCPU: 2000, MemoryBytes: 1 << 30, GPUs: 2, UsedGPUs: 1, Running: 1, MaxSandboxes: 50, ConnectedAt: time.Unix(100, 0), Architectures: []string{"amd64"}, DataPlaneURI: "https://runner-1.example.test:9443"}, nil
	}
	srv := newServer(fake, capacity, nil).HTTPServer(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return &testRunner{addr: ln.Addr().String(), ca: ca}
}

func (r *testRunner) client(t *testing.T) *Client {
	t.Helper()
	cfg, err := ClientTLSConfig(r.ca, "gw1", "r1")
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ClientConfig{ID: "r1", Addr: r.addr, TLS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestRunnerapiErrorMapping(t *testing.T) {
	r := startRunner(t, &fakeRunner{})
	c := r.client(t)
	ctx := context.Background()
	verr := &runner.ValidationError{Violations: []apierr.Violation{
		{Field: "spec.containers[0].image", Description: "is required"},
		{Field: "spec.max_lifetime_seconds", Description: "must be at most 2592000 (30 days), got 2678400"},
	}}
	agentErr := apierr.New(apierr.FileNotFound, "/x: no such file", map[string]string{"filepath": "/x"})
	for _, tc := range []struct {
		name   string
		err    error
		code   connect.Code // on the wire
		reason string
		check  func(error) bool // on the gateway side, after the Client mapped it back
	}{
		{"validation", verr, connect.CodeInvalidArgument, apierr.InvalidRequest, func(err error) bool {
			var got *runner.ValidationError
			return errors.As(err, &got) && fmt.Sprint(got.Violations) == fmt.Sprint(verr.Violations) && err.Error() == verr.Error()
		}},
		{"not found", fmt.Errorf("%w: abc", runtime.ErrNotFound), connect.CodeNotFound, apierr.SandboxNotFound, func(err error) bool {
			return errors.Is(err, runtime.ErrNotFound) && !errors.Is(err, runner.ErrNotRunning) && err.Error() == "sandbox not found: abc"
		}},
		{"not running", fmt.Errorf("%w: abc is TERMINATED", runner.ErrNotRunning), connect.CodeFailedPrecondition, apierr.SandboxNotRunning, func(err error) bool {
			return errors.Is(err, runner.ErrNotRunning) && err.Error() == "sandbox not running: abc is TERMINATED"
		}},
		{"already exists", fmt.Errorf("%w: abc", runner.ErrAlreadyExists), connect.CodeAlreadyExists, "", func(err error) bool {
			return errors.Is(err, runner.ErrAlreadyExists)
		}},
		{"waiting cut short", fmt.Errorf("wait for sandbox abc to run: %w", context.DeadlineExceeded), connect.CodeDeadlineExceeded, "", func(err error) bool {
			return errors.Is(err, context.DeadlineExceeded)
		}},
		{"api error passes", agentErr, connect.CodeNotFound, apierr.FileNotFound, func(err error) bool {
			return apierr.Info(err).GetMetadata()["filepath"] == "/x" && !errors.Is(err, runtime.ErrNotFound)
		}},
		{"anything else", errors.New("disk on fire"), connect.CodeInternal, "", func(err error) bool {
			return connect.CodeOf(err) == connect.CodeInternal && strings.Contains(err.Error(), "disk on fire")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wire := toStatus("abc", tc.err)
			if connect.CodeOf(wire) != tc.code || apierr.Reason(wire) != tc.reason {
				t.Errorf("wire error %v (reason %q), want %v %q", wire, apierr.Reason(wire), tc.code, tc.reason)
			}
			r.fake.mu.Lock()
			r.fake.err = tc.err
			r.fake.mu.Unlock()
			calls := map[string]func() error{
				"create": func() error { _, err := c.Create(ctx, runner.CreateRequest{}); return err },
				"get":    func() error { _, err := c.Get(ctx, "abc"); return err },
				"delete": func() error { _, err := c.Delete(ctx, "abc", 0); return err },
			}
			for name, call := range calls {
				if err := call(); !tc.check(err) {
					t.Errorf("%s: %v (%T) does not map back", name, err, err)
				}
			}
			// The relay answers with the same errors, which the gateway passes on unchanged.
			a, _ := c.Agent(ctx, "abc", "")
			_, err := a.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"true"}}))
			if connect.CodeOf(err) != tc.code || apierr.Reason(err) != tc.reason {
				t.Errorf("relayed exec: %v, want %v %q", err, tc.code, tc.reason)
			}
		})
	}
	if vs := apierr.Violations(toStatus("", verr)); len(vs) != 2 || vs[0].Field != "spec.containers[0].image" {
		t.Errorf("violations on the wire: %v", vs)
	}
}

func TestRunnerapiUnreachable(t *testing.T) {
	ca, _ := pki.LoadOrCreateCA(t.TempDir(), "test CA")
	cfg, _ := ClientTLSConfig(ca, "gw1", "r1")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	c, _ := NewClient(ClientConfig{ID: "r1", Addr: addr, TLS: cfg})
	ctx := context.Background()
	_, err := c.Get(ctx, "abc")
	if connect.CodeOf(err) != connect.CodeUnavailable || apierr.Reason(err) != apierr.RunnerUnavailable || errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("get from a runner that is down: %v", err)
	}
	a, _ := c.Agent(ctx, "abc", "")
	if _, err := a.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{})); apierr.Reason(err) != apierr.RunnerUnavailable {
		t.Errorf("exec through a runner that is down: %v", err)
	}
}

func TestRunnerapiConversionRoundTrip(t *testing.T) {
	code := int32(0)
	now := time.Now().UTC()
	sb := runner.Sandbox{
		ID: "abc", State: runner.StateCompleted, Reason: "Completed", Message: "done", ExitCode: &code, Restarts: 2, OOMKills: 1,
		CreatedAt: now, StartedAt: now.Add(time.Second), EndedAt: now.Add(2 * time.Second), Lifetime: time.Minute, Deadline: now.Add(time.Minute),
		IP: "10.0.0.2", RuntimeClass: "runc", ImageDigest: "sha256:abc",
		Spec: runtime.Spec{
			ID: "abc", Container: runtime.Container{Image: "busybox", Command: "/bin/sh", Args: []string{"-c", "true"}, Env: map[string]string{"A": "1"}, WorkingDir: "/w", Files: []runtime.File{{Path: "/f", Content: []byte("x"), Mode: 0o600}}, Resources: runtime.Resources{MilliCPU: 500, MemoryBytes: 1 << 28, Pids: 64, RequestMilliCPU: 100, RequestMemoryBytes: 1 << 27}, RestartLimit: 3},
			RuntimeClass: "runc",
			Meta:         map[string]string{runtime.MetaOrg: "o"},
			Services: []runtime.Service{{Port: 9000, Visibility: "custom"},
				{Port: 8080, Visibility: "public", Endpoint: runtime.EndpointHTTPS, TokenAuth: true, TimeoutSeconds: 60}},
			ShareTokenHash: "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",
			Network: &runtime.Network{
				Egress: []runtime.EgressRule{{CIDR: "10.0.0.0/8", Except: []string{"10.1.0.0/16"}}, {DNSName: "*.example.com"},
					{Tenant: runtime.TenantSameOrg}, {Any: true, Ports: []runtime.PortRange{{Protocol: "udp", Port: 53, EndPort: 54}}}},
				DenyIngress: true,
			},
		},
	}
	back := sandboxFromProto(sandboxToProto(sb))
	if !reflect.DeepEqual(back.Spec, sb.Spec) || *back.ExitCode != *sb.ExitCode ||
		!back.CreatedAt.Equal(sb.CreatedAt) || !back.EndedAt.Equal(sb.EndedAt) || back.Lifetime != sb.Lifetime || back.OOMKills != 1 || back.IP != sb.IP {
		t.Errorf("round trip:\n%+v\n%+v", back, sb)
	}
	running := sandboxFromProto(sandboxToProto(runner.Sandbox{ID: "x", State: runner.StateRunning, CreatedAt: now}))
	if running.ExitCode != nil || !running.EndedAt.IsZero() || !running.StartedAt.IsZero() {
		t.Errorf("absent exit code and times came back as %v %v %v", running.ExitCode, running.StartedAt, running.EndedAt)
	}
	if running.Usage != nil {
		t.Errorf("absent usage came back as %+v", running.Usage)
	}
	u := &runner.Usage{CPUMillicores: 250, Usage: runtime.Usage{CPUUsec: 12345, MemoryBytes: 3 << 20, MemoryPeakBytes: 5 << 20}}
	if back := sandboxFromProto(sandboxToProto(runner.Sandbox{ID: "x", State: runner.StateRunning, Usage: u})); back.Usage == nil || *back.Usage != *u {
		t.Errorf("usage came back as %+v, want %+v", back.Usage, u)
	}
	req := runner.CreateRequest{Spec: sb.Spec, Lifetime: time.Hour}
	req.Spec.PullCredentials = &runtime.Credentials{Username: "u", Password: "p"}
	got := createFromProto(createToProto(req))
	if *got.Spec.PullCredentials != *req.Spec.PullCredentials || got.Lifetime != time.Hour {
		t.Errorf("create request: %+v", got)
	}
	if p := sandboxToProto(runner.Sandbox{Spec: req.Spec}); p.GetSpec().GetPullCredentials() != nil {
		t.Error("a sandbox snapshot carries pull credentials")
	}
	uid, gid := uint32(1000), uint32(0)
	sec := &runtime.Security{RunAsUser: &uid, RunAsGroup: &gid, ReadOnlyRootFS: true, CapAdd: []string{"CAP_NET_ADMIN"},
		CapDrop: []string{"ALL"}, AllowPrivilegeEscalation: true, SeccompProfile: runtime.SeccompRuntimeDefault}
	req.Spec.Security = sec
	if got := createFromProto(createToProto(req)).Spec.Security; !reflect.DeepEqual(got, sec) {
		t.Errorf("security context: %+v, want %+v", got, sec)
	}
	req.Spec.Volumes = []runtime.Volume{{Name: "m", SizeBytes: 1 << 20, Medium: runtime.MediumMemory}, {Name: "d"}}
	req.Spec.VolumeMounts = []runtime.VolumeMount{{Volume: "m", Path: "/m", ReadOnly: true, SubPath: "a"}, {Volume: "d", Path: "/d"}}
	if got := createFromProto(createToProto(req)).Spec; !reflect.DeepEqual(got.Volumes, req.Spec.Volumes) || !reflect.DeepEqual(got.VolumeMounts, req.Spec.VolumeMounts) {
		t.Errorf("volumes: %+v %+v", got.Volumes, got.VolumeMounts)
	}
	secs := int64(30)
	for _, tc := range []struct {
		name string
		pod  *runtime.PodSettings
		want *runtime.PodSettings
	}{
		{"none", nil, nil},
		{"empty is none", &runtime.PodSettings{}, nil},
		{"every field", &runtime.PodSettings{
			NodeSelector: map[string]string{"pool": "a"},
			Tolerations: []runtime.Toleration{{Key: "k", Operator: "Equal", Value: "v", Effect: "NoExecute", TolerationSeconds: &secs},
				{Operator: "Exists"}},
			PriorityClassName: "high", ServiceAccountName: "sa", ImagePullSecrets: []string{"p1", "p2"},
			Annotations: map[string]string{"a/b": "c"},
		}, nil},
	} {
		t.Run("pod settings "+tc.name, func(t *testing.T) {
			want := tc.want
			if want == nil && !tc.pod.IsZero() {
				want = tc.pod
			}
			r := req
			r.Spec.Pod = tc.pod
			if got := createFromProto(createToProto(r)).Spec.Pod; !reflect.DeepEqual(got, want) {
				t.Errorf("pod settings: %+v, want %+v", got, want)
			}
		})
	}
}

func TestRunnerapiCreateGetCapacity(t *testing.T) {
	code := int32(3)
	fake := &fakeRunner{sb: runner.Sandbox{ID: "abc", State: runner.StateFailed, ExitCode: &code, CreatedAt: time.Unix(5, 0)}}
	r := startRunner(t, fake)
	c := r.client(t)
	ctx := context.Background()
	sb, err := c.Create(ctx, runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "img", PullCredentials: &runtime.Credentials{Username: "u", Password: "p"}}}, Lifetime: time.Minute})
	if err != nil || sb.ID != "abc" || sb.State != runner.StateFailed || *sb.ExitCode != 3 {
		t.Fatalf("create: %+v %v", sb, err)
	}
	if fake.got.Spec.PullCredentials == nil || fake.got.Spec.PullCredentials.Password != "p" || fake.got.Lifetime != time.Minute {
		t.Errorf("runner got %+v", fake.got)
	}
	// AwaitStart carries its wait to the runner; a plain Get asks for none.
	if sb, err := c.AwaitStart(ctx, "abc", 300*time.Millisecond); err != nil || sb.ID != "abc" || fake.awaited != 300*time.Millisecond {
		t.Errorf("await start: %+v %v (runner got wait %v)", sb, err, fake.awaited)
	}
	fake.awaited = 0
	if sb, err := c.Get(ctx, "abc"); err != nil || sb.ID != "abc" || fake.awaited != 0 {
		t.Errorf("get: %+v %v (runner got wait %v)", sb, err, fake.awaited)
	}
	list, err := c.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "abc" {
		t.Errorf("list: %v %v", list, err)
	}
	cap, err := c.Capacity(ctx)
	if err != nil || cap.MilliCPU != 2000 || cap.Running != 1 || !cap.ConnectedAt.Equal(time.Unix(100, 0)) || cap.Architectures[0] != "amd64" ||
		cap.GPUs != 2 || cap.UsedGPUs != 1 || cap.MaxSandboxes != 50 || cap.DataPlaneURI != "https://runner-1.example.test:9443" || !cap.NoDNSEgress || cap.NoShareTokens ||
		cap.CPUOvercommit != 2.5 || cap.Defaults != runner.DefaultResources {
		t.Errorf("capacity: %+v %v", cap, err)
	}
	sb, err = c.UpdateLifetime(ctx, "abc", 90*time.Minute)
	if err != nil || fake.lifetime != 90*time.Minute || sb.Lifetime != 90*time.Minute || !sb.Deadline.Equal(time.Unix(5, 0).Add(90*time.Minute)) {
		t.Errorf("update lifetime: runner got %s, answered %s %s, %v", fake.lifetime, sb.Lifetime, sb.Deadline, err)
	}
}

// fakeAgent serves Exec (echo of stdin), StreamExec (cat: stdin to stdout until EOF, then
// exit 0) and Logs (three chunks).
type fakeAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	cancelled chan struct{}
}

func (f *fakeAgent) Exec(_ context.Context, req *connect.Request[agentv1.ExecRequest]) (*connect.Response[agentv1.ExecResponse], error) {
	if req.Msg.GetCommand()[0] == "fail" {
		return nil, apierr.New(apierr.FileNotFound, "nope", map[string]string{"filepath": "/nope"})
	}
	return connect.NewResponse(&agentv1.ExecResponse{Stdout: req.Msg.GetStdin(), ExitCode: 7}), nil
}

func (f *fakeAgent) StreamExec(ctx context.Context, st *connect.BidiStream[agentv1.StreamExecRequest, agentv1.StreamExecResponse]) error {
	if _, err := st.Receive(); err != nil {
		return err
	}
	if err := st.Send(&agentv1.StreamExecResponse{Message: &agentv1.StreamExecResponse_Ready{Ready: &agentv1.Ready{}}}); err != nil {
		return err
	}
	for {
		m, err := st.Receive()
		if errors.Is(err, io.EOF) {
			return st.Send(&agentv1.StreamExecResponse{Message: &agentv1.StreamExecResponse_Exit{Exit: &agentv1.Exit{}}})
		}
		if err != nil {
			close(f.cancelled)
			return err
		}
		if m.GetStdin() == nil {
			continue
		}
		if err := st.Send(&agentv1.StreamExecResponse{Message: &agentv1.StreamExecResponse_Output{Output: &agentv1.Output{Stream: agentv1.Stream_STREAM_STDOUT, Data: m.GetStdin()}}}); err != nil {
			return err
		}
	}
}

func (f *fakeAgent) Logs(_ context.Context, _ *connect.Request[agentv1.LogsRequest], st *connect.ServerStream[agentv1.LogsResponse]) error {
	for i := range 3 {
		if err := st.Send(&agentv1.LogsResponse{Data: []byte(fmt.Sprint(i)), NextOffset: uint64(i + 1)}); err != nil {
			return err
		}
	}
	return nil
}

// serveAgent serves a over h2c on a loopback listener and returns a client of it.
func serveAgent(t *testing.T, a agentv1connect.AgentServiceHandler) agentv1connect.AgentServiceClient {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(agentv1connect.NewAgentServiceHandler(a))
	srv := &http.Server{Handler: mux, Protocols: new(http.Protocols)}
	srv.Protocols.SetUnencryptedHTTP2(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", ln.Addr().String())
	})
}

func TestRunnerapiRelay(t *testing.T) {
	fa := &fakeAgent{cancelled: make(chan struct{})}
	r := startRunner(t, &fakeRunner{})
	r.fake.agentClient = serveAgent(t, fa)
	c := r.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, err := c.Agent(ctx, "abc", "")
	if err != nil {
		t.Fatal(err)
	}

	res, err := a.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"cat"}, Stdin: []byte("hi")}))
	if err != nil || string(res.Msg.GetStdout()) != "hi" || res.Msg.GetExitCode() != 7 {
		t.Fatalf("exec: %v %v", res, err)
	}
	_, err = a.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"fail"}}))
	if info := apierr.Info(err); info.GetReason() != apierr.FileNotFound || info.GetMetadata()["filepath"] != "/nope" || connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("agent error relayed as %v", err)
	}

	// Without the header the relay cannot know the sandbox.
	raw := agentv1connect.NewAgentServiceClient(c.hc, "https://"+r.addr, connect.WithGRPC())
	if _, err := raw.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"cat"}})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("exec without %s: %v", SandboxIDHeader, err)
	}

	logs, err := a.Logs(ctx, connect.NewRequest(&agentv1.LogsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	for logs.Receive() {
		got.Write(logs.Msg().GetData())
	}
	if logs.Err() != nil || got.String() != "012" {
		t.Errorf("logs %q %v", got.String(), logs.Err())
	}

	// Bidi: messages go through one by one, and half-close is half-close.
	st := a.StreamExec(ctx)
	if err := st.Send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Init{Init: &agentv1.StreamExecInit{Command: []string{"cat"}}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Receive(); err != nil || m.GetReady() == nil {
		t.Fatalf("first message %v %v, want ready", m, err)
	}
	for _, s := range []string{"a", "bc"} {
		if err := st.Send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Stdin{Stdin: []byte(s)}}); err != nil {
			t.Fatal(err)
		}
		// The echo arrives before the next send: nothing waits for the whole output.
		if m, err := st.Receive(); err != nil || string(m.GetOutput().GetData()) != s {
			t.Fatalf("echo of %q: %v %v", s, m, err)
		}
	}
	if err := st.CloseRequest(); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Receive(); err != nil || m.GetExit() == nil {
		t.Fatalf("after half-close: %v %v, want exit", m, err)
	}
	if _, err := st.Receive(); !errors.Is(err, io.EOF) {
		t.Errorf("after exit: %v, want EOF", err)
	}
	_ = st.CloseResponse()

	// Cancelling the caller cancels the agent's call.
	sctx, scancel := context.WithCancel(ctx)
	st = a.StreamExec(sctx)
	_ = st.Send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Init{Init: &agentv1.StreamExecInit{Command: []string{"cat"}}}})
	if m, err := st.Receive(); err != nil || m.GetReady() == nil {
		t.Fatalf("first message %v %v, want ready", m, err)
	}
	scancel()
	select {
	case <-fa.cancelled:
	case <-time.After(10 * time.Second):
		t.Error("the agent's stream was not cancelled with the caller's")
	}
}

func TestRunnerapiMTLS(t *testing.T) {
	r := startRunner(t, &fakeRunner{sb: runner.Sandbox{ID: "abc"}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.client(t).Get(ctx, "abc"); err != nil {
		t.Fatalf("a gateway's certificate: %v", err)
	}
	other, err := pki.LoadOrCreateCA(t.TempDir(), "another CA")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *pki.CA, uris ...*url.URL) *tls.Certificate {
		c, err := ca.IssueClient("someone", uris, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}
	runnerURI, _ := url.Parse("spiffe://sandboxd/runner/r2")
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"no client certificate", pki.ClientTLSConfig(nil, r.ca.Pool(), "r1")},
		{"certificate from another CA", pki.ClientTLSConfig(issue(other, GatewayURI("gw1")), r.ca.Pool(), "r1")},
		{"certificate without the gateway SAN", pki.ClientTLSConfig(issue(r.ca, runnerURI), r.ca.Pool(), "r1")},
		{"certificate with an empty gateway name", pki.ClientTLSConfig(issue(r.ca, GatewayURI("")), r.ca.Pool(), "r1")},
		{"runner not trusted: another CA", pki.ClientTLSConfig(issue(r.ca, GatewayURI("gw1")), other.Pool(), "r1")},
		{"runner of another name", pki.ClientTLSConfig(issue(r.ca, GatewayURI("gw1")), r.ca.Pool(), "r2")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewClient(ClientConfig{ID: "r1", Addr: r.addr, TLS: tc.cfg})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			sb, err := c.Get(ctx, "abc")
			if err == nil || connect.CodeOf(err) != connect.CodeUnavailable {
				t.Errorf("get: %+v %v (code %v), want the handshake refused", sb.ID, err, connect.CodeOf(err))
			}
			a, _ := c.Agent(ctx, "abc", "")
			if _, err := a.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"true"}})); err == nil {
				t.Error("exec through the relay went through")
			}
			// And at the TLS level, the handshake itself fails.
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", r.addr, tc.cfg)
			if err == nil {
				// TLS 1.3: the client finishes first; the server's verdict comes with the first read.
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				_, err = conn.Read(make([]byte, 1))
				conn.Close()
			}
			if err == nil {
				t.Errorf("handshake: %v", err)
			}
			t.Logf("refused: %v", err)
		})
	}
	if _, err := ClientTLSConfig(r.ca, "a/b", "r1"); err == nil {
		t.Error("a gateway name with a slash was accepted")
	}
}

// TestRunnerapiRelayContainer: the Client names the container of an agent call in
// ContainerHeader (none for the primary), the relay passes it to the runner for every
// kind of call (unary, logs, streams), and a container the sandbox does not have comes
// back NOT_FOUND CWSANDBOX_CONTAINER_NOT_FOUND naming it, which the Client maps back to
// a *runner.ContainerNotFoundError, not to a missing sandbox.
func TestRunnerapiRelayContainer(t *testing.T) {
	fa := &fakeAgent{cancelled: make(chan struct{})}
	r := startRunner(t, &fakeRunner{})
	r.fake.agentClient = serveAgent(t, fa)
	c := r.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	db, _ := c.Agent(ctx, "abc", "db")
	if _, err := db.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"cat"}})); err != nil {
		t.Fatal(err)
	}
	primary, _ := c.Agent(ctx, "abc", "")
	if _, err := primary.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"cat"}})); err != nil {
		t.Fatal(err)
	}
	if err := c.Logs(ctx, "abc", "db", &agentv1.LogsRequest{}, func(*agentv1.LogsResponse) error { return nil }); err != nil {
		t.Fatal(err)
	}
	st := db.StreamExec(ctx)
	if err := st.Send(&agentv1.StreamExecRequest{Message: &agentv1.StreamExecRequest_Init{Init: &agentv1.StreamExecInit{Command: []string{"cat"}}}}); err != nil {
		t.Fatal(err)
	}
	_ = st.CloseRequest()
	for {
		if _, err := st.Receive(); err != nil {
			break
		}
	}
	_ = st.CloseResponse()
	r.fake.mu.Lock()
	got := slices.Clone(r.fake.containers)
	r.fake.mu.Unlock()
	if want := []string{"db", "", "db", "db"}; !slices.Equal(got, want) {
		t.Errorf("containers the runner was asked for: %q, want %q", got, want)
	}

	nope, _ := c.Agent(ctx, "abc", "nope")
	_, err := nope.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"cat"}}))
	if connect.CodeOf(err) != connect.CodeNotFound || apierr.Reason(err) != apierr.ContainerNotFound || apierr.Info(err).GetMetadata()["container"] != "nope" {
		t.Errorf("exec in an unknown container: %v (reason %q)", err, apierr.Reason(err))
	}
	err = c.Logs(ctx, "abc", "nope", &agentv1.LogsRequest{}, func(*agentv1.LogsResponse) error { return nil })
	if apierr.Reason(err) != apierr.ContainerNotFound || apierr.Info(err).GetMetadata()["container"] != "nope" {
		t.Errorf("logs of an unknown container: %v", err)
	}
	// On RunnerService calls the same wire error maps back to the runner's error.
	r.fake.mu.Lock()
	r.fake.err = &runner.ContainerNotFoundError{Sandbox: "abc", Container: "nope"}
	r.fake.mu.Unlock()
	_, back := c.Get(ctx, "abc")
	var cnf *runner.ContainerNotFoundError
	if !errors.As(back, &cnf) || cnf.Container != "nope" || cnf.Sandbox != "abc" || errors.Is(back, runtime.ErrNotFound) || !errors.Is(back, runtime.ErrContainerNotFound) {
		t.Errorf("mapped back: %v (%T)", back, back)
	}
}

// The relay refuses the runner-only calls: starting a main command, and the archives of
// a volume (ArchivePath, ExtractPath), through the client and on the wire.
func TestRunnerapiRunnerOnlyCalls(t *testing.T) {
	r := startRunner(t, &fakeRunner{})
	r.fake.agentClient = serveAgent(t, &fakeAgent{cancelled: make(chan struct{})})
	c := r.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, err := c.Agent(ctx, "abc", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.ArchivePath(ctx, connect.NewRequest(&agentv1.ArchivePathRequest{Path: "/data"})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("archive through the client: %v", err)
	}
	st := a.ExtractPath(ctx)
	_ = st.Send(&agentv1.ExtractPathRequest{Path: "/data"})
	if _, err := st.CloseAndReceive(); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("extract through the client: %v", err)
	}
	raw := agentv1connect.NewAgentServiceClient(c.hc, "https://"+r.addr, connect.WithGRPC(),
		connect.WithInterceptors(sandboxHeader{runnerID: "r1"}))
	as, err := raw.ArchivePath(sandboxAgent{id: "abc"}.ctx(ctx), connect.NewRequest(&agentv1.ArchivePathRequest{Path: "/data"}))
	if err == nil {
		for as.Receive() {
			t.Error("the relay sent archive data")
		}
		err = as.Err()
	}
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("archive on the wire: %v", err)
	}
	// Stop (the Kubernetes backend's, stopping a Pod's workload): never relayed (the fake
	// agent would answer UNIMPLEMENTED).
	if _, err := a.Stop(ctx, connect.NewRequest(&agentv1.StopRequest{})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("stop through the client: %v", err)
	}
	if _, err := raw.Stop(sandboxAgent{id: "abc"}.ctx(ctx), connect.NewRequest(&agentv1.StopRequest{})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("stop on the wire: %v", err)
	}
}
