package local

import (
	"debug/elf"
	"fmt"
	goruntime "runtime"
)

// elfMachine is the ELF machine of each architecture the agent may be built for.
var elfMachine = map[string]elf.Machine{
	"386": elf.EM_386, "amd64": elf.EM_X86_64, "arm": elf.EM_ARM, "arm64": elf.EM_AARCH64,
	"loong64": elf.EM_LOONGARCH, "ppc64le": elf.EM_PPC64, "riscv64": elf.EM_RISCV, "s390x": elf.EM_S390,
}

// checkStaticExecutable checks that path is an ELF executable for this machine with no
// program interpreter: the agent runs as every sandbox's first process, inside images
// that need not have a dynamic loader or a libc, so a dynamically linked agent (or a
// file that is not an executable at all) would break every sandbox while the runner
// looked healthy. Refusing it at start-up makes such a runner fail to come up — which
// an update's trial sees and rolls back.
func checkStaticExecutable(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	defer func() { _ = f.Close() }()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("not an executable (ELF type %v)", f.Type)
	}
	if want, ok := elfMachine[goruntime.GOARCH]; ok && f.Machine != want {
		return fmt.Errorf("built for %v, not this machine's %v (%s)", f.Machine, want, goruntime.GOARCH)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("dynamically linked (it names a program interpreter); build it with CGO_ENABLED=0 as `make agent` does")
		}
	}
	return nil
}
