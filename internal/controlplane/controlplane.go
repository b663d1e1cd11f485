// Package controlplane serves sandboxd.controlplane.v1 over the store: managed runners with
// their policy (RunnerManagementService), API keys (ApiKeyService) and the runner releases
// each release channel offers (ReleaseService). Every call needs an
// API key with role SANDBOX_ADMIN and acts on that key's organization; releases are
// platform-wide, and only the platform organization's admins may change them. It also keeps the
// pieces `sandboxd dev` builds on: first-start bootstrap (organization, admin key, local
// runner), runner heartbeats into the store, and the store-backed policy source the
// gateway reads.
package controlplane

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/vanguard"
	"google.golang.org/protobuf/reflect/protoreflect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apifront"
	"github.com/sandboxd/sandboxd/internal/audit"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/rollout"
	"github.com/sandboxd/sandboxd/internal/store"
)

// DefaultHeartbeatInterval is how often runners heartbeat; a runner is CONNECTED while its
// last heartbeat is within three intervals.
const DefaultHeartbeatInterval = 5 * time.Second

// LiveSandboxCounter says how many live sandboxes a runner owns.
type LiveSandboxCounter func(ctx context.Context, org, runnerID string) (int, error)

// Config configures a Service.
type Config struct {
	Store store.Store
	Auth  auth.Authenticator
	// PlatformOrg is the platform operator's organization (the one the control plane
	// bootstraps, with its first admin key). Releases are platform-wide, so only its
	// admins may publish and promote them; required.
	PlatformOrg string
	// HeartbeatInterval is the runners' heartbeat interval; default 5 s.
	HeartbeatInterval time.Duration
	// TargetVersions maps a release channel (store.ChannelStable, store.ChannelRapid) to
	// the runner version it offers while the store has no release records; once it has
	// any, the channels offer what the records say (ReleaseService). A channel without one
	// offers no update.
	TargetVersions map[string]string
	// LiveSandboxes counts a runner's live sandboxes for Delete; default: the store's
	// sandbox index (records not yet ended).
	LiveSandboxes LiveSandboxCounter
	Logger        *slog.Logger
	// CA signs runner certificates at registration; nil disables CreateBootstrapToken and
	// RunnerRegistrationService.Register.
	CA *pki.CA
	// RunnerCertTTL is the lifetime of registered runners' certificates; default
	// DefaultRunnerCertTTL.
	RunnerCertTTL time.Duration
	// EndpointDomain is the platform's base domain of public endpoints
	// (<port>-<sandbox>.<runner>.<EndpointDomain>); runners' edge certificates are issued
	// for it only. Default DefaultEndpointDomain.
	EndpointDomain string
	// DataPlaneCA signs runners' data-plane server certificates (the CA the gateways
	// issue client certificates from); nil: runners cannot ask for one.
	DataPlaneCA *pki.CA
	// ReleaseKeys are the Ed25519 public keys the platform's release manifests are signed
	// with (sandboxd --release-keys). With any, PublishRelease accepts only a signed
	// release manifest that one of them verifies, so a stolen admin key alone cannot
	// point runners at other images; without, it accepts only records.
	ReleaseKeys []ed25519.PublicKey
	// ClusterKey seals registered clusters' credentials (AES-256-GCM; 32 bytes, e.g.
	// pki.LoadOrCreateSecret of PKI-DIR/ClusterKeyFile); nil: ClusterService refuses to add
	// clusters (CWSANDBOX_CLUSTERS_DISABLED) and runners are never installed.
	ClusterKey []byte
	// Install configures the runners the control plane installs into registered clusters.
	Install InstallConfig
	// Now is the clock; default time.Now.
	Now func() time.Time
	// UpdateDeadline is how long a runner told to update by ApplyAvailableUpdate has to
	// report the new version and ready before it is rolled back (the automatic rollout's
	// health gate, which internal/rollout runs); default rollout.DefaultDeadline.
	UpdateDeadline time.Duration
	// ReleaseDir holds the binaries of published releases, DIR/<version>/<goarch>/
	// {sandboxd,sandbox-agent}, which RunnerReleaseService serves to runners that update
	// themselves; "" serves none.
	ReleaseDir string
}

// DefaultEndpointDomain: *.localhost names resolve to loopback, so a platform on one
// machine needs no DNS.
const DefaultEndpointDomain = pki.DefaultBaseDomain

// EdgeCertTTL is the lifetime of a runner's edge certificate; runners renew it at half.
const EdgeCertTTL = 7 * 24 * time.Hour

// Service implements RunnerManagementService, ApiKeyService, ReleaseService,
// RolloutService and ClusterService.
type Service struct {
	controlplanev1connect.UnimplementedRunnerManagementServiceHandler
	controlplanev1connect.UnimplementedApiKeyServiceHandler
	controlplanev1connect.UnimplementedReleaseServiceHandler
	controlplanev1connect.UnimplementedRolloutServiceHandler
	controlplanev1connect.UnimplementedClusterServiceHandler

	st       store.Store
	auth     auth.Authenticator
	platform string
	interval time.Duration
	targets  map[string]string
	live     LiveSandboxCounter
	log      *slog.Logger
	now      func() time.Time
	ca       *pki.CA
	certTTL  time.Duration
	domain   string
	dpCA     *pki.CA
	relKeys  []ed25519.PublicKey
	deadline time.Duration
	// releaseDir: Config.ReleaseDir.
	releaseDir string
	// downloads counts each runner's release downloads in flight (DownloadArtifact).
	downloads downloadSlots
	sealer    *Sealer
	inst      *installer
	audit     *audit.Recorder
	storeID   string // the store's identity, read by New (storeproof.go)
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil {
		return nil, errors.New("controlplane: no store")
	}
	if cfg.Auth == nil {
		return nil, errors.New("controlplane: no authenticator")
	}
	if cfg.PlatformOrg == "" {
		return nil, errors.New("controlplane: no platform organization")
	}
	s := &Service{st: cfg.Store, auth: cfg.Auth, platform: cfg.PlatformOrg, interval: cfg.HeartbeatInterval, targets: cfg.TargetVersions,
		live: cfg.LiveSandboxes, log: cfg.Logger, now: cfg.Now, ca: cfg.CA, certTTL: cfg.RunnerCertTTL, domain: cfg.EndpointDomain, dpCA: cfg.DataPlaneCA,
		relKeys: slices.Clone(cfg.ReleaseKeys), deadline: cfg.UpdateDeadline, releaseDir: cfg.ReleaseDir}
	if s.deadline <= 0 {
		s.deadline = rollout.DefaultDeadline
	}
	for i, k := range s.relKeys {
		if len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("controlplane: release key %d is %d bytes, not an Ed25519 public key", i, len(k))
		}
	}
	if cfg.ClusterKey != nil {
		sl, err := NewSealer(cfg.ClusterKey)
		if err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
		s.sealer = sl
	}
	id, err := readStoreIdentity(s.st)
	if err != nil {
		return nil, err
	}
	s.storeID = id
	s.inst = newInstaller(s, cfg.Install)
	// Every admin write is recorded in the store's audit log (internal/audit); the
	// gateway prunes it (--audit-retention).
	s.audit = audit.NewRecorder(cfg.Store.Audit(), audit.Options{Logger: cfg.Logger, PlatformOrg: cfg.PlatformOrg})
	if s.domain == "" {
		s.domain = DefaultEndpointDomain
	}
	if err := pki.CheckBaseDomain(s.domain); err != nil {
		return nil, fmt.Errorf("controlplane: endpoint domain: %w", err)
	}
	if s.certTTL <= 0 {
		s.certTTL = DefaultRunnerCertTTL
	}
	if s.interval <= 0 {
		s.interval = DefaultHeartbeatInterval
	}
	if s.live == nil {
		s.live = StoreLiveSandboxes(cfg.Store)
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// StoreLiveSandboxes counts the runner's records in the store's sandbox index that have
// not ended.
func StoreLiveSandboxes(st store.Store) LiveSandboxCounter {
	return func(ctx context.Context, org, runnerID string) (int, error) {
		n := 0
		page := store.Page{Size: store.MaxPageSize}
		for {
			sbs, next, err := st.Sandboxes().List(ctx, org, store.SandboxFilter{RunnerIDs: []string{runnerID}}, page)
			if err != nil {
				return 0, err
			}
			n += len(sbs)
			if next == "" {
				return n, nil
			}
			page.Token = next
		}
	}
}

// AdminServices are the services Handler serves.
func AdminServices() []protoreflect.ServiceDescriptor {
	f := controlplanev1.File_sandboxd_controlplane_v1_controlplane_proto
	return []protoreflect.ServiceDescriptor{f.Services().ByName("RunnerManagementService"), f.Services().ByName("ApiKeyService"),
		f.Services().ByName("ReleaseService"), f.Services().ByName("RolloutService"), f.Services().ByName("ClusterService")}
}

// Handler serves the admin services over gRPC, gRPC-Web, Connect and REST/JSON (by their
// google.api.http annotations), requiring an admin key on every call.
func (s *Service) Handler() http.Handler {
	opts := []connect.HandlerOption{
		connect.WithInterceptors(s.audit.Interceptor(), auth.Interceptor{Auth: s.auth, Require: auth.RoleAdmin}, apifront.NotImplemented{}, apifront.PathVars{}, apifront.Enums{}),
		connect.WithReadMaxBytes(4 << 20),
	}
	t, err := vanguard.NewTranscoder([]*vanguard.Service{
		vanguard.NewService(controlplanev1connect.NewRunnerManagementServiceHandler(s, opts...)),
		vanguard.NewService(controlplanev1connect.NewApiKeyServiceHandler(s, opts...)),
		vanguard.NewService(controlplanev1connect.NewReleaseServiceHandler(s, opts...)),
		vanguard.NewService(controlplanev1connect.NewRolloutServiceHandler(s, opts...)),
		vanguard.NewService(controlplanev1connect.NewClusterServiceHandler(s, opts...)),
	}, apifront.TranscoderOptions()...)
	if err != nil {
		// The services and their annotations are compiled in: a programming error.
		panic(fmt.Sprintf("controlplane: REST transcoding: %v", err))
	}
	return t
}

// Route sends control-plane calls (gRPC/Connect paths /sandboxd.controlplane.v1.… and
// REST paths under /v1/sandbox/) to controlPlane and everything else to gateway, so both
// share one port.
func Route(controlPlane, gateway http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if strings.HasPrefix(p, "/sandboxd.controlplane.v1.") || strings.HasPrefix(p, "/v1/sandbox/") {
			controlPlane.ServeHTTP(w, r)
			return
		}
		gateway.ServeHTTP(w, r)
	})
}

func principal(ctx context.Context) auth.Principal {
	p, _ := auth.FromContext(ctx)
	return p
}
