package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

// testCgroupParent is per test process: other checkouts' tests may run at the same
// time, and their sandboxes must not look like this run's leaks.
var testCgroupParent = "sandboxd-localtest-" + strconv.Itoa(os.Getpid())

// testOCIRuntime is the OCI runtime of the runc class the tests' backends use
// (Config.OCIRuntime): SANDBOXD_TEST_OCI_RUNTIME, "" (runc) by default.
var testOCIRuntime = os.Getenv("SANDBOXD_TEST_OCI_RUNTIME")

var (
	agentBin   string // the agent the tests run
	busyboxDir string // a one-layer busybox rootfs
	skipReason string
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	if os.Getenv(vforkHelperEnv) == "1" {
		vforkHelper() // TestSeccompCaptureTimesOut's process that cannot stop
	}
	if !testenv.HaveRoot() {
		return m.Run() // tests that need root skip, or fail where it is required (newEnv)
	}
	if _, err := os.Stat("/usr/sbin/runc"); err != nil {
		skipReason = "needs /usr/sbin/runc (apt install runc)"
	} else if _, err := os.Stat("/bin/busybox"); err != nil {
		skipReason = "needs /bin/busybox (apt install busybox-static)"
	}
	if skipReason != "" {
		return m.Run()
	}
	if dir := os.Getenv(fixtureEnv); dir != "" {
		// A child of TestCrashRecovery: the parent's fixtures and cgroup parent.
		agentBin, busyboxDir = filepath.Join(dir, "sandbox-agent"), filepath.Join(dir, "busybox")
		testCgroupParent = os.Getenv(cgroupEnv)
		return m.Run()
	}
	tmp, err := os.MkdirTemp("", "sbxl-fixture-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)

	// In tmp, beside busybox: TestCrashRecovery's children find both through fixtureEnv.
	if agentBin, err = testenv.Agent(tmp); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	busyboxDir = filepath.Join(tmp, "busybox")
	if err := buildBusybox(busyboxDir); err != nil {
		fmt.Fprintln(os.Stderr, "busybox rootfs:", err)
		return 1
	}
	code := m.Run()
	for _, d := range []string{probeLayer, pythonLayer} {
		if d != "" {
			os.RemoveAll(d)
		}
	}
	// The tests' parent cgroups (a real runner keeps its own).
	for _, d := range mustGlob("/sys/fs/cgroup/*/" + testCgroupParent) {
		os.Remove(d)
	}
	os.Remove("/sys/fs/cgroup/" + testCgroupParent)
	return code
}

func goBuild(out, pkg string) ([]byte, error) {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd.CombinedOutput()
}

func mustGlob(p string) []string {
	m, _ := filepath.Glob(p)
	return m
}

// buildBusybox makes a rootfs from Debian's busybox-static: the binary, one symlink per
// applet, /etc/passwd and /etc/group with root and a user 1000.
func buildBusybox(dir string) error {
	for _, d := range []string{"bin", "etc", "tmp", "root", "home/user", "proc", "sys", "dev", "mnt"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	data, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), data, 0o755); err != nil {
		return err
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return err
	}
	for _, a := range strings.Fields(string(out)) {
		if a == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			return err
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
		"etc/group":  "root:x:0:\nuser:x:1000:\n",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o644); err != nil {
			return err
		}
	}
	return os.Chown(filepath.Join(dir, "home/user"), 1000, 1000)
}

// testImages serves the busybox layer as "busybox" and fails other references like the
// image store would.
type testImages struct{ layers []string }

func (ti testImages) Pull(ctx context.Context, ref string, _ *runtime.Credentials) (*Image, error) {
	switch ref {
	case "busybox":
		return &Image{Ref: ref, Digest: "sha256:b0b0", Layers: ti.layers, Config: ImageConfig{
			Cmd: []string{"sh"}, Env: []string{"PATH=/bin", "FROM_IMAGE=1"}, WorkingDir: "/",
		}}, nil
	case "python":
		return pythonImage()
	case "nocmd":
		return &Image{Ref: ref, Digest: "sha256:0c0d", Layers: ti.layers}, nil
	case "workdir":
		return &Image{Ref: ref, Digest: "sha256:3d3d", Layers: ti.layers, Config: ImageConfig{
			Cmd: []string{"sh"}, Env: []string{"PATH=/bin"}, WorkingDir: "/root",
		}}, nil
	case "deepworkdir": // a working directory below /data, where volSpec mounts "data"
		return &Image{Ref: ref, Digest: "sha256:4d4d", Layers: ti.layers, Config: ImageConfig{
			Cmd: []string{"sh"}, Env: []string{"PATH=/bin"}, WorkingDir: "/data/app/work",
		}}, nil
	case "private":
		return nil, fmt.Errorf("%w: private", image.ErrUnauthorized)
	case "bad ref":
		return nil, fmt.Errorf("%w: bad ref", image.ErrInvalidReference)
	}
	if _, err := name.ParseReference(ref); err != nil {
		return nil, fmt.Errorf("%w: %w", image.ErrInvalidReference, err)
	}
	return nil, fmt.Errorf("%w: %s", image.ErrNotFound, ref)
}

type env struct {
	t     testing.TB
	b     *Backend
	state string
	cfg   func(*Config) // changes every backend's config (nil: none)
}

// newEnv returns a Backend on a fresh state dir; at cleanup every sandbox is destroyed
// and the host is checked for leftovers.
func newEnv(t testing.TB) *env { return newEnvWith(t, nil) }

// newEnvWith is newEnv with cfg applied to every backend's config.
func newEnvWith(t testing.TB, cfg func(*Config)) *env {
	t.Helper()
	testenv.RequireRoot(t, "runc, mounts, cgroups")
	if skipReason != "" {
		t.Skip(skipReason)
	}
	// Short on purpose: agent.sock paths stay under the 108-byte limit.
	state, err := os.MkdirTemp("", "sbxl-")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, state: state, cfg: cfg}
	e.b = e.backend()
	t.Cleanup(func() {
		b := e.backend()
		ents, _ := os.ReadDir(state)
		for _, ent := range ents {
			if validID(ent.Name()) {
				if err := b.Destroy(context.Background(), ent.Name()); err != nil {
					t.Errorf("cleanup destroy %s: %v", ent.Name(), err)
				}
			}
		}
		if err := b.PurgeSnapshotCache(); err != nil {
			t.Errorf("cleanup snapshot cache: %v", err)
		}
		checkNoLeaks(t, state, "")
		os.RemoveAll(state)
	})
	return e
}

// backend returns a new Backend on the env's state dir (like a restarted runner).
func (e *env) backend() *Backend {
	e.t.Helper()
	cfg := Config{
		StateDir:     e.state,
		AgentBinary:  agentBin,
		CgroupParent: testCgroupParent,
		Images:       testImages{layers: []string{busyboxDir}},
		OCIRuntime:   testOCIRuntime,
	}
	if e.cfg != nil {
		e.cfg(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

func (e *env) create(spec runtime.Spec) runtime.Info {
	e.t.Helper()
	if spec.Image == "" {
		spec.Image = "busybox"
	}
	info, err := e.b.Create(context.Background(), &spec)
	if err != nil {
		e.t.Fatalf("create %s: %v", spec.ID, err)
	}
	return info
}

// agentClient talks to a sandbox's agent the way the runner does: gRPC over h2c over
// the unix socket from DialAgent.
func agentClient(b *Backend, id string) agentv1connect.AgentServiceClient {
	return agentClientOf(b, id, "")
}

// agentClientOf is agentClient for container name of a group ("" the primary).
func agentClientOf(b *Backend, id, name string) agentv1connect.AgentServiceClient {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{
		Protocols: &protos,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return b.DialAgent(ctx, id, name)
		},
	}
	return agentv1connect.NewAgentServiceClient(&http.Client{Transport: tr}, "http://agent", connect.WithGRPC())
}

func execIn(t testing.TB, c agentv1connect.AgentServiceClient, argv ...string) (string, string, int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{Command: argv}))
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	return string(resp.Msg.Stdout), string(resp.Msg.Stderr), resp.Msg.ExitCode
}

// checkNoLeaks fails t if anything of sandbox id (or of any sandbox, id "") is left on
// the host: mounts under the state dir, cgroups (and processes in them), runtime state,
// sandbox dirs.
func checkNoLeaks(t testing.TB, state, id string) {
	t.Helper()
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, state+"/") && (id == "" || strings.Contains(l, state+"/"+id+"/")) {
			t.Errorf("leaked mount: %s", l)
		}
	}
	pattern := "/sys/fs/cgroup/*/" + testCgroupParent + "/*"
	if id != "" {
		pattern = "/sys/fs/cgroup/*/" + testCgroupParent + "/" + id
	}
	for _, d := range mustGlob(pattern) {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			procs, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			t.Errorf("leaked cgroup %s (procs: %q)", d, bytes.TrimSpace(procs))
		}
	}
	ents, _ := os.ReadDir(state)
	for _, e := range ents {
		if e.Name() == poolBundles {
			sub, _ := os.ReadDir(filepath.Join(state, poolBundles))
			for _, s := range sub {
				if id == "" || s.Name() == id {
					t.Errorf("leaked pooled container bundle %s", s.Name())
				}
			}
			continue
		}
		if e.Name() == dirImports {
			sub, _ := os.ReadDir(filepath.Join(state, dirImports))
			for _, s := range sub {
				t.Errorf("leaked checkpoint import staging dir %s", s.Name())
			}
			continue
		}
		if e.Name() == diskTemplatesDir || e.Name() == dirVolumePool || e.Name() == seccompDir {
			continue // kept for the next sandbox, like the image cache (mounts: see above)
		}
		if e.Name() == dirRootfs {
			sub, _ := os.ReadDir(filepath.Join(state, dirRootfs))
			for _, s := range sub {
				if id == "" || s.Name() == id || strings.HasPrefix(s.Name(), id+".") {
					t.Errorf("leaked root filesystem mount point %s", s.Name())
				}
			}
			continue
		}
		if e.Name() == ociRootDir {
			for _, class := range []string{"runc", GVisorClass} {
				sub, _ := os.ReadDir(filepath.Join(state, ociRootDir, class))
				for _, s := range sub {
					if id == "" || strings.HasPrefix(s.Name(), id) {
						t.Errorf("leaked %s state %s", class, s.Name())
					}
				}
			}
			continue
		}
		if id == "" || e.Name() == id {
			t.Errorf("leaked sandbox dir %s", e.Name())
		}
	}
}

func isErr(err, target error) bool { return errors.Is(err, target) }
