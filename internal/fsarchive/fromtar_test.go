package fsarchive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

func gzipped(t testing.TB, raw []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// contextTar is a build context as `tar -C dir .` might write it, out of order, with
// directories missing and a setuid bit.
func contextTar(t testing.TB) []byte {
	suid := fileEnt("./bin/run.sh", "#!/bin/sh\necho hi\n")
	suid.hdr.Mode = 0o4755
	sticky := dirEnt("./tmp/")
	sticky.hdr.Mode = 0o1777
	return rawTar(t,
		dirEnt("./"),
		fileEnt("./Dockerfile", "FROM x\nCOPY . /app\n"),
		fileEnt("src/z/deep.txt", "deep"), // no src/ nor src/z/ entry
		suid,
		fileEnt("./a-b", "dash"),
		dirEnt("./a/"),
		fileEnt("./a/b", "ab"),
		linkEnt("./link", "../../etc/passwd"),
		sticky,
		dirEnt("src/"), // after its content: takes its place
	)
}

func TestFromTarRoundTrip(t *testing.T) {
	raw := contextTar(t)
	data, err := FromTar(bytes.NewReader(raw), TarLimits{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"./", "Dockerfile", "a/", "a/b", "a-b", "bin/", "bin/run.sh", "link", "src/", "src/z/", "src/z/deep.txt", "tmp/"}
	if got := names(t, data); !slices.Equal(got, want) {
		t.Fatalf("entries %q, want %q", got, want)
	}
	gz, err := FromTar(bytes.NewReader(gzipped(t, raw)), TarLimits{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gz, data) {
		t.Errorf("the gzip-compressed tar gives other bytes than the plain one")
	}
	root, st, err := extractFresh(t, data, runtime.ArchiveLimits{MaxFiles: int64(len(want)), MaxBytes: 1 << 20}, IDMap{})
	if err != nil {
		t.Fatalf("Extract: %v", err)
	}
	if st.Files != int64(len(want)) {
		t.Errorf("extracted %d entries, want %d", st.Files, len(want))
	}
	for p, c := range map[string]string{"Dockerfile": "FROM x\nCOPY . /app\n", "src/z/deep.txt": "deep", "a/b": "ab", "bin/run.sh": "#!/bin/sh\necho hi\n"} {
		if b, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(b) != c {
			t.Errorf("%s: %q %v, want %q", p, b, err, c)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "bin/run.sh")); err != nil || fi.Mode().Perm() != 0o755 || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
		t.Errorf("bin/run.sh mode %v %v, want 0755 without setuid", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(root, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("tmp mode %v %v, want the sticky bit", fi.Mode(), err)
	}
	if l, err := os.Readlink(filepath.Join(root, "link")); err != nil || l != "../../etc/passwd" {
		t.Errorf("link -> %q %v", l, err)
	}
	// Another order of the same entries gives the same bytes.
	ents := []ent{fileEnt("b/c", "1"), fileEnt("a", "2"), dirEnt("b/")}
	one, err := FromTar(bytes.NewReader(rawTar(t, ents...)), TarLimits{})
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(ents)
	two, err := FromTar(bytes.NewReader(rawTar(t, ents...)), TarLimits{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(one, two) {
		t.Errorf("the order of the tar's entries changes the archive")
	}
}

func TestTreeLookupAddFile(t *testing.T) {
	tree, err := ReadTar(bytes.NewReader(contextTar(t)), TarLimits{})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]byte{"Dockerfile": tar.TypeReg, "src/z": tar.TypeDir, "link": tar.TypeSymlink, "nope": 0} {
		if got := tree.Lookup(p); got != want {
			t.Errorf("Lookup(%s) = %q, want %q", p, got, want)
		}
	}
	if err := tree.AddFile("Dockerfile", []byte("x")); !errors.Is(err, ErrInvalid) {
		t.Errorf("AddFile over an entry: %v", err)
	}
	if err := tree.AddFile("a/x", []byte("x")); !errors.Is(err, ErrInvalid) {
		t.Errorf("AddFile of a path: %v", err)
	}
	if err := tree.AddFile(".inline", []byte("FROM y\n")); err != nil {
		t.Fatal(err)
	}
	data, err := tree.Archive()
	if err != nil {
		t.Fatal(err)
	}
	if got := names(t, data); got[1] != ".inline" {
		t.Errorf("entries %q, want .inline second", got)
	}
	small, err := ReadTar(bytes.NewReader(rawTar(t, fileEnt("a", "1"))), TarLimits{MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := small.AddFile("b", nil); !errors.Is(err, ErrTooLarge) {
		t.Errorf("AddFile beyond MaxEntries: %v", err)
	}
}

// A header that claims a huge size and carries no data (the tar writer will not write
// one: its size field is patched).
func hugeSizeTar(t testing.TB) []byte {
	raw := rawTar(t, ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "big", Mode: 0o644, ModTime: time.Unix(1000, 0), Format: tar.FormatUSTAR}})
	copy(raw[124:136], "77777777777\x00") // 8 GiB
	retype(raw, tar.TypeReg)              // fixes the checksum
	return raw
}

// retyped is e as a ustar entry of type typ.
func retyped(t testing.TB, e ent, typ byte) []byte {
	e.hdr.Format = tar.FormatUSTAR
	e.hdr.ModTime = time.Unix(1000, 0)
	raw := rawTar(t, e)
	retype(raw, typ)
	return raw
}

type tarCase struct {
	name  string
	data  []byte
	lim   TarLimits
	large bool   // ErrTooLarge, else ErrInvalid
	want  string // in the message
}

func tarCases(t testing.TB) []tarCase {
	long := strings.Repeat("n", MaxName+1)
	deep := strings.Repeat("d/", 9) + "f"
	var longPath string
	for len(longPath) <= MaxPath {
		longPath += strings.Repeat("p", 200) + "/"
	}
	longPath += "f"
	bomb := gzipped(t, rawTar(t, fileEnt("zeros", strings.Repeat("\x00", 8<<20))))
	manyEnts := make([]ent, 0, 20)
	for i := range 20 {
		manyEnts = append(manyEnts, fileEnt(strings.Repeat("f", i+1), ""))
	}
	return []tarCase{
		{"traversal", rawTar(t, fileEnt("../evil", "x")), TarLimits{}, false, `"../evil": path leaves the root`},
		{"traversal inside", rawTar(t, fileEnt("a/../../evil", "x")), TarLimits{}, false, `"a/../../evil": path leaves the root`},
		{"dotdot that stays inside", rawTar(t, fileEnt("a/../b", "x")), TarLimits{}, false, `"a/../b": path leaves the root`},
		{"absolute", rawTar(t, fileEnt("/etc/passwd", "x")), TarLimits{}, false, `"/etc/passwd": absolute path`},
		{"hard link", rawTar(t, fileEnt("a", "x"), ent{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "b", Linkname: "a"}}), TarLimits{}, false, `"b": a hard link`},
		{"hard link out", rawTar(t, ent{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "b", Linkname: "/etc/shadow"}}), TarLimits{}, false, `"b": a hard link`},
		{"char device", rawTar(t, ent{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3}}), TarLimits{}, false, `"null": a device node`},
		{"block device", rawTar(t, ent{hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8}}), TarLimits{}, false, `"sda": a device node`},
		{"fifo", rawTar(t, ent{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "p"}}), TarLimits{}, false, `"p": a fifo`},
		{"sparse", retyped(t, fileEnt("s", ""), tar.TypeGNUSparse), TarLimits{}, false, ""},
		{"unknown type", retyped(t, fileEnt("u", ""), 'Z'), TarLimits{}, false, `"u": entry type`},
		{"duplicate", rawTar(t, fileEnt("a", "1"), fileEnt("./a", "2")), TarLimits{}, false, `"./a": a second entry`},
		{"duplicate dir", rawTar(t, dirEnt("a/"), dirEnt("a/")), TarLimits{}, false, `"a/": a second entry`},
		{"file over dir", rawTar(t, fileEnt("a/b", "1"), fileEnt("a", "2")), TarLimits{}, false, `"a": a second entry`},
		{"below a file", rawTar(t, fileEnt("a", "1"), fileEnt("a/b", "2")), TarLimits{}, false, `"a/b": below "a"`},
		{"below a symlink", rawTar(t, linkEnt("a", "/etc"), fileEnt("a/passwd", "2")), TarLimits{}, false, `"a/passwd": below "a"`},
		{"root a file", rawTar(t, fileEnt(".", "")), TarLimits{}, false, `names the root`},
		{"long component", rawTar(t, fileEnt(long, "")), TarLimits{}, false, "component longer"},
		{"long path", rawTar(t, fileEnt(longPath, "")), TarLimits{}, false, "path longer"},
		{"deep", rawTar(t, fileEnt(deep, "")), TarLimits{MaxDepth: 8}, false, "deeper than 8"},
		{"symlink without target", rawTar(t, linkEnt("l", "")), TarLimits{}, false, `"l": a symlink without a target`},
		{"long symlink", rawTar(t, linkEnt("l", strings.Repeat("x", MaxLink+1))), TarLimits{}, false, `"l": a symlink target longer`},
		{"huge size", hugeSizeTar(t), TarLimits{}, true, `"big": more than`},
		{"bytes", rawTar(t, fileEnt("a", "12345"), fileEnt("b", "12345")), TarLimits{MaxBytes: 10}, true, `"b": more than 10 bytes`},
		{"entries", rawTar(t, manyEnts...), TarLimits{MaxEntries: 10}, true, "more than 10 entries"},
		{"implicit dirs count", rawTar(t, fileEnt("a/b/c/d", "")), TarLimits{MaxEntries: 3}, true, "more than 3 entries"},
		{"gzip bomb", bomb, TarLimits{MaxStream: 1 << 20}, true, "longer than 1048576 bytes"},
		{"zstd", compress(t, rawTar(t, fileEnt("a", ""))), TarLimits{}, false, "zstd"},
		{"xz", []byte("\xfd7zXZ\x00rest"), TarLimits{}, false, "xz"},
		{"bzip2", []byte("BZh91AY&SY"), TarLimits{}, false, "bzip2"},
		{"empty", nil, TarLimits{}, false, "empty"},
		{"garbage", []byte(strings.Repeat("garbage ", 100)), TarLimits{}, false, "tar"},
		{"bad gzip", []byte{0x1f, 0x8b, 0, 0}, TarLimits{}, false, "gzip"},
		{"truncated", rawTar(t, fileEnt("a", strings.Repeat("x", 2000)))[:1700], TarLimits{}, false, "truncated"},
		{"truncated gzip", gzipped(t, rawTar(t, fileEnt("a", "x")))[:40], TarLimits{}, false, ""},
		{"no entries", make([]byte, 1024), TarLimits{}, false, "no entries"},
	}
}

// Every refusal: the right error, naming the entry and why, and no archive.
func TestFromTarRefuses(t *testing.T) {
	for _, tc := range tarCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			data, err := FromTar(bytes.NewReader(tc.data), tc.lim)
			want := ErrInvalid
			if tc.large {
				want = ErrTooLarge
			}
			if !errors.Is(err, want) || data != nil {
				t.Fatalf("FromTar: %v (%d bytes), want %v", err, len(data), want)
			}
			var te *TarError
			if !errors.As(err, &te) {
				t.Fatalf("%T is not a *TarError", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

// The same refusals gzip-compressed (but those about the compression itself).
func TestFromTarRefusesGzipped(t *testing.T) {
	for _, tc := range tarCases(t) {
		if len(tc.data) < 2 || tc.data[0] == 0x1f || tc.name == "zstd" || tc.name == "xz" || tc.name == "bzip2" || tc.name == "garbage" {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromTar(bytes.NewReader(gzipped(t, tc.data)), tc.lim)
			if want := map[bool]error{true: ErrTooLarge, false: ErrInvalid}[tc.large]; !errors.Is(err, want) {
				t.Fatalf("FromTar: %v, want %v", err, want)
			}
		})
	}
}

func TestFromTarReaderError(t *testing.T) {
	boom := errors.New("boom")
	raw := rawTar(t, fileEnt("a", strings.Repeat("x", 4096)))
	_, err := FromTar(&failingReader{r: bytes.NewReader(raw), n: 1000, err: boom}, TarLimits{})
	if !errors.Is(err, boom) || errors.Is(err, ErrInvalid) {
		t.Fatalf("FromTar: %v, want the reader's error", err)
	}
}

// FuzzFromTar: whatever the bytes, FromTar refuses them with a *TarError or answers an
// archive that Extract takes within the same limits (nothing outside its root), the
// same bytes each time.
func FuzzFromTar(f *testing.F) {
	for _, tc := range tarCases(f) {
		if len(tc.data) > 64<<10 {
			continue // the bomb: its case is in TestFromTarRefuses
		}
		f.Add(tc.data, false)
	}
	f.Add(contextTar(f), false)
	f.Add(contextTar(f), true)
	f.Add(rawTar(f, fileEnt("../x", "1")), true)
	f.Add(rawTar(f, linkEnt("a", ".."), fileEnt("a/b", "1")), false)
	f.Add(rawTar(f, ent{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: "/etc/passwd"}}), true)
	f.Add(hugeSizeTar(f), true)
	f.Add(gzipped(f, rawTar(f, fileEnt("z", strings.Repeat("\x00", 1<<20)))), false)
	lim := TarLimits{MaxBytes: 256 << 10, MaxEntries: 500, MaxDepth: 32, MaxStream: 2 << 20}
	f.Fuzz(func(t *testing.T, data []byte, gz bool) {
		if gz {
			data = gzipped(t, data)
		}
		out, err := FromTar(bytes.NewReader(data), lim)
		if err != nil {
			var te *TarError
			if !errors.As(err, &te) || !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("FromTar: %v (%T), want a *TarError", err, err)
			}
			return
		}
		again, err := FromTar(bytes.NewReader(data), lim)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("a second FromTar differs: %v", err)
		}
		ctxLim := runtime.ArchiveLimits{MaxBytes: lim.MaxBytes, MaxFiles: lim.MaxEntries + 1}
		if _, _, err := extractFresh(t, out, ctxLim, IDMap{}); err != nil {
			t.Fatalf("Extract refuses FromTar's archive: %v", err)
		}
	})
}
