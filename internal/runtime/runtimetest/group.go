package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/startseq"
)

// The group tests (multi-container sandboxes) run when Options.SecondImage is set: a
// backend opts in by naming an image other than Image that has python3 and /bin/sh.

// groupTests are Run's tests of multi-container sandboxes.
var groupTests = []struct {
	name string
	fn   func(*testing.T, *suite)
}{
	{"GroupLocalhost", testGroupLocalhost},
	{"GroupPrimaryExit", testGroupPrimaryExit},
	{"GroupSidecarRestarts", testGroupSidecarRestarts},
	{"GroupInitContainers", testGroupInitContainers},
	{"GroupDependsOn", testGroupDependsOn},
	{"GroupRecover", testGroupRecover},
}

// group is a spec of the suite's image running argv as its primary "app", with a
// shared volume "shared" at /data in every container the test adds with side.
func (s *suite) group(prefix string, argv ...string) runtime.Spec {
	sp := s.spec(prefix, argv...)
	sp.Name = "app"
	sp.Volumes = []runtime.Volume{{Name: "shared"}}
	sp.VolumeMounts = []runtime.VolumeMount{{Volume: "shared", Path: "/data"}}
	return sp
}

// side is a container called name of image running argv, with the shared volume.
func side(name, image string, argv ...string) runtime.Container {
	c := runtime.Container{Name: name, Image: image, VolumeMounts: []runtime.VolumeMount{{Volume: "shared", Path: "/data"}}}
	if len(argv) > 0 {
		c.Command, c.Args = argv[0], argv[1:]
	}
	return c
}

// agentIn is a client of container name's agent in sandbox id.
func agentIn(b runtime.Backend, id, name string) agentv1connect.AgentServiceClient {
	return agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.DialAgent(ctx, id, name) })
}

// execInC runs argv in container name of sandbox id: stdout, exit code.
func execInC(t *testing.T, b runtime.Backend, id, name string, argv ...string) (string, int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := agentIn(b, id, name).Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: argv}))
	if err != nil {
		t.Fatalf("exec %q in %s/%s: %v", argv, id, name, err)
	}
	return string(res.Msg.GetStdout()), res.Msg.GetExitCode()
}

// statuses returns sandbox id's container statuses by name (the backend must report them).
func statuses(t *testing.T, b runtime.Backend, id string) map[string]runtime.ContainerStatus {
	t.Helper()
	r, ok := b.(runtime.ContainerStatusReporter)
	if !ok {
		t.Fatalf("%T reports no container statuses", b)
	}
	sts, err := r.ContainerStatuses(context.Background(), id)
	if err != nil {
		t.Fatalf("container statuses of %s: %v", id, err)
	}
	out := map[string]runtime.ContainerStatus{}
	for _, st := range sts {
		out[st.Name] = st
	}
	return out
}

// eventually retries check until it returns "" or d has passed; the last complaint fails t.
func eventually(t *testing.T, d time.Duration, check func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		msg := check()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// testGroupLocalhost: two containers from two images share the network (a server in
// one is reached from the other on localhost and by a host alias), the hostname and the
// volumes; each has its own root filesystem, environment and files; named execs reach
// each container; an unknown name is ErrContainerNotFound; Destroy leaves nothing.
func testGroupLocalhost(t *testing.T, s *suite) {
	b := s.newBackend(t)
	spec := s.group("grp", "sleep", "3600")
	spec.Env = map[string]string{"WHO": "app"}
	spec.Files = []runtime.File{{Path: "/etc/app.txt", Content: []byte("app-file")}}
	web := side("web", s.opts.SecondImage, "python3", "-m", "http.server", "8080", "--bind", "127.0.0.1", "--directory", "/data")
	web.Env = map[string]string{"WHO": "web"}
	web.Files = []runtime.File{{Path: "/tmp/web.txt", Content: []byte("web-file")}}
	spec.Sidecars = []runtime.Container{web}
	spec.HostAliases = []string{"web"}
	s.create(t, b, spec)

	if out, c := execInC(t, b, spec.ID, "app", "sh", "-c", "echo shared-data > /data/index.txt"); c != 0 {
		t.Fatalf("write to the shared volume: %q, exit %d", out, c)
	}
	for _, host := range []string{"127.0.0.1", "localhost", "web"} {
		eventually(t, 30*time.Second, func() string {
			out, c := execInC(t, b, spec.ID, "app", "wget", "-q", "-O", "-", "http://"+host+":8080/index.txt")
			if c != 0 || out != "shared-data\n" {
				return "wget from app to web's server at " + host + ": " + out
			}
			return ""
		})
	}
	for name, want := range map[string]string{"app": "app", "web": "web"} {
		if out, c := execInC(t, b, spec.ID, name, "sh", "-c", "echo $WHO"); c != 0 || out != want+"\n" {
			t.Errorf("WHO in %s: %q (exit %d), want %q", name, out, c, want)
		}
	}
	if out, c := execInC(t, b, spec.ID, "", "cat", "/etc/app.txt"); c != 0 || out != "app-file" {
		t.Errorf("app's file through the default container: %q (exit %d)", out, c)
	}
	if out, c := execInC(t, b, spec.ID, "web", "cat", "/tmp/web.txt"); c != 0 || out != "web-file" {
		t.Errorf("web's file: %q (exit %d)", out, c)
	}
	if _, c := execInC(t, b, spec.ID, "web", "test", "-e", "/etc/app.txt"); c == 0 {
		t.Errorf("web sees app's file: the root filesystems are not the containers' own")
	}
	if _, c := execInC(t, b, spec.ID, "web", "python3", "-c", "print(1)"); c != 0 {
		t.Errorf("python3 in web (its image): exit %d", c)
	}
	h1, _ := execInC(t, b, spec.ID, "app", "hostname")
	h2, _ := execInC(t, b, spec.ID, "web", "hostname")
	if h1 != h2 || h1 == "" {
		t.Errorf("hostnames %q and %q: want one", h1, h2)
	}
	sts := statuses(t, b, spec.ID)
	if len(sts) != 2 || sts["app"].State != runtime.ContainerRunning || sts["web"].State != runtime.ContainerRunning {
		t.Errorf("statuses %+v: want app and web running", sts)
	}
	_, err := b.DialAgent(context.Background(), spec.ID, "nope")
	if !errors.Is(err, runtime.ErrContainerNotFound) {
		t.Errorf("dial container nope: %v, want ErrContainerNotFound", err)
	}
	s.destroy(t, b, spec.ID)
	if err := b.Destroy(context.Background(), spec.ID); err != nil {
		t.Errorf("second destroy: %v", err)
	}
}

// testGroupPrimaryExit: the primary's exit ends the sandbox with its exit code, and the
// other containers are stopped.
func testGroupPrimaryExit(t *testing.T, s *suite) {
	b := s.newBackend(t)
	spec := s.group("gexit", "sh", "-c", "sleep 1; exit 3")
	spec.Sidecars = []runtime.Container{side("idle", s.opts.SecondImage, "sleep", "3600")}
	s.create(t, b, spec)
	ex := wait(t, b, spec.ID)
	if ex.ExitCode == nil || *ex.ExitCode != 3 {
		t.Fatalf("exit %+v (code %v), want the primary's 3", ex, code(ex.ExitCode))
	}
	sts := statuses(t, b, spec.ID)
	if st := sts["idle"]; st.State != runtime.ContainerExited {
		t.Errorf("sidecar after the primary ended: %+v, want exited", st)
	}
	if st := sts["app"]; st.State != runtime.ContainerExited || st.ExitCode == nil || *st.ExitCode != 3 {
		t.Errorf("primary: %+v, want exited 3", st)
	}
	s.destroy(t, b, spec.ID)
}

// testGroupSidecarRestarts: a sidecar that exits non-zero is restarted within its limit
// and then stays exited, while the sandbox runs on.
func testGroupSidecarRestarts(t *testing.T, s *suite) {
	b := s.newBackend(t)
	spec := s.group("grst", "sleep", "3600")
	flaky := side("flaky", s.opts.SecondImage, "sh", "-c", "echo x >> /data/runs; exit 7")
	flaky.RestartLimit = 2
	spec.Sidecars = []runtime.Container{flaky}
	s.create(t, b, spec)
	// A bound, not a speed: on a Kubernetes runner the suite's subtests start their Pods
	// at once on CI's 2 cores, and the sidecar's three runs (its agent restarts it, with
	// backoff) once took over 30 s there.
	eventually(t, 90*time.Second, func() string {
		st := statuses(t, b, spec.ID)["flaky"]
		if st.State != runtime.ContainerExited || st.Restarts != 2 || st.ExitCode == nil || *st.ExitCode != 7 {
			return fmt.Sprintf("flaky sidecar: %s, exit %v, %d restarts, %s %q; want exited 7 after 2 restarts",
				st.State, code(st.ExitCode), st.Restarts, st.Reason, st.Message)
		}
		return ""
	})
	if out, _ := execInC(t, b, spec.ID, "app", "cat", "/data/runs"); out != "x\nx\nx\n" {
		t.Errorf("flaky ran %q, want 3 times", out)
	}
	if st := statuses(t, b, spec.ID)["app"]; st.State != runtime.ContainerRunning {
		t.Errorf("primary after its sidecar failed: %+v, want running", st)
	}
	s.destroy(t, b, spec.ID)
}

// testGroupInitContainers: init containers run one by one, to exit 0, before the others;
// a failing one fails Create, naming it, and leaves nothing behind.
func testGroupInitContainers(t *testing.T, s *suite) {
	b := s.newBackend(t)
	spec := s.group("ginit", "sleep", "3600")
	spec.InitContainers = []runtime.Container{
		side("first", s.opts.SecondImage, "sh", "-c", "sleep 0.3; echo 1 >> /data/order"),
		side("second", s.opts.Image, "sh", "-c", "echo 2 >> /data/order"),
	}
	spec.Sidecars = []runtime.Container{side("late", s.opts.Image, "sh", "-c", "echo 3 >> /data/order; sleep 3600")}
	s.create(t, b, spec)
	// The init containers are done when Create returns; the sidecar is started, and
	// writes soon after.
	if out, _ := execInC(t, b, spec.ID, "app", "cat", "/data/order"); !strings.HasPrefix(out, "1\n2\n") {
		t.Errorf("order %q when Create returned, want both init containers done, in order", out)
	}
	eventually(t, 10*time.Second, func() string {
		if out, _ := execInC(t, b, spec.ID, "app", "cat", "/data/order"); out != "1\n2\n3\n" {
			return fmt.Sprintf("order %q, want init containers first, in order, then the sidecar", out)
		}
		return ""
	})
	sts := statuses(t, b, spec.ID)
	if st := sts["first"]; !st.Init || st.State != runtime.ContainerExited || st.ExitCode == nil || *st.ExitCode != 0 {
		t.Errorf("init container first: %+v, want exited 0", st)
	}
	s.destroy(t, b, spec.ID)

	bad := s.group("gbad", "sleep", "3600")
	bad.InitContainers = []runtime.Container{side("broken", s.opts.Image, "sh", "-c", "exit 4")}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.StartTimeout)
	defer cancel()
	t.Cleanup(func() { _ = b.Destroy(context.Background(), bad.ID) })
	if _, err := b.Create(ctx, &bad); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("create with a failing init container: %v, want an error naming it", err)
	}
	s.destroy(t, b, bad.ID)
}

// testGroupDependsOn: a container waits for its dependencies' conditions: healthy (its
// startup probe passed) and completed (exited 0).
func testGroupDependsOn(t *testing.T, s *suite) {
	b := s.newBackend(t)
	spec := s.group("gdep", "sh", "-c", "cat /data/migrated /data/db-ready > /data/app-saw; sleep 3600")
	db := side("db", s.opts.Image, "sh", "-c", "sleep 1; echo ready > /data/db-ready; sleep 3600")
	db.StartupProbe = &runtime.Probe{Exec: []string{"test", "-f", "/data/db-ready"}, Period: 200 * time.Millisecond}
	migrate := side("migrate", s.opts.SecondImage, "sh", "-c", "sleep 0.5; echo migrated > /data/migrated")
	migrate.DependsOn = []runtime.Dependency{{Container: "db", Condition: runtime.ConditionHealthy}}
	spec.DependsOn = []runtime.Dependency{
		{Container: "migrate", Condition: runtime.ConditionCompleted},
		{Container: "db", Condition: runtime.ConditionStarted},
	}
	spec.Sidecars = []runtime.Container{db, migrate}
	s.create(t, b, spec)
	eventually(t, 10*time.Second, func() string {
		out, _ := execInC(t, b, spec.ID, "app", "cat", "/data/app-saw")
		if out != "migrated\nready\n" {
			return "app saw " + out + ", want migrate's and db's output before it started"
		}
		return ""
	})
	s.destroy(t, b, spec.ID)
}

// testGroupRecover: a new Backend on the same state re-adopts every container of a
// live group.
func testGroupRecover(t *testing.T, s *suite) {
	b := s.newBackend(t)
	spec := s.group("grec", "sleep", "3600")
	spec.Sidecars = []runtime.Container{side("web", s.opts.SecondImage, "sleep", "3600")}
	s.create(t, b, spec)
	b2 := s.newBackend(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recs, err := b2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range recs {
		if r.Spec.ID == spec.ID {
			found = true
			if !r.Alive || len(r.Spec.Sidecars) != 1 || r.Spec.Sidecars[0].Name != "web" {
				t.Errorf("recovered %+v alive=%v, want the live group", r.Spec, r.Alive)
			}
		}
	}
	if !found {
		t.Fatalf("recovered %v: no %s", recs, spec.ID)
	}
	if out, c := execInC(t, b2, spec.ID, "web", "echo", "hi"); c != 0 || out != "hi\n" {
		t.Errorf("exec in web after recovery: %q, exit %d", out, c)
	}
	sts := statuses(t, b2, spec.ID)
	if sts["web"].State != runtime.ContainerRunning || sts["app"].State != runtime.ContainerRunning {
		t.Errorf("statuses after recovery: %+v", sts)
	}
	if err := b2.Stop(ctx, spec.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	if st := statuses(t, b2, spec.ID)["web"]; st.State != runtime.ContainerExited {
		t.Errorf("web after Stop: %+v, want exited", st)
	}
	s.destroy(t, b2, spec.ID)
}

// testStartupProbe: a single container's startup probe gates Create as a group's does:
// Create returns once it passed (what it checks is there), and a probe that never passes
// fails Create naming the container, with nothing of the sandbox left.
func testStartupProbe(t *testing.T, s *suite) {
	b := s.newBackend(t)
	spec := s.spec("probe", "sh", "-c", "sleep 1; touch /tmp/ready; sleep 3600")
	spec.StartupProbe = &runtime.Probe{Exec: []string{"test", "-f", "/tmp/ready"}, Period: 200 * time.Millisecond}
	s.create(t, b, spec)
	if _, code := execInC(t, b, spec.ID, "", "test", "-f", "/tmp/ready"); code != 0 {
		t.Error("Create returned before the startup probe passed")
	}
	s.destroy(t, b, spec.ID)

	bad := s.spec("pbad", "sleep", "3600")
	bad.Name = "web"
	bad.StartupProbe = &runtime.Probe{Exec: []string{"false"}, Period: 100 * time.Millisecond, FailureThreshold: 3}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.StartTimeout)
	defer cancel()
	t.Cleanup(func() { _ = b.Destroy(context.Background(), bad.ID) })
	var f *startseq.Failure
	if _, err := b.Create(ctx, &bad); !errors.As(err, &f) || f.Reason != startseq.ReasonProbeFailed || f.Container != "web" {
		t.Fatalf("create with a probe that never passes: %v, want a %s failure naming web", err, startseq.ReasonProbeFailed)
	}
	s.destroy(t, b, bad.ID)
}
