// Package version is the version sandboxd and sbx report (`sandboxd version`,
// `sbx --version`, the runner's heartbeats): set at build time with
//
//	go build -ldflags "-X github.com/sandboxd/sandboxd/internal/version.version=$(git describe --tags --always --dirty)"
//
// (the Makefile's build and scripts/build-runner-image.sh do), else taken from the VCS
// stamp Go puts in every binary built in a checkout, else "dev".
package version

import (
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
)

// version is set by -ldflags -X; empty means "not given".
var version string

// String is the version of this binary.
var String = sync.OnceValue(func() string {
	if version != "" {
		return version
	}
	bi, _ := debug.ReadBuildInfo()
	return fromBuildInfo(bi)
})

// pseudo matches the timestamp-commit part of a Go pseudo-version
// (v0.0.0-20260102030405-abcdef123456), which says less than the commit itself.
var pseudo = regexp.MustCompile(`\d{14}-[0-9a-f]{12}`)

// fromBuildInfo is the version a binary built without -ldflags reports: a tagged
// module version (`go install …@v1.2.3`, or a build at a clean tag), else the commit it
// was built from (12 hex digits, "-dirty" with uncommitted changes), else "dev".
func fromBuildInfo(bi *debug.BuildInfo) string {
	if bi == nil {
		return "dev"
	}
	var rev string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" && !pseudo.MatchString(v) && !strings.Contains(v, "+dirty") {
		return v
	}
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}
