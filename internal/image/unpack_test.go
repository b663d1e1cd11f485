package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/testenv"
)

type tentry struct {
	name, link, body string
	typ              byte
	mode             int64
	uid, gid         int
	xattrs           map[string]string
}

var tMtime = time.Unix(1600000000, 0)

func mkTar(t testing.TB, entries ...tentry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: tMtime, Format: tar.FormatPAX}
		if h.Mode == 0 {
			h.Mode = 0o644
			if e.typ == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

func TestUnpackFeatures(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	dir := t.TempDir()
	tb := mkTar(t,
		tentry{name: "./", typ: tar.TypeDir, mode: 0o755},
		tentry{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		tentry{name: "etc/passwd", typ: tar.TypeReg, body: "root:x:0:0::/root:/bin/sh\n", mode: 0o644},
		tentry{name: "bin/busybox", typ: tar.TypeReg, body: "ELF", mode: 0o4755, uid: 0, gid: 0},
		tentry{name: "bin/sh", typ: tar.TypeSymlink, link: "/bin/busybox"},
		tentry{name: "bin/ls", typ: tar.TypeLink, link: "bin/busybox"},
		tentry{name: "/abs/file", typ: tar.TypeReg, body: "abs"}, // made relative
		tentry{name: "home/user/", typ: tar.TypeDir, mode: 0o700, uid: 1000, gid: 1000},
		tentry{name: "home/user/f", typ: tar.TypeReg, body: "x", mode: 0o600, uid: 1000, gid: 1001},
		tentry{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		tentry{name: "opaque/", typ: tar.TypeDir},
		tentry{name: "opaque/.wh..wh..opq", typ: tar.TypeReg},
		tentry{name: "usr/.wh.gone", typ: tar.TypeReg},
		tentry{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		tentry{name: "run/fifo", typ: tar.TypeFifo, mode: 0o620},
		tentry{name: "caps", typ: tar.TypeReg, body: "c", xattrs: map[string]string{"user.k": "v", "trusted.overlay.redirect": "/etc"}},
		tentry{name: "dup", typ: tar.TypeReg, body: "first"},
		tentry{name: "dup", typ: tar.TypeReg, body: "second"},
		tentry{name: "link-to-dir", typ: tar.TypeSymlink, link: "../../../"}, // symlink targets are free
	)
	if err := unpack(context.Background(), bytes.NewReader(tb), dir); err != nil {
		t.Fatal(err)
	}
	p := func(s string) string { return filepath.Join(dir, s) }
	read := func(s string) string {
		b, err := os.ReadFile(p(s))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	lstat := func(s string) *unix.Stat_t {
		var st unix.Stat_t
		if err := unix.Lstat(p(s), &st); err != nil {
			t.Fatalf("lstat %s: %v", s, err)
		}
		return &st
	}
	if read("etc/passwd") != "root:x:0:0::/root:/bin/sh\n" || read("abs/file") != "abs" || read("dup") != "second" {
		t.Error("file contents wrong")
	}
	if l, _ := os.Readlink(p("bin/sh")); l != "/bin/busybox" {
		t.Errorf("symlink = %q", l)
	}
	if a, b := lstat("bin/busybox"), lstat("bin/ls"); a.Ino != b.Ino || a.Nlink != 2 {
		t.Error("hard link not shared")
	}
	if st := lstat("bin/busybox"); st.Mode&0o7777 != 0o4755 {
		t.Errorf("setuid mode = %o", st.Mode&0o7777)
	}
	if st := lstat("home/user"); st.Uid != 1000 || st.Gid != 1000 || st.Mode&0o7777 != 0o700 {
		t.Errorf("dir owner/mode = %d:%d %o", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if st := lstat("home/user/f"); st.Uid != 1000 || st.Gid != 1001 {
		t.Errorf("file owner = %d:%d", st.Uid, st.Gid)
	}
	if st := lstat("tmp"); st.Mode&0o7777 != 0o1777 {
		t.Errorf("tmp mode = %o", st.Mode&0o7777)
	}
	for _, s := range []string{"etc", "etc/passwd", "home/user", "bin/sh", "."} {
		if st := lstat(s); st.Mtim.Sec != tMtime.Unix() {
			t.Errorf("%s mtime = %d, want %d", s, st.Mtim.Sec, tMtime.Unix())
		}
	}
	if st := lstat("usr/gone"); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout not a 0/0 char device: mode %o rdev %d", st.Mode, st.Rdev)
	}
	if _, err := os.Lstat(p("usr/.wh.gone")); !os.IsNotExist(err) {
		t.Error(".wh. file should not exist")
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(p("opaque"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("opaque xattr: %q %v", buf[:n], err)
	}
	if _, err := os.Lstat(p("opaque/.wh..wh..opq")); !os.IsNotExist(err) {
		t.Error("opaque marker file should not exist")
	}
	if _, err := os.Lstat(p("dev/null")); !os.IsNotExist(err) {
		t.Error("device node should be skipped")
	}
	if st := lstat("run/fifo"); st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Error("fifo missing")
	}
	if n, err := unix.Lgetxattr(p("caps"), "user.k", buf); err != nil || string(buf[:n]) != "v" {
		t.Errorf("user xattr: %v", err)
	}
	if _, err := unix.Lgetxattr(p("caps"), "trusted.overlay.redirect", buf); err == nil {
		t.Error("trusted.* xattr from the image must be dropped")
	}
}

// TestUnpackRejects: every case must fail with ErrUnsafeLayer and write nothing outside dir.
func TestUnpackRejects(t *testing.T) {
	testenv.RequireRoot(t, "unpacking layers: chown, device nodes, xattrs")
	cases := []struct {
		name    string
		entries []tentry
	}{
		{"dotdot", []tentry{{name: "../x", typ: tar.TypeReg, body: "pwn"}}},
		{"dotdot-inner", []tentry{{name: "a/../../x", typ: tar.TypeReg, body: "pwn"}}},
		{"abs-dotdot", []tentry{{name: "/../x", typ: tar.TypeReg, body: "pwn"}}},
		{"hardlink-escape", []tentry{{name: "passwd", typ: tar.TypeLink, link: "../../etc/passwd"}}},
		{"hardlink-via-symlink", []tentry{
			{name: "l", typ: tar.TypeSymlink, link: "/"},
			{name: "passwd", typ: tar.TypeLink, link: "l/x"}}},
		{"write-through-symlink", []tentry{
			{name: "evil", typ: tar.TypeSymlink, link: "OUTSIDE"},
			{name: "evil/x", typ: tar.TypeReg, body: "pwn"}}},
		{"write-through-relative-symlink", []tentry{
			{name: "evil", typ: tar.TypeSymlink, link: "../outside"},
			{name: "evil/x", typ: tar.TypeReg, body: "pwn"}}},
		{"dir-through-symlink", []tentry{
			{name: "evil", typ: tar.TypeSymlink, link: "../outside"},
			{name: "evil/sub/", typ: tar.TypeDir}}},
		{"whiteout-through-symlink", []tentry{
			{name: "evil", typ: tar.TypeSymlink, link: "../outside"},
			{name: "evil/.wh.keep", typ: tar.TypeReg}}},
		{"whiteout-dotdot", []tentry{{name: "a/.wh..", typ: tar.TypeReg}}},
		{"root-as-file", []tentry{{name: ".", typ: tar.TypeReg}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			os.MkdirAll(outside, 0o755)
			os.WriteFile(filepath.Join(outside, "keep"), []byte("keep"), 0o644)
			dir := filepath.Join(base, "layer", "sub")
			os.MkdirAll(dir, 0o755)
			for i := range tc.entries {
				tc.entries[i].link = strings.ReplaceAll(tc.entries[i].link, "OUTSIDE", outside)
			}
			err := unpack(context.Background(), bytes.NewReader(mkTar(t, tc.entries...)), dir)
			if !errors.Is(err, ErrUnsafeLayer) {
				t.Fatalf("err = %v, want ErrUnsafeLayer", err)
			}
			assertOutsideUntouched(t, base, dir)
		})
	}
}

// assertOutsideUntouched checks that only dir (and its ancestors) and the sentinel exist under base.
func assertOutsideUntouched(t testing.TB, base, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(base, "outside", "keep"))
	if err != nil || string(b) != "keep" {
		t.Fatalf("sentinel changed: %q %v", b, err)
	}
	filepath.Walk(base, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			t.Fatalf("walk: %v", err)
		}
		if p == dir || strings.HasPrefix(p, dir+"/") {
			return nil
		}
		switch p {
		case base, filepath.Join(base, "outside"), filepath.Join(base, "outside", "keep"), filepath.Join(base, "layer"):
			return nil
		}
		t.Fatalf("written outside the layer dir: %s", p)
		return nil
	})
}

func TestArgv(t *testing.T) {
	img := Config{Entrypoint: []string{"/entry", "-x"}, Cmd: []string{"serve", "--port=1"}}
	noEP := Config{Cmd: []string{"python3"}}
	cases := []struct {
		name    string
		cfg     Config
		command string
		args    []string
		want    []string
	}{
		{"command+args", img, "/bin/sh", []string{"-c", "echo"}, []string{"/bin/sh", "-c", "echo"}},
		{"command only drops cmd and entrypoint", img, "/bin/true", nil, []string{"/bin/true"}},
		{"args only replace cmd", img, "", []string{"run"}, []string{"/entry", "-x", "run"}},
		{"neither", img, "", nil, []string{"/entry", "-x", "serve", "--port=1"}},
		{"cmd only image", noEP, "", nil, []string{"python3"}},
		{"args with cmd-only image", noEP, "", []string{"-c", "1"}, []string{"-c", "1"}},
		{"empty", Config{}, "", nil, nil},
		{"empty args slice", Config{}, "", []string{}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.cfg.Argv(tc.command, tc.args)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("want error, got %q", got)
				}
				return
			}
			if err != nil || strings.Join(got, "\x00") != strings.Join(tc.want, "\x00") {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
			if len(img.Entrypoint) != 2 || len(img.Cmd) != 2 {
				t.Fatal("config mutated")
			}
		})
	}
}
