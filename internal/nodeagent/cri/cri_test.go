package cri

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// fakeCRI is a CRI runtime service on a real gRPC server: it proves the gogo-generated
// cri-api types go through grpc's codec both ways.
type fakeCRI struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	mu        sync.Mutex
	sandboxes []*runtimeapi.PodSandbox
	memory    map[string]int64 // container ID -> limit
	exited    bool             // every container has exited
	filters   []map[string]string
}

func (f *fakeCRI) ListPodSandbox(_ context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.filters = append(f.filters, req.GetFilter().GetLabelSelector())
	var out []*runtimeapi.PodSandbox
	for _, s := range f.sandboxes {
		ok := true
		for k, v := range req.GetFilter().GetLabelSelector() {
			if s.Labels[k] != v {
				ok = false
			}
		}
		if ok {
			out = append(out, s)
		}
	}
	return &runtimeapi.ListPodSandboxResponse{Items: out}, nil
}

func (f *fakeCRI) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*runtimeapi.Container
	for id := range f.memory {
		st := runtimeapi.ContainerState_CONTAINER_RUNNING
		if f.exited {
			st = runtimeapi.ContainerState_CONTAINER_EXITED
		}
		if want := req.GetFilter().GetState(); want != nil && want.State != st {
			continue
		}
		out = append(out, &runtimeapi.Container{Id: id, PodSandboxId: req.GetFilter().GetPodSandboxId(), State: st})
	}
	return &runtimeapi.ListContainersResponse{Containers: out}, nil
}

func (f *fakeCRI) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{
		Id:        req.ContainerId,
		Resources: &runtimeapi.ContainerResources{Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: f.memory[req.ContainerId]}},
	}}, nil
}

func (f *fakeCRI) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.sandboxes {
		if s.Id == req.PodSandboxId {
			return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: s.Id, State: s.State}}, nil
		}
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{State: runtimeapi.PodSandboxState_SANDBOX_NOTREADY}}, nil
}

func (f *fakeCRI) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "containerd", RuntimeVersion: "v2.test"}, nil
}

// StartFake serves f on a unix socket under dir and returns the endpoint.
func startFake(t *testing.T, f *fakeCRI) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(s, f)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return "unix://" + sock
}

const (
	uid1  = "0b6f1a8e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
	sbxID = "5f0c3a9d2b1e4f6a8c7d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"
)

func goodSandbox() *runtimeapi.PodSandbox {
	return &runtimeapi.PodSandbox{
		Id:             sbxID,
		Metadata:       &runtimeapi.PodSandboxMetadata{Namespace: "sbx", Name: "sbx-abc", Uid: uid1},
		State:          runtimeapi.PodSandboxState_SANDBOX_READY,
		RuntimeHandler: "runsc",
		Labels:         map[string]string{labelPodUID: uid1, LabelRunner: "runner-a", LabelSandbox: "abc"},
	}
}

func goodQuery() Query {
	return Query{Pod: PodRef{Namespace: "sbx", Name: "sbx-abc", UID: uid1}, RunnerID: "runner-a", SandboxID: "abc"}
}

func newResolver(t *testing.T, f *fakeCRI) *Resolver {
	t.Helper()
	r, err := New(Config{Endpoint: startFake(t, f), Namespaces: []string{"sbx", "other"}, RuntimeHandler: "runsc"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestResolverMatch(t *testing.T) {
	f := &fakeCRI{sandboxes: []*runtimeapi.PodSandbox{goodSandbox()}, memory: map[string]int64{"c1": 256 << 20, "c2": 64 << 20}}
	r := newResolver(t, f)
	got, err := r.Sandbox(context.Background(), goodQuery())
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != sbxID || got.MemoryBytes != 320<<20 {
		t.Fatalf("got %+v", got)
	}
	// The request's map went through the codec: the runtime saw the UID selector.
	if len(f.filters) != 1 || f.filters[0][labelPodUID] != uid1 {
		t.Fatalf("filters %v", f.filters)
	}
	running, err := r.Running(context.Background(), sbxID)
	if err != nil || !running {
		t.Fatalf("running %v %v", running, err)
	}
	// Ready sandbox, its containers ended (a checkpoint without leave_running): not running.
	f.mu.Lock()
	f.exited = true
	f.mu.Unlock()
	if running, err := r.Running(context.Background(), sbxID); err != nil || running {
		t.Fatalf("exited containers: running %v %v", running, err)
	}
	f.mu.Lock()
	f.exited = false
	f.mu.Unlock()
	if v, err := r.Version(context.Background()); err != nil || v != "containerd v2.test" {
		t.Fatalf("version %q %v", v, err)
	}
	// A container without a limit: memory unknown.
	f.memory["c3"] = 0
	got, err = r.Sandbox(context.Background(), goodQuery())
	if err != nil || got.MemoryBytes != 0 {
		t.Fatalf("got %+v %v", got, err)
	}
}

func TestResolverRefuses(t *testing.T) {
	other := goodSandbox()
	other.Id = strings.Repeat("a", 64)
	cases := []struct {
		name  string
		edit  func(*runtimeapi.PodSandbox)
		query func(*Query)
		extra []*runtimeapi.PodSandbox
		want  error
	}{
		{name: "wrong uid", query: func(q *Query) { q.Pod.UID = "1b6f1a8e-1c2d-4e5f-8a9b-0c1d2e3f4a5b" }, want: ErrNotFound},
		{name: "wrong name", query: func(q *Query) { q.Pod.Name = "sbx-other" }, want: ErrNotFound},
		{name: "wrong namespace", edit: func(s *runtimeapi.PodSandbox) { s.Metadata.Namespace = "other" }, want: ErrNotFound},
		{name: "namespace not served", query: func(q *Query) { q.Pod.Namespace = "kube-system" }, want: ErrDenied},
		{name: "runc handler", edit: func(s *runtimeapi.PodSandbox) { s.RuntimeHandler = "" }, want: ErrDenied},
		{name: "other handler", edit: func(s *runtimeapi.PodSandbox) { s.RuntimeHandler = "runc" }, want: ErrDenied},
		{name: "other runner", edit: func(s *runtimeapi.PodSandbox) { s.Labels[LabelRunner] = "runner-b" }, want: ErrDenied},
		{name: "no runner label", edit: func(s *runtimeapi.PodSandbox) { delete(s.Labels, LabelRunner) }, want: ErrDenied},
		{name: "other sandbox label", edit: func(s *runtimeapi.PodSandbox) { s.Labels[LabelSandbox] = "xyz" }, want: ErrDenied},
		{name: "caller runner differs", query: func(q *Query) { q.RunnerID = "runner-b" }, want: ErrDenied},
		{name: "not ready", edit: func(s *runtimeapi.PodSandbox) { s.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY }, want: ErrNotReady},
		{name: "two ready", extra: []*runtimeapi.PodSandbox{other}, want: ErrAmbiguous},
		{name: "bad runtime id", edit: func(s *runtimeapi.PodSandbox) { s.Id = "../../etc" }, want: ErrCRI},
		{name: "bad uid syntax", query: func(q *Query) { q.Pod.UID = "../x" }, want: ErrInvalid},
		{name: "bad name syntax", query: func(q *Query) { q.Pod.Name = "A/b" }, want: ErrInvalid},
		{name: "bad sandbox id", query: func(q *Query) { q.SandboxID = "-x" }, want: ErrInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := goodSandbox()
			if c.edit != nil {
				c.edit(s)
			}
			q := goodQuery()
			if c.query != nil {
				c.query(&q)
			}
			r := newResolver(t, &fakeCRI{sandboxes: append([]*runtimeapi.PodSandbox{s}, c.extra...)})
			got, err := r.Sandbox(context.Background(), q)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %+v, %v; want %v", got, err, c.want)
			}
		})
	}
}

// A NotReady sandbox of an earlier attempt next to the ready one is not ambiguous.
func TestResolverOldAttempt(t *testing.T) {
	old := goodSandbox()
	old.Id = strings.Repeat("b", 64)
	old.State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	r := newResolver(t, &fakeCRI{sandboxes: []*runtimeapi.PodSandbox{old, goodSandbox()}})
	got, err := r.Sandbox(context.Background(), goodQuery())
	if err != nil || got.ID != sbxID {
		t.Fatalf("got %+v %v", got, err)
	}
}

func TestResolverConfig(t *testing.T) {
	for _, c := range []Config{
		{Endpoint: "tcp://x", Namespaces: []string{"a"}, RuntimeHandler: "runsc"},
		{Endpoint: "/x.sock", RuntimeHandler: "runsc"},
		{Endpoint: "/x.sock", Namespaces: []string{"A"}, RuntimeHandler: "runsc"},
		{Endpoint: "/x.sock", Namespaces: []string{"a"}},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// The labels checked are the ones the Kubernetes backend puts on sandbox Pods.
func TestLabelsMatchBackend(t *testing.T) {
	if LabelRunner != kubernetes.LabelRunner || LabelSandbox != kubernetes.LabelSandbox {
		t.Fatalf("labels %s %s, backend %s %s", LabelRunner, LabelSandbox, kubernetes.LabelRunner, kubernetes.LabelSandbox)
	}
}
