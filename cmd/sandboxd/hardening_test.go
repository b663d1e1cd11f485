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
