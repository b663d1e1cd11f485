package policy

import (
	"errors"
	"path"
	"slices"
	"strings"
)

// imageRef is a parsed OCI image reference, normalized the way Docker does: an
// unqualified name is on docker.io, and a single-segment docker.io name is in library/.
type imageRef struct {
	host, repo, tag, digest string
}

func parseImage(ref string) (imageRef, error) {
	var r imageRef
	name := strings.TrimSpace(ref)
	if name == "" || strings.ContainsAny(name, " \t\n") {
		return r, errors.New("is not an image reference")
	}
	if i := strings.IndexByte(name, '@'); i >= 0 {
		name, r.digest = name[:i], name[i+1:]
		if !validDigest(r.digest) {
			return r, errors.New("has a malformed digest; want e.g. @sha256:<64 hex digits>")
		}
	}
	if i := strings.LastIndexByte(name, ':'); i > strings.LastIndexByte(name, '/') {
		name, r.tag = name[:i], name[i+1:]
		if r.tag == "" {
			return r, errors.New("has an empty tag")
		}
	}
	first, rest, ok := strings.Cut(name, "/")
	if ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		r.host, r.repo = strings.ToLower(first), rest
	} else {
		r.host, r.repo = "docker.io", name
	}
	if r.host == "index.docker.io" || r.host == "registry-1.docker.io" {
		r.host = "docker.io"
	}
	if r.host == "docker.io" && !strings.Contains(r.repo, "/") {
		r.repo = "library/" + r.repo
	}
	for seg := range strings.SplitSeq(r.repo, "/") {
		if seg == "" {
			return r, errors.New("has an empty path segment")
		}
	}
	return r, nil
}

func validDigest(d string) bool {
	alg, hex, ok := strings.Cut(d, ":")
	if !ok || alg == "" || len(hex) < 32 {
		return false
	}
	for _, c := range alg {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	for _, c := range hex {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// registryAllowed matches a registry host against an allow-list entry: equal hosts, or
// "*.example.com" for any subdomain. "docker.io" also matches its aliases.
func registryAllowed(pattern, host string) bool {
	pattern = normalizeHost(pattern)
	if pattern == host {
		return true
	}
	suffix, ok := strings.CutPrefix(pattern, "*")
	return ok && strings.HasPrefix(suffix, ".") && strings.HasSuffix(host, suffix) && len(host) > len(suffix)
}

func normalizeHost(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	if h == "index.docker.io" || h == "registry-1.docker.io" {
		return "docker.io"
	}
	return h
}

// looksLikeHost is Docker's rule for the first segment of a reference.
func looksLikeHost(seg string) bool {
	return strings.ContainsAny(seg, ".:") || seg == "localhost"
}

// repositoryAllowed matches r against a glob pattern over the repository path, or over
// host/path when the pattern starts with a host.
func repositoryAllowed(pattern string, r imageRef) bool {
	subject := r.repo
	first, rest, ok := strings.Cut(pattern, "/")
	if ok && looksLikeHost(first) {
		pattern = normalizeHost(first) + "/" + rest
		subject = r.host + "/" + r.repo
	}
	pat := slices.CompactFunc(strings.Split(pattern, "/"), func(a, b string) bool { return a == "**" && b == "**" })
	return globMatch(pat, strings.Split(subject, "/"))
}

// globMatch matches path segments: "**" spans zero or more segments, others use
// path.Match within one segment.
func globMatch(pat, segs []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for i := len(segs); i >= 0; i-- {
				if globMatch(pat[1:], segs[i:]) {
					return true
				}
			}
			return false
		}
		if len(segs) == 0 {
			return false
		}
		if ok, err := path.Match(pat[0], segs[0]); err != nil || !ok {
			return false
		}
		pat, segs = pat[1:], segs[1:]
	}
	return len(segs) == 0
}

// validRepositoryPattern reports whether every segment is a well-formed glob.
func validRepositoryPattern(p string) bool {
	if strings.TrimSpace(p) == "" {
		return false
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "" {
			return false
		}
		if _, err := path.Match(seg, ""); err != nil {
			return false
		}
	}
	return true
}
