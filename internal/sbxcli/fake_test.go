package sbxcli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	"github.com/sandboxd/sandboxd/gen/sandboxd/build/v1/buildv1connect"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	"github.com/sandboxd/sandboxd/internal/buildfake"
)

// execFunc plays a command in a fake sandbox: it writes the command's output and
// returns its exit code, or a start failure (the agent's START_FAILED) with the code a
// shell would give.
type execFunc func(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) (code int32, startErr string)

// fakeAPI is an in-process SandboxService: sandboxes are records that run at once, and
// exec runs commands on this host (hostExec) unless a test plays them itself.
type fakeAPI struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler
	url string

	mu        sync.Mutex
	sandboxes map[string]*sandboxv1.Sandbox
	order     []string
	execs     [][]string
	// execIn is the container of each exec (the request's field, "" = the primary).
	execIn   []string
	fromFile []*sandboxv1.CreateSandboxFromFileRequest
	logReqs  []*sandboxv1.StreamLogsRequest
	fileReqs []string // "read|write CONTAINER PATH" per unary file call
	files    map[string][]byte
	purges   []*sandboxv1.PurgeSandboxesRequest
	deleted  []string
	exec     execFunc
	// snaps is the snapshot index (snapshots_test.go); deleteReqs every DeleteSandbox.
	snaps      fakeSnaps
	deleteReqs []*sandboxv1.DeleteSandboxRequest
	// lifetimeReqs every UpdateSandboxLifetime (lifetime_test.go).
	lifetimeReqs []*statev1.UpdateSandboxLifetimeRequest
	// pauseReqs and forkReqs every PauseSandbox and ForkSandbox (pause_test.go).
	pauseReqs []*statev1.PauseSandboxRequest
	forkReqs  []*statev1.ForkSandboxRequest
	// resumeReqs every ResumeSandbox (pause_test.go).
	resumeReqs []*statev1.ResumeSandboxRequest
	// tmpl is the template service; fromTmpl every CreateSandboxFromTemplate (templates_test.go).
	tmpl     fakeTemplates
	fromTmpl []*sandboxv1.CreateSandboxFromTemplateRequest
	// builds is the build service (builds_test.go).
	builds buildfake.Server
	// progress is what WatchSandboxProgress plays (nil: not implemented), watches how
	// often it was called (progress_test.go).
	progress []*statev1.WatchSandboxProgressResponse
	watches  int
}

func newFake(t *testing.T) *fakeAPI {
	t.Helper()
	f := &fakeAPI{sandboxes: map[string]*sandboxv1.Sandbox{}, exec: hostExec}
	mux := http.NewServeMux()
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(f))
	mux.Handle(statev1connect.NewSandboxStateServiceHandler(&fakeState{f: f}))
	mux.Handle(sandboxv1connect.NewSandboxTemplateServiceHandler(&f.tmpl))
	mux.Handle(buildv1connect.NewBuildServiceHandler(&f.builds))
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
	f.url = "http://" + ln.Addr().String()
	return f
}

// run runs sbx in-process against the fake (exec through the gateway path).
func (f *fakeAPI) run(ctx context.Context, stdin string, args ...string) (stdout, stderr string, code int) {
	return runSbx(ctx, stdin, append([]string{"--base-url", f.url, "--api-key", "k", "--data-plane", "gateway"}, args...)...)
}

func (f *fakeAPI) sbx(stdin string, args ...string) (stdout, stderr string, code int) {
	return f.run(context.Background(), stdin, args...)
}

// add stores a running sandbox created now.
func (f *fakeAPI) add(id string, tags ...string) *sandboxv1.Sandbox {
	return f.put(&sandboxv1.Sandbox{SandboxId: id, Spec: &sandboxv1.SandboxSpec{Tags: tags,
		Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}}})
}

func (f *fakeAPI) put(sb *sandboxv1.Sandbox) *sandboxv1.Sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb.Status == nil {
		sb.Status = &sandboxv1.SandboxStatus{State: sandboxv1.State_STATE_RUNNING, CreateTime: timestamppb.Now(),
			StartTime: timestamppb.Now(), EffectiveMaxLifetimeSeconds: 600, RunnerId: "local"}
	}
	f.sandboxes[sb.GetSandboxId()] = sb
	f.order = append(f.order, sb.GetSandboxId())
	return sb
}

func (f *fakeAPI) get(id string) (*sandboxv1.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sandboxes[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("sandbox %s not found", id))
	}
	return proto.Clone(sb).(*sandboxv1.Sandbox), nil
}

func terminal(st sandboxv1.State) bool {
	return st == sandboxv1.State_STATE_COMPLETED || st == sandboxv1.State_STATE_FAILED || st == sandboxv1.State_STATE_TERMINATED
}

func (f *fakeAPI) CreateSandbox(_ context.Context, req *connect.Request[sandboxv1.CreateSandboxRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	f.mu.Lock()
	id := fmt.Sprintf("sbx-fake-%d", len(f.order)+1)
	f.mu.Unlock()
	sb := f.put(&sandboxv1.Sandbox{SandboxId: id, Spec: req.Msg.GetSandbox().GetSpec()})
	out := proto.Clone(sb).(*sandboxv1.Sandbox)
	for _, svc := range out.GetSpec().GetServices() {
		if svc.GetEndpoint().GetAuth() == sandboxv1.EndpointAuth_ENDPOINT_AUTH_SHARE_TOKEN {
			out.EndpointShareToken = "share-token-of-" + id // in the create response only, as the gateway does
		}
	}
	return connect.NewResponse(out), nil
}

func (f *fakeAPI) GetSandbox(_ context.Context, req *connect.Request[sandboxv1.GetSandboxRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	sb, err := f.get(req.Msg.GetSandboxId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(sb), nil
}

func (f *fakeAPI) ListSandboxes(_ context.Context, req *connect.Request[sandboxv1.ListSandboxesRequest]) (*connect.Response[sandboxv1.ListSandboxesResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &sandboxv1.ListSandboxesResponse{}
	for _, id := range f.order {
		sb := f.sandboxes[id]
		if f.matches(sb, req.Msg.GetTags()) && (req.Msg.GetShowTerminated() || !terminal(sb.GetStatus().GetState())) {
			out.Sandboxes = append(out.Sandboxes, proto.Clone(sb).(*sandboxv1.Sandbox))
		}
	}
	return connect.NewResponse(out), nil
}

func (f *fakeAPI) matches(sb *sandboxv1.Sandbox, tags []string) bool {
	for _, t := range tags {
		if !slices.Contains(sb.GetSpec().GetTags(), t) {
			return false
		}
	}
	return true
}

func (f *fakeAPI) DeleteSandbox(_ context.Context, req *connect.Request[sandboxv1.DeleteSandboxRequest]) (*connect.Response[sandboxv1.DeleteSandboxResponse], error) {
	if _, err := f.get(req.Msg.GetSandboxId()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	sb := f.sandboxes[req.Msg.GetSandboxId()]
	sb.Status.State = sandboxv1.State_STATE_TERMINATED
	f.deleted = append(f.deleted, sb.GetSandboxId())
	f.deleteReqs = append(f.deleteReqs, req.Msg)
	out := &sandboxv1.DeleteSandboxResponse{Sandbox: proto.Clone(sb).(*sandboxv1.Sandbox)}
	for _, v := range req.Msg.GetSnapshotVolumes() {
		out.FileSystemSnapshotIds = append(out.FileSystemSnapshotIds,
			f.snaps.add(sb.GetSandboxId(), v, sandboxv1.SnapshotTrigger_SNAPSHOT_TRIGGER_ON_DELETE).GetFileSystemSnapshotId())
	}
	f.mu.Unlock()
	return connect.NewResponse(out), nil
}

func (f *fakeAPI) PurgeSandboxes(_ context.Context, req *connect.Request[sandboxv1.PurgeSandboxesRequest]) (*connect.Response[sandboxv1.PurgeSandboxesResponse], error) {
	m := req.Msg
	f.mu.Lock()
	defer f.mu.Unlock()
	f.purges = append(f.purges, m)
	if (len(m.GetTags()) > 0) == m.GetPurgeAll() {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("give exactly one scope"))
	}
	out := &sandboxv1.PurgeSandboxesResponse{}
	for _, id := range f.order {
		sb := f.sandboxes[id]
		st := sb.GetStatus().GetState()
		if terminal(st) || st == sandboxv1.State_STATE_TERMINATING || (!m.GetPurgeAll() && !f.matches(sb, m.GetTags())) {
			continue
		}
		if !m.GetDryRun() {
			sb.Status.State = sandboxv1.State_STATE_TERMINATED
		}
		out.PurgeCount++
	}
	return connect.NewResponse(out), nil
}

func (f *fakeAPI) StreamExec(ctx context.Context, st *connect.BidiStream[sandboxv1.ExecStreamRequest, sandboxv1.ExecStreamResponse]) error {
	first, err := st.Receive()
	if err != nil {
		return err
	}
	init := first.GetInit()
	if _, err := f.get(init.GetSandboxId()); err != nil {
		return err
	}
	f.mu.Lock()
	f.execs = append(f.execs, init.GetCommand())
	f.execIn = append(f.execIn, init.GetContainer())
	play := f.exec
	f.mu.Unlock()

	var sendMu sync.Mutex
	send := func(m *sandboxv1.ExecStreamResponse) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.Send(m)
	}
	stdinR, stdinW := io.Pipe()
	go func() { // stdin until Close or the client's half-close
		for {
			m, err := st.Receive()
			if err != nil {
				_ = stdinW.Close()
				return
			}
			switch x := m.GetMessage().(type) {
			case *sandboxv1.ExecStreamRequest_Stdin:
				if _, err := stdinW.Write(x.Stdin); err != nil {
					return
				}
			case *sandboxv1.ExecStreamRequest_Close:
				_ = stdinW.Close()
			}
		}
	}()
	if err := send(&sandboxv1.ExecStreamResponse{Message: &sandboxv1.ExecStreamResponse_Ready{Ready: &sandboxv1.ExecStreamReady{ReadyTime: timestamppb.Now()}}}); err != nil {
		return err
	}
	out := func(s sandboxv1.ExecStreamOutput_Stream) io.Writer {
		return writerFunc(func(p []byte) (int, error) {
			err := send(&sandboxv1.ExecStreamResponse{Message: &sandboxv1.ExecStreamResponse_Output{Output: &sandboxv1.ExecStreamOutput{Stream: s, Data: bytes.Clone(p)}}})
			return len(p), err
		})
	}
	code, startErr := play(ctx, init.GetCommand(), stdinR, out(sandboxv1.ExecStreamOutput_STREAM_STDOUT), out(sandboxv1.ExecStreamOutput_STREAM_STDERR))
	_ = stdinR.Close()
	if startErr != "" {
		if err := send(&sandboxv1.ExecStreamResponse{Message: &sandboxv1.ExecStreamResponse_Error{Error: &sandboxv1.ExecStreamError{Code: "START_FAILED", Message: startErr}}}); err != nil {
			return err
		}
	}
	return send(&sandboxv1.ExecStreamResponse{Message: &sandboxv1.ExecStreamResponse_Exit{Exit: &sandboxv1.ExecStreamExit{ExitCode: code}}})
}

// CreateSandboxFromFile records the request and creates a two-service sandbox, the
// primary the requested service (else "app").
func (f *fakeAPI) CreateSandboxFromFile(_ context.Context, req *connect.Request[sandboxv1.CreateSandboxFromFileRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	f.mu.Lock()
	f.fromFile = append(f.fromFile, req.Msg)
	id := fmt.Sprintf("sbx-fake-%d", len(f.order)+1)
	f.mu.Unlock()
	primary := req.Msg.GetPrimaryService()
	if primary == "" {
		primary = "app"
	}
	var cs []*sandboxv1.Container
	for _, name := range []string{"app", "redis"} {
		c := &sandboxv1.Container{Name: name, Image: name}
		if name == primary {
			c.Primary = proto.Bool(true)
		}
		cs = append(cs, c)
	}
	sb := f.put(&sandboxv1.Sandbox{SandboxId: id, Spec: &sandboxv1.SandboxSpec{Containers: cs, Tags: req.Msg.GetTags()}})
	return connect.NewResponse(proto.Clone(sb).(*sandboxv1.Sandbox)), nil
}

func (f *fakeAPI) StreamLogs(_ context.Context, req *connect.Request[sandboxv1.StreamLogsRequest], st *connect.ServerStream[sandboxv1.LogEntry]) error {
	if _, err := f.get(req.Msg.GetSandboxId()); err != nil {
		return err
	}
	f.mu.Lock()
	f.logReqs = append(f.logReqs, req.Msg)
	f.mu.Unlock()
	name := req.Msg.GetContainer()
	if name == "" {
		name = "the primary"
	}
	return st.Send(&sandboxv1.LogEntry{Data: []byte("output of " + name + "\n")})
}

func (f *fakeAPI) WriteFile(_ context.Context, req *connect.Request[sandboxv1.WriteFileRequest]) (*connect.Response[sandboxv1.WriteFileResponse], error) {
	if _, err := f.get(req.Msg.GetSandboxId()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fileReqs = append(f.fileReqs, "write "+req.Msg.GetContainer()+" "+req.Msg.GetPath())
	if f.files == nil {
		f.files = map[string][]byte{}
	}
	f.files[req.Msg.GetContainer()+":"+req.Msg.GetPath()] = req.Msg.GetContent()
	return connect.NewResponse(&sandboxv1.WriteFileResponse{}), nil
}

func (f *fakeAPI) ReadFile(_ context.Context, req *connect.Request[sandboxv1.ReadFileRequest]) (*connect.Response[sandboxv1.ReadFileResponse], error) {
	if _, err := f.get(req.Msg.GetSandboxId()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fileReqs = append(f.fileReqs, "read "+req.Msg.GetContainer()+" "+req.Msg.GetPath())
	data, ok := f.files[req.Msg.GetContainer()+":"+req.Msg.GetPath()]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("%s: no such file", req.Msg.GetPath()))
	}
	return connect.NewResponse(&sandboxv1.ReadFileResponse{Content: data}), nil
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// hostExec runs argv on this host, as the agent would in a sandbox: a command not on
// the PATH is a start failure with 127.
func hostExec(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) (int32, string) {
	if _, err := exec.LookPath(argv[0]); err != nil {
		return 127, argv[0] + ": command not found in PATH"
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, ""
	case errors.As(err, &ee):
		return int32(ee.ExitCode()), ""
	}
	return 126, err.Error()
}

// lastExec is the argv of the last exec.
func (f *fakeAPI) lastExec() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.execs) == 0 {
		return nil
	}
	return f.execs[len(f.execs)-1]
}
