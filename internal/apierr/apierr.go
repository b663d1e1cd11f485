// Package apierr builds the errors of the public API (AIP-193): a status code with
// google.rpc.ErrorInfo (domain cwsandbox.com, a CWSANDBOX_* reason, metadata), and where
// they fit google.rpc.BadRequest field violations and google.rpc.RetryInfo. The official
// clients map reasons in this domain to their exception classes.
package apierr

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the ErrorInfo domain the clients trust.
const Domain = "cwsandbox.com"

// Reasons. Each has exactly one status code, in codes below; New takes it from there, so a
// call site names the reason and never pairs it with another code. docs/api.md lists the
// table (TestDocsTable keeps it true).
const (
	InvalidRequest   = "CWSANDBOX_INVALID_REQUEST"
	InvalidPath      = "CWSANDBOX_INVALID_PATH"
	Unauthenticated  = "CWSANDBOX_UNAUTHENTICATED"
	PermissionDenied = "CWSANDBOX_PERMISSION_DENIED"
	// SourceIPNotAllowed: the runner's policy (control_plane_access.source_ip_allowlist)
	// does not allow Sandbox API calls from the caller's address (PERMISSION_DENIED;
	// metadata source_ip names the address seen, runner_id the runner).
	SourceIPNotAllowed = "CWSANDBOX_SOURCE_IP_NOT_ALLOWED"
	NotImplemented     = "CWSANDBOX_NOT_IMPLEMENTED"
	SandboxNotFound    = "CWSANDBOX_SANDBOX_NOT_FOUND"
	SandboxNotRunning  = "CWSANDBOX_SANDBOX_NOT_RUNNING"
	// ContainerNotFound: the sandbox has no container of the name a data call gave
	// (NOT_FOUND; metadata "container" names it, since the official client rewrites the
	// message of a NOT_FOUND).
	ContainerNotFound    = "CWSANDBOX_CONTAINER_NOT_FOUND"
	PlacementRejected    = "CWSANDBOX_PLACEMENT_REJECTED"
	NoSuitableRunner     = "CWSANDBOX_NO_SUITABLE_RUNNER"
	RunnerUnavailable    = "CWSANDBOX_RUNNER_UNAVAILABLE"
	RunnerNotFound       = "CWSANDBOX_RUNNER_NOT_FOUND"
	CommandTimeout       = "CWSANDBOX_COMMAND_TIMEOUT"
	FileNotFound         = "CWSANDBOX_FILE_NOT_FOUND"
	FileIsDirectory      = "CWSANDBOX_FILE_IS_DIRECTORY"
	FilePermissionDenied = "CWSANDBOX_FILE_PERMISSION_DENIED"
	FileTooLarge         = "CWSANDBOX_FILE_TOO_LARGE"
	FileNotRegular       = "CWSANDBOX_FILE_NOT_REGULAR" // a FIFO, socket or device: not read through the API
	FileIOFailed         = "CWSANDBOX_FILE_IO_FAILED"
	// File-system snapshots (issue 20): every CWSANDBOX_FSS_* reason the official clients
	// map. The terminal ones are FileSystemSnapshot state reasons as well as call errors.
	FSSNotFound           = "CWSANDBOX_FSS_NOT_FOUND"
	FSSNotReady           = "CWSANDBOX_FSS_NOT_READY"
	FSSNotSupported       = "CWSANDBOX_FSS_NOT_SUPPORTED"
	FSSSizeExceeded       = "CWSANDBOX_FSS_SIZE_EXCEEDED"
	FSSQuotaExceeded      = "CWSANDBOX_FSS_QUOTA_EXCEEDED"
	FSSBucketMismatch     = "CWSANDBOX_FSS_BUCKET_MISMATCH"
	FSSBucketUnavailable  = "CWSANDBOX_FSS_BUCKET_UNAVAILABLE"
	FSSBucketProvisioning = "CWSANDBOX_FSS_BUCKET_PROVISIONING"
	FSSRestoreFailed      = "CWSANDBOX_FSS_RESTORE_FAILED"
	FSSCreateFailed       = "CWSANDBOX_FSS_CREATE_FAILED"
	FSSCreateTimedOut     = "CWSANDBOX_FSS_CREATE_TIMED_OUT"
	FSSAuthFailed         = "CWSANDBOX_FSS_AUTH_FAILED"
	FSSTransportFailed    = "CWSANDBOX_FSS_TRANSPORT_FAILED"
	FSSWaitTimeout        = "CWSANDBOX_FSS_WAIT_TIMEOUT"
	FSSCanceled           = "CWSANDBOX_FSS_CANCELED"
	FSSBackendThrottled   = "CWSANDBOX_FSS_BACKEND_THROTTLED"
	FSSInflightLimit      = "CWSANDBOX_FSS_INFLIGHT_LIMIT"
	// VolumeNotSnapshottable: the volume named for a snapshot is not a scratch volume
	// (a registered volume).
	VolumeNotSnapshottable  = "CWSANDBOX_VOLUME_NOT_SNAPSHOTTABLE"
	ResourceCeilingExceeded = "CWSANDBOX_RESOURCE_CEILING_EXCEEDED"
	// Registered volumes (VolumeService, issue 23): the reasons the official client maps.
	VolumeNotFound          = "CWSANDBOX_VOLUME_NOT_FOUND"
	VolumeNotReady          = "CWSANDBOX_VOLUME_NOT_READY"
	VolumePlacementConflict = "CWSANDBOX_VOLUME_PLACEMENT_CONFLICT"
	VolumeTypeNotSupported  = "CWSANDBOX_VOLUME_TYPE_NOT_SUPPORTED"
	VolumeRunnerIneligible  = "CWSANDBOX_VOLUME_RUNNER_INELIGIBLE"
	VolumeInUse             = "CWSANDBOX_VOLUME_IN_USE"
	// VolumeBusy (sandboxd's own): another live sandbox holds the read-write mount of a
	// GLOBAL volume (single writer; metadata volume_id, sandbox_id of the holder).
	VolumeBusy = "CWSANDBOX_VOLUME_BUSY"
	// VolumeSubPathNotDirectory (sandboxd's own, the agent's ExtractPath with sub_dirs):
	// the volume's content holds a file or symlink where a container mounts a sub_path
	// (or on the way to one); the Kubernetes runner fails the sandbox (an invalid spec).
	VolumeSubPathNotDirectory = "CWSANDBOX_VOLUME_SUB_PATH_NOT_DIRECTORY"
	// CheckpointNotSupported (sandboxd's own, issue 21): the sandbox's runtime class
	// cannot be checkpointed on its runner (a pause releasing resources, a fork); the
	// message names the runtime class that can.
	CheckpointNotSupported = "CWSANDBOX_CHECKPOINT_NOT_SUPPORTED"
	// NodeAgentUnavailable (sandboxd's own, issue 21): on a Kubernetes runner, the node
	// agent on the sandbox's node that a pause, resume or checkpoint needs cannot be
	// reached now (UNAVAILABLE, RetryInfo); the sandbox is left as it was.
	NodeAgentUnavailable = "CWSANDBOX_NODE_AGENT_UNAVAILABLE"
	// NodeAgentRefused (sandboxd's own, issue 21): that node agent answered and refused
	// (FAILED_PRECONDITION); the message is a fixed sentence, the agent's reason is in
	// the runner's log.
	NodeAgentRefused = "CWSANDBOX_NODE_AGENT_REFUSED"
	// CheckpointSpaceExhausted (sandboxd's own, issue 21): the checkpoint store has no
	// room for the checkpoint a pause releasing resources or a fork needs
	// (RESOURCE_EXHAUSTED, runtime.ErrCheckpointSpaceExhausted, whichever backend says
	// it: a local runner's --checkpoint-quota-bytes or --checkpoint-min-free-bytes, a
	// Kubernetes runner's node agent's --quota-bytes or --min-free-bytes). The sandbox is
	// left as it was.
	CheckpointSpaceExhausted = "CWSANDBOX_CHECKPOINT_SPACE_EXHAUSTED"
	RunnerCapacityExhausted  = "CWSANDBOX_RUNNER_CAPACITY_EXHAUSTED"
	// QuotaExceeded (sandboxd's own, issue 23): the organization's quota (sandboxes, CPU
	// or memory of its live sandboxes) has no room for the create (RESOURCE_EXHAUSTED,
	// which the official client maps to SandboxResourceExhaustedError).
	QuotaExceeded = "CWSANDBOX_QUOTA_EXCEEDED"
	// HTTPSShareTokenNotSupported: no runner that may take the sandbox can check the
	// share token of an HTTPS SHARE_TOKEN endpoint (FAILED_PRECONDITION).
	HTTPSShareTokenNotSupported = "CWSANDBOX_HTTPS_SHARE_TOKEN_NOT_SUPPORTED"
	// ServerBusy: the server buffers as many request bytes as it may (RESOURCE_EXHAUSTED).
	ServerBusy = "CWSANDBOX_SERVER_BUSY"
	// RouteNotFound: no REST route has the request's path (NOT_FOUND, HTTP 404).
	RouteNotFound = "CWSANDBOX_ROUTE_NOT_FOUND"
	// BackendUnavailable: a store the call needs (the API keys) cannot answer now; the
	// official clients retry it like RunnerUnavailable.
	BackendUnavailable = "CWSANDBOX_BACKEND_UNAVAILABLE"
	// RequestIDConflict: the request_id already created a sandbox from a different
	// request (CreateSandboxFromFile: other file bytes or options).
	RequestIDConflict = "CWSANDBOX_REQUEST_ID_CONFLICT"
	// Sandbox templates (issue 22).
	TemplateNotFound      = "CWSANDBOX_TEMPLATE_NOT_FOUND"
	TemplateLimitExceeded = "CWSANDBOX_TEMPLATE_LIMIT_EXCEEDED"
	// Image builds (issue 22, sandboxd.build.v1.BuildService).
	BuildNotFound = "CWSANDBOX_BUILD_NOT_FOUND"
	// BuildContextNotFound: a build_context_objects entry names no object of the caller's
	// organization (another organization's is not found alike).
	BuildContextNotFound = "CWSANDBOX_BUILD_CONTEXT_NOT_FOUND"
	// BuildContextLimitExceeded: the organization holds as many uploaded build contexts
	// (count or bytes) as it may.
	BuildContextLimitExceeded = "CWSANDBOX_BUILD_CONTEXT_LIMIT_EXCEEDED"
	// BuildNotSupported: no runner can build (the gvisor class and a builder image), or
	// the platform has no registry to push to; the message says which.
	BuildNotSupported = "CWSANDBOX_BUILD_NOT_SUPPORTED"
	// BuildStorageUnavailable: an organization's own build storage (build storage mode
	// CUSTOMER_OWNED) cannot be used: no S3 endpoint is allowed, the location is not one,
	// the bucket does not exist, or its credentials cannot write, read and delete there.
	BuildStorageUnavailable = "CWSANDBOX_BUILD_STORAGE_UNAVAILABLE"
	// BuildFailed: a Compose service's image build failed, so the sandbox was not
	// created; the message names the service and the failing step.
	BuildFailed = "CWSANDBOX_BUILD_FAILED"
	// Secret stores (issue 23 point 2, docs/secrets.md). SecretStoreNotProvisioned is the
	// target's: a container references a store the organization does not have (also
	// PutSecret into one). SecretNotProvisioned: the store has no secret at a referenced
	// path and field (or its value is no pull credential).
	SecretStoreNotProvisioned = "CWSANDBOX_SECRET_STORE_NOT_PROVISIONED"
	SecretNotProvisioned      = "CWSANDBOX_SECRET_NOT_PROVISIONED"
	SecretStoreNotFound       = "CWSANDBOX_SECRET_STORE_NOT_FOUND"
	SecretNotFound            = "CWSANDBOX_SECRET_NOT_FOUND"
	// SecretLimitExceeded: the organization has as many secret stores, or the store as
	// many secrets, as it may (metadata limit).
	SecretLimitExceeded = "CWSANDBOX_SECRET_LIMIT_EXCEEDED"
	// SecretStoreProviderUnsupported: a secret store of a provider sandboxd does not
	// build (WANDB).
	SecretStoreProviderUnsupported = "CWSANDBOX_SECRET_STORE_PROVIDER_UNSUPPORTED"
)

// Reasons of the control plane's own API (runners, registration, API keys).
const (
	AlreadyExists           = "CWSANDBOX_ALREADY_EXISTS"
	EtagMismatch            = "CWSANDBOX_ETAG_MISMATCH"
	RunnerInUse             = "CWSANDBOX_RUNNER_IN_USE"
	NoUpdateAvailable       = "CWSANDBOX_NO_UPDATE_AVAILABLE"
	APIKeyNotFound          = "CWSANDBOX_API_KEY_NOT_FOUND"
	ControlPlaneUnavailable = "CWSANDBOX_CONTROL_PLANE_UNAVAILABLE"
	// ControlPlaneStoreUnverified: a gateway given --control-plane forwards admin calls
	// only once the control plane proved it uses the gateway's store (UNAVAILABLE, RetryInfo).
	ControlPlaneStoreUnverified = "CWSANDBOX_CONTROL_PLANE_STORE_UNVERIFIED"
	// ControlPlaneStoreMismatch: the gateway's control plane proved another store than the
	// gateway's; admin calls are refused until the gateway restarts on one store (FAILED_PRECONDITION).
	ControlPlaneStoreMismatch = "CWSANDBOX_CONTROL_PLANE_STORE_MISMATCH"
	BootstrapTokenInvalid     = "CWSANDBOX_BOOTSTRAP_TOKEN_INVALID"
	// RunnerIdentityMismatch: the runner's client certificate names another runner (or
	// no runner); a call without a client certificate is Unauthenticated.
	RunnerIdentityMismatch = "CWSANDBOX_RUNNER_IDENTITY_MISMATCH"
	RegistrationDisabled   = "CWSANDBOX_REGISTRATION_DISABLED"
	// RunnerIDTaken: the runner's runner_id is also held by an earlier-created runner of
	// another organization (a duplicate from before runner IDs were unique across
	// organizations), so no certificate naming it is issued to this runner.
	RunnerIDTaken = "CWSANDBOX_RUNNER_ID_TAKEN"
	// RunnerIDReserved: runner IDs beginning "platform-" are the platform organization's
	// (controlplane.ReservedRunnerIDPrefix); another organization may not create one.
	RunnerIDReserved = "CWSANDBOX_RUNNER_ID_RESERVED"
	ReleaseNotFound  = "CWSANDBOX_RELEASE_NOT_FOUND"
	// ReleaseNotPromotable: the release is not on RAPID, or STABLE offers a higher version.
	ReleaseNotPromotable = "CWSANDBOX_RELEASE_NOT_PROMOTABLE"
	// ReleaseSignatureInvalid: the release manifest's signature does not verify with any
	// of the control plane's trusted release keys (signed release manifests, issue 18).
	ReleaseSignatureInvalid = "CWSANDBOX_RELEASE_SIGNATURE_INVALID"
	// ReleaseSignatureRequired: the control plane trusts release keys, so it publishes
	// only signed release manifests, not bare records.
	ReleaseSignatureRequired = "CWSANDBOX_RELEASE_SIGNATURE_REQUIRED"
	// ReleaseKeysNotConfigured: a signed release manifest was sent to a control plane that
	// trusts no release key, so it has nothing to verify the signature with.
	ReleaseKeysNotConfigured = "CWSANDBOX_RELEASE_KEYS_NOT_CONFIGURED"
	// ReleaseArtifactNotFound: the control plane's release directory has no such binary
	// for a published release (RunnerReleaseService.DownloadArtifact).
	ReleaseArtifactNotFound = "CWSANDBOX_RELEASE_ARTIFACT_NOT_FOUND"
	// ReleaseArtifactsDisabled: the control plane serves no release binaries (no
	// --release-dir).
	ReleaseArtifactsDisabled = "CWSANDBOX_RELEASE_ARTIFACTS_DISABLED"
	// ReleaseDownloadsBusy: the runner already has as many release downloads in flight as
	// one runner may (RunnerReleaseService.DownloadArtifact); retry when one ends.
	ReleaseDownloadsBusy = "CWSANDBOX_RELEASE_DOWNLOADS_BUSY"
	// Clusters (issue 18): a registered cluster, and the control plane's installs into it.
	ClusterNotFound = "CWSANDBOX_CLUSTER_NOT_FOUND"
	// ClusterInUse: a runner names the cluster; delete the runner first.
	ClusterInUse = "CWSANDBOX_CLUSTER_IN_USE"
	// ClustersDisabled: the control plane has no key to seal cluster credentials with.
	ClustersDisabled = "CWSANDBOX_CLUSTERS_DISABLED"
	// ClusterServerShared: another organization registered a cluster of that API server
	// URL; one cluster shared by organizations would undo the isolation between them.
	ClusterServerShared = "CWSANDBOX_CLUSTER_SERVER_SHARED"
	// UninstallFailed: deleting an installed runner could not remove its objects.
	UninstallFailed = "CWSANDBOX_UNINSTALL_FAILED"
	// Install reasons: ManagedRunnerStatus.install_error.reason of a FAILED install (and the
	// install_reason metadata of UninstallFailed). Never a call's own status.
	InstallForbidden       = "CWSANDBOX_INSTALL_FORBIDDEN"
	InstallUnauthenticated = "CWSANDBOX_INSTALL_UNAUTHENTICATED"
	InstallConflict        = "CWSANDBOX_INSTALL_CONFLICT"
	InstallRejected        = "CWSANDBOX_INSTALL_REJECTED"
	InstallTimeout         = "CWSANDBOX_INSTALL_TIMEOUT"
	InstallFailed          = "CWSANDBOX_INSTALL_FAILED"
	InstallNotConfigured   = "CWSANDBOX_INSTALL_NOT_CONFIGURED"
	InstallCredential      = "CWSANDBOX_INSTALL_CREDENTIAL"
	InstallNoHeartbeat     = "CWSANDBOX_INSTALL_NO_HEARTBEAT"
)

// reasonCode is one row of the table: a reason, its one code, and when it is sent.
type reasonCode struct {
	reason string
	code   connect.Code
	when   string
}

// table pairs every reason with its status code, once. The code follows what the
// official clients do with it (client-protocol.md §6): they map NOT_FOUND,
// UNAUTHENTICATED/PERMISSION_DENIED, UNAVAILABLE, RESOURCE_EXHAUSTED and INVALID_ARGUMENT
// to exception classes when they do not know the reason, so the code must say the same
// thing as the reason.
var table = []reasonCode{
	{InvalidRequest, connect.CodeInvalidArgument, "a request field is wrong; BadRequest names each"},
	{InvalidPath, connect.CodeInvalidArgument, "a file path is empty, too long, or has a NUL byte or a \"..\" element"},
	{Unauthenticated, connect.CodeUnauthenticated, "no API key, or one that is not valid"},
	{PermissionDenied, connect.CodePermissionDenied, "the key may not make this call"},
	{SourceIPNotAllowed, connect.CodePermissionDenied, "the runner's policy (control_plane_access.source_ip_allowlist) does not allow calls from the caller's address; metadata source_ip names it"},
	{NotImplemented, connect.CodeUnimplemented, "sandboxd does not build this RPC or feature (yet)"},
	{SandboxNotFound, connect.CodeNotFound, "no such sandbox visible to the caller"},
	{SandboxNotRunning, connect.CodeFailedPrecondition, "the sandbox is not running (yet or any more)"},
	{ContainerNotFound, connect.CodeNotFound, "the sandbox has no container of that name (metadata container)"},
	{PlacementRejected, connect.CodeInvalidArgument, "the one runner that may take the sandbox rejects it (policy)"},
	{NoSuitableRunner, connect.CodeFailedPrecondition, "no runner can take the sandbox; BadRequest names each runner's reasons"},
	{RunnerUnavailable, connect.CodeUnavailable, "the sandbox's runner cannot be reached now, or answered a call wrongly (the message says how); retry"},
	{RunnerNotFound, connect.CodeNotFound, "no such runner"},
	{CommandTimeout, connect.CodeDeadlineExceeded, "the command ran past its timeout"},
	{FileNotFound, connect.CodeNotFound, "no such file in the sandbox (metadata filepath)"},
	{FileIsDirectory, connect.CodeFailedPrecondition, "the path is a directory"},
	{FilePermissionDenied, connect.CodePermissionDenied, "the sandbox may not read or write the path"},
	{FileTooLarge, connect.CodeResourceExhausted, "the file exceeds the unary limit (metadata size_bytes, max_size_bytes)"},
	{FileNotRegular, connect.CodeFailedPrecondition, "a FIFO, socket or device: not read through the API"},
	{FileIOFailed, connect.CodeInternal, "reading or writing the file failed"},
	{FSSNotFound, connect.CodeNotFound, "no such file-system snapshot visible to the caller (also at create: restore_from_snapshot_id)"},
	{FSSNotReady, connect.CodeFailedPrecondition, "the snapshot is not READY (CREATING, FAILED or DELETING) for what was asked"},
	{FSSNotSupported, connect.CodeFailedPrecondition, "no file-system snapshots here: the gateway has no blob store, or the sandbox's runner takes none"},
	{FSSSizeExceeded, connect.CodeFailedPrecondition, "the snapshot does not fit: its content exceeds the volume's size, or the archive the maximum snapshot size"},
	{FSSQuotaExceeded, connect.CodeResourceExhausted, "the organization's snapshot count or bytes quota is used up (metadata quota, limit, current)"},
	{FSSBucketMismatch, connect.CodeFailedPrecondition, "the snapshot lives in another bucket than the one configured now"},
	{FSSBucketUnavailable, connect.CodeFailedPrecondition, "the snapshot object store or the organization's bucket cannot be used"},
	{FSSBucketProvisioning, connect.CodeUnavailable, "the snapshot bucket is being provisioned; retry"},
	{FSSRestoreFailed, connect.CodeInternal, "restoring a volume from its snapshot failed (download, check or extraction)"},
	{FSSCreateFailed, connect.CodeInternal, "taking the snapshot failed (capture, archive or upload)"},
	{FSSCreateTimedOut, connect.CodeDeadlineExceeded, "taking the snapshot ran past its deadline"},
	{FSSAuthFailed, connect.CodeFailedPrecondition, "the blob store refused the platform's credentials"},
	{FSSTransportFailed, connect.CodeUnavailable, "talking to the blob store failed"},
	{FSSWaitTimeout, connect.CodeDeadlineExceeded, "waiting for the snapshot to be READY ran past its budget"},
	{FSSCanceled, connect.CodeAborted, "the snapshot was canceled before it completed (its sandbox ended)"},
	{FSSBackendThrottled, connect.CodeUnavailable, "the snapshot backend is busy; retry"},
	{FSSInflightLimit, connect.CodeUnavailable, "as many snapshots are in flight as allowed (per sandbox or runner); retry"},
	{VolumeNotSnapshottable, connect.CodeInvalidArgument, "the volume named for a snapshot is not a scratch volume of the sandbox"},
	{VolumeNotFound, connect.CodeNotFound, "no such registered volume visible to the caller (metadata volume_id)"},
	{VolumeNotReady, connect.CodeFailedPrecondition, "the registered volume a sandbox mounts is not READY (VALIDATING, ERROR or DELETING)"},
	{VolumePlacementConflict, connect.CodeFailedPrecondition, "the sandbox mounts a CLUSTER_LOCAL volume of a runner its runner_ids exclude, or volumes of two runners"},
	{VolumeTypeNotSupported, connect.CodeFailedPrecondition, "the volume's runner cannot hold registered volumes (its backend holds none, or they are unavailable on its host)"},
	{VolumeSubPathNotDirectory, connect.CodeFailedPrecondition, "the volume's content holds a file or symlink where a container mounts a sub_path, a working directory or a nested mount point (or on the way to one)"},
	{VolumeRunnerIneligible, connect.CodeFailedPrecondition, "the volume's runner_id names no runner of the organization, or its namespace is not the runner's"},
	{VolumeInUse, connect.CodeFailedPrecondition, "live sandboxes mount the volume (metadata sandbox_ids); delete them first or force"},
	{VolumeBusy, connect.CodeFailedPrecondition, "another live sandbox holds the one read-write mount of the GLOBAL volume (metadata volume_id, sandbox_id); mount it read-only, or retry once that sandbox ended"},
	{CheckpointNotSupported, connect.CodeFailedPrecondition, "the sandbox's runtime class cannot be checkpointed here (pause releasing resources, fork); the message names one that can"},
	{NodeAgentUnavailable, connect.CodeUnavailable, "on a Kubernetes runner, the node agent of the sandbox's node (pause, resume, checkpoint) cannot be reached now; RetryInfo says when to retry"},
	{NodeAgentRefused, connect.CodeFailedPrecondition, "on a Kubernetes runner, the node agent of the sandbox's node refused the pause, resume or checkpoint (its reason is in the runner's log)"},
	{CheckpointSpaceExhausted, connect.CodeResourceExhausted, "the checkpoint store has no room for the checkpoint of a pause or fork (a local runner: its `--checkpoint-quota-bytes` or `--checkpoint-min-free-bytes`, named in the message; a Kubernetes runner: the node agent's quota or free space on the sandbox's node); the sandbox is left as it was"},
	{ResourceCeilingExceeded, connect.CodeInvalidArgument, "every violation is a sandbox-wide resource ceiling (total_*)"},
	{RunnerCapacityExhausted, connect.CodeResourceExhausted, "no runner has room now; RetryInfo says when to retry"},
	{QuotaExceeded, connect.CodeResourceExhausted, "the organization's quota has no room for the create: metadata quota (sandboxes, cpu_millicores, memory_bytes), limit, current, requested"},
	{HTTPSShareTokenNotSupported, connect.CodeFailedPrecondition, "no runner that may take the sandbox can check an HTTPS share token"},
	{ServerBusy, connect.CodeResourceExhausted, "the server buffers as many request bytes as it may; retry"},
	{RouteNotFound, connect.CodeNotFound, "no REST route has the request's path (HTTP 404)"},
	{BackendUnavailable, connect.CodeUnavailable, "a store the call needs (the API keys) cannot answer now; retry"},
	{RequestIDConflict, connect.CodeInvalidArgument, "the request_id already created a sandbox (or template) from a different request (another file's bytes, other options, another template)"},
	{TemplateNotFound, connect.CodeNotFound, "no such sandbox template visible to the caller (by ID or display name; deleted ones only with show_deleted)"},
	{TemplateLimitExceeded, connect.CodeResourceExhausted, "the organization has as many templates as it may (metadata limit)"},
	{BuildNotFound, connect.CodeNotFound, "no such image build in the caller's organization"},
	{BuildContextNotFound, connect.CodeNotFound, "no such build context object of the caller's organization (bucket, key, version_id)"},
	{BuildContextLimitExceeded, connect.CodeResourceExhausted, "the organization holds as many uploaded build contexts (count or bytes) as it may; delete none needed or wait for retention (metadata limit, current)"},
	{BuildStorageUnavailable, connect.CodeFailedPrecondition, "the organization's own build storage (CUSTOMER_OWNED) cannot be used: endpoint, bucket or credentials; the violations say which"},
	{BuildNotSupported, connect.CodeFailedPrecondition, "no runner can build images (gvisor class and a builder image), or there is no platform registry; the message says which"},
	{BuildFailed, connect.CodeFailedPrecondition, "a Compose service's image build failed (CreateSandboxFromFile): metadata service, build_id, failure_reason; the message names the failing step"},
	{SecretStoreNotProvisioned, connect.CodeFailedPrecondition, "a container (or PutSecret) names a secret store the organization does not have; BadRequest names the field"},
	{SecretNotProvisioned, connect.CodeFailedPrecondition, "the secret store has no secret at a referenced path and field, or its value is no pull credential; BadRequest names each"},
	{SecretStoreNotFound, connect.CodeNotFound, "no such secret store in the caller's organization"},
	{SecretNotFound, connect.CodeNotFound, "no such secret (path, field) in the store"},
	{SecretLimitExceeded, connect.CodeResourceExhausted, "the organization has as many secret stores, or the store as many secrets, as it may (metadata limit)"},
	{SecretStoreProviderUnsupported, connect.CodeFailedPrecondition, "the secret store's provider_type is not built by sandboxd (WANDB; use UNSPECIFIED, SANDBOXD or KUBERNETES), or the call does not apply to it (PutSecret into a KUBERNETES store; a KUBERNETES store's secrets on a local runner)"},
	{AlreadyExists, connect.CodeAlreadyExists, "a runner with that runner_id exists (in any organization: runner IDs name endpoint hosts and certificates platform-wide), or one for that cluster, or a release of that version, or a template of that display name"},
	{EtagMismatch, connect.CodeAborted, "the etag is not the current one; read again"},
	{RunnerInUse, connect.CodeFailedPrecondition, "the runner owns live sandboxes"},
	{NoUpdateAvailable, connect.CodeFailedPrecondition, "there is nothing to apply"},
	{APIKeyNotFound, connect.CodeNotFound, "no such API key"},
	{ControlPlaneUnavailable, connect.CodeUnavailable, "the control plane's store cannot answer now; retry"},
	{ControlPlaneStoreUnverified, connect.CodeUnavailable, "the gateway has not verified yet that its control plane uses the gateway's store (--control-plane); retry"},
	{ControlPlaneStoreMismatch, connect.CodeFailedPrecondition, "the gateway's control plane uses another store than the gateway: admin calls are refused until both use one store and the gateway restarts"},
	{BootstrapTokenInvalid, connect.CodeUnauthenticated, "the bootstrap token is used, expired or unknown"},
	{RunnerIdentityMismatch, connect.CodePermissionDenied, "the runner's client certificate names another runner, or none"},
	{RunnerIDReserved, connect.CodePermissionDenied, "runner IDs beginning platform- are reserved for the platform organization's runners; choose another runner_id"},
	{RunnerIDTaken, connect.CodeFailedPrecondition, "the runner's runner_id is also held by an earlier-created runner of another organization: no certificate naming it (registration, edge, data plane) is issued; delete the runner and create one with another runner_id"},
	{RegistrationDisabled, connect.CodeFailedPrecondition, "this control plane has no CA for what is asked (registration, edge or data-plane certificates)"},
	{ReleaseNotFound, connect.CodeNotFound, "no release of that version"},
	{ReleaseNotPromotable, connect.CodeFailedPrecondition, "the release is not on RAPID, or STABLE offers a higher version"},
	{ReleaseSignatureInvalid, connect.CodeInvalidArgument, "the release manifest's signature does not verify with any trusted release key"},
	{ReleaseSignatureRequired, connect.CodeFailedPrecondition, "the control plane trusts release keys: publish a signed release manifest, not a record"},
	{ReleaseKeysNotConfigured, connect.CodeFailedPrecondition, "the control plane trusts no release key: it cannot verify a signed release manifest"},
	{ReleaseArtifactNotFound, connect.CodeNotFound, "the control plane's release directory has no such binary of the release"},
	{ReleaseArtifactsDisabled, connect.CodeFailedPrecondition, "the control plane serves no release binaries (no --release-dir)"},
	{ReleaseDownloadsBusy, connect.CodeResourceExhausted, "the runner already has as many release downloads in flight as one runner may; retry"},
	{ClusterNotFound, connect.CodeNotFound, "no such cluster"},
	{ClusterInUse, connect.CodeFailedPrecondition, "a runner names the cluster"},
	{ClustersDisabled, connect.CodeFailedPrecondition, "this control plane keeps no key to seal cluster credentials with"},
	{ClusterServerShared, connect.CodeFailedPrecondition, "another organization registered a cluster of that API server"},
	{UninstallFailed, connect.CodeFailedPrecondition, "the control plane could not remove an installed runner's objects from its cluster"},
	{InstallForbidden, connect.CodeFailedPrecondition, "install: the cluster credential lacks RBAC for an object the runner needs (HTTP 403)"},
	{InstallUnauthenticated, connect.CodeFailedPrecondition, "install: the API server does not accept the cluster credential (HTTP 401)"},
	{InstallConflict, connect.CodeFailedPrecondition, "install: an object exists and another manager owns it"},
	{InstallRejected, connect.CodeFailedPrecondition, "install: the API server rejected an object (invalid, bad request)"},
	{InstallTimeout, connect.CodeFailedPrecondition, "install: the API server did not answer in time"},
	{InstallFailed, connect.CodeFailedPrecondition, "install: another error talking to the cluster"},
	{InstallNotConfigured, connect.CodeFailedPrecondition, "install: the control plane lacks the --install-* flags or a CA"},
	{InstallCredential, connect.CodeFailedPrecondition, "install: the cluster's stored credential cannot be opened or used"},
	{InstallNoHeartbeat, connect.CodeFailedPrecondition, "install: applied, but the runner did not heartbeat in time"},
}
var codes = func() map[string]connect.Code {
	m := make(map[string]connect.Code, len(table))
	for _, r := range table {
		m[r.reason] = r.code
	}
	return m
}()

// Code is the status code of reason; CodeUnknown for a reason not in the table (a test
// checks that every reason constant is).
func Code(reason string) connect.Code {
	if c, ok := codes[reason]; ok {
		return c
	}
	return connect.CodeUnknown
}

// Known reports whether reason is in the table.
func Known(reason string) bool {
	_, ok := codes[reason]
	return ok
}

// IsSnapshotReason reports whether reason is one of the file-system snapshot reasons
// (CWSANDBOX_FSS_*) of the table.
func IsSnapshotReason(reason string) bool {
	return Known(reason) && strings.HasPrefix(reason, "CWSANDBOX_FSS_")
}

// Violation names a request field and what is wrong with it.
type Violation struct {
	Field       string
	Description string
}

// Describe joins violations as "FIELD DESCRIPTION; FIELD DESCRIPTION" for a message.
func Describe(vs []Violation) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = v.Field + " " + v.Description
	}
	return strings.Join(parts, "; ")
}

// New returns an error with reason's code and an ErrorInfo of reason and metadata.
//
// msg and meta may quote what a caller sent (a path, a name, a header) and so hold bytes
// that are not UTF-8; New makes them valid (see utf8Valid), so the error always carries
// its ErrorInfo and marshals.
func New(reason, msg string, meta map[string]string) *connect.Error {
	err := connect.NewError(Code(reason), errors.New(utf8Valid(msg)))
	if d, derr := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: validMap(meta)}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// utf8Valid returns s with every run of bytes that is not UTF-8 replaced by U+FFFD.
// Protobuf strings must be UTF-8: one bad byte in a detail's field makes the detail fail
// to marshal (it would be dropped), and a status message that is not UTF-8 makes the
// whole gRPC status fail to marshal (the client gets INTERNAL instead of the error).
func utf8Valid(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// validMap is m with utf8Valid keys and values (m itself when they all are).
func validMap(m map[string]string) map[string]string {
	ok := true
	for k, v := range m {
		ok = ok && utf8.ValidString(k) && utf8.ValidString(v)
	}
	if ok {
		return m
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[utf8Valid(k)] = utf8Valid(v)
	}
	return out
}

// validMessage is err, or when its message is not UTF-8 (an error that New did not
// make) a copy with a valid message, its code, details and metadata: a detail added
// to it could not be sent otherwise. The copy does not wrap err's cause.
func validMessage(err *connect.Error) *connect.Error {
	if utf8.ValidString(err.Message()) {
		return err
	}
	out := connect.NewError(err.Code(), errors.New(utf8Valid(err.Message())))
	for _, d := range err.Details() {
		out.AddDetail(d)
	}
	for k, vs := range err.Meta() {
		out.Meta()[k] = vs
	}
	return out
}

// Newf is New with a formatted message and no metadata.
func Newf(reason, format string, args ...any) *connect.Error {
	return New(reason, fmt.Sprintf(format, args...), nil)
}

// Invalid returns reason (one whose code is INVALID_ARGUMENT) with a BadRequest listing
// violations.
func Invalid(reason, msg string, vs []Violation) *connect.Error {
	return WithViolations(New(reason, msg, nil), vs)
}

// PageSize is a list request's page_size as a page size: 0 is def, above max is max, and
// a negative size is INVALID_ARGUMENT CWSANDBOX_INVALID_REQUEST naming page_size.
func PageSize(got int32, def, max int) (int, error) {
	switch {
	case got < 0:
		return 0, Invalid(InvalidRequest, "page_size must not be negative", []Violation{{Field: "page_size", Description: "must not be negative"}})
	case got == 0:
		return def, nil
	}
	return min(int(got), max), nil
}

// WithViolations adds a BadRequest listing vs (nothing when vs is empty). Fields and
// descriptions may quote what a caller sent: they are made valid UTF-8 as in New.
func WithViolations(err *connect.Error, vs []Violation) *connect.Error {
	err = validMessage(err)
	if len(vs) == 0 {
		return err
	}
	br := &errdetails.BadRequest{}
	for _, v := range vs {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: utf8Valid(v.Field), Description: utf8Valid(v.Description)})
	}
	if d, derr := connect.NewErrorDetail(br); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// WithRetry adds RetryInfo: the client should wait delay before trying again.
func WithRetry(err *connect.Error, delay time.Duration) *connect.Error {
	err = validMessage(err)
	if d, derr := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// Info returns the ErrorInfo of err in our domain, or nil.
func Info(err error) *errdetails.ErrorInfo {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if info, ok := v.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info
		}
	}
	return nil
}

// RetryInfo returns the RetryInfo of err (what WithRetry adds), or nil.
func RetryInfo(err error) *errdetails.RetryInfo {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if ri, ok := v.(*errdetails.RetryInfo); ok {
				return ri
			}
		}
	}
	return nil
}

// Reason returns err's CWSANDBOX_* reason, or "".
func Reason(err error) string {
	return Info(err).GetReason()
}

// Violations returns the BadRequest field violations of err.
func Violations(err error) []Violation {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	var out []Violation
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if br, ok := v.(*errdetails.BadRequest); ok {
			for _, fv := range br.GetFieldViolations() {
				out = append(out, Violation{Field: fv.GetField(), Description: fv.GetDescription()})
			}
		}
	}
	return out
}
