package kubernetes

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

func snapBackend(t *testing.T, cacheBytes int64) *Backend {
	t.Helper()
	return &Backend{
		cfg:       Config{SnapshotCacheDir: filepath.Join(t.TempDir(), "cache"), SnapshotCacheBytes: cacheBytes},
		log:       slog.New(slog.DiscardHandler),
		sandboxes: map[string]*sandbox{},
		snaps:     snapCache{limits: map[string]runtime.ArchiveLimits{}, inUse: map[string]int{}},
	}
}

func digestOfBytes(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// failingReader returns its content and then err (a digest mismatch as blob.Store.Get
// reports it).
type failingReader struct {
	r   io.Reader
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if errors.Is(err, io.EOF) {
		return n, f.err
	}
	return n, err
}

// PrepareSnapshot downloads once per digest (concurrent calls share it), keeps nothing
// of a failed download, and evicts the least recently used entries past the cache's
// size, never one a Create is restoring from.
func TestPrepareSnapshotCache(t *testing.T) {
	b := snapBackend(t, 250)
	ctx := context.Background()
	content := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, 100) }

	var opens atomic.Int32
	release := make(chan struct{})
	d0 := digestOfBytes(content(0))
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.PrepareSnapshot(ctx, d0, runtime.ArchiveLimits{MaxBytes: 7}, func(context.Context) (io.ReadCloser, error) {
				opens.Add(1)
				<-release
				return io.NopCloser(bytes.NewReader(content(0))), nil
			})
		}()
	}
	time.Sleep(100 * time.Millisecond)
	close(release)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := opens.Load(); n != 1 {
		t.Errorf("%d downloads of one digest, want 1", n)
	}
	if got, err := os.ReadFile(b.cachePath(d0)); err != nil || !bytes.Equal(got, content(0)) {
		t.Errorf("cached %q %v", got, err)
	}
	// Cached: open is not called again.
	if err := b.PrepareSnapshot(ctx, d0, runtime.ArchiveLimits{MaxBytes: 7}, func(context.Context) (io.ReadCloser, error) {
		t.Error("open called for a cached digest")
		return nil, errors.New("no")
	}); err != nil {
		t.Fatal(err)
	}

	// A mismatching download leaves nothing.
	bad := digestOfBytes([]byte("other"))
	err := b.PrepareSnapshot(ctx, bad, runtime.ArchiveLimits{}, func(context.Context) (io.ReadCloser, error) {
		return io.NopCloser(&failingReader{r: strings.NewReader("xx"), err: errors.New("digest mismatch")}), nil
	})
	if err == nil || !strings.Contains(err.Error(), "digest mismatch") {
		t.Errorf("mismatch: %v", err)
	}
	des, _ := os.ReadDir(b.cfg.SnapshotCacheDir)
	if len(des) != 1 {
		t.Errorf("cache holds %d entries after a failed download, want 1", len(des))
	}
	if err := b.PrepareSnapshot(ctx, "../../etc", runtime.ArchiveLimits{}, nil); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Errorf("bad digest: %v", err)
	}

	// d0 is in use by a Create: adding two more (300 bytes > 250) evicts d1, the least
	// recently used of the others, not d0.
	spec := &runtime.Spec{Container: runtime.Container{VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/data"}}},
		Volumes: []runtime.Volume{{Name: "v", RestoreDigest: d0}}}
	plan, rel, err := b.planRestores(spec)
	if err != nil || len(plan) != 1 || plan[0].container != "" || plan[0].path != "/data" || plan[0].limits.MaxBytes != 7 {
		t.Fatalf("plan %+v, %v", plan, err)
	}
	old := time.Now().Add(-time.Hour)
	_ = os.Chtimes(b.cachePath(d0), old, old)
	prep := func(i int) string {
		d := digestOfBytes(content(i))
		if err := b.PrepareSnapshot(ctx, d, runtime.ArchiveLimits{}, func(context.Context) (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(content(i))), nil
		}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	d1 := prep(1)
	_ = os.Chtimes(b.cachePath(d1), old.Add(time.Minute), old.Add(time.Minute))
	d2 := prep(2)
	if got := b.CachedSnapshots(10); strings.Join(got, ",") != d2+","+d0 {
		t.Errorf("cached %v, want d2 then d0 (d1 evicted)", got)
	}
	rel()
	d3 := prep(3)
	if got := b.CachedSnapshots(10); strings.Join(got, ",") != d3+","+d2 {
		t.Errorf("cached %v, want d3, d2 (d0 evicted once released)", got)
	}
	if got := b.CachedSnapshots(1); len(got) != 1 || got[0] != d3 {
		t.Errorf("cached(1) %v", got)
	}
	// An archive larger than the whole cache is refused.
	big := bytes.Repeat([]byte("z"), 300)
	if err := b.PrepareSnapshot(ctx, digestOfBytes(big), runtime.ArchiveLimits{}, func(context.Context) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(big)), nil
	}); err == nil {
		t.Error("an archive larger than the cache was taken")
	}
}

// Restores are refused before anything is made when no container mounts the volume,
// an init container mounts it, or its archive is not prepared; a sidecar's mount is
// used when the primary has none (one mounted only by sub-path or read-only goes
// through the filler: TestScratchRestoreThroughFiller).
func TestPlanRestores(t *testing.T) {
	b := snapBackend(t, 0)
	d := digestOfBytes([]byte("x"))
	if err := os.MkdirAll(b.cfg.SnapshotCacheDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b.cachePath(d), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	vols := []runtime.Volume{{Name: "v", RestoreDigest: d, SizeBytes: 5}}
	for name, tc := range map[string]struct {
		spec runtime.Spec
		want string
	}{
		"unmounted": {runtime.Spec{Volumes: vols}, "no container mounts it"},
		"init": {runtime.Spec{Container: runtime.Container{VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/d"}}}, Volumes: vols,
			InitContainers: []runtime.Container{{Name: "setup", VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/d"}}}}}, "init container setup"},
		"not prepared": {runtime.Spec{Container: runtime.Container{VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/d"}}},
			Volumes: []runtime.Volume{{Name: "v", RestoreDigest: digestOfBytes([]byte("y"))}}}, "not prepared"},
	} {
		_, rel, err := b.planRestores(&tc.spec)
		rel()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	spec := runtime.Spec{Container: runtime.Container{Name: "app", VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/ro", ReadOnly: true}}},
		Sidecars: []runtime.Container{{Name: "web", VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/rw"}}}}, Volumes: vols}
	plan, rel, err := b.planRestores(&spec)
	defer rel()
	if err != nil || len(plan) != 1 || plan[0].container != "web" || plan[0].path != "/rw" || plan[0].limits.MaxBytes != 5 {
		t.Errorf("plan %+v, %v; want web's /rw, at most the volume's 5 bytes", plan, err)
	}
	if _, _, err := (&Backend{}).planRestores(&spec); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("without a cache dir: %v", err)
	}
}

// CaptureVolume: an unknown volume is ErrVolumeNotFound, one mounted only by sub-path
// cannot be captured, an ended sandbox has nothing left; a capture holds Stop until it
// is closed.
func TestCaptureVolumeHold(t *testing.T) {
	b := snapBackend(t, 0)
	spec := runtime.Spec{ID: "x", Container: runtime.Container{VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: "/d", ReadOnly: true}, {Volume: "s", Path: "/s", SubPath: "a"}}},
		Volumes: []runtime.Volume{{Name: "v"}, {Name: "s"}}}
	s := &sandbox{id: "x", spec: spec, changed: make(chan struct{}), done: make(chan struct{})}
	b.sandboxes["x"] = s
	ctx := context.Background()
	if _, err := b.CaptureVolume(ctx, "x", "nope"); !errors.Is(err, runtime.ErrVolumeNotFound) {
		t.Errorf("unknown volume: %v", err)
	}
	if _, err := b.CaptureVolume(ctx, "x", "s"); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("sub-path volume: %v", err)
	}
	if _, err := b.CaptureVolume(ctx, "y", "v"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("unknown sandbox: %v", err)
	}
	c, err := b.CaptureVolume(ctx, "x", "v")
	if err != nil {
		t.Fatal(err)
	}
	if c.Pause() != 0 {
		t.Errorf("pause %s", c.Pause())
	}
	waited := make(chan struct{})
	go func() { b.waitCaptures(ctx, s); close(waited) }()
	select {
	case <-waited:
		t.Fatal("waitCaptures returned with a capture open")
	case <-time.After(100 * time.Millisecond):
	}
	_ = c.Close()
	_ = c.Close()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("waitCaptures still waiting after Close")
	}
	close(s.done)
	if _, err := b.CaptureVolume(ctx, "x", "v"); err == nil || !strings.Contains(err.Error(), "ended") {
		t.Errorf("ended sandbox: %v", err)
	}
}

// behindGate serves an agent of sandbox "x" (serve, on a listener proving its
// identity) behind a real gate, and returns a backend that reaches it, the sandbox
// (single-container, volume "v" mounted at mount) and a scratch directory.
func behindGate(t *testing.T, ctx context.Context, mount string, serve func(ln net.Listener, dir string)) (*Backend, *sandbox, string) {
	t.Helper()
	dir := t.TempDir()
	client, server := gateCerts(t, dir)
	ident := agent.NewIdentity("x")
	serve(agentListener(t, filepath.Join(dir, "primary.sock"), ident), dir)
	dial := startGate(t, ctx, dir, gate.ServeOptions{})
	b := snapBackend(t, 0)
	b.cfg.StartTimeout = 30 * time.Second
	b.cfg.Dial = dial
	spec := runtime.Spec{ID: "x", Container: runtime.Container{VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: mount}}},
		Volumes: []runtime.Volume{{Name: "v"}}}
	s := &sandbox{id: "x", spec: spec, client: client, server: server.Certificate[0], ident: ident,
		pod: &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.0.0.1"}}, changed: make(chan struct{}), done: make(chan struct{})}
	b.sandboxes["x"] = s
	return b, s, dir
}

// TestSnapshotThroughAgent: a capture and a restore go through a real agent (in
// standby, as a restoring Pod's is) behind a real gate: the capture's archive, cached by
// PrepareSnapshot, fills an empty mount with the content, and an archive over the
// restore's limits is refused as too large.
func TestSnapshotThroughAgent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agentDone := make(chan struct{})
	src := filepath.Join(t.TempDir(), "src")
	b, s, dir := behindGate(t, ctx, src, func(ln net.Listener, dir string) {
		go func() {
			defer close(agentDone)
			_, _ = agent.Run(ctx, agent.Options{Config: &agentconfig.Config{Standby: true, WorkingDir: dir}, StateDir: filepath.Join(dir, "run"), Listener: ln})
		}()
	})
	defer func() { cancel(); <-agentDone }()
	dst := filepath.Join(dir, "dst")
	for _, d := range []string{filepath.Join(src, "sub"), dst} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "sub", "f.txt"), []byte("snapshot content"), 0o640); err != nil {
		t.Fatal(err)
	}
	// The agent is held: Recover takes such a sandbox's Create as cut short.
	if !b.heldInStandby(ctx, s, "10.0.0.1") {
		t.Error("an agent in standby is not seen as held")
	}
	c, err := b.CaptureVolume(ctx, "x", "v")
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	stats, err := c.WriteArchive(ctx, &archive)
	_ = c.Close()
	if err != nil {
		t.Fatal(err)
	}
	if stats.Bytes != int64(len("snapshot content")) || stats.Files < 2 {
		t.Errorf("stats %+v", stats)
	}
	digest := digestOfBytes(archive.Bytes())
	open := func(context.Context) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(archive.Bytes())), nil
	}
	if err := b.PrepareSnapshot(ctx, digest, runtime.ArchiveLimits{MaxBytes: 1 << 20, MaxFiles: 100}, open); err != nil {
		t.Fatal(err)
	}

	// The restored spec mounts the volume at dst.
	s.spec = runtime.Spec{ID: "x", Container: runtime.Container{VolumeMounts: []runtime.VolumeMount{{Volume: "v", Path: dst}}},
		Volumes: []runtime.Volume{{Name: "v", RestoreDigest: digest}}}
	plan, rel, err := b.planRestores(&s.spec)
	if err != nil {
		t.Fatal(err)
	}
	defer rel()
	if err := b.runRestores(ctx, s, plan); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dst, "sub", "f.txt")); err != nil || string(got) != "snapshot content" {
		t.Errorf("restored %q, %v", got, err)
	}

	// Over its limits: refused as too large, nothing left.
	dst2 := filepath.Join(dir, "dst2")
	if err := os.MkdirAll(dst2, 0o755); err != nil {
		t.Fatal(err)
	}
	plan[0].path, plan[0].limits = dst2, runtime.ArchiveLimits{MaxBytes: 3}
	if err := b.runRestores(ctx, s, plan); !errors.Is(err, fsarchive.ErrTooLarge) {
		t.Errorf("restore over its limits: %v", err)
	}
	if des, _ := os.ReadDir(dst2); len(des) != 0 {
		t.Errorf("left %v", des)
	}

	// Once started, it is not held any more.
	startCfg, _ := json.Marshal(agentconfig.Config{Argv: []string{"sleep", "30"}, Env: []string{"PATH=/usr/bin:/bin"}})
	if _, err := b.agentClient("x", "").Start(ctx, connect.NewRequest(&agentv1.StartRequest{Config: startCfg})); err != nil {
		t.Fatal(err)
	}
	if b.heldInStandby(ctx, s, "10.0.0.1") {
		t.Error("a started agent is seen as held")
	}
}

// hostileAgent answers ArchivePath as a compromised agent might.
type hostileAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	mode string
}

func (h hostileAgent) ArchivePath(_ context.Context, _ *connect.Request[agentv1.ArchivePathRequest], st *connect.ServerStream[agentv1.ArchivePathResponse]) error {
	switch h.mode {
	case "huge":
		return st.Send(&agentv1.ArchivePathResponse{Data: make([]byte, 8<<20)})
	case "no-stats":
		return st.Send(&agentv1.ArchivePathResponse{Data: []byte("partial")})
	case "after-stats":
		_ = st.Send(&agentv1.ArchivePathResponse{Stats: &agentv1.ArchiveStats{Files: 1}})
		return st.Send(&agentv1.ArchivePathResponse{Data: []byte("more")})
	default: // negative statistics
		_ = st.Send(&agentv1.ArchivePathResponse{Data: []byte("x")})
		return st.Send(&agentv1.ArchivePathResponse{Stats: &agentv1.ArchiveStats{Files: -5, Bytes: -1 << 40, Skipped: -1}})
	}
}

// TestCaptureHostileAgent: what the sandbox's agent sends is bounded and checked: a
// message over 4 MiB is refused (not buffered), a stream without the final statistics
// or with data after them fails, negative statistics are clamped to zero.
func TestCaptureHostileAgent(t *testing.T) {
	for _, mode := range []string{"huge", "no-stats", "after-stats", "negative"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b, _, _ := behindGate(t, ctx, "/data", func(ln net.Listener, _ string) {
				mux := http.NewServeMux()
				mux.Handle(agentv1connect.NewAgentServiceHandler(hostileAgent{mode: mode}))
				srv := &http.Server{Handler: mux, Protocols: new(http.Protocols)}
				srv.Protocols.SetUnencryptedHTTP2(true)
				go func() { _ = srv.Serve(ln) }()
				t.Cleanup(func() { _ = srv.Close() })
			})
			c, err := b.CaptureVolume(ctx, "x", "v")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var buf bytes.Buffer
			stats, err := c.WriteArchive(ctx, &buf)
			switch mode {
			case "negative":
				if err != nil || stats != (runtime.ArchiveStats{}) || buf.String() != "x" {
					t.Errorf("stats %+v, %q, %v", stats, buf.String(), err)
				}
			default:
				if err == nil {
					t.Errorf("accepted (%d bytes)", buf.Len())
				}
				if buf.Len() > 16 {
					t.Errorf("%d bytes written", buf.Len())
				}
			}
		})
	}
}
