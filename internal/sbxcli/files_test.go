package sbxcli

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeTree makes files (path → content; "->target" makes a symbolic link, a trailing
// slash a directory) under dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasSuffix(p, "/"):
			err = os.MkdirAll(full, 0o755)
		case strings.HasPrefix(content, "->"):
			err = os.Symlink(strings.TrimPrefix(content, "->"), full)
		default:
			err = os.WriteFile(full, []byte(content), 0o640)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// readTree lists dir as path → content ("->target" for links, "/" for directories).
func readTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			got[rel] = "->" + target
			return err
		case d.IsDir():
			got[rel+"/"] = ""
		default:
			b, err := os.ReadFile(p)
			got[rel] = string(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func equalTrees(a, b map[string]string) bool {
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

// The fake sandbox's exec runs on this host, so its "sandbox paths" are local ones:
// cp, ls, rm and mkdir run their real scripts with this host's tar and shell.
func TestSbxFilesCopyAndManage(t *testing.T) {
	f := newFake(t)
	f.add("sbx-1")
	src, box, back := t.TempDir(), t.TempDir(), t.TempDir()
	tree := map[string]string{
		"proj/a.txt": "alpha\n", "proj/sub/b.bin": "\x00\x01binary", "proj/sub/deep/c": "c", "proj/empty/": "",
		"proj/link": "->sub/b.bin", "proj/sub/up": "->../a.txt", "proj/-dash": "dash",
	}
	writeTree(t, src, tree)
	if err := os.Chmod(filepath.Join(src, "proj/a.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for k, v := range tree {
		want[strings.TrimPrefix(k, "proj/")] = v
	}
	want["sub/"], want["sub/deep/"] = "", ""

	// A directory to a sandbox path that does not exist: it becomes the copy.
	if _, errs, code := f.sbx("", "cp", filepath.Join(src, "proj"), "sbx-1:"+box+"/new"); code != 0 {
		t.Fatalf("cp up: %d %q", code, errs)
	}
	if got := readTree(t, box+"/new"); !equalTrees(got, want) {
		t.Errorf("in the sandbox:\n got %v\nwant %v", got, want)
	}
	if fi, err := os.Stat(box + "/new/a.txt"); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("mode not kept: %v %v", fi.Mode(), err)
	}
	// To an existing directory: the copy goes inside it, under its name (cp -r).
	if _, errs, code := f.sbx("", "files", "cp", filepath.Join(src, "proj"), "sbx-1:"+box); code != 0 {
		t.Fatalf("files cp up: %d %q", code, errs)
	}
	if got := readTree(t, box+"/proj"); !equalTrees(got, want) {
		t.Errorf("in the sandbox, in a directory:\n got %v\nwant %v", got, want)
	}
	// And back, both ways.
	if _, errs, code := f.sbx("", "cp", "sbx-1:"+box+"/proj", back+"/copy"); code != 0 {
		t.Fatalf("cp down: %d %q", code, errs)
	}
	if got := readTree(t, back+"/copy"); !equalTrees(got, want) {
		t.Errorf("copied back:\n got %v\nwant %v", got, want)
	}
	if _, errs, code := f.sbx("", "cp", "sbx-1:"+box+"/proj", back); code != 0 {
		t.Fatalf("cp down into a directory: %d %q", code, errs)
	}
	if got := readTree(t, back+"/proj"); !equalTrees(got, want) {
		t.Errorf("copied back into a directory:\n got %v\nwant %v", got, want)
	}
	// Single files, both ways, to a new name and into a directory.
	if _, errs, code := f.sbx("", "cp", filepath.Join(src, "proj/a.txt"), "sbx-1:"+box+"/one/renamed.txt"); code != 0 {
		t.Fatalf("cp a file up: %d %q", code, errs)
	}
	if b, err := os.ReadFile(box + "/one/renamed.txt"); err != nil || string(b) != "alpha\n" {
		t.Errorf("file up: %q %v", b, err)
	}
	if _, errs, code := f.sbx("", "cp", "sbx-1:"+box+"/one/renamed.txt", back); code != 0 {
		t.Fatalf("cp a file down: %d %q", code, errs)
	}
	if b, err := os.ReadFile(back + "/renamed.txt"); err != nil || string(b) != "alpha\n" {
		t.Errorf("file down: %q %v", b, err)
	}
	if _, errs, code := f.sbx("", "cp", "sbx-1:"+box+"/nope", back+"/x"); code != 1 || !strings.Contains(errs, "tar in the sandbox exited") {
		t.Errorf("cp of a missing path: %d %q", code, errs)
	}
	if _, errs, code := f.sbx("", "cp", src, back); code != 1 || !strings.Contains(errs, "ID:PATH") {
		t.Errorf("cp local to local: %d %q", code, errs)
	}

	// ls, mkdir, rm.
	if out, errs, code := f.sbx("", "files", "ls", "sbx-1", box+"/proj"); code != 0 || !strings.Contains(out, "a.txt") || !strings.Contains(out, "link -> sub/b.bin") {
		t.Errorf("files ls: %d %q %q", code, out, errs)
	}
	if _, errs, code := f.sbx("", "files", "mkdir", "-p", "sbx-1", box+"/m/n/o"); code != 0 {
		t.Errorf("files mkdir -p: %d %q", code, errs)
	}
	if fi, err := os.Stat(box + "/m/n/o"); err != nil || !fi.IsDir() {
		t.Errorf("mkdir: %v", err)
	}
	if _, _, code := f.sbx("", "files", "mkdir", "sbx-1", box+"/x/y"); code == 0 {
		t.Error("files mkdir without -p made parents")
	}
	if _, _, code := f.sbx("", "files", "rm", "sbx-1", box+"/m"); code == 0 {
		t.Error("files rm of a directory without -r succeeded")
	}
	if _, errs, code := f.sbx("", "files", "rm", "-r", "sbx-1", box+"/m", box+"/proj/-dash"); code != 0 {
		t.Errorf("files rm -r: %d %q", code, errs)
	}
	if _, err := os.Stat(box + "/m"); !os.IsNotExist(err) {
		t.Errorf("rm -r left %v", err)
	}
	if _, _, code := f.sbx("", "files", "ls", "sbx-1", box+"/m"); code == 0 {
		t.Error("files ls of a missing path succeeded")
	}
}

// tarOf builds an archive; each entry's Typeflag, Name, Linkname, Mode and content.
type entry struct {
	typ      byte
	name     string
	linkname string
	mode     int64
	body     string
}

func tarOf(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Typeflag: e.typ, Name: e.name, Linkname: e.linkname, Mode: e.mode, Size: int64(len(e.body))}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestUntarMaliciousArchive feeds untar archives a hostile sandbox could send instead of
// `tar -c`: nothing may appear outside the destination, no link may point out of it,
// no device, FIFO or setuid file may be made, and the limits hold.
func TestUntarMaliciousArchive(t *testing.T) {
	lim := copyLimits{bytes: 1 << 20, files: 100}
	top := func(extra ...entry) []entry { return append([]entry{{typ: tar.TypeDir, name: "./d/"}}, extra...) }
	for _, tc := range []struct {
		name    string
		entries []entry
		lim     copyLimits
		fails   string   // the copy fails with this; else it succeeds
		skipped []string // the entries skipped, in order
		want    map[string]string
	}{
		{name: "dotdot", entries: top(entry{typ: tar.TypeReg, name: "./d/../../evil", body: "x"}), fails: ".. in the path"},
		{name: "dotdot inside", entries: top(entry{typ: tar.TypeReg, name: "./d/a/../b", body: "x"}), fails: ".. in the path"},
		{name: "absolute", entries: top(entry{typ: tar.TypeReg, name: "/tmp/evil", body: "x"}), fails: "not a relative path"},
		{name: "outside the top", entries: top(entry{typ: tar.TypeReg, name: "./other/evil", body: "x"}), fails: "outside the copied path"},
		{name: "first is not the source", entries: []entry{{typ: tar.TypeReg, name: "./d/x", body: "x"}}, fails: "does not start with the copied path"},
		{name: "first is a link", entries: []entry{{typ: tar.TypeSymlink, name: "./d", linkname: "/etc"}}, fails: "neither a file nor a directory"},
		{name: "empty", entries: nil, fails: "no files"},
		{name: "symlink out, then write through it", entries: top(
			entry{typ: tar.TypeSymlink, name: "./d/etc", linkname: "/etc"},
			entry{typ: tar.TypeSymlink, name: "./d/up", linkname: "../../outside"},
			entry{typ: tar.TypeReg, name: "./d/etc/passwd", body: "pwned"},
			entry{typ: tar.TypeReg, name: "./d/ok", body: "ok"},
		), skipped: []string{`"etc": symbolic link to "/etc" (points outside the copy)`, `"up": symbolic link to "../../outside" (points outside the copy)`}, want: map[string]string{"ok": "ok", "etc/": "", "etc/passwd": "pwned"}},
		{name: "chained links", entries: top(
			entry{typ: tar.TypeDir, name: "./d/x/"},
			entry{typ: tar.TypeSymlink, name: "./d/x/l", linkname: "../y"},    // inside: y
			entry{typ: tar.TypeSymlink, name: "./d/e", linkname: "x/l/../.."}, // lexically ., really ..
			entry{typ: tar.TypeSymlink, name: "./d/self", linkname: "."},
			entry{typ: tar.TypeSymlink, name: "./d/self/s2", linkname: "../../o"}, // placed through a link
		), skipped: []string{`"e": symbolic link to "x/l/../.." (points outside the copy)`, `"self/s2": its parent self is a symbolic link`},
			want: map[string]string{"x/": "", "x/l": "->../y", "self": "->."}},
		{name: "hard link out", entries: top(entry{typ: tar.TypeLink, name: "./d/h", linkname: "../../etc/passwd"}), fails: ".. in the path"},
		{name: "hard link to an absolute path", entries: top(entry{typ: tar.TypeLink, name: "./d/h", linkname: "/etc/passwd"}), fails: "not a relative path"},
		{name: "hard link inside", entries: top(entry{typ: tar.TypeReg, name: "./d/a", body: "same"}, entry{typ: tar.TypeLink, name: "./d/b", linkname: "./d/a"}),
			want: map[string]string{"a": "same", "b": "same"}},
		{name: "devices and FIFOs", entries: top(
			entry{typ: tar.TypeChar, name: "./d/mem"}, entry{typ: tar.TypeBlock, name: "./d/sda"}, entry{typ: tar.TypeFifo, name: "./d/fifo"},
		), skipped: []string{`"mem": character device (not a file, directory or link)`, `"sda": block device (not a file, directory or link)`, `"fifo": FIFO (not a file, directory or link)`},
			want: map[string]string{}},
		{name: "too many bytes", entries: top(entry{typ: tar.TypeReg, name: "./d/a", body: "12345"}, entry{typ: tar.TypeReg, name: "./d/b", body: "67890"}),
			lim: copyLimits{bytes: 8, files: 10}, fails: "--max-size"},
		{name: "too many files", entries: top(entry{typ: tar.TypeReg, name: "./d/a"}, entry{typ: tar.TypeReg, name: "./d/b"}, entry{typ: tar.TypeReg, name: "./d/c"}),
			lim: copyLimits{bytes: 8, files: 3}, fails: "--max-files"},
		{name: "a file, then more", entries: []entry{{typ: tar.TypeReg, name: "./d", body: "f"}, {typ: tar.TypeReg, name: "./d/x", body: "x"}}, fails: "unexpected after the copied path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			dst := filepath.Join(base, "dst")
			l := lim
			if tc.lim.files > 0 {
				l = tc.lim
			}
			skipped, err := untar(bytes.NewReader(tarOf(t, tc.entries...)), dst, "d", l)
			if tc.fails != "" {
				if err == nil || !strings.Contains(err.Error(), tc.fails) {
					t.Errorf("err %v, want one saying %q", err, tc.fails)
				}
			} else if err != nil {
				t.Fatalf("untar: %v", err)
			}
			if !slices.Equal(skipped, tc.skipped) {
				t.Errorf("skipped %q, want %q", skipped, tc.skipped)
			}
			// Nothing beside dst, and no link inside it that leaves it.
			if entries, _ := os.ReadDir(base); len(entries) > 1 || (len(entries) == 1 && entries[0].Name() != "dst") {
				t.Errorf("written beside the destination: %v", entries)
			}
			if tc.want != nil {
				if got := readTree(t, dst); !equalTrees(got, tc.want) {
					t.Errorf("tree\n got %v\nwant %v", got, tc.want)
				}
			}
		})
	}
}

func TestUntarStripsSpecialModeBits(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "dst")
	archive := tarOf(t, entry{typ: tar.TypeDir, name: "./d/", mode: 0o1777},
		entry{typ: tar.TypeReg, name: "./d/suid", body: "#!/bin/sh\n", mode: 0o6755},
		entry{typ: tar.TypeDir, name: "./d/ro/", mode: 0o500},
		entry{typ: tar.TypeReg, name: "./d/ro/f", body: "in a read-only directory"})
	if _, err := untar(bytes.NewReader(archive), dst, "d", copyLimits{bytes: 1 << 20, files: 10}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dst, "suid"))
	if err != nil || fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("suid file: %v %v", fi.Mode(), err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "ro/f")); err != nil || string(b) != "in a read-only directory" {
		t.Errorf("file in a read-only directory: %q %v", b, err)
	}
}

// A sandbox that answers `tar -c` with a hostile archive: sbx cp fails or skips, writes
// nothing outside the destination, and says what it left out.
func TestSbxCopyFromHostileSandbox(t *testing.T) {
	f := newFake(t)
	f.add("sbx-1")
	archive := tarOf(t, entry{typ: tar.TypeDir, name: "./out/"},
		entry{typ: tar.TypeSymlink, name: "./out/etc", linkname: "/etc"},
		entry{typ: tar.TypeReg, name: "./out/ok", body: "fine"},
		entry{typ: tar.TypeReg, name: "./out/../../escaped", body: "pwned"})
	f.exec = func(_ context.Context, _ []string, _ io.Reader, stdout, _ io.Writer) (int32, string) {
		_, _ = stdout.Write(archive)
		return 0, ""
	}
	base := t.TempDir()
	_, errs, code := f.sbx("", "cp", "sbx-1:/work/out", filepath.Join(base, "a", "dst"))
	if code != 1 || !strings.Contains(errs, ".. in the path") {
		t.Errorf("hostile archive: exit %d, %q", code, errs)
	}
	if _, err := os.Lstat(filepath.Join(base, "escaped")); !os.IsNotExist(err) {
		t.Errorf("a file escaped the destination: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(base, "a", "dst", "etc")); !os.IsNotExist(err) {
		t.Errorf("a link out of the destination was made: %v", err)
	}
	// Without the escape, the link is skipped and named, and the copy exits 1.
	archive = tarOf(t, entry{typ: tar.TypeDir, name: "./out/"}, entry{typ: tar.TypeSymlink, name: "./out/etc", linkname: "/etc"},
		entry{typ: tar.TypeReg, name: "./out/ok", body: "fine"})
	_, errs, code = f.sbx("", "cp", "sbx-1:/work/out", filepath.Join(base, "b"))
	if code != 1 || !strings.Contains(errs, `sbx: skipped "etc": symbolic link to "/etc" (points outside the copy)`) || !strings.Contains(errs, "1 entry not copied") {
		t.Errorf("archive with an outward link: exit %d, %q", code, errs)
	}
	if b, err := os.ReadFile(filepath.Join(base, "b", "ok")); err != nil || string(b) != "fine" {
		t.Errorf("the rest was not copied: %q %v", b, err)
	}
}
