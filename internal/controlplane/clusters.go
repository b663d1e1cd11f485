package controlplane

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"unicode"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Clusters are platform infrastructure: a credential that can create namespaces and RBAC in
// a cluster is the platform operator's, so only the platform organization's admins manage
// them (requirePlatformAdmin), and no call ever returns a credential. The store holds the
// credential sealed with AES-256-GCM under a key the control plane keeps in its PKI
// directory, with the cluster_id as additional data (a sealed credential copied onto
// another cluster's row does not open).

// Bounds of a cluster's credential.
const (
	MaxKubeconfig = 64 << 10
	MaxToken      = 8 << 10
	MaxCAPEM      = 64 << 10
	maxServerURL  = 2048
)

// ClusterKeyFile is the cluster-credential key's file in the PKI directory.
const ClusterKeyFile = "cluster-credentials.key"

// ClusterCredential is a cluster's credential as it is sealed (JSON). Exactly one of
// Kubeconfig and Token is set.
type ClusterCredential struct {
	Server     string `json:"server"`
	Kubeconfig string `json:"kubeconfig,omitempty"`
	Token      string `json:"token,omitempty"`
	CAPEM      string `json:"ca_pem,omitempty"`
}

// Sealer seals and opens cluster credentials (AES-256-GCM).
type Sealer struct{ aead cipher.AEAD }

// NewSealer returns a Sealer for a 32-byte key (pki.LoadOrCreateSecret makes one).
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) < 32 {
		return nil, fmt.Errorf("cluster key: %d bytes, want 32", len(key))
	}
	b, err := aes.NewCipher(key[:32])
	if err != nil {
		return nil, err
	}
	a, err := cipher.NewGCM(b)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: a}, nil
}

// Seal encrypts c for clusterID: nonce || ciphertext.
func (s *Sealer) Seal(clusterID string, c ClusterCredential) ([]byte, error) {
	plain, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, s.aead.NonceSize())
	_, _ = rand.Read(nonce) // never fails (crypto/rand)
	return s.aead.Seal(nonce, nonce, plain, []byte(clusterID)), nil
}

// Open decrypts what Seal made for clusterID.
func (s *Sealer) Open(clusterID string, sealed []byte) (ClusterCredential, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return ClusterCredential{}, errors.New("sealed credential too short")
	}
	plain, err := s.aead.Open(nil, sealed[:n], sealed[n:], []byte(clusterID))
	if err != nil {
		return ClusterCredential{}, fmt.Errorf("open the credential of cluster %s (another cluster key?): %w", clusterID, err)
	}
	var c ClusterCredential
	if err := json.Unmarshal(plain, &c); err != nil {
		return ClusterCredential{}, err
	}
	return c, nil
}

// checkServer accepts an https URL of a host (and port, path) only.
func checkServer(s string) error {
	if len(s) > maxServerURL {
		return fmt.Errorf("must be at most %d bytes", maxServerURL)
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("is not a URL: %w", err)
	case u.Scheme != "https":
		return fmt.Errorf("must be an https:// URL (got scheme %q): the credential must not travel in the clear", u.Scheme)
	case u.Host == "" || u.Hostname() == "":
		return errors.New("must name a host")
	case u.User != nil:
		return errors.New("must not carry user information")
	case u.RawQuery != "" || u.Fragment != "":
		return errors.New("must not have a query or fragment")
	}
	return nil
}

func checkCAPEM(s string) error {
	if len(s) > MaxCAPEM {
		return fmt.Errorf("must be at most %d bytes (got %d)", MaxCAPEM, len(s))
	}
	rest, n := []byte(s), 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return fmt.Errorf("has a PEM block of type %q: want CERTIFICATE only", b.Type)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("certificate %d: %w", n+1, err)
		}
		n++
	}
	if n == 0 {
		return errors.New("has no PEM CERTIFICATE")
	}
	if strings.TrimSpace(string(rest)) != "" {
		return errors.New("has data that is not PEM after the certificates")
	}
	return nil
}

// checkToken: a bearer token is printable ASCII without spaces (it goes in a header).
func checkToken(t string) error {
	if len(t) > MaxToken {
		return fmt.Errorf("must be at most %d bytes (got %d)", MaxToken, len(t))
	}
	for _, r := range t {
		if r > unicode.MaxASCII || r <= ' ' || r == 0x7f {
			return errors.New("must be printable ASCII without spaces")
		}
	}
	return nil
}

// ParseKubeconfig parses a kubeconfig with client-go and checks that its current context
// authenticates with inline data only: a kubeconfig that names files, runs an exec plugin
// or uses an auth provider would make the control plane read its own files or run
// commands. It returns the current context's server.
func ParseKubeconfig(b []byte) (string, *rest.Config, error) {
	if len(b) > MaxKubeconfig {
		return "", nil, fmt.Errorf("must be at most %d bytes (got %d)", MaxKubeconfig, len(b))
	}
	cfg, err := clientcmd.Load(b)
	if err != nil {
		return "", nil, fmt.Errorf("is not a kubeconfig: %w", err)
	}
	cur := cfg.CurrentContext
	ctx, ok := cfg.Contexts[cur]
	if cur == "" || !ok || ctx == nil {
		return "", nil, fmt.Errorf("has no current context (current-context %q)", cur)
	}
	cl, ok := cfg.Clusters[ctx.Cluster]
	if !ok || cl == nil {
		return "", nil, fmt.Errorf("context %q names cluster %q, which it does not define", cur, ctx.Cluster)
	}
	user, ok := cfg.AuthInfos[ctx.AuthInfo]
	if !ok || user == nil {
		return "", nil, fmt.Errorf("context %q names user %q, which it does not define", cur, ctx.AuthInfo)
	}
	switch {
	case cl.CertificateAuthority != "":
		return "", nil, errors.New("cluster certificate-authority names a file: inline it as certificate-authority-data")
	case cl.InsecureSkipTLSVerify:
		return "", nil, errors.New("cluster insecure-skip-tls-verify is not allowed: give certificate-authority-data")
	case cl.ProxyURL != "":
		return "", nil, errors.New("cluster proxy-url is not allowed")
	case user.Exec != nil:
		return "", nil, errors.New("user exec plugins are not allowed: use a token or client certificate")
	case user.AuthProvider != nil:
		return "", nil, errors.New("user auth-provider is not allowed: use a token or client certificate")
	case user.TokenFile != "" || user.ClientCertificate != "" || user.ClientKey != "":
		return "", nil, errors.New("user token-file, client-certificate and client-key name files: inline them (token, client-certificate-data, client-key-data)")
	case user.Token == "" && len(user.ClientCertificateData) == 0 && user.Username == "":
		return "", nil, errors.New("user has no credential (token, client-certificate-data or username)")
	}
	if err := checkServer(cl.Server); err != nil {
		return "", nil, fmt.Errorf("cluster server %w", err)
	}
	rc, err := clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return "", nil, fmt.Errorf("cannot be used: %w", err)
	}
	return cl.Server, rc, nil
}

// RESTConfig is the client configuration c authenticates with.
func (c ClusterCredential) RESTConfig() (*rest.Config, error) {
	if c.Kubeconfig != "" {
		_, rc, err := ParseKubeconfig([]byte(c.Kubeconfig))
		return rc, err
	}
	return &rest.Config{Host: c.Server, BearerToken: c.Token, TLSClientConfig: rest.TLSClientConfig{CAData: []byte(c.CAPEM)}}, nil
}

// ValidateCluster checks a cluster to add and returns its credential (in the clear).
func ValidateCluster(c *controlplanev1.Cluster) (ClusterCredential, error) {
	var vs violations
	if c == nil {
		vs.add("cluster", "is required")
		return ClusterCredential{}, vs.err("cluster is required")
	}
	switch id := c.GetClusterId(); {
	case id == "":
		vs.add("cluster.cluster_id", "is required")
	case !clusterIDPattern.MatchString(id):
		vs.add("cluster.cluster_id", "must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
	if o := c.GetOrganizationId(); o != "" && len(o) > 128 {
		vs.add("cluster.organization_id", "must be at most 128 bytes")
	}
	if c.GetCredentialKind() != controlplanev1.ClusterCredentialKind_CLUSTER_CREDENTIAL_KIND_UNSPECIFIED {
		vs.add("cluster.credential_kind", "is output only: it follows from kubeconfig or token")
	}
	if c.GetCreateTime() != nil {
		vs.add("cluster.create_time", "is output only")
	}
	cred := ClusterCredential{Server: c.GetServer()}
	switch kc, tok := c.GetKubeconfig(), c.GetToken(); {
	case kc != "" && tok != "":
		vs.add("cluster.token", "give a kubeconfig or a token, not both")
	case kc != "":
		if c.GetCaPem() != "" {
			vs.add("cluster.ca_pem", "goes with a token; a kubeconfig carries its own certificate-authority-data")
		}
		server, _, err := ParseKubeconfig([]byte(kc))
		if err != nil {
			vs.add("cluster.kubeconfig", "%v", err)
			break
		}
		if cred.Server != "" && cred.Server != server {
			vs.add("cluster.server", "is %q but the kubeconfig's current context names %q", cred.Server, server)
		}
		cred.Server, cred.Kubeconfig = server, kc
	case tok != "":
		if err := checkToken(tok); err != nil {
			vs.add("cluster.token", "%v", err)
		}
		if c.GetServer() == "" {
			vs.add("cluster.server", "is required with a token")
		} else if err := checkServer(c.GetServer()); err != nil {
			vs.add("cluster.server", "%v", err)
		}
		if c.GetCaPem() == "" {
			vs.add("cluster.ca_pem", "is required with a token: the API server's CA certificate")
		} else if err := checkCAPEM(c.GetCaPem()); err != nil {
			vs.add("cluster.ca_pem", "%v", err)
		}
		cred.Token, cred.CAPEM = tok, c.GetCaPem()
	default:
		vs.add("cluster.kubeconfig", "a credential is required: kubeconfig, or token with server and ca_pem")
	}
	if err := vs.err("invalid cluster"); err != nil {
		return ClusterCredential{}, err
	}
	return cred, nil
}

func clusterProto(c store.Cluster) *controlplanev1.Cluster {
	out := &controlplanev1.Cluster{ClusterId: c.ClusterID, Server: c.Server, OrganizationId: c.Org,
		CreateTime: timestamppb.New(c.CreatedAt), CredentialKind: controlplanev1.ClusterCredentialKind_CLUSTER_CREDENTIAL_KIND_SERVICE_ACCOUNT_TOKEN}
	if c.CredentialKind == store.CredentialKubeconfig {
		out.CredentialKind = controlplanev1.ClusterCredentialKind_CLUSTER_CREDENTIAL_KIND_KUBECONFIG
	}
	return out
}

func (s *Service) clustersEnabled() error {
	if s.sealer == nil {
		return apierr.New(apierr.ClustersDisabled,
			"this control plane keeps no cluster-credential key (Config.ClusterKey): clusters cannot be registered", nil)
	}
	return nil
}

func checkClusterIDArg(id string) error {
	var vs violations
	if !clusterIDPattern.MatchString(id) {
		vs.add("cluster_id", "must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
	return vs.err("invalid cluster_id")
}

func clusterErr(id string, err error) error {
	meta := map[string]string{"cluster_id": id}
	var inUse *store.ClusterInUseError
	switch {
	case errors.As(err, &inUse):
		return apierr.New(apierr.ClusterInUse,
			fmt.Sprintf("cluster %s is named by runner(s) %s: delete them first (that uninstalls what the control plane installed)",
				id, strings.Join(inUse.RunnerIDs, ", ")), meta)
	case errors.Is(err, store.ErrAlreadyExists):
		return apierr.New(apierr.AlreadyExists, fmt.Sprintf("cluster %s is registered already", id), meta)
	case errors.Is(err, store.ErrNotFound):
		return apierr.New(apierr.ClusterNotFound, fmt.Sprintf("cluster %s not found", id), meta)
	}
	return storeErr(err)
}

func (s *Service) AddCluster(ctx context.Context, req *connect.Request[controlplanev1.AddClusterRequest]) (*connect.Response[controlplanev1.Cluster], error) {
	if err := s.requirePlatformAdmin(ctx, "AddCluster"); err != nil {
		return nil, err
	}
	if err := s.clustersEnabled(); err != nil {
		return nil, err
	}
	c := req.Msg.GetCluster()
	cred, err := ValidateCluster(c)
	if err != nil {
		return nil, err
	}
	org := c.GetOrganizationId()
	if org == "" {
		org = s.platform
	}
	if _, err := s.st.Orgs().Get(ctx, org); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			var vs violations
			vs.add("cluster.organization_id", "no organization %q", org)
			return nil, vs.err("invalid cluster")
		}
		return nil, storeErr(err)
	}
	if err := s.checkServerUnshared(ctx, cred.Server, org); err != nil {
		return nil, err
	}
	sealed, err := s.sealer.Seal(c.GetClusterId(), cred)
	if err != nil {
		return nil, apierr.Newf(apierr.ControlPlaneUnavailable, "seal the credential: %v", err)
	}
	kind := store.CredentialToken
	if cred.Kubeconfig != "" {
		kind = store.CredentialKubeconfig
	}
	out, err := s.st.Clusters().Create(ctx, store.Cluster{ClusterID: c.GetClusterId(), Org: org, Server: cred.Server,
		CredentialKind: kind, Credential: sealed})
	if err != nil {
		return nil, clusterErr(c.GetClusterId(), err)
	}
	p := principal(ctx)
	s.log.Info("cluster added", "cluster", out.ClusterID, "server", out.Server, "credential", kind, "for_org", org, "org", p.Org, "key", p.KeyID)
	return connect.NewResponse(clusterProto(out)), nil
}

// checkServerUnshared refuses a cluster whose API server another organization registered:
// runners of two organizations in one cluster share its nodes and its RBAC administrator,
// which isolation between organizations must not. (A cluster reached by two different
// URLs is not recognized; the install's namespaces are per organization and labelled, so
// even then one organization's install cannot apply over or delete the other's.) The
// same organization may register a server twice (e.g. with two credentials).
func (s *Service) checkServerUnshared(ctx context.Context, server, org string) error {
	cs, err := s.st.Clusters().List(ctx)
	if err != nil {
		return storeErr(err)
	}
	key := serverKey(server)
	for _, c := range cs {
		if c.Org != org && serverKey(c.Server) == key {
			msg := fmt.Sprintf("server %s is registered to another organization as cluster %s", server, c.ClusterID)
			return apierr.WithViolations(apierr.New(apierr.ClusterServerShared,
				"cluster: "+msg+": a cluster is registered to one organization only (organizations must not share one)",
				map[string]string{"server": server, "cluster_id": c.ClusterID}),
				[]apierr.Violation{{Field: "cluster.server", Description: msg}})
		}
	}
	return nil
}

// serverKey is server as compared by checkServerUnshared: scheme and host are case-blind,
// a default port and a trailing "/" change nothing.
func serverKey(server string) string {
	u, err := url.Parse(server)
	if err != nil {
		return server
	}
	host := strings.ToLower(u.Hostname())
	if p := u.Port(); p != "" && p != "443" {
		host = net.JoinHostPort(host, p)
	} else if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return strings.ToLower(u.Scheme) + "://" + host + strings.TrimRight(u.EscapedPath(), "/")
}

func (s *Service) ListClusters(ctx context.Context, _ *connect.Request[controlplanev1.ListClustersRequest]) (*connect.Response[controlplanev1.ListClustersResponse], error) {
	if err := s.requirePlatformAdmin(ctx, "ListClusters"); err != nil {
		return nil, err
	}
	cs, err := s.st.Clusters().List(ctx)
	if err != nil {
		return nil, storeErr(err)
	}
	out := &controlplanev1.ListClustersResponse{}
	for _, c := range cs {
		out.Clusters = append(out.Clusters, clusterProto(c))
	}
	return connect.NewResponse(out), nil
}

func (s *Service) GetCluster(ctx context.Context, req *connect.Request[controlplanev1.GetClusterRequest]) (*connect.Response[controlplanev1.Cluster], error) {
	if err := s.requirePlatformAdmin(ctx, "GetCluster"); err != nil {
		return nil, err
	}
	id := req.Msg.GetClusterId()
	if err := checkClusterIDArg(id); err != nil {
		return nil, err
	}
	c, err := s.st.Clusters().Get(ctx, id)
	if err != nil {
		return nil, clusterErr(id, err)
	}
	return connect.NewResponse(clusterProto(c)), nil
}

func (s *Service) DeleteCluster(ctx context.Context, req *connect.Request[controlplanev1.DeleteClusterRequest]) (*connect.Response[emptypb.Empty], error) {
	if err := s.requirePlatformAdmin(ctx, "DeleteCluster"); err != nil {
		return nil, err
	}
	id := req.Msg.GetClusterId()
	if err := checkClusterIDArg(id); err != nil {
		return nil, err
	}
	if err := s.st.Clusters().Delete(ctx, id); err != nil {
		return nil, clusterErr(id, err)
	}
	p := principal(ctx)
	s.log.Info("cluster deleted", "cluster", id, "org", p.Org, "key", p.KeyID)
	return connect.NewResponse(&emptypb.Empty{}), nil
}
