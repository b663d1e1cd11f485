// Package gateway serves the public coreweave.sandbox.v1 API: it authenticates every call,
// scopes sandboxes to their organization, places new sandboxes on a runner, keeps the
// sandbox index, and relays exec, files and logs to the runner that owns a sandbox.
package gateway

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/vanguard"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	auditv1 "github.com/sandboxd/sandboxd/gen/sandboxd/audit/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/audit/v1/auditv1connect"
	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/build/v1/buildv1connect"
	quotav1 "github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/quota/v1/quotav1connect"
	statev1 "github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/sandbox/v1/statev1connect"
	settingsv1 "github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/settings/v1/settingsv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/apifront"
	"github.com/sandboxd/sandboxd/internal/audit"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobconfig"
	"github.com/sandboxd/sandboxd/internal/health"
	"github.com/sandboxd/sandboxd/internal/metrics"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/placement"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/relay"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/spec"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/tracing"
)

// Limits of the public API (the message size and the data RPCs' are the relay's:
// relay.MaxMessageBytes …).
const (
	maxGracePeriod  = 300 * time.Second
	defaultPageSize = 100
	maxPageSize     = 1000
)

// Authenticator checks an API key.
type Authenticator = auth.Authenticator

// Config configures a Server.
type Config struct {
	Auth    Authenticator
	Runners []runner.Handle
	// PlatformOrg is the platform operator's organization: a runner whose certificate
	// names it (runner.OwnedHandle) is a platform runner and serves every organization.
	// A runner that names another organization serves that one only (owner.go). Empty
	// with remote runners: New warns (warnNoPlatformOrg); a runner registered to the
	// platform's organization then serves that organization only.
	PlatformOrg string
	// Policies gives each runner's policy; nil means every runner has the empty policy.
	Policies policy.Source
	// Index keeps the sandbox index across restarts (with Orgs to load it); nil keeps it
	// in memory only.
	Index IndexStore
	Orgs  OrgLister
	// ReconcileInterval > 0 runs Reconcile that often (needs Index); OrphanGrace is how old
	// an unknown sandbox must be before it is deleted (0 = DefaultOrphanGrace, < 0 never).
	ReconcileInterval time.Duration
	OrphanGrace       time.Duration
	// Retention is how long ended sandboxes stay readable; default 1 h.
	Retention time.Duration
	// ViewInterval is how often the runners are probed for capacity, usage and policy
	// (default DefaultViewInterval); DisconnectAfter how long a runner whose probes time
	// out stays placeable (default DefaultDisconnectAfter).
	ViewInterval, DisconnectAfter time.Duration
	// WarmInterval is how often the templates' warm pools are re-sent to the runners
	// (warm.go); 0: DefaultWarmInterval.
	WarmInterval time.Duration
	// DataPlane signs the client certificates of the direct data path (ConnectSandbox);
	// nil: ConnectSandbox is UNIMPLEMENTED and clients use the gateway's data RPCs.
	DataPlane DataPlaneIssuer
	// BaseDomain is the base domain runners are named under (the control plane's
	// --base-domain); default pki.DefaultBaseDomain. ConnectSandbox hands a client the
	// direct address of a tenant organization's runner only when its host is
	// <runner_id>.<BaseDomain> or a name under it (pki.CheckTenantDataPlaneHost), the
	// hosts the control plane certifies for it.
	BaseDomain string
	// ShareTokenKey derives the endpoint share tokens of SHARE_TOKEN endpoints (see
	// sharetoken.go). Every gateway replica needs the same key, kept across restarts, so
	// that a replayed create returns the same token; empty: a random key per process.
	ShareTokenKey []byte
	// Snapshots keeps the file-system snapshot index (with Blobs, where the runners put
	// the archives, and SnapshotBucket, the object_bucket snapshots report); without
	// both Snapshots and Blobs the snapshot RPCs answer CWSANDBOX_FSS_NOT_SUPPORTED.
	Snapshots      SnapshotStore
	Blobs          blob.Store
	SnapshotBucket string
	// BlobConfig is what Blobs was opened from (optional): with an S3 store, snapshots in
	// an organization's own bucket are checked and deleted there, reached with the same
	// endpoint and credentials (blobconfig.Buckets).
	BlobConfig blobconfig.Config
	// FSS configures snapshot limits, the snapshot garbage collector and the
	// organizations' snapshot buckets (settings_fss.go).
	FSS FSSOptions
	// Templates keeps the organizations' sandbox templates (templates.go); nil: the
	// template RPCs and CreateSandboxFromTemplate answer CWSANDBOX_NOT_IMPLEMENTED.
	Templates store.Templates
	// Volumes keeps the organizations' registered volumes (volumes.go); nil: VolumeService
	// and sandboxes mounting a volume_id answer CWSANDBOX_NOT_IMPLEMENTED.
	Volumes store.Volumes
	Logger  *slog.Logger
	// RegistryCredentials, when set, gives pull credentials (minted per create, for org)
	// for an image of the platform registry, ok false for any other image
	// (registry.Registry.PullCredentials; registrycreds.go).
	RegistryCredentials func(org, image string) (username, password string, ok bool)
	// Builds configures image builds (sandboxd.build.v1.BuildService, buildsvc.go); its
	// zero value answers CWSANDBOX_NOT_IMPLEMENTED.
	Builds BuildOptions
	// Quota enforces per-organization quotas (quota.go); its zero value enforces none.
	Quota QuotaOptions
	// TrustedProxies are the peers whose X-Forwarded-For names the caller, for the
	// runners' source-IP allowlists (sourceip.go); none by default: the TCP peer is the
	// caller.
	TrustedProxies []netip.Prefix
	// Secrets configures the built-in secret stores (secrets.go); its zero value answers
	// CWSANDBOX_NOT_IMPLEMENTED.
	Secrets SecretOptions
	// Audit keeps the audit log (internal/audit, docs/audit.md); its zero value keeps
	// none (AuditService answers CWSANDBOX_NOT_IMPLEMENTED).
	Audit AuditOptions
	// Health sets when runners whose creates keep failing are degraded and quarantined
	// (internal/health, health.go); its zero value is the defaults.
	Health health.Config
	// healthClock is the health tracker's clock (tests; nil: time.Now).
	healthClock func() time.Time
	// probeJudgeFor and probeJudgeEvery override ProbeJudgeFor and probeJudgePoll (tests).
	probeJudgeFor, probeJudgeEvery time.Duration
	// maxDetached overrides maxDetachedCreates (tests).
	maxDetached int
	// StartWait bounds how a GetSandbox of a young starting sandbox waits for it to
	// start (startwait.go); the zero value is the defaults.
	StartWait StartWaitOptions
}

// AuditOptions configure the audit log.
type AuditOptions struct {
	// Store holds the events (nil: no audit log).
	Store store.Audit
	// Config: retention (0: audit.DefaultRetention) and pruning.
	Config audit.Config
	// PlatformOrg is the organization whose admins read every organization's events.
	PlatformOrg string
}

// Server implements the coreweave.sandbox.v1 services of Services. The RPCs sandboxd
// does not build yet are the embedded generated stubs, which answer UNIMPLEMENTED (with
// reason CWSANDBOX_NOT_IMPLEMENTED: apifront.NotImplemented): all of VolumeService and
// SettingsService but its file-system snapshot bucket config (settings_fss.go).
// Building one is defining its method on Server
// (SandboxTemplateService and CreateSandboxFromTemplate: templates.go).
type Server struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler
	sandboxv1connect.UnimplementedDiscoveryServiceHandler
	sandboxv1connect.UnimplementedSandboxTemplateServiceHandler
	sandboxv1connect.UnimplementedSettingsServiceHandler

	auth     Authenticator
	runners  []runner.Handle
	policies policy.Source
	// platformOrg: see Config.PlatformOrg.
	platformOrg string
	// orphanGrace: see Config.OrphanGrace.
	orphanGrace time.Duration
	index       *index
	retention   time.Duration
	log         *slog.Logger
	// reserved holds the resources of creates in flight until their runner answers.
	reserved placement.Reservations
	// sandboxOps serializes resumes and forks of one sandbox (a resume may move it).
	sandboxOps sandboxLocks
	views      *runnerViews
	stop       context.CancelFunc
	warmPoke   chan struct{} // warm.go
	// dataPlane: see Config.DataPlane.
	dataPlane   DataPlaneIssuer
	baseDomain  string // Config.BaseDomain
	shareTokens shareTokens
	// fss: see Config.FSS (Limits with defaults).
	fss FSSOptions
	// snaps, blobs and snapBucket: see Config.Snapshots; hooks are the snapshot limits'
	// and placement preference's; gone tracks runners whose snapshot jobs cannot be asked
	// about (see ReconcileSnapshots).
	snaps      SnapshotStore
	blobs      blob.Store
	snapBucket string
	// openBucket opens the store of a bucket other than the platform's (an
	// organization's own; blobconfig.Buckets.Store).
	openBucket func(ctx context.Context, bucket string) (blob.Store, error)
	hooks      snapshotHooks
	gone       unreachable
	// templates: see Config.Templates.
	templates store.Templates
	// volumes: see Config.Volumes.
	volumes store.Volumes
	// registryCreds: see Config.RegistryCredentials.
	registryCreds func(org, image string) (username, password string, ok bool)
	// builds serves BuildService (Config.Builds).
	builds *buildService
	// quota: Config.Quota (ReservationTTL defaulted); orgs: Config.Orgs.
	quota QuotaOptions
	orgs  OrgLister
	// trustedProxies: see Config.TrustedProxies.
	trustedProxies []netip.Prefix
	// secrets: see Config.Secrets (with defaults).
	secrets SecretOptions
	// audit records audited calls (nil without Config.Audit.Store); auditSvc serves them.
	audit    *audit.Recorder
	auditSvc audit.Service
	// health tracks the runners' failed creates (health.go); healthPending the accepted
	// creates not judged yet.
	health        *health.Tracker
	healthPending healthPending
	// bg ends with the server (Close): the probe judges (health.go) stop with it.
	bg           context.Context
	probeWatches sync.WaitGroup
	// loops are the background loops New starts (views, warm pools, reconciliation, snapshot
	// GC, build dispatch and retention, audit pruning); Close waits for them.
	loops sync.WaitGroup
	// attempts are the create requests to runners in flight (runnerCreate); detached
	// bounds those whose callers went away.
	attempts                       sync.WaitGroup
	detached                       *orgSlots
	probeJudgeFor, probeJudgeEvery time.Duration
	// startWait (Config.StartWait with its defaults) and the places of the GetSandbox
	// calls waiting at once (startwait.go).
	startWait    StartWaitOptions
	startWaiters *orgSlots
	// progressWatch bounds the WatchSandboxProgress streams open at once (progress.go).
	progressWatch *orgSlots
}

// New returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Auth == nil {
		return nil, errors.New("gateway: no authenticator")
	}
	if len(cfg.Runners) == 0 {
		return nil, errors.New("gateway: no runner")
	}
	if cfg.Retention <= 0 {
		cfg.Retention = time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := cfg.FSS.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	cfg.FSS.Limits = cfg.FSS.Limits.WithDefaults()
	if err := cfg.Quota.Validate(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if err := cfg.Health.Validate(); err != nil {
		return nil, fmt.Errorf("gateway: runner health: %w", err)
	}
	if err := cfg.StartWait.Validate(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if cfg.Quota.Store != nil && cfg.Index == nil {
		return nil, errors.New("gateway: quotas need a store-backed Index to count sandboxes")
	}
	if cfg.Quota.ReservationTTL == 0 {
		cfg.Quota.ReservationTTL = DefaultQuotaReservationTTL
	}
	if cfg.FSS.PlatformBucket == "" {
		cfg.FSS.PlatformBucket = "local" // a directory store's (blobconfig.Config.Bucket)
	}
	if err := pki.CheckBaseDomain(cmp.Or(cfg.BaseDomain, pki.DefaultBaseDomain)); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	s := &Server{fss: cfg.FSS, auth: cfg.Auth, runners: cfg.Runners, policies: cfg.Policies, platformOrg: cfg.PlatformOrg, index: newIndex(cfg.Index, cfg.Logger), retention: cfg.Retention, log: cfg.Logger, dataPlane: cfg.DataPlane, baseDomain: cmp.Or(cfg.BaseDomain, pki.DefaultBaseDomain),
		shareTokens: newShareTokens(cfg.ShareTokenKey), snaps: cfg.Snapshots, blobs: cfg.Blobs, snapBucket: cfg.SnapshotBucket,
		openBucket: blobconfig.NewBuckets(cfg.BlobConfig, cfg.Blobs, 0).Store, templates: cfg.Templates}
	if cfg.Index != nil {
		if cfg.Orgs == nil {
			return nil, errors.New("gateway: an Index needs Orgs to load it")
		}
		if err := s.index.load(context.Background(), cfg.Orgs); err != nil {
			return nil, err
		}
	}
	s.registryCreds = cfg.RegistryCredentials
	warnNoPlatformOrg(cfg.Logger, cfg.PlatformOrg, cfg.Runners)
	s.health = s.newHealth(cfg.Health, cfg.healthClock)
	s.index.observe = s.observeHealth
	s.quota, s.orgs = cfg.Quota, cfg.Orgs
	s.volumes = cfg.Volumes
	s.trustedProxies = slices.Clone(cfg.TrustedProxies)
	s.secrets = cfg.Secrets.withDefaults()
	s.orphanGrace = cfg.OrphanGrace
	s.startWait = cfg.StartWait.withDefaults()
	s.startWaiters = s.startWait.slots()
	s.progressWatch = newOrgSlots(MaxProgressWatches, MaxProgressWatchesPerOrg)
	if cfg.Audit.Config.Retention == 0 {
		cfg.Audit.Config.Retention = audit.DefaultRetention
	}
	if err := cfg.Audit.Config.Validate(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	s.auditSvc = audit.Service{Store: cfg.Audit.Store, PlatformOrg: cfg.Audit.PlatformOrg}
	if cfg.Audit.Store != nil {
		s.audit = audit.NewRecorder(cfg.Audit.Store, audit.Options{Logger: cfg.Logger, PlatformOrg: cfg.Audit.PlatformOrg, Source: func(ctx context.Context) string {
			if a, ok := callerOf(ctx); ok && a.IsValid() {
				return a.String()
			}
			return ""
		}})
	}
	if s.orphanGrace == 0 {
		s.orphanGrace = DefaultOrphanGrace
	}
	ctx, stop := context.WithCancel(context.Background())
	s.stop, s.bg = stop, ctx
	s.probeJudgeFor, s.probeJudgeEvery = cmp.Or(cfg.probeJudgeFor, ProbeJudgeFor), cmp.Or(cfg.probeJudgeEvery, probeJudgePoll)
	maxDetached := cmp.Or(cfg.maxDetached, maxDetachedCreates)
	s.detached = newOrgSlots(maxDetached, min(maxDetached, maxDetachedCreatesPerOrg))
	s.views = newRunnerViews(s, cfg.DisconnectAfter)
	if cfg.ViewInterval <= 0 {
		cfg.ViewInterval = DefaultViewInterval
	}
	s.loops.Go(func() { s.views.run(ctx, cfg.ViewInterval) })
	if s.templates != nil {
		if cfg.WarmInterval <= 0 {
			cfg.WarmInterval = DefaultWarmInterval
		}
		s.warmPoke = make(chan struct{}, 1)
		s.loops.Go(func() { s.warmLoop(ctx, cfg.WarmInterval) })
	}
	s.wireSnapshots(ctx, cfg)
	s.builds = newBuildService(s, cfg.Builds, ctx)
	if s.audit != nil {
		s.loops.Go(func() { s.audit.Run(ctx, cfg.Audit.Config) })
	}
	if cfg.ReconcileInterval > 0 && (cfg.Index != nil || cfg.Snapshots != nil) {
		s.loops.Go(func() { s.reconcileLoop(ctx, cfg.ReconcileInterval) })
	}
	return s, nil
}

// Close stops the server's background work (runner probes, warm pools, reconciliation,
// snapshot GC, build dispatch, audit pruning) and waits for those loops, the health probe
// watches and the create requests to runners to end: once it returns, nothing of the
// server's still reads or writes its stores.
func (s *Server) Close() {
	s.stop()
	s.loops.Wait()
	s.probeWatches.Wait()
	s.attempts.Wait()
}

// Services are the services Handler serves.
func Services() []protoreflect.ServiceDescriptor {
	return []protoreflect.ServiceDescriptor{
		sandboxv1.File_coreweave_sandbox_v1_sandbox_proto.Services().ByName("SandboxService"),
		sandboxv1.File_coreweave_sandbox_v1_discovery_proto.Services().ByName("DiscoveryService"),
		sandboxv1.File_coreweave_sandbox_v1_sandbox_template_proto.Services().ByName("SandboxTemplateService"),
		sandboxv1.File_coreweave_sandbox_v1_volume_proto.Services().ByName("VolumeService"),
		sandboxv1.File_coreweave_sandbox_v1_settings_proto.Services().ByName("SettingsService"),
		statev1.File_sandboxd_sandbox_v1_state_proto.Services().ByName("SandboxStateService"),
		buildv1.File_sandboxd_build_v1_build_proto.Services().ByName("BuildService"),
		quotav1.File_sandboxd_quota_v1_quota_proto.Services().ByName("QuotaService"),
		settingsv1.File_sandboxd_settings_v1_secrets_proto.Services().ByName("SecretService"),
		auditv1.File_sandboxd_audit_v1_audit_proto.Services().ByName("AuditService"),
	}
}

// Handler serves Services (gRPC, gRPC-Web, Connect, and REST/JSON per the google.api.http
// annotations), GET /readyz and GET /livez.
func (s *Server) Handler() http.Handler {
	interceptors := []connect.Interceptor{tracing.PublicServer(), metrics.Default.Interceptor(metrics.PathGateway)}
	if s.audit != nil {
		interceptors = append(interceptors, s.audit.Interceptor()) // outside auth: it records refusals too
	}
	interceptors = append(interceptors, auth.Interceptor{Auth: s.auth}, apifront.NotImplemented{}, apifront.PathVars{}, apifront.Enums{})
	opts := []connect.HandlerOption{
		connect.WithInterceptors(interceptors...),
		connect.WithReadMaxBytes(relay.MaxMessageBytes),
		connect.WithSendMaxBytes(relay.MaxMessageBytes),
		// Responses are not compressed (gzip-compressed requests are still read): the
		// official client and connect-go offer gzip on every call, and gzip at ~60 MB/s a
		// core capped file reads through the gateway at that rate (and spent the CPU every
		// tenant shares) for content that is often incompressible.
		connect.WithCompressMinBytes(math.MaxInt),
	}
	api, err := restTranscoder(
		vanguard.NewService(sandboxv1connect.NewSandboxServiceHandler(s, opts...)),
		vanguard.NewService(sandboxv1connect.NewDiscoveryServiceHandler(s, opts...)),
		vanguard.NewService(sandboxv1connect.NewSandboxTemplateServiceHandler(s, opts...)),
		vanguard.NewService(sandboxv1connect.NewVolumeServiceHandler(s, opts...)),
		vanguard.NewService(sandboxv1connect.NewSettingsServiceHandler(s, opts...)),
		vanguard.NewService(statev1connect.NewSandboxStateServiceHandler(s, opts...)),
		vanguard.NewService(buildv1connect.NewBuildServiceHandler(s.builds, opts...)),
		vanguard.NewService(quotav1connect.NewQuotaServiceHandler(s, opts...)),
		vanguard.NewService(settingsv1connect.NewSecretServiceHandler(secretService{s}, opts...)),
		vanguard.NewService(auditv1connect.NewAuditServiceHandler(s.auditSvc, opts...)),
	)
	if err != nil {
		// The services and their annotations are compiled in: this is a programming error.
		panic(fmt.Sprintf("gateway: %v", err))
	}
	mux := http.NewServeMux()
	mux.Handle("/", withCaller(s.trustedProxies, withOrigin(api)))
	mux.HandleFunc("GET /v1/builds/{build_id}/logs", s.buildLogsREST) // a stream REST transcoding cannot carry (no sandbox)
	mux.HandleFunc("GET "+BuildLogPath, s.buildLogText)               // GetSandboxBuildLogs's URLs
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /livez", metrics.Livez)
	mux.HandleFunc("PUT "+BuildContextsPath+"{name}", s.putBuildContext) // raw bytes, streamed to the blob store
	return mux
}

// readyz is ready while at least one runner is connected: this gateway can place and
// serve sandboxes then.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if err := s.Ready(r.Context()); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = fmt.Fprintln(w, "ok")
}

// Ready is nil while at least one runner is connected: this gateway can place and serve
// sandboxes then. A quarantined runner still counts (the gateway answers creates with
// the quarantine's reason, and its cooldown ends without traffic).
func (s *Server) Ready(ctx context.Context) error {
	var down []string
	for _, v := range s.views.snapshot(ctx) {
		if v.Ready {
			return nil
		}
		down = append(down, v.ID+": "+v.NotReady)
	}
	return errors.New("no runner connected: " + strings.Join(down, "; "))
}

func principal(ctx context.Context) auth.Principal {
	p, _ := auth.FromContext(ctx)
	return p
}

func (s *Server) runnerByID(id string) runner.Handle {
	for _, r := range s.runners {
		if r.ID() == id {
			return r
		}
	}
	return nil
}

// lookup finds the caller's sandbox id and its runner.
func (s *Server) lookup(ctx context.Context, id string) (*record, runner.Handle, error) {
	if id == "" {
		return nil, nil, apierr.Invalid(apierr.InvalidRequest, "sandbox_id is required", []apierr.Violation{{Field: "sandbox_id", Description: "is required"}})
	}
	rec, ok := s.index.get(ctx, principal(ctx).Org, id)
	if !ok {
		return nil, nil, runner.NotFoundError(id)
	}
	rid := s.index.runnerOf(rec)
	r := s.runnerByID(rid)
	if r == nil {
		return nil, nil, apierr.WithRetry(apierr.Newf(apierr.RunnerUnavailable, "runner %s of sandbox %s is not connected", rid, id), 5*time.Second)
	}
	if !s.servesLoaded(ctx, r, rec.org) {
		// Its runner's certificate is not verified yet, or it now belongs to another
		// organization (re-registered): nothing of the sandbox's goes to it.
		why := "does not serve the sandbox's organization"
		if _, known := s.runnerOwner(r); !known {
			why = "is not verified yet (no handshake since this gateway started)"
		}
		return nil, nil, apierr.WithRetry(apierr.Newf(apierr.RunnerUnavailable, "runner %s of sandbox %s %s", rid, id, why), 5*time.Second)
	}
	// Every operation on an existing sandbox: its runner's allowlist, as it is now.
	if err := s.checkSource(ctx, rid); err != nil {
		return nil, nil, err
	}
	return rec, r, nil
}

// current returns the sandbox's live state from its runner, or the last one seen once
// the runner has forgotten it.
//
// A runner that cannot be reached leaves the sandbox as last seen: it may well still run.
// A runner that answers but no longer knows a sandbox that had not ended has lost it (its
// state was wiped, or the sandbox vanished while it was down): the sandbox is FAILED with
// reason Lost, so clients stop waiting for it.
func (s *Server) current(ctx context.Context, rec *record, r runner.Handle) runner.Sandbox {
	if last := s.index.lastOf(rec); deletedWithoutRunner(last) {
		return last // its runner was gone; should it have the sandbox again, Reconcile deletes it
	}
	sb, err := r.Get(ctx, rec.id)
	if err == nil && sb.Reason == runner.ReasonMoved {
		err = runtime.ErrNotFound // as a runner that forgot it
	}
	if nr := s.movedAway(ctx, rec, r, err); nr != nil {
		return s.current(ctx, rec, nr)
	}
	if err == nil {
		s.index.setLast(ctx, rec, sb)
		return sb
	}
	if !errors.Is(err, runtime.ErrNotFound) {
		// Unreachable (for this gateway): another replica may have ended the record
		// meanwhile (deleted without its runner, gone.go).
		s.index.refreshLast(ctx, rec)
	}
	last := s.index.lastOf(rec)
	if !errors.Is(err, runtime.ErrNotFound) || last.State.Terminal() {
		return last
	}
	lost := last
	lost.State, lost.Reason = runner.StateFailed, ReasonLost
	lost.Message = fmt.Sprintf("runner %s no longer knows this sandbox", r.ID())
	lost.EndedAt = time.Now()
	s.log.Warn("sandbox lost by its runner", "sandbox", rec.id, "runner", r.ID(), "was", last.State)
	s.index.setLast(ctx, rec, lost)
	return lost
}

// movedAway is the runner sandbox rec runs on now when its runner r answered err as a
// runner that no longer has it (not found, or not running) and the store names another
// (another gateway replica moved it there: ResumeSandbox); nil otherwise.
func (s *Server) movedAway(ctx context.Context, rec *record, r runner.Handle, err error) runner.Handle {
	if err == nil || !(errors.Is(err, runtime.ErrNotFound) || errors.Is(err, runner.ErrNotRunning)) || !s.index.refresh(ctx, rec) {
		return nil
	}
	if nr := s.runnerByID(s.index.runnerOf(rec)); nr != nil && nr.ID() != r.ID() {
		s.log.Info("sandbox moved to another runner", "sandbox", rec.id, "from", r.ID(), "to", nr.ID())
		return nr
	}
	return nil
}

// followMove is the runner sandbox rec runs on: r, or the one it moved to when r no
// longer has it (movedAway).
func (s *Server) followMove(ctx context.Context, rec *record, r runner.Handle) runner.Handle {
	sb, err := r.Get(ctx, rec.id)
	if err == nil && sb.Reason == runner.ReasonMoved {
		err = runtime.ErrNotFound
	}
	if nr := s.movedAway(ctx, rec, r, err); nr != nil {
		return nr
	}
	return r
}

// ReasonLost: the sandbox's runner answered but no longer knows it.
const ReasonLost = "Lost"

func (s *Server) CreateSandbox(ctx context.Context, req *connect.Request[sandboxv1.CreateSandboxRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	out, err := s.create(ctx, createArgs{spec: req.Msg.GetSandbox().GetSpec(), requestID: req.Msg.GetRequestId(), displayName: req.Msg.GetSandbox().GetDisplayName(), displayNameField: "sandbox.display_name"})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// createArgs is one create: a CreateSandbox, or a CreateSandboxFromFile translated.
type createArgs struct {
	spec      *sandboxv1.SandboxSpec
	requestID string
	// requestDigest identifies a request of another RPC than CreateSandbox
	// (record.requestDigest).
	requestDigest string
	// sourceTemplateID and sourceTemplateRevision: the template of a
	// CreateSandboxFromTemplate (record).
	sourceTemplateID       string
	sourceTemplateRevision int64
	// displayName is the sandbox's display_name (checked by create), displayNameField
	// its field path in the request.
	displayName, displayNameField string
	// adjust adds to the runtime spec converted from the resolved spec what the public
	// wire cannot carry (a Compose file's depends_on, tmpfs and host aliases).
	adjust func(*runtime.Spec) error
	// engine is a container-engine sandbox's (control CONTROL_CONTAINER_ENGINE): its one
	// container takes each runner's engine image, and only runners that run engines
	// (and whose policies allow it and its images) are candidates.
	engine *runtime.Engine
	// builds are the image builds of a Compose file's services (record.builds).
	builds map[string]string
}

// create is the one create path: request_id dedupe, the spec's shape, placement (the
// runners' policies and capacity), the runner, the index.
func (s *Server) create(ctx context.Context, a createArgs) (*sandboxv1.Sandbox, error) {
	p := principal(ctx)
	if vs := requestIDViolations("request_id", a.requestID); vs != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid request_id: "+apierr.Describe(vs), vs)
	}
	if vs := sandboxDisplayNameViolations(a.displayNameField, a.displayName); vs != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid display_name: "+apierr.Describe(vs), vs)
	}
	if rec, ok := s.index.byRequestID(ctx, p.Org, a.requestID); ok {
		if rec.requestDigest != a.requestDigest {
			return nil, requestIDConflict()
		}
		if r := s.runnerByID(s.index.runnerOf(rec)); r != nil {
			return s.created(rec, s.current(ctx, rec, r), r), nil
		}
	}
	// Shape first, on what the caller sent; then placement (the runners' policies and
	// capacity); then the runner.
	asked := a.spec
	shape := asked
	if a.engine != nil && len(asked.GetContainers()) == 1 {
		// The engine image is each runner's own (placement gives it); shape the rest.
		shape = proto.CloneOf(asked)
		shape.Containers[0].Image = runtime.EngineContainerName
	}
	restore, secrets := s.restorer(ctx, p.Org), s.secretResolver(ctx, p.Org)
	asked, err := s.pinToVolumes(ctx, p.Org, asked)
	if err != nil {
		return nil, err
	}
	globals, err := s.prepareGlobals(ctx, p.Org, asked)
	if err != nil {
		return nil, err
	}
	leasesKept := false
	var createErr error // createOn's: an abandoned create keeps its leases until it settles
	defer func() {
		if !leasesKept {
			afterSettled(createErr, func() { globals.release(context.WithoutCancel(ctx)) })
		}
	}()
	ctx = withGlobalPlans(ctx, globals)
	// The shape's conversion notes the references a runner resolves (KUBERNETES secret
	// stores): placement keeps them to runners that can.
	shapeSecrets, secretRefs := byReference(secrets)
	cr, err := toCreateRequest(shape, restore, shapeSecrets, s.registeredResolver(ctx, p.Org))
	if err != nil {
		return nil, err
	}
	if a.adjust != nil {
		if err := a.adjust(&cr.Spec); err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
	}
	cands, err := s.place(ctx, asked, a.engine, secretRefs(), globals.placementFields(), globals.writerFields())
	if err != nil {
		return nil, err
	}
	cands = s.preferForRestores(ctx, cands, cr.Restores)
	r, res, sb, held, err := s.createOn(ctx, cands, p.Org, p.KeyID, a.adjust, restore, secrets)
	if err != nil {
		createErr = err
		return nil, err
	}
	// The sandbox holds its GLOBAL volumes' write leases from now on: they end with it.
	globals.commit(context.WithoutCancel(ctx), sb.ID)
	leasesKept = true
	recorded := res.Spec
	if a.engine != nil && len(recorded.GetContainers()) == 1 {
		// The engine's container is named in the runtime spec only (the name is reserved
		// on the public wire); the sandbox shows it by that name.
		recorded = proto.CloneOf(recorded)
		recorded.Containers[0].Name = runtime.EngineContainerName
	}
	rec := &record{id: sb.ID, org: p.Org, runnerID: r.ID(), spec: recorded, createdAt: sb.CreatedAt, last: sb, requestDigest: a.requestDigest,
		sourceTemplateID: a.sourceTemplateID, sourceTemplateRevision: a.sourceTemplateRevision, displayName: a.displayName, builds: a.builds,
		need: held.need, reservation: held.id}
	rec.policyRevision, _ = strconv.ParseInt(res.PolicyRevision, 10, 64)
	if err := s.index.put(ctx, rec, a.requestID); err != nil {
		// Not recorded, so not reachable through the API: do not leave it running, nor
		// holding its quota; unless another record has its ID (a runner answered under
		// it): that one's sandbox may be what runs under it.
		var dup *store.AlreadyExistsError
		if !errors.As(err, &dup) || dup.Key != store.KeyID {
			_, _ = r.Delete(context.WithoutCancel(ctx), sb.ID, 0)
		} else {
			s.log.Warn("a created sandbox's ID is another record's; not recorded", "sandbox", sb.ID, "org", p.Org, "runner", r.ID())
		}
		s.releaseQuota(ctx, p.Org, held.id)
		if errors.As(err, &dup) && dup.Key == store.KeyRequestID {
			// Another gateway replica created this request's sandbox meanwhile: that one counts.
			if first, ok := s.index.byRequestID(ctx, p.Org, a.requestID); ok {
				if first.requestDigest != a.requestDigest {
					return nil, requestIDConflict()
				}
				if fr := s.runnerByID(s.index.runnerOf(first)); fr != nil {
					return s.created(first, s.current(ctx, first, fr), fr), nil
				}
			}
		}
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	s.log.Info("sandbox created", "sandbox", sb.ID, "org", p.Org, "runner", r.ID(), "image", spec.Primary(res.Spec).GetImage())
	return s.created(rec, sb, r), nil
}

// requestIDConflict: a request_id already created a sandbox from another request.
func requestIDConflict() error {
	vs := []apierr.Violation{{Field: "request_id", Description: "already created a sandbox from a different request (another file, other options, or another RPC)"}}
	return apierr.Invalid(apierr.RequestIDConflict, "request_id conflict: "+apierr.Describe(vs), vs)
}

// created is the create response for rec as sb: the only answer that carries the
// sandbox's share token.
func (s *Server) created(rec *record, sb runner.Sandbox, r runner.Handle) *sandboxv1.Sandbox {
	return s.withShareToken(s.toProto(rec, sb, r), sb)
}

func (s *Server) GetSandbox(ctx context.Context, req *connect.Request[sandboxv1.GetSandboxRequest]) (*connect.Response[sandboxv1.Sandbox], error) {
	rec, r, err := s.lookup(ctx, req.Msg.GetSandboxId())
	if err != nil {
		if out, ok := s.endedWithoutRunner(ctx, req.Msg.GetSandboxId(), err); ok {
			return connect.NewResponse(out), nil
		}
		return nil, err
	}
	sb := s.current(ctx, rec, r)
	if nr := s.runnerByID(s.index.runnerOf(rec)); nr != nil {
		r = nr // it moved
	}
	sb = s.awaitStart(ctx, principal(ctx).Org, rec, r, sb)
	return connect.NewResponse(s.toProto(rec, sb, r)), nil
}

func (s *Server) ListSandboxes(ctx context.Context, req *connect.Request[sandboxv1.ListSandboxesRequest]) (*connect.Response[sandboxv1.ListSandboxesResponse], error) {
	m := req.Msg
	size, err := apierr.PageSize(m.GetPageSize(), defaultPageSize, maxPageSize)
	if err != nil {
		return nil, err
	}
	after := ""
	if t := m.GetPageToken(); t != "" {
		b, err := base64.RawURLEncoding.DecodeString(t)
		if err != nil || len(b) == 0 {
			return nil, badPageToken()
		}
		after = string(b)
	}
	s.index.forget(ctx, time.Now().Add(-s.retention))
	want := m.GetState()
	terminalFilter := want == sandboxv1.State_STATE_COMPLETED || want == sandboxv1.State_STATE_FAILED || want == sandboxv1.State_STATE_TERMINATED
	desc := m.GetSortDirection() == sandboxv1.SortDirection(2)
	out := &sandboxv1.ListSandboxesResponse{}
	skipping := after != ""
	for _, rec := range s.index.list(ctx, principal(ctx).Org, desc) {
		if skipping {
			if rec.id == after {
				skipping = false
			}
			continue
		}
		if !hasAll(rec.spec.GetTags(), m.GetTags()) {
			continue
		}
		if len(m.GetVolumeIds()) > 0 && !hasAny(registeredVolumeIDs(rec.spec), m.GetVolumeIds()) {
			continue
		}
		if len(m.GetRunnerIds()) > 0 && !slices.Contains(m.GetRunnerIds(), s.index.runnerOf(rec)) {
			continue
		}
		var sb runner.Sandbox
		var name runnerName
		if r := s.runnerByID(s.index.runnerOf(rec)); r != nil && s.servesLoaded(ctx, r, rec.org) {
			sb, name = s.current(ctx, rec, r), r
		} else if r != nil {
			// Its runner is not verified yet, or serves another organization now (gone.go):
			// it is sent nothing; the sandbox is listed as last seen.
			sb, name = s.index.lastOf(rec), r
		} else if last := s.index.lastOf(rec); last.State.Terminal() {
			sb, name = last, absentRunner(s.index.runnerOf(rec)) // ended (deleted without its runner)
		} else {
			continue
		}
		if sb.State.Terminal() && !m.GetShowTerminated() && !terminalFilter {
			continue
		}
		if want != sandboxv1.State_STATE_UNSPECIFIED && sandboxv1.State(sb.State) != want {
			continue
		}
		if len(out.Sandboxes) == size {
			out.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(out.Sandboxes[size-1].GetSandboxId()))
			break
		}
		out.Sandboxes = append(out.Sandboxes, s.toProto(rec, sb, name))
	}
	if skipping {
		// The token names no sandbox of this organization: garbage (or a sandbox forgotten
		// since, past its retention), not an empty last page.
		return nil, badPageToken()
	}
	return connect.NewResponse(out), nil
}

func badPageToken() error {
	return apierr.Invalid(apierr.InvalidRequest, "invalid page_token", []apierr.Violation{{Field: "page_token", Description: "is not a token this server issued"}})
}

func hasAll(have, want []string) bool {
	for _, t := range want {
		if !slices.Contains(have, t) {
			return false
		}
	}
	return true
}

func (s *Server) DeleteSandbox(ctx context.Context, req *connect.Request[sandboxv1.DeleteSandboxRequest]) (*connect.Response[sandboxv1.DeleteSandboxResponse], error) {
	m := req.Msg
	if m.GetAllowMissing() && len(m.GetSnapshotVolumes()) > 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, "allow_missing cannot be combined with snapshot_volumes",
			[]apierr.Violation{{Field: "snapshot_volumes", Description: "must be empty with allow_missing"}})
	}
	if vs := requestIDViolations("request_id", m.GetRequestId()); vs != nil {
		return nil, apierr.Invalid(apierr.InvalidRequest, "invalid request_id: "+apierr.Describe(vs), vs)
	}
	if m.GetGracePeriodSeconds() < 0 {
		return nil, apierr.Invalid(apierr.InvalidRequest, "grace_period_seconds must not be negative",
			[]apierr.Violation{{Field: "grace_period_seconds", Description: "must not be negative"}})
	}
	rec, r, err := s.lookup(ctx, m.GetSandboxId())
	if err != nil {
		if m.GetAllowMissing() && connect.CodeOf(err) == connect.CodeNotFound {
			return connect.NewResponse(&sandboxv1.DeleteSandboxResponse{}), nil
		}
		if out, gone, err := s.deleteWithoutRunner(ctx, m, err); gone {
			if err != nil {
				return nil, err
			}
			return connect.NewResponse(out), nil
		}
		return nil, err
	}
	grace := min(time.Duration(m.GetGracePeriodSeconds())*time.Second, maxGracePeriod)
	if len(m.GetSnapshotVolumes()) > 0 {
		out, err := s.snapshotOnDelete(ctx, m, rec, r, grace)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(out), nil
	}
	sb, err := r.Delete(ctx, rec.id, grace)
	if err != nil {
		if errors.Is(err, runtime.ErrNotFound) {
			sb = s.index.lastOf(rec) // the runner already forgot it: it ended long ago
		} else {
			return nil, runner.APIError(rec.id, err, runner.SpecField)
		}
	}
	s.index.setLast(ctx, rec, sb)
	s.views.poke() // its capacity is free again soon
	return connect.NewResponse(&sandboxv1.DeleteSandboxResponse{Sandbox: s.toProto(rec, sb, r)}), nil
}

func (s *Server) PurgeSandboxes(ctx context.Context, req *connect.Request[sandboxv1.PurgeSandboxesRequest]) (*connect.Response[sandboxv1.PurgeSandboxesResponse], error) {
	m := req.Msg
	if m.GetRequestId() != "" {
		return nil, apierr.Newf(apierr.NotImplemented, "request_id is not supported on PurgeSandboxes")
	}
	if (len(m.GetTags()) > 0) == m.GetPurgeAll() {
		return nil, apierr.Invalid(apierr.InvalidRequest, "give exactly one scope: tags or purge_all",
			[]apierr.Violation{{Field: "tags", Description: "set tags or purge_all, not both and not neither"}})
	}
	out := &sandboxv1.PurgeSandboxesResponse{}
	for _, rec := range s.index.list(ctx, principal(ctx).Org, false) {
		if !m.GetPurgeAll() && !hasAll(rec.spec.GetTags(), m.GetTags()) {
			continue
		}
		r := s.runnerByID(s.index.runnerOf(rec))
		if r == nil || !s.servesLoaded(ctx, r, rec.org) {
			// Nothing of the sandbox's goes to such a runner (gone.go): a gone one's
			// sandbox ends here; one not verified yet is retried.
			name, gone := s.goneRunner(ctx, rec)
			if !gone {
				out.RetryableFailedSandboxIds = append(out.RetryableFailedSandboxIds, rec.id)
				continue
			}
			s.index.refreshLast(ctx, rec)
			last := s.index.lastOf(rec)
			if last.State.Terminal() {
				continue
			}
			if !m.GetDryRun() {
				s.endWithoutRunner(ctx, rec, last, name)
			}
			out.PurgeCount++
			continue
		}
		if sb := s.current(ctx, rec, r); sb.State.Terminal() || sb.State == runner.StateTerminating {
			continue
		}
		if !m.GetDryRun() {
			sb, err := r.Delete(ctx, rec.id, 0)
			if err != nil {
				out.FailedSandboxIds = append(out.FailedSandboxIds, rec.id)
				continue
			}
			s.index.setLast(ctx, rec, sb)
		}
		out.PurgeCount++
	}
	s.views.poke()
	return connect.NewResponse(out), nil
}

// agentOf returns the agent of a sandbox already looked up (of its container named
// container; "" = the primary), waiting while it starts.
func (s *Server) agentOf(ctx context.Context, rec *record, r runner.Handle, container string) (agentv1connect.AgentServiceClient, error) {
	id := rec.id
	name, err := containerOf(rec.id, rec.spec, container)
	if err != nil {
		return nil, err
	}
	a, err := r.Agent(ctx, rec.id, name)
	if nr := s.movedAway(ctx, rec, r, err); nr != nil {
		a, err = nr.Agent(ctx, rec.id, name)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("sandbox %s did not start in time: %w", id, ctx.Err()))
		}
		return nil, runner.APIError(rec.id, err, runner.SpecField)
	}
	return a, nil
}

// gatewaySource is the gateway's relay.DataSource: the caller's organization must own the sandbox.
type gatewaySource struct{ s *Server }

func (g gatewaySource) DataAgent(ctx context.Context, perm sandboxv1.SandboxDataPermission, id, container string) (agentv1connect.AgentServiceClient, error) {
	s := g.s
	rec, r, err := s.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.agentOf(ctx, rec, r, container)
}

// DataLogs reads the log from the sandbox's runner, which keeps it after the sandbox
// ended for its retention window; past that the sandbox (still in the index) has none.
func (g gatewaySource) DataLogs(ctx context.Context, id, container string) (relay.LogReader, error) {
	s := g.s
	rec, r, err := s.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	name, err := containerOf(rec.id, rec.spec, container)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, req *agentv1.LogsRequest, send func(*agentv1.LogsResponse) error) error {
		err := r.Logs(ctx, rec.id, name, req, send)
		if errors.Is(err, runtime.ErrNotFound) {
			if last := s.index.lastOf(rec); last.State.Terminal() {
				return apierr.New(apierr.SandboxNotRunning,
					fmt.Sprintf("sandbox %s is %s and its runner no longer keeps its logs", rec.id, last.State), map[string]string{"sandbox_id": rec.id})
			}
		}
		return err
	}, nil
}

func (s *Server) relay() relay.Relay { return relay.Relay{Src: gatewaySource{s}} }

func (s *Server) Exec(ctx context.Context, req *connect.Request[sandboxv1.ExecRequest]) (*connect.Response[sandboxv1.ExecResponse], error) {
	return s.relay().Exec(ctx, req)
}

func (s *Server) WriteFile(ctx context.Context, req *connect.Request[sandboxv1.WriteFileRequest]) (*connect.Response[sandboxv1.WriteFileResponse], error) {
	return s.relay().WriteFile(ctx, req)
}

func (s *Server) ReadFile(ctx context.Context, req *connect.Request[sandboxv1.ReadFileRequest]) (*connect.Response[sandboxv1.ReadFileResponse], error) {
	return s.relay().ReadFile(ctx, req)
}

// StreamExec: see relay.Relay.StreamExec.
func (s *Server) StreamExec(ctx context.Context, stream *connect.BidiStream[sandboxv1.ExecStreamRequest, sandboxv1.ExecStreamResponse]) error {
	return s.relay().StreamExec(ctx, stream)
}

// StreamLogs: see relay.Relay.StreamLogs.
func (s *Server) StreamLogs(ctx context.Context, req *connect.Request[sandboxv1.StreamLogsRequest], stream *connect.ServerStream[sandboxv1.LogEntry]) error {
	return s.relay().StreamLogs(ctx, req, stream)
}
