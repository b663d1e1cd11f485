// Package runtime is the contract between the runner and the machinery that runs sandboxes.
//
// A Backend turns a Spec into a running container whose PID 1 is sandbox-agent, and tears
// it down again. Everything the runner does inside a sandbox (exec, files, logs) goes
// through the agent, reached with DialAgent, so backends stay small: the local backend
// (runc or runsc on this host) and the Kubernetes backend (Pods) implement the same five
// verbs.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// DefaultRestartLimit is how many times the agent restarts a main command that exited
// non-zero before it reports the sandbox failed.
const DefaultRestartLimit = 6

// DefaultPidsLimit is a sandbox's process (and thread) limit when its spec sets none.
const DefaultPidsLimit = 4096

// Spec is a fully resolved sandbox: policy defaults are merged and validated before a
// Spec reaches a backend, so a backend only checks what it alone can know.
//
// A sandbox is a group of containers, like a Pod: the primary container (embedded, so a
// single-container spec reads as it always did: spec.Image, spec.Command, …), its
// sidecars and its init containers. They share the network namespace (they reach each
// other on localhost), the hostname, the volumes and the lifetime; each has its own
// root filesystem from its own image, its own agent and its own resource limits. The
// primary's exit ends the sandbox and decides its outcome, and it is the default target
// of exec, files and logs. Init containers run in order, each to exit 0, before the
// others start; then containers start as their DependsOn conditions hold (startseq).
type Spec struct {
	ID string `json:"id"`
	// Container is the primary container. Its Name is "" in a single-container spec
	// (it is then called DefaultContainerName where a name is needed).
	Container
	// Sidecars are the sandbox's other containers, in the order they were given.
	Sidecars []Container `json:"sidecars,omitempty"`
	// InitContainers run in order before the others start; each must exit 0 (a failing
	// one fails the sandbox, naming it). They take no DependsOn and no StartupProbe.
	InitContainers []Container `json:"init_containers,omitempty"`
	// HostAliases are names that resolve to 127.0.0.1 in every container (/etc/hosts):
	// the service names of a Compose file, so services reach each other by name.
	HostAliases []string `json:"host_aliases,omitempty"`
	// Volumes are the sandbox's scratch volumes; each container's VolumeMounts mount them.
	Volumes      []Volume `json:"volumes,omitempty"`
	RuntimeClass string   `json:"runtime_class,omitempty"` // "" = the backend's default
	// Services are the sandbox's declared ports; those with an Endpoint are published by
	// the runner's edge.
	Services []Service `json:"services,omitempty"`
	// ShareTokenHash is the hex SHA-256 of the sandbox's endpoint share token, which its
	// TokenAuth HTTPS services accept (edge.ShareTokenHash); the token itself is never
	// given to a runner. "" = none.
	ShareTokenHash string `json:"share_token_hash,omitempty"`
	// Network is what the sandbox may reach and what may reach it. nil means the backend
	// enforces nothing beyond its own isolation (specs recorded before network rules
	// existed); a non-nil zero value allows no egress at all.
	Network *Network `json:"network,omitempty"`
	// Pod is the policy's Kubernetes Pod settings (node selector, tolerations, …), set by
	// whoever resolves the spec against the runner's policy; nil means none.
	Pod *PodSettings `json:"pod,omitempty"`
	// Engine, when set, runs the sandbox under a container engine (the public API's
	// control CONTROL_CONTAINER_ENGINE): the sandbox's one container, named
	// EngineContainerName, holds Docker Engine, which runs Engine.Compose with
	// `docker compose` inside the sandbox (services stopped and started independently by
	// whoever execs there). Its Image is the runner's engine image (the runner fills an
	// empty one); nil for every other sandbox.
	Engine *Engine `json:"engine,omitempty"`
	// EgressSecretValues are the values of the Network's egress secrets
	// (EgressSecret.Key() → value), resolved at create; like SecretEnv never persisted,
	// returned or logged, and handed to the backend's egress proxy only.
	EgressSecretValues map[string]string `json:"-"`
	// Meta is the platform's immutable bookkeeping (organization, creation time,
	// deadline; its keys are the Meta* constants); backends persist it and hand it back
	// from Recover.
	Meta map[string]string `json:"meta,omitempty"`
}

// DefaultContainerName names the primary container of a spec that gives it no name.
const DefaultContainerName = "main"

// EngineContainerName names the one container of a container-engine sandbox (Spec.Engine).
const EngineContainerName = "cws-engine"

// Engine is what a container-engine sandbox runs under its engine.
type Engine struct {
	// Compose is the Compose file as the caller gave it (at most 256 KiB), run by
	// `docker compose up` inside the sandbox as project Project.
	Compose []byte `json:"compose"`
	// Project is the Compose project's name (a DNS-1123 label).
	Project string `json:"project"`
	// Images are the images the file's services use (image_overrides applied), each a
	// reference the policy's image rules accept like any container's image. The runner
	// pulls them with its credentials and hands them to the engine before `docker
	// compose up`, so the services run the images the policy allowed.
	Images []string `json:"images,omitempty"`
	// PullCredentials, by image of Images, pull that image only (the platform registry's
	// pull token for an image a Compose build made); never persisted.
	PullCredentials map[string]*Credentials `json:"-"`
}

// Container is one container of a sandbox.
type Container struct {
	// Name is a DNS-1123 label, unique in the sandbox (init containers included); "" only
	// for the primary of a single-container spec.
	Name  string `json:"name,omitempty"`
	Image string `json:"image"` // reference: name[:tag][@digest]
	// PullCredentials, when set, are used for this image only; they are never persisted.
	PullCredentials *Credentials `json:"-"`
	// Command is a single executable (the wire protocol's Container.command); empty means
	// the image's entrypoint. Args replace the image's cmd when Command is set, or when
	// non-empty.
	Command string            `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// SecretEnv are environment variables whose values come from secret stores (set
	// over Env). Like PullCredentials they are never persisted (json "-"), never sent
	// back and never logged: a backend hands them to the container's process only
	// (docs/secrets.md).
	SecretEnv map[string]string `json:"-"`
	// SecretRefs are environment variables taken from the runner's orchestrator's own
	// secrets (a KUBERNETES secret store, docs/secrets.md): references only, the value
	// never passes through sandboxd. Backends that cannot resolve them refuse the spec
	// (ErrSecretRefsUnsupported).
	SecretRefs []SecretRef `json:"secret_refs,omitempty"`
	WorkingDir string      `json:"working_dir,omitempty"`
	Files      []File      `json:"files,omitempty"`
	// Resources are this container's limits and requests; the sandbox's are the sum over
	// its containers (Spec.TotalResources).
	Resources Resources `json:"resources"`
	// VolumeMounts mount the sandbox's Volumes into this container.
	VolumeMounts []VolumeMount `json:"volume_mounts,omitempty"`
	// Tmpfs are paths where this container gets an empty, private tmpfs.
	Tmpfs []string `json:"tmpfs,omitempty"`
	// Security is the container's security context; nil means the platform defaults.
	Security     *Security `json:"security,omitempty"`
	RestartLimit int       `json:"restart_limit"`
	// StartupProbe, when set, must pass before the container counts as healthy: a
	// sandbox is RUNNING only once every container's probe has passed, and a probe that
	// keeps failing fails the sandbox, naming the container.
	StartupProbe *Probe `json:"startup_probe,omitempty"`
	// DependsOn holds the container's start until each condition holds.
	DependsOn []Dependency `json:"depends_on,omitempty"`
}

// Probe runs a command in its container; exit 0 passes.
type Probe struct {
	Exec             []string      `json:"exec"` // argv; a shell form is ["/bin/sh", "-c", cmd]
	InitialDelay     time.Duration `json:"initial_delay,omitempty"`
	Period           time.Duration `json:"period,omitempty"`            // 0 = DefaultProbePeriod
	Timeout          time.Duration `json:"timeout,omitempty"`           // 0 = DefaultProbeTimeout
	FailureThreshold int           `json:"failure_threshold,omitempty"` // 0 = DefaultProbeFailures
}

// Probe defaults (Kubernetes' startup probe defaults, but a shorter period).
const (
	DefaultProbePeriod   = time.Second
	DefaultProbeTimeout  = time.Second
	DefaultProbeFailures = 30
)

// Conditions of a Dependency (Compose's depends_on conditions).
const (
	ConditionStarted   = "started"   // the container's main command has started
	ConditionHealthy   = "healthy"   // and its StartupProbe has passed
	ConditionCompleted = "completed" // and it has exited 0
)

// Dependency is one condition a container's start waits for.
type Dependency struct {
	Container string `json:"container"`
	Condition string `json:"condition"` // a Condition* constant
}

// ContainerName is c's name, DefaultContainerName for the unnamed primary.
func (c *Container) ContainerName() string {
	if c.Name == "" {
		return DefaultContainerName
	}
	return c.Name
}

// Multi reports whether the sandbox has more than its primary container.
func (s *Spec) Multi() bool { return len(s.Sidecars) > 0 || len(s.InitContainers) > 0 }

// Containers returns pointers to the primary and then the sidecars (not the init
// containers), in order.
func (s *Spec) Containers() []*Container {
	out := make([]*Container, 0, 1+len(s.Sidecars))
	out = append(out, &s.Container)
	for i := range s.Sidecars {
		out = append(out, &s.Sidecars[i])
	}
	return out
}

// AllContainers returns the init containers, the primary and the sidecars.
func (s *Spec) AllContainers() []*Container {
	out := make([]*Container, 0, len(s.InitContainers)+1+len(s.Sidecars))
	for i := range s.InitContainers {
		out = append(out, &s.InitContainers[i])
	}
	return append(out, s.Containers()...)
}

// Find returns the container called name ("" = the primary), init containers included,
// and whether it is an init container; nil when there is none.
func (s *Spec) Find(name string) (c *Container, init bool) {
	if name == "" || name == s.ContainerName() {
		return &s.Container, false
	}
	for i := range s.Sidecars {
		if s.Sidecars[i].Name == name {
			return &s.Sidecars[i], false
		}
	}
	for i := range s.InitContainers {
		if s.InitContainers[i].Name == name {
			return &s.InitContainers[i], true
		}
	}
	return nil, false
}

// TotalResources is what the sandbox as a whole may use and is admitted by: the sum of
// its containers' limits and requests. Init containers run before the others and never
// beside them, so, as in Kubernetes, they count with the largest of any one of them
// where that exceeds the sum of the rest. A zero (unlimited) limit in any container
// makes the total's limit of that quantity zero (unlimited) too.
func (s *Spec) TotalResources() Resources {
	if !s.Multi() {
		return s.Resources
	}
	total := func(get func(*Resources) int64, zeroIsUnlimited bool) int64 {
		var n int64
		for _, c := range s.Containers() {
			if v := get(&c.Resources); v == 0 && zeroIsUnlimited {
				return 0
			} else {
				n += v
			}
		}
		for i := range s.InitContainers {
			if v := get(&s.InitContainers[i].Resources); v == 0 && zeroIsUnlimited {
				return 0
			} else {
				n = max(n, v)
			}
		}
		return n
	}
	return Resources{
		MilliCPU:           total(func(r *Resources) int64 { return r.MilliCPU }, true),
		MemoryBytes:        total(func(r *Resources) int64 { return r.MemoryBytes }, true),
		Pids:               total(func(r *Resources) int64 { return r.Pids }, true),
		DiskBytes:          total(func(r *Resources) int64 { return r.DiskBytes }, true),
		RequestMilliCPU:    total(func(r *Resources) int64 { return r.RequestMilliCPU }, false),
		RequestMemoryBytes: total(func(r *Resources) int64 { return r.RequestMemoryBytes }, false),
	}
}

// Endpoint kinds of a Service.
const (
	EndpointHTTPS       = "https"           // TLS ended at the runner's edge, HTTP to the port
	EndpointPassthrough = "tls-passthrough" // TCP spliced to the port, TLS left to the workload
)

// Service is one declared sandbox port.
type Service struct {
	Port int    `json:"port"`
	Name string `json:"name,omitempty"`
	// Visibility is "public", "private", "custom" (reachable from the sources of
	// Network.Ingress) or "" (reachable from nothing outside).
	Visibility string `json:"visibility,omitempty"`
	// Endpoint is EndpointHTTPS, EndpointPassthrough or "" (none).
	Endpoint string `json:"endpoint,omitempty"`
	// TokenAuth (the wire's SHARE_TOKEN auth): callers of an HTTPS endpoint need the
	// sandbox's share token (Spec.ShareTokenHash) or an API key of its organization.
	TokenAuth bool `json:"token_auth,omitempty"`
	// TimeoutSeconds bounds an HTTPS request until its response headers (0 = default).
	TimeoutSeconds int `json:"timeout_seconds,omitempty"`
}

// Credentials authenticate an image pull.
type Credentials struct {
	Username string
	Password string
}

// File is written into the sandbox before the main command starts.
type File struct {
	Path    string `json:"path"`
	Content []byte `json:"content"`
	Mode    uint32 `json:"mode,omitempty"` // 0 = 0644
}

// Resources are a sandbox's hard limits and its requests. A zero limit means unlimited
// for that dimension (the runner fills one from its defaults before a backend sees the
// spec, see WithDefaults); a zero request means the limit.
type Resources struct {
	MilliCPU    int64 `json:"milli_cpu,omitempty"`
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// RequestMilliCPU and RequestMemoryBytes are what the sandbox is guaranteed: what the
	// runner admits it by (and Kubernetes schedules it by), at most the limits.
	RequestMilliCPU    int64 `json:"request_milli_cpu,omitempty"`
	RequestMemoryBytes int64 `json:"request_memory_bytes,omitempty"`
	Pids               int64 `json:"pids,omitempty"`
	// DiskBytes caps the sandbox's writable root filesystem layer; 0 means the
	// backend's default (no wire field sets it yet: the runner's --disk flag does).
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// WithDefaults completes r with the defaults d (d's requests and limits), per quantity (CPU
// and memory), by the rule the API documents (docs/admin.md, "Resources"), Kubernetes'
// and the official client's: the request is the one asked, else the limit asked, else
// d's request; the limit is the one asked, else d's limit but never below the request
// (the request itself when d has none).
func (r Resources) WithDefaults(d Resources) Resources {
	r.RequestMilliCPU, r.MilliCPU = defaulted(r.RequestMilliCPU, r.MilliCPU, d.RequestMilliCPU, d.MilliCPU)
	r.RequestMemoryBytes, r.MemoryBytes = defaulted(r.RequestMemoryBytes, r.MemoryBytes, d.RequestMemoryBytes, d.MemoryBytes)
	return r
}

// defaulted applies WithDefaults' rule to one quantity: req and limit as asked (0 = not
// asked), defReq and defLimit the defaults.
func defaulted(req, limit, defReq, defLimit int64) (int64, int64) {
	switch {
	case req == 0 && limit > 0:
		req = limit
	case req == 0:
		req = defReq
	}
	if limit == 0 {
		limit = max(defLimit, req)
	}
	return req, limit
}

// Exit describes how a sandbox's container ended.
type Exit struct {
	// ExitCode is the main command's last exit code; nil when the main command never ran
	// to completion (killed with the container, failed to start).
	ExitCode *int32
	Restarts int
	// Reason is a short CamelCase cause: Completed, Error, RestartLimit, OOMKilled,
	// StartError, Killed, Vanished.
	Reason  string
	Message string
	At      time.Time
}

// WithDefaultReason returns e with an empty Reason filled from the exit code: Completed
// for 0, Error otherwise (no code included).
func (e Exit) WithDefaultReason() Exit {
	if e.Reason == "" {
		if e.ExitCode != nil && *e.ExitCode == 0 {
			e.Reason = "Completed"
		} else {
			e.Reason = "Error"
		}
	}
	return e
}

// LateInfoWaiter is a backend whose Create may return before every Info field is known:
// the Kubernetes backend's agent can answer before the kubelet reports the container
// (ImageDigest comes with that report). WaitInfo waits, bounded by ctx, until the
// sandbox's Info is complete (or it ended) and returns it.
type LateInfoWaiter interface {
	WaitInfo(ctx context.Context, id string) (Info, error)
}

// Info is what a backend knows of a live sandbox.
type Info struct {
	ID           string
	IP           string // address the host (and the edge) reaches the sandbox's ports at
	RuntimeClass string // the effective OCI runtime class
	ImageDigest  string
	StartedAt    time.Time
}

// Recovered is a sandbox a backend found when the runner started.
type Recovered struct {
	Spec  Spec
	Info  Info
	Alive bool  // the container is still running and its agent reachable
	Exit  *Exit // set when !Alive
	// Paused: the sandbox was paused (see Pauser) and still is; Alive is false and Exit
	// nil. Released says it is checkpointed (its processes ended) rather than frozen.
	Paused   bool
	Released bool
}

// Backend runs sandboxes.
type Backend interface {
	// Create pulls the image, prepares the root filesystem and network, and starts the
	// container. It returns once the agent accepts connections, or with an error after
	// undoing everything it did. Errors wrap the sentinels below where one fits.
	Create(ctx context.Context, spec *Spec) (Info, error)
	// DialAgent connects to the agent of the sandbox's container ("" = the primary). A
	// name the sandbox's spec does not have is ErrContainerNotFound.
	DialAgent(ctx context.Context, id, container string) (net.Conn, error)
	// Wait blocks until the sandbox's container has exited.
	Wait(ctx context.Context, id string) (Exit, error)
	// Stop asks the sandbox to end: SIGTERM to the agent (which forwards it), SIGKILL to
	// everything after grace. It returns when the container has exited.
	Stop(ctx context.Context, id string, grace time.Duration) error
	// Destroy removes every trace of the sandbox: processes, mounts, cgroups, network
	// devices, files. It is idempotent.
	Destroy(ctx context.Context, id string) error
	// Recover lists the sandboxes this backend finds from an earlier run.
	Recover(ctx context.Context) ([]Recovered, error)
}

// Errors a backend returns, wrapped with context.
var (
	// ErrNotFound: no such sandbox (or it left the retention window). The one "sandbox
	// not found": backends and the runner return it; an errdefs.ErrNotFound.
	ErrNotFound = fmt.Errorf("sandbox %w", errdefs.ErrNotFound)
	// ErrContainerNotFound: the sandbox has no container of that name.
	ErrContainerNotFound = fmt.Errorf("container %w", errdefs.ErrNotFound)
	// ErrVolumeNotFound: the sandbox has no scratch volume of that name.
	ErrVolumeNotFound    = fmt.Errorf("scratch volume %w", errdefs.ErrNotFound)
	ErrImageNotFound     = fmt.Errorf("image %w", errdefs.ErrNotFound)
	ErrImageUnauthorized = errors.New("image pull unauthorized")
	ErrRegistry          = errors.New("registry unreachable")
	ErrInvalidImageRef   = errors.New("invalid image reference")
	// ErrRegistryNotAllowed: the image's registry is (or resolves to) loopback,
	// link-local, the host or the sandbox network, and the operator did not configure it.
	// It wraps ErrInvalidImageRef.
	ErrRegistryNotAllowed = fmt.Errorf("%w: the registry is not allowed (a loopback, link-local, host or sandbox-network address the operator did not configure)", ErrInvalidImageRef)
	ErrInvalidSpec        = errors.New("invalid sandbox spec")
	ErrUnknownRuntime     = errors.New("unknown runtime class")
)
