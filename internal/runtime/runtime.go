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
type Spec struct {
	ID    string `json:"id"`
	Image string `json:"image"` // reference: name[:tag][@digest]
	// PullCredentials, when set, are used for this image only; they are never persisted.
	PullCredentials *Credentials `json:"-"`
	// Command is a single executable (the wire protocol's Container.command); empty means
	// the image's entrypoint. Args replace the image's cmd when Command is set, or when
	// non-empty.
	Command    string            `json:"command,omitempty"`
	Args       []string          `json:"args,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	WorkingDir string            `json:"working_dir,omitempty"`
	Files      []File            `json:"files,omitempty"`
	Resources  Resources         `json:"resources"`
	// Volumes are the sandbox's scratch volumes; VolumeMounts mount them.
	Volumes      []Volume      `json:"volumes,omitempty"`
	VolumeMounts []VolumeMount `json:"volume_mounts,omitempty"`
	// Security is the container's security context; nil means the platform defaults.
	Security     *Security `json:"security,omitempty"`
	RuntimeClass string    `json:"runtime_class,omitempty"` // "" = the backend's default
	RestartLimit int       `json:"restart_limit"`
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
	// Meta is the platform's immutable bookkeeping (organization, creation time,
	// deadline; its keys are the Meta* constants); backends persist it and hand it back
	// from Recover.
	Meta map[string]string `json:"meta,omitempty"`
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
}

// Backend runs sandboxes.
type Backend interface {
	// Create pulls the image, prepares the root filesystem and network, and starts the
	// container. It returns once the agent accepts connections, or with an error after
	// undoing everything it did. Errors wrap the sentinels below where one fits.
	Create(ctx context.Context, spec *Spec) (Info, error)
	// DialAgent connects to the sandbox's agent.
	DialAgent(ctx context.Context, id string) (net.Conn, error)
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
	ErrNotFound          = fmt.Errorf("sandbox %w", errdefs.ErrNotFound)
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
