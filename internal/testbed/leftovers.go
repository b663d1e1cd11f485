package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/sandboxd/sandboxd/internal/stack/stacktest"
)

// leftovers lists what runner i left on the host after it stopped with every sandbox
// deleted: sandbox dirs, mounts under its data dir (but its netns dir's own bind
// mount), loop devices backed by its files, cgroups and OCI runtime state. Each item
// comes with the runner's last log lines about it, to say how it came to be left.
func (b *Bed) leftovers(i int) []string {
	dir := b.RunnerDataDir(i)
	sbDir := filepath.Join(dir, "sandboxes")
	out := stacktest.Leftovers(dir)
	ids := map[string]bool{}
	for _, l := range out {
		// "sandbox dir ID", "mount …/sandboxes/ID/…", "loop device /dev/loopN (…/sandboxes/ID/…)"
		if id, ok := strings.CutPrefix(l, "sandbox dir "); ok {
			ids[id] = true
		} else if _, rest, ok := strings.Cut(l, sbDir+"/"); ok {
			ids[strings.SplitN(rest, "/", 2)[0]] = true
		}
	}
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/" + b.cgroupParent(i) + "/*/cgroup.procs")
	v2, _ := filepath.Glob("/sys/fs/cgroup/" + b.cgroupParent(i) + "/*/cgroup.procs")
	for _, c := range append(cgs, v2...) {
		out = append(out, "cgroup "+filepath.Dir(c))
		ids[filepath.Base(filepath.Dir(c))] = true
	}
	roots, _ := filepath.Glob(filepath.Join(sbDir, ".oci", "*", "*"))
	for _, r := range roots {
		if strings.HasPrefix(filepath.Base(filepath.Dir(r)), ".exe-") {
			continue // the link to the runner's sealed runc (runtime/local/runcsealed.go): no sandbox's
		}
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

// forceClean removes what leftovers found, so the test's temporary dir can go.
func (b *Bed) forceClean(i int) { stacktest.ForceClean(b.RunnerDataDir(i)) }
