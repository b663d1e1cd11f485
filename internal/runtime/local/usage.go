package local

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

var _ runtime.UsageReader = (*Backend)(nil)

// maxCgroupFile bounds what is read of one cgroup file (cpu.stat is a few lines).
const maxCgroupFile = 4096

// Usage reads a tracked sandbox's CPU time and memory from its cgroup (a group's every
// container's, summed): cgroup v2 cpu.stat usage_usec, memory.current and memory.peak;
// cgroup v1 cpuacct.usage, memory.usage_in_bytes and memory.max_usage_in_bytes. The
// files are opened beneath the cgroup mount's directory without following any symlink
// (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV): the cgroup path is
// the runner's own (CgroupParent and the container ID), never the sandbox's word, and a
// container with a delegated cgroup can create directories but not redirect these
// reads. ErrNotFound for a sandbox this backend does not run now.
func (b *Backend) Usage(id string) (runtime.Usage, error) {
	if !validID(id) {
		return runtime.Usage{}, fmt.Errorf("%w: %q", runtime.ErrNotFound, id)
	}
	b.mu.Lock()
	s := b.sandboxes[id]
	b.mu.Unlock()
	if s == nil {
		return runtime.Usage{}, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	rels := []string{b.oomCgroupOf(s)}
	for _, m := range s.members { // a group: every container's
		rels = append(rels, m.cgroupRel())
	}
	var total runtime.Usage
	for i, rel := range rels {
		u, err := cgroupUsage(filepath.Join(b.cfg.CgroupParent, rel))
		if err != nil {
			if i == 0 {
				return runtime.Usage{}, err
			}
			continue
		}
		total.CPUUsec += u.CPUUsec
		total.MemoryBytes += u.MemoryBytes
		total.MemoryPeakBytes += u.MemoryPeakBytes
	}
	return total, nil
}

// cgroupUsage reads the usage of cgroup rel (relative to a hierarchy's root): cgroup v2
// when /sys/fs/cgroup/rel has cpu.stat with usage_usec, else cgroup v1's cpuacct and
// memory hierarchies.
func cgroupUsage(rel string) (runtime.Usage, error) {
	if !filepath.IsLocal(rel) {
		return runtime.Usage{}, fmt.Errorf("%w: cgroup %q", runtime.ErrNotFound, rel)
	}
	var u runtime.Usage
	if data, err := readCgroupFile(cgroupRoot, rel, "cpu.stat"); err == nil {
		if n, ok := counter(data, "usage_usec"); ok {
			u.CPUUsec = n
			u.MemoryBytes, _ = readCgroupInt(cgroupRoot, rel, "memory.current")
			u.MemoryPeakBytes, _ = readCgroupInt(cgroupRoot, rel, "memory.peak") // kernels ≥ 5.19
			return u, nil
		}
	}
	ns, err := readCgroupInt(filepath.Join(cgroupRoot, "cpuacct"), rel, "cpuacct.usage")
	if err != nil {
		ns, err = readCgroupInt(filepath.Join(cgroupRoot, "cpu,cpuacct"), rel, "cpuacct.usage")
	}
	if err != nil {
		return runtime.Usage{}, fmt.Errorf("%w: no CPU accounting for cgroup %s: %w", runtime.ErrNotFound, rel, err)
	}
	u.CPUUsec = ns / 1000
	mem := filepath.Join(cgroupRoot, "memory")
	u.MemoryBytes, _ = readCgroupInt(mem, rel, "memory.usage_in_bytes")
	u.MemoryPeakBytes, _ = readCgroupInt(mem, rel, "memory.max_usage_in_bytes")
	return u, nil
}

// readCgroupFile reads at most maxCgroupFile bytes of root/rel/name, resolving rel/name
// beneath root without symlinks or mount crossings.
func readCgroupFile(root, rel, name string) ([]byte, error) {
	d, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(d)
	fd, err := unix.Openat2(d, filepath.Join(rel, name), &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(root, rel, name), Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(root, rel, name))
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxCgroupFile))
	if err != nil {
		return nil, err
	}
	return data, nil
}

func readCgroupInt(root, rel, name string) (int64, error) {
	data, err := readCgroupFile(root, rel, name)
	if err != nil {
		return 0, err
	}
	data = bytes.TrimSpace(data)
	if string(data) == "max" {
		return 0, errors.New("no value")
	}
	return strconv.ParseInt(string(data), 10, 64)
}

// counter is the value of key in a flat-keyed cgroup file ("key value" lines).
func counter(data []byte, key string) (int64, bool) {
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		f := bytes.Fields(line)
		if len(f) == 2 && string(f[0]) == key {
			n, err := strconv.ParseInt(string(f[1]), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
