package fsarchive

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// openDir opens dir for Write/Extract.
func openDir(t testing.TB, dir string) *os.File {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func writeArchive(t testing.TB, dir string, ids IDMap) ([]byte, runtime.ArchiveStats) {
	t.Helper()
	var buf bytes.Buffer
	st, err := Write(context.Background(), openDir(t, dir), &buf, ids)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	return buf.Bytes(), st
}

// extractFresh extracts data into a new directory root inside a new parent that also
// holds an empty sibling directory; it checks nothing was written outside root.
func extractFresh(t testing.TB, data []byte, limits runtime.ArchiveLimits, ids IDMap) (string, runtime.ArchiveStats, error) {
	t.Helper()
	parent := t.TempDir()
	removable(t, parent)
	root := filepath.Join(parent, "root")
	sibling := filepath.Join(parent, "sibling")
	for _, d := range []string{root, sibling} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	st, err := Extract(context.Background(), bytes.NewReader(data), openDir(t, root), limits, ids)
	checkNothingOutside(t, parent)
	return root, st, err
}

// removable makes the directories under dir writable before t's TempDir cleanup
// removes it (read-only directories stop RemoveAll without root).
func removable(t testing.TB, dir string) {
	t.Cleanup(func() {
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(p, 0o700)
			}
			return nil
		})
	})
}

// checkNothingOutside asserts parent holds exactly root and an empty sibling.
func checkNothingOutside(t testing.TB, parent string) {
	t.Helper()
	ents, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "root,sibling" {
		t.Fatalf("parent of the extraction root holds %v, want [root sibling]", names)
	}
	ents, err = os.ReadDir(filepath.Join(parent, "sibling"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("sibling of the extraction root is not empty: %v", ents)
	}
}

func xattrsSupported(t testing.TB, dir string) bool {
	t.Helper()
	p := filepath.Join(dir, ".xattr-probe")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(p)
	return unix.Setxattr(p, "user.probe", []byte("1"), 0) == nil
}

var (
	t0 = time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
)

// bigContent is n pseudo-random but compressible-in-part bytes (deterministic).
func bigContent(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := 0; i < n; i += 4096 {
		end := min(i+4096, n)
		if (i/4096)%2 == 0 {
			for j := i; j < end; j++ {
				b[j] = byte(r.Uint32())
			}
		} else {
			copy(b[i:end], bytes.Repeat([]byte("sandboxd snapshot "), 4096/18+1))
		}
	}
	return b
}

// buildTree makes the round-trip tree under dir and returns whether it has xattrs.
func buildTree(t testing.TB, dir string) bool {
	t.Helper()
	removable(t, dir)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	mkdir := func(p string, mode os.FileMode) {
		must(os.Mkdir(filepath.Join(dir, p), 0o700))
	}
	file := func(p string, data []byte, mode os.FileMode) {
		must(os.WriteFile(filepath.Join(dir, p), data, 0o600))
		must(os.Chmod(filepath.Join(dir, p), mode))
	}
	mkdir("a", 0)
	mkdir("a/b", 0)
	mkdir("a/b/c", 0)
	mkdir("empty", 0)
	mkdir("ro", 0)
	mkdir("sticky", 0)
	file("a/b/c/deep.txt", []byte("deep\n"), 0o644)
	file("a/empty", nil, 0o600)
	file("a/big", bigContent(20<<20, 1), 0o640)
	file("ro/file", []byte("read only"), 0o400)
	file("setuid", []byte("#!/bin/sh\n"), 0o4755|os.ModeSetuid)
	file("name with spaces and ünïcödé", []byte("x"), 0o644)
	must(os.Chmod(filepath.Join(dir, "setuid"), 0o755|os.ModeSetuid|os.ModeSetgid))
	must(os.Symlink("b/c/deep.txt", filepath.Join(dir, "a/rel")))
	must(os.Symlink("/etc/passwd", filepath.Join(dir, "abs")))
	must(os.Symlink("does/not/exist", filepath.Join(dir, "dangling")))
	must(os.Link(filepath.Join(dir, "a/b/c/deep.txt"), filepath.Join(dir, "hardlink")))
	// A sparse file: 64 MiB with 4 KiB of data in the middle.
	sp, err := os.Create(filepath.Join(dir, "sparse"))
	must(err)
	must(sp.Truncate(64 << 20))
	_, err = sp.WriteAt(bytes.Repeat([]byte{7}, 4096), 32<<20)
	must(err)
	must(sp.Close())
	must(unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	xattrs := xattrsSupported(t, dir)
	if xattrs {
		must(unix.Setxattr(filepath.Join(dir, "a/big"), "user.one", []byte("1"), 0))
		must(unix.Setxattr(filepath.Join(dir, "a/big"), "user.bin", []byte{0, 1, 2, 255}, 0))
		must(unix.Setxattr(filepath.Join(dir, "a/b"), "user.dir", []byte("on a directory"), 0))
		if os.Geteuid() == 0 {
			must(unix.Setxattr(filepath.Join(dir, "a/big"), "trusted.skipped", []byte("not user.*"), 0))
		}
	}
	// Modes and mtimes last (children before parents).
	must(os.Chmod(filepath.Join(dir, "sticky"), 0o777|os.ModeSticky))
	var paths []string
	must(filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	}))
	sort.Sort(sort.Reverse(sort.StringSlice(paths)))
	for i, p := range paths {
		ts := t0.Add(time.Duration(i) * time.Hour)
		tss := []unix.Timespec{unix.NsecToTimespec(ts.UnixNano()), unix.NsecToTimespec(ts.UnixNano())}
		must(unix.UtimesNanoAt(unix.AT_FDCWD, p, tss, unix.AT_SYMLINK_NOFOLLOW))
	}
	must(os.Chmod(filepath.Join(dir, "ro"), 0o500))
	return xattrs
}

type entryInfo struct {
	typ    fs.FileMode
	perm   fs.FileMode
	size   int64
	sum    [32]byte
	target string
	mtime  time.Time
	uid    uint32
	gid    uint32
	xattrs map[string]string
}

// describe reads a tree into path → entryInfo (the fifo left out: Write skips it).
func describe(t testing.TB, dir string) map[string]entryInfo {
	t.Helper()
	out := map[string]entryInfo{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		e := entryInfo{
			typ:   fi.Mode().Type(),
			perm:  fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky),
			mtime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
			uid:   st.Uid,
			gid:   st.Gid,
		}
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			e.size, e.sum = int64(len(b)), sha256.Sum256(b)
			e.xattrs = readXattrs(t, p)
		case fi.IsDir():
			e.xattrs = readXattrs(t, p)
		case fi.Mode()&fs.ModeSymlink != 0:
			e.target, err = os.Readlink(p)
			if err != nil {
				return err
			}
		case fi.Mode()&fs.ModeNamedPipe != 0:
			return nil
		}
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func readXattrs(t testing.TB, p string) map[string]string {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		return nil
	}
	m := map[string]string{}
	for _, k := range strings.Split(string(buf[:n]), "\x00") {
		if !strings.HasPrefix(k, "user.") {
			continue
		}
		v := make([]byte, 64<<10)
		vn, err := unix.Lgetxattr(p, k, v)
		if err != nil {
			t.Fatal(err)
		}
		m[k] = string(v[:vn])
	}
	return m
}

func TestRoundTrip(t *testing.T) {
	src := t.TempDir()
	hasXattrs := buildTree(t, src)
	want := describe(t, src)
	data, wst := writeArchive(t, src, IDMap{})
	if wst.Skipped != 1 {
		t.Errorf("Write skipped %d entries, want 1 (the fifo)", wst.Skipped)
	}
	if wst.Files != int64(len(want)) {
		t.Errorf("Write stored %d entries, want %d", wst.Files, len(want))
	}
	var wantBytes int64
	for _, e := range want {
		wantBytes += e.size
	}
	if wst.Bytes != wantBytes {
		t.Errorf("Write stats: %d bytes, want %d", wst.Bytes, wantBytes)
	}
	t.Logf("archive of %d entries, %d bytes of files: %d bytes", wst.Files, wst.Bytes, len(data))
	if len(data) > 16<<20 {
		t.Errorf("archive of %d bytes: the zeros of the sparse file and the repeated text should compress", len(data))
	}

	dst, xst, err := extractFresh(t, data, runtime.ArchiveLimits{MaxBytes: wantBytes, MaxFiles: wst.Files}, IDMap{})
	if err != nil {
		t.Fatalf("Extract: %v", err)
	}
	if xst.Files != wst.Files || xst.Bytes != wst.Bytes || xst.Skipped != 0 {
		t.Errorf("Extract stats %+v, Write stats %+v", xst, wst)
	}
	got := describe(t, dst)
	for p, w := range want {
		g, ok := got[p]
		if !ok {
			t.Errorf("%s: missing after the round trip", p)
			continue
		}
		w.perm &^= fs.ModeSetuid | fs.ModeSetgid
		if os.Geteuid() != 0 {
			w.uid, w.gid = g.uid, g.gid // owners are the caller's
		}
		if !hasXattrs {
			w.xattrs, g.xattrs = nil, nil
		}
		if len(w.xattrs) == 0 && len(g.xattrs) == 0 {
			w.xattrs, g.xattrs = nil, nil
		}
		if w.typ != g.typ || w.perm != g.perm || w.size != g.size || w.sum != g.sum || w.target != g.target ||
			!w.mtime.Equal(g.mtime) || w.uid != g.uid || w.gid != g.gid || !equalMaps(w.xattrs, g.xattrs) {
			t.Errorf("%s: got %+v\nwant %+v", p, g, w)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: extracted but not in the source", p)
		}
	}
	if hasXattrs && got["a/big"].xattrs["user.bin"] != "\x00\x01\x02\xff" {
		t.Errorf("binary xattr lost: %q", got["a/big"].xattrs)
	}
	// The sparse file came back sparse (its zeros are not written).
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "sparse"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 > 8<<20 {
		t.Errorf("sparse file extracted with %d bytes allocated, want holes", st.Blocks*512)
	}
	// The hard link is a copy.
	var a, b unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "hardlink"), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Join(dst, "a/b/c/deep.txt"), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino == b.Ino {
		t.Error("hard link extracted as a hard link, want a copy")
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestWriteDeterministic(t *testing.T) {
	src := t.TempDir()
	for _, n := range []string{"b", "a", "c", "aa", "B"} {
		if err := os.WriteFile(filepath.Join(src, n), bigContent(100<<10, uint64(len(n))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(src, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	one, _ := writeArchive(t, src, IDMap{})
	two, _ := writeArchive(t, src, IDMap{})
	if !bytes.Equal(one, two) {
		t.Fatal("two archives of the same tree differ")
	}
	names := tarNames(t, one)
	if got := strings.Join(names, " "); got != "./ B a aa b c d/" {
		t.Fatalf("entries %q, want sorted depth-first", got)
	}
}

// tarEntries decompresses an archive and returns its headers.
func tarEntries(t testing.TB, data []byte) []*tar.Header {
	t.Helper()
	dec := mustDecoder(t, data)
	defer dec.Close()
	tr := tar.NewReader(dec)
	var hdrs []*tar.Header
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hdrs
		}
		if err != nil {
			t.Fatal(err)
		}
		hdrs = append(hdrs, h)
	}
}

func mustDecoder(t testing.TB, data []byte) *zstd.Decoder {
	t.Helper()
	dec, err := zstd.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return dec
}

func tarNames(t testing.TB, data []byte) []string {
	var names []string
	for _, h := range tarEntries(t, data) {
		names = append(names, h.Name)
	}
	return names
}

// A symlink named like a directory and pointing out of the tree is archived as a
// symlink: Write does not follow it.
func TestWriteDoesNotFollowSymlinks(t *testing.T) {
	src := t.TempDir()
	if err := os.Symlink("/etc", filepath.Join(src, "etc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(src, "d", "passwd")); err != nil {
		t.Fatal(err)
	}
	data, st := writeArchive(t, src, IDMap{})
	hdrs := tarEntries(t, data)
	if len(hdrs) != 4 || st.Files != 4 || st.Bytes != 0 {
		t.Fatalf("%d entries (stats %+v), want ./ d/ d/passwd etc", len(hdrs), st)
	}
	for _, h := range hdrs {
		switch h.Name {
		case "etc", "d/passwd":
			if h.Typeflag != tar.TypeSymlink || !strings.HasPrefix(h.Linkname, "/etc") || h.Size != 0 {
				t.Errorf("%s: type %q target %q size %d, want a symlink to /etc", h.Name, h.Typeflag, h.Linkname, h.Size)
			}
		case "./", "d/":
		default:
			t.Errorf("unexpected entry %q", h.Name)
		}
	}
}

func TestWriteContextCancelled(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Write(ctx, openDir(t, src), io.Discard, IDMap{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Write with a cancelled context: %v, want context.Canceled", err)
	}
	data, _ := writeArchive(t, src, IDMap{})
	root := t.TempDir()
	if _, err := Extract(ctx, bytes.NewReader(data), openDir(t, root), runtime.ArchiveLimits{}, IDMap{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Extract with a cancelled context: %v, want context.Canceled", err)
	}
}

// A path Extract would refuse is a Write error, not an archive that cannot be restored.
func TestWritePathTooLong(t *testing.T) {
	src := t.TempDir()
	fd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.Repeat("n", 250)
	for range 17 { // 17 × 251 bytes > MaxPath; built by descriptor (past PATH_MAX)
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
	_, err = Write(context.Background(), openDir(t, src), io.Discard, IDMap{})
	if err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("Write of a path over %d bytes: %v", MaxPath, err)
	}
}
