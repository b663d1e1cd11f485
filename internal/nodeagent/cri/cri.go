// Package cri resolves a Pod to its CRI Pod sandbox on this node, through the container
// runtime's CRI socket (containerd's), for the node agent: the sandbox ID the agent
// checkpoints is the runtime's answer, never a caller's.
//
// A Pod is resolved only when exactly one READY Pod sandbox carries its UID and every
// check holds: namespace, name and UID equal the reference, the namespace is an allowed
// one, the runtime handler is the gVisor one, and the Pod's sandboxd.io/runner-id and
// sandboxd.io/sandbox-id labels (the kubelet copies Pod labels onto the CRI sandbox) name
// the calling runner and the expected sandbox.
package cri

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/sandboxd/sandboxd/internal/nodeagent/hibernate"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// The Pod labels the Kubernetes backend sets (internal/runtime/kubernetes LabelRunner,
// LabelSandbox; a test keeps them equal).
const (
	LabelRunner  = "sandboxd.io/runner-id"
	LabelSandbox = "sandboxd.io/sandbox-id"
	// labelPodUID is the kubelet's label of a CRI Pod sandbox naming its Pod's UID.
	labelPodUID = "io.kubernetes.pod.uid"
)

// MaxSandboxIDLen is the longest sandbox ID the Kubernetes backend makes (its maxIDLen).
const MaxSandboxIDLen = 53

// Errors the resolver wraps; the agent maps them to connect codes.
var (
	ErrInvalid   = errors.New("invalid")           // INVALID_ARGUMENT
	ErrNotFound  = errors.New("not found")         // NOT_FOUND
	ErrDenied    = errors.New("permission denied") // PERMISSION_DENIED
	ErrNotReady  = errors.New("not ready")         // FAILED_PRECONDITION
	ErrAmbiguous = errors.New("ambiguous")         // FAILED_PRECONDITION
	ErrCRI       = errors.New("cri")               // UNAVAILABLE/INTERNAL
)

// PodRef names a Pod.
type PodRef struct {
	Namespace, Name, UID string
}

var (
	dns1123Label     = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	dns1123Subdomain = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)
	uuidPattern      = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	labelValue       = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)
)

// Validate checks a Pod reference's syntax: namespace a DNS-1123 label, name a DNS-1123
// subdomain, UID a lower-case UUID (what the API server assigns).
func (r PodRef) Validate() error {
	switch {
	case !dns1123Label.MatchString(r.Namespace):
		return fmt.Errorf("%w pod.namespace %q: want a DNS-1123 label", ErrInvalid, clip(r.Namespace))
	case len(r.Name) > 253 || !dns1123Subdomain.MatchString(r.Name) || strings.Contains(r.Name, ".."):
		return fmt.Errorf("%w pod.name %q: want a DNS-1123 subdomain", ErrInvalid, clip(r.Name))
	case !uuidPattern.MatchString(r.UID):
		return fmt.Errorf("%w pod.uid %q: want a UUID (lower case)", ErrInvalid, clip(r.UID))
	}
	return nil
}

// ValidSandboxID checks a sandboxd sandbox ID (the Kubernetes backend's).
func ValidSandboxID(id string) error {
	if !runtime.ValidID(id, MaxSandboxIDLen) {
		return fmt.Errorf("%w sandbox_id %q: want 1-%d characters of [a-z0-9-], not starting or ending with '-'", ErrInvalid, clip(id), MaxSandboxIDLen)
	}
	return nil
}

// ValidRunnerID checks a runner ID (a Kubernetes label value).
func ValidRunnerID(id string) error {
	if !labelValue.MatchString(id) {
		return fmt.Errorf("%w runner id %q: want a Kubernetes label value", ErrInvalid, clip(id))
	}
	return nil
}

// Query is what a caller asks to resolve: the Pod, the runner it claims to be (from its
// verified certificate) and the sandbox ID the Pod must carry.
type Query struct {
	Pod       PodRef
	RunnerID  string
	SandboxID string
}

// Sandbox is a resolved Pod sandbox.
type Sandbox struct {
	// ID is the CRI Pod sandbox ID (hibernate.ValidContainerID holds).
	ID string
	// MemoryBytes is the sum of the Pod's containers' memory limits; 0 when one has none
	// (or the runtime does not say).
	MemoryBytes int64
}

// Resolver resolves Pods through one CRI runtime service.
type Resolver struct {
	client         runtimeapi.RuntimeServiceClient
	conn           *grpc.ClientConn
	namespaces     []string
	runtimeHandler string
	timeout        time.Duration
}

// Config configures a Resolver.
type Config struct {
	// Endpoint is the CRI socket: unix:///run/containerd/containerd.sock or an absolute path.
	Endpoint string
	// Namespaces are the namespaces whose Pods may be resolved (at least one).
	Namespaces []string
	// RuntimeHandler is the CRI runtime handler the Pod sandbox must run with ("runsc").
	RuntimeHandler string
	// Timeout bounds each CRI call (default 10 s).
	Timeout time.Duration
}

// New connects (lazily) to the CRI endpoint.
func New(cfg Config) (*Resolver, error) {
	path, ok := strings.CutPrefix(cfg.Endpoint, "unix://")
	if !ok {
		path = cfg.Endpoint
	}
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("cri endpoint %q: want unix:///path or an absolute path", cfg.Endpoint)
	}
	if len(cfg.Namespaces) == 0 {
		return nil, errors.New("cri: at least one namespace")
	}
	for _, ns := range cfg.Namespaces {
		if !dns1123Label.MatchString(ns) {
			return nil, fmt.Errorf("cri: namespace %q: want a DNS-1123 label", ns)
		}
	}
	if cfg.RuntimeHandler == "" {
		return nil, errors.New("cri: a runtime handler")
	}
	conn, err := grpc.NewClient("passthrough:///cri",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return nil, fmt.Errorf("cri: %w", err)
	}
	t := cfg.Timeout
	if t <= 0 {
		t = 10 * time.Second
	}
	return &Resolver{
		client:         runtimeapi.NewRuntimeServiceClient(conn),
		conn:           conn,
		namespaces:     slices.Clone(cfg.Namespaces),
		runtimeHandler: cfg.RuntimeHandler,
		timeout:        t,
	}, nil
}

// Close closes the CRI connection.
func (r *Resolver) Close() error { return r.conn.Close() }

// Sandbox resolves q.Pod to its one READY Pod sandbox, with every check of the package doc.
func (r *Resolver) Sandbox(ctx context.Context, q Query) (Sandbox, error) {
	if err := q.Pod.Validate(); err != nil {
		return Sandbox{}, err
	}
	if err := ValidSandboxID(q.SandboxID); err != nil {
		return Sandbox{}, err
	}
	if err := ValidRunnerID(q.RunnerID); err != nil {
		return Sandbox{}, err
	}
	if !slices.Contains(r.namespaces, q.Pod.Namespace) {
		return Sandbox{}, fmt.Errorf("%w: namespace %s is not one this agent serves", ErrDenied, q.Pod.Namespace)
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	resp, err := r.client.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{
		Filter: &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{labelPodUID: q.Pod.UID}},
	})
	if err != nil {
		return Sandbox{}, fmt.Errorf("%w: ListPodSandbox: %w", ErrCRI, err)
	}
	var found []*runtimeapi.PodSandbox
	notReady := 0
	for _, s := range resp.GetItems() {
		// The filter is the runtime's; check the UID ourselves too.
		md := s.GetMetadata()
		if md.GetUid() != q.Pod.UID {
			continue
		}
		if s.GetState() != runtimeapi.PodSandboxState_SANDBOX_READY {
			notReady++
			continue
		}
		found = append(found, s)
	}
	switch {
	case len(found) == 0 && notReady > 0:
		return Sandbox{}, fmt.Errorf("%w: the Pod sandbox of %s/%s is not ready", ErrNotReady, q.Pod.Namespace, q.Pod.Name)
	case len(found) == 0:
		return Sandbox{}, fmt.Errorf("%w: no Pod sandbox of %s/%s (uid %s) on this node", ErrNotFound, q.Pod.Namespace, q.Pod.Name, q.Pod.UID)
	case len(found) > 1:
		return Sandbox{}, fmt.Errorf("%w: %d ready Pod sandboxes of %s/%s", ErrAmbiguous, len(found), q.Pod.Namespace, q.Pod.Name)
	}
	s := found[0]
	if err := r.check(s, q); err != nil {
		return Sandbox{}, err
	}
	if err := hibernate.ValidContainerID(s.GetId()); err != nil {
		return Sandbox{}, fmt.Errorf("%w: the runtime's sandbox ID: %s", ErrCRI, err.Error()) // not the caller's fault: not ErrInvalid
	}
	return Sandbox{ID: s.GetId(), MemoryBytes: r.memory(ctx, s.GetId())}, nil
}

// check applies the ownership checks to the one candidate.
func (r *Resolver) check(s *runtimeapi.PodSandbox, q Query) error {
	md := s.GetMetadata()
	if md.GetNamespace() != q.Pod.Namespace || md.GetName() != q.Pod.Name {
		// A Pod UID names one Pod: another name or namespace is not the Pod asked for.
		return fmt.Errorf("%w: no Pod sandbox of %s/%s (uid %s) on this node", ErrNotFound, q.Pod.Namespace, q.Pod.Name, q.Pod.UID)
	}
	if s.GetRuntimeHandler() != r.runtimeHandler {
		return fmt.Errorf("%w: the Pod %s/%s does not run with runtime handler %s", ErrDenied, q.Pod.Namespace, q.Pod.Name, r.runtimeHandler)
	}
	labels := s.GetLabels()
	if labels[LabelRunner] != q.RunnerID {
		return fmt.Errorf("%w: the Pod %s/%s is not this runner's", ErrDenied, q.Pod.Namespace, q.Pod.Name)
	}
	if labels[LabelSandbox] != q.SandboxID {
		return fmt.Errorf("%w: the Pod %s/%s is not sandbox %s", ErrDenied, q.Pod.Namespace, q.Pod.Name, q.SandboxID)
	}
	return nil
}

// memory sums the memory limits of the sandbox's containers (0: unknown or unlimited).
func (r *Resolver) memory(ctx context.Context, sandboxID string) int64 {
	resp, err := r.client.ListContainers(ctx, &runtimeapi.ListContainersRequest{
		Filter: &runtimeapi.ContainerFilter{PodSandboxId: sandboxID},
	})
	if err != nil || len(resp.GetContainers()) == 0 || len(resp.GetContainers()) > 64 {
		return 0
	}
	var sum int64
	for _, c := range resp.GetContainers() {
		if c.GetPodSandboxId() != sandboxID {
			return 0
		}
		st, err := r.client.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId()})
		if err != nil {
			return 0
		}
		m := st.GetStatus().GetResources().GetLinux().GetMemoryLimitInBytes()
		if m <= 0 || m > 1<<50 {
			return 0
		}
		sum += m
	}
	return sum
}

// Running reports whether the Pod sandbox id is READY and one of its containers runs
// (after a checkpoint: the sandbox's readiness alone lags behind its containers' end).
func (r *Resolver) Running(ctx context.Context, id string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	resp, err := r.client.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
	if err != nil {
		return false, fmt.Errorf("%w: PodSandboxStatus: %w", ErrCRI, err)
	}
	if resp.GetStatus().GetState() != runtimeapi.PodSandboxState_SANDBOX_READY {
		return false, nil
	}
	cs, err := r.client.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		PodSandboxId: id, State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	}})
	if err != nil {
		return false, fmt.Errorf("%w: ListContainers: %w", ErrCRI, err)
	}
	for _, c := range cs.GetContainers() {
		if c.GetPodSandboxId() == id && c.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
			return true, nil
		}
	}
	return false, nil
}

// Version is the runtime's name and version (a liveness check).
func (r *Resolver) Version(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	v, err := r.client.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return "", fmt.Errorf("%w: Version: %w", ErrCRI, err)
	}
	return v.GetRuntimeName() + " " + v.GetRuntimeVersion(), nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
