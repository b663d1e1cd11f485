package registry

import (
	"regexp"
	"strings"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
)

// References is a set of image references (those that templates and live sandboxes
// name); its Keep keeps the manifests they name, by digest or by tag (a reference with
// neither names "latest"). The registry host of a reference is not compared: a
// reference naming "<org>/<repo>" on any host keeps that repository's manifest here,
// which can only keep too much, never too little (another name for this registry, such
// as localhost for 127.0.0.1, still counts). The zero value is empty and ready.
type References struct {
	digests map[string]map[digest.Digest]bool // repository path → digests
	tags    map[string]map[string]bool        // repository path → tags
}

// maxRefLen bounds a reference token (Distribution's name limit is 255, plus host, tag
// and digest).
const maxRefLen = 512

// refToken matches what may be an image reference in free text (a Compose file, an
// argument): a run of reference characters with a slash in it.
var refToken = regexp.MustCompile(`[A-Za-z0-9][A-Za-z0-9_.:@/+-]*/[A-Za-z0-9_.:@/+-]*`)

// Add adds ref if it is an image reference; false if it is not one.
func (rs *References) Add(ref string) bool {
	if len(ref) > maxRefLen {
		return false
	}
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return false
	}
	p := reference.Path(named)
	if rs.digests == nil {
		rs.digests, rs.tags = map[string]map[digest.Digest]bool{}, map[string]map[string]bool{}
	}
	added := false
	if c, ok := named.(reference.Canonical); ok {
		add(rs.digests, p, c.Digest())
		added = true
	}
	if t, ok := named.(reference.Tagged); ok {
		add(rs.tags, p, t.Tag())
		added = true
	}
	if !added {
		add(rs.tags, p, "latest")
	}
	return true
}

func add[K comparable](m map[string]map[K]bool, p string, k K) {
	if m[p] == nil {
		m[p] = map[K]bool{}
	}
	m[p][k] = true
}

// Scan adds every image reference in text (a whole value such as an image field, or free
// text such as a Compose file); it returns how many it added.
func (rs *References) Scan(text string) int {
	n := 0
	for _, tok := range refToken.FindAllString(text, -1) {
		if rs.Add(strings.TrimRight(tok, ".:@/+-")) {
			n++
		}
	}
	return n
}

// Len is the number of repositories named.
func (rs *References) Len() int {
	n := len(rs.tags)
	for p := range rs.digests {
		if _, ok := rs.tags[p]; !ok {
			n++
		}
	}
	return n
}

// Keep keeps the manifests the references name (a Keep).
func (rs *References) Keep(org, repo string, d digest.Digest, tags []string) bool {
	p := org + "/" + repo
	if rs.digests[p][d] {
		return true
	}
	for _, t := range tags {
		if rs.tags[p][t] {
			return true
		}
	}
	return false
}
