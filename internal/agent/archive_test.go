package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

// archivePath collects ArchivePath's stream: the archive and the final stats.
func archivePath(ctx context.Context, t *testing.T, h *harness, path string) ([]byte, *agentv1.ArchiveStats, error) {
	t.Helper()
	st, err := h.client.ArchivePath(ctx, connect.NewRequest(&agentv1.ArchivePathRequest{Path: path}))
	if err != nil {
		return nil, nil, err
	}
	defer st.Close()
	var buf bytes.Buffer
	var stats *agentv1.ArchiveStats
	for st.Receive() {
		if stats != nil {
			t.Fatal("a message after the stats")
		}
		buf.Write(st.Msg().GetData())
		stats = st.Msg().GetStats()
	}
	return buf.Bytes(), stats, st.Err()
}

// extractPath sends archive to ExtractPath in small messages.
func extractPath(ctx context.Context, h *harness, path string, archive []byte, maxBytes, maxFiles int64) (*agentv1.ArchiveStats, error) {
	st := h.client.ExtractPath(ctx)
	first := &agentv1.ExtractPathRequest{Path: path, MaxBytes: maxBytes, MaxFiles: maxFiles}
	if err := st.Send(first); err != nil {
		_, err = st.CloseAndReceive()
		return nil, err
	}
	for off := 0; off < len(archive); off += 1000 {
		if err := st.Send(&agentv1.ExtractPathRequest{Data: archive[off:min(off+1000, len(archive))]}); err != nil {
			break
		}
	}
	res, err := st.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return res.Msg.GetStats(), nil
}

// A tree goes out through ArchivePath and back in through ExtractPath, in standby (a
// restore happens before the main command starts): content, modes and the symlink come
// back as they were, and the symlink pointing out of the tree is archived as a link,
// never followed.
func TestArchiveExtractPath(t *testing.T) {
	h := startAgent(t, &agentconfig.Config{Standby: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	mustWrite(t, filepath.Join(src, "a.txt"), "alpha", 0o644)
	if err := os.MkdirAll(filepath.Join(src, "sub", "deeper"), 0o750); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(src, "sub", "deeper", "run.sh"), "#!/bin/sh\necho hi\n", 0o755)
	if err := os.Symlink(outside, filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}

	archive, stats, err := archivePath(ctx, t, h, src)
	if err != nil {
		t.Fatal(err)
	}
	if stats == nil || stats.Files < 5 || stats.Bytes != int64(len("alpha")+len("#!/bin/sh\necho hi\n")) {
		t.Fatalf("stats %v", stats)
	}
	if bytes.Contains(archive, []byte("host secret")) {
		t.Fatal("the archive holds the symlink target's content")
	}

	dst := t.TempDir()
	xs, err := extractPath(ctx, h, dst, archive, 1<<20, 100)
	if err != nil {
		t.Fatal(err)
	}
	if xs.GetFiles() != stats.Files || xs.GetBytes() != stats.Bytes {
		t.Errorf("extracted %v, archived %v", xs, stats)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "a.txt")); err != nil || string(b) != "alpha" {
		t.Errorf("a.txt: %q %v", b, err)
	}
	fi, err := os.Stat(filepath.Join(dst, "sub", "deeper", "run.sh"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("run.sh: %v %v", fi, err)
	}
	if target, err := os.Readlink(filepath.Join(dst, "link")); err != nil || target != outside {
		t.Errorf("link: %q %v", target, err)
	}

	// A directory that is not empty is refused; so is a relative path and a symlink.
	if _, err := extractPath(ctx, h, dst, archive, 0, 0); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("extract into a non-empty directory: %v", err)
	}
	if _, err := extractPath(ctx, h, "rel/dir", archive, 0, 0); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("extract into a relative path: %v", err)
	}
	if _, _, err := archivePath(ctx, t, h, filepath.Join(src, "link")); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("archive of a symlink: %v", err)
	}

	// Limits: too many bytes or entries are refused, and nothing is left behind.
	for _, lim := range []struct{ bytes, files int64 }{{4, 0}, {0, 2}} {
		dst := t.TempDir()
		if _, err := extractPath(ctx, h, dst, archive, lim.bytes, lim.files); connect.CodeOf(err) != connect.CodeResourceExhausted {
			t.Errorf("limits %+v: %v", lim, err)
		}
		if names, _ := os.ReadDir(dst); len(names) != 0 {
			t.Errorf("limits %+v: left %v", lim, names)
		}
	}
	// A corrupt archive is refused as invalid.
	bad := bytes.Clone(archive)
	bad[len(bad)/2] ^= 0xff
	if _, err := extractPath(ctx, h, t.TempDir(), bad, 0, 0); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("corrupt archive: %v", err)
	}
}

func mustWrite(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// ExtractPath with sub_dirs (a Kubernetes GLOBAL copy whose sub_path directories the
// kubelet made first): they may be there and are filled in place; a symlink of the
// archive on one is FAILED_PRECONDITION, as is a directory holding anything else; bad
// sub_dirs are INVALID_ARGUMENT.
func TestExtractPathSubDirs(t *testing.T) {
	h := startAgent(t, &agentconfig.Config{Standby: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	extract := func(dst string, archive []byte, subDirs ...string) error {
		st := h.client.ExtractPath(ctx)
		if err := st.Send(&agentv1.ExtractPathRequest{Path: dst, SubDirs: subDirs, Data: archive}); err != nil {
			_, err = st.CloseAndReceive()
			return err
		}
		_, err := st.CloseAndReceive()
		return err
	}
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(src, "a", "b", "f.txt"), "in b", 0o644)
	good, _, err := archivePath(ctx, t, h, src)
	if err != nil {
		t.Fatal(err)
	}
	ln := t.TempDir()
	if err := os.Symlink(t.TempDir(), filepath.Join(ln, "a")); err != nil {
		t.Fatal(err)
	}
	hostile, _, err := archivePath(ctx, t, h, ln)
	if err != nil {
		t.Fatal(err)
	}
	made := func() string {
		dst := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dst, "a", "b"), 0o777); err != nil {
			t.Fatal(err)
		}
		return dst
	}

	dst := made()
	if err := extract(dst, good, "a/b"); err != nil {
		t.Fatalf("extract into the made sub_dirs: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "a", "b", "f.txt")); err != nil || string(b) != "in b" {
		t.Errorf("f.txt: %q %v", b, err)
	}
	if err := extract(made(), good); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("made directories without sub_dirs: %v, want FAILED_PRECONDITION (not empty)", err)
	}
	if err := extract(made(), hostile, "a/b"); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "symlink") ||
		apierr.Reason(err) != apierr.VolumeSubPathNotDirectory {
		t.Errorf("a symlink on a sub_dir: %v (reason %q), want FAILED_PRECONDITION %s naming the symlink", err, apierr.Reason(err), apierr.VolumeSubPathNotDirectory)
	}
	other := made()
	mustWrite(t, filepath.Join(other, "planted"), "x", 0o644)
	if err := extract(other, good, "a/b"); connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != "" ||
		!strings.Contains(err.Error(), "planted") {
		t.Errorf("a directory holding more than the sub_dirs: %v, want FAILED_PRECONDITION without a reason, naming what is there", err)
	}
	if _, err := os.Stat(filepath.Join(other, "planted")); err != nil {
		t.Errorf("a refused directory's content was removed: %v", err)
	}
	// Bad sub_dirs are INVALID_ARGUMENT before anything is opened: the kubelet's
	// directories stay (never cleared for it).
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprintf("d%d", i)
	}
	for name, bad := range map[string][]string{
		"../x": {"../x"}, "/abs": {"/abs"}, "a/../b": {"a/../b"}, "empty": {""}, ".": {"."},
		"300-byte component": {"a/b", strings.Repeat("x", 300)},
		"65 sub_dirs":        append([]string{"a/b"}, many...),
	} {
		dst := made()
		if err := extract(dst, good, bad...); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("sub_dirs %s: %v, want INVALID_ARGUMENT", name, err)
		}
		if fi, err := os.Stat(filepath.Join(dst, "a", "b")); err != nil || !fi.IsDir() {
			t.Errorf("sub_dirs %s: the made directory a/b is gone: %v", name, err)
		}
	}
}
