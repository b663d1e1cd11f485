// Package release checks the parts of a release record — its version, image digests and
// binary checksums — and orders versions. It is pure (standard library only): the store
// and the control plane both use it, so they accept and order alike.
//
// A version is semver-ish: an optional "v", MAJOR.MINOR.PATCH (decimal, no leading
// zeros), and optionally "-PRERELEASE" (dot-separated identifiers of letters, digits and
// '-'), e.g. v1.4.0, 1.4.0-rc.1, v0.9.2-3-gabcdef0 (git describe). Build metadata ("+…")
// is refused: two versions that differ only in it would be equal in order but not in name.
// Versions are kept exactly as written: the runners report theirs in the same spelling.
package release

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/textclip"
)

// MaxVersionLen bounds a version string.
const MaxVersionLen = 128

var (
	numeric    = `(0|[1-9][0-9]{0,8})`
	ident      = `[0-9A-Za-z-]+`
	versionRE  = regexp.MustCompile(`^v?` + numeric + `\.` + numeric + `\.` + numeric + `(-` + ident + `(\.` + ident + `)*)?$`)
	digestRE   = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	checksumRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Arches are the architectures a binary checksum may be given for (GOARCH names).
var Arches = []string{"386", "amd64", "arm", "arm64", "loong64", "ppc64le", "riscv64", "s390x"}

// Version is a parsed version.
type Version struct {
	Major, Minor, Patch int64
	Pre                 []string // nil: a release; else its prerelease identifiers
}

// ParseVersion parses a version, or says what is wrong with it.
func ParseVersion(s string) (Version, error) {
	if s == "" {
		return Version{}, fmt.Errorf("is required")
	}
	if len(s) > MaxVersionLen {
		return Version{}, fmt.Errorf("must be at most %d bytes (got %d)", MaxVersionLen, len(s))
	}
	if strings.Contains(s, "+") {
		return Version{}, fmt.Errorf("must not carry build metadata ('+…') (got %q)", s)
	}
	m := versionRE.FindStringSubmatch(s)
	if m == nil {
		return Version{}, fmt.Errorf("must be a semantic version: [v]MAJOR.MINOR.PATCH[-PRERELEASE], e.g. v1.4.0 or 1.4.0-rc.1 (got %q)", s)
	}
	var v Version
	v.Major, _ = strconv.ParseInt(m[1], 10, 64)
	v.Minor, _ = strconv.ParseInt(m[2], 10, 64)
	v.Patch, _ = strconv.ParseInt(m[3], 10, 64)
	if m[4] != "" {
		v.Pre = strings.Split(m[4][1:], ".")
		for _, id := range v.Pre {
			if len(id) > 1 && id[0] == '0' && isDigits(id) {
				return Version{}, fmt.Errorf("prerelease identifier %q must not have leading zeros (got %q)", id, s)
			}
		}
	}
	return v, nil
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// Compare orders a and b by semantic-version precedence: -1, 0 or +1.
func (a Version) Compare(b Version) int {
	for _, d := range [3][2]int64{{a.Major, b.Major}, {a.Minor, b.Minor}, {a.Patch, b.Patch}} {
		if d[0] != d[1] {
			return cmp(d[0], d[1])
		}
	}
	switch {
	case a.Pre == nil && b.Pre == nil:
		return 0
	case a.Pre == nil:
		return 1
	case b.Pre == nil:
		return -1
	}
	for i := 0; i < len(a.Pre) && i < len(b.Pre); i++ {
		x, y := a.Pre[i], b.Pre[i]
		xn, yn := isDigits(x), isDigits(y)
		switch {
		case xn && yn:
			if len(x) != len(y) {
				return cmp(int64(len(x)), int64(len(y)))
			}
			if c := strings.Compare(x, y); c != 0 {
				return c
			}
		case xn:
			return -1
		case yn:
			return 1
		default:
			if c := strings.Compare(x, y); c != 0 {
				return c
			}
		}
	}
	return cmp(int64(len(a.Pre)), int64(len(b.Pre)))
}

func cmp(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// CompareVersions orders two version strings; a string that does not parse sorts before
// every version that does (and such strings among themselves by byte order).
func CompareVersions(a, b string) int {
	va, ea := ParseVersion(a)
	vb, eb := ParseVersion(b)
	switch {
	case ea != nil && eb != nil:
		return strings.Compare(a, b)
	case ea != nil:
		return -1
	case eb != nil:
		return 1
	}
	if c := va.Compare(vb); c != 0 {
		return c
	}
	return strings.Compare(a, b) // v1.0.0 and 1.0.0: equal precedence, a stable order
}

// CheckDigest checks an OCI image digest: sha256: and 64 lowercase hex digits.
func CheckDigest(d string) error {
	switch {
	case d == "":
		return fmt.Errorf("is required")
	case !digestRE.MatchString(d):
		return fmt.Errorf("must be sha256: followed by 64 lowercase hex digits (got %q)", textclip.Clip(d, 80))
	}
	return nil
}

// CheckArch checks the architecture a binary checksum is given for.
func CheckArch(arch string) error {
	for _, a := range Arches {
		if a == arch {
			return nil
		}
	}
	return fmt.Errorf("unknown architecture %q: want one of %s", textclip.Clip(arch, 80), strings.Join(Arches, ", "))
}

// CheckChecksum checks a binary's SHA-256: 64 lowercase hex digits.
func CheckChecksum(sum string) error {
	if !checksumRE.MatchString(sum) {
		return fmt.Errorf("must be a SHA-256 as 64 lowercase hex digits (got %q)", textclip.Clip(sum, 80))
	}
	return nil
}

// ImageWithTag is image reference ref with its tag replaced by tag (a digest is dropped:
// it pins the old one): how a runner's image follows its version (a Kubernetes runner's
// self-update, the control plane's re-apply of an installed runner).
func ImageWithTag(ref, tag string) string {
	ref, _, _ = strings.Cut(ref, "@")
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref = ref[:i]
	}
	return ref + ":" + tag
}
