package fsarchive

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// ent is an entry of a hand-made archive.
type ent struct {
	hdr  tar.Header
	data string
}

func dirEnt(name string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}}
}
func fileEnt(name, data string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))}, data: data}
}
func linkEnt(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

// rawTar is a tar stream of ents (PAX format, as Write makes).
func rawTar(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := e.hdr
		if h.Format == tar.FormatUnknown {
			h.Format = tar.FormatPAX
		}
		if h.ModTime.IsZero() && h.Typeflag != tar.TypeXGlobalHeader {
			h.ModTime = t0
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func compress(t testing.TB, raw []byte, opts ...zstd.EOption) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc, err := zstd.NewWriter(&buf, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enc.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// archive is a compressed hand-made archive.
func archive(t testing.TB, ents ...ent) []byte { return compress(t, rawTar(t, ents...)) }

// attackCase is a hostile archive and the error it must give.
type attackCase struct {
	name   string
	raw    func(t testing.TB, outside string) []byte // the tar stream
	limits runtime.ArchiveLimits
	want   error
}

func attackCases() []attackCase {
	tarOf := func(ents ...ent) func(testing.TB, string) []byte {
		return func(t testing.TB, _ string) []byte { return rawTar(t, ents...) }
	}
	long := strings.Repeat("n", 256)
	deep := strings.Repeat(strings.Repeat("d", 200)+"/", 21) + "f"
	return []attackCase{
		{name: "dotdot", raw: tarOf(dirEnt("./"), fileEnt("../x", "pwn")), want: ErrInvalid},
		{name: "dotdot-dir", raw: tarOf(dirEnt("./"), dirEnt("../")), want: ErrInvalid},
		{name: "absolute", raw: tarOf(dirEnt("./"), fileEnt("/abs", "pwn")), want: ErrInvalid},
		{name: "dotdot-inside", raw: tarOf(dirEnt("./"), dirEnt("a/"), fileEnt("a/../../b", "pwn")), want: ErrInvalid},
		{name: "not-clean-dot", raw: tarOf(dirEnt("./"), dirEnt("a/"), fileEnt("a/./b", "x")), want: ErrInvalid},
		{name: "not-clean-slashes", raw: tarOf(dirEnt("./"), dirEnt("a/"), fileEnt("a//b", "x")), want: ErrInvalid},
		{name: "dot-slash-prefix", raw: tarOf(dirEnt("./"), fileEnt("./x", "x")), want: ErrInvalid},
		{name: "symlink-abs-then-through", raw: func(t testing.TB, outside string) []byte {
			return rawTar(t, dirEnt("./"), linkEnt("s", outside), fileEnt("s/pwn", "pwn"))
		}, want: ErrInvalid},
		{name: "symlink-rel-then-through", raw: tarOf(dirEnt("./"), linkEnt("s", "../sibling"), fileEnt("s/pwn", "pwn")), want: ErrInvalid},
		{name: "symlink-then-dir-through", raw: tarOf(dirEnt("./"), linkEnt("s", "../sibling"), dirEnt("s/d/")), want: ErrInvalid},
		{name: "symlink-dot-then-through", raw: tarOf(dirEnt("./"), dirEnt("a/"), linkEnt("a/s", ".."), fileEnt("a/s/x", "x")), want: ErrInvalid},
		{name: "symlink-replaced-by-file", raw: tarOf(dirEnt("./"), linkEnt("s", "../sibling/f"), fileEnt("s", "pwn")), want: ErrInvalid},
		{name: "duplicate-file", raw: tarOf(dirEnt("./"), fileEnt("f", "1"), fileEnt("f", "2")), want: ErrInvalid},
		{name: "duplicate-dir", raw: tarOf(dirEnt("./"), dirEnt("d/"), dirEnt("d/")), want: ErrInvalid},
		{name: "file-then-dir", raw: tarOf(dirEnt("./"), fileEnt("d", "1"), dirEnt("d/")), want: ErrInvalid},
		{name: "dir-then-file-after-content", raw: tarOf(dirEnt("./"), dirEnt("d/"), fileEnt("d/x", "1"), fileEnt("d", "1")), want: ErrInvalid},
		{name: "duplicate-root", raw: tarOf(dirEnt("./"), dirEnt("./")), want: ErrInvalid},
		{name: "hard-link", raw: tarOf(dirEnt("./"), fileEnt("f", "x"), ent{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "l", Linkname: "f"}}), want: ErrInvalid},
		{name: "hard-link-outside", raw: tarOf(dirEnt("./"), ent{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "l", Linkname: "/etc/passwd"}}), want: ErrInvalid},
		{name: "char-device", raw: tarOf(dirEnt("./"), ent{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "null", Mode: 0o666, Devmajor: 1, Devminor: 3}}), want: ErrInvalid},
		{name: "block-device", raw: tarOf(dirEnt("./"), ent{hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Mode: 0o666, Devmajor: 8}}), want: ErrInvalid},
		{name: "fifo", raw: tarOf(dirEnt("./"), ent{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "p", Mode: 0o666}}), want: ErrInvalid},
		{name: "global-header", raw: tarOf(dirEnt("./"), ent{hdr: tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "g", PAXRecords: map[string]string{"path": "x"}}}), want: ErrInvalid},
		{name: "security-xattr", raw: tarOf(dirEnt("./"), ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "f", Mode: 0o755,
			PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\xff\xff\xff\xff"}}}), want: ErrInvalid},
		{name: "trusted-xattr", raw: tarOf(dirEnt("./"), ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o755,
			PAXRecords: map[string]string{"SCHILY.xattr.trusted.overlay.opaque": "y"}}}), want: ErrInvalid},
		{name: "unknown-pax-record", raw: tarOf(dirEnt("./"), ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "f", Mode: 0o644,
			PAXRecords: map[string]string{"comment": "hello"}}}), want: ErrInvalid},
		{name: "gnu-sparse-pax", raw: func(t testing.TB, _ string) []byte {
			// archive/tar writes no GNU.sparse records: a PAX header made by hand.
			recs := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
				paxRecord("GNU.sparse.name", "f") + paxRecord("GNU.sparse.realsize", "1099511627776")
			sec := t0.Truncate(time.Second)
			raw := rawTar(t, ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755, ModTime: sec, Format: tar.FormatUSTAR}},
				ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "PaxHeaders/f", Size: int64(len(recs)), ModTime: sec, Format: tar.FormatUSTAR}, data: recs},
				ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "f", Mode: 0o644, Size: 513, ModTime: sec, Format: tar.FormatUSTAR}, data: "1\n0\n1\n" + strings.Repeat("\x00", 506) + "x"})
			retype(raw[512:1024], tar.TypeXHeader)
			return raw
		}, want: ErrInvalid},
		{name: "xattr-on-symlink", raw: tarOf(dirEnt("./"), ent{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "s", Linkname: "t",
			PAXRecords: map[string]string{"SCHILY.xattr.user.x": "y"}}}), want: ErrInvalid},
		{name: "too-many-xattrs", raw: func(t testing.TB, _ string) []byte {
			recs := map[string]string{}
			for i := range MaxXattrs + 1 {
				recs["SCHILY.xattr.user."+strings.Repeat("k", i+1)] = "v"
			}
			return rawTar(t, dirEnt("./"), ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "f", Mode: 0o644, PAXRecords: recs}})
		}, want: ErrInvalid},
		{name: "empty-symlink-target", raw: tarOf(dirEnt("./"), linkEnt("s", "")), want: ErrInvalid},
		{name: "no-root-entry", raw: tarOf(fileEnt("f", "x")), want: ErrInvalid},
		{name: "root-not-first", raw: tarOf(dirEnt("./"), fileEnt("f", "x"), dirEnt("./")), want: ErrInvalid},
		{name: "root-as-file", raw: tarOf(fileEnt(".", "x")), want: ErrInvalid},
		{name: "empty-tar", raw: tarOf(), want: ErrInvalid},
		{name: "missing-parent", raw: tarOf(dirEnt("./"), fileEnt("x/y", "x")), want: ErrInvalid},
		{name: "out-of-order", raw: tarOf(dirEnt("./"), dirEnt("a/"), dirEnt("b/"), fileEnt("a/x", "x")), want: ErrInvalid},
		{name: "file-under-file", raw: tarOf(dirEnt("./"), fileEnt("f", "x"), fileEnt("f/x", "x")), want: ErrInvalid},
		{name: "long-component", raw: tarOf(dirEnt("./"), fileEnt(long, "x")), want: ErrInvalid},
		{name: "long-path", raw: tarOf(dirEnt("./"), fileEnt(deep, "x")), want: ErrInvalid},
		{name: "long-symlink-target", raw: tarOf(dirEnt("./"), linkEnt("s", strings.Repeat("t", MaxLink+1))), want: ErrInvalid},
		{name: "size-on-dir", raw: func(t testing.TB, _ string) []byte {
			// archive/tar writes no data for a directory: a file's header retyped.
			sec := t0.Truncate(time.Second)
			raw := rawTar(t, ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755, ModTime: sec, Format: tar.FormatUSTAR}},
				ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "d", Mode: 0o755, Size: 3, ModTime: sec, Format: tar.FormatUSTAR}, data: "abc"})
			retype(raw[512:1024], tar.TypeDir)
			return raw
		}, want: ErrInvalid},
		{name: "type-unknown", raw: func(t testing.TB, _ string) []byte {
			sec := t0.Truncate(time.Second)
			raw := rawTar(t, ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755, ModTime: sec, Format: tar.FormatUSTAR}},
				ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "x", Mode: 0o755, Size: 3, ModTime: sec, Format: tar.FormatUSTAR}, data: "abc"})
			retype(raw[512:1024], 'Z')
			return raw
		}, want: ErrInvalid},
		{name: "gnu-old-sparse", raw: func(t testing.TB, _ string) []byte {
			sec := t0.Truncate(time.Second)
			raw := rawTar(t, ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755, ModTime: sec, Format: tar.FormatUSTAR}},
				ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "x", Mode: 0o755, Size: 3, ModTime: sec, Format: tar.FormatUSTAR}, data: "abc"})
			retype(raw[512:1024], tar.TypeGNUSparse)
			return raw
		}, want: ErrInvalid},
		{name: "negative-uid", raw: tarOf(dirEnt("./"), ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "f", Mode: 0o644, Uid: -1}}), want: ErrInvalid},
		{name: "too-many-entries", raw: tarOf(dirEnt("./"), fileEnt("a", ""), fileEnt("b", ""), fileEnt("c", ""), fileEnt("d", "")),
			limits: runtime.ArchiveLimits{MaxFiles: 4}, want: ErrTooLarge},
		{name: "too-many-bytes-one-file", raw: tarOf(dirEnt("./"), fileEnt("a", "0123456789a")),
			limits: runtime.ArchiveLimits{MaxBytes: 10}, want: ErrTooLarge},
		{name: "too-many-bytes-in-all", raw: tarOf(dirEnt("./"), fileEnt("a", "012345"), fileEnt("b", "012345")),
			limits: runtime.ArchiveLimits{MaxBytes: 10}, want: ErrTooLarge},
		{name: "declared-huge-size-truncated", raw: func(t testing.TB, _ string) []byte {
			raw := rawTar(t, dirEnt("./"), fileEnt("f", strings.Repeat("x", 4096)))
			return raw[:len(raw)-1024-2048] // cut inside the file's data
		}, want: ErrInvalid},
		{name: "truncated-header", raw: func(t testing.TB, _ string) []byte {
			raw := rawTar(t, dirEnt("./"), fileEnt("f", "x"))
			return raw[:len(raw)-1024-512-100]
		}, want: ErrInvalid},
		{name: "garbage-tar", raw: func(testing.TB, string) []byte { return bytes.Repeat([]byte("garbage!"), 200) }, want: ErrInvalid},
	}
}

// paxRecord is one PAX record ("len key=value\n", len counting itself).
func paxRecord(k, v string) string {
	n := len(k) + len(v) + 3
	for {
		rec := fmt.Sprintf("%d %s=%s\n", n, k, v)
		if len(rec) == n {
			return rec
		}
		n = len(rec)
	}
}

// retype changes a ustar header block's type and fixes its checksum.
func retype(blk []byte, typ byte) {
	blk[156] = typ
	copy(blk[148:156], "        ")
	sum := 0
	for _, c := range blk[:512] {
		sum += int(c)
	}
	copy(blk[148:156], fmt.Sprintf("%06o\x00 ", sum))
}

func TestExtractRefusesAttacks(t *testing.T) {
	for _, c := range attackCases() {
		t.Run(c.name, func(t *testing.T) {
			outside := t.TempDir()
			data := compress(t, c.raw(t, outside))
			_, _, err := extractFresh(t, data, c.limits, IDMap{})
			if !errors.Is(err, c.want) {
				t.Fatalf("Extract: %v, want %v", err, c.want)
			}
			if errors.Is(err, ErrInvalid) && errors.Is(err, ErrTooLarge) {
				t.Fatalf("Extract: %v wraps both errors", err)
			}
			t.Logf("%v", err)
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Fatalf("written outside the root: %v", ents)
			}
		})
	}
}

// Broken streams: each is ErrInvalid, never a panic.
func TestExtractRefusesBrokenStreams(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), bigContent(1<<20, 3), 0o644); err != nil {
		t.Fatal(err)
	}
	good, _ := writeArchive(t, src, IDMap{})
	bigWindow := compress(t, rawTar(t, dirEnt("./"), fileEnt("f", string(bigContent(20<<20, 4)))),
		zstd.WithWindowSize(64<<20), zstd.WithEncoderLevel(zstd.SpeedFastest))
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0x55
	for name, data := range map[string][]byte{
		"empty":              nil,
		"garbage":            bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 1000),
		"truncated-half":     good[:len(good)/2],
		"truncated-last":     good[:len(good)-1],
		"truncated-header":   good[:3],
		"bit-flip":           flipped,
		"trailing-garbage":   append(bytes.Clone(good), "garbage"...),
		"uncompressed":       rawTar(t, dirEnt("./"), fileEnt("f", "x")),
		"window-over-8MiB":   bigWindow,
		"two-archives-glued": append(bytes.Clone(good), good...),
		"small-glued":        append(compress(t, rawTar(t, dirEnt("./"))), compress(t, rawTar(t, fileEnt("f", "x")))...),
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := extractFresh(t, data, runtime.ArchiveLimits{}, IDMap{})
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Extract: %v, want ErrInvalid", err)
			}
			t.Logf("%v", err)
		})
	}
	if _, _, err := extractFresh(t, good, runtime.ArchiveLimits{}, IDMap{}); err != nil {
		t.Fatalf("the intact archive: %v", err)
	}
}

// failingReader fails after n bytes, as a blob reader whose digest does not match.
type failingReader struct {
	r   io.Reader
	n   int
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, f.err
	}
	if len(p) > f.n {
		p = p[:f.n]
	}
	n, err := f.r.Read(p)
	f.n -= n
	if errors.Is(err, io.EOF) {
		return n, f.err
	}
	return n, err
}

// The reader's own failure is returned as it is (not as a corrupt archive), also when it
// comes at the very end (a digest checked at EOF).
func TestExtractReturnsReaderErrors(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), bigContent(1<<20, 5), 0o644); err != nil {
		t.Fatal(err)
	}
	good, _ := writeArchive(t, src, IDMap{})
	errDigest := errors.New("digest mismatch")
	for _, n := range []int{0, len(good) / 2, len(good)} {
		root := t.TempDir()
		_, err := Extract(context.Background(), &failingReader{r: bytes.NewReader(good), n: n, err: errDigest}, openDir(t, root), runtime.ArchiveLimits{}, IDMap{})
		if !errors.Is(err, errDigest) || errors.Is(err, ErrInvalid) {
			t.Errorf("reader failing after %d of %d bytes: %v, want the reader's error", n, len(good), err)
		}
	}
}

// Modes: setuid/setgid never survive; the sticky bit only on directories.
func TestExtractStripsModes(t *testing.T) {
	data := archive(t, dirEnt("./"),
		ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777}},
		ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "sgid/", Mode: 0o2775}},
		ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "suid", Mode: 0o4755, Size: 1}, data: "x"},
		ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "sgid-file", Mode: 0o2755, Size: 1}, data: "x"},
		ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "sticky-file", Mode: 0o1644, Size: 1}, data: "x"},
		ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "type-bits", Mode: 0o100640, Size: 1}, data: "x"},
	)
	root, _, err := extractFresh(t, data, runtime.ArchiveLimits{}, IDMap{})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{
		"tmp":         os.ModeDir | os.ModeSticky | 0o777,
		"sgid":        os.ModeDir | 0o775,
		"suid":        0o755,
		"sgid-file":   0o755,
		"sticky-file": 0o644,
		"type-bits":   0o640,
	} {
		fi, err := os.Lstat(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode(), want)
		}
	}
}

// Symlinks are created as they are, never followed: an absolute target stays a string.
func TestExtractSymlinksNotFollowed(t *testing.T) {
	outside := t.TempDir()
	data := archive(t, dirEnt("./"), linkEnt("abs", outside), linkEnt("rel", "../sibling/x"), linkEnt("dangling", "nope/nope"))
	root, st, err := extractFresh(t, data, runtime.ArchiveLimits{}, IDMap{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 4 || st.Bytes != 0 {
		t.Errorf("stats %+v", st)
	}
	for name, want := range map[string]string{"abs": outside, "rel": "../sibling/x", "dangling": "nope/nope"} {
		got, err := os.Readlink(filepath.Join(root, name))
		if err != nil || got != want {
			t.Errorf("%s -> %q (%v), want %q", name, got, err, want)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("written outside: %v", ents)
	}
}

func TestExtractLimitsExact(t *testing.T) {
	data := archive(t, dirEnt("./"), fileEnt("a", "01234"), fileEnt("b", "56789"))
	if _, st, err := extractFresh(t, data, runtime.ArchiveLimits{MaxBytes: 10, MaxFiles: 3}, IDMap{}); err != nil || st.Bytes != 10 || st.Files != 3 {
		t.Fatalf("at its limits: %+v %v", st, err)
	}
	if _, _, err := extractFresh(t, data, runtime.ArchiveLimits{MaxBytes: 9}, IDMap{}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a byte over: %v", err)
	}
	if _, _, err := extractFresh(t, data, runtime.ArchiveLimits{MaxFiles: 2}, IDMap{}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("an entry over: %v", err)
	}
}

func TestCheckPath(t *testing.T) {
	for _, p := range []string{"", "/a", "..", "../a", "a/..", "a/../b", "a/", "a//b", "./a", "a/.", "a\x00b", strings.Repeat("x", 256), strings.Repeat("x/", 2049)} {
		if checkPath(p) == nil {
			t.Errorf("checkPath(%q) accepted", p)
		}
	}
	for _, p := range []string{"a", "a/b", "...", "a/..b", "..a", " ", "a\\..\\b", strings.Repeat("x", 255)} {
		if err := checkPath(p); err != nil {
			t.Errorf("checkPath(%q): %v", p, err)
		}
	}
}

func TestIDMap(t *testing.T) {
	m := IDMap{HostBase: 100000, Size: 65536}
	for host, want := range map[uint32]uint32{100000: 0, 101000: 1000, 165535: 65535, 0: nobody, 99999: nobody, 165536: nobody} {
		if got := m.toSandbox(host); got != want {
			t.Errorf("toSandbox(%d) = %d, want %d", host, got, want)
		}
	}
	for id, want := range map[uint32]uint32{0: 100000, 1000: 101000, 65535: 165535, 65536: 100000 + nobody, 1 << 31: 100000 + nobody} {
		if got, ok := m.toHost(id); !ok || got != want {
			t.Errorf("toHost(%d) = %d %v, want %d", id, got, ok, want)
		}
	}
	small := IDMap{HostBase: 100000, Size: 1000}
	if _, ok := small.toHost(5000); ok {
		t.Error("toHost outside a map without nobody: ok")
	}
	if got, ok := (IDMap{}).toHost(1234); !ok || got != 1234 {
		t.Errorf("zero map toHost = %d %v", got, ok)
	}
	if got := (IDMap{}).toSandbox(1234); got != 1234 {
		t.Errorf("zero map toSandbox = %d", got)
	}
}

// Owners round-trip through the sandbox's view (root only: chown).
func TestOwnersMapped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown)")
	}
	src := t.TempDir()
	for name, uid := range map[string]int{"in": 100005, "out": 7} {
		p := filepath.Join(src, name)
		if err := os.WriteFile(p, []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, uid+1); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("in", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(src, "link"), 100009, 100009); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(src, 100000, 100000); err != nil {
		t.Fatal(err)
	}
	data, _ := writeArchive(t, src, IDMap{HostBase: 100000, Size: 65536})
	owners := map[string][2]int{}
	for _, h := range tarEntries(t, data) {
		owners[h.Name] = [2]int{h.Uid, h.Gid}
	}
	wantStored := map[string][2]int{"./": {0, 0}, "in": {5, 6}, "out": {nobody, nobody}, "link": {9, 9}}
	for name, want := range wantStored {
		if owners[name] != want {
			t.Errorf("stored owner of %s: %v, want %v", name, owners[name], want)
		}
	}
	root, _, err := extractFresh(t, data, runtime.ArchiveLimits{}, IDMap{HostBase: 200000, Size: 65536})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][2]uint32{".": {200000, 200000}, "in": {200005, 200006}, "out": {200000 + nobody, 200000 + nobody}, "link": {200009, 200009}} {
		var st = describe(t, root)[name]
		if st.uid != want[0] || st.gid != want[1] {
			t.Errorf("extracted owner of %s: %d:%d, want %v", name, st.uid, st.gid, want)
		}
	}
}

func TestExtractContextCancelledMidway(t *testing.T) {
	src := t.TempDir()
	for i := range 20 {
		if err := os.WriteFile(filepath.Join(src, string(rune('a'+i))), bigContent(1<<20, uint64(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, _ := writeArchive(t, src, IDMap{})
	ctx, cancel := context.WithCancel(context.Background())
	r := &cancelAfter{r: bytes.NewReader(data), n: len(data) / 3, cancel: cancel}
	start := time.Now()
	_, err := Extract(ctx, r, openDir(t, t.TempDir()), runtime.ArchiveLimits{}, IDMap{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Extract: %v, want context.Canceled (after %v)", err, time.Since(start))
	}
}

type cancelAfter struct {
	r      io.Reader
	n      int
	cancel func()
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if c.n -= n; c.n <= 0 {
		c.cancel()
	}
	return n, err
}

// Extreme mtimes are clamped by the file system, not an error.
func TestExtractExtremeMtimes(t *testing.T) {
	var ents []ent
	ents = append(ents, dirEnt("./"))
	for i, mt := range []time.Time{time.Unix(0, 0), time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(1960, 1, 1, 0, 0, 0, 5, time.UTC), time.Date(9999, 12, 31, 0, 0, 0, 999999999, time.UTC)} {
		e := fileEnt(fmt.Sprint("f", i), "x")
		e.hdr.ModTime = mt
		d := dirEnt(fmt.Sprint("d", i, "/"))
		d.hdr.ModTime = mt
		l := linkEnt(fmt.Sprint("l", i), "x")
		l.hdr.ModTime = mt
		ents = append(ents, e, d, l)
	}
	if _, _, err := extractFresh(t, archive(t, ents...), runtime.ArchiveLimits{}, IDMap{}); err != nil {
		t.Fatal(err)
	}
	root, _, err := extractFresh(t, archive(t, ents[:4]...), runtime.ArchiveLimits{}, IDMap{})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(root, "l0")); err != nil || !fi.ModTime().Equal(time.Unix(0, 0)) {
		t.Fatalf("symlink mtime: %v %v", fi.ModTime(), err)
	}
}
