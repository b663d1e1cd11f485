package kubernetes

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/logstore"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestContainerStatusesDialsOnlyUnreported: ContainerStatuses asks a sidecar's agent
// only while the kubelet has not reported its container at all; once it has, the Pod's
// view and the agent's watch (agentStatus) stand, and no call dials.
func TestContainerStatusesDialsOnlyUnreported(t *testing.T) {
	var dials atomic.Int32
	b := &Backend{
		cfg: Config{Dial: func(context.Context, string, string) (net.Conn, error) {
			dials.Add(1)
			return nil, errors.New("no gate here")
		}},
		log:       slog.New(slog.DiscardHandler),
		sandboxes: map[string]*sandbox{},
	}
	spec := runtime.Spec{ID: "x", Container: runtime.Container{Name: "app", Image: "i"},
		Sidecars: []runtime.Container{{Name: "db", Image: "i", RestartLimit: runtime.DefaultRestartLimit}}}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	pod := &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.0.0.1", ContainerStatuses: []corev1.ContainerStatus{
		{Name: containerMain, State: running}, {Name: "db", State: running},
	}}}
	s := &sandbox{id: "x", spec: spec, pod: pod, changed: make(chan struct{}), done: make(chan struct{}),
		agentStatus: map[string]*agentv1.StatusResponse{"db": {State: agentv1.MainState_MAIN_STATE_RUNNING, RestartCount: 2}}}
	b.sandboxes["x"] = s
	for range 3 {
		sts, err := b.ContainerStatuses(context.Background(), "x")
		if err != nil {
			t.Fatal(err)
		}
		if len(sts) != 2 || sts[1].Name != "db" || sts[1].State != runtime.ContainerRunning || sts[1].Restarts != 2 {
			t.Fatalf("statuses %+v", sts)
		}
	}
	if n := dials.Load(); n != 0 {
		t.Errorf("a sidecar the kubelet reported: its agent dialled %d times", n)
	}

	// Not reported yet: its agent is asked, through one client.
	b.mu.Lock()
	pod.Status.ContainerStatuses = pod.Status.ContainerStatuses[:1]
	b.mu.Unlock()
	for range 2 {
		if _, err := b.ContainerStatuses(context.Background(), "x"); err != nil {
			t.Fatal(err)
		}
	}
	if dials.Load() == 0 {
		t.Error("a sidecar the kubelet has not reported: its agent was not asked")
	}
	if len(s.statusClients) != 1 {
		t.Errorf("status clients %v, want one", s.statusClients)
	}
}

// TestContainerStatusesFinalFromMessage: a sidecar whose restarts and end no Watch saw
// (its agent was gone before a connection held) is reported from the final status its
// agent left in the container's termination message; a message that is no final status
// leaves the watch's view.
func TestContainerStatusesFinalFromMessage(t *testing.T) {
	b := &Backend{
		cfg: Config{Dial: func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("no gate here")
		}},
		log:       slog.New(slog.DiscardHandler),
		sandboxes: map[string]*sandbox{},
	}
	spec := runtime.Spec{ID: "x", Container: runtime.Container{Name: "app", Image: "i"},
		Sidecars: []runtime.Container{{Name: "db", Image: "i", RestartLimit: 3}}}
	ended := func(msg string) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 7, Reason: "Error", Message: msg}}
	}
	pod := &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.0.0.1", ContainerStatuses: []corev1.ContainerStatus{
		{Name: containerMain, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
		{Name: "db", State: ended(`{"state":"MAIN_STATE_FAILED","exitCode":7,"restartCount":2,"reason":"RestartLimit","message":"main command exited 7; restart limit 2 reached"}`)},
	}}}
	s := &sandbox{id: "x", spec: spec, pod: pod, changed: make(chan struct{}), done: make(chan struct{}),
		agentStatus: map[string]*agentv1.StatusResponse{"db": {State: agentv1.MainState_MAIN_STATE_RESTARTING, RestartCount: 1}}}
	b.sandboxes["x"] = s
	db := func() runtime.ContainerStatus {
		t.Helper()
		sts, err := b.ContainerStatuses(context.Background(), "x")
		if err != nil || len(sts) != 2 {
			t.Fatalf("statuses %+v, %v", sts, err)
		}
		return sts[1]
	}
	if st := db(); st.State != runtime.ContainerExited || st.Restarts != 2 || st.ExitCode == nil || *st.ExitCode != 7 || st.Reason != "RestartLimit" {
		t.Errorf("db from its termination message: %+v, want exited 7 after 2 restarts (RestartLimit)", st)
	}
	// Nothing watched at all: the same.
	s.agentStatus = nil
	if st := db(); st.State != runtime.ContainerExited || st.Restarts != 2 {
		t.Errorf("db, never watched: %+v, want exited after 2 restarts", st)
	}
	// A message that is not a final status (the container wrote its own): the Pod's
	// exit and the watch's count stand.
	s.agentStatus = map[string]*agentv1.StatusResponse{"db": {State: agentv1.MainState_MAIN_STATE_RESTARTING, RestartCount: 1}}
	for _, msg := range []string{`{"state":"MAIN_STATE_RUNNING","restartCount":50}`, "not json", "", "\x1b[2Jescape", strings.Repeat("w", 4000)} {
		pod.Status.ContainerStatuses[1].State = ended(msg)
		if st := db(); st.Restarts != 1 || strings.Contains(st.Message, "MAIN_STATE") || strings.Contains(st.Message, "\x1b") || len(st.Message) > 1024 {
			t.Errorf("message %q: %+v, want the watch's 1 restart and no raw status, escape or long text", msg, st)
		}
	}
	// The workload can write the file too: what it says is held to what an agent could
	// say (a known reason, restarts within the limit, a bounded printable message), and
	// the kubelet's OOMKilled stands over it.
	s.agentStatus = nil
	pod.Status.ContainerStatuses[1].State = ended(`{"state":"MAIN_STATE_COMPLETED","exitCode":0,"restartCount":999,"reason":"Hacked","message":"\u001b[2J` + strings.Repeat("m", 3000) + `"}`)
	if st := db(); st.State != runtime.ContainerExited || st.Restarts != 3 || st.Reason != "Error" || len(st.Message) > 1024 || strings.Contains(st.Message, "\x1b") {
		t.Errorf("forged final status: %+v, want restarts 3 (the limit), reason Error, a clipped printable message", st)
	}
	oom := ended(`{"state":"MAIN_STATE_COMPLETED","exitCode":0,"reason":"Completed"}`)
	oom.Terminated.Reason = "OOMKilled"
	pod.Status.ContainerStatuses[1].State = oom
	if st := db(); st.Reason != "OOMKilled" {
		t.Errorf("a sidecar the kubelet saw OOM-killed: %+v, want OOMKilled", st)
	}
}

// TestLogDirUntracked: a sandbox the backend no longer tracks (a teardown on the
// recovery path) still has its sidecars' log copies archived.
func TestLogDirUntracked(t *testing.T) {
	dir := t.TempDir()
	b := &Backend{cfg: Config{LogDir: dir}, sandboxes: map[string]*sandbox{}}
	if err := os.MkdirAll(filepath.Join(dir, ".containers", "x", "db"), 0o700); err != nil {
		t.Fatal(err)
	}
	for container, want := range map[string]string{
		"":     filepath.Join(dir, "x"),
		"main": filepath.Join(dir, "x"),
		"db":   filepath.Join(dir, ".containers", "x", "db"),
		"../x": "",
		"a/b":  "",
	} {
		if got := b.LogDir("x", container); got != want {
			t.Errorf("LogDir(x, %q) = %q, want %q", container, got, want)
		}
	}
}

// TestOpenContainerLog: an exited sidecar's log is read from the backend's host copy;
// an init container has none (errors.ErrUnsupported, which the runner reports).
func TestOpenContainerLog(t *testing.T) {
	dir := t.TempDir()
	b := &Backend{cfg: Config{LogDir: dir}, sandboxes: map[string]*sandbox{}}
	db := filepath.Join(dir, ".containers", "x", "db")
	if err := os.MkdirAll(db, 0o700); err != nil {
		t.Fatal(err)
	}
	w, err := logstore.Open(db, agentconfig.MainLog)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(logstore.Combined, []byte("db said this\n")); err != nil {
		t.Fatal(err)
	}
	w.Close()
	done := make(chan struct{})
	close(done)
	b.sandboxes["x"] = &sandbox{spec: runtime.Spec{ID: "x", Container: runtime.Container{Name: "app"},
		Sidecars:       []runtime.Container{{Name: "db"}},
		InitContainers: []runtime.Container{{Name: "setup"}}},
		logsDone: map[string]chan struct{}{"db": done}}
	r, err := b.OpenContainerLog("x", "db")
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	if _, err := r.Read(logstore.ReadOptions{}, func(c logstore.Chunk) error { got = append(got, c.Data...); return nil }); err != nil || string(got) != "db said this\n" {
		t.Errorf("log of db: %q %v", got, err)
	}
	r.Close()
	if _, err := b.OpenContainerLog("x", "setup"); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("log of the init container: %v, want errors.ErrUnsupported", err)
	}
}
