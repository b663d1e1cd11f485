package gateway

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/spec"
)

// DataPlaneIssuer signs the client certificates of the direct data path
// (dataplane.Issuer).
type DataPlaneIssuer interface {
	// Issue signs a certificate for csr's key granting perms on one sandbox.
	Issue(csr *x509.CertificateRequest, org, sandboxID, container string, perms []sandboxv1.SandboxDataPermission) (chainPEM []byte, notAfter time.Time, err error)
	// ServerCAPEM is the bundle clients verify the runners' data-plane listeners by.
	ServerCAPEM() []byte
}

// maxCSRBytes bounds the CSR a client may send (a P-256 CSR is about 250 bytes).
const maxCSRBytes = 16 << 10

// ConnectSandbox issues a short-lived client certificate for the direct data path to one
// running sandbox of the caller's organization, and says where its runner serves it.
//
// The CSR is DER (what the official client sends) or PEM; its key must be ECDSA P-256.
// A gateway without a data-plane CA answers UNIMPLEMENTED; a sandbox that is not running
// (nor paused) or whose runner serves no data plane answers FAILED_PRECONDITION. Clients in AUTO mode
// then use the gateway's data RPCs.
func (s *Server) ConnectSandbox(ctx context.Context, req *connect.Request[sandboxv1.ConnectSandboxRequest]) (*connect.Response[sandboxv1.SandboxConnection], error) {
	m := req.Msg
	if s.dataPlane == nil {
		return nil, apierr.Newf(apierr.NotImplemented, "this sandboxd serves no direct data plane; use the data RPCs of SandboxService")
	}
	var vs []apierr.Violation
	if m.GetSandboxId() == "" {
		vs = append(vs, apierr.Violation{Field: "sandbox_id", Description: "is required"})
	}
	csr, why := parseCSR(m.GetCsrDer())
	if why != "" {
		vs = append(vs, apierr.Violation{Field: "csr_der", Description: why})
	}
	perms, pvs := grantable(m.GetRequestedPermissions())
	vs = append(vs, pvs...)
	if len(vs) > 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid ConnectSandbox request: "+apierr.Describe(vs), vs)
	}
	rec, r, err := s.lookup(ctx, m.GetSandboxId())
	if err != nil {
		return nil, err
	}
	// Logs outlive the sandbox (its runner keeps them for the retention window), so a
	// certificate for logs alone is issued for an ending or ended sandbox too.
	logsOnly := slices.Equal(perms, []sandboxv1.SandboxDataPermission{sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_STREAM_LOGS})
	// A PAUSED sandbox is reached too: its runner resumes it on the first call (auto-resume)
	// or answers CWSANDBOX_SANDBOX_NOT_RUNNING itself.
	if sb := s.current(ctx, rec, r); sb.State != runner.StateRunning && sb.State != runner.StatePaused && !(logsOnly && (sb.State.Terminal() || sb.State == runner.StateTerminating)) {
		return nil, apierr.New(apierr.SandboxNotRunning,
			fmt.Sprintf("sandbox %s is %s: only a running sandbox can be reached directly (an ended one for its logs alone)", rec.id, sb.State),
			map[string]string{"sandbox_id": rec.id, "state": sb.State.String()})
	}
	endpoint := s.views.dataPlaneOf(ctx, r.ID())
	if endpoint == "" {
		return nil, apierr.New(apierr.NotImplemented,
			fmt.Sprintf("runner %s of sandbox %s serves no direct data plane", r.ID(), rec.id),
			map[string]string{"sandbox_id": rec.id, "runner_id": r.ID()})
	}
	if err := s.directHostAllowed(r, endpoint); err != nil {
		s.log.Warn("direct data plane not offered: the runner announces a host the control plane does not certify for it",
			"runner", r.ID(), "sandbox", rec.id, "endpoint", endpoint, "err", err)
		return nil, apierr.New(apierr.NotImplemented,
			fmt.Sprintf("runner %s of sandbox %s serves no direct data plane this gateway may hand out (%v); use the data RPCs of SandboxService", r.ID(), rec.id, err),
			map[string]string{"sandbox_id": rec.id, "runner_id": r.ID()})
	}
	// The key was checked when the call arrived; check again right before signing, so that
	// a key revoked meanwhile (or whose principal came from a cache) gets no certificate.
	// Certificates already issued are not revocable: they live dataplane.Issuer's TTL
	// (dataplane.DefaultCertTTL, 15 min, at most dataplane.MaxCertTTL), so keep it short.
	if err := s.keyStillActive(ctx); err != nil {
		return nil, err
	}
	chain, notAfter, err := s.dataPlane.Issue(csr, rec.org, rec.id, spec.Primary(rec.spec).GetName(), perms)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("issue data-plane certificate: %w", err))
	}
	s.log.Debug("direct data-plane certificate issued", "sandbox", rec.id, "org", rec.org, "runner", r.ID(), "perms", perms, "not_after", notAfter)
	return connect.NewResponse(&sandboxv1.SandboxConnection{
		EndpointUri:               endpoint,
		EndpointId:                r.ID(),
		ClientCertificateChainPem: chain,
		ServerCaBundlePem:         s.dataPlane.ServerCAPEM(),
		ExpiresAt:                 timestamppb.New(notAfter),
		Transport:                 sandboxv1.SandboxDataTransport_SANDBOX_DATA_TRANSPORT_DIRECT_MTLS,
		Protocol:                  sandboxv1.SandboxDataProtocol_SANDBOX_DATA_PROTOCOL_CONNECT_H2_V1,
		GrantedPermissions:        perms,
	}), nil
}

// directHostAllowed reports why the gateway must not hand clients endpoint (the
// https://HOST:PORT runner r announces) as r's direct data plane (nil: it may). The
// runner's announcement is its own word; what clients trust is the data-plane CA, which
// the control plane signs a tenant organization's runner only for
// <runner_id>.<base-domain> and names under it. So a tenant's runner is offered only at
// such a host (defence in depth: the certificate the control plane refuses is refused
// here too); a platform runner's host is the operator's. A runner whose owner is not
// known yet is offered nothing.
func (s *Server) directHostAllowed(r runner.Handle, endpoint string) error {
	owner, known := s.runnerOwner(r)
	if !known {
		return errors.New("its owner is not verified yet")
	}
	if owner == "" {
		return nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" || u.User != nil || u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("its data-plane URI %q is not https://HOST:PORT", endpoint)
	}
	return pki.CheckTenantDataPlaneHost(u.Hostname(), r.ID(), s.baseDomain)
}

// keyStillActive re-checks the caller's key when the authenticator can (auth.KeyChecker).
func (s *Server) keyStillActive(ctx context.Context) error {
	kc, ok := s.auth.(auth.KeyChecker)
	if !ok {
		return nil
	}
	p := principal(ctx)
	got, err := kc.KeyActive(p.KeyID)
	switch {
	case errors.Is(err, auth.ErrInvalidKey) || err == nil && got.Org != p.Org:
		return apierr.Newf(apierr.Unauthenticated, "invalid API key")
	case err != nil:
		return apierr.Newf(apierr.BackendUnavailable, "cannot check the API key now: %v", err)
	}
	return nil
}

// parseCSR decodes a DER or PEM CSR and checks its signature and key; why says what is
// wrong ("" when nothing is).
func parseCSR(b []byte) (*x509.CertificateRequest, string) {
	switch {
	case len(b) == 0:
		return nil, "is required"
	case len(b) > maxCSRBytes:
		return nil, fmt.Sprintf("is %d bytes, more than %d", len(b), maxCSRBytes)
	}
	der := b
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte("-----BEGIN")) {
		blk, _ := pem.Decode(b)
		if blk == nil || blk.Type != "CERTIFICATE REQUEST" && blk.Type != "NEW CERTIFICATE REQUEST" {
			return nil, "is PEM but holds no CERTIFICATE REQUEST"
		}
		der = blk.Bytes
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, "is not a PKCS #10 certificate signing request: " + err.Error()
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, "has an invalid signature: " + err.Error()
	}
	if k, ok := csr.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		return nil, "must hold an ECDSA P-256 public key"
	}
	return csr, ""
}

// grantable checks the requested permissions and returns them sorted without duplicates.
func grantable(req []sandboxv1.SandboxDataPermission) ([]sandboxv1.SandboxDataPermission, []apierr.Violation) {
	if len(req) == 0 {
		return nil, []apierr.Violation{{Field: "requested_permissions", Description: "must name at least one permission"}}
	}
	var out []sandboxv1.SandboxDataPermission
	var vs []apierr.Violation
	for i, p := range req {
		if p < sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_EXEC || p > sandboxv1.SandboxDataPermission_SANDBOX_DATA_PERMISSION_READ_FILE {
			vs = append(vs, apierr.Violation{Field: fmt.Sprintf("requested_permissions[%d]", i), Description: fmt.Sprintf("%s is not a permission this server grants", p)})
			continue
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out, vs
}
