package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/mountinfo"
)

// The sweep is teardown's last line: whatever step of Create or Destroy a crash cut
// short, what it left is found from the host itself, not from a record that the crash
// may have kept from being written. Mounts at or below a sandbox's dir (or its root
// filesystem mount point) are unmounted deepest first, and loop devices whose backing
// file lies in its dir are detached. Only then may the dir be removed: RemoveAll through a
// mount left behind would delete what it mounts (a shared image layer, say).

// unmountUnder unmounts every mount at or below any of dirs. The mount table is read
// once when nothing is left there (the usual case: teardown has unmounted what it knows
// of), else once more to check.
func unmountUnder(dirs ...string) error {
	mps, err := mountinfo.Under(dirs...)
	if err != nil {
		return fmt.Errorf("list mounts under %s: %w", strings.Join(dirs, ", "), err)
	}
	if len(mps) == 0 {
		return nil
	}
	var errs []error
	for _, mp := range mps {
		if err := unmountAll(mp); err != nil {
			errs = append(errs, err)
		}
	}
	if errs != nil {
		return errors.Join(errs...)
	}
	if left, err := mountinfo.Under(dirs...); err == nil && len(left) > 0 {
		return fmt.Errorf("still mounted under %s: %s", strings.Join(dirs, ", "), strings.Join(left, ", "))
	}
	return nil
}

// LoopDevice is an attached loop device (/dev/loopN) and its backing file.
type LoopDevice struct{ Dev, File string }

// LoopDevicesUnder returns the attached loop devices whose backing file lies at or below
// dir (a deleted file still counts): for Destroy's sweep, and for leak checks in tests.
func LoopDevicesUnder(dir string) []LoopDevice {
	dir = filepath.Clean(dir)
	ents, _ := os.ReadDir("/sys/block")
	var out []LoopDevice
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		bf, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err != nil {
			continue // not attached
		}
		// A deleted backing file reads as "<path> (deleted)".
		p := strings.TrimSuffix(strings.TrimSpace(string(bf)), " (deleted)")
		if p == dir || strings.HasPrefix(p, dir+"/") {
			out = append(out, LoopDevice{Dev: "/dev/" + e.Name(), File: p})
		}
	}
	return out
}

// loopsBackedUnder is LoopDevicesUnder's devices.
func loopsBackedUnder(dir string) []string {
	var out []string
	for _, l := range LoopDevicesUnder(dir) {
		out = append(out, l.Dev)
	}
	return out
}

// detachLoopsUnder detaches the loop devices backed by files in dir that no mount holds
// any more, and returns those still attached after that. A mounted image's device
// detaches itself when its filesystem is last unmounted (autoclear); another mount
// namespace can hold a copy of the mount for a moment (a neighbour's runc clones the
// host's mounts before it pivots into its root), so the devices get a little time first.
// One left attached holds the image's inode, not its path: the dir can still go.
func detachLoopsUnder(dir string) []string {
	devs := loopsBackedUnder(dir)
	for deadline := time.Now().Add(200 * time.Millisecond); len(devs) > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		devs = loopsBackedUnder(dir)
	}
	if len(devs) == 0 {
		return nil
	}
	for _, dev := range devs {
		// On a device that is still open elsewhere LOOP_CLR_FD only sets autoclear.
		if f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0); err == nil {
			_ = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
			f.Close()
		}
	}
	return loopsBackedUnder(dir)
}
