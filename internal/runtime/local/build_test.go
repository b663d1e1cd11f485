package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// Image builds inside a gVisor sandbox (docs/builds.md): the builder image
// (scripts/build-test-images.sh builder, Debian's Buildah) runs as an ordinary sandbox of
// the gvisor class with the default capabilities and no_new_privs: Buildah's chroot
// isolation, lacking CAP_SYS_ADMIN, moves each RUN into a new user namespace (gVisor's
// own kernel allows it) where it makes its mount and UTS namespaces and mounts /proc,
// /sys and /dev. Under runc those would be the host kernel's user namespaces: builds
// belong to the gvisor class only. The host hands the base image and the
// context in and reads the built OCI layout back through the agent's archive calls (the
// runner-only ExtractPath and ArchivePath: bounded, never following a symlink), so the
// builder needs no registry and no network.

// buildDockerfile uses every instruction the first builds need: the image it makes
// shows each of them (testBuildSteps counts its steps after FROM).
const buildDockerfile = `FROM localhost/sandboxd/busybox:latest
ENV GREETING=hello-from-build
WORKDIR /app
COPY hello.txt ./hello.txt
RUN echo "$GREETING" > greeting && mkdir -p /app/data && chown nobody /app/data && id -u > built-as
USER nobody
RUN id -u > /app/data/ran-as
CMD ["sh", "-c", "cat /app/greeting; exec sleep 3600"]
`

const buildSteps = 7 // buildDockerfile's steps after FROM

// buildFailing fails at its third step.
const buildFailing = `FROM localhost/sandboxd/busybox:latest
RUN echo fine
RUN echo about to fail && exit 7
RUN echo never
`

// buildScript runs inside the builder: load the base image the host handed in, build
// the context at $1 with Dockerfile $2, and write the result as an OCI layout to $3.
const buildScript = `set -e
[ -n "$(buildah images -q localhost/sandboxd/busybox:latest 2>/dev/null)" ] || buildah pull -q docker-archive:/build/base/base.tar >/dev/null
buildah bud --layers --isolation=chroot --pull=never -f "$2" -t localhost/built:1 "$1"
[ -z "$3" ] || buildah push -q localhost/built:1 "oci:$3:latest"
`

// buildImages serves the builder rootfs as "builder" and pulls everything else through
// a real image store (the built image, from the loopback registry).
type buildImages struct {
	builder string
	store   *image.Store
}

func (bi *buildImages) Pull(ctx context.Context, ref string, _ *runtime.Credentials) (*Image, error) {
	if ref == "builder" {
		return &Image{Ref: ref, Digest: "sha256:b1d0", Layers: []string{bi.builder}, Config: ImageConfig{Env: []string{testimage.DefaultPath, "LANG=C.UTF-8"}}}, nil
	}
	img, err := bi.store.Pull(ctx, ref, nil)
	if err != nil {
		return nil, err
	}
	c := img.Config
	return &Image{Ref: img.Ref, Digest: img.Digest, Layers: img.Layers, Config: ImageConfig{
		Entrypoint: c.Entrypoint, Cmd: c.Cmd, Env: c.Env, WorkingDir: c.WorkingDir, User: c.User,
	}}, nil
}

// TestBuildInGVisor builds a Dockerfile (FROM a test image; ENV, WORKDIR, COPY, RUN,
// USER, CMD) with Buildah inside a gVisor sandbox, pushes the OCI layout it wrote to a
// registry and runs it as a sandbox that sees every instruction; a rebuild of the
// unchanged context takes every step from the layer cache; a failing RUN names its step.
func TestBuildInGVisor(t *testing.T) {
	e := gvisorEnv(t)
	builderTar, err := testimage.BuilderTar()
	if errors.Is(err, testimage.ErrNoTestImages) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	imgs, err := testimage.StandardImages()
	if errors.Is(err, testimage.ErrNoTestImages) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	testenv.RequireRoot(t, "runsc")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	rootfs := t.TempDir()
	start := time.Now()
	if out, err := exec.Command("tar", "--numeric-owner", "-xpf", builderTar, "-C", rootfs).CombinedOutput(); err != nil {
		t.Fatalf("unpack %s: %v: %s", builderTar, err, out)
	}
	t.Logf("unpacked the builder image in %v", time.Since(start))
	host, stop, err := testimage.StartRegistry(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	store, err := image.Open(image.Options{Root: t.TempDir(), Insecure: []string{"127.0.0.1:*"}})
	if err != nil {
		t.Fatal(err)
	}
	m := e.withNetwork(t, buildTestNetwork)
	b, err := New(Config{OCIRuntime: testOCIRuntime, StateDir: e.state, AgentBinary: agentBin, CgroupParent: testCgroupParent,
		Images: &buildImages{builder: rootfs, store: store}, Runtimes: e.b.cfg.Runtimes, Network: e.b.cfg.Network})
	if err != nil {
		t.Fatal(err)
	}
	e.b = b

	// The host side of a build: the base image as a docker-archive, the context.
	in := t.TempDir()
	base, bctx := filepath.Join(in, "base"), filepath.Join(in, "ctx")
	for _, d := range []string{base, bctx} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tag, _ := name.NewTag("localhost/sandboxd/busybox:latest")
	if err := tarball.WriteToFile(filepath.Join(base, "base.tar"), tag, imgs.Busybox); err != nil {
		t.Fatal(err)
	}
	for p, c := range map[string]string{"Dockerfile": buildDockerfile, "Dockerfile.fail": buildFailing, "hello.txt": "hello-from-context\n"} {
		if err := os.WriteFile(filepath.Join(bctx, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	start = time.Now()
	if _, err := b.Create(ctx, &runtime.Spec{ID: "bld-1", RuntimeClass: GVisorClass,
		Container: runtime.Container{Image: "builder", Command: "sleep", Args: []string{"infinity"},
			Resources: runtime.Resources{MilliCPU: 2000, MemoryBytes: 2 << 30, Pids: 1024},
			// No Security: the default capabilities are enough (see the top of the file).
		},
		// The widest egress there is: even "any" never reaches the host or a sandbox.
		Network: &runtime.Network{Egress: []runtime.EgressRule{{Any: true}}},
	}); err != nil {
		t.Fatalf("create the builder sandbox: %v", err)
	}
	c := agentClient(b, "bld-1")
	if out, _, code := execIn(t, c, "buildah", "--version"); code != 0 || !strings.HasPrefix(out, "buildah version") {
		t.Fatalf("buildah --version: %q (%d)", out, code)
	}
	t.Logf("builder sandbox: create -> first exec %v", time.Since(start))
	if rel, _, _ := execIn(t, c, "uname", "-r"); strings.TrimSpace(rel) == hostRelease(t) {
		t.Fatalf("the builder runs on the host kernel (%s), not gVisor's", rel)
	}
	// The build below runs without CAP_SYS_ADMIN (bit 21): nothing beyond the defaults.
	if out, _, _ := execIn(t, c, "sh", "-c", "grep CapEff /proc/self/status"); !strings.HasPrefix(out, "CapEff:") {
		t.Fatalf("builder CapEff: %q", out)
	} else if eff, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(out, "CapEff:")), 16, 64); err != nil || eff&(1<<21) != 0 {
		t.Fatalf("builder CapEff %q (%v): want no CAP_SYS_ADMIN", out, err)
	}
	limits := runtime.ArchiveLimits{MaxBytes: 64 << 20, MaxFiles: 1000}
	sendDir(ctx, t, c, base, "/build/base", limits)
	sendDir(ctx, t, c, bctx, "/build/ctx", limits)

	build := func(dockerfile, out string) (string, string, int32, time.Duration) {
		t.Helper()
		start := time.Now()
		resp, err := c.Exec(ctx, connect.NewRequest(&agentv1.ExecRequest{
			Command: []string{"sh", "-c", buildScript, "build", "/build/ctx", "/build/ctx/" + dockerfile, out},
			Timeout: durationpb.New(5 * time.Minute), MaxOutputBytes: 1 << 20,
		}))
		if err != nil {
			t.Fatalf("exec the build: %v", err)
		}
		return string(resp.Msg.Stdout), string(resp.Msg.Stderr), resp.Msg.ExitCode, time.Since(start)
	}
	stdout, stderr, code, took := build("Dockerfile", "/build/out")
	if code != 0 {
		t.Fatalf("build: exit %d\n%s\n%s", code, stdout, stderr)
	}
	t.Logf("first build (base image loaded, %d steps, OCI layout written): %v", buildSteps+1, took)

	// The layout comes back as an archive the host unpacks with the snapshot bounds.
	outDir := filepath.Join(t.TempDir(), "out")
	receiveDir(ctx, t, c, "/build/out", outDir, runtime.ArchiveLimits{MaxBytes: 256 << 20, MaxFiles: 1000})
	lp, err := layout.FromPath(outDir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("built layout: %v manifests (%v), want 1", im, err)
	}
	built, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(host+"/built:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, built, remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}

	// The built image runs as a sandbox and shows every instruction.
	start = time.Now()
	if _, err := b.Create(ctx, &runtime.Spec{ID: "run-1", RuntimeClass: GVisorClass,
		Container: runtime.Container{Image: host + "/built:1", Command: "httpd", Args: []string{"-f", "-p", "8080", "-h", "/app"}},
		Network:   &runtime.Network{Ingress: []runtime.IngressRule{{Any: true}}}}); err != nil {
		t.Fatalf("create a sandbox from the built image: %v", err)
	}
	t.Logf("sandbox from the built image: pull + create %v", time.Since(start))
	rc := agentClient(b, "run-1")
	for _, check := range []struct{ script, want string }{
		{"cat /app/hello.txt", "hello-from-context\n"},                                // COPY
		{"echo $GREETING; cat /app/greeting", "hello-from-build\nhello-from-build\n"}, // ENV, RUN
		{"pwd", "/app\n"},    // WORKDIR
		{"id -u", "65534\n"}, // USER
		{"cat /app/built-as /app/data/ran-as", "0\n65534\n"}, // RUN before and after USER
	} {
		if out, stderr, code := execIn(t, rc, "sh", "-c", check.script); out != check.want || code != 0 {
			t.Errorf("%s in the built image: %q (%d %s), want %q", check.script, out, code, stderr, check.want)
		}
	}

	// A RUN reaches neither another sandbox (run-1, whose httpd answers the host) nor the
	// host: the build sandbox's network rules hold for its RUN steps.
	peer, err := m.Lookup("run-1")
	if err != nil {
		t.Fatal(err)
	}
	peerAddr := net.JoinHostPort(peer.IP.String(), "8080")
	peerURL := "http://" + peerAddr + "/hello.txt"
	var body []byte
	for i := 0; i < 50; i++ { // httpd may not listen yet right after create
		if resp, err := markedClient(m).Get(peerURL); err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if string(body) != "hello-from-context\n" {
		t.Fatalf("host -> %s: %q, want the built sandbox's httpd to answer", peerURL, body)
	}
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = conn.Write([]byte("HTTP/1.0 200 OK\r\n\r\nhost-secret\n"))
			conn.Close()
		}
	}()
	hostAddr := net.JoinHostPort(m.Gateway().String(), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	// nc, not wget: busybox-static's wget segfaults inside gVisor (even for 1.2.3.4).
	for _, target := range []string{peerAddr, hostAddr} {
		host, port, _ := net.SplitHostPort(target)
		df := "FROM localhost/sandboxd/busybox:latest\nRUN printf 'GET /hello.txt HTTP/1.0\\r\\n\\r\\n' | nc -w 3 " + host + " " + port + "\n"
		if _, stderr, code := execIn(t, c, "sh", "-c", "printf '%s' \"$1\" > /build/ctx/Dockerfile.net", "sh", df); code != 0 {
			t.Fatalf("write Dockerfile.net: %s", stderr)
		}
		stdout, stderr, code, _ := build("Dockerfile.net", "")
		out := stdout + stderr
		if code == 0 || strings.Contains(out, "hello-from-context") || strings.Contains(out, "host-secret") ||
			!strings.Contains(out, `STEP "RUN printf`) || !strings.Contains(out, "nc: timed out") {
			t.Errorf("a RUN reaching %s: exit %d, want nc to time out and the step named\n%s", target, code, out)
		}
		t.Logf("RUN reaching %s: %s", target, finalLine(stderr))
	}
	if err := b.Destroy(ctx, "run-1"); err != nil {
		t.Fatal(err)
	}

	// A rebuild of the unchanged context takes every step from the layer cache (in the
	// builder's storage: a per-organization cache volume in the platform).
	stdout, stderr, code, took = build("Dockerfile", "")
	if code != 0 {
		t.Fatalf("rebuild: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if n := strings.Count(stdout+stderr, "Using cache"); n != buildSteps {
		t.Errorf("rebuild: %d steps from the cache, want all %d\n%s\n%s", n, buildSteps, stdout, stderr)
	}
	t.Logf("rebuild with an unchanged context (all cached): %v", took)

	// A failing RUN names its step.
	stdout, stderr, code, _ = build("Dockerfile.fail", "")
	if code == 0 || !strings.Contains(stderr, `STEP "RUN echo about to fail && exit 7"`) {
		t.Errorf("failing build: exit %d, want non-zero and the step named\n%s\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout+stderr, "about to fail") || strings.Contains(stdout+stderr, "never\n") {
		t.Errorf("failing build: output of the steps before and after the failure\n%s\n%s", stdout, stderr)
	}
}

// buildTestNetwork is TestBuildInGVisor's test network (withNetwork's index).
const buildTestNetwork = 21

func finalLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// sendDir unpacks the host dir src into the builder at dst (created empty).
func sendDir(ctx context.Context, t *testing.T, c agentv1connect.AgentServiceClient, src, dst string, limits runtime.ArchiveLimits) {
	t.Helper()
	if out, stderr, code := execIn(t, c, "mkdir", "-p", dst); code != 0 {
		t.Fatalf("mkdir %s: %s %s", dst, out, stderr)
	}
	root, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	pr, pw := io.Pipe()
	go func() {
		_, err := fsarchive.Write(ctx, root, pw, fsarchive.IDMap{})
		pw.CloseWithError(err)
	}()
	stream := c.ExtractPath(ctx)
	first := &agentv1.ExtractPathRequest{Path: dst, MaxBytes: limits.MaxBytes, MaxFiles: limits.MaxFiles}
	buf := make([]byte, 1<<20)
	for {
		n, rerr := pr.Read(buf)
		if n > 0 || first != nil {
			m := first
			if m == nil {
				m = &agentv1.ExtractPathRequest{}
			}
			first = nil
			m.Data = append([]byte(nil), buf[:n]...)
			if err := stream.Send(m); err != nil {
				break // the answer says why
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		} else if rerr != nil {
			t.Fatalf("archive %s: %v", src, rerr)
		}
	}
	if _, err := stream.CloseAndReceive(); err != nil {
		t.Fatalf("extract %s into %s: %v", src, dst, err)
	}
}

// receiveDir unpacks the builder's dir src into the new host dir dst, within limits.
func receiveDir(ctx context.Context, t *testing.T, c agentv1connect.AgentServiceClient, src, dst string, limits runtime.ArchiveLimits) {
	t.Helper()
	if err := os.Mkdir(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	root, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	stream, err := c.ArchivePath(ctx, connect.NewRequest(&agentv1.ArchivePathRequest{Path: src}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	pr, pw := io.Pipe()
	go func() {
		for stream.Receive() {
			if d := stream.Msg().GetData(); len(d) > 0 {
				if _, err := pw.Write(d); err != nil {
					return
				}
			}
		}
		err := stream.Err()
		if err == nil {
			err = io.EOF
		}
		pw.CloseWithError(err)
	}()
	if _, err := fsarchive.Extract(ctx, pr, root, limits, fsarchive.IDMap{}); err != nil {
		pr.CloseWithError(err)
		t.Fatalf("archive of %s: %v", src, fmt.Errorf("extract: %w", err))
	}
}
