package local

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestSealedRunc: the backend runs runc (or crun, SANDBOXD_TEST_OCI_RUNTIME=crun) from
// one sealed copy (the runtime's own seals, so neither clones itself again), which
// cannot be written to, through a symlink named as the binary in the state dir;
// sandboxes start and run from it.
func TestSealedRunc(t *testing.T) {
	e := newEnv(t)
	rt := e.b.runtimes["runc"]
	if rt == nil {
		t.Fatal("no runc class")
	}
	bin := "/usr/sbin/runc"
	if testOCIRuntime == OCICrun {
		bin = FindCrun()
	}
	want := filepath.Join(e.state, ociRootDir, ".exe-runc", filepath.Base(bin))
	if rt.exe != want || rt.binary != bin {
		t.Fatalf("runc runs from %q (binary %q), want %q", rt.exe, rt.binary, want)
	}
	again, err := sealedExe(rt.binary)
	if err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(rt.exe); err != nil || target != again {
		t.Errorf("%s -> %q (%v), want the one sealed copy %q", rt.exe, target, err, again)
	}
	fd, err := unix.Open(rt.exe, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals != runcSeals {
		t.Errorf("seals %#x (%v), want runc's %#x", seals, err, runcSeals)
	}
	if wfd, err := unix.Open(rt.exe, unix.O_WRONLY|unix.O_CLOEXEC, 0); err == nil {
		_, werr := unix.Write(wfd, []byte("#!"))
		unix.Close(wfd)
		if werr == nil {
			t.Error("wrote to the sealed copy of runc")
		}
	}
	if cmd := rt.command(t.Context(), "--version"); cmd.Args[0] != rt.binary {
		t.Errorf("argv[0] %q, want %q", cmd.Args[0], rt.binary)
	}
	e.create(runtime.Spec{ID: "sealed-1", Container: runtime.Container{Command: "sleep", Args: []string{"3600"}}})
	out, errOut, code := execIn(t, agentClient(e.b, "sealed-1"), "id", "-u")
	if code != 0 || strings.TrimSpace(out) != "0" {
		t.Errorf("exec in a sandbox runc started from the copy: %q %q %d", out, errOut, code)
	}
}

// TestSealedRuncNotForOthers: only a binary named runc or crun is run from a sealed copy.
func TestSealedRuncNotForOthers(t *testing.T) {
	for bin, want := range map[string]bool{"/usr/sbin/runc": true, "/usr/local/bin/runsc": false, "/usr/bin/crun": true, "/usr/bin/youki": false} {
		if got := usesSealedCopy(bin); got != want {
			t.Errorf("usesSealedCopy(%q) = %v, want %v", bin, got, want)
		}
	}
}
