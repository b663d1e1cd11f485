package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// Container is one container of a multi-container sandbox (Spec.Containers). The
// containers share the network (they reach each other on localhost) and the sandbox's
// lifetime; the primary's exit decides the sandbox's outcome and it is the default
// target of exec, files and logs.
type Container struct {
	Name  string // required: unique, a DNS label (lower case, digits, '-')
	Image string // required
	// Command is the executable; Args its arguments. Both empty run the image's
	// entrypoint (unlike a single-container Spec, which then waits until stopped).
	Command    string
	Args       []string
	Env        map[string]string
	WorkingDir string
	Files      map[string][]byte // path in the container → content, written before start
	CPU        string            // e.g. "500m": request and limit; the sandbox's total is the sum
	Memory     string            // e.g. "256Mi"
	// Primary marks the primary container. At most one may set it; with none the first
	// container is the primary.
	Primary bool
	// StartupProbe, when set, must pass before the sandbox runs.
	StartupProbe *Probe
	// Mounts mount volumes of Spec.Volumes into this container.
	Mounts []Mount
}

// Probe is a command run in its container until it exits 0.
type Probe struct {
	Exec             []string      // required: argv
	Period           time.Duration // between attempts; 0 = the server's default
	Timeout          time.Duration // per attempt; 0 = the server's default
	FailureThreshold int           // attempts before it fails; 0 = the server's default
	InitialDelay     time.Duration // before the first attempt
}

// ContainerInfo is one container of a sandbox as last seen: what its spec says and, once
// the server reports it, its status.
type ContainerInfo struct {
	Name    string
	Primary bool
	Image   string
	State   State // StateUnspecified until the server reports the container
	// ExitCode is the container's last exit code, set once its state is terminal.
	ExitCode *int
	Restarts int
}

// primaryIndex is the index of the primary container: the one marked primary, else the
// first (-1 for none).
func primaryIndex[T any](cs []T, primary func(T) bool) int {
	for i, c := range cs {
		if primary(c) {
			return i
		}
	}
	if len(cs) == 0 {
		return -1
	}
	return 0
}

// validateContainers checks what the server would refuse anyway, but with a message
// that names the Go field: names present and unique, images present, one primary.
func (s Spec) validateContainers() error {
	if len(s.Containers) == 0 {
		return nil
	}
	if s.Image != "" || s.Command != "" || len(s.Args) > 0 || len(s.Env) > 0 || s.WorkingDir != "" || len(s.Files) > 0 || s.CPU != "" || s.Memory != "" {
		return errors.New("sandbox: Spec.Containers excludes the single-container fields (Image, Command, Args, Env, WorkingDir, Files, CPU, Memory): set them on each Container")
	}
	seen := map[string]bool{}
	primaries := 0
	for i, c := range s.Containers {
		switch {
		case c.Name == "":
			return fmt.Errorf("sandbox: Containers[%d]: Name is required", i)
		case seen[c.Name]:
			return fmt.Errorf("sandbox: Containers[%d]: name %q is used twice", i, c.Name)
		case c.Image == "":
			return fmt.Errorf("sandbox: container %q: Image is required", c.Name)
		case c.StartupProbe != nil && len(c.StartupProbe.Exec) == 0:
			return fmt.Errorf("sandbox: container %q: StartupProbe.Exec is required", c.Name)
		}
		seen[c.Name] = true
		if c.Primary {
			primaries++
		}
	}
	if primaries > 1 {
		return errors.New("sandbox: more than one container is marked Primary")
	}
	return nil
}

func (c Container) proto(primary bool) *sandboxv1.Container {
	p := &sandboxv1.Container{
		Name: c.Name, Image: c.Image, Command: c.Command, Args: c.Args,
		EnvironmentVariables: c.Env, WorkingDir: c.WorkingDir,
	}
	if primary {
		t := true
		p.Primary = &t
	}
	for _, path := range sortedKeys(c.Files) {
		p.Files = append(p.Files, &sandboxv1.FileMount{Path: path, Content: c.Files[path]})
	}
	p.ResourceRequirements = requirements(c.CPU, c.Memory)
	p.VolumeMounts = mountsProto(c.Mounts)
	if pr := c.StartupProbe; pr != nil {
		p.StartupProbe = &sandboxv1.Probe{Exec: pr.Exec, PeriodSeconds: seconds(pr.Period), TimeoutSeconds: seconds(pr.Timeout),
			FailureThreshold: int32(min(pr.FailureThreshold, math.MaxInt32)), InitialDelaySeconds: seconds(pr.InitialDelay)}
	}
	return p
}

// requirements is a request equal to the limit, or nil when neither is set.
func requirements(cpu, memory string) *sandboxv1.ResourceRequirements {
	if cpu == "" && memory == "" {
		return nil
	}
	r := func() *sandboxv1.Resources { return &sandboxv1.Resources{Cpu: cpu, Memory: memory} }
	return &sandboxv1.ResourceRequirements{Requests: r(), Limits: r()}
}

// seconds rounds d up to whole seconds, as the wire counts them.
func seconds(d time.Duration) int32 {
	if d <= 0 {
		return 0
	}
	return int32(min(math.Ceil(d.Seconds()), math.MaxInt32))
}

// containerInfos joins the spec's containers with the status's, by name. A container
// only the status names (the server added it) comes last.
func containerInfos(p *sandboxv1.Sandbox) []ContainerInfo {
	specs := p.GetSpec().GetContainers()
	statuses := p.GetStatus().GetContainerStatuses()
	if len(specs) == 0 && len(statuses) == 0 {
		return nil
	}
	prim := primaryIndex(specs, (*sandboxv1.Container).GetPrimary)
	byName := map[string]*sandboxv1.ContainerStatus{}
	for _, st := range statuses {
		byName[st.GetName()] = st
	}
	var out []ContainerInfo
	seen := map[string]bool{}
	add := func(ci ContainerInfo, st *sandboxv1.ContainerStatus) {
		if st != nil {
			ci.State, ci.Restarts = State(st.GetState()), int(st.GetRestartCount())
			if ci.State.Terminal() {
				code := int(st.GetExitCode())
				ci.ExitCode = &code
			}
		}
		seen[ci.Name] = true
		out = append(out, ci)
	}
	for i, c := range specs {
		add(ContainerInfo{Name: c.GetName(), Primary: i == prim, Image: c.GetImage()}, byName[c.GetName()])
	}
	for _, st := range statuses {
		if !seen[st.GetName()] {
			add(ContainerInfo{Name: st.GetName()}, st)
		}
	}
	return out
}

// InContainer returns a handle on the same sandbox whose exec, files and logs go to the
// container name ("" = the primary) unless their options name another. It shares the
// client, not the status: refresh each handle on its own.
func (s *Sandbox) InContainer(name string) *Sandbox {
	p := s.Proto()
	return &Sandbox{c: s.c, id: s.id, proto: p, shareToken: s.shareToken, container: name}
}

// Container is the container this handle targets ("" = the primary).
func (s *Sandbox) Container() string { return s.container }

// target is the container a call goes to: the option's, else the handle's.
func (s *Sandbox) target(opt string) string {
	if opt != "" {
		return opt
	}
	return s.container
}

// FileType is the format of CreateFromFile's file.
type FileType int32

// File types, numbered as in coreweave.sandbox.v1.SandboxFileType.
const (
	FileCompose FileType = FileType(sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_COMPOSE)
)

// MaxSandboxFileBytes bounds CreateFromFile's file, checked client-side.
const MaxSandboxFileBytes = 256 << 10

// FileSpec describes a sandbox created from a file (CreateFromFile): each Compose
// service becomes a container named after it.
type FileSpec struct {
	Type     FileType // default FileCompose
	Contents []byte   // the file itself (at most MaxSandboxFileBytes)
	// PrimaryService names the primary container; "" lets the server choose.
	PrimaryService string
	// ImageOverrides replace services' images: service → image.
	ImageOverrides map[string]string
	// CPU and Memory are the resources of a service that declares none.
	CPU, Memory string
	// Engine runs the file under a container engine inside the sandbox
	// (CONTROL_CONTAINER_ENGINE) instead of as the sandbox's own containers.
	Engine      bool
	DisplayName string
	Lifetime    time.Duration
	Tags        []string
	RunnerIDs   []string
	Annotations map[string]string
	Egress      []EgressRule
	DenyEgress  bool
}

// Proto returns the request CreateFromFile sends (without a request ID).
func (f FileSpec) Proto() *sandboxv1.CreateSandboxFromFileRequest {
	r := &sandboxv1.CreateSandboxFromFileRequest{
		Type: sandboxv1.SandboxFileType(f.Type), Contents: f.Contents, PrimaryService: f.PrimaryService,
		ImageOverrides: f.ImageOverrides, DefaultResources: requirements(f.CPU, f.Memory),
		MaxLifetimeSeconds: seconds(f.Lifetime), Tags: f.Tags, RunnerIds: f.RunnerIDs, Annotations: f.Annotations,
		DisplayName: f.DisplayName, Network: networkOptions(f.Egress, f.DenyEgress),
	}
	if r.Type == 0 {
		r.Type = sandboxv1.SandboxFileType_SANDBOX_FILE_TYPE_COMPOSE
	}
	if f.Engine {
		r.Control = sandboxv1.Control_CONTROL_CONTAINER_ENGINE
	}
	if len(f.RunnerIDs) > 0 {
		r.Mode = sandboxv1.SandboxMode_SANDBOX_MODE_CKS
	}
	return r
}

// CreateFromFile creates a sandbox from a file (a Compose file) and returns at once;
// Wait for it to run, which for Compose means every service started and passed its
// health check as its dependents require. Retries reuse the request ID, as Create's do.
func (c *Client) CreateFromFile(ctx context.Context, f FileSpec) (*Sandbox, error) {
	if len(f.Contents) == 0 {
		return nil, errors.New("sandbox: FileSpec.Contents is empty")
	}
	if len(f.Contents) > MaxSandboxFileBytes {
		return nil, fmt.Errorf("sandbox: the file has %d bytes, more than the %d a sandbox file may have", len(f.Contents), MaxSandboxFileBytes)
	}
	return c.CreateFromFileProto(ctx, f.Proto())
}

// CreateFromFileProto is CreateFromFile with a wire request; an empty request ID gets a
// fresh one.
func (c *Client) CreateFromFileProto(ctx context.Context, req *sandboxv1.CreateSandboxFromFileRequest) (*Sandbox, error) {
	if req.GetRequestId() == "" {
		req.RequestId = newUUID()
	}
	return c.createRetried(ctx, func(ctx context.Context) (*connect.Response[sandboxv1.Sandbox], error) {
		return c.svc.CreateSandboxFromFile(ctx, connect.NewRequest(req))
	})
}
