package local

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestKeptVolume: a kept volume outlives the sandbox that claimed it and the next
// claimant finds its content; one claimant at a time; a claimed volume is not removed;
// ListKept orders by last use; RemoveKept deletes it.
func TestKeptVolume(t *testing.T) {
	e := volPoolEnv(t)
	p := e.b.vols
	release, err := p.acquire()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	t.Cleanup(func() {
		for _, n := range []string{"bc-a", "bc-b"} {
			if err := e.b.RemoveKept(n); err != nil {
				t.Errorf("remove %s: %v", n, err)
			}
		}
	})
	a, err := p.keptVolume("sbx1", "bc-a", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a, "layer"), []byte("cached"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := p.keptVolume("sbx2", "bc-a", 64<<20); !errors.Is(err, runtime.ErrKeptInUse) {
		t.Errorf("second claimant: %v, want ErrKeptInUse", err)
	}
	if err := e.b.RemoveKept("bc-a"); !errors.Is(err, runtime.ErrKeptInUse) {
		t.Errorf("remove while claimed: %v, want ErrKeptInUse", err)
	}
	time.Sleep(10 * time.Millisecond)
	if _, err := p.keptVolume("sbx3", "bc-b", 64<<20); err != nil {
		t.Fatal(err)
	}
	// The quota holds: 64 MiB do not fit.
	if err := os.WriteFile(filepath.Join(a, "big"), make([]byte, 80<<20), 0o600); err == nil {
		t.Error("wrote 80 MiB into a kept volume of 64 MiB")
	}
	_ = os.Remove(filepath.Join(a, "big"))
	if err := p.removeSandbox("sbx1", true); err != nil { // sbx1's teardown
		t.Fatal(err)
	}
	ks, err := e.b.ListKept()
	if err != nil || len(ks) != 2 || ks[0].Name != "bc-a" || ks[0].InUse || ks[1].Name != "bc-b" || !ks[1].InUse {
		t.Fatalf("kept: %+v %v, want bc-a (free) then bc-b (in use)", ks, err)
	}
	a2, err := p.keptVolume("sbx2", "bc-a", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(a2, "layer")); err != nil || string(b) != "cached" {
		t.Errorf("the next claimant reads %q %v, want what the first wrote", b, err)
	}
	p.unclaimKept("sbx2")
	p.unclaimKept("sbx3")
	// Sandbox-written content: a symlink to a host dir is removed, never followed.
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "host-file"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(a2, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := e.b.RemoveKept("bc-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(outside, "host-file")); err != nil {
		t.Errorf("removing a kept volume touched what a symlink in it points to: %v", err)
	}
	if _, err := os.Stat(a2); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removed kept volume still there: %v", err)
	}
	if ks, _ := e.b.ListKept(); len(ks) != 1 || ks[0].Name != "bc-b" {
		t.Errorf("kept after removal: %+v", ks)
	}
	if err := e.b.RemoveKept("../x"); err == nil {
		t.Error("RemoveKept accepted a path")
	}
}
