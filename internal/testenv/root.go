// Package testenv is what tests of every tier share about the machine they run on: the
// one rule for tests that need root, and the agent binary built as `make agent` builds
// it. It imports nothing of sandboxd, so the tests of any package (internal ones too) can
// use it. internal/stack/stacktest builds a whole single-host stack on top of it.
//
// The tiers: `go test -short ./...` is the unit tier, the same set of tests with and
// without root, needing neither root nor a network. `go test ./...` adds the tests that
// need root (runc, namespaces, mounts, nftables); without root they skip, unless
// RequireRootEnv=1 or CI=true says root is required, where they fail.
package testenv

import (
	"flag"
	"fmt"
	"os"
	"testing"
)

// RequireRootEnv set to 1 turns a skip for want of root into a failure (CI sets it).
const RequireRootEnv = "SANDBOXD_REQUIRE_ROOT"

// RootRequired reports whether tests that need root must fail rather than skip without
// it: RequireRootEnv=1 or CI=true.
func RootRequired() bool {
	return os.Getenv(RequireRootEnv) == "1" || os.Getenv("CI") == "true"
}

// noRoot says why tests that need root do not run in this process ("" when they do):
// -short asks for the unit tier, which never needs root, or the process is not root.
// required is whether that is a failure rather than a skip.
func noRoot() (why string, required bool) {
	if !flag.Parsed() {
		flag.Parse() // a TestMain may ask before m.Run parses the flags
	}
	switch {
	case testing.Short():
		return "-short runs the unit tier", false
	case os.Geteuid() != 0:
		return fmt.Sprintf("running as uid %d", os.Geteuid()), RootRequired()
	}
	return "", false
}

// RequireRoot skips t unless tests that need root run in this process (root, and no
// -short); without root it fails t instead where RootRequired. why says what root is for.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	switch no, required := noRoot(); {
	case no == "":
	case required:
		t.Fatalf("needs root (%s): %s, and %s=1 or CI=true require it", why, no, RequireRootEnv)
	default:
		t.Skipf("needs root (%s): %s", why, no)
	}
}

// HaveRoot reports whether tests that need root run in this process, for a TestMain
// that prepares what they share (an agent, a rootfs) only then; the tests themselves
// still call RequireRoot, so they skip or fail by its rule.
func HaveRoot() bool {
	no, _ := noRoot()
	return no == ""
}

// MainRequiresRoot is RequireRoot for a TestMain whose every test needs root and whose
// set-up does too (a stack, a registry of test images). When they cannot run it says so
// on stdout, naming pkg, and returns ok=false with the exit code to end with: 0 (every
// test skipped) or, where RootRequired, 1.
func MainRequiresRoot(pkg, why string) (code int, ok bool) {
	no, required := noRoot()
	switch {
	case no == "":
		return 0, true
	case required:
		fmt.Printf("%s: needs root (%s): %s, and %s=1 or CI=true require it\n", pkg, why, no, RequireRootEnv)
		return 1, false
	}
	fmt.Printf("%s: every test skipped: needs root (%s): %s\n", pkg, why, no)
	return 0, false
}
