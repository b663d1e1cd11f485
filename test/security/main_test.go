// Package security is the standing adversarial suite: each test performs an attack a
// tenant (or anyone on the network) could try against a real `sandboxd dev` — from
// outside with API keys of two organizations, and from inside sandboxes as root — and
// asserts that it is refused. Every hole found gets a test here, kept forever.
//
// The suite builds sandboxd and the agent, starts one `sandboxd dev` on loopback ports
// of its own for the whole package, and makes user keys of two organizations. It needs
// root (containers); without it, or with -short, every test skips, and where root is
// required (testenv.RequireRoot: CI) that is an error.
package security

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
	"github.com/sandboxd/sandboxd/internal/testenv"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// Dev is the running `sandboxd dev` the suite attacks.
type Dev struct {
	Bin, DataDir, Log string
	// API is the base URL of the public API (gRPC, Connect, gRPC-Web, REST on one port);
	// Edge the public endpoints' HTTPS address; DataPlane the direct mTLS data plane's.
	API, Edge, DataPlane string
	// Admin is the default organization's admin key; KeyA and KeyB user keys of the
	// organizations "org-a" and "org-b".
	Admin, KeyA, KeyB string
	// Bridge, Subnet and CgroupParent are the server's own (derived from the process ID,
	// as stacktest's are): another `sandboxd dev` on the host (another checkout's suite,
	// the conformance suite) shares none of them, nor the nftables table and the DNS
	// address that go with them. With the defaults, the second server failed to start
	// (its DNS address taken) or rewrote the first's nftables table without its rules.
	Bridge, CgroupParent string
	Subnet               netip.Prefix
	proc                 *exec.Cmd
}

// sandboxSubnet is the subnet of the suite's server (the default before it starts).
func sandboxSubnet() netip.Prefix {
	if dev != nil && dev.Subnet.IsValid() {
		return dev.Subnet
	}
	return netip.MustParsePrefix("10.88.0.0/16")
}

// bridgeAddr is the bridge's address, the sandboxes' gateway.
func (d *Dev) bridgeAddr() netip.Addr { return d.Subnet.Addr().Next() }

var (
	dev *Dev
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if !testenv.HaveRoot() {
		return m.Run() // every test skips, or fails where root is required (needDev)
	}
	d, err := startDev()
	if err != nil {
		fmt.Println("security:", err)
		if d != nil {
			d.stop()
			fmt.Println(tailFile(d.Log, 4000))
		}
		return 1
	}
	dev = d
	code := m.Run()
	if leaks := d.purgeAndCheck(); len(leaks) > 0 {
		fmt.Println("security: sandboxes left something behind after they were deleted:\n  " + strings.Join(leaks, "\n  "))
		code = 1
	}
	if code != 0 {
		fmt.Println("---- sandboxd dev log (tail)\n" + tailFile(d.Log, 6000))
	}
	d.stop()
	return code
}

// needDev skips without the suite's server (not root, -short), or fails where root is
// required (testenv.RequireRoot).
func needDev(t testing.TB) *Dev {
	t.Helper()
	testenv.RequireRoot(t, "sandboxd dev runs containers")
	return dev
}

func startDev() (*Dev, error) {
	dir, err := os.MkdirTemp("", "sandboxd-security-")
	if err != nil {
		return nil, err
	}
	pid := os.Getpid()
	d := &Dev{Bin: filepath.Join(dir, "bin"), DataDir: filepath.Join(dir, "data"), Log: filepath.Join(dir, "sandboxd.log"),
		Bridge:       fmt.Sprintf("sbxsec%04x", pid&0xffff),
		Subnet:       netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(150 + pid%50), byte(pid / 50 % 256), 0}), 24),
		CgroupParent: fmt.Sprintf("sandboxd-security-%d", pid)}
	if err := os.MkdirAll(d.Bin, 0o755); err != nil {
		return nil, err
	}
	if given := os.Getenv("SANDBOXD_SECURITY_BIN"); given != "" {
		// Attack a given build (e.g. an older one, to see a test fail on its hole).
		if err := exec.Command("cp", given, filepath.Join(d.Bin, "sandboxd")).Run(); err != nil {
			return nil, err
		}
	} else {
		cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(d.Bin, "sandboxd"), "github.com/sandboxd/sandboxd/cmd/sandboxd")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build sandboxd: %w\n%s", err, out)
		}
	}
	// Under SANDBOXD_ENGINE_IMAGE=1 (CI builds the engine image in the background) dev
	// must start with it: dev itself never waits for the build.
	if testimage.EngineImageRequired() && local.FindRunsc() != "" {
		if _, err := testimage.EngineTar(); err != nil {
			return nil, err
		}
	}
	// sandboxd dev finds the agent next to itself.
	if _, err := testenv.Agent(d.Bin); err != nil {
		return nil, err
	}
	api, edge, dp := freeAddr(), freeAddr(), freeAddr()
	d.API, d.Edge, d.DataPlane = "http://"+api, edge, dp
	logf, err := os.Create(d.Log)
	if err != nil {
		return nil, err
	}
	d.proc = exec.Command(filepath.Join(d.Bin, "sandboxd"), "dev", "--data-dir", d.DataDir, "--listen", api,
		"--edge-listen", edge, "--data-plane-listen", dp, "--warm-pool", "0",
		"--bridge", d.Bridge, "--subnet", d.Subnet.String(), "--cgroup-parent", d.CgroupParent)
	d.proc.Stdout, d.proc.Stderr = logf, logf
	if err := d.proc.Start(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get(d.API + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			return d, fmt.Errorf("sandboxd dev not ready after 90 s")
		}
		if d.proc.ProcessState != nil {
			return d, fmt.Errorf("sandboxd dev exited")
		}
		time.Sleep(200 * time.Millisecond)
	}
	key, err := os.ReadFile(filepath.Join(d.DataDir, "admin-api-key"))
	if err != nil {
		return d, err
	}
	d.Admin = strings.TrimSpace(string(key))
	if d.KeyA, err = d.NewKey("org-a", "user"); err != nil {
		return d, err
	}
	if d.KeyB, err = d.NewKey("org-b", "user"); err != nil {
		return d, err
	}
	return d, nil
}

// Pid is the process ID of the running `sandboxd dev` (its memory is measured).
func (d *Dev) Pid() int { return d.proc.Process.Pid }

// NewKey makes an API key of org with role (user or admin).
func (d *Dev) NewKey(org, role string) (string, error) {
	out, err := exec.Command(filepath.Join(d.Bin, "sandboxd"), "apikey", "create", "--data-dir", d.DataDir,
		"--org", org, "--role", role).Output()
	if err != nil {
		return "", fmt.Errorf("apikey create --org %s: %w", org, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func (d *Dev) stop() {
	if d.proc != nil && d.proc.Process != nil && d.proc.ProcessState == nil {
		_ = d.proc.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = d.proc.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = d.proc.Process.Kill()
			<-done
		}
	}
	// Sandboxes outlive `sandboxd dev` by design; the suite's own go with it.
	if d.DataDir != "" {
		cleanupDev(d)
	}
}

// purgeAndCheck deletes every sandbox still there (of both organizations and the admin's),
// waits for the runner to tear them down and returns what is left of them on the host:
// sandbox dirs, mounts below the data dir (but the network's netns dir) and loop devices
// backed by its files.
func (d *Dev) purgeAndCheck() []string {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, key := range []string{d.Admin, d.KeyA, d.KeyB} {
		_, _ = d.sandboxes(key).PurgeSandboxes(ctx, connect.NewRequest(&sandboxv1.PurgeSandboxesRequest{PurgeAll: true}))
	}
	sbDir := filepath.Join(d.DataDir, "sandboxes")
	var left []string
	for ctx.Err() == nil {
		left = left[:0]
		ents, _ := os.ReadDir(sbDir)
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") {
				left = append(left, "sandbox dir "+e.Name())
			}
		}
		if len(left) == 0 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	// The runner keeps each organization's image build cache (a kept volume in its volume
	// pool) after the builder is gone, by design, so the pool stays mounted while one
	// exists (the backend's Close unmounts it: volPool.close).
	// Likewise the pool, once a sandbox used it (sized scratch volumes, GLOBAL volume
	// copies, restores), stays mounted until the backend closes; what must be gone is
	// every sandbox's volume and capture in it.
	pool := filepath.Join(d.DataDir, "sandboxes", ".volumes")
	kept, _ := os.ReadDir(filepath.Join(pool, "mnt", "keep"))
	sbxVols, _ := os.ReadDir(filepath.Join(pool, "mnt", "sbx"))
	captures, _ := os.ReadDir(filepath.Join(pool, "mnt", "captures"))
	for _, e := range sbxVols {
		left = append(left, "pool volume sbx/"+e.Name())
	}
	for _, e := range captures {
		left = append(left, "pool capture captures/"+e.Name())
	}
	_, poolUsed := os.Stat(filepath.Join(pool, "mnt", "sbx"))
	for _, l := range stacktest.Leftovers(d.DataDir) {
		switch {
		case strings.HasPrefix(l, "sandbox dir "): // those were waited for above
		case (len(kept) > 0 || poolUsed == nil) && (l == "mount "+filepath.Join(pool, "mnt") || strings.HasSuffix(l, "("+filepath.Join(pool, "pool.img")+")")):
		default:
			left = append(left, l)
		}
	}
	return left
}

// cleanupDev removes what the suite's server leaves on purpose (running sandboxes), with
// the same commands an operator would use.
func cleanupDev(d *Dev) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	roots, _ := filepath.Glob(filepath.Join(d.DataDir, "sandboxes", ".oci", "*"))
	for _, root := range roots {
		bin := "runc"
		if filepath.Base(root) == "gvisor" {
			continue // runsc state is removed with its containers' processes below
		}
		out, _ := exec.CommandContext(ctx, bin, "--root", root, "list", "-q").Output()
		for id := range strings.FieldsSeq(string(out)) {
			_ = exec.CommandContext(ctx, bin, "--root", root, "delete", "--force", id).Run()
		}
	}
	stacktest.ForceClean(filepath.Dir(d.DataDir))
	// The server's own bridge, nftables table and cgroup parent (it leaves them for its
	// next start, which there is not).
	if d.Bridge != "" {
		if m, err := network.New(network.Config{Bridge: d.Bridge, Subnet: d.Subnet, Table: "sandboxd_" + d.Bridge,
			StateDir: filepath.Join(d.DataDir, "network")}); err == nil {
			if err := m.Cleanup(); err != nil {
				fmt.Println("security: network cleanup:", err)
			}
		}
		parents, _ := filepath.Glob("/sys/fs/cgroup/*/" + d.CgroupParent)
		for _, p := range parents {
			_ = os.Remove(p) // rmdir: fails, rightly, if a sandbox's cgroup is still inside
		}
	}
	_ = os.RemoveAll(filepath.Dir(d.DataDir))
}

func freeAddr() string {
	a, err := testenv.FreeAddr()
	if err != nil {
		panic(err)
	}
	return a
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.ToValidUTF8(b, []byte("?")))
}
