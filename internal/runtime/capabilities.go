package runtime

import (
	"context"
	"time"

	"github.com/sandboxd/sandboxd/internal/logstore"
	"github.com/sandboxd/sandboxd/internal/reserved"
)

// Support says what a runner cannot do, whatever its policy says. It is the one struct a
// capability travels in, under one name, from the backend (SupportReporter) through the
// runner, its capacity (runner.proto CapacityResponse) and the gateway's view of it to
// placement and policy.Platform, which refuses what the runner lacks, so that a sandbox
// goes to a runner that can rather than run with part of its spec silently dropped.
// Embedded where it travels, a capability added here reaches every hop; only the runner
// wire converts field by field.
//
// The zero value can do everything: a field names a lack.
type Support struct {
	// NoDNSEgress: egress rules by host name (EgressRule.DNSName) cannot be enforced,
	// e.g. Kubernetes NetworkPolicy matches addresses, never TLS server names. Set by
	// the backend.
	NoDNSEgress bool
	// NoEndpoints: the runner has no edge, so it publishes no endpoints. Set by the
	// runner (its edge domain is empty).
	NoEndpoints bool
	// NoShareTokens: the runner's edge cannot check endpoint share tokens (HTTPS
	// endpoints with SHARE_TOKEN auth). Set by the runner; on the wire an older runner
	// that does not say it can is taken to lack it.
	NoShareTokens bool
	// NoContainerEngine: the runner cannot run container-engine sandboxes (Spec.Engine):
	// its backend cannot host Docker Engine safely in a sandbox, or the runner has no
	// engine image. On the wire an older runner that does not say it can is taken to
	// lack it.
	NoContainerEngine bool
	// NoSnapshots: the runner takes and restores no file-system snapshots (it has no
	// blob store, or its backend implements neither VolumeCapturer nor SnapshotCache).
	// On the wire an older runner that does not say it can is taken to lack it.
	NoSnapshots bool
	// NoSecretRefs: the runner cannot resolve references to a KUBERNETES secret store's
	// secrets (Container.SecretRefs): its backend is no SecretRefChecker (every backend
	// but Kubernetes). Set by the runner; on the wire an older runner that does not say it
	// can is taken to lack it.
	NoSecretRefs bool
	// NoGlobalVolumes: the runner cannot mount GLOBAL registered volumes (their content
	// in the blob store, docs/volumes.md): it has no blob store, or its backend cannot
	// fill a volume's copy (set by the backend: the Kubernetes backend without a snapshot
	// cache directory). The runner refuses them at create; placement
	// sends a sandbox mounting one only to runners without it. On the wire an older
	// runner that does not say it can is taken to lack it.
	NoGlobalVolumes bool
	// NoGlobalVolumeWriters: the runner mounts GLOBAL volumes read-only only: its backend
	// cannot commit a writer's copy when the sandbox ends (set by the backend; Kubernetes
	// runners of earlier releases said so, the Kubernetes backend commits writers now).
	// The runner refuses read-write mounts at create; placement sends a
	// sandbox mounting one read-write only to runners without it (nor NoGlobalVolumes).
	// On the wire an older runner that does not say is taken to commit them.
	NoGlobalVolumeWriters bool
	// NoGlobalVolumeSubPaths: the runner cannot mount a sub-directory of a GLOBAL
	// volume's copy (a mount's sub_path, or the registered volume's own). No backend of
	// this release sets it: the Kubernetes backend's of earlier releases did (its kubelet
	// made the sub-directory before the copy was filled, which then found its target not
	// empty; it now fills the copy into the kubelet's sub-directories). The runner refuses
	// such a mount at create (set by the backend; not on the wire: a gateway that placed
	// one on such a runner tries the next runner).
	NoGlobalVolumeSubPaths bool
	// NoEgressSecrets: the runner enforces host-name rules but injects no egress secrets
	// (EgressRule.Secret): a Kubernetes runner whose Role does not let it write its
	// egress roots ConfigMap (NoDNSEgress implies it). Set by the backend; the runner refuses such rules at
	// create, placement sends such a sandbox elsewhere. On the wire a lack: an older
	// runner that does not say either injects them or reports NoDNSEgress.
	NoEgressSecrets bool
}

// Optional interfaces of a Backend. The runner asserts them when it runs; each backend
// asserts at compile time the ones it implements (var _ runtime.X = (*Backend)(nil)),
// so a renamed method breaks the build instead of silently turning a capability off.

// SupportReporter is implemented by backends that cannot do everything (see Support): the
// runner refuses such sandboxes itself and reports the lack in its capacity. A backend
// that does not implement it supports everything.
type SupportReporter interface {
	Support() Support
}

// EgressReserver is implemented by backends that keep address ranges out of every
// sandbox's egress whatever its rules ask (the platform's reserved ranges but those the
// runner's operator opened, the sandbox network, the host): the runner refuses at create
// a cidr rule that lies wholly inside them, and the backend cuts them out of the rest.
type EgressReserver interface {
	ReservedEgress() reserved.Set
}

// LogDirProvider is implemented by backends that keep a sandbox's agent logs in a host
// directory: LogDir(id, container) is that directory for one of its containers ("" =
// the primary; "" when there is none), which the runner moves into its archive when the
// sandbox ends, before Destroy, so the logs outlive the sandbox for the retention
// window.
type LogDirProvider interface {
	LogDir(id, container string) string
}

// ContainerLogOpener is implemented by backends that keep the log of a container that
// has exited while its sandbox runs (an init container, a sidecar that ended for good)
// where its agent left it: OpenContainerLog opens it for reading ("" = the primary). That
// place was writable by the container, so it never follows a symlink the sandbox may
// have planted there (logstore.OpenReaderBeneath); a log never written is an error
// matching fs.ErrNotExist.
type ContainerLogOpener interface {
	OpenContainerLog(id, container string) (*logstore.Reader, error)
}

// ContainerStatusReporter is implemented by backends that report each container of a
// sandbox (every backend that runs multi-container specs): init containers first, then
// the primary and the sidecars, as Spec.AllContainers orders them.
type ContainerStatusReporter interface {
	ContainerStatuses(ctx context.Context, id string) ([]ContainerStatus, error)
}

// States of a ContainerStatus.
const (
	ContainerWaiting = "waiting" // not started yet (held by its dependencies, or creating)
	ContainerRunning = "running"
	ContainerExited  = "exited" // for good: no restart will follow
)

// ContainerStatus is one container of a sandbox as its backend sees it.
type ContainerStatus struct {
	Name     string
	Init     bool
	State    string // a Container* state
	ExitCode *int32 // the last exit of its main command, nil before there was one
	Restarts int
	// Reason and Message say why it is waiting or exited (as in Exit).
	Reason  string
	Message string
}

// OOMCounter is implemented by backends that can tell how many processes of sandbox id
// the kernel's OOM killer has killed so far; the runner reports it (also while the
// sandbox runs: an exec'd process can be killed without the sandbox ending).
type OOMCounter interface {
	OOMKills(id string) (int, error)
}

// Usage is what a sandbox uses as its cgroup counts it: CPU time since it started, and
// memory charged now and at most (0: unknown).
type Usage struct {
	CPUUsec         int64
	MemoryBytes     int64
	MemoryPeakBytes int64
	// At is when the numbers were sampled, when the backend reads them from a source that
	// samples on its own (the kubelet); zero: at the read. The runner computes the CPU
	// rate between samples, so a cached sample read again does not look like an idle
	// window.
	At time.Time
}

// UsageReader is implemented by backends that can read a running sandbox's resource
// usage cheaply (a few cgroup files); the runner reports it in GetSandbox's
// status.resource_usage. ErrNotFound when it cannot tell.
type UsageReader interface {
	Usage(id string) (Usage, error)
}

// RuntimeClassLister is implemented by backends that know which runtime classes they
// run, the default first: what the runner offers unless configured otherwise.
type RuntimeClassLister interface {
	RuntimeClasses() []string
}
