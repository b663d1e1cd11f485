package local

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// poolEnv is newEnv with a warm pool on its Backend; the pool is closed (and checked
// empty) before newEnv's own cleanup checks for leaks.
func poolEnv(t *testing.T, size int, idle time.Duration) *env {
	t.Helper()
	return poolEnvCfg(t, PoolConfig{Size: size, Idle: idle})
}

func poolEnvCfg(t *testing.T, cfg PoolConfig) *env {
	t.Helper()
	e := newEnv(t)
	b, err := New(Config{OCIRuntime: testOCIRuntime,
		StateDir:     e.state,
		AgentBinary:  agentBin,
		CgroupParent: testCgroupParent,
		Images:       testImages{layers: []string{busyboxDir}},
		Pool:         cfg,
		Logger:       slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.b = b
	t.Cleanup(func() {
		if err := b.Close(context.Background()); err != nil {
			t.Errorf("close pool: %v", err)
		}
		if d := poolDirs(e.state); len(d) > 0 {
			t.Errorf("pooled containers left after Close: %v", d)
		}
	})
	return e
}

func poolDirs(state string) []string {
	ents, _ := os.ReadDir(state)
	var out []string
	for _, e := range ents {
		if isPoolID(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

func waitPoolReady(t *testing.T, b *Backend, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for b.PoolStats().Ready < n {
		if time.Now().After(deadline) {
			t.Fatalf("pool: %+v, want %d ready", b.PoolStats(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPoolClaim(t *testing.T) {
	e := poolEnv(t, 2, time.Minute)
	e.create(runtime.Spec{ID: "prime", Container: runtime.Container{Command: "true"}})
	waitPoolReady(t, e.b, 2)
	if st := e.b.PoolStats(); st.Claims != 0 || st.Refills != 2 {
		t.Fatalf("stats %+v", st)
	}

	const id = "pooled-1"
	start := time.Now()
	info := e.create(runtime.Spec{
		ID: id, Container: runtime.Container{Command: "sh", Args: []string{"-c", "echo started; cat /etc/motd; sleep 3600"}, Env: map[string]string{"FOO": "bar"}, WorkingDir: "/tmp", Files: []runtime.File{{Path: "/etc/motd", Content: []byte("hello file\n")}}, Resources: runtime.Resources{MilliCPU: 500, MemoryBytes: 256 << 20, Pids: 64}},
	})
	t.Logf("claimed create: %v", time.Since(start))
	if st := e.b.PoolStats(); st.Claims != 1 {
		t.Fatalf("no claim: %+v", st)
	}
	if info.ID != id || info.ImageDigest != "sha256:b0b0" || info.RuntimeClass != "runc" || info.StartedAt.IsZero() {
		t.Errorf("info %+v", info)
	}
	cid := e.b.containerID(id)
	if !isPoolID(cid) {
		t.Fatalf("container id %q", cid)
	}
	c := agentClient(e.b, id)
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}, "268435456"},
		{[]string{"cat", "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"}, "268435456"},
		{[]string{"cat", "/sys/fs/cgroup/pids/pids.max"}, "64"},
		{[]string{"cat", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"}, "50000"},
		{[]string{"hostname"}, id},
		{[]string{"cat", "/etc/hostname"}, id},
		{[]string{"cat", "/etc/hosts"}, id},
		{[]string{"env"}, "FOO=bar"},
		{[]string{"env"}, "FROM_IMAGE=1"},
		{[]string{"pwd"}, "/tmp"},
		{[]string{"cat", "/etc/motd"}, "hello file"},
		{[]string{"grep", "CapEff", "/proc/self/status"}, "00000000a80405fb"},
	} {
		out, errOut, code := execIn(t, c, tc.argv...)
		if !strings.Contains(out, tc.want) {
			t.Errorf("%q: %q (stderr %q, exit %d), want %q", tc.argv, out, errOut, code, tc.want)
		}
	}
	if out, _, _ := execIn(t, c, "cat", "/etc/hosts"); strings.Contains(out, "pool_") {
		t.Errorf("/etc/hosts still names the pooled container: %q", out)
	}
	// The main command's log starts at offset 0 with its own output.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{}))
	if err != nil || st.Msg.GetState() != agentv1.MainState_MAIN_STATE_RUNNING {
		t.Errorf("status %v, %v", st, err)
	}
	logs, err := c.Logs(ctx, connect.NewRequest(&agentv1.LogsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	first := int64(-1)
	for logs.Receive() {
		if first < 0 {
			first = int64(logs.Msg().GetOffset())
		}
		got.Write(logs.Msg().GetData())
	}
	if first != 0 || !strings.HasPrefix(got.String(), "started\nhello file\n") {
		t.Errorf("logs from offset %d: %q", first, got.String())
	}
	if d := e.b.LogDir(id, ""); !strings.HasPrefix(d, filepath.Join(e.state, id)+"/") {
		t.Errorf("LogDir %q", d)
	}
	// The runtime CLI reaches the container by the sandbox id too (its bundle dir moved).
	cmd, err := e.b.RuntimeCommand(context.Background(), id, "exec", id, "hostname")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != id {
		t.Errorf("runc exec: %q, %v", out, err)
	}
	if n, err := e.b.OOMKills(id); err != nil || n != 0 {
		t.Errorf("OOMKills = %d, %v", n, err)
	}

	// A restarted backend recovers it under its own id and removes the unclaimed pooled
	// container; Stop, Wait and Destroy work through it.
	waitPoolReady(t, e.b, 2)
	if err := e.b.Close(context.Background()); err != nil { // stop the refills
		t.Fatal(err)
	}
	b2 := e.backend()
	rs, err := b2.Recover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, r := range rs {
		if r.Spec.ID == id {
			found = r.Alive && r.Spec.Env["FOO"] == "bar" && r.Info.ImageDigest == "sha256:b0b0"
		}
		if isPoolID(r.Spec.ID) {
			t.Errorf("recovered a pooled container: %+v", r)
		}
	}
	if !found {
		t.Fatalf("recover: %+v", rs)
	}
	if d := poolDirs(e.state); len(d) != 0 {
		t.Errorf("pool dirs after recover: %v", d)
	}
	if out, _, _ := execIn(t, agentClient(b2, id), "hostname"); strings.TrimSpace(out) != id {
		t.Errorf("hostname after recover: %q", out)
	}
	if err := b2.Stop(context.Background(), id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	ex, err := b2.Wait(context.Background(), id)
	if err != nil || ex.Reason != "Stopped" && ex.Reason != "Completed" {
		t.Errorf("exit %+v, %v", ex, err)
	}
	if err := b2.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, id)
	checkNoLeaks(t, e.state, cid)
}

func TestPoolMainExitAndRestarts(t *testing.T) {
	e := poolEnv(t, 3, time.Minute)
	e.create(runtime.Spec{ID: "prime", Container: runtime.Container{Command: "true"}})
	for _, tc := range []struct {
		id       string
		argv     []string
		restarts int
		code     int32
		reason   string
	}{
		{"p-exit-ok", []string{"true"}, 0, 0, "Completed"},
		{"p-exit-3", []string{"sh", "-c", "exit 3"}, 0, 3, "RestartLimit"},
		{"p-exit-restarts", []string{"sh", "-c", "exit 4"}, 2, 4, "RestartLimit"},
	} {
		waitPoolReady(t, e.b, 1)
		claims := e.b.PoolStats().Claims
		e.create(runtime.Spec{ID: tc.id, Container: runtime.Container{Command: tc.argv[0], Args: tc.argv[1:], RestartLimit: tc.restarts}})
		if e.b.PoolStats().Claims != claims+1 {
			t.Fatalf("%s: not claimed: %+v", tc.id, e.b.PoolStats())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ex, err := e.b.Wait(ctx, tc.id)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if ex.ExitCode == nil || *ex.ExitCode != tc.code || ex.Restarts != tc.restarts || ex.Reason != tc.reason {
			t.Errorf("%s: exit %+v (code %v)", tc.id, ex, deref(ex.ExitCode))
		}
		cid := e.b.containerID(tc.id)
		if err := e.b.Destroy(context.Background(), tc.id); err != nil {
			t.Fatal(err)
		}
		checkNoLeaks(t, e.state, tc.id)
		checkNoLeaks(t, e.state, cid)
	}
}

func TestPoolIdleAndDrain(t *testing.T) {
	e := poolEnv(t, 2, 2*time.Second) // long enough to be seen ready on a loaded machine
	e.create(runtime.Spec{ID: "prime", Container: runtime.Container{Command: "true"}})
	waitPoolReady(t, e.b, 1)
	// Unused for longer than Idle: dropped.
	deadline := time.Now().Add(10 * time.Second)
	for e.b.PoolStats().Ready > 0 || len(poolDirs(e.state)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("idle pool not dropped: %+v %v", e.b.PoolStats(), poolDirs(e.state))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Drain destroys ready ones; the pool refills after the next create.
	e.create(runtime.Spec{ID: "prime2", Container: runtime.Container{Command: "true"}})
	waitPoolReady(t, e.b, 1)
	if err := e.b.DrainPool(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := poolDirs(e.state); len(d) > 0 || e.b.PoolStats().Ready != 0 {
		t.Errorf("after drain: %v %+v", d, e.b.PoolStats())
	}
	for _, m := range mustGlob("/sys/fs/cgroup/*/" + testCgroupParent + "/pool_*") {
		t.Errorf("leaked pooled cgroup %s", m)
	}
}

// A standby agent reports STANDBY, refuses execs, and starts only once.
func TestPoolStandbyAgent(t *testing.T) {
	e := poolEnv(t, 1, time.Minute)
	e.create(runtime.Spec{ID: "prime", Container: runtime.Container{Command: "true"}})
	waitPoolReady(t, e.b, 1)
	dirs := poolDirs(e.state)
	if len(dirs) != 1 {
		t.Fatalf("pool dirs %v", dirs)
	}
	// The agent may still be starting (`runc run` returns before it runs): Status waits.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var pi persistedInfo
	if err := readJSON(filepath.Join(e.state, dirs[0], fileInfo), &pi); err != nil || pi.Agent == nil {
		t.Fatalf("pooled container's info %+v: %v", pi, err)
	}
	if err := startAgent(ctx, nil, filepath.Join(e.state, dirs[0]), pi.Agent, []byte(`{"standby":true}`)); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("Start with a standby config: %v", err)
	}
	st, err := readStatus(filepath.Join(e.state, dirs[0]))
	if err != nil || st.GetState() != agentv1.MainState_MAIN_STATE_STANDBY {
		t.Fatalf("standby status %v, %v", st, err)
	}
	// Claim it, then a second Start is refused.
	e.create(runtime.Spec{ID: "standby-claimed", Container: runtime.Container{Command: "sleep", Args: []string{"60"}}})
	if e.b.PoolStats().Claims != 1 {
		t.Fatalf("not claimed: %+v", e.b.PoolStats())
	}
	err = startAgent(context.Background(), nil, filepath.Join(e.state, "standby-claimed"), pi.Agent, []byte(`{"argv":["true"]}`))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("second Start: %v", err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// TestPoolHardening: pooled containers carry the backend's disk limit and a user
// namespace range of their own into the sandbox that claims them; specs the pool cannot
// serve (another disk limit, a runtime security context, volumes) are created cold.
func TestPoolHardening(t *testing.T) {
	e := poolEnv(t, 1, time.Minute)
	e.b.cfg.DiskBytes = 64 << 20
	ctx := context.Background()
	e.create(runtime.Spec{ID: "first", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
	waitPoolReady(t, e.b, 1)

	e.create(runtime.Spec{ID: "claimer", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}, Security: &runtime.Security{RunAsUser: u32(1000)}}})
	if st := e.b.PoolStats(); st.Claims != 1 {
		t.Fatalf("pool stats %+v: a run-as user alone should be served from the pool", st)
	}
	c := agentClient(e.b, "claimer")
	if out, _, _ := execIn(t, c, "sh", "-c", "id -u; df -m / | tail -1 | awk '{print $2}'"); !strings.HasPrefix(out, "1000\n6") {
		t.Errorf("claimed sandbox: %q, want uid 1000 and a ~64 MiB root", out)
	}
	r1, r2 := hostIDs(t, e, "first"), hostIDs(t, e, "claimer")
	if r1 == r2 {
		t.Errorf("first and the claimed container share the range %+v", r1)
	}
	waitPoolReady(t, e.b, 1)
	for i, spec := range []runtime.Spec{
		{Container: runtime.Container{Resources: runtime.Resources{DiskBytes: 32 << 20}}},
		{Container: runtime.Container{Security: &runtime.Security{ReadOnlyRootFS: true}}},
		{Volumes: []runtime.Volume{{Name: "v"}}, Container: runtime.Container{VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/v"}}}},
	} {
		spec.ID, spec.Command, spec.Args = fmt.Sprintf("cold-%d", i), "sleep", []string{"3600"}
		e.create(spec)
		if st := e.b.PoolStats(); st.Claims != 1 {
			t.Errorf("%s: claimed from the pool (%+v)", spec.ID, st)
		}
		if err := e.b.Destroy(ctx, spec.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// countingImages counts pulls by reference and fails "unreachable…" references the way
// an unreachable registry would, with the network details a caller must not see.
type countingImages struct {
	testImages
	mu    sync.Mutex
	pulls map[string]int
}

func (c *countingImages) Pull(ctx context.Context, ref string, creds *runtime.Credentials) (*Image, error) {
	c.mu.Lock()
	c.pulls[ref]++
	c.mu.Unlock()
	if strings.HasPrefix(ref, "unreachable") {
		return nil, fmt.Errorf("%w: 127.0.0.1:18080: Get \"https://127.0.0.1:18080/v2/\": http: server gave HTTP response to HTTPS client; dial tcp 127.0.0.1:1: connect: connection refused; x509: certificate signed by unknown authority", image.ErrUnreachable)
	}
	return c.testImages.Pull(ctx, ref, creds)
}

func (c *countingImages) count(ref string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pulls[ref]
}

// TestPoolNoRepullAfterFailure: an image whose pull failed is not pulled again by the
// warm pool until a Create asks for it again; the Create's error names the image and a
// generic cause, not what answered.
func TestPoolNoRepullAfterFailure(t *testing.T) {
	e := newEnv(t)
	imgs := &countingImages{testImages: testImages{layers: []string{busyboxDir}}, pulls: map[string]int{}}
	b, err := New(Config{OCIRuntime: testOCIRuntime,
		StateDir: e.state, AgentBinary: agentBin, CgroupParent: testCgroupParent, Images: imgs,
		Pool:   PoolConfig{Size: 2, Idle: time.Minute},
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.b = b
	t.Cleanup(func() {
		if err := b.Close(context.Background()); err != nil {
			t.Errorf("close pool: %v", err)
		}
	})
	const ref = "unreachable.example/x:1"
	for round := 1; round <= 2; round++ {
		_, err := b.Create(context.Background(), &runtime.Spec{ID: fmt.Sprintf("fail-%d", round), Container: runtime.Container{Image: ref, Command: "true"}})
		if !errors.Is(err, runtime.ErrRegistry) {
			t.Fatalf("create: %v, want ErrRegistry", err)
		}
		msg := err.Error()
		for _, leak := range []string{"refused", "HTTP response", "x509", "127.0.0.1", "18080", "dial"} {
			if strings.Contains(msg, leak) {
				t.Errorf("the error tells the caller %q: %s", leak, msg)
			}
		}
		if !strings.Contains(msg, ref) {
			t.Errorf("the error does not name the image: %s", msg)
		}
		// The pool's first retry used to come after 2 s, then 4 s, 8 s, …
		time.Sleep(5 * time.Second)
		if n := imgs.count(ref); n != round {
			t.Fatalf("round %d: %d pulls of %s, want %d (one per Create)", round, n, ref, round)
		}
	}
	// A good image still gets its pool.
	e.create(runtime.Spec{ID: "good", Container: runtime.Container{Command: "true"}})
	waitPoolReady(t, b, 2)
}

// TestMapPullErrorSanitized: each kind of pull failure reaches the caller as the image
// and a generic cause wrapping the runtime's sentinel, never what answered.
func TestMapPullErrorSanitized(t *testing.T) {
	b := &Backend{log: slog.New(slog.NewTextHandler(testWriter{t}, nil))}
	const ref = "127.0.0.1:18080/x:1"
	detail := `Get "https://127.0.0.1:18080/v2/": dial tcp 127.0.0.1:18080: connect: connection refused; http: server gave HTTP response to HTTPS client; x509: certificate signed by unknown authority`
	for _, c := range []struct {
		in   error
		want error
	}{
		{fmt.Errorf("%w: %s", image.ErrUnreachable, detail), runtime.ErrRegistry},
		{fmt.Errorf("%w: %s", image.ErrNotFound, detail), runtime.ErrImageNotFound},
		{fmt.Errorf("%w: %s", image.ErrUnauthorized, detail), runtime.ErrImageUnauthorized},
		{fmt.Errorf("%w: %s", image.ErrInvalidReference, detail), runtime.ErrInvalidImageRef},
		{fmt.Errorf("%w: %s", image.ErrRegistryNotAllowed, detail), runtime.ErrRegistryNotAllowed},
		{fmt.Errorf("%w: %w: %s", runtime.ErrRegistry, image.ErrUnreachable, detail), runtime.ErrRegistry},
		{fmt.Errorf("%w: %s", image.ErrUnsafeLayer, detail), runtime.ErrRegistry},
		{fmt.Errorf("layer: %w (%s)", context.DeadlineExceeded, detail), context.DeadlineExceeded},
	} {
		err := b.mapPullError(ref, c.in)
		if !errors.Is(err, c.want) {
			t.Errorf("%v: got %v, want %v", c.in, err, c.want)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "pull "+ref+": ") {
			t.Errorf("does not name the image: %s", msg)
		}
		for _, leak := range []string{"refused", "HTTP response", "x509", "dial", "18080/v2"} {
			if strings.Contains(msg, leak) {
				t.Errorf("tells the caller %q: %s", leak, msg)
			}
		}
	}
}

// TestPoolFollowsDemand: after a burst of n Creates the pool refills to n (not Size),
// and once the demand has decayed (an injected clock) it shrinks back to Size.
func TestPoolFollowsDemand(t *testing.T) {
	const n = 6
	var (
		clockMu sync.Mutex
		skew    time.Duration
	)
	now := func() time.Time {
		clockMu.Lock()
		defer clockMu.Unlock()
		return time.Now().Add(skew)
	}
	e := poolEnvCfg(t, PoolConfig{Size: 1, Idle: time.Hour, Max: 16, now: now})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("burst%d", i)
			if _, err := e.b.Create(context.Background(), &runtime.Spec{ID: id, Container: runtime.Container{Image: "busybox", Command: "true"}}); err != nil {
				t.Errorf("create %s: %v", id, err)
				return
			}
			if err := e.b.Destroy(context.Background(), id); err != nil {
				t.Errorf("destroy %s: %v", id, err)
			}
		}()
	}
	wg.Wait()
	waitPoolReady(t, e.b, n)
	if st := e.b.PoolStats(); st.Want != n || len(st.Sets) != 1 || st.Sets[0].Demand != n {
		t.Fatalf("after a burst of %d: %+v", n, st)
	}
	clockMu.Lock()
	skew = demandHold + 10*demandHalfLife
	clockMu.Unlock()
	waitFor(t, func() bool { return e.b.PoolStats().Ready == 1 && len(poolDirs(e.state)) == 1 })
	if st := e.b.PoolStats(); st.Want != 1 || st.Dropped < n-1 {
		t.Fatalf("after the demand decayed: %+v, want 1 kept and the rest dropped", st)
	}
}

// TestPoolCloseDuringRefills: Close while several refills run leaves no pooled
// container behind (poolEnvCfg's cleanup checks).
func TestPoolCloseDuringRefills(t *testing.T) {
	e := poolEnvCfg(t, PoolConfig{Size: 4, Idle: time.Hour, Refills: 4})
	e.create(runtime.Spec{ID: "prime", Container: runtime.Container{Command: "true"}})
	waitFor(t, func() bool {
		st := e.b.PoolStats()
		return len(st.Sets) == 1 && st.Sets[0].Starting > 1
	})
	if err := e.b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := poolDirs(e.state); len(d) > 0 {
		t.Fatalf("pooled containers left after Close during refills: %v", d)
	}
}
