package local

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

// loopBackings lists the loop devices whose backing file is under dir.
// lingeringLoops is loopBackings(dir) once the devices have had time to detach: Destroy
// detaches a loop device with LOOP_CLR_FD, which on a device another process has open
// at that moment (anything on the host that scans block devices) only sets autoclear,
// so the kernel detaches it at that process's close. A device still attached after a
// few seconds is a leak.
func lingeringLoops(dir string) []string {
	deadline := time.Now().Add(5 * time.Second)
	for {
		l := loopBackings(dir)
		if len(l) == 0 || time.Now().After(deadline) {
			return l
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func loopBackings(dir string) []string {
	var out []string
	for _, f := range mustGlob("/sys/block/loop*/loop/backing_file") {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
			out = append(out, f)
		}
	}
	return out
}

// TestDiskLimit fills a sandbox's disk: the writer gets ENOSPC at the limit, the host
// holds no more than the limit, and Destroy leaves no mount, loop device or file.
func TestDiskLimit(t *testing.T) {
	const limit = 64 << 20
	for _, tc := range []struct {
		name     string
		noUserNS bool
		spec     runtime.Resources // DiskBytes 0: the backend's default
		backend  int64
	}{
		{"spec limit, user namespace", false, runtime.Resources{DiskBytes: limit}, 0},
		{"backend default, no user namespace", true, runtime.Resources{}, limit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.b.cfg.DiskBytes = tc.backend
			if tc.noUserNS {
				e.b.cfg.NoUserNS, e.b.ids = true, nil
			}
			const id = "disk-1"
			e.create(runtime.Spec{ID: id, Container: runtime.Container{Command: "sleep", Args: []string{"3600"}, Resources: tc.spec}})
			c := agentClient(e.b, id)
			var st syscall.Stat_t
			img := filepath.Join(e.state, id, fileDiskImage)
			if err := syscall.Stat(img, &st); err != nil || st.Size != limit || st.Blocks*512 > 8<<20 {
				t.Errorf("a new disk image: %d bytes, %d allocated (%v); want %d, sparse", st.Size, st.Blocks*512, err, limit)
			}
			out, _, _ := execIn(t, c, "sh", "-c", "dd if=/dev/zero of=/fill bs=1M count=256 2>&1; echo rc=$?; sync")
			if !strings.Contains(out, "No space left on device") || strings.Contains(out, "rc=0") {
				t.Fatalf("filling the disk: %q, want ENOSPC", out)
			}
			size, _, _ := execIn(t, c, "sh", "-c", "ls -l /fill | awk '{print $5}'")
			if n := strings.TrimSpace(size); len(n) < 7 || len(n) > 8 { // tens of MiB
				t.Errorf("the filler wrote %s bytes, want close to %d", n, limit)
			}
			if out, _, _ := execIn(t, c, "sh", "-c", "rm /fill && echo again > /tmp/x && cat /tmp/x"); out != "again\n" {
				t.Errorf("after freeing space: %q", out)
			}
			if err := syscall.Stat(img, &st); err != nil {
				t.Fatal(err)
			}
			if used := st.Blocks * 512; used > limit+(8<<20) {
				t.Errorf("the disk image holds %d bytes of host disk, above the %d limit", used, limit)
			}
			if len(loopBackings(e.state)) != 1 {
				t.Errorf("loop devices on the state dir: %v, want 1", loopBackings(e.state))
			}
			// A restarted runner finds the sandbox with its disk still mounted, and its
			// Destroy removes it all.
			b := e.backend()
			b.cfg.DiskBytes = tc.backend
			if rec, err := b.Recover(context.Background()); err != nil || len(rec) != 1 || !rec[0].Alive {
				t.Fatalf("recover: %+v %v", rec, err)
			}
			if out, _, _ := execIn(t, agentClient(b, id), "cat", "/tmp/x"); out != "again\n" {
				t.Errorf("after a restart: %q", out)
			}
			if err := b.Destroy(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			checkNoLeaks(t, e.state, id)
			if l := lingeringLoops(e.state); len(l) > 0 {
				t.Errorf("loop devices left attached: %v", l)
			}
		})
	}
}

func TestDiskLimitTooSmall(t *testing.T) {
	e := newEnv(t)
	_, err := e.b.Create(context.Background(), &runtime.Spec{ID: "tiny", Container: runtime.Container{Image: "busybox", Command: "true", Resources: runtime.Resources{DiskBytes: 1 << 20}}})
	if !isErr(err, runtime.ErrInvalidSpec) || !strings.Contains(err.Error(), "below the minimum") {
		t.Fatalf("Create = %v", err)
	}
	checkNoLeaks(t, e.state, "tiny")
}

// TestMountLoopConcurrent: many file systems attached at once (a burst of creates, each
// with a disk limit) all get a loop device. Every caller asks the kernel for the same
// lowest free device, so all but one lose each round; 20 rounds of retry were once all
// the attach allowed, and the 21st of a burst of 50 failed with EBUSY.
func TestMountLoopConcurrent(t *testing.T) {
	testenv.RequireRoot(t, "loop devices, mounts")
	dir := t.TempDir()
	const n = 48
	img := filepath.Join(dir, "template.img")
	if err := mkfs(img, 8<<20); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, n)
	mnts := make([]string, n)
	for i := range n {
		mnts[i] = filepath.Join(dir, "m"+strconv.Itoa(i))
		if err := os.Mkdir(mnts[i], 0o700); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(img)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(i)+".img"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	start := make(chan struct{})
	for i := range n {
		go func() {
			<-start
			errs <- mountLoop(filepath.Join(dir, strconv.Itoa(i)+".img"), mnts[i])
		}()
	}
	close(start)
	var failed []error
	for range n {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		}
	}
	for _, m := range mnts {
		_ = syscall.Unmount(m, 0)
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d attaches failed; first: %v", len(failed), n, failed[0])
	}
	if l := lingeringLoops(dir); len(l) > 0 {
		t.Errorf("loop devices left attached: %v", l)
	}
}
