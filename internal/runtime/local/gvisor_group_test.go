package local

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
)

// gvisorGroupSpec is groupSpec under gVisor.
func gvisorGroupSpec(id string) runtime.Spec {
	spec := groupSpec(id)
	spec.RuntimeClass = GVisorClass
	return spec
}

// TestGVisorGroupLocalhost: a group under gVisor is one sentry: the sidecar's server
// answers the primary on localhost (no bridge: the sentry's loopback), both see gVisor's
// kernel and one hostname, each has its own agent, root filesystem and tmpfs; the
// group's total memory is on the sentry's cgroup, the sandbox's own; runsc knows every
// container under its own id; Destroy leaves nothing.
func TestGVisorGroupLocalhost(t *testing.T) {
	e := gvisorEnv(t)
	spec := gvisorGroupSpec("gvg-lo")
	// The longest container name (63 characters): runsc takes <id>.<name> as its id.
	long := strings.Repeat("s", 63)
	// And "side2" beside "side": runsc resolves ids as abbreviations (see runscID).
	spec.Sidecars = append(spec.Sidecars, runtime.Container{Name: long, Image: "busybox", Command: "sleep", Args: []string{"3600"}},
		runtime.Container{Name: "side2", Image: "busybox", Command: "sleep", Args: []string{"3600"}})
	e.create(spec)
	app := agentClient(e.b, spec.ID)
	side := agentClientOf(e.b, spec.ID, "side")
	if _, errOut, c := execIn(t, side, "sh", "-c", "echo hello > /data/index.html"); c != 0 {
		t.Fatalf("write in side: %s", errOut)
	}
	waitWget(t, app, "http://127.0.0.1:80/index.html", "hello\n") // side's port 80, on the sentry's loopback
	host := hostRelease(t)
	var hostnames []string
	for _, name := range []string{"app", "side", long} {
		cl := agentClientOf(e.b, spec.ID, name)
		rel, _, _ := execIn(t, cl, "uname", "-r")
		if rel = strings.TrimSpace(rel); rel == "" || rel == host {
			t.Errorf("uname -r in %s = %q (host %q): want gVisor's kernel", name, rel, host)
		}
		h, _, _ := execIn(t, cl, "hostname")
		hostnames = append(hostnames, h)
		if out, _, _ := execIn(t, cl, "cat", "/proc/1/cmdline"); !strings.Contains(out, "sandbox-agent") {
			t.Errorf("pid 1 of %s: %q, want its own agent", name, out)
		}
	}
	if hostnames[0] != hostnames[1] || hostnames[1] != hostnames[2] || strings.TrimSpace(hostnames[0]) != spec.ID {
		t.Errorf("hostnames %q: want one, %s", hostnames, spec.ID)
	}
	if _, _, c := execIn(t, side, "sh", "-c", "mount | grep -q ' /scratch '"); c != 0 {
		t.Errorf("side has no tmpfs at /scratch")
	}
	if _, _, c := execIn(t, app, "test", "-d", "/scratch"); c == 0 {
		t.Errorf("app has side's tmpfs /scratch")
	}
	if _, _, c := execIn(t, side, "sh", "-c", "echo x > /only-side"); c != 0 {
		t.Fatal("write in side's root")
	}
	if _, _, c := execIn(t, app, "test", "-e", "/only-side"); c == 0 {
		t.Errorf("app sees side's root filesystem")
	}

	// runsc knows each container under its own id.
	list, err := e.b.runtimes[GVisorClass].list(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, c := range list {
		ids[c.ID] = c.Status
	}
	for _, cid := range []string{spec.ID, memberCID(spec.ID, "side"), memberCID(spec.ID, "side2"), memberCID(spec.ID, long)} {
		if ids[cid] != "running" {
			t.Errorf("runsc list: %s is %q, want running (%v)", cid, ids[cid], ids)
		}
	}
	if err := e.b.Destroy(context.Background(), spec.ID); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, spec.ID)
}

// TestGVisorGroupLimits: the group's total resources are on the sentry's cgroup (the
// sandbox's own), the containers' cgroups are runsc's empty ones, and each container's
// OCI spec carries runsc's annotations.
func TestGVisorGroupLimits(t *testing.T) {
	e := gvisorEnv(t)
	spec := gvisorGroupSpec("gvg-lim")
	e.create(spec)
	base := filepath.Join(cgroupRoot, "memory", testCgroupParent, spec.ID)
	got, err := os.ReadFile(filepath.Join(base, "memory.limit_in_bytes"))
	if err != nil {
		t.Skipf("no cgroup v1 memory hierarchy here: %v", err)
	}
	if want := "201326592"; strings.TrimSpace(string(got)) != want { // 128 MiB + 64 MiB
		t.Errorf("sandbox memory limit %q, want the total %s", got, want)
	}
	if procs, _ := os.ReadFile(filepath.Join(base, "cgroup.procs")); len(strings.Fields(string(procs))) == 0 {
		t.Errorf("no process (the sentry) in the sandbox's cgroup")
	}
	for cid, want := range map[string][2]string{ // runsc's ids: see runscID
		spec.ID:                    {ctrTypeSandbox, spec.ID + runscIDSuffix},
		memberCID(spec.ID, "side"): {ctrTypeContainer, spec.ID + runscIDSuffix},
	} {
		dir := e.b.dir(spec.ID)
		if cid != spec.ID {
			dir = memberDir(dir, "side")
		}
		var sp specs.Spec
		if err := readJSON(filepath.Join(dir, dirBundle, "config.json"), &sp); err != nil {
			t.Fatal(err)
		}
		if sp.Annotations[annoContainerType] != want[0] || sp.Annotations[annoSandboxID] != want[1] {
			t.Errorf("%s annotations %v, want type %s in sandbox %s", cid, sp.Annotations, want[0], want[1])
		}
	}
	if err := e.b.Destroy(context.Background(), spec.ID); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, spec.ID)
}

// TestGVisorGroupNetwork: with a bridge, the sidecar's server is reached from the host at
// the sandbox's IP (one network stack for the group) and from the primary on localhost.
func TestGVisorGroupNetwork(t *testing.T) {
	e := gvisorEnv(t)
	m := e.withNetwork(t, 0)
	spec := gvisorGroupSpec("gvg-net")
	spec.Sidecars[0].Args = []string{"-f", "-p", "8080", "-h", "/data"}
	spec.Sidecars[0].Files = []runtime.File{{Path: "/data/index.html", Content: []byte("hello\n")}}
	info := e.create(spec)
	if info.IP == "" {
		t.Fatal("no IP")
	}
	app := agentClient(e.b, spec.ID)
	if body := getFromHost(m, info.IP, "8080", "/index.html"); body != "hello\n" {
		t.Errorf("host -> %s:8080 (the sidecar) read %q", info.IP, body)
	}
	if out, errOut, c := execIn(t, app, "wget", "-q", "-O", "-", "http://127.0.0.1:8080/index.html"); c != 0 || out != "hello\n" {
		t.Errorf("app -> localhost:8080: %q %q exit %d", out, errOut, c)
	}
	if err := e.b.Destroy(context.Background(), spec.ID); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, spec.ID)
}

// TestGVisorGroupInitFailure: init containers run in order inside the sentry; a failing
// one fails Create with its name and leaves nothing behind.
func TestGVisorGroupInitFailure(t *testing.T) {
	e := gvisorEnv(t)
	vm := []runtime.VolumeMount{{Volume: "shared", Path: "/data"}}
	ok := gvisorGroupSpec("gvg-init")
	ok.Command, ok.Args = "sh", []string{"-c", "cat /data/order > /data/app-saw; sleep 3600"}
	ok.InitContainers = []runtime.Container{
		{Name: "one", Image: "busybox", Command: "sh", Args: []string{"-c", "sleep 0.2; echo 1 >> /data/order"}, VolumeMounts: vm},
		{Name: "two", Image: "busybox", Command: "sh", Args: []string{"-c", "echo 2 >> /data/order"}, VolumeMounts: vm},
	}
	e.create(ok)
	app := agentClient(e.b, ok.ID)
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _, _ := execIn(t, app, "cat", "/data/app-saw")
		if out == "1\n2\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("app saw %q, want both init containers' lines in order", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	sts, err := e.b.ContainerStatuses(context.Background(), ok.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		if st.Init && (st.State != runtime.ContainerExited || st.ExitCode == nil || *st.ExitCode != 0) {
			t.Errorf("init container %s: %+v, want exited 0", st.Name, st)
		}
	}
	if err := e.b.Destroy(context.Background(), ok.ID); err != nil {
		t.Fatal(err)
	}

	bad := gvisorGroupSpec("gvg-bad")
	bad.InitContainers = []runtime.Container{{Name: "broken", Image: "busybox", Command: "sh", Args: []string{"-c", "exit 4"}}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.b.Create(ctx, &bad); err == nil || !strings.Contains(err.Error(), `"broken"`) {
		t.Fatalf("create with a failing init container: %v, want an error naming it", err)
	}
	checkNoLeaks(t, e.state, bad.ID)
	checkNoLeaks(t, e.state, ok.ID)
}

// TestGVisorGroupPrimaryExit: the primary's exit ends the group with its exit code; the
// other containers are stopped and their exits recorded. A sidecar that fails is
// restarted within its limit inside the sentry, while the primary runs on.
func TestGVisorGroupPrimaryExit(t *testing.T) {
	e := gvisorEnv(t)
	spec := gvisorGroupSpec("gvg-exit")
	spec.Command, spec.Args = "sh", []string{"-c", "sleep 2; exit 3"}
	spec.Sidecars = append(spec.Sidecars, runtime.Container{Name: "flaky", Image: "busybox", Command: "sh",
		Args: []string{"-c", "echo x >> /data/runs; exit 7"}, RestartLimit: 2,
		VolumeMounts: []runtime.VolumeMount{{Volume: "shared", Path: "/data"}}})
	e.create(spec)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The flaky sidecar ran three times and stays exited, while the primary runs.
	deadline := time.Now().Add(10 * time.Second)
	for {
		sts, err := e.b.ContainerStatuses(ctx, spec.ID)
		if err != nil {
			t.Fatal(err)
		}
		var flaky, app runtime.ContainerStatus
		for _, st := range sts {
			switch st.Name {
			case "flaky":
				flaky = st
			case "app":
				app = st
			}
		}
		if flaky.State == runtime.ContainerExited && flaky.Restarts == 2 && flaky.ExitCode != nil && *flaky.ExitCode == 7 {
			if app.State != runtime.ContainerRunning {
				t.Errorf("app after flaky failed: %+v, want running", app)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("flaky: %+v, want exited 7 after 2 restarts", flaky)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ex, err := e.b.Wait(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ex.ExitCode == nil || *ex.ExitCode != 3 {
		t.Fatalf("exit %+v, want the primary's 3", ex)
	}
	sts, err := e.b.ContainerStatuses(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		if st.State != runtime.ContainerExited {
			t.Errorf("%s after the primary ended: %+v, want exited", st.Name, st)
		}
	}
	if err := e.b.Destroy(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, spec.ID)
}

// TestGVisorGroupStopAndRecover: a new Backend re-adopts a live gVisor group (each
// container's agent answers; runsc waits are re-established), Stop gives every
// container SIGTERM, and the group ends.
func TestGVisorGroupStopAndRecover(t *testing.T) {
	e := gvisorEnv(t)
	spec := gvisorGroupSpec("gvg-rec")
	spec.Command, spec.Args = "sh", []string{"-c", "trap 'sleep 1; exit 5' TERM; while :; do sleep 0.1; done"}
	spec.Sidecars[0].Command, spec.Sidecars[0].Args = "sh", []string{"-c", "trap 'echo side-term > /data/side; exit 6' TERM; while :; do sleep 0.1; done"}
	e.create(spec)
	b2 := e.backend()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := b2.Recover(ctx)
	if err != nil || len(recs) != 1 || !recs[0].Alive {
		t.Fatalf("recover: %+v, %v", recs, err)
	}
	if out, _, c := execIn(t, agentClientOf(b2, spec.ID, "side"), "echo", "hi"); c != 0 || out != "hi\n" {
		t.Errorf("exec in side after recovery: %q, exit %d", out, c)
	}
	if err := b2.Stop(ctx, spec.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	ex, err := b2.Wait(ctx, spec.ID)
	if err != nil || ex.ExitCode == nil || *ex.ExitCode != 5 {
		t.Fatalf("exit after stop: %+v, %v, want 5", ex, err)
	}
	sts, err := b2.ContainerStatuses(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		if st.Name == "side" && (st.State != runtime.ContainerExited || st.ExitCode == nil || *st.ExitCode != 6) {
			t.Errorf("side after Stop: %+v, want exited 6 (its TERM trap)", st)
		}
	}
	if err := b2.Destroy(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, spec.ID)
}

// TestGVisorGroupPrimaryExitGrace: when the primary's main command ends, the other
// containers get their grace period as under runc (the primary's agent holds the sentry
// until they have stopped, see gvisor_group.go): a sidecar's SIGTERM trap runs to its
// end, and its exit is its own code, not a kill.
func TestGVisorGroupPrimaryExitGrace(t *testing.T) {
	e := gvisorEnv(t)
	testPrimaryExitGrace(t, e, gvisorGroupSpec("gvg-grace"))
}

// TestGroupPrimaryExitGrace is TestGVisorGroupPrimaryExitGrace under runc.
func TestGroupPrimaryExitGrace(t *testing.T) {
	e := newEnv(t)
	testPrimaryExitGrace(t, e, groupSpec("grp-grace"))
}

// exitOf prints an optional exit code.
func exitOf(c *int32) string {
	if c == nil {
		return "none"
	}
	return strconv.Itoa(int(*c))
}

func testPrimaryExitGrace(t *testing.T, e *env, spec runtime.Spec) {
	spec.Command, spec.Args = "sh", []string{"-c", "sleep 1; exit 3"}
	spec.Sidecars[0].Command, spec.Sidecars[0].Args = "sh", []string{"-c",
		"trap 'sleep 0.5; echo graceful > /data/side-term; exit 6' TERM; while :; do sleep 0.1; done"}
	e.create(spec)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ex, err := e.b.Wait(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ex.ExitCode == nil || *ex.ExitCode != 3 {
		t.Errorf("exit %+v, want the primary's 3", ex)
	}
	sts, err := e.b.ContainerStatuses(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		switch st.Name {
		case "side":
			if st.State != runtime.ContainerExited || st.ExitCode == nil || *st.ExitCode != 6 || st.Reason == "Killed" {
				t.Errorf("side after the primary ended: %+v (exit %v), want exited 6 from its TERM trap", st, exitOf(st.ExitCode))
			}
		case "app":
			if st.State != runtime.ContainerExited || st.ExitCode == nil || *st.ExitCode != 3 {
				t.Errorf("app: %+v, want exited 3", st)
			}
		}
	}
	e.b.mu.Lock()
	vol := e.b.sandboxes[spec.ID].volumeRoots["shared"]
	e.b.mu.Unlock()
	if got, err := os.ReadFile(filepath.Join(vol, "side-term")); err != nil || string(got) != "graceful\n" {
		t.Errorf("the sidecar's TERM trap wrote %q (%v) to the shared volume, want \"graceful\\n\"", got, err)
	}
	if err := e.b.Destroy(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, spec.ID)
}

// waitWget runs wget of url in the container of c until it prints want (a server that
// has just started may not listen yet), failing t after 10 s.
func waitWget(t *testing.T, c agentv1connect.AgentServiceClient, url, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, errOut, code := execIn(t, c, "wget", "-q", "-O", "-", url)
		if code == 0 && out == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("wget %s: %q %q exit %d, want %q", url, out, errOut, code, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// getFromHost GETs path at ip:port from the host as the edge dials (with the network's
// host mark: unmarked host connections are refused), retrying for a few seconds while
// nothing answers; it returns the body ("" if nothing did).
func getFromHost(m *network.Manager, ip, port, path string) string {
	hc := markedClient(m)
	for i := 0; i < 100; i++ {
		resp, err := hc.Get("http://" + net.JoinHostPort(ip, port) + path)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return string(body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return ""
}
