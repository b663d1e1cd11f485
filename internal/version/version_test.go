package version

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	vcs := func(main, rev, modified string) *debug.BuildInfo {
		bi := &debug.BuildInfo{Main: debug.Module{Version: main}}
		if rev != "" {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs", Value: "git"}, debug.BuildSetting{Key: "vcs.revision", Value: rev})
		}
		if modified != "" {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs.modified", Value: modified})
		}
		return bi
	}
	const rev = "7d24d0c0123456789abcdef0123456789abcdef0"
	for _, tc := range []struct {
		bi   *debug.BuildInfo
		want string
	}{
		{nil, "dev"},
		{vcs("(devel)", "", ""), "dev"},
		{vcs("(devel)", rev, "false"), "7d24d0c01234"},
		{vcs("(devel)", rev, "true"), "7d24d0c01234-dirty"},
		{vcs("v0.0.0-20260102030405-7d24d0c01234+dirty", rev, "true"), "7d24d0c01234-dirty"},
		{vcs("v1.2.4-0.20260102030405-7d24d0c01234", rev, "false"), "7d24d0c01234"},
		{vcs("v1.2.3", rev, "false"), "v1.2.3"}, // a build at a clean tag
		{vcs("v1.2.3", "", ""), "v1.2.3"},       // go install …@v1.2.3
	} {
		if got := fromBuildInfo(tc.bi); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.bi, got, tc.want)
		}
	}
}

// TestBinariesReportVersion builds sbx and sandboxd the ways the Makefile and a plain
// `go build` do and runs their version commands.
func TestBinariesReportVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	n := 0
	build := func(name, ldflags string) string {
		t.Helper()
		n++
		out := filepath.Join(dir, fmt.Sprint(n), filepath.Base(name))
		cmd := exec.Command("go", "build", "-buildvcs=true", "-ldflags", ldflags, "-o", out, "./"+name)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", name, err, b)
		}
		return out
	}
	run := func(bin string, args ...string) string {
		t.Helper()
		b, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", bin, args, err, b)
		}
		return string(b)
	}
	const set = "-X github.com/sandboxd/sandboxd/internal/version.version=v9.8.7-test"
	if got := run(build("cmd/sbx", set), "--version"); got != "sbx v9.8.7-test\n" {
		t.Errorf("sbx --version: %q", got)
	}
	if got := run(build("cmd/sandboxd", set), "version"); got != "sandboxd v9.8.7-test\n" {
		t.Errorf("sandboxd version: %q", got)
	}
	// Without -ldflags: the commit Go stamped into the binary. Go stamps only a checkout
	// whose .git is a directory (not a worktree's .git file).
	if fi, err := os.Stat(filepath.Join(root, ".git")); err != nil || !fi.IsDir() {
		t.Skip("not a git clone: Go stamps no VCS information")
	}
	head, err := exec.Command("git", "-C", root, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		t.Skipf("git: %v", err)
	}
	got := run(build("cmd/sbx", "-s"), "--version")
	if want := "sbx " + strings.TrimSpace(string(head)); !strings.HasPrefix(got, want) {
		t.Errorf("sbx --version without ldflags: %q, want %s[-dirty]", got, want)
	}
}
