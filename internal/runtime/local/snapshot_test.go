package local

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// volPoolEnv is newEnv for tests of the volume pool: skipped on a host without btrfs.
func volPoolEnv(t testing.TB) *env {
	t.Helper()
	e := newEnv(t)
	if !e.b.vols.available() {
		t.Skip("no btrfs volume pool on this host (mkfs.btrfs, btrfs in the kernel)")
	}
	return e
}

// archiveOf captures volume of sandbox id on b and returns the archive and its digest.
func archiveOf(t testing.TB, b *Backend, id, volume string) ([]byte, string, time.Duration) {
	t.Helper()
	c, err := b.CaptureVolume(context.Background(), id, volume)
	if err != nil {
		t.Fatalf("capture %s/%s: %v", id, volume, err)
	}
	defer c.Close()
	var buf bytes.Buffer
	if _, err := c.WriteArchive(context.Background(), &buf); err != nil {
		t.Fatalf("archive %s/%s: %v", id, volume, err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("close capture: %v", err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), hex.EncodeToString(sum[:]), c.Pause()
}

// extracted unpacks archive into a fresh dir (owners as stored) and returns it.
func extracted(t testing.TB, archive []byte) string {
	t.Helper()
	dir := t.TempDir()
	root, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if _, err := fsarchive.Extract(context.Background(), bytes.NewReader(archive), root, runtime.ArchiveLimits{}, fsarchive.IDMap{}); err != nil {
		t.Fatalf("extract: %v", err)
	}
	return dir
}

// prepare hands archive to b's snapshot cache.
func prepare(t testing.TB, b *Backend, archive []byte, digest string) {
	t.Helper()
	if err := b.PrepareSnapshot(context.Background(), digest, runtime.ArchiveLimits{}, func(context.Context) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(archive)), nil
	}); err != nil {
		t.Fatalf("prepare %s: %v", digest, err)
	}
}

func sh(t testing.TB, b *Backend, id, cmd string) string {
	t.Helper()
	out, errOut, code := execIn(t, agentClient(b, id), "sh", "-c", cmd)
	if code != 0 {
		t.Fatalf("%s in %s: exit %d: %s%s", cmd, id, code, out, errOut)
	}
	return strings.TrimSpace(out)
}

func volSpec(id, class string, vols []runtime.Volume, main string) runtime.Spec {
	sp := runtime.Spec{ID: id, RuntimeClass: class, Volumes: vols,
		Container: runtime.Container{Command: "sh", Args: []string{"-c", main}, Resources: runtime.Resources{MemoryBytes: 256 << 20}}}
	for _, v := range vols {
		sp.VolumeMounts = append(sp.VolumeMounts, runtime.VolumeMount{Volume: v.Name, Path: "/" + v.Name})
	}
	return sp
}

// writerLoop writes to /data without pause (the file tick changes all the time).
const writerLoop = "echo hello > /data/hello; mkdir -p /data/dir/sub; echo deep > /data/dir/sub/f; ln -s hello /data/link; " +
	"chown 1000:1001 /data/dir/sub/f; i=0; while :; do i=$((i+1)); echo $i > /data/tick; done"

// TestCaptureVolume captures a running sandbox's volume while it writes without pause,
// under runc and gVisor: the archive holds the volume's content, owners as the sandbox
// sees them, and the sandbox runs on. The capture then outlives the sandbox's Destroy.
func TestCaptureVolume(t *testing.T) {
	for _, class := range []string{"", GVisorClass} {
		name := class
		if name == "" {
			name = "runc"
		}
		t.Run(name, func(t *testing.T) {
			e := volPoolEnv(t)
			if class == GVisorClass && e.b.runtimes[GVisorClass] == nil {
				t.Skip("runsc not found")
			}
			id := "cap-" + name
			e.create(volSpec(id, class, []runtime.Volume{{Name: "data", SizeBytes: 64 << 20}}, writerLoop))
			waitFor(t, func() bool { return sh(t, e.b, id, "cat /data/tick 2>/dev/null || echo 0") > "1" })
			archive, _, pause := archiveOf(t, e.b, id, "data")
			t.Logf("pause %s, archive %d bytes", pause, len(archive))
			if pause <= 0 {
				t.Errorf("Pause = %s, want the measured freeze time", pause)
			}
			dir := extracted(t, archive)
			for f, want := range map[string]string{"hello": "hello\n", "dir/sub/f": "deep\n"} {
				if got, err := os.ReadFile(filepath.Join(dir, f)); err != nil || string(got) != want {
					t.Errorf("%s = %q, %v; want %q", f, got, err, want)
				}
			}
			if l, err := os.Readlink(filepath.Join(dir, "link")); err != nil || l != "hello" {
				t.Errorf("link -> %q, %v", l, err)
			}
			if _, err := os.Stat(filepath.Join(dir, "tick")); err != nil {
				t.Errorf("tick: %v", err)
			}
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(dir, "dir/sub/f"), &st); err != nil || st.Uid != 1000 || st.Gid != 1001 {
				t.Errorf("owner of dir/sub/f = %d:%d (%v), want 1000:1001 as the sandbox set it", st.Uid, st.Gid, err)
			}
			// The sandbox was thawed: it keeps writing.
			t1 := sh(t, e.b, id, "cat /data/tick")
			waitFor(t, func() bool { return sh(t, e.b, id, "cat /data/tick") != t1 })
			if ents, _ := os.ReadDir(filepath.Join(e.b.vols.mnt(), poolCaptures)); len(ents) != 0 {
				t.Errorf("captures left after Close: %d", len(ents))
			}

			// A capture taken before Destroy is archived after it.
			c, err := e.b.CaptureVolume(context.Background(), id, "data")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := e.b.Destroy(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(e.b.vols.mnt(), poolSandboxes, id)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("sandbox's volumes after Destroy: %v", err)
			}
			var buf bytes.Buffer
			if _, err := c.WriteArchive(context.Background(), &buf); err != nil {
				t.Fatalf("archive after Destroy: %v", err)
			}
			if got, _ := os.ReadFile(filepath.Join(extracted(t, buf.Bytes()), "hello")); string(got) != "hello\n" {
				t.Errorf("hello after Destroy = %q", got)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if e.b.vols.mounted() {
				t.Errorf("volume pool still mounted with nothing in it")
			}
		})
	}
}

// TestCaptureStoppedSandbox: a sandbox that has ended but is not destroyed yet (snapshot
// on delete) is captured without freezing anything.
func TestCaptureStoppedSandbox(t *testing.T) {
	e := volPoolEnv(t)
	e.create(volSpec("cap-stopped", "", []runtime.Volume{{Name: "data"}}, "echo bye > /data/last; exit 3"))
	if _, err := e.b.Wait(context.Background(), "cap-stopped"); err != nil {
		t.Fatal(err)
	}
	archive, _, _ := archiveOf(t, e.b, "cap-stopped", "data")
	if got, _ := os.ReadFile(filepath.Join(extracted(t, archive), "last")); string(got) != "bye\n" {
		t.Errorf("last = %q", got)
	}
}

// TestCaptureErrors: unknown sandbox, unknown volume.
func TestCaptureErrors(t *testing.T) {
	e := volPoolEnv(t)
	e.create(volSpec("cap-err", "", []runtime.Volume{{Name: "data"}, {Name: "mem", Medium: runtime.MediumMemory}}, "exec sleep 3600"))
	for _, tc := range []struct {
		id, vol string
		want    error
	}{
		{"nope", "data", runtime.ErrNotFound},
		{"cap-err", "nope", runtime.ErrVolumeNotFound},
	} {
		if _, err := e.b.CaptureVolume(context.Background(), tc.id, tc.vol); !errors.Is(err, tc.want) {
			t.Errorf("CaptureVolume(%s, %s) = %v, want %v", tc.id, tc.vol, err, tc.want)
		}
	}
}

// TestRestoreVolume: one archive prepared once (two concurrent PrepareSnapshot calls
// open it once) restores into two sandboxes, a sized one (the limit holds, EDQUOT at it)
// and one in another user namespace (owners as the snapshot's sandbox saw them); writes
// in one do not show in the other; a volume smaller than the content is refused.
func TestRestoreVolume(t *testing.T) {
	e := volPoolEnv(t)
	e.create(volSpec("src", "", []runtime.Volume{{Name: "data", SizeBytes: 64 << 20}},
		"dd if=/dev/urandom of=/data/blob bs=1M count=8 2>/dev/null; echo hello > /data/hello; mkdir /data/d; chown 1000:1001 /data/d; touch /data/done; exec sleep 3600"))
	waitFor(t, func() bool { return sh(t, e.b, "src", "test -f /data/done && echo y || echo n") == "y" })
	sum := sh(t, e.b, "src", "md5sum /data/blob | cut -d' ' -f1")
	archive, digest, _ := archiveOf(t, e.b, "src", "data")

	var opened atomic.Int32
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			errs <- e.b.PrepareSnapshot(context.Background(), digest, runtime.ArchiveLimits{}, func(context.Context) (io.ReadCloser, error) {
				opened.Add(1)
				time.Sleep(50 * time.Millisecond) // both calls are in flight
				return io.NopCloser(bytes.NewReader(archive)), nil
			})
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := opened.Load(); n != 1 {
		t.Errorf("archive opened %d times for two concurrent PrepareSnapshot calls, want 1", n)
	}
	prepare(t, e.b, archive, digest) // cached: not opened again
	if got := e.b.CachedSnapshots(10); len(got) != 1 || got[0] != digest {
		t.Errorf("CachedSnapshots = %v, want [%s]", got, digest)
	}

	vol := func(size int64) []runtime.Volume {
		return []runtime.Volume{{Name: "data", SizeBytes: size, RestoreDigest: digest}}
	}
	e.create(volSpec("r1", "", vol(32<<20), "exec sleep 3600"))
	e.create(volSpec("r2", "", vol(0), "exec sleep 3600"))
	for _, id := range []string{"r1", "r2"} {
		if got := sh(t, e.b, id, "cat /data/hello; md5sum /data/blob | cut -d' ' -f1; stat -c %u:%g /data/d; stat -c %u /data"); got != "hello\n"+sum+"\n1000:1001\n0" {
			t.Errorf("%s: restored volume shows %q", id, got)
		}
	}
	r1, _, _ := readIDRange(e.b.dir("r1"))
	r2, _, _ := readIDRange(e.b.dir("r2"))
	if r1.HostID == r2.HostID {
		t.Fatalf("r1 and r2 share an id range")
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(e.b.vols.volumePath("r2", 0), "d"), &st); err != nil || st.Uid != r2.HostID+1000 {
		t.Errorf("host owner of r2's d = %d (%v), want %d", st.Uid, err, r2.HostID+1000)
	}
	sh(t, e.b, "r1", "echo mine > /data/hello; echo new > /data/new")
	if got := sh(t, e.b, "r2", "cat /data/hello; ls /data"); got != "hello\nblob\nd\ndone\nhello" {
		t.Errorf("r2 sees r1's writes: %q", got)
	}
	// r1 is limited to 32 MiB, 8 of which the snapshot holds.
	if got := sh(t, e.b, "r1", "dd if=/dev/zero of=/data/fill bs=1M count=64 2>&1 | grep -q -E '"+fullErrors+"' && echo full; rm -f /data/fill"); got != "full" {
		t.Errorf("filling r1's restored 32 MiB volume: %q, want it full", got)
	}
	// Not prepared: a clear error.
	sp := volSpec("r4", "", []runtime.Volume{{Name: "data", RestoreDigest: strings.Repeat("ab", 32)}}, "exec sleep 3600")
	sp.Image = "busybox"
	if _, err := e.b.Create(context.Background(), &sp); err == nil || !strings.Contains(err.Error(), "not in the local backend's cache") {
		t.Errorf("restore of an unprepared snapshot: %v", err)
	}
}

// TestRestoreTooLarge: content larger than the volume is refused at Create.
func TestRestoreTooLarge(t *testing.T) {
	e := volPoolEnv(t)
	e.create(volSpec("big", "", []runtime.Volume{{Name: "data", SizeBytes: 64 << 20}},
		"dd if=/dev/zero of=/data/blob bs=1M count=20 2>/dev/null; touch /data/done; exec sleep 3600"))
	waitFor(t, func() bool { return sh(t, e.b, "big", "test -f /data/done && echo y || echo n") == "y" })
	archive, digest, _ := archiveOf(t, e.b, "big", "data")
	prepare(t, e.b, archive, digest)
	sp := volSpec("small", "", []runtime.Volume{{Name: "data", SizeBytes: 16 << 20, RestoreDigest: digest}}, "exec sleep 3600")
	sp.Image = "busybox"
	_, err := e.b.Create(context.Background(), &sp)
	if !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), `volume "data"`) {
		t.Errorf("restore of 20 MiB into 16 MiB: %v, want ErrInvalidSpec naming the volume", err)
	}
}

// TestSnapshotCacheEviction: beyond its budget the cache drops least recently used
// entries.
func TestSnapshotCacheEviction(t *testing.T) {
	e := newEnvWith(t, func(c *Config) { c.SnapshotCacheBytes = 3 << 20 })
	if !e.b.vols.available() {
		t.Skip("no btrfs volume pool on this host")
	}
	e.create(volSpec("ev", "", []runtime.Volume{{Name: "data"}}, "exec sleep 3600"))
	var digests []string
	for range 4 {
		sh(t, e.b, "ev", "rm -f /data/*; dd if=/dev/urandom of=/data/f bs=1M count=1 2>/dev/null")
		archive, digest, _ := archiveOf(t, e.b, "ev", "data")
		prepare(t, e.b, archive, digest)
		digests = append(digests, digest)
	}
	got := e.b.CachedSnapshots(10)
	if len(got) != 3 || got[0] != digests[3] || got[1] != digests[2] || got[2] != digests[1] {
		t.Errorf("CachedSnapshots = %v, want the last three of %v, newest first", got, digests)
	}
	if _, err := os.Stat(filepath.Join(e.b.vols.mnt(), poolCache, digests[0])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("evicted entry still there: %v", err)
	}
	// The cache survives a restart: Close unmounts the pool (no sandbox volume is left),
	// the next backend's Recover mounts it again.
	if err := e.b.Destroy(context.Background(), "ev"); err != nil {
		t.Fatal(err)
	}
	if err := e.b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e.b.vols.mounted() {
		t.Error("volume pool mounted after Close")
	}
	e.b = e.backend()
	if _, err := e.b.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if again := e.b.CachedSnapshots(10); !slices.Equal(again, got) {
		t.Errorf("CachedSnapshots after a restart = %v, want %v", again, got)
	}
}

// TestVolumePoolRecover: a new backend on the same state dir adopts sandboxes with pool
// volumes, also when the pool was unmounted meanwhile (a host restart), and captures
// and destroys them.
func TestVolumePoolRecover(t *testing.T) {
	e := volPoolEnv(t)
	e.create(volSpec("live", "", []runtime.Volume{{Name: "data"}}, "echo live > /data/f; exec sleep 3600"))
	b2 := e.backend()
	if _, err := b2.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return sh(t, b2, "live", "cat /data/f 2>/dev/null || true") == "live" })
	archive, _, _ := archiveOf(t, b2, "live", "data")
	if got, _ := os.ReadFile(filepath.Join(extracted(t, archive), "f")); string(got) != "live\n" {
		t.Errorf("f = %q", got)
	}
	if err := b2.Destroy(context.Background(), "live"); err != nil {
		t.Fatal(err)
	}

	// A stopped sandbox, and the pool unmounted under it.
	e.b = e.backend()
	e.create(volSpec("ended", "", []runtime.Volume{{Name: "data", SizeBytes: 32 << 20}}, "echo ended > /data/f"))
	if _, err := e.b.Wait(context.Background(), "ended"); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(e.b.vols.mnt(), 0); err != nil {
		t.Fatal(err)
	}
	b3 := e.backend()
	if _, err := b3.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !b3.vols.mounted() {
		t.Fatal("Recover did not mount the volume pool")
	}
	archive, _, _ = archiveOf(t, b3, "ended", "data")
	if got, _ := os.ReadFile(filepath.Join(extracted(t, archive), "f")); string(got) != "ended\n" {
		t.Errorf("f = %q", got)
	}
	if err := b3.Destroy(context.Background(), "ended"); err != nil {
		t.Fatal(err)
	}
	if b3.vols.mounted() {
		t.Error("volume pool still mounted with nothing in it")
	}
	checkNoLeaks(t, e.state, "")
}

// TestVolumePoolRecoverSweepsStale: a runner killed while it archived a capture or
// extracted a restore leaves that subvolume in the pool (nothing of the dead process
// closes it). The next backend's Recover removes both, so the pool keeps no stale copy of
// a volume and unmounts once its last sandbox is gone.
func TestVolumePoolRecoverSweepsStale(t *testing.T) {
	e := volPoolEnv(t)
	e.create(volSpec("crashed", "", []runtime.Volume{{Name: "data", SizeBytes: 32 << 20}}, "echo x > /data/f; exec sleep 3600"))
	waitFor(t, func() bool { return sh(t, e.b, "crashed", "cat /data/f 2>/dev/null || true") == "x" })
	// The runner dies mid-upload: the capture is neither written out nor closed.
	if _, err := e.b.CaptureVolume(context.Background(), "crashed", "data"); err != nil {
		t.Fatal(err)
	}
	tmp, err := e.b.vols.openDir(poolTmp)
	if err != nil {
		t.Fatal(err)
	}
	err = subvolCreate(tmp, "extracting") // and mid-restore
	tmp.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{poolCaptures, poolTmp} {
		if ents, _ := os.ReadDir(filepath.Join(e.b.vols.mnt(), d)); len(ents) != 1 {
			t.Fatalf("%s holds %d entries before the restart, want 1", d, len(ents))
		}
	}

	b2 := e.backend()
	if _, err := b2.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{poolCaptures, poolTmp} {
		if ents, err := os.ReadDir(filepath.Join(b2.vols.mnt(), d)); err != nil || len(ents) != 0 {
			t.Errorf("%s after Recover: %d entries (%v), want none", d, len(ents), err)
		}
	}
	// The sandbox's volume survived the sweep.
	if got := sh(t, b2, "crashed", "cat /data/f"); got != "x" {
		t.Errorf("volume after Recover: %q", got)
	}
	if err := b2.Destroy(context.Background(), "crashed"); err != nil {
		t.Fatal(err)
	}
	if b2.vols.mounted() {
		t.Error("volume pool still mounted with nothing in it")
	}
	checkNoLeaks(t, e.state, "")
}

// TestNoVolumePool: without the pool (a host without btrfs) volumes work, and snapshots
// are refused as not implemented.
func TestNoVolumePool(t *testing.T) {
	e := newEnvWith(t, func(c *Config) { c.NoVolumePool = true })
	if !e.b.Support().NoSnapshots {
		t.Error("Support().NoSnapshots = false without the volume pool")
	}
	e.create(volSpec("nopool", "", []runtime.Volume{{Name: "data"}}, "exec sleep 3600"))
	if _, err := e.b.CaptureVolume(context.Background(), "nopool", "data"); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("CaptureVolume = %v, want ErrNotImplemented", err)
	}
	digest := strings.Repeat("0", 64)
	if err := e.b.PrepareSnapshot(context.Background(), digest, runtime.ArchiveLimits{}, nil); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("PrepareSnapshot = %v, want ErrNotImplemented", err)
	}
	sp := volSpec("nopool-r", "", []runtime.Volume{{Name: "data", RestoreDigest: digest}}, "exec sleep 3600")
	sp.Image = "busybox"
	if _, err := e.b.Create(context.Background(), &sp); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("Create with a restore = %v, want ErrNotImplemented", err)
	}
	if got := e.b.CachedSnapshots(10); got != nil {
		t.Errorf("CachedSnapshots = %v", got)
	}
}

// TestCaptureGroup: a group's shared volume is captured with every container frozen.
func TestCaptureGroup(t *testing.T) {
	e := volPoolEnv(t)
	sp := volSpec("capgrp", "", []runtime.Volume{{Name: "data"}}, "echo main > /data/main; exec sleep 3600")
	sp.Container.Name = "main"
	sp.Sidecars = []runtime.Container{{Name: "side", Image: "busybox", Command: "sh", Args: []string{"-c", "echo side > /data/side; exec sleep 3600"},
		VolumeMounts: []runtime.VolumeMount{{Volume: "data", Path: "/data"}}}}
	e.create(sp)
	waitFor(t, func() bool { return sh(t, e.b, "capgrp", "cat /data/side 2>/dev/null || true") == "side" })
	archive, _, pause := archiveOf(t, e.b, "capgrp", "data")
	t.Logf("group pause %s", pause)
	dir := extracted(t, archive)
	for _, f := range []string{"main", "side"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestMemoryVolumeSnapshot: a memory volume is captured (copied with the sandbox
// frozen) and restored into another sandbox's memory volume, owners as the sandbox saw
// them; a memory volume smaller than the snapshot is refused.
func TestMemoryVolumeSnapshot(t *testing.T) {
	e := volPoolEnv(t)
	e.create(volSpec("msrc", "", []runtime.Volume{{Name: "mem", Medium: runtime.MediumMemory, SizeBytes: 32 << 20}},
		"dd if=/dev/urandom of=/mem/blob bs=1M count=4 2>/dev/null; mkdir /mem/d; echo hi > /mem/d/f; chown 1000:1001 /mem/d/f; ln -s d/f /mem/l; touch /mem/done; "+
			"i=0; while :; do i=$((i+1)); echo $i > /mem/tick; done"))
	waitFor(t, func() bool { return sh(t, e.b, "msrc", "test -f /mem/done && echo y || echo n") == "y" })
	sum := sh(t, e.b, "msrc", "md5sum /mem/blob | cut -d' ' -f1")
	archive, digest, pause := archiveOf(t, e.b, "msrc", "mem")
	t.Logf("memory volume (4 MiB) pause %s", pause)
	dir := extracted(t, archive)
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "d/f"), &st); err != nil || st.Uid != 1000 || st.Gid != 1001 {
		t.Errorf("owner of d/f = %d:%d (%v), want 1000:1001", st.Uid, st.Gid, err)
	}
	prepare(t, e.b, archive, digest)
	e.create(volSpec("mdst", "", []runtime.Volume{{Name: "mem", Medium: runtime.MediumMemory, SizeBytes: 32 << 20, RestoreDigest: digest}}, "exec sleep 3600"))
	if got := sh(t, e.b, "mdst", "md5sum /mem/blob | cut -d' ' -f1; cat /mem/d/f; stat -c %u:%g /mem/d/f; readlink /mem/l; stat -f -c %T /mem"); got != sum+"\nhi\n1000:1001\nd/f\ntmpfs" {
		t.Errorf("restored memory volume shows %q", got)
	}
	sp := volSpec("msmall", "", []runtime.Volume{{Name: "mem", Medium: runtime.MediumMemory, SizeBytes: 1 << 20, RestoreDigest: digest}}, "exec sleep 3600")
	sp.Image = "busybox"
	if _, err := e.b.Create(context.Background(), &sp); !errors.Is(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), `volume "mem"`) {
		t.Errorf("restore of 4 MiB into a 1 MiB memory volume: %v, want ErrInvalidSpec naming the volume", err)
	}
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
