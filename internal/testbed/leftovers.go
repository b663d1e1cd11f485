package testbed

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// leftovers lists what runner i left on the host after it stopped with every sandbox
// deleted: sandbox dirs, mounts under its data dir (but its netns dir's own bind
// mount), loop devices backed by its files, cgroups and OCI runtime state. Each item
// comes with the runner's last log lines about it, to say how it came to be left.
func (b *Bed) leftovers(i int) []string {
	dir := b.RunnerDataDir(i)
	var out []string
	ids := map[string]bool{}
	sbDir := filepath.Join(dir, "sandboxes")
	ents, _ := os.ReadDir(sbDir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			ids[e.Name()] = true
			out = append(out, "sandbox dir "+e.Name())
		}
	}
	netnsDir := filepath.Join(dir, "network", "netns")
	for _, mp := range mountsUnder(dir) {
		if mp == netnsDir {
			continue
		}
		if rel, err := filepath.Rel(sbDir, mp); err == nil && !strings.HasPrefix(rel, "..") {
			ids[strings.SplitN(rel, "/", 2)[0]] = true
		}
		out = append(out, "mount "+mp)
	}
	for _, l := range loopsUnder(dir) {
		out = append(out, "loop device "+l)
	}
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/" + b.cgroupParent(i) + "/*/cgroup.procs")
	v2, _ := filepath.Glob("/sys/fs/cgroup/" + b.cgroupParent(i) + "/*/cgroup.procs")
	for _, c := range append(cgs, v2...) {
		out = append(out, "cgroup "+filepath.Dir(c))
		ids[filepath.Base(filepath.Dir(c))] = true
	}
	roots, _ := filepath.Glob(filepath.Join(sbDir, ".oci", "*", "*"))
	for _, r := range roots {
		out = append(out, "OCI runtime state "+r)
		ids[filepath.Base(r)] = true
	}
	if len(out) == 0 {
		return nil
	}
	log, _ := os.ReadFile(b.Runners[i].Log())
	for id := range ids {
		var lines []string
		for l := range strings.SplitSeq(string(log), "\n") {
			if strings.Contains(l, id) {
				lines = append(lines, l)
			}
		}
		if len(lines) > 6 {
			lines = lines[len(lines)-6:]
		}
		out = append(out, fmt.Sprintf("runner log about %s:\n  %s", id, strings.Join(lines, "\n  ")))
	}
	for k := range out {
		out[k] = "runner " + b.cfg.Runners[i].ID + ": " + out[k]
	}
	return out
}

// forceClean removes what leftovers found, so the test's temporary dir can go: every
// mount under the runner's data dir (deepest first, lazily) and the loop devices backed
// by its files.
func (b *Bed) forceClean(i int) {
	dir := b.RunnerDataDir(i)
	for _, mp := range mountsUnder(dir) {
		_ = unix.Unmount(mp, unix.MNT_DETACH)
	}
	for _, l := range loopsUnder(dir) {
		dev := strings.SplitN(l, " ", 2)[0]
		_ = exec.Command("losetup", "-d", dev).Run()
	}
}

// mountsUnder lists the mount points below dir, deepest first.
func mountsUnder(dir string) []string {
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

// loopsUnder lists attached loop devices whose backing file is below dir, as
// "/dev/loopN (file)".
func loopsUnder(dir string) []string {
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
