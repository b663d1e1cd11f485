package stacktest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/mountinfo"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/local"
	"github.com/sandboxd/sandboxd/internal/runtime/local/network"
)

// Leftovers lists what sandboxes left on the host under a runner's data dir once every
// one of them was deleted: sandbox dirs (<dataDir>/sandboxes/<id>), mounts below dataDir
// (but the network's holder of network namespaces, which stays mounted for the next
// start), and loop
// devices backed by files below it. Tests call it before their temporary dir is removed,
// so a leak is reported as what leaked, not as an unlinkat error.
func Leftovers(dataDir string) []string {
	var out []string
	ents, _ := os.ReadDir(filepath.Join(dataDir, "sandboxes"))
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, "sandbox dir "+e.Name())
		}
	}
	holder := filepath.Join(dataDir, "network", "mntns")
	for _, mp := range MountsUnder(dataDir) {
		if mp != holder {
			out = append(out, "mount "+mp)
		}
	}
	for _, l := range LingeringLoops(dataDir) {
		out = append(out, "loop device "+l)
	}
	held, err := network.HeldNetNS(filepath.Join(dataDir, "network"))
	if err != nil {
		out = append(out, "network namespaces: "+err.Error())
	}
	for _, id := range held {
		out = append(out, "network namespace "+id)
	}
	return out
}

// LingeringLoops is LoopsUnder(dir) once the devices have had time to detach: an
// unmount or LOOP_CLR_FD of a loop device another process has open at that moment
// (anything on the host that scans block devices) only sets autoclear, and the kernel
// detaches it at that process's close. A device still attached after a few seconds is
// a leak.
func LingeringLoops(dir string) []string {
	deadline := time.Now().Add(5 * time.Second)
	for {
		l := LoopsUnder(dir)
		if len(l) == 0 || time.Now().After(deadline) {
			return l
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ForceClean unmounts (lazily, deepest first) everything below dataDir and detaches the
// loop devices backed by its files, so that the dir can be removed after a leak.
func ForceClean(dataDir string) {
	for _, mp := range MountsUnder(dataDir) {
		_ = unix.Unmount(mp, unix.MNT_DETACH)
	}
	for _, l := range LoopsUnder(dataDir) {
		dev, _, _ := strings.Cut(l, " ")
		if f, err := os.OpenFile(dev, os.O_RDWR, 0); err == nil {
			_ = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
			f.Close()
		}
	}
}

// MountsUnder lists the mount points below dir, deepest first.
func MountsUnder(dir string) []string {
	mps, _ := mountinfo.Under(dir)
	return slices.DeleteFunc(mps, func(mp string) bool { return mp == filepath.Clean(dir) })
}

// LoopsUnder lists attached loop devices whose backing file is below dir, as
// "/dev/loopN (file)".
func LoopsUnder(dir string) []string {
	var out []string
	for _, l := range local.LoopDevicesUnder(dir) {
		out = append(out, l.Dev+" ("+l.File+")")
	}
	return out
}

// RemoveKept removes every kept volume of kept (the organizations' build layer caches
// outlive their builders by design): register it with Cleanup so that it runs before the
// stack's own cleanup and its leftover checks.
func RemoveKept(tb testing.TB, kept runtime.KeptVolumes) {
	tb.Helper()
	list, err := kept.ListKept()
	if err != nil {
		tb.Errorf("list the kept volumes: %v", err)
	}
	for _, v := range list {
		if err := kept.RemoveKept(v.Name); err != nil {
			tb.Errorf("remove the kept volume %s: %v", v.Name, err)
		}
	}
}
