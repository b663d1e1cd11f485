package local

import (
	"bufio"
	"compress/gzip"
	"io"
	"os"
	"slices"
	"strings"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// The default seccomp profile lists, on amd64, the x86_64 architecture with the i386
// and x32 ABIs. Every architecture is a filter of its own that runc compiles with
// libseccomp at each container's start; x32's costs about 13 ms of CPU per container
// here (a quarter of runc's). A kernel built without the x32 ABI (CONFIG_X86_X32_ABI,
// CONFIG_X86_X32 before 5.18; most distributions' kernels now) runs no x32 system call
// whatever a filter says, so on such a kernel the profile leaves x32 out: an x32 call
// is then refused by the filter (the thread is killed, SIGSYS) instead of failing with
// ENOSYS in the kernel; no x32 call reaches the kernel either way. The i386 ABI stays:
// leaving it out would stop 32-bit programs. When the kernel's config cannot be read,
// x32 stays too.

// hostHasX32 reports whether the running kernel may have the x32 ABI.
var hostHasX32 = sync.OnceValue(func() bool {
	var uts unix.Utsname
	release := ""
	if unix.Uname(&uts) == nil {
		release = unix.ByteSliceToString(uts.Release[:])
	}
	if f, err := os.Open("/proc/config.gz"); err == nil {
		defer f.Close()
		if zr, err := gzip.NewReader(f); err == nil {
			if has, ok := kernelConfigHasX32(zr); ok {
				return has
			}
		}
	}
	if release != "" {
		if f, err := os.Open("/boot/config-" + release); err == nil {
			defer f.Close()
			if has, ok := kernelConfigHasX32(f); ok {
				return has
			}
		}
	}
	return true
})

// kernelConfigHasX32 reads a kernel config: whether it enables the x32 ABI, and
// whether it was a whole config (an x86 one that read to its end) to judge by.
func kernelConfigHasX32(r io.Reader) (has, ok bool) {
	sc := bufio.NewScanner(io.LimitReader(r, 16<<20))
	x86 := false
	for sc.Scan() {
		switch l := strings.TrimSpace(sc.Text()); l {
		case "CONFIG_X86_X32_ABI=y", "CONFIG_X86_X32=y":
			has = true
		case "CONFIG_X86_64=y":
			x86 = true
		}
	}
	if sc.Err() != nil || !x86 {
		return true, false
	}
	return has, true
}

// withoutX32 drops the x32 architecture from p when the kernel has no x32 ABI.
func withoutX32(p *specs.LinuxSeccomp, hasX32 bool) *specs.LinuxSeccomp {
	if p == nil || hasX32 || !slices.Contains(p.Architectures, specs.ArchX32) {
		return p
	}
	p.Architectures = slices.DeleteFunc(slices.Clone(p.Architectures), func(a specs.Arch) bool { return a == specs.ArchX32 })
	return p
}
