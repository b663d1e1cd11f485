package local

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/sandboxd/sandboxd/internal/blob"
	blobdir "github.com/sandboxd/sandboxd/internal/blob/dir"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fsarchive"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// pinnedImages serves name@digest as name (the test images have fixed digests), so a
// spec pinned to another digest than the image's gets that image and its own digest.
type pinnedImages struct{ Images }

func (p pinnedImages) Pull(ctx context.Context, ref string, creds *runtime.Credentials) (*Image, error) {
	if i := strings.LastIndexByte(ref, '@'); i >= 0 {
		ref = ref[:i]
	}
	return p.Images.Pull(ctx, ref, creds)
}

// exportEnv is a gVisor env with the volume pool whose images can be pinned.
func exportEnv(t testing.TB) *env {
	t.Helper()
	e := newEnvWith(t, func(c *Config) { c.Images = pinnedImages{c.Images} })
	if e.b.runtimes[GVisorClass] == nil {
		t.Skip("runsc not found")
	}
	if !e.b.vols.available() {
		t.Skip("no btrfs volume pool on this host (mkfs.btrfs, btrfs in the kernel)")
	}
	return e
}

// ckStore is a blob dir store holding exported checkpoints under a prefix.
type ckStore struct {
	root string
	s    *blobdir.Store
}

func newCkStore(t testing.TB) *ckStore {
	t.Helper()
	root := t.TempDir()
	s, err := blobdir.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &ckStore{root: root, s: s}
}

func (c *ckStore) put(prefix string) func(context.Context, string, io.Reader) error {
	return func(ctx context.Context, part string, r io.Reader) error {
		_, err := c.s.Put(ctx, prefix+"/"+part, r, -1)
		return err
	}
}

func (c *ckStore) open(prefix string) func(context.Context, string) (io.ReadCloser, error) {
	return func(ctx context.Context, part string) (io.ReadCloser, error) {
		return c.s.Get(ctx, prefix+"/"+part)
	}
}

// objectFile is the dir store's file of key prefix/part (internal/blob/dir's layout).
func (c *ckStore) objectFile(prefix, part string) string {
	return filepath.Join(c.root, "objects", prefix+".d", part+".o")
}

// checkNoImportLeft: no staging dir and no staged volume is left.
func checkNoImportLeft(t testing.TB, e *env) {
	t.Helper()
	if ents, _ := os.ReadDir(filepath.Join(e.state, dirImports)); len(ents) > 0 {
		t.Errorf("import staging dirs left: %v", ents)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.b.vols.mnt(), poolTmp)); len(ents) > 0 {
		t.Errorf("volume pool tmp/ entries left: %v", ents)
	}
}

// TestExportForkFromCheckpoint exports a running gVisor sandbox with a counter in memory
// and a disk volume into a blob dir store, then makes two forks from it on the same
// backend: both continue the counter from the exported state, have their own address,
// the source's files, and writes of their own; the source ran on. The refusals: another
// platform, parts not the spec's, a tampered part, an image at another digest, an
// image part over its limit: each leaves nothing behind.
func TestExportForkFromCheckpoint(t *testing.T) {
	e := exportEnv(t)
	e.withNetwork(t, 10)
	ctx := context.Background()
	store := newCkStore(t)
	const src = "ex-src"
	sp := volSpec(src, GVisorClass, []runtime.Volume{{Name: "data", SizeBytes: 64 << 20}}, counterLoop)
	sp.Image = "busybox"
	srcInfo := e.create(sp)
	sh(t, e.b, src, "echo r > /rootfile; echo v > /data/f")
	c0 := waitCount(t, e.b, src, 5)

	start := time.Now()
	ex, err := e.b.ExportCheckpoint(ctx, src, store.put("ck"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("export of a running sandbox: %v (paused %v), %d bytes of content, parts %v, platform %q", time.Since(start), ex.Took, ex.Bytes, ex.Parts, ex.Platform)
	for _, p := range ex.Parts {
		info, err := store.s.Stat(ctx, "ck/"+p)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("part %s: %d bytes stored", p, info.Size)
	}
	if want := []string{"image", "run", "volume-0"}; !slices.Equal(ex.Parts, want) {
		t.Errorf("parts %v, want %v", ex.Parts, want)
	}
	if ex.Platform != e.b.CheckpointPlatform(GVisorClass) || !strings.HasPrefix(ex.Platform, "gvisor runsc-") || ex.Class != GVisorClass {
		t.Errorf("export %+v", ex)
	}
	if ex.Took <= 0 || ex.Bytes <= 0 {
		t.Errorf("export took %v, %d bytes", ex.Took, ex.Bytes)
	}
	if e.b.isPaused(src) {
		t.Error("the source is paused after the export")
	}
	waitCount(t, e.b, src, c0+3) // it runs on
	if ents, _ := filepath.Glob(filepath.Join(e.b.dir(src), "fork-*")); len(ents) > 0 {
		t.Errorf("the export's checkpoint left: %v", ents)
	}
	checkNoImportLeft(t, e)

	fork := func(id string) *runtime.Spec {
		f := sp.Clone()
		f.ID = id
		f.Image = "busybox@sha256:b0b0"
		return &f
	}
	wantRefused := func(what string, errs []error, is error) {
		t.Helper()
		for _, err := range errs {
			if err == nil || (is != nil && !errors.Is(err, is)) {
				t.Errorf("%s: %v, want %v", what, err, is)
			} else {
				t.Logf("%s: %v", what, err)
			}
		}
		checkNoImportLeft(t, e)
		if _, err := os.Lstat(e.b.dir("ex-bad")); err == nil {
			t.Errorf("%s: the refused fork's dir is left", what)
		}
	}
	// Another platform.
	other := ex
	other.Platform = "gvisor runsc-release-20990101.0 linux/amd64"
	_, errs := e.b.ForkFromCheckpoint(ctx, other, store.open("ck"), []*runtime.Spec{fork("ex-bad"), fork("ex-bad2")})
	wantRefused("another platform", errs, errdefs.ErrNotImplemented)
	if !strings.Contains(errs[0].Error(), other.Platform) || !strings.Contains(errs[0].Error(), ex.Platform) {
		t.Errorf("the refusal does not name both platforms: %v", errs[0])
	}
	// Parts not the spec's: one more, one missing.
	for _, parts := range [][]string{{"image", "run", "volume-0", "extra"}, {"image", "run"}, {"image", "run", "volume-1"}} {
		bad := ex
		bad.Parts = parts
		_, errs := e.b.ForkFromCheckpoint(ctx, bad, store.open("ck"), []*runtime.Spec{fork("ex-bad")})
		wantRefused("parts "+strings.Join(parts, ","), errs, runtime.ErrInvalidSpec)
	}
	// An image not pinned, and one pinned to another digest.
	unpinned := fork("ex-bad")
	unpinned.Image = "busybox"
	_, errs = e.b.ForkFromCheckpoint(ctx, ex, store.open("ck"), []*runtime.Spec{unpinned})
	wantRefused("unpinned image", errs, runtime.ErrInvalidSpec)
	otherImage := fork("ex-bad")
	otherImage.Image = "busybox@sha256:0ther"
	_, errs = e.b.ForkFromCheckpoint(ctx, ex, store.open("ck"), []*runtime.Spec{otherImage})
	wantRefused("image at another digest", errs, runtime.ErrInvalidSpec)
	// A tampered part (a copy of the store with one byte of the volume's object changed).
	tampered := newCkStore(t)
	if out, err := exec.Command("cp", "-a", store.root+"/objects", tampered.root+"/").CombinedOutput(); err != nil {
		t.Fatalf("copy the store: %v: %s", err, out)
	}
	obj := tampered.objectFile("ck", "volume-0")
	data, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2+24] ^= 0x40
	if err := os.WriteFile(obj, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, errs = e.b.ForkFromCheckpoint(ctx, ex, tampered.open("ck"), []*runtime.Spec{fork("ex-bad")})
	wantRefused("a tampered part", errs, nil)
	if !errors.Is(errs[0], blob.ErrCorrupt) {
		t.Errorf("a tampered part: %v, want blob.ErrCorrupt", errs[0])
	}
	// An image part over its limit (the memory and the disk the sandbox may use): a pages
	// file of a PiB.
	big := newCkStore(t)
	for _, p := range ex.Parts[1:] {
		rc, err := store.s.Get(ctx, "ck/"+p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = big.s.Put(ctx, "ck/"+p, rc, -1)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := big.s.Put(ctx, "ck/image", bytes.NewReader(hugeFileArchive(t, "pages.img", 1<<50)), -1); err != nil {
		t.Fatal(err)
	}
	_, errs = e.b.ForkFromCheckpoint(ctx, ex, big.open("ck"), []*runtime.Spec{fork("ex-bad")})
	wantRefused("an image part over its limit", errs, fsarchive.ErrTooLarge)

	// Two forks.
	specs := []*runtime.Spec{fork("ex-0"), fork("ex-1")}
	start = time.Now()
	infos, errs := e.b.ForkFromCheckpoint(ctx, ex, store.open("ck"), specs)
	t.Logf("fork from the checkpoint x2: %v", time.Since(start))
	ips := map[string]bool{srcInfo.IP: true}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("fork %d: %v", i, err)
		}
		if ips[infos[i].IP] || infos[i].IP == "" {
			t.Errorf("fork %d: IP %q not distinct", i, infos[i].IP)
		}
		ips[infos[i].IP] = true
		if infos[i].ImageDigest != "sha256:b0b0" {
			t.Errorf("fork %d: image digest %q", i, infos[i].ImageDigest)
		}
	}
	checkNoImportLeft(t, e)
	for i, f := range specs {
		id := f.ID
		if n := count(t, e.b, id); n < c0 {
			t.Errorf("fork %s: counter %d, the source had %d before the export", id, n, c0)
		}
		waitCount(t, e.b, id, c0+2)
		if out := sh(t, e.b, id, "cat /rootfile /data/f; hostname"); out != "r\nv\n"+id {
			t.Errorf("fork %s: files and hostname = %q", id, out)
		}
		if out := sh(t, e.b, id, "ip -4 addr"); !strings.Contains(out, infos[i].IP+"/") {
			t.Errorf("fork %s: addresses %q, want %s", id, out, infos[i].IP)
		}
		sh(t, e.b, id, "echo "+id+" > /rootfile; echo "+id+" > /data/f")
	}
	if out := sh(t, e.b, src, "cat /rootfile /data/f"); out != "r\nv" {
		t.Errorf("the source's files after the forks wrote = %q", out)
	}
	for _, f := range specs {
		if out := sh(t, e.b, f.ID, "cat /rootfile /data/f"); out != f.ID+"\n"+f.ID {
			t.Errorf("fork %s: files = %q", f.ID, out)
		}
	}
	for _, id := range []string{"ex-0", "ex-1", src} {
		if err := e.b.Destroy(ctx, id); err != nil {
			t.Errorf("destroy %s: %v", id, err)
		}
		checkNoLeaks(t, e.state, id)
	}
}

// hugeFileArchive is an fsarchive stream whose one file claims size bytes; it ends after
// the file's header (Extract refuses the file there).
func hugeFileArchive(t testing.TB, name string, size int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(zw)
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755, Format: tar.FormatPAX},
		{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: size, Format: tar.FormatPAX},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// treeHashes maps each regular file under dir to its size and sha256.
func treeHashes(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		n, err := io.Copy(h, f)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = strconv.FormatInt(n, 10) + " " + hex.EncodeToString(h.Sum(nil))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestExportMove moves a checkpointed sandbox: it is exported (as it is: it stays
// paused, its checkpoint intact; the image part holds the checkpoint byte for byte),
// destroyed, and made again from the export under the same ID: it runs with its memory
// (the counter continues) and files; nothing of the import is left, and Destroy leaves
// nothing.
func TestExportMove(t *testing.T) {
	e := exportEnv(t)
	e.withNetwork(t, 11)
	ctx := context.Background()
	store := newCkStore(t)
	const id = "mv-1"
	sp := volSpec(id, GVisorClass, []runtime.Volume{{Name: "data", SizeBytes: 64 << 20}}, counterLoop)
	sp.Image = "busybox"
	e.create(sp)
	sh(t, e.b, id, "echo r > /rootfile; echo v > /data/f; dd if=/dev/urandom of=/tmp/fill bs=1M count=8 2>/dev/null")
	fill := sh(t, e.b, id, "md5sum /tmp/fill")
	c1 := waitCount(t, e.b, id, 3)
	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	c1 = max(c1, 0)
	image := filepath.Join(e.b.dir(id), dirCheckpoint)
	before := treeHashes(t, image)
	ents, _ := os.ReadDir(image)
	for _, ent := range ents {
		fi, _ := ent.Info()
		st := fi.Sys().(*syscall.Stat_t)
		t.Logf("checkpoint file %s: %d bytes, %d allocated, mode %v", ent.Name(), fi.Size(), st.Blocks*512, fi.Mode())
	}
	start := time.Now()
	ex, err := e.b.ExportCheckpoint(ctx, id, store.put("mv"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("export of a checkpointed sandbox: %v, %d bytes of content", time.Since(start), ex.Bytes)
	if ex.Took != 0 {
		t.Errorf("export of a checkpointed sandbox paused it for %v", ex.Took)
	}
	if !e.b.isPaused(id) {
		t.Error("the checkpointed sandbox is not paused after the export")
	}
	if after := treeHashes(t, image); !mapsEqual(after, before) {
		t.Errorf("the checkpoint changed with the export")
	}
	// The image part is the checkpoint, byte for byte (the pages file's holes too).
	dst := t.TempDir()
	root, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := store.s.Get(ctx, "mv/image")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fsarchive.Extract(ctx, rc, root, runtime.ArchiveLimits{}, fsarchive.IDMap{}); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	root.Close()
	if got := treeHashes(t, dst); !mapsEqual(got, before) {
		t.Errorf("the image part extracted = %v, the checkpoint = %v", got, before)
	}

	if err := e.b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, id)
	f := sp.Clone()
	f.Image = "busybox@sha256:b0b0"
	start = time.Now()
	infos, errs := e.b.ForkFromCheckpoint(ctx, ex, store.open("mv"), []*runtime.Spec{&f})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	t.Logf("move (fork from the checkpoint under the same ID): %v", time.Since(start))
	checkNoImportLeft(t, e)
	if infos[0].ID != id {
		t.Errorf("moved sandbox's info %+v", infos[0])
	}
	if n := count(t, e.b, id); n < c1 || n > c1+10 {
		t.Errorf("counter %d after the move, %d before: not continued", n, c1)
	}
	waitCount(t, e.b, id, c1+2)
	if out := sh(t, e.b, id, "cat /rootfile /data/f; hostname"); out != "r\nv\n"+id {
		t.Errorf("files and hostname after the move = %q", out)
	}
	if got := sh(t, e.b, id, "md5sum /tmp/fill"); got != fill {
		t.Errorf("memory after the move: %q, want %q", got, fill)
	}
	if _, err := e.b.Resume(ctx, id); !errors.Is(err, runtime.ErrNotPaused) {
		t.Errorf("resume of the moved sandbox: %v, want ErrNotPaused", err)
	}
	// It pauses and resumes like any other.
	if _, err := e.b.Pause(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.b.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := e.b.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	checkNoLeaks(t, e.state, id)
	checkNoImportLeft(t, e)
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestCheckpointPlatform: the gVisor class names its runsc build, architecture and
// network (the same string every call, runsc asked once); runc names none.
func TestCheckpointPlatform(t *testing.T) {
	e := gvisorEnv(t)
	p := e.b.CheckpointPlatform(GVisorClass)
	t.Logf("platform %q", p)
	if !strings.HasPrefix(p, "gvisor runsc-") || !strings.Contains(p, " linux/") || !strings.HasSuffix(p, " network-none") {
		t.Errorf("CheckpointPlatform(gvisor) = %q", p)
	}
	if q := e.b.CheckpointPlatform(GVisorClass); q != p {
		t.Errorf("second call %q, first %q", q, p)
	}
	if q := e.b.CheckpointPlatform("runc"); q != "" {
		t.Errorf("CheckpointPlatform(runc) = %q", q)
	}
	if _, err := e.b.ExportCheckpoint(context.Background(), "nope", func(context.Context, string, io.Reader) error { return nil }); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("export of an unknown sandbox: %v", err)
	}
}

// TestExportFrozenAndRefused: a frozen sandbox is exported as Fork takes it (thawed for
// the checkpoint, frozen again after); sandboxes whose checkpoints cannot move are
// refused with ErrNotImplemented saying why (runc, a memory volume), before put is
// called; Recover removes the staging dirs a crashed import left.
func TestExportFrozenAndRefused(t *testing.T) {
	e := exportEnv(t)
	ctx := context.Background()
	store := newCkStore(t)
	const id = "exf"
	e.create(runtime.Spec{ID: id, RuntimeClass: GVisorClass, Container: runtime.Container{Command: "sh", Args: []string{"-c", counterLoop}}})
	c1 := waitCount(t, e.b, id, 2)
	if _, err := e.b.Pause(ctx, id, false); err != nil {
		t.Fatal(err)
	}
	ex, err := e.b.ExportCheckpoint(ctx, id, store.put("f"))
	if err != nil {
		t.Fatal(err)
	}
	if ex.Took <= 0 || !slices.Equal(ex.Parts, []string{"image", "run"}) {
		t.Errorf("export of a frozen sandbox: %+v", ex)
	}
	if !e.b.isPaused(id) {
		t.Error("the frozen sandbox is not paused after the export")
	}
	if _, err := e.b.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	waitCount(t, e.b, id, c1+2)

	noPut := func(context.Context, string, io.Reader) error {
		t.Error("put called for a refused export")
		return nil
	}
	e.create(runtime.Spec{ID: "exr", Container: runtime.Container{Command: "sleep", Args: []string{"1000"}}})
	if _, err := e.b.ExportCheckpoint(ctx, "exr", noPut); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("export of a runc sandbox: %v", err)
	}
	e.create(volSpec("exm", GVisorClass, []runtime.Volume{{Name: "m", Medium: runtime.MediumMemory}}, "sleep 1000"))
	if _, err := e.b.ExportCheckpoint(ctx, "exm", noPut); !errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), "memory") {
		t.Errorf("export of a sandbox with a memory volume: %v", err)
	}

	left := filepath.Join(e.state, dirImports, "deadbeef")
	if err := os.MkdirAll(filepath.Join(left, "image"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := e.backend().Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(left); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Recover left a staging dir: %v", err)
	}
}

// TestExportDiskLimit: a gVisor sandbox with a disk limit (its writable layer and agent
// state on a disk image of its own, disk.go) is exported and forked from the export like
// one without.
func TestExportDiskLimit(t *testing.T) {
	e := newEnvWith(t, func(c *Config) {
		c.DiskBytes = 128 << 20
		c.Images = pinnedImages{c.Images}
	})
	if e.b.runtimes[GVisorClass] == nil {
		t.Skip("runsc not found")
	}
	ctx := context.Background()
	store := newCkStore(t)
	const id = "exd"
	sp := runtime.Spec{ID: id, RuntimeClass: GVisorClass, Container: runtime.Container{Image: "busybox", Command: "sh", Args: []string{"-c", counterLoop}}}
	e.create(sp)
	sh(t, e.b, id, "echo r > /rootfile")
	c1 := waitCount(t, e.b, id, 2)
	ex, err := e.b.ExportCheckpoint(ctx, id, store.put("d"))
	if err != nil {
		t.Fatal(err)
	}
	f := sp.Clone()
	f.ID = "exd-f"
	f.Image = "busybox@sha256:b0b0"
	if _, errs := e.b.ForkFromCheckpoint(ctx, ex, store.open("d"), []*runtime.Spec{&f}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	checkNoImportLeft(t, e)
	for _, x := range []string{id, f.ID} {
		if n := waitCount(t, e.b, x, c1+2); n < c1 {
			t.Errorf("%s: counter %d", x, n)
		}
		if out := sh(t, e.b, x, "cat /rootfile"); out != "r" {
			t.Errorf("%s: /rootfile = %q", x, out)
		}
	}
}
