package local

import (
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestKernelConfigHasX32(t *testing.T) {
	for _, c := range []struct {
		name, config string
		has, ok      bool
	}{
		{"x32 ABI", "CONFIG_X86_64=y\nCONFIG_IA32_EMULATION=y\nCONFIG_X86_X32_ABI=y\n", true, true},
		{"x32 before 5.18", "CONFIG_X86_64=y\nCONFIG_X86_X32=y\n", true, true},
		{"not set", "CONFIG_X86_64=y\nCONFIG_IA32_EMULATION=y\n# CONFIG_X86_X32_ABI is not set\n", false, true},
		{"absent", "CONFIG_X86_64=y\n", false, true},
		{"not an x86_64 config", "CONFIG_ARM64=y\n", true, false},
		{"empty", "", true, false},
	} {
		has, ok := kernelConfigHasX32(strings.NewReader(c.config))
		if has != c.has || ok != c.ok {
			t.Errorf("%s: has %v ok %v, want %v %v", c.name, has, ok, c.has, c.ok)
		}
	}
}

// TestSeccompWithoutX32: x32 leaves the profile only on a kernel without it; i386 and
// x86_64 stay, and so does every rule.
func TestSeccompWithoutX32(t *testing.T) {
	full, err := defaultSeccomp()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(full.Architectures, specs.ArchX86_64) {
		t.Skipf("not an amd64 profile: %v", full.Architectures)
	}
	if hostHasX32() != slices.Contains(full.Architectures, specs.ArchX32) {
		t.Errorf("host has x32: %v; the default profile's architectures: %v", hostHasX32(), full.Architectures)
	}
	p := *full
	p.Architectures = []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32}
	if got := withoutX32(&p, true).Architectures; len(got) != 3 {
		t.Errorf("kernel with x32: %v, want all three", got)
	}
	got := withoutX32(&p, false)
	if !slices.Equal(got.Architectures, []specs.Arch{specs.ArchX86_64, specs.ArchX86}) {
		t.Errorf("kernel without x32: %v, want x86_64 and i386", got.Architectures)
	}
	if len(got.Syscalls) != len(full.Syscalls) || got.DefaultAction != full.DefaultAction {
		t.Errorf("rules changed: %d syscalls (want %d), default %s", len(got.Syscalls), len(full.Syscalls), got.DefaultAction)
	}
}
