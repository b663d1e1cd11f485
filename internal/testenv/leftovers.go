package testenv

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Leftovers lists what sandboxes left on the host under a runner's data dir once every
// one of them was deleted: sandbox dirs (<dataDir>/sandboxes/<id>), mounts below dataDir
// (but the network's netns dir itself, which stays mounted for the next start), and loop
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
	netns := filepath.Join(dataDir, "network", "netns")
	for _, mp := range MountsUnder(dataDir) {
		if mp != netns {
			out = append(out, "mount "+mp)
		}
	}
	for _, l := range LoopsUnder(dataDir) {
		out = append(out, "loop device "+l)
	}
	return out
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
	data, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return slices.Compact(out)
}

// LoopsUnder lists attached loop devices whose backing file is below dir, as
// "/dev/loopN (file)".
func LoopsUnder(dir string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if p := strings.TrimSpace(string(data)); err == nil && strings.HasPrefix(p, dir+"/") {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(f)))+" ("+p+")")
		}
	}
	return out
}
