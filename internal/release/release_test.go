package release_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/release"
)

func TestParseVersion(t *testing.T) {
	for _, ok := range []string{"1.0.0", "v1.0.0", "v0.9.2-3-gabcdef0", "1.4.0-rc.1", "v10.20.30-alpha.beta-1.0", "0.0.0-dirty"} {
		if _, err := release.ParseVersion(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1", "1.0", "v1.0.0.0", "01.0.0", "1.00.0", "1.0.0-", "1.0.0-rc..1", "1.0.0-01",
		"1.0.0+build", "V1.0.0", " 1.0.0", "1.0.0\n", "dev", "abcdef123456", "1.0.0-é", "1234567890.0.0",
		"1.0.0-" + strings.Repeat("a", 200)} {
		if _, err := release.ParseVersion(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCompareVersions(t *testing.T) {
	// Ascending precedence (semver.org §11).
	order := []string{"1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
		"1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "v1.0.1", "1.2.0", "1.10.0", "v2.0.0"}
	for i := range order {
		for j := range order {
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := release.CompareVersions(order[i], order[j]); got != want {
				t.Errorf("Compare(%s, %s) = %d, want %d", order[i], order[j], got, want)
			}
		}
	}
	shuffled := slices.Clone(order)
	slices.Reverse(shuffled)
	slices.SortFunc(shuffled, release.CompareVersions)
	if !slices.Equal(shuffled, order) {
		t.Errorf("sorted %v", shuffled)
	}
	a, _ := release.ParseVersion("v1.0.0")
	b, _ := release.ParseVersion("1.0.0")
	if a.Compare(b) != 0 {
		t.Error("v1.0.0 and 1.0.0 differ in precedence")
	}
}

func TestDigestsAndChecksums(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	if err := release.CheckDigest("sha256:" + sum); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"", sum, "sha256:" + strings.ToUpper(sum), "sha512:" + sum, "sha256:" + sum[:62], "sha256:" + sum + "0"} {
		if release.CheckDigest(bad) == nil {
			t.Errorf("digest %q accepted", bad)
		}
	}
	if release.CheckChecksum(sum) != nil || release.CheckChecksum("sha256:"+sum) == nil || release.CheckChecksum("") == nil {
		t.Error("checksum")
	}
	if release.CheckArch("amd64") != nil || release.CheckArch("arm64") != nil || release.CheckArch("x86_64") == nil || release.CheckArch("") == nil {
		t.Error("arch")
	}
}

// FuzzParseVersion: the validator never panics; what it accepts is bounded, has no
// build metadata, compares equal to itself, and orders consistently against a fixed
// version (antisymmetry).
func FuzzParseVersion(f *testing.F) {
	for _, s := range []string{"1.0.0", "v1.2.3-rc.1", "v0.9.2-3-gabcdef0", "1.0.0+x", "", "01.1.1", "1.0.0-0a.00"} {
		f.Add(s)
	}
	ref := "v1.2.3-rc.1"
	f.Fuzz(func(t *testing.T, s string) {
		v, err := release.ParseVersion(s)
		_ = release.CheckDigest(s)
		_ = release.CheckChecksum(s)
		if err != nil {
			return
		}
		if len(s) > release.MaxVersionLen || strings.ContainsAny(s, "+ \n") {
			t.Fatalf("accepted %q", s)
		}
		if v.Compare(v) != 0 || release.CompareVersions(s, s) != 0 {
			t.Fatalf("%q != itself", s)
		}
		if release.CompareVersions(s, ref) != -release.CompareVersions(ref, s) {
			t.Fatalf("%q vs %q not antisymmetric", s, ref)
		}
	})
}
