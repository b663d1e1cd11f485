package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// engineCompose is two services: web serves a page, client's healthcheck reaches web by
// name (dockerd's embedded DNS on the Compose network).
const engineCompose = `services:
  web:
    image: localhost/sandboxd/busybox:latest
    command: ["sh", "-c", "mkdir -p /www && echo hello-from-web > /www/index.html && exec httpd -f -p 80 -h /www"]
  client:
    image: localhost/sandboxd/busybox:latest
    command: ["sleep", "3600"]
    depends_on: [web]
    healthcheck:
      test: ["CMD", "sh", "-c", "nc -w 2 web 80 </dev/null"]
      interval: 1s
      timeout: 2s
      retries: 30
`

// engineBroken has a service that exits at once.
const engineBroken = `services:
  fine:
    image: localhost/sandboxd/busybox:latest
    command: ["sleep", "3600"]
  broken:
    image: localhost/sandboxd/busybox:latest
    command: ["false"]
`

// TestEngineImageUnderRunsc runs the engine test image (scripts/build-test-images.sh
// engine) under runsc directly, as the local backend's engine mode is to: all
// capabilities inside gVisor, --net-raw, the images handed in as docker-archive tarballs
// in a read-only /cws-engine. cws-engine starts dockerd; cws-engine-up loads the images
// and brings the Compose file up (two services, one reaching the other by name); `docker
// compose stop/start` of one service by exec work; a file whose service exits fails
// cws-engine-up naming that service. Nothing is left behind (mounts, cgroups, runsc
// state). TestEngineSandbox runs the same through Backend.Create.
func TestEngineImageUnderRunsc(t *testing.T) {
	testenv.RequireRoot(t, "runsc, mounts, cgroups")
	runsc := FindRunsc()
	if runsc == "" {
		t.Skip("runsc not built (make runsc)")
	}
	engineTar, err := testimage.EngineTar()
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

	dir := t.TempDir()
	rootfs, in, state := filepath.Join(dir, "rootfs"), filepath.Join(dir, "in"), filepath.Join(dir, "state")
	for _, d := range []string{rootfs, filepath.Join(in, "images"), filepath.Join(in, "bad"), state} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if out, err := exec.Command("tar", "--numeric-owner", "-xpf", engineTar, "-C", rootfs).CombinedOutput(); err != nil {
		t.Fatalf("unpack %s: %v: %s", engineTar, err, out)
	}
	t.Logf("unpacked the engine image in %v", time.Since(start))
	tag, _ := name.NewTag("localhost/sandboxd/busybox:latest")
	if err := tarball.WriteToFile(filepath.Join(in, "images", "busybox.tar"), tag, imgs.Busybox); err != nil {
		t.Fatal(err)
	}
	for p, c := range map[string]string{"compose.yaml": engineCompose, "project": "enginetest", "bad/compose.yaml": engineBroken, "bad/project": "broken"} {
		if err := os.WriteFile(filepath.Join(in, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	id := fmt.Sprintf("enginetest-%d", os.Getpid())
	cgroup := "/sandboxd-enginetest-" + fmt.Sprint(os.Getpid())
	caps := engineTestCaps()
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user": map[string]any{"uid": 0, "gid": 0}, "cwd": "/",
			"args":         []string{"/usr/local/bin/cws-engine"},
			"env":          []string{testimage.DefaultPath, "LANG=C.UTF-8"},
			"capabilities": map[string]any{"bounding": caps, "effective": caps, "permitted": caps},
		},
		"root":     map[string]any{"path": rootfs},
		"hostname": "cws-engine",
		"mounts": []any{
			map[string]any{"destination": "/proc", "type": "proc", "source": "proc"},
			map[string]any{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "mode=755"}},
			map[string]any{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
			map[string]any{"destination": "/cws-engine", "type": "bind", "source": in, "options": []string{"rbind", "ro"}},
		},
		"linux": map[string]any{
			"cgroupsPath": cgroup,
			"namespaces":  []any{map[string]any{"type": "pid"}, map[string]any{"type": "ipc"}, map[string]any{"type": "uts"}, map[string]any{"type": "mount"}, map[string]any{"type": "network"}},
		},
	}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	runCtx := func(ctx context.Context, args ...string) (string, string, error) {
		cmd := exec.CommandContext(ctx, runsc, append([]string{"--root", state, "--platform=systrap", "--net-raw", "--gofer-network-namespace=new"}, args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	run := func(args ...string) (string, string, error) { return runCtx(ctx, args...) }
	t.Cleanup(func() {
		// Not ctx: the test's deferred cancel has run by now.
		c, stop := context.WithTimeout(context.Background(), time.Minute)
		defer stop()
		_, _, _ = runCtx(c, "kill", id, "KILL")
		_, _, _ = runCtx(c, "delete", "-force", id)
		removeCgroupEverywhere(t, cgroup)
		if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), dir) {
			t.Errorf("mounts under %s left behind", dir)
		}
	})
	start = time.Now()
	// The sandbox's output goes to a file: dockerd keeps what it inherits open, and
	// `runsc run --detach` with pipes would wait for them forever.
	logPath := filepath.Join(dir, "engine.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	runCmd := exec.CommandContext(ctx, runsc, "--root", state, "--platform=systrap", "--net-raw", "--gofer-network-namespace=new", "run", "--bundle", dir, "--detach", id)
	runCmd.Stdout, runCmd.Stderr = logf, logf
	if err := runCmd.Run(); err != nil {
		out, _ := os.ReadFile(logPath)
		t.Fatalf("runsc run: %v: %s", err, out)
	}
	sh := func(script string) (string, string, error) { return run("exec", id, "sh", "-c", script) }
	if _, stderr, err := run("exec", id, "/usr/local/bin/cws-engine-up"); err != nil {
		out, _ := os.ReadFile(logPath)
		t.Fatalf("cws-engine-up: %v: %s\n-- dockerd:\n%s", err, stderr, tailBytes(out, 2000))
	}
	t.Logf("runsc run -> compose up --wait done (two services, one healthy through the other by name): %v", time.Since(start))

	const p = "docker compose -p enginetest -f /cws-engine/compose.yaml"
	if out, stderr, err := sh(p + ` stop web >/dev/null 2>&1 && ` + p + ` ps -a --format '{{.Service}} {{.State}}' | sort`); err != nil || out != "client running\nweb exited\n" {
		t.Fatalf("stop web: %q (%v) %s", out, err, stderr)
	}
	if out, _, _ := sh(`docker exec enginetest-client-1 sh -c 'nc -w 2 web 80 </dev/null && echo reached'`); strings.Contains(out, "reached") {
		t.Fatalf("web answered while stopped: %q", out)
	}
	if out, stderr, err := sh(p + ` start web >/dev/null 2>&1 && docker exec enginetest-client-1 sh -c 'printf "GET / HTTP/1.0\r\n\r\n" | nc -w 2 web 80'`); err != nil || !strings.Contains(out, "hello-from-web") {
		t.Fatalf("start web, then the client fetches it by name: %q (%v) %s", out, err, stderr)
	}

	// A service that exits: cws-engine-up fails naming it (and only it).
	_, stderr, err := run("exec", id, "/usr/local/bin/cws-engine-up", "/cws-engine/bad")
	if err == nil {
		t.Fatal("cws-engine-up of a file whose service exits succeeded")
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if last := lines[len(lines)-1]; last != "cws-engine: failing services: broken" {
		t.Errorf("last line of the failure = %q, want it to name service broken alone", last)
	}
}

// engineTestCaps is every capability runsc knows: inside gVisor they are the sandbox's.
func engineTestCaps() []string {
	return []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
		"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
		"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
		"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT",
		"CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME",
		"CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL",
		"CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
		"CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ"}
}

// removeCgroupEverywhere removes cgroup (a path under each v1 controller, or the v2
// root) and fails the test if one stays.
func removeCgroupEverywhere(t *testing.T, cgroup string) {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", cgroup))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", cgroup))
	for _, d := range dirs {
		if _, err := os.Stat(d); err != nil {
			continue
		}
		deadline := time.Now().Add(5 * time.Second)
		for os.Remove(d) != nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s left behind", d)
		}
	}
}

func tailBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
