package edge

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// sandboxIDLen is the length of a sandbox ID as internal/runner makes them: 10 random
// bytes in unpadded base32, lower-cased (alphabet a-z, 2-7).
const sandboxIDLen = 16

var (
	// ErrForeignHost: the name is not one label under .<runner-id>.<base-domain>.
	ErrForeignHost = errors.New("edge: host is not an endpoint name of this runner")
	// ErrMalformedHost: the name is under this runner's domain, but its first label is
	// not <port>-<sandbox-id>.
	ErrMalformedHost = errors.New("edge: malformed endpoint host name")
)

// Host is the public host name of a sandbox's port on a runner.
func Host(port int, sandboxID, runnerID, baseDomain string) string {
	return strconv.Itoa(port) + "-" + strings.ToLower(sandboxID) + "." +
		strings.ToLower(runnerID) + "." + strings.ToLower(baseDomain)
}

// ParseHost is the inverse of Host: it returns the (lower-case) sandbox ID and port of
// an endpoint name. Names are compared case-insensitively (DNS); one trailing dot is
// accepted. Errors wrap ErrForeignHost or ErrMalformedHost.
func ParseHost(host, runnerID, baseDomain string) (sandboxID string, port int, err error) {
	label, ok := endpointLabel(host, runnerID, baseDomain)
	if !ok {
		return "", 0, fmt.Errorf("%w: %q", ErrForeignHost, host)
	}
	sandboxID, port, ok = parseLabel(label)
	if !ok {
		return "", 0, fmt.Errorf("%w: %q", ErrMalformedHost, host)
	}
	return sandboxID, port, nil
}

// endpointLabel returns the first label of host if host is exactly one non-empty label
// followed by .<runnerID>.<baseDomain>, i.e. a name the wildcard certificate covers.
// It does not allocate: it runs for every request.
func endpointLabel(host, runnerID, baseDomain string) (string, bool) {
	host = strings.TrimSuffix(host, ".")
	n := len(host) - len(baseDomain) - 1 - len(runnerID) - 1
	if runnerID == "" || baseDomain == "" || n < 1 {
		return "", false
	}
	if host[n] != '.' || host[n+1+len(runnerID)] != '.' ||
		!strings.EqualFold(host[n+1:n+1+len(runnerID)], runnerID) ||
		!strings.EqualFold(host[n+2+len(runnerID):], baseDomain) {
		return "", false
	}
	label := host[:n]
	if strings.IndexByte(label, '.') >= 0 {
		return "", false
	}
	return label, true
}

// parseLabel splits "<port>-<sandbox-id>": port in 1–65535 without leading zeros, the
// ID in the runner's alphabet (either case).
func parseLabel(label string) (sandboxID string, port int, ok bool) {
	p, id, found := strings.Cut(label, "-")
	if !found || len(p) == 0 || len(p) > 5 || p[0] == '0' || len(id) != sandboxIDLen {
		return "", 0, false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return "", 0, false
		}
		port = port*10 + int(p[i]-'0')
	}
	if port > 65535 {
		return "", 0, false
	}
	sandboxID = strings.ToLower(id) // no allocation when already lower case
	if !validSandboxID(sandboxID) {
		return "", 0, false
	}
	return sandboxID, port, true
}

// validSandboxID reports whether id is a sandbox ID as the runner makes them (lower case).
func validSandboxID(id string) bool {
	if len(id) != sandboxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}
