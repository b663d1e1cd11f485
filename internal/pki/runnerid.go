package pki

import (
	"crypto/x509"
	"errors"
	"net/url"
	"strings"
)

// RunnerURI is the URI SAN naming runner runnerID of organization org in the
// certificate the control plane issues it at registration.
func RunnerURI(org, runnerID string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: "sandboxd", Path: "/runner/" + org + "/" + runnerID}
}

// RunnerIdentity returns the organization and runner ID of cert's
// spiffe://sandboxd/runner/<org>/<runner_id> URI SAN; ok is false when it has none.
func RunnerIdentity(cert *x509.Certificate) (org, runnerID string, ok bool) {
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" || u.Host != "sandboxd" {
			continue
		}
		rest, found := strings.CutPrefix(u.Path, "/runner/")
		if !found {
			continue
		}
		org, id, found := strings.Cut(rest, "/")
		if found && org != "" && id != "" && !strings.Contains(id, "/") {
			return org, id, true
		}
	}
	return "", "", false
}

// ErrRunnerIdentity is RunnerOwner's error for a certificate whose runner identity is
// malformed or ambiguous.
var ErrRunnerIdentity = errors.New("the certificate's runner identity (spiffe://sandboxd/runner/<org>/<runner_id>) is malformed or not unique")

// RunnerOwner is the organization a runner's server certificate says it belongs to:
// the org of its one runner URI SAN (issued at registration), or "" when it has none (a
// certificate the platform CA issued the runner directly: an operator's runner, which
// holds the CA). A certificate with a malformed runner URI, or with several, is
// ErrRunnerIdentity: no owner is guessed.
func RunnerOwner(cert *x509.Certificate) (org, runnerID string, err error) {
	n := 0
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" && u.Host == "sandboxd" && strings.HasPrefix(u.Path, "/runner/") {
			n++
		}
	}
	if n == 0 {
		return "", "", nil
	}
	org, id, ok := RunnerIdentity(cert)
	if !ok || n > 1 {
		return "", "", ErrRunnerIdentity
	}
	return org, id, nil
}
