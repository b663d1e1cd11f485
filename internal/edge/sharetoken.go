package edge

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
)

// A SHARE_TOKEN endpoint (Route.Auth AuthToken with a Route.ShareTokenHash) also accepts
// its sandbox's share token: a random credential the gateway hands out once, in the
// create response. The edge knows only its SHA-256 and compares in constant time; the
// token works for every SHARE_TOKEN port of that one sandbox. It is taken from
//
//   - the header ShareTokenHeader, which the official client's
//     EndpointShareToken.as_headers() sends;
//   - the query parameter ShareTokenParam, for links and browsers. The official clients
//     mention a query-parameter fallback without naming it, so the name is ours. A page
//     request (GET or HEAD, Accept: text/html) with a valid one gets the login session
//     cookie (login.go) and is redirected to the same URL without the parameter, so the
//     token leaves the address bar.
//
// Both are removed before a request reaches the sandbox, whichever credential let it in;
// a wrong token is 401 even when the request also carries a valid key.

const (
	// ShareTokenHeader carries a share token (the official client's header).
	ShareTokenHeader = "X-Sandbox-Share-Token"
	// ShareTokenParam carries a share token in the query string.
	ShareTokenParam = "sandbox_share_token"

	// shareSession is the key ID of a login session that a share token opened: it is
	// bound to the endpoint's host like any session, and no API key's ID contains a '.'
	// (keyIDOf), so no key's session can pass for one.
	shareSession = "share-token."
)

// ShareTokenHash is what runners and routes keep of a share token: its SHA-256, hex.
func ShareTokenHash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// ValidShareTokenHash reports whether h has the form ShareTokenHash returns.
func ValidShareTokenHash(h string) bool {
	if len(h) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// shareTokenMatches reports whether token is the one whose hash is want, in time
// independent of where they differ.
func shareTokenMatches(token, want string) bool {
	w, err := hex.DecodeString(want)
	if err != nil || len(w) != sha256.Size || token == "" {
		return false
	}
	got := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(got[:], w) == 1
}

// cutShareTokenParam removes every ShareTokenParam from r's query (the raw query and the
// request target, which the two proxy paths forward) and returns their values; the rest
// of the query goes on byte for byte. A name is compared unescaped, as a workload would
// read it, so no spelling of it gets through.
func cutShareTokenParam(r *http.Request) []string {
	if r.URL.RawQuery == "" {
		return nil
	}
	var vals, kept []string
	for part := range strings.SplitSeq(r.URL.RawQuery, "&") {
		name, val, _ := strings.Cut(part, "=")
		if n, err := url.QueryUnescape(name); err != nil || n != ShareTokenParam {
			kept = append(kept, part)
			continue
		}
		v, err := url.QueryUnescape(val)
		if err != nil {
			v = "" // malformed: no token, so refused
		}
		vals = append(vals, v)
	}
	if vals == nil {
		return nil
	}
	r.URL.RawQuery = strings.Join(kept, "&")
	path, _, _ := strings.Cut(r.RequestURI, "?")
	r.RequestURI = path
	if r.URL.RawQuery != "" {
		r.RequestURI += "?" + r.URL.RawQuery
	}
	r.URL.ForceQuery = false
	return vals
}

// shareTokenOf is the share token r presents: the header's, else the query parameters'
// (all of which must agree); ok is false when it presents none.
func shareTokenOf(r *http.Request, params []string) (token string, fromQuery, ok bool) {
	if vs := r.Header.Values(ShareTokenHeader); len(vs) > 0 {
		if len(vs) > 1 {
			return "", false, true // ambiguous: refused
		}
		return strings.TrimSpace(vs[0]), false, true
	}
	if len(params) == 0 {
		return "", false, false
	}
	for _, p := range params[1:] {
		if p != params[0] {
			return "", true, true
		}
	}
	return params[0], true, true
}
