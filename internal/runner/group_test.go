package runner

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/logstore"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
	"github.com/sandboxd/sandboxd/internal/runtime/startseq"
)

// groupSpec is a sandbox of three containers: init "setup", primary "app", sidecar "db".
func groupSpec() runtime.Spec {
	return runtime.Spec{
		Container:      runtime.Container{Name: "app", Image: "busybox"},
		Sidecars:       []runtime.Container{{Name: "db", Image: "redis"}},
		InitContainers: []runtime.Container{{Name: "setup", Image: "busybox"}},
	}
}

// startGroup creates groupSpec on a runner over be and waits for it to run.
func startGroup(t *testing.T, be runtime.Backend) (*Runner, Sandbox) {
	t.Helper()
	r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	sb, err := r.Create(context.Background(), CreateRequest{Spec: groupSpec()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.Agent(ctx, sb.ID, ""); err != nil {
		t.Fatal(err)
	}
	return r, sb
}

func execIn(t *testing.T, r *Runner, id, container string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := r.Agent(ctx, id, container)
	if err != nil {
		return "", err
	}
	res, err := a.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: []string{"echo", "hi"}}))
	if err != nil {
		return "", err
	}
	return string(res.Msg.GetStdout()), nil
}

// eventually polls cond for up to 10 s (container statuses are asked of the backend at
// most once a second).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10 s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestGroupRouting: Agent reaches the agent of the container named ("" and the primary's
// name: the primary); a name the spec lacks is a ContainerNotFoundError, on the API
// NOT_FOUND CWSANDBOX_CONTAINER_NOT_FOUND with the name in the metadata; an init
// container, and a sidecar once it exited, are not running (FAILED_PRECONDITION).
func TestGroupRouting(t *testing.T) {
	be := runtimetest.NewFake()
	t.Cleanup(be.Close)
	r, sb := startGroup(t, be)
	for container, want := range map[string]string{"": "app: echo hi", "app": "app: echo hi", "db": "db: echo hi"} {
		if got, err := execIn(t, r, sb.ID, container); err != nil || got != want {
			t.Errorf("exec in %q: %q %v, want %q", container, got, err, want)
		}
	}

	_, err := execIn(t, r, sb.ID, "nope")
	var cnf *ContainerNotFoundError
	if !errors.As(err, &cnf) || cnf.Container != "nope" || !errors.Is(err, runtime.ErrContainerNotFound) || errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("exec in an unknown container: %v", err)
	}
	api := APIError(sb.ID, err, SpecField)
	if connect.CodeOf(api) != connect.CodeNotFound || apierr.Reason(api) != apierr.ContainerNotFound || apierr.Info(api).GetMetadata()["container"] != "nope" {
		t.Errorf("unknown container on the API: %v (reason %q, metadata %v)", api, apierr.Reason(api), apierr.Info(api).GetMetadata())
	}
	// "main" names the unnamed primary only: this one is called app.
	if _, err := execIn(t, r, sb.ID, "main"); !errors.As(err, &cnf) {
		t.Errorf("exec in main of a sandbox whose primary is app: %v", err)
	}

	_, err = execIn(t, r, sb.ID, "setup")
	var cnr *ContainerNotRunningError
	if !errors.As(err, &cnr) || !errors.Is(err, ErrNotRunning) {
		t.Fatalf("exec in the init container: %v", err)
	}
	if api := APIError(sb.ID, err, SpecField); connect.CodeOf(api) != connect.CodeFailedPrecondition || !strings.Contains(api.Error(), `"setup"`) {
		t.Errorf("init container on the API: %v", api)
	}

	code := int32(1)
	be.Sandbox(sb.ID, time.Second).SetContainer(runtime.ContainerStatus{Name: "db", State: runtime.ContainerExited, ExitCode: &code, Reason: "Error"})
	eventually(t, "db reported not running", func() bool {
		_, err := execIn(t, r, sb.ID, "db")
		return errors.As(err, &cnr) && cnr.Container == "db"
	})
	if got, err := execIn(t, r, sb.ID, ""); err != nil || got != "app: echo hi" {
		t.Errorf("exec in the primary once a sidecar exited: %q %v", got, err)
	}
}

// TestGroupStatuses: Get and List show every container's state, exit code and restarts
// as the backend reports them, kept current, and asked of the backend at a bounded rate.
func TestGroupStatuses(t *testing.T) {
	be := runtimetest.NewFake()
	t.Cleanup(be.Close)
	r, sb := startGroup(t, be)
	got, err := r.Get(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range got.Containers {
		names = append(names, c.Name+"="+c.State)
	}
	if want := "setup=exited app=running db=running"; strings.Join(names, " ") != want {
		t.Fatalf("containers %q, want %q", names, want)
	}
	if c := got.Containers[0]; !c.Init || c.ExitCode == nil || *c.ExitCode != 0 {
		t.Errorf("init container: %+v", c)
	}

	code := int32(3)
	be.Sandbox(sb.ID, time.Second).SetContainer(runtime.ContainerStatus{Name: "db", State: runtime.ContainerRunning, Restarts: 2, ExitCode: &code, Reason: "Error"})
	eventually(t, "db's restarts in List", func() bool {
		for _, s := range r.List() {
			if s.ID == sb.ID && len(s.Containers) == 3 {
				c := s.Containers[2]
				return c.Restarts == 2 && c.ExitCode != nil && *c.ExitCode == 3
			}
		}
		return false
	})

	// Many reads in a short time ask the backend a few times, not once per read.
	before := be.Calls().ContainerStatuses
	for range 200 {
		if _, err := r.Get(sb.ID); err != nil {
			t.Fatal(err)
		}
		r.List()
	}
	if n := be.Calls().ContainerStatuses - before; n > 5 {
		t.Errorf("400 reads asked the backend %d times", n)
	}

	// A single-container sandbox has none.
	single, err := r.Create(context.Background(), CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox"}}})
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := r.Get(single.ID); s.Containers != nil {
		t.Errorf("single-container sandbox: containers %+v", s.Containers)
	}

	// The last statuses stay once the sandbox ended.
	if _, err := r.Delete(sb.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	end, err := r.WaitTerminal(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(end.Containers) != 3 || end.Containers[1].State != runtime.ContainerExited {
		t.Errorf("statuses of the ended sandbox: %+v", end.Containers)
	}
}

// groupLogBackend is a Fake whose sandboxes keep each container's logs in dirs[name]
// (the primary's under "").
type groupLogBackend struct {
	*runtimetest.Fake
	dirs map[string]string
}

var _ runtime.LogDirProvider = (*groupLogBackend)(nil)

func (b *groupLogBackend) LogDir(_, container string) string { return b.dirs[container] }

func writeLog(t *testing.T, dir, line string) {
	t.Helper()
	w, err := logstore.Open(dir, "main")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write(logstore.Combined, []byte(line)); err != nil {
		t.Fatal(err)
	}
}

func readAll(t *testing.T, r *Runner, id, container string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	err := r.Logs(ctx, id, container, &agentv1.LogsRequest{}, func(m *agentv1.LogsResponse) error { b.Write(m.GetData()); return nil })
	return b.String(), err
}

// TestGroupLogs: Logs reads the log of the container named, from its agent while the
// sandbox runs and from the runner's archive once it ended; the archive holds every
// container's log, each in its own dir, and a container whose log dir was replaced (a
// symlink to another sandbox's logs) archives nothing.
func TestGroupLogs(t *testing.T) {
	victim := t.TempDir()
	writeLog(t, victim, "victim secret\n")
	swapped := filepath.Join(t.TempDir(), "logs")
	if err := os.Symlink(victim, swapped); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{"": t.TempDir(), "db": t.TempDir(), "setup": swapped}
	writeLog(t, dirs[""], "app archived\n")
	writeLog(t, dirs["db"], "db archived\n")
	be := &groupLogBackend{Fake: runtimetest.NewFake(), dirs: dirs}
	t.Cleanup(be.Close)
	r, sb := startGroup(t, be)
	fs := be.Sandbox(sb.ID, time.Second)
	fs.WriteLog("", []byte("app live\n"))
	fs.WriteLog("db", []byte("db live\n"))
	for container, want := range map[string]string{"": "app live\n", "app": "app live\n", "db": "db live\n"} {
		if got, err := readAll(t, r, sb.ID, container); err != nil || got != want {
			t.Errorf("live log of %q: %q %v, want %q", container, got, err, want)
		}
	}
	var cnf *ContainerNotFoundError
	if _, err := readAll(t, r, sb.ID, "nope"); !errors.As(err, &cnf) {
		t.Errorf("log of an unknown container: %v", err)
	}

	fs.Exit(runtime.Exit{Reason: ReasonCompleted, At: time.Now()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.WaitTerminal(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	for container, want := range map[string]string{"": "app archived\n", "db": "db archived\n", "setup": ""} {
		if got, err := readAll(t, r, sb.ID, container); err != nil || got != want {
			t.Errorf("archived log of %q: %q %v, want %q", container, got, err, want)
		}
	}
	if _, err := readAll(t, r, sb.ID, "nope"); !errors.As(err, &cnf) {
		t.Errorf("log of an unknown container of an ended sandbox: %v", err)
	}
	dir, err := r.LogDir(sb.ID, "db")
	if err != nil || dir != filepath.Join(r.cfg.DataDir, containerLogs, sb.ID, "db") {
		t.Errorf("LogDir of db: %q %v", dir, err)
	}
	if _, err := os.Lstat(filepath.Join(r.cfg.DataDir, containerLogs, sb.ID, "setup")); err == nil {
		t.Errorf("a replaced log dir was archived")
	}
}

// TestGroupAdmissionBySum: a runner admits a sandbox by the sum of its containers'
// requests (each completed with the runner's defaults), so two containers that fit
// one by one do not fit together.
func TestGroupAdmissionBySum(t *testing.T) {
	l := idleRunner(t, 1000)
	l.CPUOvercommit = 1
	half := runtime.Resources{RequestMilliCPU: 600, MilliCPU: 600}
	spec := runtime.Spec{
		Container: runtime.Container{Name: "app", Image: "busybox", Resources: half},
		Sidecars:  []runtime.Container{{Name: "db", Image: "redis", Resources: half}},
	}
	_, err := l.Create(context.Background(), CreateRequest{Spec: spec})
	if apierr.Reason(err) != apierr.NoSuitableRunner {
		t.Fatalf("1200m on a 1000m runner: %v, want %s", err, apierr.NoSuitableRunner)
	}
	// A sidecar that asks for nothing gets the runner's defaults (100m), and the sum fits.
	spec.Sidecars[0].Resources = runtime.Resources{}
	sb, err := l.Create(context.Background(), CreateRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	side := sb.Spec.Sidecars[0]
	if side.Resources.RequestMilliCPU != DefaultResources.RequestMilliCPU || side.Resources.Pids != runtime.DefaultPidsLimit || side.RestartLimit != runtime.DefaultRestartLimit {
		t.Errorf("sidecar defaults: %+v restart limit %d", side.Resources, side.RestartLimit)
	}
	c, err := l.Capacity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c.UsedMilliCPU != 700 {
		t.Errorf("used %dm, want 700m (600m + the sidecar's default 100m)", c.UsedMilliCPU)
	}
}

// TestGroupValidation: the runner's own validation covers every container, naming it.
func TestGroupValidation(t *testing.T) {
	spec := groupSpec()
	spec.Sidecars[0].Image = ""
	spec.Sidecars[0].Resources.MilliCPU = -1
	spec.InitContainers[0].Command = "a\x00b"
	err := validate(&CreateRequest{Spec: spec})
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("validate: %v", err)
	}
	var fields []string
	for _, v := range verr.Violations {
		fields = append(fields, v.Field)
	}
	want := "spec.init_containers[0].command spec.containers[1].image spec.containers[1].resources.cpu"
	if strings.Join(fields, " ") != want {
		t.Errorf("fields %q, want %q", fields, want)
	}
	// The group's own rules: a dependency on a container that is not there.
	spec = groupSpec()
	spec.Sidecars[0].DependsOn = []runtime.Dependency{{Container: "ghost", Condition: runtime.ConditionStarted}}
	if err := validate(&CreateRequest{Spec: spec}); !errors.As(err, &verr) || !strings.Contains(err.Error(), "ghost") {
		t.Errorf("a dependency on no container: %v", err)
	}
}

// TestGroupCreateFailureNamesContainer: a Create that fails because of one container (a
// startseq.Failure) fails the sandbox with that failure's reason and the container's
// name in its message.
func TestGroupCreateFailureNamesContainer(t *testing.T) {
	be := runtimetest.NewFake()
	t.Cleanup(be.Close)
	be.OnCreate = func(context.Context, *runtimetest.FakeSandbox) error {
		return &startseq.Failure{Container: "db", Reason: startseq.ReasonProbeFailed, Message: "startup probe failed 30 times"}
	}
	r, err := New(context.Background(), Config{Backend: be, DataDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	sb, err := r.Create(context.Background(), CreateRequest{Spec: groupSpec()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	end, err := r.WaitTerminal(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if end.State != StateFailed || end.Reason != startseq.ReasonProbeFailed || !strings.Contains(end.Message, `"db"`) {
		t.Errorf("ended %s %s %q", end.State, end.Reason, end.Message)
	}
}

// FuzzContainerNames: whatever container name the runner's validation accepts in a spec
// (the only names that reach a path: archived logs) names a single directory right
// under the sandbox's container-logs dir, and a name the spec lacks resolves to nothing.
func FuzzContainerNames(f *testing.F) {
	for _, s := range []string{"db", "..", "a/b", "", "main", "App", "x\x00", strings.Repeat("a", 64), "-a", "a-b"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, name, asked string) {
		spec := runtime.Spec{ID: "sb1", Container: runtime.Container{Name: "app", Image: "busybox"},
			Sidecars: []runtime.Container{{Name: name, Image: "redis"}}}
		if validate(&CreateRequest{Spec: spec}) != nil {
			return
		}
		r := &Runner{cfg: Config{DataDir: "/data"}}
		dir := r.archiveDir("sb1", name, false)
		if filepath.Dir(dir) != "/data/"+containerLogs+"/sb1" || filepath.Base(dir) != name {
			t.Fatalf("accepted container name %q archives to %q", name, dir)
		}
		e := newEntry(Sandbox{ID: "sb1", Spec: spec})
		got, primary, _, err := e.container(asked)
		switch c, _ := spec.Find(asked); {
		case c == nil && err == nil:
			t.Fatalf("%q resolved to %q in a spec without it", asked, got)
		case c != nil && (err != nil || got != c.ContainerName() || primary != (c == &spec.Container)):
			t.Fatalf("%q resolved to %q %v %v", asked, got, primary, err)
		}
	})
}
