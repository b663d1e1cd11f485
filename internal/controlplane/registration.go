package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/apifront"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Bootstrap tokens and runner certificates.
const (
	// DefaultBootstrapTokenTTL is how long a bootstrap token is valid unless asked otherwise.
	DefaultBootstrapTokenTTL = time.Hour
	// MaxBootstrapTokenTTL bounds a requested token lifetime.
	MaxBootstrapTokenTTL = 24 * time.Hour
	// DefaultRunnerCertTTL is the lifetime of a runner certificate issued at registration.
	DefaultRunnerCertTTL = 365 * 24 * time.Hour

	// tokenPrefix starts every bootstrap token, so a leaked one is recognisable.
	tokenPrefix = "sbxbt_"
)

// BootstrapToken is a parsed bootstrap token: "sbxbt_<secret>.<ca-sha256-hex>". The
// secret is the credential (the store keeps its SHA-256); the CA pin lets a fresh runner
// trust the control plane before it has the CA (the control plane's TLS chain includes
// the CA certificate, which must hash to the pin).
type BootstrapToken struct {
	Secret string
	CAPin  string // hex SHA-256 of the CA certificate's DER; "" when the token has none
}

// NewBootstrapToken returns a new token pinned to ca.
func NewBootstrapToken(ca *x509.Certificate) (string, BootstrapToken, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", BootstrapToken{}, err
	}
	t := BootstrapToken{Secret: base64.RawURLEncoding.EncodeToString(b)}
	if ca != nil {
		t.CAPin = CAPin(ca)
	}
	return t.String(), t, nil
}

// CAPin is the hex SHA-256 of cert's DER.
func CAPin(cert *x509.Certificate) string {
	h := sha256.Sum256(cert.Raw)
	return hex.EncodeToString(h[:])
}

func (t BootstrapToken) String() string {
	if t.CAPin == "" {
		return tokenPrefix + t.Secret
	}
	return tokenPrefix + t.Secret + "." + t.CAPin
}

// Hash is what the store keeps of the token.
func (t BootstrapToken) Hash() string {
	h := sha256.Sum256([]byte(t.Secret))
	return hex.EncodeToString(h[:])
}

// ParseBootstrapToken parses what NewBootstrapToken returned.
func ParseBootstrapToken(s string) (BootstrapToken, error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(s), tokenPrefix)
	if !ok {
		return BootstrapToken{}, fmt.Errorf("not a bootstrap token (want %s…)", tokenPrefix)
	}
	secret, pin, _ := strings.Cut(rest, ".")
	if raw, err := base64.RawURLEncoding.DecodeString(secret); err != nil || len(raw) != 32 {
		return BootstrapToken{}, errors.New("malformed bootstrap token secret")
	}
	if pin != "" {
		if b, err := hex.DecodeString(pin); err != nil || len(b) != sha256.Size {
			return BootstrapToken{}, errors.New("malformed bootstrap token CA pin")
		}
	}
	return BootstrapToken{Secret: secret, CAPin: strings.ToLower(pin)}, nil
}

// RunnerURI is the URI SAN naming runnerID of org in its certificate (pki.RunnerURI).
func RunnerURI(org, runnerID string) *url.URL { return pki.RunnerURI(org, runnerID) }

// RunnerIdentity returns the organization and runner ID of cert's
// spiffe://sandboxd/runner/<org>/<runner_id> URI SAN (pki.RunnerIdentity).
func RunnerIdentity(cert *x509.Certificate) (org, runnerID string, ok bool) {
	return pki.RunnerIdentity(cert)
}

func (s *Service) CreateBootstrapToken(ctx context.Context, req *connect.Request[controlplanev1.CreateBootstrapTokenRequest]) (*connect.Response[controlplanev1.CreateBootstrapTokenResponse], error) {
	var vs violations
	checkRunnerID(&vs, "runner_id", req.Msg.GetRunnerId())
	ttl := DefaultBootstrapTokenTTL
	if d := req.Msg.GetTtl(); d != nil {
		switch v := d.AsDuration(); {
		case v < 0 || v > MaxBootstrapTokenTTL:
			vs.add("ttl", "must be between 0 and %s (got %s)", MaxBootstrapTokenTTL, v)
		case v > 0:
			ttl = v
		}
	}
	if err := vs.err("invalid bootstrap token request"); err != nil {
		return nil, err
	}
	if s.ca == nil {
		return nil, apierr.New(apierr.RegistrationDisabled,
			"this control plane has no CA: runner registration is not available here", nil)
	}
	org, id := principal(ctx).Org, req.Msg.GetRunnerId()
	if _, err := s.st.Runners().Get(ctx, org, id); err != nil {
		return nil, runnerErr(id, "", err)
	}
	secret, tok, err := NewBootstrapToken(s.ca.Certificate())
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	exp := s.now().Add(ttl).UTC()
	if err := s.st.BootstrapTokens().Create(ctx, store.BootstrapToken{Hash: tok.Hash(), Org: org, RunnerID: id, ExpiresAt: exp}); err != nil {
		return nil, runnerErr(id, "", err)
	}
	s.log.Info("bootstrap token issued", "org", org, "runner", id, "expires", exp)
	return connect.NewResponse(&controlplanev1.CreateBootstrapTokenResponse{BootstrapToken: secret, RunnerId: id, ExpireTime: timestamppb.New(exp)}), nil
}

// Registration serves RunnerRegistrationService.
type Registration struct {
	controlplanev1connect.UnimplementedRunnerRegistrationServiceHandler
	s *Service
}

// Registration returns the runner-facing service.
func (s *Service) Registration() *Registration { return &Registration{s: s} }

func (g *Registration) Register(ctx context.Context, req *connect.Request[controlplanev1.RegisterRequest]) (*connect.Response[controlplanev1.RegisterResponse], error) {
	s := g.s
	if s.ca == nil {
		return nil, apierr.New(apierr.RegistrationDisabled, "this control plane has no CA: runner registration is not available here", nil)
	}
	var vs violations
	if req.Msg.GetBootstrapToken() == "" {
		vs.add("bootstrap_token", "is required")
	}
	csr := parseCSR(&vs, req.Msg.GetCsrPem())
	if csr != nil {
		if err := csr.CheckSignature(); err != nil {
			vs.add("csr_pem", "signature invalid: %v", err)
			csr = nil
		}
	}
	if err := vs.err("invalid registration"); err != nil {
		return nil, err
	}
	tok, err := ParseBootstrapToken(req.Msg.GetBootstrapToken())
	if err != nil {
		return nil, tokenInvalid(err.Error())
	}
	// Check the CSR's key before consuming the token, so a bad key does not burn it.
	if _, err := s.ca.SignCSR(csr, func(c *x509.Certificate) { c.Subject.CommonName = "probe" }, time.Minute); err != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, err.Error(), []apierr.Violation{{Field: "csr_pem", Description: err.Error()}})
	}
	rec, err := s.st.BootstrapTokens().Consume(ctx, tok.Hash())
	if errors.Is(err, store.ErrNotFound) {
		s.log.Warn("runner registration refused: bootstrap token unknown, used or expired")
		return nil, tokenInvalid("bootstrap token is unknown, already used or expired: create a new one (POST /v1/sandbox/managedRunners/RUNNER_ID:createBootstrapToken)")
	}
	if err != nil {
		return nil, runnerErr("", "", err)
	}
	org, id := rec.Org, rec.RunnerID
	if err := s.checkIDHolder(ctx, org, id); err != nil {
		return nil, err
	}
	cert, err := s.ca.SignCSR(csr, func(c *x509.Certificate) {
		c.Subject.CommonName = "sandboxd runner " + id
		c.Subject.Organization = []string{org}
		c.DNSNames = []string{id}
		c.URIs = []*url.URL{RunnerURI(org, id)}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}
	}, s.certTTL)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	s.log.Info("runner registered", "org", org, "runner", id, "serial", cert.SerialNumber.Text(16), "not_after", cert.NotAfter)
	return connect.NewResponse(&controlplanev1.RegisterResponse{
		Org: org, RunnerId: id,
		CertificateChainPem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})),
		CaBundlePem:         string(s.ca.CertPEM()),
		HeartbeatInterval:   durationpb.New(s.interval),
	}), nil
}

// parseCSR reads the PEM CERTIFICATE REQUEST of field csr_pem, adding a violation to vs
// (and returning nil) when it is none.
func parseCSR(vs *violations, csrPEM string) *x509.CertificateRequest {
	blk, _ := pem.Decode([]byte(csrPEM))
	if blk == nil || blk.Type != "CERTIFICATE REQUEST" {
		vs.add("csr_pem", "must be a PEM CERTIFICATE REQUEST")
		return nil
	}
	c, err := x509.ParseCertificateRequest(blk.Bytes)
	if err != nil {
		vs.add("csr_pem", "cannot be parsed: %v", err)
		return nil
	}
	return c
}

func tokenInvalid(msg string) error {
	return apierr.New(apierr.BootstrapTokenInvalid, msg, nil)
}

// caller is the runner whose client certificate (from registration) the call came with.
func caller(ctx context.Context) (org, id string, err error) {
	cs, _ := ctx.Value(tlsStateKey{}).(*tls.ConnectionState)
	if cs == nil || len(cs.VerifiedChains) == 0 {
		return "", "", apierr.New(apierr.Unauthenticated, "this call needs the runner's client certificate from registration (mTLS)", nil)
	}
	org, id, ok := RunnerIdentity(cs.VerifiedChains[0][0])
	if !ok {
		return "", "", apierr.New(apierr.RunnerIdentityMismatch, "the client certificate does not name a runner (spiffe://sandboxd/runner/<org>/<runner_id>)", nil)
	}
	return org, id, nil
}

// checkIDHolder refuses a certificate naming runner id to org's runner unless org holds
// the ID: its runner of that ID exists and no other organization's runner of that ID
// was created before it. Runner IDs are unique across organizations since
// CreateManagedRunner checks; a database from before may hold duplicates, whose
// earliest runner keeps the name (*.<id>.<domain>, DNS name <id>). A certificate is
// issued only for a runner that exists: a deleted runner's certificate gets no more.
func (s *Service) checkIDHolder(ctx context.Context, org, id string) error {
	holder, err := s.st.Runners().IDHolder(ctx, id)
	if err == nil && holder != org {
		_, err = s.st.Runners().Get(ctx, org, id)
	}
	switch {
	case err != nil:
		s.log.Warn("certificate refused: runner not readable", "org", org, "runner", id, "err", err)
		return runnerErr(id, "", err)
	case holder != org:
		s.log.Warn("certificate refused: runner_id held by another organization's earlier runner", "org", org, "runner", id)
		return apierr.New(apierr.RunnerIDTaken,
			fmt.Sprintf("runner_id %s is also held by an earlier-created runner of another organization, so no certificate naming it is issued to this runner: delete it and create a runner with another runner_id", id),
			map[string]string{"runner_id": id})
	}
	return nil
}

func (g *Registration) IssueEdgeCertificate(ctx context.Context, req *connect.Request[controlplanev1.IssueEdgeCertificateRequest]) (*connect.Response[controlplanev1.IssueEdgeCertificateResponse], error) {
	s := g.s
	org, id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if s.ca == nil {
		return nil, apierr.New(apierr.RegistrationDisabled, "this control plane has no CA: it cannot issue edge certificates", nil)
	}
	var vs violations
	if d := req.Msg.GetBaseDomain(); d != s.domain {
		vs.add("base_domain", "must be the platform's endpoint domain %q, got %q", s.domain, d)
	}
	csr := parseCSR(&vs, req.Msg.GetCsrPem())
	if err := vs.err("invalid edge certificate request"); err != nil {
		return nil, err
	}
	if err := s.checkIDHolder(ctx, org, id); err != nil {
		return nil, err
	}
	name := "*." + id + "." + s.domain
	cert, err := s.ca.SignCSR(csr, func(c *x509.Certificate) {
		c.Subject.CommonName = name
		c.Subject.Organization = []string{org}
		c.DNSNames = []string{name}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}, EdgeCertTTL)
	if err != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, err.Error(), []apierr.Violation{{Field: "csr_pem", Description: err.Error()}})
	}
	s.log.Info("edge certificate issued", "org", org, "runner", id, "name", name, "not_after", cert.NotAfter)
	return connect.NewResponse(&controlplanev1.IssueEdgeCertificateResponse{
		CertificateChainPem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})),
	}), nil
}

func (g *Registration) IssueDataPlaneCertificate(ctx context.Context, req *connect.Request[controlplanev1.IssueDataPlaneCertificateRequest]) (*connect.Response[controlplanev1.IssueDataPlaneCertificateResponse], error) {
	s := g.s
	org, id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if s.dpCA == nil {
		return nil, apierr.New(apierr.RegistrationDisabled, "this control plane has no data-plane CA: runners cannot serve the direct data plane", nil)
	}
	var vs violations
	host := req.Msg.GetHost()
	if host == "" || len(host) > 253 || strings.Contains(host, "*") || strings.ContainsAny(host, "/:@ ") && net.ParseIP(host) == nil {
		vs.add("host", "must be the DNS name or IP address clients reach the data plane by, got %q", host)
	}
	csr := parseCSR(&vs, req.Msg.GetCsrPem())
	if err := vs.err("invalid data-plane certificate request"); err != nil {
		return nil, err
	}
	if err := s.checkIDHolder(ctx, org, id); err != nil {
		return nil, err
	}
	if err := s.checkDataPlaneHost(org, id, host); err != nil {
		return nil, err
	}
	dns, ips := pki.SplitHosts(nil, []string{host})
	cert, err := s.dpCA.SignCSR(csr, func(c *x509.Certificate) {
		c.Subject.CommonName = "sandboxd data plane of runner " + id
		c.Subject.Organization = []string{org}
		c.DNSNames, c.IPAddresses = dns, ips
		c.URIs = []*url.URL{RunnerURI(org, id)}
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}, EdgeCertTTL)
	if err != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, err.Error(), []apierr.Violation{{Field: "csr_pem", Description: err.Error()}})
	}
	s.log.Info("data-plane certificate issued", "org", org, "runner", id, "host", host, "not_after", cert.NotAfter)
	return connect.NewResponse(&controlplanev1.IssueDataPlaneCertificateResponse{
		CertificateChainPem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})),
		CaBundlePem:         string(s.dpCA.CertPEM()),
	}), nil
}

// checkDataPlaneHost refuses to certify host for the direct data plane of org's runner id
// unless the control plane assigns it to that runner. Clients trust the one data-plane
// CA for every runner and check only the host name, so a certificate for another host
// would let the runner pose as that host's data plane to every organization. A platform
// runner is the operator's, configured by the operator: any host. A tenant
// organization's runner only <id>.<base-domain> and names under it
// (pki.CheckTenantDataPlaneHost), which its unique runner ID makes its own.
func (s *Service) checkDataPlaneHost(org, id, host string) error {
	if org == s.platform {
		return s.checkPlatformDataPlaneHost(id, host)
	}
	why := pki.CheckTenantDataPlaneHost(host, id, s.domain)
	if why == nil {
		return nil
	}
	s.log.Warn("data-plane certificate refused: host not assigned to the runner", "org", org, "runner", id, "host", host, "err", why)
	return s.refuseDataPlaneHost(id, host, fmt.Sprintf("a tenant organization's runner is certified only for %s and names under it (set --data-plane-host to one)",
		pki.TenantDataPlaneHost(id, s.domain)), why.Error())
}

// refuseDataPlaneHost is the PERMISSION_DENIED of a data-plane host not certified for
// runner id: the message's reason, and why as the violation on host.
func (s *Service) refuseDataPlaneHost(id, host, reason, why string) error {
	return apierr.WithViolations(apierr.New(apierr.PermissionDenied,
		fmt.Sprintf("runner %s may not have a data-plane certificate for %q: %s", id, host, reason),
		map[string]string{"runner_id": id, "host": host, "allowed_host": pki.TenantDataPlaneHost(id, s.domain)}),
		[]apierr.Violation{{Field: "host", Description: why}})
}

// checkPlatformDataPlaneHost: a platform runner may be certified for any host, except a
// name in the base domain that a tenant's runner could be certified for too: under the
// base domain, only names under the runner's own ID or under a label with the reserved
// prefix (ReservedRunnerIDPrefix: no tenant runner has such an ID). Otherwise an
// operator's "dp.<base-domain>" would be the data-plane host of whichever tenant first
// created a runner named "dp".
func (s *Service) checkPlatformDataPlaneHost(id, host string) error {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if h != s.domain && !strings.HasSuffix(h, "."+s.domain) {
		return nil
	}
	if pki.CheckTenantDataPlaneHost(h, id, s.domain) == nil {
		return nil
	}
	labels := strings.Split(strings.TrimSuffix(h, s.domain), ".")
	if len(labels) >= 2 && strings.HasPrefix(labels[len(labels)-2], ReservedRunnerIDPrefix) {
		return nil // <...>.platform-x.<base-domain>
	}
	why := fmt.Sprintf("in the base domain %s a platform runner is certified only under its own ID (%s) or a label beginning %q, which no tenant's runner can be named", s.domain, pki.TenantDataPlaneHost(id, s.domain), ReservedRunnerIDPrefix)
	s.log.Warn("data-plane certificate refused: a platform runner's host in the base domain that a tenant's runner could hold", "runner", id, "host", host)
	return s.refuseDataPlaneHost(id, host, why, why)
}

func (g *Registration) VerifyApiKey(ctx context.Context, req *connect.Request[controlplanev1.VerifyApiKeyRequest]) (*connect.Response[controlplanev1.VerifyApiKeyResponse], error) {
	if _, _, err := caller(ctx); err != nil {
		return nil, err
	}
	p, err := g.s.auth.Authenticate(req.Msg.GetApiKey())
	if err != nil {
		return nil, apierr.New(apierr.Unauthenticated, "not a valid API key", nil)
	}
	return connect.NewResponse(&controlplanev1.VerifyApiKeyResponse{OrganizationId: p.Org, KeyId: p.KeyID}), nil
}

func (g *Registration) ApiKeyActive(ctx context.Context, req *connect.Request[controlplanev1.ApiKeyActiveRequest]) (*connect.Response[controlplanev1.ApiKeyActiveResponse], error) {
	if _, _, err := caller(ctx); err != nil {
		return nil, err
	}
	kc, ok := g.s.auth.(auth.KeyChecker)
	if !ok {
		return nil, apierr.New(apierr.NotImplemented, "this control plane's key store cannot check keys by ID", nil)
	}
	p, err := kc.KeyActive(req.Msg.GetKeyId())
	switch {
	case errors.Is(err, auth.ErrInvalidKey):
		return connect.NewResponse(&controlplanev1.ApiKeyActiveResponse{}), nil
	case err != nil:
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return connect.NewResponse(&controlplanev1.ApiKeyActiveResponse{Active: p.Org == req.Msg.GetOrganizationId()}), nil
}

func (g *Registration) Heartbeat(ctx context.Context, req *connect.Request[controlplanev1.HeartbeatRequest]) (*connect.Response[controlplanev1.HeartbeatResponse], error) {
	s := g.s
	org, id, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if want := req.Msg.GetRunnerId(); want != "" && want != id {
		s.log.Warn("heartbeat refused: certificate of another runner", "cert_runner", id, "runner", want)
		return nil, apierr.New(apierr.RunnerIdentityMismatch,
			fmt.Sprintf("the client certificate is runner %s's, not runner %s's", id, want), map[string]string{"runner_id": want})
	}
	var vs violations
	failedVersion, failure := checkSelfUpdateFailure(&vs, req.Msg.GetSelfUpdateFailedVersion(), req.Msg.GetSelfUpdateFailure())
	now := s.now().UTC()
	prepull := checkPrepull(&vs, req.Msg.GetPrepull(), now)
	if err := vs.err("invalid heartbeat"); err != nil {
		s.log.Warn("heartbeat refused", "org", org, "runner", id, "err", err)
		return nil, err
	}
	capacity, _ := json.Marshal(Resources{MilliCPU: req.Msg.GetCapacity().GetMilliCpu(), MemoryBytes: req.Msg.GetCapacity().GetMemoryBytes()})
	usage, _ := json.Marshal(Resources{MilliCPU: req.Msg.GetUsage().GetMilliCpu(), MemoryBytes: req.Msg.GetUsage().GetMemoryBytes(), Sandboxes: req.Msg.GetUsage().GetSandboxes()})
	if err := s.st.Runners().RecordHeartbeat(ctx, org, id, store.RunnerStatus{
		LastHeartbeatAt: &now, Version: req.Msg.GetVersion(), Ready: req.Msg.GetReady(), Capacity: capacity, Usage: usage,
		SelfUpdate: req.Msg.GetSelfUpdate(), SelfUpdateFailedVersion: failedVersion, SelfUpdateFailure: failure, Prepull: prepull,
	}); err != nil {
		return nil, runnerErr(id, "", err)
	}
	r, err := s.st.Runners().Get(ctx, org, id)
	if err != nil {
		return nil, runnerErr(id, "", err)
	}
	// An installed runner is told its desired version only once the update's re-apply of
	// its objects is done (UpdateStarted): else it would move its image alone, ahead of its
	// objects, or without them when the re-apply fails.
	desired := r.DesiredVersion
	if desired != "" && r.ClusterID != "" && s.reapplyPending(ctx, r) {
		desired = ""
	}
	// A runner that updates itself checks what it downloads against these.
	sum, agentSum := s.desiredChecksums(ctx, desired, req.Msg.GetArch())
	return connect.NewResponse(&controlplanev1.HeartbeatResponse{
		DesiredSandboxdSha256: sum,
		DesiredAgentSha256:    agentSum,
		PolicyJson:            string(r.Policy),
		PolicyRevision:        r.PolicyRevision,
		Etag:                  r.Etag,
		DesiredVersion:        desired,
		HeartbeatInterval:     durationpb.New(s.interval),
	}), nil
}

type tlsStateKey struct{}

// withTLSState makes the connection's TLS state available to the handlers.
func withTLSState(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil {
			r = r.WithContext(context.WithValue(r.Context(), tlsStateKey{}, r.TLS))
		}
		h.ServeHTTP(w, r)
	})
}

// RegistrationHandler serves RunnerRegistrationService (no API key: Register takes a
// bootstrap token, Heartbeat the runner's client certificate). Serve it over TLS from
// TLSConfig so Heartbeat sees the verified certificate.
func (s *Service) RegistrationHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(controlplanev1connect.NewRunnerRegistrationServiceHandler(s.Registration(), connect.WithReadMaxBytes(1<<20)))
	return withTLSState(mux)
}

// TLSHandler serves everything the control plane offers on one TLS listener: the
// registration service, the store proof gateways check (storeproof.go), and the admin
// services (API key) for every other path, behind the API's front (the key is checked from the headers before any body is read, bodies
// in flight are capped: issue 15 §2).
func (s *Service) TLSHandler() http.Handler {
	reg, admin, artifacts := s.RegistrationHandler(), s.adminFront(), s.ArtifactsHandler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == StoreProofPath {
			s.serveStoreProof(w, r)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/"+controlplanev1connect.RunnerRegistrationServiceName+"/") {
			reg.ServeHTTP(w, r)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/"+controlplanev1connect.RunnerReleaseServiceName+"/") {
			artifacts.ServeHTTP(w, r)
			return
		}
		admin.ServeHTTP(w, r)
	})
}

// TLSConfig is the control plane's listener configuration: a server certificate from ca
// for hosts (IPs or DNS names; "localhost" is always included) sent with the CA
// certificate (so a runner can check its bootstrap token's CA pin), renewed as it ages;
// client certificates from ca are verified when presented (runners) and not required
// (Register, admin calls with API keys).
func TLSConfig(ca *pki.CA, hosts []string) (*tls.Config, error) {
	dns, ips := pki.SplitHosts([]string{"localhost"}, hosts)
	get := pki.Renewing(func() (tls.Certificate, error) {
		c, err := ca.IssueServer("sandboxd control plane", dns, ips, 30*24*time.Hour)
		if err == nil {
			c.Certificate = append(c.Certificate, ca.Certificate().Raw)
		}
		return c, err
	})
	first, err := get()
	if err != nil {
		return nil, err
	}
	cfg := pki.ServerTLSConfig(*first, ca.Pool(), false)
	cfg.Certificates = nil
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return get() }
	return cfg, nil
}

// adminFront is Handler behind an apifront.Front authenticating with the control plane's
// keys.
func (s *Service) adminFront() http.Handler {
	var svcs []protoreflect.ServiceDescriptor
	f := controlplanev1.File_sandboxd_controlplane_v1_controlplane_proto
	for i := range f.Services().Len() {
		svcs = append(svcs, f.Services().Get(i))
	}
	routes, err := apifront.Routes(svcs...)
	if err != nil {
		panic(fmt.Sprintf("controlplane: REST routes: %v", err)) // compiled-in annotations
	}
	return apifront.New(s.Handler(), apifront.Config{Auth: s.auth, MaxMessageBytes: 4 << 20,
		MaxBodyBytesInFlight: 64 << 20, Routes: routes, Logger: s.log})
}
