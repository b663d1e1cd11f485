package local

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The sweep is teardown's last line: whatever step of Create or Destroy a crash cut
// short, what it left is found from the host itself, not from a record that the crash
// may have kept from being written. Mounts at or below a sandbox's dir (or its root
// filesystem mount point) are unmounted deepest first, and loop devices whose backing
// file lies in its dir are detached. Only then may the dir be removed: RemoveAll through a
// mount left behind would delete what it mounts (a shared image layer, say).

// mountsUnder returns the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	dir = filepath.Clean(dir)
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountinfo(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	// Deepest first; a path mounted more than once appears once (unmountAll peels it).
	slices.SortFunc(out, func(a, b string) int {
		if d := strings.Count(b, "/") - strings.Count(a, "/"); d != 0 {
			return d
		}
		return strings.Compare(b, a)
	})
	return slices.Compact(out), nil
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space, and so on).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder unmounts every mount at or below dir.
func unmountUnder(dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil {
		return fmt.Errorf("list mounts under %s: %w", dir, err)
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
	if left, err := mountsUnder(dir); err == nil && len(left) > 0 {
		return fmt.Errorf("still mounted under %s: %s", dir, strings.Join(left, ", "))
	}
	return nil
}

// loopsBackedUnder returns the loop devices (/dev/loopN) whose backing file lies at or
// below dir.
func loopsBackedUnder(dir string) []string {
	dir = filepath.Clean(dir)
	ents, _ := os.ReadDir("/sys/block")
	var out []string
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
			out = append(out, "/dev/"+e.Name())
		}
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
