package main

import (
	"flag"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/stack"
)

// TestEgressAllowReservedFlag: --egress-allow-reserved is repeatable, reaches the
// stack's configuration, and refuses what is not a canonical prefix of a reserved range.
func TestEgressAllowReservedFlag(t *testing.T) {
	var h hardeningFlags
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	h.register(fs)
	if err := fs.Parse([]string{"--egress-allow-reserved", "10.20.0.0/16", "--egress-allow-reserved", "192.168.5.0/24"}); err != nil {
		t.Fatal(err)
	}
	var cfg stack.Config
	if err := h.apply(&cfg); err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("192.168.5.0/24")}
	if !slices.Equal(cfg.OpenReserved, want) {
		t.Errorf("OpenReserved = %v, want %v", cfg.OpenReserved, want)
	}
	for _, bad := range []string{"10.20.0.1/16", "nope", "203.0.113.0/24"} {
		h := hardeningFlags{disk: "0", openReserved: listFlag{bad}}
		if err := h.apply(&stack.Config{}); err == nil || !strings.Contains(err.Error(), "--egress-allow-reserved") {
			t.Errorf("%s: %v, want a refusal naming the flag", bad, err)
		}
	}
}

// TestForkSentriesFlag: --fork-sentries reaches the stack's configuration (0: the
// backend's default) and refuses what the backend would not take.
func TestForkSentriesFlag(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want int
		ok   bool
	}{{"", 0, true}, {"8", 8, true}, {"-1", -1, true}, {"4096", 4096, true}, {"4097", 0, false}, {"-2", 0, false}} {
		cfg, err, verr := applyHardeningFlag(t, "--fork-sentries", tc.arg)
		if (verr == nil) != tc.ok {
			t.Errorf("%q: validate %v", tc.arg, verr)
		}
		switch {
		case tc.ok && (err != nil || cfg.ForkSentries != tc.want):
			t.Errorf("%q: ForkSentries %d, %v, want %d", tc.arg, cfg.ForkSentries, err, tc.want)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "--fork-sentries")):
			t.Errorf("%q: %v, want a refusal naming the flag", tc.arg, err)
		}
	}
}

// applyHardeningFlag parses flag=arg (nothing when arg is "") into hardeningFlags and
// returns what apply makes of it and what validate says.
func applyHardeningFlag(t *testing.T, flagName, arg string) (cfg stack.Config, applyErr, validateErr error) {
	t.Helper()
	var h hardeningFlags
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	h.register(fs)
	args := []string{}
	if arg != "" {
		args = []string{flagName + "=" + arg}
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	applyErr = h.apply(&cfg)
	return cfg, applyErr, h.validate()
}

// TestOCIRuntimeFlag: --oci-runtime reaches the stack's configuration and refuses any
// runtime but runc and crun.
func TestOCIRuntimeFlag(t *testing.T) {
	for _, tc := range []struct {
		arg, want string
		ok        bool
	}{{"", "runc", true}, {"runc", "runc", true}, {"crun", "crun", true}, {"runsc", "", false}, {"/usr/bin/crun", "", false}, {"CRUN", "", false}} {
		cfg, err, verr := applyHardeningFlag(t, "--oci-runtime", tc.arg)
		if (verr == nil) != tc.ok {
			t.Errorf("%q: validate %v", tc.arg, verr)
		}
		switch {
		case tc.ok && (err != nil || cfg.OCIRuntime != tc.want):
			t.Errorf("%q: OCIRuntime %q, %v, want %q", tc.arg, cfg.OCIRuntime, err, tc.want)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "--oci-runtime")):
			t.Errorf("%q: %v, want a refusal naming the flag", tc.arg, err)
		}
	}
}

// TestCheckpointSpaceFlags: --checkpoint-quota-bytes and --checkpoint-min-free-bytes
// reach the stack's configuration (defaults 20 GiB and 2 GiB: a runner bounds its
// checkpoints unless told not to) and refuse negative sizes naming the flag.
func TestCheckpointSpaceFlags(t *testing.T) {
	for _, tc := range []struct {
		flag, arg      string
		quota, minFree int64
		ok             bool
	}{
		{"--checkpoint-quota-bytes", "", 20 << 30, 2 << 30, true},
		{"--checkpoint-quota-bytes", "1048576", 1 << 20, 2 << 30, true},
		{"--checkpoint-quota-bytes", "0", 0, 2 << 30, true},
		{"--checkpoint-min-free-bytes", "0", 20 << 30, 0, true},
		{"--checkpoint-quota-bytes", "-1", 0, 0, false},
		{"--checkpoint-min-free-bytes", "-5", 0, 0, false},
	} {
		cfg, err, verr := applyHardeningFlag(t, tc.flag, tc.arg)
		if (verr == nil) != tc.ok {
			t.Errorf("%s=%q: validate %v", tc.flag, tc.arg, verr)
		}
		switch {
		case tc.ok && (err != nil || cfg.CheckpointQuotaBytes != tc.quota || cfg.CheckpointMinFreeBytes != tc.minFree):
			t.Errorf("%s=%q: quota %d min free %d, %v; want %d %d", tc.flag, tc.arg, cfg.CheckpointQuotaBytes, cfg.CheckpointMinFreeBytes, err, tc.quota, tc.minFree)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), tc.flag)):
			t.Errorf("%s=%q: %v, want a refusal naming the flag", tc.flag, tc.arg, err)
		}
	}
}
