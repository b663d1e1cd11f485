// Package dataplane is the direct data path of the public API (coreweave.sandbox.v1
// SandboxDataPlaneService): clients reach the runner that owns a sandbox over mTLS and run
// exec, logs and file calls there instead of through the gateway.
//
// Credentials: the gateway's ConnectSandbox signs the client's CSR (an ECDSA P-256 key it
// keeps) with the data-plane CA, a CA of its own kept next to the platform CA
// (<pki dir>/dataplane/ca.pem, ca-key.pem). It is separate, not an intermediate, so a
// client certificate for one sandbox is never trusted by anything that trusts the
// platform CA (runner API, control plane, edge). The certificate is short-lived (15 min by
// default) and names exactly one sandbox, its organization, its primary container and the
// operations it allows, in one URI SAN:
//
//	spiffe://sandboxd/sandbox/<org>/<sandbox>?container=<name>&perm=exec,stream_exec,…
//
// The runner's listener (Server) serves with a certificate from the same CA, requires TLS
// 1.3 and a client certificate that chains to it, and checks on every call that the
// certificate's sandbox is the one addressed, that it still lives on this runner in that
// organization, and that the operation is granted. No bearer token is involved.
package dataplane

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strings"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/pki"
)

// CADir is the data-plane CA's directory under a platform PKI directory.
const CADir = "dataplane"

// LoadOrCreateCA loads (creating on first use) the data-plane CA kept in pkiDir/dataplane.
func LoadOrCreateCA(pkiDir string) (*pki.CA, error) {
	ca, err := pki.LoadOrCreateCA(filepath.Join(pkiDir, CADir), "sandboxd data-plane CA")
	if err != nil {
		return nil, fmt.Errorf("data-plane CA: %w", err)
	}
	return ca, nil
}

// Identity is what a data-plane client certificate grants.
type Identity struct {
	Org, SandboxID string
	// Container is the sandbox's primary container name ("" when it has none).
	Container string
	Perms     []sandboxv1.SandboxDataPermission
}

const (
	uriScheme = "spiffe"
	uriHost   = "sandboxd"
	uriPrefix = "/sandbox/"
)

var permNames = map[sandboxv1.SandboxDataPermission]string{
	sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_EXEC:        "exec",
	sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_STREAM_EXEC: "stream_exec",
	sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_STREAM_LOGS: "stream_logs",
	sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_WRITE_FILE:  "write_file",
	sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_READ_FILE:   "read_file",
}

// PermName is perm's name in certificates ("" for none we grant).
func PermName(p sandboxv1.SandboxDataPermission) string { return permNames[p] }

// Has reports whether the identity grants p.
func (id Identity) Has(p sandboxv1.SandboxDataPermission) bool { return slices.Contains(id.Perms, p) }

// URI is the identity's URI SAN.
func (id Identity) URI() *url.URL {
	names := make([]string, 0, len(id.Perms))
	for _, p := range id.Perms {
		names = append(names, permNames[p])
	}
	q := url.Values{"perm": {strings.Join(names, ",")}}
	if id.Container != "" {
		q.Set("container", id.Container)
	}
	return &url.URL{Scheme: uriScheme, Host: uriHost,
		Path:    uriPrefix + id.Org + "/" + id.SandboxID,
		RawPath: uriPrefix + url.PathEscape(id.Org) + "/" + url.PathEscape(id.SandboxID), RawQuery: q.Encode()}
}

// ParseIdentity reads the identity of a data-plane client certificate: exactly one URI
// SAN of the form above, naming an organization, a sandbox and at least one known
// permission.
func ParseIdentity(c *x509.Certificate) (Identity, error) {
	var found []*url.URL
	for _, u := range c.URIs {
		if u.Scheme == uriScheme && u.Host == uriHost && strings.HasPrefix(u.EscapedPath(), uriPrefix) {
			found = append(found, u)
		}
	}
	if len(found) != 1 {
		return Identity{}, fmt.Errorf("certificate names %d sandboxes, want 1", len(found))
	}
	u := found[0]
	parts := strings.Split(strings.TrimPrefix(u.EscapedPath(), uriPrefix), "/")
	if len(parts) != 2 {
		return Identity{}, fmt.Errorf("certificate URI %s: want %s<org>/<sandbox>", u, uriPrefix)
	}
	var id Identity
	var err error
	if id.Org, err = url.PathUnescape(parts[0]); err != nil {
		return Identity{}, err
	}
	if id.SandboxID, err = url.PathUnescape(parts[1]); err != nil {
		return Identity{}, err
	}
	if id.Org == "" || id.SandboxID == "" {
		return Identity{}, errors.New("certificate URI names no organization or sandbox")
	}
	q := u.Query()
	id.Container = q.Get("container")
	for name := range strings.SplitSeq(q.Get("perm"), ",") {
		for p, n := range permNames {
			if n == name && !id.Has(p) {
				id.Perms = append(id.Perms, p)
			}
		}
	}
	if len(id.Perms) == 0 {
		return Identity{}, errors.New("certificate grants no operation")
	}
	slices.Sort(id.Perms)
	return id, nil
}
