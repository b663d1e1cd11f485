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

// PlatformRunnerURI is the URI SAN naming runner runnerID in the server certificate a
// runner that holds the platform CA issues itself (runnerapi.ServerTLSConfig: the
// operator's own runners, split mode and the embedded default): the explicit mark of a
// platform runner. The control plane never signs it (registration signs RunnerURI).
func PlatformRunnerURI(runnerID string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: "sandboxd", Path: "/platform-runner/" + runnerID}
}

// ErrRunnerIdentity is RunnerOwner's error for a certificate whose runner identity is
// malformed or ambiguous.
var ErrRunnerIdentity = errors.New("the certificate's runner identity (spiffe://sandboxd/runner/<org>/<runner_id> or spiffe://sandboxd/platform-runner/<runner_id>) is malformed or not unique")

// ErrNoRunnerIdentity is RunnerOwner's error for a certificate that names no runner: it
// belongs to nobody and serves nothing (no owner is guessed from its absence).
var ErrNoRunnerIdentity = errors.New("the certificate names no runner (neither spiffe://sandboxd/runner/<org>/<runner_id> nor spiffe://sandboxd/platform-runner/<runner_id>): it belongs to nobody")

// RunnerOwner is whom a runner's server certificate says the runner belongs to: the org
// of its one runner URI SAN (RunnerURI, issued by the control plane at registration), or
// the platform (platform true, org "") for its one PlatformRunnerURI (a runner holding
// the platform CA). Only that explicit mark makes a platform runner: a certificate with
// no runner URI is ErrNoRunnerIdentity, and one with a malformed runner URI, or several,
// is ErrRunnerIdentity.
func RunnerOwner(cert *x509.Certificate) (org, runnerID string, platform bool, err error) {
	n := 0
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" && u.Host == "sandboxd" && (strings.HasPrefix(u.Path, "/runner/") || strings.HasPrefix(u.Path, "/platform-runner/")) {
			n++
		}
	}
	if n == 0 {
		return "", "", false, ErrNoRunnerIdentity
	}
	if n > 1 {
		return "", "", false, ErrRunnerIdentity
	}
	if id, ok := platformRunnerID(cert); ok {
		return "", id, true, nil
	}
	org, id, ok := RunnerIdentity(cert)
	if !ok {
		return "", "", false, ErrRunnerIdentity
	}
	return org, id, false, nil
}

// platformRunnerID is the runner ID of cert's PlatformRunnerURI, if it has a valid one.
func platformRunnerID(cert *x509.Certificate) (string, bool) {
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" || u.Host != "sandboxd" {
			continue
		}
		if id, found := strings.CutPrefix(u.Path, "/platform-runner/"); found && id != "" && !strings.Contains(id, "/") {
			return id, true
		}
	}
	return "", false
}

// NodeAgentClientURI is the URI SAN naming runner runnerID in the client certificate it
// presents to its node agents (spiffe://sandboxd/node-agent-client/<runner_id>), issued by
// the runner's own node-agent CA. Its path is not under /runner/, so RunnerIdentity and
// RunnerOwner never read it as a runner's certificate.
func NodeAgentClientURI(runnerID string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: "sandboxd", Path: "/node-agent-client/" + runnerID}
}

// NodeAgentRunner returns the runner ID of cert's one NodeAgentClientURI; ok is false when
// it has none, a malformed one, or several.
func NodeAgentRunner(cert *x509.Certificate) (runnerID string, ok bool) {
	n := 0
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" || u.Host != "sandboxd" {
			continue
		}
		rest, found := strings.CutPrefix(u.Path, "/node-agent-client/")
		if !found {
			continue
		}
		n++
		if rest == "" || strings.Contains(rest, "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return "", false
		}
		runnerID = rest
	}
	return runnerID, n == 1
}
