// Package store keeps the control plane's and the gateway's durable state: organizations,
// API keys, runners (with their policy and status), bootstrap tokens, the gateway's sandbox
// index and the releases each release channel offers. One interface, two backends behind it: SQLite (embedded, the default, pure Go) and
// PostgreSQL (shared by replicas). Open picks the backend from the DSN.
//
// Conventions: every call takes a context; times go in and come out in UTC with microsecond
// precision (PostgreSQL's); JSON documents are stored as the caller's exact text; errors are
// matched with errors.Is against ErrNotFound, ErrConflict, ErrAlreadyExists and ErrInvalid
// (errors.As with *AlreadyExistsError says which key collided).
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/release"
)

// Store is the whole persistent state, grouped per entity.
type Store interface {
	Orgs() Orgs
	APIKeys() APIKeys
	Runners() Runners
	BootstrapTokens() BootstrapTokens
	Sandboxes() Sandboxes
	Releases() Releases
	Rollouts() Rollouts
	Clusters() Clusters
	Installs() Installs
	FSSBucketConfigs() FSSBucketConfigs
	Snapshots() Snapshots
	Templates() Templates
	Volumes() Volumes
	Builds() Builds
	BuildStorageConfigs() BuildStorageConfigs
	Quotas() Quotas
	SecretStores() SecretStores
	Audit() Audit
	// Identity is the store's persistent random identity (identity.go), created on the
	// first call: processes that open one database get one identity.
	Identity(ctx context.Context) (string, error)
	// Backend is "sqlite" or "postgres".
	Backend() string
	Close() error
}

// Orgs are organizations: the unit every other record is scoped to.
type Orgs interface {
	Create(ctx context.Context, org Org) (Org, error) // ErrAlreadyExists (key "id")
	Get(ctx context.Context, id string) (Org, error)
	List(ctx context.Context) ([]Org, error) // by id
}

// APIKeys are hashed API keys. Get is by key id alone (authentication learns the
// organization from the key); the administrative calls are organization-scoped.
type APIKeys interface {
	Create(ctx context.Context, key APIKey) (APIKey, error) // ErrAlreadyExists (key "id")
	Get(ctx context.Context, id string) (APIKey, error)     // revoked keys too; check RevokedAt
	List(ctx context.Context, org string) ([]APIKey, error) // oldest first, revoked included
	// Revoke marks the key revoked; revoking a revoked key keeps the first time.
	Revoke(ctx context.Context, org, id string) (APIKey, error)
	// TouchLastUsed records a use. It never moves LastUsedAt backwards.
	TouchLastUsed(ctx context.Context, id string, at time.Time) error
}

// Runners are managed runners: administrative fields (with an etag for optimistic
// concurrency), the policy document, and status that heartbeats write without changing
// the etag.
type Runners interface {
	// Create fails with *AlreadyExistsError for a taken runner_id or cluster_id. A
	// runner_id is taken platform-wide: another organization's runner of that ID is
	// *AlreadyExistsError (key runner_id) too.
	Create(ctx context.Context, r Runner) (Runner, error)
	// IDHolder is the organization whose runner holds runnerID: the earliest created
	// of the runners of that ID (a database from before IDs were unique across
	// organizations may have several). ErrNotFound when there is none.
	IDHolder(ctx context.Context, runnerID string) (org string, err error)
	Get(ctx context.Context, org, runnerID string) (Runner, error)
	// List returns a page ordered by runner_id and the token of the next page ("" at the end).
	List(ctx context.Context, org string, page Page) ([]Runner, string, error)
	// Update applies the non-nil fields of u if etag is the runner's current etag
	// (ErrConflict otherwise). A policy write increments PolicyRevision.
	Update(ctx context.Context, org, runnerID, etag string, u RunnerUpdate) (Runner, error)
	// Delete removes the runner and its bootstrap tokens; etag "" deletes unconditionally.
	Delete(ctx context.Context, org, runnerID, etag string) error
	// RecordHeartbeat stores status; it leaves the etag, the policy and UpdatedAt alone.
	RecordHeartbeat(ctx context.Context, org, runnerID string, s RunnerStatus) error
}

// BootstrapTokens are one-time secrets a runner presents on first registration.
type BootstrapTokens interface {
	Create(ctx context.Context, t BootstrapToken) error // ErrAlreadyExists (key "hash"); ErrNotFound without the runner
	// Consume atomically marks the token used and returns it. A token that is unknown,
	// already used or expired gives ErrNotFound, so exactly one concurrent caller wins.
	Consume(ctx context.Context, hash string) (BootstrapToken, error)
}

// Sandboxes is the gateway's sandbox index. A sandbox of another organization is
// ErrNotFound, exactly like a missing one. A record is terminal once EndedAt is set.
type Sandboxes interface {
	// Create inserts a record; *AlreadyExistsError with key "id" or "request_id".
	Create(ctx context.Context, s Sandbox) (Sandbox, error)
	Get(ctx context.Context, org, id string) (Sandbox, error)
	GetByRequestID(ctx context.Context, org, requestID string) (Sandbox, error)
	List(ctx context.Context, org string, f SandboxFilter, page Page) ([]Sandbox, string, error)
	UpdateStatus(ctx context.Context, org, id string, u SandboxStatusUpdate) (Sandbox, error)
	// DeleteEndedBefore drops terminal records (of every organization) that ended before
	// cutoff and returns how many.
	DeleteEndedBefore(ctx context.Context, cutoff time.Time) (int64, error)
}

// Releases are the runner versions the platform knows, platform-wide (not per
// organization), and the release channels that offer each: RAPID from when a version is
// published, STABLE from when it is promoted. A channel's current version is the highest
// (semantic-version precedence, package release) it offers.
type Releases interface {
	// Publish records a release and puts it on RAPID. The version, digests and checksums
	// must be valid (ErrInvalid); *AlreadyExistsError with key "version" when it exists.
	Publish(ctx context.Context, r Release) (Release, error)
	Get(ctx context.Context, version string) (Release, error)
	// List returns every release, highest version first.
	List(ctx context.Context) ([]Release, error)
	// Promote puts a release on STABLE. ErrNotFound; ErrNotOnRapid when it is not on
	// RAPID; ErrOlderThanStable when STABLE offers a higher version. Promoting a release
	// that is on STABLE already changes nothing.
	Promote(ctx context.Context, version string) (Release, error)
}

// Clusters are the Kubernetes clusters the control plane installs runners into
// (platform-wide: ClusterID is unique across organizations). The store keeps the
// credential as the caller sealed it and never looks inside.
type Clusters interface {
	// Create fails with *AlreadyExistsError (key "cluster_id") for a taken id, ErrNotFound
	// without the organization.
	Create(ctx context.Context, c Cluster) (Cluster, error)
	Get(ctx context.Context, clusterID string) (Cluster, error)
	// List returns every cluster by cluster_id.
	List(ctx context.Context) ([]Cluster, error)
	// Delete removes the cluster unless a runner of its organization names it
	// (*ClusterInUseError, which matches ErrClusterInUse).
	Delete(ctx context.Context, clusterID string) error
}

// Credential kinds of a Cluster.
const (
	CredentialKubeconfig = "KUBECONFIG"
	CredentialToken      = "SERVICE_ACCOUNT_TOKEN"
)

// Cluster is a registered cluster.
type Cluster struct {
	ClusterID      string
	Org            string // whose runners are installed on it
	Server         string // https://…
	CredentialKind string // CredentialKubeconfig or CredentialToken
	// Credential is the sealed credential (opaque to the store).
	Credential []byte
	CreatedAt  time.Time // set by the store
}

// ClusterInUseError: runners name the cluster.
type ClusterInUseError struct {
	ClusterID string
	RunnerIDs []string // a few of them
}

func (e *ClusterInUseError) Error() string {
	return fmt.Sprintf("cluster %s is named by runner(s) %v", e.ClusterID, e.RunnerIDs)
}

// Is makes errors.Is(err, ErrClusterInUse) hold.
func (e *ClusterInUseError) Is(target error) bool { return target == ErrClusterInUse }

// Installs are the control plane's installs of runners into registered clusters, one per
// runner; a runner's install goes when the runner is deleted.
type Installs interface {
	// Put creates or replaces the runner's install record (ErrNotFound without the runner).
	Put(ctx context.Context, in Install) (Install, error)
	Get(ctx context.Context, org, runnerID string) (Install, error)
	// ListState returns the installs of every organization in state.
	ListState(ctx context.Context, state string) ([]Install, error)
}

// Install states.
const (
	InstallInstalling = "INSTALLING"
	InstallInstalled  = "INSTALLED"
	InstallFailed     = "FAILED"
)

// Install is how far the control plane got installing one runner.
type Install struct {
	Org       string
	RunnerID  string
	ClusterID string
	State     string // InstallInstalling, InstallInstalled or InstallFailed
	Namespace string // the namespace it installs into
	// Reason, Message and Hints say why it failed (State InstallFailed).
	Reason    string
	Message   string
	Hints     []string
	UpdatedAt time.Time // set by the store
}

// Release is one runner version.
type Release struct {
	Version           string // see package release; kept as written
	RunnerImageDigest string // sha256:…
	AgentImageDigest  string // sha256:…
	// BinaryChecksums maps an architecture (release.Arches) to the hex SHA-256 of the
	// sandboxd binary for it; empty when the release ships images only.
	BinaryChecksums map[string]string
	// AgentBinaryChecksums: the same for the sandbox-agent binary; empty when none.
	AgentBinaryChecksums map[string]string
	// Manifest is the signed release manifest exactly as published (package release),
	// when the release was published from one, and ManifestSignature its Ed25519
	// signature: both or neither. Kept so that anyone reading the release can verify it
	// again instead of trusting the store or the control plane.
	Manifest          []byte
	ManifestSignature []byte
	CreatedAt         time.Time  // set by the store
	RapidAt           *time.Time // on RAPID since (set by Publish)
	StableAt          *time.Time // on STABLE since (set by Promote)
}

// Channels are the release channels that offer r, STABLE first.
func (r Release) Channels() []string {
	var out []string
	if r.StableAt != nil {
		out = append(out, ChannelStable)
	}
	if r.RapidAt != nil {
		out = append(out, ChannelRapid)
	}
	return out
}

// Org is an organization.
type Org struct {
	ID        string
	Name      string
	CreatedAt time.Time // set by the store
}

// API key roles.
const (
	RoleAdmin = "SANDBOX_ADMIN"
	RoleUser  = "SANDBOX_USER"
)

// APIKey is a key's record; the secret itself is never stored.
type APIKey struct {
	ID         string
	Org        string
	Role       string // RoleAdmin or RoleUser
	Name       string
	Hash       string    // hex SHA-256 of the whole key
	CreatedAt  time.Time // set by the store when zero
	RevokedAt  *time.Time
	LastUsedAt *time.Time
}

// Release channels.
const (
	ChannelStable = "STABLE"
	ChannelRapid  = "RAPID"
)

// DefaultRunnerGroup is the runner_group_id of a runner created without one.
const DefaultRunnerGroup = "default"

// Runner is a managed runner: one per cluster, unique runner_id per organization.
type Runner struct {
	Org            string
	RunnerID       string
	ClusterID      string
	Zone           string
	RunnerGroupID  string // DefaultRunnerGroup when empty on create
	DisplayName    string
	ReleaseChannel string // ChannelStable (when empty on create) or ChannelRapid
	DesiredVersion string // set by applyAvailableUpdate; "" means none
	// Policy is the runner's policy document; nil means never configured (JSON null on
	// the API), "{}" is the permissive policy. Once set it can be replaced, not unset.
	Policy json.RawMessage
	// PolicyRevision counts policy writes: 0 never set, 1 the first policy, …
	PolicyRevision int64
	// MaintenancePolicy is the runner's maintenance policy as a JSON object (the control
	// plane validates it; internal/maintenance reads it); nil means none: any time.
	MaintenancePolicy json.RawMessage
	// Etag changes on every administrative write (not on heartbeats).
	Etag      string
	CreatedAt time.Time
	UpdatedAt time.Time
	Status    RunnerStatus
	// LastUpdate is the runner's last update step (the automatic rollout's or
	// ApplyAvailableUpdate's); nil when it never had one.
	LastUpdate *UpdateAttempt
}

// Update step states.
const (
	UpdateInProgress = "IN_PROGRESS"
	UpdateSucceeded  = "SUCCEEDED"
	UpdateRolledBack = "ROLLED_BACK"
)

// UpdateAttempt is one update step of a runner: desired_version set to To, waiting for the
// runner to report To and ready until Deadline.
type UpdateAttempt struct {
	From      string
	To        string
	State     string // UpdateInProgress, UpdateSucceeded or UpdateRolledBack
	Reason    string // why it failed
	StartedAt time.Time
	Deadline  time.Time
	EndedAt   *time.Time // nil while in progress
}

// RunnerStatus is what heartbeats report.
type RunnerStatus struct {
	LastHeartbeatAt *time.Time // nil: never heard from
	Version         string
	Ready           bool
	Capacity        json.RawMessage // nil when never reported
	Usage           json.RawMessage
	// SelfUpdate: the runner can move itself to its desired version.
	SelfUpdate bool
	// SelfUpdateFailedVersion is the last version the runner refused or rolled back from
	// (a single-host runner updating itself) and SelfUpdateFailure why; both "" when it
	// reports none. Each heartbeat replaces them, so a runner that reports none clears
	// them. Bounded: MaxSelfUpdateFailedVersionLen, MaxSelfUpdateFailureLen (ErrInvalid);
	// a reason needs a version.
	SelfUpdateFailedVersion string
	SelfUpdateFailure       string
	// Prepull is how the runner's image pre-pull stands (the JSON of a
	// controlplane.v1.PrepullStatus), replaced by every heartbeat; nil when the last
	// heartbeat reported none. At most MaxPrepullLen bytes (ErrInvalid).
	Prepull json.RawMessage
}

// MaxPrepullLen bounds RunnerStatus.Prepull: 64 images of bounded text.
const MaxPrepullLen = 1 << 20

// Bounds of RunnerStatus's self-update failure, in bytes.
const (
	MaxSelfUpdateFailedVersionLen = release.MaxVersionLen
	MaxSelfUpdateFailureLen       = 1024
)

// RunnerUpdate holds the fields to change; nil leaves a field as it is.
type RunnerUpdate struct {
	DisplayName    *string
	RunnerGroupID  *string
	ReleaseChannel *string
	DesiredVersion *string
	Policy         json.RawMessage // replaces the whole document; JSON null is rejected
	// SetMaintenancePolicy writes MaintenancePolicy (nil clears it: any time).
	SetMaintenancePolicy bool
	MaintenancePolicy    json.RawMessage
	// LastUpdate replaces the runner's last update step.
	LastUpdate *UpdateAttempt
}

// Rollouts is the automatic rollout's state besides the runners' own columns: halted
// channels (per organization) and the lease that lets one control-plane replica at a time run the controller.
type Rollouts interface {
	// Runners returns every runner of every organization, by organization and runner_id.
	Runners(ctx context.Context) ([]Runner, error)
	// Halts returns org's halts ("": every organization's), by organization and channel.
	Halts(ctx context.Context, org string) ([]RolloutHalt, error)
	// Halt records the halt of a channel's rollout to h.Org's runners (h.Org required: a
	// runner of one organization must not stop another's rollout). A channel halted for
	// the organization for the same version keeps its first halt (reason and time); a halt
	// for another version is replaced.
	Halt(ctx context.Context, h RolloutHalt) error
	// Resume lifts org's halt of channel ("": every organization's) and says how many
	// halts it lifted.
	Resume(ctx context.Context, org, channel string) (int, error)
	// AcquireLease takes or renews the lease name for holder until now+ttl, if it is free,
	// expired or holder's already; it reports whether holder has it.
	AcquireLease(ctx context.Context, name, holder string, now time.Time, ttl time.Duration) (bool, error)
}

// RolloutHalt is a channel whose rollout of Version to Org's runners stopped.
type RolloutHalt struct {
	Channel  string
	Version  string
	Reason   string
	Org      string // the organization halted: its runner's step failed
	RunnerID string // the runner whose step failed
	HaltedAt time.Time
}

// BootstrapToken is a one-time registration secret for one runner, kept hashed.
type BootstrapToken struct {
	Hash       string // hex SHA-256 of the secret; the primary key
	Org        string
	RunnerID   string
	ExpiresAt  time.Time
	CreatedAt  time.Time // set by the store
	ConsumedAt *time.Time
}

// Sandbox is one entry of the gateway's sandbox index.
type Sandbox struct {
	ID             string
	Org            string
	RunnerID       string
	RequestID      string // "" when the create had none; unique per organization otherwise
	Spec           json.RawMessage
	Tags           []string
	CreatedAt      time.Time // the caller's; the store's clock when zero
	State          string
	PolicyRevision int64           // of the runner policy the sandbox was resolved with
	Status         json.RawMessage // last status seen; nil when none
	UpdatedAt      time.Time
	EndedAt        *time.Time // set once terminal
	// SourceTemplateID and SourceTemplateRevision name the template the sandbox was
	// created from ("" and 0: none).
	SourceTemplateID       string
	SourceTemplateRevision int64
	// MilliCPU and MemoryBytes are what the sandbox holds against its organization's
	// quota while it has not ended (Quotas).
	MilliCPU, MemoryBytes int64
	// ReservationID, on Create, names the quota reservation this sandbox was admitted
	// by: the record takes its share of it in the same transaction (Quotas.Reserve).
	// Not stored.
	ReservationID string
	// VolumeIDs are the registered volumes (volume_id) the sandbox mounts: written by
	// Create (for the volume_ids filter and Volumes.Attached), not read back (the spec
	// names them).
	VolumeIDs []string
}

// SandboxStatusUpdate is a new state and last status for a sandbox.
type SandboxStatusUpdate struct {
	State   string
	Status  json.RawMessage // nil leaves the stored status
	EndedAt *time.Time      // nil leaves EndedAt as it is (a terminal record stays terminal)
	// RunnerID, when set, is the runner the sandbox now runs on (it moved: ResumeSandbox
	// on another runner); "" leaves it.
	RunnerID string
}

// SandboxFilter narrows Sandboxes.List. Empty fields do not filter.
type SandboxFilter struct {
	Tags            []string // every tag must be present
	States          []string // any of
	RunnerIDs       []string // any of
	VolumeIDs       []string // mounts any of
	IncludeTerminal bool     // include records with EndedAt set
	Descending      bool     // newest first (default oldest first)
}

// Page asks for one page of a list. Size 0 means DefaultPageSize; above MaxPageSize is capped.
// Token is the next-page token of the previous call with the same filter ("" for the first).
type Page struct {
	Size  int
	Token string
}

// Page sizes.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Errors, matched with errors.Is.
var (
	ErrNotFound      = fmt.Errorf("%w", errdefs.ErrNotFound)
	ErrConflict      = errors.New("etag mismatch: the record changed since it was read")
	ErrAlreadyExists = fmt.Errorf("%w", errdefs.ErrAlreadyExists)
	ErrInvalid       = errors.New("invalid argument")
	// ErrNotOnRapid: a release must be on RAPID before it is promoted to STABLE.
	ErrNotOnRapid = errors.New("release is not on the RAPID channel")
	// ErrOlderThanStable: STABLE offers a higher version than the one to promote.
	ErrOlderThanStable = errors.New("release is older than the current STABLE version")
	// ErrClusterInUse: runners name the cluster (see ClusterInUseError).
	ErrClusterInUse = errors.New("cluster is in use")
	// ErrSchemaTooNew: the database was migrated by a newer sandboxd than this one.
	ErrSchemaTooNew = errors.New("database schema is newer than this binary")
)

// Keys reported by AlreadyExistsError.
const (
	KeyID        = "id"
	KeyRunnerID  = "runner_id"
	KeyClusterID = "cluster_id"
	KeyRequestID = "request_id"
	KeyHash      = "hash"
	KeyVersion   = "version"
	// KeyClusterID is also the key of a taken Cluster id.
)

// AlreadyExistsError says which unique key a create collided on. It matches ErrAlreadyExists.
type AlreadyExistsError struct {
	Entity string // "organization", "api_key", "runner", "bootstrap_token", "sandbox", "release"
	Key    string // KeyID, KeyRunnerID, KeyClusterID, KeyRequestID, KeyHash, KeyVersion
}

func (e *AlreadyExistsError) Error() string {
	return fmt.Sprintf("%s with this %s already exists", e.Entity, e.Key)
}

// Is makes errors.Is(err, ErrAlreadyExists) hold.
func (e *AlreadyExistsError) Is(target error) bool { return target == ErrAlreadyExists }
