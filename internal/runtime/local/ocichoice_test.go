package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

func TestValidateOCIRuntime(t *testing.T) {
	for _, ok := range []string{"", "runc", "crun"} {
		if err := ValidateOCIRuntime(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"runsc", "RUNC", "/usr/bin/crun", "crun ", "youki"} {
		if err := ValidateOCIRuntime(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

func TestApplyOCIRuntime(t *testing.T) {
	in := map[string]string{"runc": "/usr/sbin/runc", GVisorClass: "/x/runsc"}
	for _, name := range []string{"", "runc"} {
		out, err := applyOCIRuntime(in, name)
		if err != nil || out["runc"] != "/usr/sbin/runc" || out[GVisorClass] != "/x/runsc" {
			t.Errorf("%q: %v %v", name, out, err)
		}
	}
	if _, err := applyOCIRuntime(in, "youki"); err == nil {
		t.Error("youki: accepted")
	}
	if FindCrun() == "" {
		if _, err := applyOCIRuntime(in, "crun"); err == nil {
			t.Error("crun without a crun binary: accepted")
		}
		return
	}
	if cgErr := checkCrunCgroups(cgroupRoot); cgErr != nil {
		// A hybrid host with cgroup2 controllers (crun refuses it): the backend says so
		// at once rather than failing every create.
		if _, err := applyOCIRuntime(in, "crun"); err == nil || !strings.Contains(err.Error(), "scripts/cgroup-v1-ns.sh") {
			t.Errorf("crun on a hybrid cgroup host: %v", err)
		}
		t.Skip("this host's cgroups are not crun's (hybrid with cgroup2 controllers): run under scripts/cgroup-v1-ns.sh")
	}
	out, err := applyOCIRuntime(in, "crun")
	if err != nil {
		t.Fatal(err)
	}
	if !isCrun(out["runc"]) || out[GVisorClass] != "/x/runsc" {
		t.Errorf("crun: %v", out)
	}
	if in["runc"] != "/usr/sbin/runc" {
		t.Errorf("the caller's map changed: %v", in)
	}
}

func TestOCIStateOf(t *testing.T) {
	root := t.TempDir()
	if got := ociStateOf(filepath.Join(root, "none")); got != "" {
		t.Errorf("no root: %q", got)
	}
	if got := ociStateOf(root); got != "" {
		t.Errorf("empty root: %q", got)
	}
	mk := func(id, file string) {
		if err := os.MkdirAll(filepath.Join(root, id), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, id, file), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	mk("a", "config.json") // neither's
	if got := ociStateOf(root); got != "" {
		t.Errorf("unknown: %q", got)
	}
	mk("b", "status")
	if got := ociStateOf(root); got != OCICrun {
		t.Errorf("crun's: %q", got)
	}
	os.RemoveAll(filepath.Join(root, "b"))
	mk("c", "state.json")
	if got := ociStateOf(root); got != OCIRunc {
		t.Errorf("runc's: %q", got)
	}
}

func TestCheckCrunCgroupsNotCgroupfs(t *testing.T) {
	// Not a cgroup mount at all: nothing for crun to refuse.
	if err := checkCrunCgroups(t.TempDir()); err != nil {
		t.Error(err)
	}
}

// TestOCIRuntimeSwitchRefused: a backend on a state dir whose runc class has
// containers of the other OCI runtime refuses to start (it could neither see nor
// stop them), and starts again under the runtime that made them.
func TestOCIRuntimeSwitchRefused(t *testing.T) {
	if FindCrun() == "" || checkCrunCgroups(cgroupRoot) != nil {
		t.Skip("needs crun on a host whose cgroups it takes (scripts/cgroup-v1-ns.sh)")
	}
	e := newEnv(t)
	e.create(runtime.Spec{ID: "switch-1"})
	made := testOCIRuntime
	if made == "" {
		made = OCIRunc
	}
	other := OCICrun
	if made == OCICrun {
		other = OCIRunc
	}
	cfg := e.b.cfg
	cfg.Runtimes, cfg.OCIRuntime = nil, other
	_, err := New(cfg)
	if err == nil || !strings.Contains(err.Error(), "started by "+made) {
		t.Fatalf("a backend of %s on %s's containers: %v", other, made, err)
	}
	if err := e.b.Destroy(context.Background(), "switch-1"); err != nil {
		t.Fatal(err)
	}
	cfg.Runtimes = nil
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("no containers left: %v", err)
	}
	_ = b.Close(context.Background())
}

// TestNotExistCrun: crun's words for an unknown container count as "no such container",
// as runc's and runsc's do; other missing files do not.
func TestNotExistCrun(t *testing.T) {
	for msg, want := range map[string]bool{
		"runc delete x: exit status 1: container does not exist":                                                 true,
		"runc kill x TERM: exit status 1: error opening file `/s/.oci/runc/x/status`: No such file or directory": true,
		"runc delete x: exit status 1: cannot open directory '/s/.oci/runc/x': No such file or directory":        true,
		"runc run x: exit status 1: open `/s/x/bundle/config.json`: No such file or directory":                   false,
		"runc pause x: exit status 1: permission denied":                                                         false,
	} {
		if got := notExist(errors.New(msg)); got != want {
			t.Errorf("notExist(%q) = %v, want %v", msg, got, want)
		}
	}
}

// TestCrunSpec: a spec for crun says ociVersion 1.1.0 and keeps every cgroup hierarchy
// dir read-only after /sys/fs/cgroup (crun's recursive read-only bind of /sys/fs/cgroup
// leaves the controllers writable otherwise); the runner's own hierarchies are listed
// whatever their names.
func TestCrunSpec(t *testing.T) {
	self := "12:hugetlb:/\n11:cpu,cpuacct:/x\n3:name=openrc:/\n0::/init.scope\n"
	dirs := crunCgroupDirs(self)
	for _, want := range []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/openrc", "/sys/fs/cgroup/hugetlb"} {
		if !slices.Contains(dirs, want) {
			t.Errorf("%s not read-only: %v", want, dirs)
		}
	}
	for _, d := range dirs {
		if d == "/sys/fs/cgroup/" || strings.Contains(d[len("/sys/fs/cgroup/"):], "/") {
			t.Errorf("bad dir %q", d)
		}
	}
	oci := ociSpec(specParams{RootFS: "/r", Cgroups: "/p/x"})
	orig := slices.Clone(oci.Linux.ReadonlyPaths)
	crunSpec(oci, dirs)
	if oci.Version != "1.1.0" {
		t.Errorf("ociVersion %q", oci.Version)
	}
	i := slices.Index(oci.Linux.ReadonlyPaths, "/sys/fs/cgroup")
	if i < 0 || !slices.Equal(oci.Linux.ReadonlyPaths[:len(orig)], orig) || !slices.Equal(oci.Linux.ReadonlyPaths[len(orig):], dirs) {
		t.Errorf("readonlyPaths %v", oci.Linux.ReadonlyPaths)
	}
	if !slices.Equal(readonlyPaths, orig) {
		t.Errorf("the shared readonlyPaths changed: %v", readonlyPaths)
	}
}
