package security

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/sbxcli"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// hostileTar is an archive for `tar -c ./out`: the copied directory, then entries.
func hostileTar(t *testing.T, entries ...*tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range append([]*tar.Header{{Typeflag: tar.TypeDir, Name: "./out/", Mode: 0o755}}, entries...) {
		body := bytes.Repeat([]byte("x"), int(h.Size))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestCopyFromHostileSandbox: root in a sandbox replaces its tar, so `sbx cp ID:/out DIR`
// on the user's machine reads an archive of the tenant's making: names with .. or
// absolute ones, links out of DIR and a write through them, a device node, setuid bits,
// more bytes than allowed. sbx must write nothing outside DIR, make no link leading out
// of it, no device and no setuid file, and say so by failing.
func TestCopyFromHostileSandbox(t *testing.T) {
	d := needDev(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := sandbox.New(d.API, d.KeyB)
	if err != nil {
		t.Fatal(err)
	}
	// Debian, whose /bin/sh finds tar on the PATH (busybox's runs its own applet).
	sb, err := c.Create(ctx, sandbox.Spec{Image: "python:3.11"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), sb.ID()) })
	id := sb.ID()
	// The tar first on the sandbox's PATH sends /tmp/evil.tar.
	if _, errs, code, err := sb.Run(ctx, []string{"/bin/sh", "-c",
		`printf '#!/bin/sh\nexec cat /tmp/evil.tar\n' > /usr/local/bin/tar && chmod 755 /usr/local/bin/tar && mkdir -p /out && [ "$(command -v tar)" = /usr/local/bin/tar ]`}); err != nil || code != 0 {
		t.Fatalf("replace tar: %d %v %s", code, err, errs)
	}

	for _, tc := range []struct {
		name    string
		entries []*tar.Header
		args    []string
		fails   string
	}{
		{"dotdot", []*tar.Header{{Typeflag: tar.TypeReg, Name: "./out/../../../escaped", Size: 5, Mode: 0o644}}, nil, ".. in the path"},
		{"absolute", []*tar.Header{{Typeflag: tar.TypeReg, Name: "/tmp/escaped", Size: 5, Mode: 0o644}}, nil, "not a relative path"},
		{"links out and through", []*tar.Header{
			{Typeflag: tar.TypeSymlink, Name: "./out/up", Linkname: "../../..", Mode: 0o777},
			{Typeflag: tar.TypeReg, Name: "./out/up/escaped", Size: 5, Mode: 0o644},
			{Typeflag: tar.TypeSymlink, Name: "./out/abs", Linkname: "/", Mode: 0o777},
			{Typeflag: tar.TypeLink, Name: "./out/hard", Linkname: "./out/up/escaped"},
		}, nil, "not copied"},
		{"device and setuid", []*tar.Header{
			{Typeflag: tar.TypeChar, Name: "./out/mem", Devmajor: 1, Devminor: 1, Mode: 0o666},
			{Typeflag: tar.TypeFifo, Name: "./out/fifo", Mode: 0o666},
			{Typeflag: tar.TypeReg, Name: "./out/suid", Size: 5, Mode: 0o4755},
		}, nil, "2 entries not copied"},
		{"too large", []*tar.Header{{Typeflag: tar.TypeReg, Name: "./out/big", Size: 2 << 20, Mode: 0o644}}, []string{"--max-size", "1Mi"}, "--max-size"},
		{"too many", []*tar.Header{
			{Typeflag: tar.TypeReg, Name: "./out/1", Mode: 0o644}, {Typeflag: tar.TypeReg, Name: "./out/2", Mode: 0o644},
			{Typeflag: tar.TypeReg, Name: "./out/3", Mode: 0o644},
		}, []string{"--max-files", "3"}, "--max-files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := sb.WriteFile(ctx, "/tmp/evil.tar", hostileTar(t, tc.entries...)); err != nil {
				t.Fatal(err)
			}
			base := t.TempDir()
			dst := filepath.Join(base, "a", "b", "dst")
			var out, errb bytes.Buffer
			code := sbxcli.Execute(append([]string{"--base-url", d.API, "--api-key", d.KeyB, "cp", id + ":/out", dst}, tc.args...),
				strings.NewReader(""), &out, &errb)
			if code == 0 || !strings.Contains(errb.String(), tc.fails) {
				t.Errorf("sbx cp: exit %d, stderr %q; want a failure saying %q", code, errb.String(), tc.fails)
			}
			// Nothing outside dst; inside, no link leading out, no device, no setuid file.
			_ = filepath.WalkDir(base, func(p string, e fs.DirEntry, err error) error {
				if err != nil {
					t.Error(err)
					return nil
				}
				inside := p == dst || strings.HasPrefix(p, dst+"/")
				if !inside && p != base && p != filepath.Join(base, "a") && p != filepath.Join(base, "a", "b") {
					t.Errorf("written outside the destination: %s", p)
				}
				fi, err := os.Lstat(p)
				if err != nil {
					return nil
				}
				switch m := fi.Mode(); {
				case m&fs.ModeSymlink != 0:
					target, _ := os.Readlink(p)
					resolved := filepath.Join(filepath.Dir(p), target)
					if filepath.IsAbs(target) || !strings.HasPrefix(resolved+"/", dst+"/") {
						t.Errorf("link out of the destination: %s -> %s", p, target)
					}
				case m&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0:
					t.Errorf("special file made: %s (%v)", p, m)
				case m&(fs.ModeSetuid|fs.ModeSetgid) != 0:
					t.Errorf("setuid/setgid file made: %s (%v)", p, m)
				}
				return nil
			})
			for _, p := range []string{"/escaped", "/tmp/escaped"} {
				if _, err := os.Lstat(p); err == nil {
					_ = os.Remove(p)
					t.Errorf("%s written on the host", p)
				}
			}
		})
	}
}
