package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Fake is a runtime.Backend that runs nothing, for testing what drives a backend (the
// runner). Each sandbox is a record the test scripts: how its Create ends (OnCreate),
// what its agent reports (FakeSandbox.Report), how and when its container ends
// (FakeSandbox.Exit, OnStop). Every call is counted (Calls). Its sandboxes outlive a
// runner as a real backend's do: a second runner on the same Fake recovers them.
//
// Its agents serve Watch (the runner follows the main command through it), Exec (which
// answers with the container's name and the command, so a test sees which container a
// call reached) and Logs (what FakeSandbox.WriteLog wrote) over in-memory connections; a
// sandbox's agent starts out reporting its main command RUNNING and goes away when its
// container exits.
//
// A multi-container spec runs as a group: each container has its own agent
// (DialAgent by name), its own log and its own status (ContainerStatuses): init
// containers exited 0, the others running until FakeSandbox.SetContainer says otherwise.
type Fake struct {
	// OnCreate, when set, runs inside Create once the sandbox is registered (sb), to
	// script it: report a status, exit, block until ctx ends, fail. An error fails the
	// Create, and the Fake forgets the sandbox, as a backend undoes a failed Create.
	OnCreate func(ctx context.Context, sb *FakeSandbox) error
	// OnStop, when set, is what the sandbox's main command does when Stop forwards
	// SIGTERM: Stop then returns once the container has exited (the test ends it with
	// sb.Exit). Unset, the main command obeys at once: it exits Stopped, code 143.
	OnStop func(sb *FakeSandbox, grace time.Duration)
	// FailDestroys makes that many Destroy calls fail, as a teardown step that is busy
	// for a moment (a cgroup, a mount) does.
	FailDestroys int
	// Settle, when set, is called before Create, Wait and Stop return and before Destroy
	// acts: the moment before what the backend did reaches its caller. A test hooks it to
	// observe every state its caller passes through.
	Settle func()

	mu        sync.Mutex
	sandboxes map[string]*FakeSandbox
	calls     Calls
	graces    map[string][]time.Duration // of the Stop calls, per sandbox
	added     chan struct{}              // closed and replaced when a sandbox is registered
}

// Calls counts the calls a Fake got.
type Calls struct {
	Create, Wait, Stop, Destroy, Recover int
	ContainerStatuses                    int
}

// NewFake returns a Fake with no sandboxes.
func NewFake() *Fake {
	return &Fake{sandboxes: map[string]*FakeSandbox{}, graces: map[string][]time.Duration{}, added: make(chan struct{})}
}

var (
	_ runtime.Backend                 = (*Fake)(nil)
	_ runtime.ContainerStatusReporter = (*Fake)(nil)
)

// FakeSandbox is one sandbox of a Fake.
type FakeSandbox struct {
	f    *Fake
	id   string
	spec runtime.Spec

	// Guarded by f.mu.
	info     runtime.Info
	status   *agentv1.StatusResponse
	version  uint64        // of status
	changed  chan struct{} // closed and replaced on every Report
	exited   chan struct{} // closed once the container has exited
	exit     runtime.Exit
	waitErr  error
	oomKills int
	agent    *fakeAgentServer
	// traceless: the container ended leaving no trace of how (Recover reports no Exit).
	traceless bool
	// containers are the containers other than the primary, by name (multi-container
	// specs); logs are every container's log, by name (the primary's too).
	containers map[string]*fakeContainer
	logs       map[string][]byte
}

// fakeContainer is a container other than the primary of a FakeSandbox.
type fakeContainer struct {
	status runtime.ContainerStatus
	agent  *fakeAgentServer
}

// Calls returns how many calls of each kind the Fake got.
func (f *Fake) Calls() Calls {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// StopGraces returns the grace periods of the Stop calls for sandbox id, also after it
// was destroyed.
func (f *Fake) StopGraces(id string) []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.graces[id])
}

// Sandbox returns sandbox id once the Fake has it (a runner creates sandboxes in the
// background), or nil after timeout.
func (f *Fake) Sandbox(id string, timeout time.Duration) *FakeSandbox {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		f.mu.Lock()
		sb, added := f.sandboxes[id], f.added
		f.mu.Unlock()
		if sb != nil {
			return sb
		}
		select {
		case <-added:
		case <-t.C:
			return nil
		}
	}
}

// Put adds a sandbox as an earlier runner left it (what Recover will report): alive,
// with its agent reporting the main command RUNNING, or ended with rec.Exit (nil: the
// container vanished without a trace of how it ended).
func (f *Fake) Put(rec runtime.Recovered) *FakeSandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.registerLocked(rec.Spec)
	sb.info = rec.Info
	if !rec.Alive {
		ex := runtime.Exit{}
		if rec.Exit != nil {
			ex = *rec.Exit
		}
		sb.exitLocked(ex, nil)
		sb.traceless = rec.Exit == nil
	}
	return sb
}

// Close ends the agents of every sandbox; their containers are left as they are.
func (f *Fake) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, sb := range f.sandboxes {
		if sb.agent != nil {
			sb.agent.close()
			sb.agent = nil
		}
	}
}

func (f *Fake) registerLocked(spec runtime.Spec) *FakeSandbox {
	sb := &FakeSandbox{
		f: f, id: spec.ID, spec: spec,
		info:    runtime.Info{ID: spec.ID, IP: "192.0.2.1", RuntimeClass: "fake", ImageDigest: "sha256:fake", StartedAt: time.Now()},
		status:  &agentv1.StatusResponse{State: agentv1.MainState_MAIN_STATE_RUNNING},
		version: 1,
		changed: make(chan struct{}),
		exited:  make(chan struct{}),
		logs:    map[string][]byte{},
	}
	if spec.Multi() {
		sb.containers = map[string]*fakeContainer{}
		for _, c := range sb.spec.AllContainers() {
			if c == &sb.spec.Container {
				continue
			}
			_, init := sb.spec.Find(c.Name)
			st := runtime.ContainerStatus{Name: c.Name, Init: init, State: runtime.ContainerRunning}
			if init {
				code := int32(0)
				st.State, st.ExitCode, st.Reason = runtime.ContainerExited, &code, "Completed"
			}
			sb.containers[c.Name] = &fakeContainer{status: st}
		}
	}
	f.sandboxes[spec.ID] = sb
	close(f.added)
	f.added = make(chan struct{})
	return sb
}

func (f *Fake) get(id string) (*FakeSandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[id]
	if sb == nil {
		return nil, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	return sb, nil
}

func (f *Fake) settle() {
	if f.Settle != nil {
		f.Settle()
	}
}

func (f *Fake) count(c *int) {
	f.mu.Lock()
	*c++
	f.mu.Unlock()
}

// Create implements runtime.Backend.
func (f *Fake) Create(ctx context.Context, spec *runtime.Spec) (runtime.Info, error) {
	f.mu.Lock()
	f.calls.Create++
	if f.sandboxes[spec.ID] != nil {
		f.mu.Unlock()
		return runtime.Info{}, fmt.Errorf("%w: sandbox %s already exists", runtime.ErrInvalidSpec, spec.ID)
	}
	sb := f.registerLocked(*spec)
	f.mu.Unlock()
	defer f.settle()
	if f.OnCreate != nil {
		if err := f.OnCreate(ctx, sb); err != nil {
			f.forget(sb)
			return runtime.Info{}, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return sb.info, nil
}

// forget drops sb and ends its agent.
func (f *Fake) forget(sb *FakeSandbox) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sandboxes[sb.id] == sb {
		delete(f.sandboxes, sb.id)
	}
	sb.exitLocked(runtime.Exit{Reason: "Killed", Message: "destroyed", At: time.Now()}, nil)
}

// DialAgent implements runtime.Backend: the agent of the sandbox's container ("" = the
// primary).
func (f *Fake) DialAgent(ctx context.Context, id, container string) (net.Conn, error) {
	sb, err := f.get(id)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	select {
	case <-sb.exited:
		f.mu.Unlock()
		return nil, fmt.Errorf("dial agent of %s: the sandbox has ended", id)
	default:
	}
	c, _ := sb.spec.Find(container)
	var a *fakeAgentServer
	switch {
	case c == nil:
		f.mu.Unlock()
		return nil, fmt.Errorf("dial agent of %s: %w: %q", id, runtime.ErrContainerNotFound, container)
	case c == &sb.spec.Container:
		if sb.agent == nil {
			sb.agent = serveFakeAgent(sb, sb.spec.ContainerName())
		}
		a = sb.agent
	default:
		fc := sb.containers[c.Name]
		if fc.status.State == runtime.ContainerExited {
			f.mu.Unlock()
			return nil, fmt.Errorf("dial agent of %s: container %q has exited", id, c.Name)
		}
		if fc.agent == nil {
			fc.agent = serveFakeAgent(sb, c.Name)
		}
		a = fc.agent
	}
	f.mu.Unlock()
	return a.dial(ctx)
}

// ContainerStatuses implements runtime.ContainerStatusReporter: init containers, the
// primary and the sidecars, as runtime.Spec.AllContainers orders them. The primary's is
// what its agent reports; the others' what SetContainer set.
func (f *Fake) ContainerStatuses(_ context.Context, id string) ([]runtime.ContainerStatus, error) {
	sb, err := f.get(id)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls.ContainerStatuses++
	var out []runtime.ContainerStatus
	for _, c := range sb.spec.AllContainers() {
		if c != &sb.spec.Container {
			out = append(out, sb.containers[c.Name].status)
			continue
		}
		st := runtime.ContainerStatus{Name: c.ContainerName(), State: runtime.ContainerRunning, Restarts: int(sb.status.GetRestartCount()), ExitCode: sb.status.ExitCode}
		select {
		case <-sb.exited:
			st.State, st.ExitCode, st.Reason, st.Message = runtime.ContainerExited, sb.exit.ExitCode, sb.exit.Reason, sb.exit.Message
		default:
		}
		out = append(out, st)
	}
	return out, nil
}

// SetContainer sets the status of a container other than the primary (st.Name); an
// exited one's agent goes away. It panics on a name the spec has not.
func (sb *FakeSandbox) SetContainer(st runtime.ContainerStatus) {
	sb.f.mu.Lock()
	defer sb.f.mu.Unlock()
	fc := sb.containers[st.Name]
	if fc == nil {
		panic("runtimetest: no container " + st.Name + " other than the primary")
	}
	st.Init = fc.status.Init
	fc.status = st
	if st.State == runtime.ContainerExited && fc.agent != nil {
		fc.agent.close()
		fc.agent = nil
	}
}

// WriteLog appends data to the log of the sandbox's container ("" = the primary), which
// its agent's Logs serves.
func (sb *FakeSandbox) WriteLog(container string, data []byte) {
	sb.f.mu.Lock()
	defer sb.f.mu.Unlock()
	if container == "" {
		container = sb.spec.ContainerName()
	}
	sb.logs[container] = append(sb.logs[container], data...)
}

func (sb *FakeSandbox) log(container string) []byte {
	sb.f.mu.Lock()
	defer sb.f.mu.Unlock()
	return slices.Clone(sb.logs[container])
}

// Wait implements runtime.Backend.
func (f *Fake) Wait(ctx context.Context, id string) (runtime.Exit, error) {
	f.count(&f.calls.Wait)
	sb, err := f.get(id)
	if err != nil {
		return runtime.Exit{}, err
	}
	select {
	case <-sb.exited:
	case <-ctx.Done():
		return runtime.Exit{}, ctx.Err()
	}
	f.settle()
	f.mu.Lock()
	defer f.mu.Unlock()
	return sb.exit, sb.waitErr
}

// Stop implements runtime.Backend: it returns once the container has exited.
func (f *Fake) Stop(ctx context.Context, id string, grace time.Duration) error {
	f.count(&f.calls.Stop)
	sb, err := f.get(id)
	if err != nil {
		return err
	}
	defer f.settle()
	f.mu.Lock()
	f.graces[id] = append(f.graces[id], grace)
	f.mu.Unlock()
	if f.OnStop != nil {
		f.OnStop(sb, grace)
	} else {
		code := int32(143)
		sb.Exit(runtime.Exit{ExitCode: &code, Reason: "Stopped", Message: "stopped by SIGTERM", At: time.Now()})
	}
	select {
	case <-sb.exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Destroy implements runtime.Backend; it is idempotent.
func (f *Fake) Destroy(ctx context.Context, id string) error {
	f.count(&f.calls.Destroy)
	f.settle()
	f.mu.Lock()
	if f.FailDestroys > 0 {
		f.FailDestroys--
		f.mu.Unlock()
		return fmt.Errorf("destroy %s: remove cgroup: device or resource busy", id)
	}
	sb := f.sandboxes[id]
	f.mu.Unlock()
	if sb != nil {
		f.forget(sb)
	}
	return nil
}

// Recover implements runtime.Backend: every sandbox the Fake has, alive or ended.
func (f *Fake) Recover(context.Context) ([]runtime.Recovered, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls.Recover++
	out := make([]runtime.Recovered, 0, len(f.sandboxes))
	for _, sb := range f.sandboxes {
		rec := runtime.Recovered{Spec: sb.spec, Info: sb.info, Alive: true}
		select {
		case <-sb.exited:
			rec.Alive = false
			if !sb.traceless {
				ex := sb.exit
				rec.Exit = &ex
			}
		default:
		}
		out = append(out, rec)
	}
	return out, nil
}

// OOMKills reports the count set with FakeSandbox.SetOOMKills, as the local backend
// reads its memory cgroup's.
func (f *Fake) OOMKills(id string) (int, error) {
	sb, err := f.get(id)
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return sb.oomKills, nil
}

// Report makes the sandbox's agent report st (its Watch streams send it).
func (sb *FakeSandbox) Report(st *agentv1.StatusResponse) {
	sb.f.mu.Lock()
	defer sb.f.mu.Unlock()
	sb.status = proto.Clone(st).(*agentv1.StatusResponse)
	sb.version++
	close(sb.changed)
	sb.changed = make(chan struct{})
}

// Exit ends the sandbox's container with ex (the first exit wins): Wait returns it, and
// the agent goes away.
func (sb *FakeSandbox) Exit(ex runtime.Exit) {
	sb.f.mu.Lock()
	defer sb.f.mu.Unlock()
	sb.exitLocked(ex, nil)
}

// Lose ends the sandbox's container in a way the backend cannot tell: Wait fails with
// err.
func (sb *FakeSandbox) Lose(err error) {
	sb.f.mu.Lock()
	defer sb.f.mu.Unlock()
	sb.exitLocked(runtime.Exit{}, err)
}

func (sb *FakeSandbox) exitLocked(ex runtime.Exit, waitErr error) {
	select {
	case <-sb.exited:
		return
	default:
	}
	sb.exit, sb.waitErr = ex, waitErr
	close(sb.exited)
	if sb.agent != nil {
		sb.agent.close()
		sb.agent = nil
	}
	for _, fc := range sb.containers {
		if fc.agent != nil {
			fc.agent.close()
			fc.agent = nil
		}
	}
}

// Alive reports whether the sandbox's container still runs.
func (sb *FakeSandbox) Alive() bool {
	select {
	case <-sb.exited:
		return false
	default:
		return true
	}
}

// SetOOMKills sets how many processes the sandbox's memory limit has killed.
func (sb *FakeSandbox) SetOOMKills(n int) {
	sb.f.mu.Lock()
	defer sb.f.mu.Unlock()
	sb.oomKills = n
}

// snapshot is the agent's status now, its version, and what tells of the next change.
func (sb *FakeSandbox) snapshot() (*agentv1.StatusResponse, uint64, <-chan struct{}) {
	sb.f.mu.Lock()
	defer sb.f.mu.Unlock()
	return proto.Clone(sb.status).(*agentv1.StatusResponse), sb.version, sb.changed
}

// fakeAgentServer serves one sandbox's fake agent over in-memory connections.
type fakeAgentServer struct {
	srv *http.Server
	ln  *pipeListener
}

func serveFakeAgent(sb *FakeSandbox, container string) *fakeAgentServer {
	mux := http.NewServeMux()
	mux.Handle(agentv1connect.NewAgentServiceHandler(&fakeAgent{sb: sb, container: container}))
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	s := &fakeAgentServer{
		srv: &http.Server{Handler: mux, Protocols: &protos, HTTP2: agent.HTTP2Config()},
		ln:  &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})},
	}
	go func() { _ = s.srv.Serve(s.ln) }()
	return s
}

func (s *fakeAgentServer) dial(ctx context.Context) (net.Conn, error) {
	client, server := net.Pipe()
	var err error
	select {
	case s.ln.conns <- server:
		return client, nil
	case <-s.ln.closed:
		err = errors.New("dial agent: the agent has exited")
	case <-ctx.Done():
		err = ctx.Err()
	}
	client.Close()
	server.Close()
	return nil, err
}

// close ends the agent: its listener and every connection to it.
func (s *fakeAgentServer) close() { _ = s.srv.Close() }

// pipeListener hands the server ends of net.Pipe connections to an http.Server.
type pipeListener struct {
	conns     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "fake-agent" }

// fakeAgent is the agent of one container of a FakeSandbox: Watch, as the real agent
// serves it (internal/agent), Exec and Logs.
type fakeAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	sb        *FakeSandbox
	container string
}

// Exec answers with the container's name and the command: "<container>: <argv…>".
func (a *fakeAgent) Exec(_ context.Context, req *connect.Request[agentv1.ExecRequest]) (*connect.Response[agentv1.ExecResponse], error) {
	out := a.container + ": " + strings.Join(req.Msg.GetCommand(), " ")
	return connect.NewResponse(&agentv1.ExecResponse{Stdout: []byte(out)}), nil
}

// Logs sends the container's log as one chunk (from the request's offset) and ends, also
// when asked to follow.
func (a *fakeAgent) Logs(_ context.Context, req *connect.Request[agentv1.LogsRequest], stream *connect.ServerStream[agentv1.LogsResponse]) error {
	b := a.sb.log(a.container)
	off := min(req.Msg.GetOffset(), uint64(len(b)))
	if off == uint64(len(b)) {
		return nil
	}
	return stream.Send(&agentv1.LogsResponse{Data: b[off:], Offset: off, NextOffset: uint64(len(b))})
}

func (a *fakeAgent) Watch(ctx context.Context, _ *connect.Request[agentv1.WatchRequest], stream *connect.ServerStream[agentv1.StatusResponse]) error {
	var sent uint64
	for {
		st, ver, changed := a.sb.snapshot()
		if ver != sent {
			if err := stream.Send(st); err != nil {
				return err
			}
			sent = ver
		}
		select {
		case <-changed:
		case <-a.sb.exited:
			return nil
		case <-ctx.Done():
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
}
