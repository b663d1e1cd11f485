package runner

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// snapBackend is a Fake that snapshots and restores scratch volumes kept as
// directories under root/<sandbox>/<volume> (no root needed): a capture copies the
// volume's files into memory, its archive is a plain tar of them; a restore caches the
// archive's bytes by digest. It records the order of stops, captures and destroys.
type snapBackend struct {
	*runtimetest.Fake
	root string

	mu         sync.Mutex
	specs      map[string]runtime.Spec
	events     []string
	captureErr error
	// hold, when set, blocks every WriteArchive until it is closed.
	hold     chan struct{}
	prepares map[string]int // PrepareSnapshot calls per digest
	opens    int            // downloads (open calls)
	cache    map[string][]byte
	closed   int // captures closed
	created  []runtime.Spec
}

var (
	_ runtime.VolumeCapturer = (*snapBackend)(nil)
	_ runtime.SnapshotCache  = (*snapBackend)(nil)
)

func newSnapBackend(t *testing.T) *snapBackend {
	f := runtimetest.NewFake()
	t.Cleanup(f.Close)
	return &snapBackend{Fake: f, root: t.TempDir(), specs: map[string]runtime.Spec{}, prepares: map[string]int{}, cache: map[string][]byte{}}
}

func (b *snapBackend) event(e string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.events = append(b.events, e)
}

func (b *snapBackend) Events() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.events)
}

// Create makes the volumes' directories, after checking that every restored volume's
// archive was prepared.
func (b *snapBackend) Create(ctx context.Context, spec *runtime.Spec) (runtime.Info, error) {
	b.mu.Lock()
	for _, v := range spec.Volumes {
		if v.RestoreDigest != "" && b.cache[v.RestoreDigest] == nil {
			b.mu.Unlock()
			return runtime.Info{}, fmt.Errorf("volume %s: archive %s not prepared", v.Name, v.RestoreDigest)
		}
	}
	b.specs[spec.ID] = *spec
	b.created = append(b.created, *spec)
	b.mu.Unlock()
	for _, v := range spec.Volumes {
		if err := os.MkdirAll(filepath.Join(b.root, spec.ID, v.Name), 0o700); err != nil {
			return runtime.Info{}, err
		}
	}
	return b.Fake.Create(ctx, spec)
}

func (b *snapBackend) Stop(ctx context.Context, id string, grace time.Duration) error {
	b.event("stop")
	return b.Fake.Stop(ctx, id, grace)
}

func (b *snapBackend) Destroy(ctx context.Context, id string) error {
	b.event("destroy")
	return b.Fake.Destroy(ctx, id)
}

func (b *snapBackend) CaptureVolume(_ context.Context, id, volume string) (runtime.VolumeCapture, error) {
	b.event("capture:" + volume)
	b.mu.Lock()
	spec, ok := b.specs[id]
	err := b.captureErr
	b.mu.Unlock()
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	case !hasVolume(spec, volume):
		return nil, runtime.ErrVolumeNotFound
	case err != nil:
		return nil, err
	}
	files := map[string][]byte{}
	d := filepath.Join(b.root, id, volume)
	ents, err := os.ReadDir(d)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(d, e.Name()))
		if err != nil {
			return nil, err
		}
		files[e.Name()] = data
	}
	return &memCapture{b: b, files: files}, nil
}

type memCapture struct {
	b     *snapBackend
	files map[string][]byte
	once  sync.Once
}

func (c *memCapture) Pause() time.Duration { return 3 * time.Millisecond }

func (c *memCapture) WriteArchive(ctx context.Context, w io.Writer) (runtime.ArchiveStats, error) {
	c.b.mu.Lock()
	hold := c.b.hold
	c.b.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return runtime.ArchiveStats{}, ctx.Err()
		}
	}
	tw := tar.NewWriter(w)
	var st runtime.ArchiveStats
	names := make([]string, 0, len(c.files))
	for n := range c.files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		data := c.files[n]
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return st, err
		}
		if _, err := tw.Write(data); err != nil {
			return st, err
		}
		st.Files++
		st.Bytes += int64(len(data))
	}
	return st, tw.Close()
}

func (c *memCapture) Close() error {
	c.once.Do(func() {
		c.b.mu.Lock()
		c.b.closed++
		c.b.mu.Unlock()
	})
	return nil
}

func (b *snapBackend) PrepareSnapshot(ctx context.Context, digest string, limits runtime.ArchiveLimits, open func(context.Context) (io.ReadCloser, error)) error {
	b.mu.Lock()
	b.prepares[digest]++
	cached := b.cache[digest] != nil
	b.mu.Unlock()
	if cached {
		return nil
	}
	b.mu.Lock()
	b.opens++
	b.mu.Unlock()
	time.Sleep(50 * time.Millisecond) // a download takes a while: concurrent creates overlap it
	rc, err := open(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = rc.Close() }()
	data, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.cache[digest] = data
	b.mu.Unlock()
	return nil
}

func (b *snapBackend) CachedSnapshots(max int) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for d := range b.cache {
		out = append(out, d)
	}
	slices.Sort(out)
	return out[:min(len(out), max)]
}

// snapRunner starts a runner over be with a dir blob store, both in temp dirs.
func snapRunner(t *testing.T, be runtime.Backend, dataDir string, store blob.Store, cfg func(*Config)) *Runner {
	t.Helper()
	c := Config{Backend: be, DataDir: dataDir, Blobs: store}
	if cfg != nil {
		cfg(&c)
	}
	r, err := New(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func openStore(t *testing.T) *dir.Store {
	t.Helper()
	s, err := dir.Open(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// runningWithVolume creates a sandbox with scratch volumes "data" and "cache" and waits
// until it runs; data holds hello.txt.
func runningWithVolume(t *testing.T, r *Runner, be *snapBackend) Sandbox {
	t.Helper()
	sb, err := r.Create(context.Background(), CreateRequest{Spec: runtime.Spec{
		Container: runtime.Container{Image: "busybox", VolumeMounts: []runtime.VolumeMount{{Volume: "data", Path: "/data"}, {Volume: "cache", Path: "/cache"}}},
		Volumes:   []runtime.Volume{{Name: "data"}, {Name: "cache"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "sandbox running", func() bool { s, _ := r.Get(sb.ID); return s.State == StateRunning })
	if err := os.WriteFile(filepath.Join(be.root, sb.ID, "data", "hello.txt"), []byte("hello, snapshot"), 0o600); err != nil {
		t.Fatal(err)
	}
	return sb
}

func waitJob(t *testing.T, r *Runner, id string) SnapshotJob {
	t.Helper()
	var j SnapshotJob
	eventually(t, "snapshot job "+id+" finished", func() bool { j = r.GetSnapshotJob(id); return j.State != SnapshotCreating })
	return j
}

func reasonOf(err error) string { return apierr.Reason(err) }

// TestSnapshotJobReady: a snapshot of a running sandbox's volume is captured at once
// (CREATING, with the pause), uploaded in the background, and READY with the archive's
// size and sha256, which match the object stored under the job's key; the capture is
// closed. The same snapshot ID again returns the existing job.
func TestSnapshotJobReady(t *testing.T) {
	be, store := newSnapBackend(t), openStore(t)
	r := snapRunner(t, be, t.TempDir(), store, nil)
	defer r.Close()
	sb := runningWithVolume(t, r, be)
	tgt := SnapshotTarget{Volume: "data", SnapshotID: "fss-1", BlobKey: "fss/org-1/fss-1.tar.zst"}
	job, err := r.SnapshotVolume(context.Background(), sb.ID, tgt)
	if err != nil {
		t.Fatal(err)
	}
	if job.State != SnapshotCreating && job.State != SnapshotReady || job.Pause != 3*time.Millisecond || job.SandboxID != sb.ID || job.Volume != "data" {
		t.Fatalf("job = %+v", job)
	}
	j := waitJob(t, r, "fss-1")
	if j.State != SnapshotReady || j.ContentBytes != int64(len("hello, snapshot")) || j.CompleteTime.IsZero() {
		t.Fatalf("job = %+v", j)
	}
	info, err := store.Stat(context.Background(), tgt.BlobKey)
	if err != nil || info.Size != j.SizeBytes || info.SHA256 != j.Digest {
		t.Fatalf("object %+v, %v; job %+v", info, err, j)
	}
	rc, err := store.Get(context.Background(), tgt.BlobKey)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(rc)
	_ = rc.Close()
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != j.Digest || !bytes.Contains(data, []byte("hello, snapshot")) {
		t.Fatalf("the object is not the archive of the volume (%d bytes)", len(data))
	}
	eventually(t, "capture closed", func() bool { be.mu.Lock(); defer be.mu.Unlock(); return be.closed == 1 })

	again, err := r.SnapshotVolume(context.Background(), sb.ID, tgt)
	if err != nil || again != j {
		t.Fatalf("same ID again: %+v, %v; want %+v", again, err, j)
	}
	if n := strings.Count(strings.Join(be.Events(), ","), "capture:"); n != 1 {
		t.Fatalf("captured %d times, want once (idempotent): %v", n, be.Events())
	}
}

// TestSnapshotJobSizeExceeded: an archive past MaxSizeBytes fails the job
// CWSANDBOX_FSS_SIZE_EXCEEDED and stores nothing.
func TestSnapshotJobSizeExceeded(t *testing.T) {
	be, store := newSnapBackend(t), openStore(t)
	r := snapRunner(t, be, t.TempDir(), store, nil)
	defer r.Close()
	sb := runningWithVolume(t, r, be)
	if err := os.WriteFile(filepath.Join(be.root, sb.ID, "data", "big"), bytes.Repeat([]byte("x"), 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	tgt := SnapshotTarget{Volume: "data", SnapshotID: "fss-big", BlobKey: "fss/org-1/fss-big.tar.zst", MaxSizeBytes: 16 << 10}
	if _, err := r.SnapshotVolume(context.Background(), sb.ID, tgt); err != nil {
		t.Fatal(err)
	}
	j := waitJob(t, r, "fss-big")
	if j.State != SnapshotFailed || j.Reason != apierr.FSSSizeExceeded || !strings.Contains(j.Message, "16384") {
		t.Fatalf("job = %+v", j)
	}
	if _, err := store.Stat(context.Background(), tgt.BlobKey); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("object of a failed snapshot: %v", err)
	}
}

// TestSnapshotRefusals: not running, no such volume, no blob store or no capturing
// backend, malformed targets, the in-flight limit per sandbox (and per runner).
func TestSnapshotRefusals(t *testing.T) {
	ctx := context.Background()
	be, store := newSnapBackend(t), openStore(t)
	hold := make(chan struct{})
	be.hold = hold
	var releaseOnce sync.Once
	release := func() {
		releaseOnce.Do(func() {
			be.mu.Lock()
			be.hold = nil
			be.mu.Unlock()
			close(hold)
		})
	}
	defer release()
	r := snapRunner(t, be, t.TempDir(), store, func(c *Config) { c.SnapshotsPerRunner = 3 })
	defer r.Close()
	sb := runningWithVolume(t, r, be)
	tgt := func(id, vol string) SnapshotTarget {
		return SnapshotTarget{Volume: vol, SnapshotID: id, BlobKey: "fss/o/" + id + ".tar.zst"}
	}

	_, err := r.SnapshotVolume(ctx, sb.ID, tgt("v1", "nope"))
	if reasonOf(APIError(sb.ID, err, "")) != apierr.VolumeNotSnapshottable || connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("unknown volume: %v", err)
	}
	_, err = r.SnapshotVolume(ctx, "missing", tgt("v2", "data"))
	if !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("unknown sandbox: %v", err)
	}
	var verr *ValidationError
	if _, err = r.SnapshotVolume(ctx, sb.ID, SnapshotTarget{Volume: "data", SnapshotID: "../x", BlobKey: "/etc/passwd"}); !errors.As(err, &verr) || len(verr.Violations) != 2 {
		t.Errorf("malformed target: %v", err)
	}

	// Two in flight per sandbox (the default); the third is refused, retryable.
	for _, id := range []string{"a1", "a2"} {
		if j, err := r.SnapshotVolume(ctx, sb.ID, tgt(id, "data")); err != nil || j.State != SnapshotCreating {
			t.Fatalf("%s: %+v, %v", id, j, err)
		}
	}
	_, err = r.SnapshotVolume(ctx, sb.ID, tgt("a3", "cache"))
	if apierr.Reason(err) != apierr.FSSInflightLimit || connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("third in flight: %v", err)
	}
	if j := r.GetSnapshotJob("a3"); j.State != SnapshotFailed || !strings.Contains(j.Message, "unknown") || !j.Unknown {
		t.Errorf("a refused snapshot left a job: %+v", j)
	}
	// Per runner: 3; a second sandbox's first snapshot fits, its second does not.
	sb2 := runningWithVolume(t, r, be)
	if _, err := r.SnapshotVolume(ctx, sb2.ID, tgt("b1", "data")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.SnapshotVolume(ctx, sb2.ID, tgt("b2", "data")); apierr.Reason(err) != apierr.FSSInflightLimit {
		t.Fatalf("past the runner's limit: %v", err)
	}
	release()
	for _, id := range []string{"a1", "a2", "b1"} {
		if j := waitJob(t, r, id); j.State != SnapshotReady {
			t.Fatalf("%s: %+v", id, j)
		}
	}
	if _, err := r.SnapshotVolume(ctx, sb.ID, tgt("a3", "cache")); err != nil {
		t.Fatalf("after the others finished: %v", err)
	}

	// Not running.
	if _, err := r.Delete(sb2.ID, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := r.WaitTerminal(ctx, sb2.ID); err != nil {
		t.Fatal(err)
	}
	_, err = r.SnapshotVolume(ctx, sb2.ID, tgt("c1", "data"))
	if !errors.Is(err, ErrNotRunning) || apierr.Reason(APIError(sb2.ID, err, "")) != apierr.SandboxNotRunning {
		t.Errorf("ended sandbox: %v", err)
	}

	// No blob store; a backend that cannot capture.
	noStore := snapRunner(t, newSnapBackend(t), t.TempDir(), nil, nil)
	defer noStore.Close()
	if _, err := noStore.SnapshotVolume(ctx, sb.ID, tgt("d1", "data")); apierr.Reason(err) != apierr.FSSNotSupported {
		t.Errorf("no blob store: %v", err)
	}
	if !noStore.Support().NoSnapshots {
		t.Error("a runner without a blob store says it takes snapshots")
	}
	plain := snapRunner(t, runtimetest.NewFake(), t.TempDir(), store, nil)
	defer plain.Close()
	if _, err := plain.SnapshotVolume(ctx, sb.ID, tgt("d2", "data")); apierr.Reason(err) != apierr.FSSNotSupported {
		t.Errorf("backend without VolumeCapturer: %v", err)
	}
	if !plain.Support().NoSnapshots || r.Support().NoSnapshots {
		t.Errorf("NoSnapshots: plain %v, snapshotting %v", plain.Support().NoSnapshots, r.Support().NoSnapshots)
	}

	// A volume the backend cannot capture: refused FAILED_PRECONDITION with the backend's
	// reason (a Kubernetes volume mounted by sub_path only), no job kept.
	be.mu.Lock()
	be.captureErr = fmt.Errorf("%w: volume \"data\": no container mounts its root (container main mounts only its sub-path \"a/b\")", errdefs.ErrNotImplemented)
	be.mu.Unlock()
	_, err = r.SnapshotVolume(ctx, sb.ID, tgt("e1", "data"))
	be.mu.Lock()
	be.captureErr = nil
	be.mu.Unlock()
	if apierr.Reason(err) != apierr.FSSNotSupported || !strings.Contains(err.Error(), `cannot be captured by this runner's backend: volume "data": no container mounts its root (container main mounts only its sub-path "a/b")`) || strings.Contains(err.Error(), "not implemented") {
		t.Errorf("a volume the backend cannot capture: %v, want FSS_NOT_SUPPORTED with the backend's reason", err)
	}
	if j := r.GetSnapshotJob("e1"); j.State == SnapshotCreating || j.State == SnapshotReady {
		t.Errorf("a refused snapshot left a job: %+v", j)
	}
}

// TestSnapshotJobsSurviveRestart: a restarted runner reports finished jobs as they
// were; a job still uploading when the runner went away is FAILED ("the runner
// restarted during the upload") and its partial object deleted; an unknown ID is FAILED.
func TestSnapshotJobsSurviveRestart(t *testing.T) {
	ctx := context.Background()
	be, store, data := newSnapBackend(t), openStore(t), t.TempDir()
	r := snapRunner(t, be, data, store, nil)
	sb := runningWithVolume(t, r, be)
	if _, err := r.SnapshotVolume(ctx, sb.ID, SnapshotTarget{Volume: "data", SnapshotID: "done", BlobKey: "fss/o/done.tar.zst"}); err != nil {
		t.Fatal(err)
	}
	ready := waitJob(t, r, "done")
	be.mu.Lock()
	be.hold = make(chan struct{}) // never released: the upload is under way at the restart
	be.mu.Unlock()
	key := "fss/o/partial.tar.zst"
	if _, err := r.SnapshotVolume(ctx, sb.ID, SnapshotTarget{Volume: "data", SnapshotID: "partial", BlobKey: key}); err != nil {
		t.Fatal(err)
	}
	// What a crash may leave in the store: an object under the job's key.
	if _, err := store.Put(ctx, key, strings.NewReader("partial"), -1); err != nil {
		t.Fatal(err)
	}
	r.Close()

	r2 := snapRunner(t, be, data, store, nil)
	defer r2.Close()
	if j := r2.GetSnapshotJob("done"); j.State != SnapshotReady || j.Digest != ready.Digest || j.SizeBytes != ready.SizeBytes {
		t.Errorf("finished job after a restart: %+v, want %+v", j, ready)
	}
	j := r2.GetSnapshotJob("partial")
	if j.State != SnapshotFailed || j.Reason != apierr.FSSCreateFailed || j.Message != "the runner restarted during the upload" || j.Unknown {
		t.Errorf("interrupted job: %+v", j)
	}
	eventually(t, "the partial object deleted", func() bool {
		_, err := store.Stat(ctx, key)
		return errors.Is(err, blob.ErrNotFound)
	})
	if j := r2.GetSnapshotJob("never"); j.State != SnapshotFailed || !strings.Contains(j.Message, "unknown to this runner") || !j.Unknown {
		t.Errorf("unknown job: %+v", j)
	}
	if _, err := store.Stat(ctx, "fss/o/done.tar.zst"); err != nil {
		t.Errorf("a READY snapshot's object went with the restart: %v", err)
	}
}

// TestDeleteWithSnapshots: the volumes are captured after the containers stopped and
// before the sandbox is destroyed; the uploads finish after the destroy; a failed
// capture fails its job and the sandbox is destroyed anyway; a delete without targets
// is the plain Delete.
func TestDeleteWithSnapshots(t *testing.T) {
	ctx := context.Background()
	be, store := newSnapBackend(t), openStore(t)
	r := snapRunner(t, be, t.TempDir(), store, nil)
	defer r.Close()
	sb := runningWithVolume(t, r, be)
	targets := []SnapshotTarget{
		{Volume: "data", SnapshotID: "s-data", BlobKey: "fss/o/s-data.tar.zst"},
		{Volume: "cache", SnapshotID: "s-cache", BlobKey: "fss/o/s-cache.tar.zst"},
		{Volume: "nope", SnapshotID: "s-nope", BlobKey: "fss/o/s-nope.tar.zst"},
	}
	got, jobs, err := r.DeleteWithSnapshots(sb.ID, time.Second, targets)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateTerminating || len(jobs) != 3 || jobs[0].State != SnapshotCreating || jobs[1].State != SnapshotCreating ||
		jobs[2].State != SnapshotFailed || jobs[2].Reason != apierr.VolumeNotSnapshottable {
		t.Fatalf("delete: %+v, jobs %+v", got, jobs)
	}
	end, err := r.WaitTerminal(ctx, sb.ID)
	if err != nil || end.State != StateTerminated {
		t.Fatalf("ended %+v, %v", end, err)
	}
	if ev := be.Events(); !slices.Equal(ev, []string{"stop", "capture:data", "capture:cache", "destroy"}) {
		t.Fatalf("events %v, want stop, the captures, destroy", ev)
	}
	for _, id := range []string{"s-data", "s-cache"} {
		if j := waitJob(t, r, id); j.State != SnapshotReady {
			t.Fatalf("%s: %+v", id, j)
		}
	}
	if j := r.GetSnapshotJob("s-nope"); j.Reason != apierr.VolumeNotSnapshottable {
		t.Errorf("a refused target is not reported by GetSnapshotJob: %+v", j)
	}

	// A failing capture: the job FAILED, the sandbox destroyed all the same.
	be2 := newSnapBackend(t)
	be2.captureErr = errors.New("freeze: device busy")
	r2 := snapRunner(t, be2, t.TempDir(), store, nil)
	defer r2.Close()
	sb2 := runningWithVolume(t, r2, be2)
	if _, _, err := r2.DeleteWithSnapshots(sb2.ID, time.Second, targets[:1]); err != nil {
		t.Fatal(err)
	}
	if end, err := r2.WaitTerminal(ctx, sb2.ID); err != nil || end.State != StateTerminated {
		t.Fatalf("ended %+v, %v", end, err)
	}
	if ev := be2.Events(); !slices.Equal(ev, []string{"stop", "capture:data", "destroy"}) {
		t.Fatalf("events %v", ev)
	}
	if j := waitJob(t, r2, "s-data"); j.State != SnapshotFailed || j.Reason != apierr.FSSCreateFailed || !strings.Contains(j.Message, "capturing the volume failed") || strings.Contains(j.Message, "device busy") {
		t.Fatalf("job of a failed capture: %+v", j)
	}

	// No targets: Delete as ever.
	sb3 := runningWithVolume(t, r, be)
	before := len(be.Events())
	got, jobs, err = r.DeleteWithSnapshots(sb3.ID, time.Second, nil)
	if err != nil || jobs != nil || got.State != StateTerminating {
		t.Fatalf("plain delete: %+v, %v, %v", got, jobs, err)
	}
	if _, err := r.WaitTerminal(ctx, sb3.ID); err != nil {
		t.Fatal(err)
	}
	if ev := be.Events()[before:]; !slices.Equal(ev, []string{"stop", "destroy"}) {
		t.Fatalf("plain delete events %v", ev)
	}
	// An ended sandbox: nothing to capture, the jobs FAILED.
	_, jobs, err = r.DeleteWithSnapshots(sb3.ID, 0, []SnapshotTarget{{Volume: "data", SnapshotID: "late", BlobKey: "fss/o/late.tar.zst"}})
	if err != nil || len(jobs) != 1 || jobs[0].State != SnapshotFailed {
		t.Fatalf("delete of an ended sandbox: %+v, %v", jobs, err)
	}
}

// snapshotOf stores an archive of content under key and returns its source.
func snapshotOf(t *testing.T, store blob.Store, id, content string) SnapshotSource {
	t.Helper()
	info, err := store.Put(context.Background(), "fss/o/"+id+".tar.zst", strings.NewReader(content), -1)
	if err != nil {
		t.Fatal(err)
	}
	return SnapshotSource{SnapshotID: id, BlobKey: info.Key, Digest: info.SHA256, SizeBytes: info.Size, ContentBytes: int64(len(content))}
}

func restoreRequest(src SnapshotSource) CreateRequest {
	return CreateRequest{
		Spec: runtime.Spec{
			Container: runtime.Container{Image: "busybox", VolumeMounts: []runtime.VolumeMount{{Volume: "data", Path: "/data"}}},
			Volumes:   []runtime.Volume{{Name: "data", SizeBytes: 1 << 20}},
		},
		Restores: map[string]SnapshotSource{"data": src},
	}
}

// TestRestoreDownloadsOncePerDigest: twenty sandboxes created at once from one snapshot
// download it once; each starts with its volume's RestoreDigest set, and the limits
// bound it by the volume's size.
func TestRestoreDownloadsOncePerDigest(t *testing.T) {
	be, store := newSnapBackend(t), openStore(t)
	r := snapRunner(t, be, t.TempDir(), store, nil)
	defer r.Close()
	src := snapshotOf(t, store, "fss-src", "archive bytes")
	var wg sync.WaitGroup
	ids := make([]string, 20)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := r.Create(context.Background(), restoreRequest(src))
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = sb.ID
		}()
	}
	wg.Wait()
	for _, id := range ids {
		eventually(t, "restored sandbox running", func() bool { s, _ := r.Get(id); return s.State == StateRunning })
	}
	be.mu.Lock()
	opens, created := be.opens, slices.Clone(be.created)
	be.mu.Unlock()
	if opens != 1 {
		t.Fatalf("downloaded %d times for 20 creates of one snapshot, want once", opens)
	}
	for _, s := range created {
		if s.Volumes[0].RestoreDigest != src.Digest {
			t.Fatalf("volume created with RestoreDigest %q, want %s", s.Volumes[0].RestoreDigest, src.Digest)
		}
	}
	if got := r.CachedSnapshots(); !slices.Equal(got, []string{src.Digest}) {
		t.Errorf("CachedSnapshots = %v", got)
	}
}

// TestRestoreRefusals: an archive whose content does not match its digest fails the
// create (FAILED, CWSANDBOX_FSS_RESTORE_FAILED) and is not cached; a restore of a volume
// the spec lacks is a field violation; a runner without a blob store (or a backend
// without a SnapshotCache) refuses at create; a digest a caller set itself is dropped.
func TestRestoreRefusals(t *testing.T) {
	ctx := context.Background()
	be, store := newSnapBackend(t), openStore(t)
	r := snapRunner(t, be, t.TempDir(), store, nil)
	defer r.Close()
	src := snapshotOf(t, store, "fss-src", "archive bytes")
	bad := src
	bad.Digest = strings.Repeat("0", 64)
	sb, err := r.Create(ctx, restoreRequest(bad))
	if err != nil {
		t.Fatal(err)
	}
	end, err := r.WaitTerminal(ctx, sb.ID)
	if err != nil || end.State != StateFailed || end.Reason != apierr.FSSRestoreFailed || !strings.Contains(end.Message, apierr.FSSRestoreFailed) ||
		!strings.Contains(end.Message, "does not match its sha256") {
		t.Fatalf("digest mismatch: %+v, %v", end, err)
	}
	if len(be.CachedSnapshots(10)) != 0 {
		t.Fatalf("a mismatching archive was cached: %v", be.CachedSnapshots(10))
	}
	be.mu.Lock()
	nCreated := len(be.created)
	be.mu.Unlock()
	if nCreated != 0 {
		t.Fatal("the backend created a sandbox whose restore failed")
	}

	req := restoreRequest(src)
	req.Restores = map[string]SnapshotSource{"other": src}
	var verr *ValidationError
	if _, err := r.Create(ctx, req); !errors.As(err, &verr) || verr.Violations[0].Field != "spec.volumes" {
		t.Errorf("restore of a volume the spec lacks: %v", err)
	}
	req = restoreRequest(src)
	req.Restores["data"] = SnapshotSource{SnapshotID: "x", BlobKey: "fss/o/x", Digest: "nothex", SizeBytes: 1}
	if _, err := r.Create(ctx, req); !errors.As(err, &verr) || verr.Violations[0].Field != "spec.volumes[0].scratch.restore_from_snapshot_id" {
		t.Errorf("malformed source: %v", err)
	}

	noStore := snapRunner(t, newSnapBackend(t), t.TempDir(), nil, nil)
	defer noStore.Close()
	if _, err := noStore.Create(ctx, restoreRequest(src)); apierr.Reason(err) != apierr.FSSNotSupported {
		t.Errorf("no blob store: %v", err)
	}
	plain := snapRunner(t, runtimetest.NewFake(), t.TempDir(), store, nil)
	defer plain.Close()
	if _, err := plain.Create(ctx, restoreRequest(src)); apierr.Reason(err) != apierr.FSSNotSupported {
		t.Errorf("backend without SnapshotCache: %v", err)
	}

	// A RestoreDigest the caller set without a restore never reaches the backend.
	req = restoreRequest(src)
	req.Restores = nil
	req.Spec.Volumes[0].RestoreDigest = src.Digest
	sb, err = r.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "running", func() bool { s, _ := r.Get(sb.ID); return s.State == StateRunning })
	be.mu.Lock()
	last := be.created[len(be.created)-1]
	be.mu.Unlock()
	if last.Volumes[0].RestoreDigest != "" {
		t.Errorf("a caller's own RestoreDigest reached the backend: %q", last.Volumes[0].RestoreDigest)
	}
}

// TestLocalCapacityReportsSnapshots: Support.NoSnapshots and CachedSnapshots in the
// local handle's capacity.
func TestLocalCapacityReportsSnapshots(t *testing.T) {
	be, store := newSnapBackend(t), openStore(t)
	r := snapRunner(t, be, t.TempDir(), store, nil)
	defer r.Close()
	be.cache[strings.Repeat("a", 64)] = []byte("x")
	c, err := NewLocal("r1", r).Capacity(context.Background())
	if err != nil || c.NoSnapshots || !slices.Equal(c.CachedSnapshots, []string{strings.Repeat("a", 64)}) {
		t.Fatalf("capacity: NoSnapshots %v, cached %v, %v", c.NoSnapshots, c.CachedSnapshots, err)
	}
	noStore := snapRunner(t, newSnapBackend(t), t.TempDir(), nil, nil)
	defer noStore.Close()
	if c, _ := NewLocal("r2", noStore).Capacity(context.Background()); !c.NoSnapshots || c.CachedSnapshots != nil {
		t.Fatalf("without a blob store: NoSnapshots %v, cached %v", c.NoSnapshots, c.CachedSnapshots)
	}
}

// TestSnapshotJobsPruned: a finished job is forgotten (its file too) once
// SnapshotJobRetention has passed; a stray file in the job dir is removed.
func TestSnapshotJobsPruned(t *testing.T) {
	data := t.TempDir()
	jobs := filepath.Join(data, "snapshots")
	if err := os.MkdirAll(jobs, 0o700); err != nil {
		t.Fatal(err)
	}
	old := fmt.Sprintf(`{"job":{"SnapshotID":"old","State":%d},"blob_key":"fss/o/old","updated":%q}`, SnapshotReady, time.Now().Add(-SnapshotJobRetention-time.Hour).Format(time.RFC3339Nano))
	recent := fmt.Sprintf(`{"job":{"SnapshotID":"recent","State":%d},"blob_key":"fss/o/recent","updated":%q}`, SnapshotReady, time.Now().Add(-time.Hour).Format(time.RFC3339Nano))
	for name, body := range map[string]string{"old.json": old, "recent.json": recent, ".tmp-123": "x"} {
		if err := os.WriteFile(filepath.Join(jobs, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r := snapRunner(t, newSnapBackend(t), data, openStore(t), nil)
	defer r.Close()
	if j := r.GetSnapshotJob("recent"); j.State != SnapshotReady {
		t.Errorf("a job within its retention: %+v", j)
	}
	if j := r.GetSnapshotJob("old"); j.State != SnapshotFailed {
		t.Errorf("a job past its retention: %+v", j)
	}
	ents, _ := os.ReadDir(jobs)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"recent.json"}) {
		t.Errorf("job dir holds %v, want only recent.json", names)
	}
}

// liveSnapBackend captures only running sandboxes (runtime.LiveCapturer), as the
// Kubernetes backend does.
type liveSnapBackend struct{ *snapBackend }

func (liveSnapBackend) CapturesLive() bool { return true }

// TestDeleteWithSnapshotsLive: on a backend that captures only a running sandbox, a
// delete's volumes are captured before the stop, and the uploads complete.
func TestDeleteWithSnapshotsLive(t *testing.T) {
	ctx := context.Background()
	sbe, store := newSnapBackend(t), openStore(t)
	be := liveSnapBackend{sbe}
	r := snapRunner(t, be, t.TempDir(), store, nil)
	defer r.Close()
	sb := runningWithVolume(t, r, sbe)
	_, jobs, err := r.DeleteWithSnapshots(sb.ID, time.Second, []SnapshotTarget{
		{Volume: "data", SnapshotID: "l-data", BlobKey: "fss/o/l-data.tar.zst"},
		{Volume: "nope", SnapshotID: "l-nope", BlobKey: "fss/o/l-nope.tar.zst"},
	})
	if err != nil || len(jobs) != 2 || jobs[0].State != SnapshotCreating || jobs[1].State != SnapshotFailed {
		t.Fatalf("jobs %+v, %v", jobs, err)
	}
	if end, err := r.WaitTerminal(ctx, sb.ID); err != nil || end.State != StateTerminated {
		t.Fatalf("ended %+v, %v", end, err)
	}
	if ev := sbe.Events(); !slices.Equal(ev, []string{"capture:data", "stop", "destroy"}) {
		t.Fatalf("events %v, want the capture before the stop", ev)
	}
	if j := waitJob(t, r, "l-data"); j.State != SnapshotReady {
		t.Fatalf("job %+v", j)
	}
}
