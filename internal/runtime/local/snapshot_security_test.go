package local

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Attack tests of file-system snapshots on the local backend: the captured tree and the
// archives restored are sandbox-made.

// TestSnapshotSymlinkMaze: a sandbox turns its volume into a maze of symlinks to host
// paths (absolute, through /proc/self/root, up the tree, a host file's path it guessed)
// and swaps a directory for a symlink while it is captured: the archive holds the
// symlinks as symlinks, and not one byte of a host file.
func TestSnapshotSymlinkMaze(t *testing.T) {
	e := volPoolEnv(t)
	secretDir := t.TempDir()
	const secret = "HOST-SECRET-7f1c0d"
	if err := os.WriteFile(filepath.Join(secretDir, "secret"), []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	maze := strings.Join([]string{
		"cd /data",
		"ln -s /etc etc", "ln -s /proc/self/root root", "ln -s ../../../../../../.. up",
		"ln -s " + secretDir + "/secret guessed", "ln -s /proc/1/root/" + secretDir + " viaproc",
		"mkdir real", "echo mine > real/f", "ln -s /etc/passwd real/passwd",
		"touch ready",
		// Swap real for a symlink to / and back, all the time.
		"while :; do mv real real.d; ln -s / real; rm real; mv real.d real; done",
	}, "; ")
	e.create(volSpec("maze", "", []runtime.Volume{{Name: "data"}}, maze))
	waitFor(t, func() bool { return sh(t, e.b, "maze", "test -f /data/ready && echo y || echo n") == "y" })
	for range 3 {
		archive, _, _ := archiveOf(t, e.b, "maze", "data")
		if bytes.Contains(archive, []byte(secret)) {
			t.Fatal("the archive holds the host file's content")
		}
		dir := extracted(t, archive)
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			if d.Type().IsRegular() {
				data, _ := os.ReadFile(p)
				if strings.Contains(string(data), secret) || strings.Contains(string(data), "root:x:0:0") {
					t.Errorf("%s holds host content", rel)
				}
			}
			if strings.Count(rel, "/") > 2 {
				t.Errorf("%s: the archive went down a symlink", rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range []string{"etc", "root", "up", "guessed", "viaproc"} {
			if fi, err := os.Lstat(filepath.Join(dir, l)); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
				t.Errorf("%s: %v, want a symlink", l, err)
			}
		}
	}
}

// zstdTar is a zstd-compressed tar of entries (a body for regular files).
type tarEntry struct {
	hdr  tar.Header
	body string
}

func zstdTar(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		h := e.hdr
		h.Format = tar.FormatPAX
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if e.body != "" {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// failingAtEnd returns data, then err instead of io.EOF (blob.Store.Get on a digest
// mismatch).
type failingAtEnd struct {
	r   io.Reader
	err error
}

func (f failingAtEnd) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if errors.Is(err, io.EOF) {
		return n, f.err
	}
	return n, err
}

// TestSnapshotHostileArchive: archives that try to write outside the cache entry (paths
// leaving the root, absolute paths, a file through a symlink, a hard link to a host
// file, a device), or that fail their digest at the end, are refused; nothing of them
// is kept, and nothing is written outside.
func TestSnapshotHostileArchive(t *testing.T) {
	e := volPoolEnv(t)
	outside := t.TempDir()
	reg := func(name, body string) tarEntry {
		return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg}, body: body}
	}
	link := func(name, target string) tarEntry {
		return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}}
	}
	cases := []struct {
		name    string
		archive []byte
		wrap    func(io.Reader) io.Reader
	}{
		{"dot-dot", zstdTar(t, reg("../escape", "x")), nil},
		{"deep dot-dot", zstdTar(t, reg("a/../../../escape", "x")), nil},
		{"absolute", zstdTar(t, reg(filepath.Join(outside, "abs"), "x")), nil},
		{"file through a symlink", zstdTar(t, link("lnk", outside), reg("lnk/through", "x")), nil},
		{"file through a dir symlink up", zstdTar(t, link("up", ".."), reg("up/escape", "x")), nil},
		{"hard link to a host file", zstdTar(t, tarEntry{hdr: tar.Header{Name: "hl", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}}), nil},
		{"digest mismatch at the end", zstdTar(t, reg("f", "x")), func(r io.Reader) io.Reader {
			return failingAtEnd{r, errors.New("sha256 mismatch")}
		}},
		{"garbage", []byte("not an archive at all"), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sum := sha256.Sum256(tc.archive)
			digest := hex.EncodeToString(sum[:])
			err := e.b.PrepareSnapshot(context.Background(), digest, runtime.ArchiveLimits{}, func(context.Context) (io.ReadCloser, error) {
				var r io.Reader = bytes.NewReader(tc.archive)
				if tc.wrap != nil {
					r = tc.wrap(r)
				}
				return io.NopCloser(r), nil
			})
			if err == nil {
				t.Errorf("PrepareSnapshot accepted a hostile archive")
				// Whatever it made stays inside its entry.
				entry := filepath.Join(e.b.vols.mnt(), poolCache, digest)
				_ = filepath.WalkDir(entry, func(p string, d fs.DirEntry, err error) error {
					if err == nil && d.Type()&fs.ModeSymlink == 0 && d.Type().IsRegular() {
						if data, _ := os.ReadFile(p); strings.Contains(string(data), "root:") {
							t.Errorf("%s holds a host file's content", p)
						}
					}
					return nil
				})
			}
			if got := e.b.CachedSnapshots(10); err != nil && len(got) != 0 {
				t.Errorf("CachedSnapshots after a refused archive = %v", got)
			}
			for _, d := range []string{poolTmp, poolCache, poolCacheMeta} {
				ents, _ := os.ReadDir(filepath.Join(e.b.vols.mnt(), d))
				if err != nil && len(ents) > 0 {
					t.Errorf("%s/ holds %d entries after a refused archive", d, len(ents))
				}
			}
			for _, p := range []string{filepath.Join(e.b.vols.mnt(), "escape"), filepath.Join(e.b.vols.mnt(), poolTmp, "escape"), e.b.vols.mnt() + "/../escape"} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s was written", p)
				}
			}
			if ents, _ := os.ReadDir(outside); len(ents) > 0 {
				t.Errorf("written outside: %d entries in %s", len(ents), outside)
			}
			_ = e.b.PurgeSnapshotCache()
		})
	}
	// Digests are checked before they name a path.
	for _, d := range []string{"../../../etc", strings.Repeat("A", 64), strings.Repeat("a", 63), ""} {
		if err := e.b.PrepareSnapshot(context.Background(), d, runtime.ArchiveLimits{}, nil); !errors.Is(err, runtime.ErrInvalidSpec) {
			t.Errorf("PrepareSnapshot(%q) = %v, want ErrInvalidSpec", d, err)
		}
	}
}

// TestVolumeNoNestedSubvolumes: a runc sandbox cannot make a btrfs subvolume or
// snapshot inside its volume (one would be a qgroup of its own, outside the volume's
// size), however it spells the request; other ioctls still work.
func TestVolumeNoNestedSubvolumes(t *testing.T) {
	e := volPoolEnv(t)
	bin := filepath.Join(t.TempDir(), "btrfsnest")
	if out, err := goBuild(bin, "./testdata/btrfsnest"); err != nil {
		t.Fatalf("build btrfsnest: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sp := volSpec("nest", "", []runtime.Volume{{Name: "data", SizeBytes: 32 << 20}}, "exec sleep 3600")
	sp.Files = []runtime.File{{Path: "/tmp/btrfsnest", Content: data, Mode: 0o755}}
	e.create(sp)
	out := sh(t, e.b, "nest", "/tmp/btrfsnest /data")
	want := "SUBVOL_CREATE: operation not permitted\nSUBVOL_CREATE_V2: operation not permitted\nSNAP_CREATE: operation not permitted\n" +
		"SUBVOL_CREATE|1<<32: operation not permitted\nSNAP_CREATE_V2: operation not permitted"
	if out != want {
		t.Errorf("btrfsnest:\n%s\nwant\n%s", out, want)
	}
	if got := sh(t, e.b, "nest", "ls -A /data | wc -l"); got != "0" {
		t.Errorf("the volume holds %s entries", got)
	}
	// ioctl itself is not refused: a terminal size query on /dev/null fails as it
	// should (ENOTTY), not with EPERM.
	if got := sh(t, e.b, "nest", "stty -F /dev/null 2>&1 || true"); strings.Contains(got, "not permitted") {
		t.Errorf("stty: %q", got)
	}
}
