package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/logstore"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// slowStatusBackend is a Fake whose ContainerStatuses, while block is set, answers only
// when its context ends (an agent that never replies).
type slowStatusBackend struct {
	*runtimetest.Fake
	block atomic.Bool
}

func (b *slowStatusBackend) ContainerStatuses(ctx context.Context, id string) ([]runtime.ContainerStatus, error) {
	if b.block.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return b.Fake.ContainerStatuses(ctx, id)
}

// TestGroupReadsNeverWaitForStatuses: Get and List answer from the statuses the runner
// has, whatever the backend's ContainerStatuses does, and refresh them in the background
// (at most one ask under way per sandbox).
func TestGroupReadsNeverWaitForStatuses(t *testing.T) {
	be := &slowStatusBackend{Fake: runtimetest.NewFake()}
	t.Cleanup(be.Close)
	r, sb := startGroup(t, be)
	other, err := r.Create(context.Background(), CreateRequest{Spec: groupSpec()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.Agent(ctx, other.ID, ""); err != nil {
		t.Fatal(err)
	}
	eventually(t, "statuses known", func() bool {
		got, _ := r.Get(sb.ID)
		return len(got.Containers) == 3
	})

	be.block.Store(true)
	time.Sleep(containerStatusEvery + 100*time.Millisecond) // a refresh is due
	start := time.Now()
	for range 20 {
		got, err := r.Get(sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Containers) != 3 {
			t.Errorf("Get while the backend hangs: containers %+v, want the last known", got.Containers)
		}
		if len(r.List()) != 2 {
			t.Fatal("List lost a sandbox")
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("40 reads took %v while ContainerStatuses hung", d)
	}

	// Once the backend answers again, the reads show what changed.
	be.block.Store(false)
	code := int32(2)
	be.Sandbox(sb.ID, time.Second).SetContainer(runtime.ContainerStatus{Name: "db", State: runtime.ContainerExited, ExitCode: &code, Reason: "Error"})
	eventually(t, "db exited in Get", func() bool {
		got, _ := r.Get(sb.ID)
		return len(got.Containers) == 3 && got.Containers[2].State == runtime.ContainerExited
	})
}

// TestGroupLogsOfExitedContainer: the log of an init container, or of a sidecar that
// exited, while the sandbox runs is refused at once FAILED_PRECONDITION
// SANDBOX_NOT_RUNNING naming the container and when its log is readable.
func TestGroupLogsOfExitedContainer(t *testing.T) {
	be := runtimetest.NewFake()
	t.Cleanup(be.Close)
	r, sb := startGroup(t, be)
	check := func(name string) {
		t.Helper()
		start := time.Now()
		_, err := readAll(t, r, sb.ID, name)
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Errorf("log of %s: answered after %v", name, d)
		}
		var cnr *ContainerNotRunningError
		if !errors.As(err, &cnr) || cnr.Container != name || !errors.Is(err, ErrNotRunning) {
			t.Fatalf("log of %s: %v", name, err)
		}
		api := APIError(sb.ID, err, SpecField)
		if connect.CodeOf(api) != connect.CodeFailedPrecondition || apierr.Reason(api) != apierr.SandboxNotRunning ||
			!strings.Contains(api.Error(), `"`+name+`"`) || !strings.Contains(api.Error(), "once the sandbox has ended") {
			t.Errorf("log of %s on the API: %v (reason %q)", name, api, apierr.Reason(api))
		}
	}
	check("setup")

	code := int32(1)
	be.Sandbox(sb.ID, time.Second).SetContainer(runtime.ContainerStatus{Name: "db", State: runtime.ContainerExited, ExitCode: &code, Reason: "Error"})
	eventually(t, "db exited", func() bool {
		got, _ := r.Get(sb.ID)
		return len(got.Containers) == 3 && got.Containers[2].State == runtime.ContainerExited
	})
	check("db")
}

// credsBackend is a Fake that records the pull credentials of each container of the
// specs Create gets.
type credsBackend struct {
	*runtimetest.Fake
	mu  sync.Mutex
	got map[string]string // container name: username
}

func (b *credsBackend) Create(ctx context.Context, spec *runtime.Spec) (runtime.Info, error) {
	b.mu.Lock()
	for _, c := range spec.AllContainers() {
		if c.PullCredentials != nil {
			b.got[c.ContainerName()] = c.PullCredentials.Username + ":" + c.PullCredentials.Password
		}
	}
	if spec.Engine != nil {
		for img, c := range spec.Engine.PullCredentials {
			b.got["engine "+img] = c.Username + ":" + c.Password
		}
	}
	b.mu.Unlock()
	return b.Fake.Create(ctx, spec)
}

// TestEnginePullCredentialsNeverKept: a container-engine sandbox's per-image pull
// credentials reach the backend's Create, and no snapshot carries them.
func TestEnginePullCredentialsNeverKept(t *testing.T) {
	be := &credsBackend{Fake: runtimetest.NewFake(), got: map[string]string{}}
	t.Cleanup(be.Close)
	r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	spec := runtime.Spec{Container: runtime.Container{Name: runtime.EngineContainerName, Image: "engine:1"},
		Engine: &runtime.Engine{Compose: []byte("services: {}"), Project: "sandbox", Images: []string{"reg.test/org/app:t", "busybox"},
			PullCredentials: map[string]*runtime.Credentials{"reg.test/org/app:t": {Username: "u", Password: "tok"}}}}
	sb, err := r.Create(context.Background(), CreateRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the backend's create", func() bool {
		be.mu.Lock()
		defer be.mu.Unlock()
		return be.got["engine reg.test/org/app:t"] == "u:tok"
	})
	g, err := r.Get(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append([]Sandbox{sb, g}, r.List()...) {
		if s.Spec.Engine == nil || s.Spec.Engine.PullCredentials != nil {
			t.Errorf("snapshot of %s: engine %+v keeps its credentials (or lost the engine)", s.ID, s.Spec.Engine)
		}
	}
	if spec.Engine.PullCredentials == nil {
		t.Error("Create cleared its caller's credentials")
	}
}

// TestGroupPullCredentialsNeverKept: every container's pull credentials reach the
// backend's Create, and no snapshot (Create's, Get's, List's) carries any of them.
func TestGroupPullCredentialsNeverKept(t *testing.T) {
	be := &credsBackend{Fake: runtimetest.NewFake(), got: map[string]string{}}
	t.Cleanup(be.Close)
	r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	spec := groupSpec()
	spec.PullCredentials = &runtime.Credentials{Username: "u-app", Password: "p-app"}
	spec.Sidecars[0].PullCredentials = &runtime.Credentials{Username: "u-db", Password: "p-db"}
	spec.InitContainers[0].PullCredentials = &runtime.Credentials{Username: "u-setup", Password: "p-setup"}
	sb, err := r.Create(context.Background(), CreateRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.Agent(ctx, sb.ID, ""); err != nil {
		t.Fatal(err)
	}
	be.mu.Lock()
	got := len(be.got)
	want := map[string]string{"app": "u-app:p-app", "db": "u-db:p-db", "setup": "u-setup:p-setup"}
	for k, v := range want {
		if be.got[k] != v {
			t.Errorf("Create got credentials %q for %s, want %q", be.got[k], k, v)
		}
	}
	be.mu.Unlock()
	if got != 3 {
		t.Errorf("Create got credentials for %d containers, want 3", got)
	}
	g, err := r.Get(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	snaps := append([]Sandbox{sb, g}, r.List()...)
	for _, s := range snaps {
		for _, c := range s.Spec.AllContainers() {
			if c.PullCredentials != nil {
				t.Errorf("snapshot of %s keeps the credentials of %s", s.ID, c.ContainerName())
			}
		}
	}
	// The caller's spec keeps its own.
	if spec.Sidecars[0].PullCredentials == nil || spec.InitContainers[0].PullCredentials == nil {
		t.Error("Create cleared its caller's credentials")
	}
}

// openerBackend is a Fake whose exited containers' logs are under root/<name> (what the
// container left, beneath a dir the backend trusts), opened as the local backend does.
type openerBackend struct {
	*runtimetest.Fake
	root string
	none string // a container whose log it does not keep (errors.ErrUnsupported)
}

var _ runtime.ContainerLogOpener = (*openerBackend)(nil)

func (b *openerBackend) OpenContainerLog(_, container string) (*logstore.Reader, error) {
	if container == b.none {
		return nil, fmt.Errorf("%w: no copy", errors.ErrUnsupported)
	}
	return logstore.OpenReaderBeneath(b.root, container, "main")
}

// TestGroupLogsOfExitedContainerNotKept: a container whose log its backend does not
// keep (Kubernetes: an init container) is refused as before, FAILED_PRECONDITION
// naming it.
func TestGroupLogsOfExitedContainerNotKept(t *testing.T) {
	be := &openerBackend{Fake: runtimetest.NewFake(), root: t.TempDir(), none: "setup"}
	t.Cleanup(be.Close)
	r, sb := startGroup(t, be)
	_, err := readAll(t, r, sb.ID, "setup")
	var cnr *ContainerNotRunningError
	if !errors.As(err, &cnr) || cnr.Container != "setup" || !cnr.Logs {
		t.Errorf("log of an init container its backend keeps no log of: %v", err)
	}
}

// TestGroupLogsOfExitedContainerRead: with a backend that keeps them, the logs of an
// init container and of a sidecar that exited are read at once while the sandbox runs;
// one whose log dir the container replaced by a symlink (to another sandbox's log) is
// an error, never the other log.
func TestGroupLogsOfExitedContainerRead(t *testing.T) {
	root, victim := t.TempDir(), t.TempDir()
	writeLog(t, victim, "victim secret\n")
	for _, name := range []string{"setup", "db"} {
		if err := os.Mkdir(filepath.Join(root, name), 0o700); err != nil {
			t.Fatal(err)
		}
		writeLog(t, filepath.Join(root, name), name+" said this\n")
	}
	be := &openerBackend{Fake: runtimetest.NewFake(), root: root}
	t.Cleanup(be.Close)
	r, sb := startGroup(t, be)
	read := func(name string) (string, error) {
		t.Helper()
		start := time.Now()
		got, err := readAll(t, r, sb.ID, name)
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Errorf("log of %s: answered after %v", name, d)
		}
		return got, err
	}
	if got, err := read("setup"); err != nil || got != "setup said this\n" {
		t.Errorf("log of the init container: %q %v", got, err)
	}
	code := int32(1)
	be.Sandbox(sb.ID, time.Second).SetContainer(runtime.ContainerStatus{Name: "db", State: runtime.ContainerExited, ExitCode: &code, Reason: "Error"})
	eventually(t, "db exited", func() bool {
		got, _ := r.Get(sb.ID)
		return len(got.Containers) == 3 && got.Containers[2].State == runtime.ContainerExited
	})
	if got, err := read("db"); err != nil || got != "db said this\n" {
		t.Errorf("log of the exited sidecar: %q %v", got, err)
	}

	// The sidecar swapped its log dir before it exited.
	db := filepath.Join(root, "db")
	if err := os.Rename(db, db+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, db); err != nil {
		t.Fatal(err)
	}
	got, err := read("db")
	if strings.Contains(got, "victim") || err == nil {
		t.Fatalf("log of a sidecar whose log dir is a symlink: %q %v, want an error and nothing of the other log", got, err)
	}
	// On the API: FAILED_PRECONDITION naming the container, and no host path.
	api := APIError(sb.ID, err, SpecField)
	if connect.CodeOf(api) != connect.CodeFailedPrecondition || apierr.Reason(api) != apierr.FileNotRegular ||
		!strings.Contains(api.Error(), `"db"`) || strings.Contains(api.Error(), root) {
		t.Errorf("replaced log dir on the API: %v (reason %q)", api, apierr.Reason(api))
	}
}
