package local

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandboxd/sandboxd/internal/runtime"
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
	spec.Sidecars = append(spec.Sidecars, runtime.Container{Name: long, Image: "busybox", Command: "sleep", Args: []string{"3600"}})
	e.create(spec)
	app := agentClient(e.b, spec.ID)
	side := agentClientOf(e.b, spec.ID, "side")
	if _, errOut, c := execIn(t, side, "sh", "-c", "echo hello > /data/index.html"); c != 0 {
		t.Fatalf("write in side: %s", errOut)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, errOut, c := execIn(t, app, "wget", "-q", "-O", "-", "http://127.0.0.1:80/index.html")
		if c == 0 && out == "hello\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("wget from app to side's port 80 on localhost: %q %q exit %d", out, errOut, c)
		}
		time.Sleep(100 * time.Millisecond)
	}
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

	// runsc knows each container under its group id (<id>.<name>).
	out, err := e.b.runtimes[GVisorClass].run(context.Background(), "list", "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	var list []containerState
	if err := json.Unmarshal(out, &list); err != nil {
		t.Fatalf("runsc list: %v: %s", err, out)
	}
	ids := map[string]string{}
	for _, c := range list {
		ids[c.ID] = c.Status
	}
	for _, cid := range []string{spec.ID, spec.ID + ".side", spec.ID + "." + long} {
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
	for cid, want := range map[string][2]string{
		spec.ID:           {ctrTypeSandbox, spec.ID},
		spec.ID + ".side": {ctrTypeContainer, spec.ID},
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
