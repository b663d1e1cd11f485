package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// State is a sandbox's lifecycle state.
type State int32

// States, numbered as in coreweave.sandbox.v1.State.
const (
	StateUnspecified State = 0
	StateCreating    State = 1
	StateRunning     State = 2
	StateCompleted   State = 3 // the main command exited on its own
	StateFailed      State = 4
	StateTerminating State = 5
	StateTerminated  State = 6 // stopped by a user
	StatePending     State = 7
	StatePaused      State = 8
)

// String is the state's name in lower case, as the official client reports it
// ("running", "completed", …).
func (s State) String() string {
	name, ok := sandboxv1.State_name[int32(s)]
	if !ok {
		return fmt.Sprintf("state(%d)", int32(s))
	}
	return strings.ToLower(strings.TrimPrefix(name, "STATE_"))
}

// Terminal reports whether the sandbox has ended for good.
func (s State) Terminal() bool {
	return s == StateCompleted || s == StateFailed || s == StateTerminated
}

// ParseState parses a state name ("running", "STATE_RUNNING", case-insensitive).
func ParseState(name string) (State, error) {
	n := "STATE_" + strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(name)), "STATE_")
	v, ok := sandboxv1.State_value[n]
	if !ok {
		return 0, fmt.Errorf("unknown state %q", name)
	}
	return State(v), nil
}

// DefaultImage, DefaultCommand and DefaultArgs are what Create uses for an empty Spec,
// like the official client: a sandbox that stays up until it is stopped.
const (
	DefaultImage   = "python:3.11"
	DefaultCommand = "/bin/sh"
)

// DefaultArgs keep the default command running until SIGTERM.
var DefaultArgs = []string{"-c", `trap "exit 0" TERM INT; sleep infinity & wait`}

// Spec describes a sandbox: one container (Image, Command … Memory) or, with
// Containers, several.
type Spec struct {
	// Containers, when set, are the sandbox's containers (the primary first or marked
	// Primary) and the single-container fields below, Image to Memory, must be empty.
	Containers []Container

	Image string // default DefaultImage
	// Command is the executable (one string); Args its arguments. Both empty run
	// DefaultCommand with DefaultArgs; Command empty with Args runs the image entrypoint.
	Command    string
	Args       []string
	Env        map[string]string
	WorkingDir string
	Files      map[string][]byte // path in the sandbox → content, written before start
	CPU        string            // e.g. "500m", "2": request and limit
	Memory     string            // e.g. "512Mi"
	Lifetime   time.Duration     // 0 = platform default
	Tags       []string
	RunnerIDs  []string
	// Annotations are free-form key/values stored with the sandbox.
	Annotations map[string]string
	// Publish gives ports public endpoints on the runner's edge.
	Publish []Endpoint
	// Egress is what the sandbox may reach. Empty means the default: the runner
	// policy's, else the platform's (the internet and the organization's sandboxes).
	Egress []EgressRule
	// DenyEgress allows no egress at all but the platform DNS; exclusive with Egress.
	DenyEgress bool
	// Volumes are the sandbox's scratch volumes (see ScratchVolume): each can be
	// snapshotted, and one with RestoreFrom starts with a snapshot's content.
	Volumes []ScratchVolume
}

// Endpoint kinds.
const (
	HTTPS          = "https" // TLS ended at the runner's edge with a platform certificate
	TLSPassthrough = "tls"   // TLS passed to the sandbox untouched, routed by SNI
)

// Endpoint publishes a sandbox port.
type Endpoint struct {
	Port int
	Kind string // HTTPS or TLSPassthrough
	// Token (HTTPS only): callers need an API key of the sandbox's organization as
	// `Authorization: Bearer`.
	Token bool
	// Timeout (HTTPS only) bounds a request until its response headers; 0 = 15 s.
	Timeout time.Duration
}

// Published is an endpoint's address: an https:// URL, or host:port for passthrough.
type Published struct {
	Port    int
	Kind    string
	Address string // "" until the runner publishes it
	// Auth is who may call it: AuthOpen or AuthShareToken (the status's, else the spec's;
	// "" for passthrough).
	Auth string
}

// Endpoint auth modes, as Published.Auth reports them.
const (
	AuthOpen       = "open"
	AuthShareToken = "share_token"
)

// Resources are Kubernetes quantities ("500m", "1Gi"); "" is not set.
type Resources struct{ CPU, Memory string }

// Proto returns the wire spec Create sends. With Containers the primary is marked
// explicitly (the one marked Primary, else the first).
func (s Spec) Proto() *sandboxv1.SandboxSpec {
	sp := &sandboxv1.SandboxSpec{Tags: s.Tags, RunnerIds: s.RunnerIDs, Annotations: s.Annotations}
	if len(s.Containers) > 0 {
		prim := primaryIndex(s.Containers, func(c Container) bool { return c.Primary })
		for i, c := range s.Containers {
			sp.Containers = append(sp.Containers, c.proto(i == prim))
		}
	} else {
		sp.Containers = []*sandboxv1.Container{s.mainContainer()}
	}
	for _, e := range s.Publish {
		ep := &sandboxv1.EndpointSpec{Kind: sandboxv1.EndpointKind_ENDPOINT_KIND_HTTPS, RequestTimeoutSeconds: int32(e.Timeout / time.Second)}
		if e.Kind == TLSPassthrough {
			ep.Kind = sandboxv1.EndpointKind_ENDPOINT_KIND_TLS_PASSTHROUGH
		}
		if e.Token {
			ep.Auth = sandboxv1.EndpointAuth_ENDPOINT_AUTH_SHARE_TOKEN
		}
		sp.Services = append(sp.Services, &sandboxv1.Service{Port: int32(e.Port), Visibility: sandboxv1.Visibility_VISIBILITY_PUBLIC, Endpoint: ep})
	}
	sp.Network = networkOptions(s.Egress, s.DenyEgress)
	for _, v := range s.Volumes {
		sp.Volumes = append(sp.Volumes, v.proto())
	}
	if s.Lifetime > 0 {
		sp.MaxLifetimeSeconds = int32(min(math.Ceil(s.Lifetime.Seconds()), math.MaxInt32))
	}
	if len(s.RunnerIDs) > 0 {
		sp.Mode = sandboxv1.SandboxMode_SANDBOX_MODE_CKS
	}
	return sp
}

// mainContainer is the only container of a single-container Spec.
func (s Spec) mainContainer() *sandboxv1.Container {
	c := &sandboxv1.Container{
		Name:                 "main",
		Image:                s.Image,
		Command:              s.Command,
		Args:                 s.Args,
		EnvironmentVariables: s.Env,
		WorkingDir:           s.WorkingDir,
	}
	if c.Image == "" {
		c.Image = DefaultImage
	}
	if s.Command == "" && len(s.Args) == 0 {
		c.Command, c.Args = DefaultCommand, append([]string(nil), DefaultArgs...)
	}
	for _, p := range sortedKeys(s.Files) {
		c.Files = append(c.Files, &sandboxv1.FileMount{Path: p, Content: s.Files[p]})
	}
	c.ResourceRequirements = requirements(s.CPU, s.Memory)
	for _, v := range s.Volumes {
		if v.MountPath != "" {
			c.VolumeMounts = append(c.VolumeMounts, &sandboxv1.VolumeMount{Volume: v.Name, MountPath: v.MountPath})
		}
	}
	return c
}

// networkOptions is the wire form of Egress and DenyEgress (nil for the default).
func networkOptions(egress []EgressRule, deny bool) *sandboxv1.NetworkOptions {
	if len(egress) == 0 && !deny {
		return nil
	}
	n := &sandboxv1.NetworkOptions{Egress: egressToProto(egress)}
	if deny {
		n.DenyEgress = &deny
	}
	return n
}

// Sandbox is a client-side handle on one sandbox with the status last seen. Its
// methods are safe for concurrent use.
type Sandbox struct {
	c  *Client
	id string

	mu      sync.Mutex
	proto   *sandboxv1.Sandbox
	fileCap atomic.Int64 // the server's unary file cap, once reported
	// container is where exec, files and logs go by default ("" = the primary); see
	// InContainer.
	container string
	// shareToken is the create response's endpoint share token: Get and List never
	// return it, so a refresh must not lose it.
	shareToken string
}

// ShareToken is the credential of the sandbox's HTTPS SHARE_TOKEN endpoints, returned
// by the create that made this handle only ("" for any other handle, or a sandbox
// without such an endpoint). Send it as the X-Sandbox-Share-Token header; never log it.
func (s *Sandbox) ShareToken() string { return s.shareToken }

// Info is a snapshot of a sandbox's status.
type Info struct {
	ID        string
	State     State
	Reason    string // why it is in this state (e.g. the pull error of a FAILED sandbox)
	ExitCode  *int   // the main command's, once it exited
	RunnerID  string
	Image     string // the primary container's
	Tags      []string
	CreatedAt time.Time
	StartedAt time.Time
	EndedAt   time.Time
	Lifetime  time.Duration // effective maximum lifetime
	// ExpiresAt is when the runner stops it at the latest: creation plus Lifetime
	// (zero when either is unknown).
	ExpiresAt time.Time
	// Requests and Limits are the effective resources, defaults included.
	Requests, Limits Resources
	// Restarts counts the main command's restarts (with several containers, the most
	// any container had; Containers has each one's).
	Restarts  int
	Endpoints []Published
	// Egress are the effective egress rules: what the sandbox may reach, defaults
	// included (none under deny_egress).
	Egress []EgressRule
	// Containers are the sandbox's containers, the spec's order, with their status once
	// the server reports it (a single-container sandbox has one).
	Containers []ContainerInfo
	// SourceTemplateID and SourceTemplateRevision name the template (and its revision)
	// the sandbox was made from (CreateFromTemplate); "" and 0 otherwise.
	SourceTemplateID       string
	SourceTemplateRevision int64
}

// ID is the sandbox's ID.
func (s *Sandbox) ID() string { return s.id }

// Proto returns the last sandbox message received (nil if none).
func (s *Sandbox) Proto() *sandboxv1.Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proto
}

// State is the state last seen.
func (s *Sandbox) State() State { return s.Info().State }

// Info returns the status last seen.
func (s *Sandbox) Info() Info {
	p := s.Proto()
	st := p.GetStatus()
	in := Info{
		ID: s.id, State: State(st.GetState()), Reason: st.GetStateReason(), RunnerID: st.GetRunnerId(),
		Tags: p.GetSpec().GetTags(), Lifetime: time.Duration(st.GetEffectiveMaxLifetimeSeconds()) * time.Second,
		Egress:           egressFromProto(st.GetEffectiveEgress()),
		SourceTemplateID: p.GetSourceTemplateId(), SourceTemplateRevision: p.GetSourceTemplateRevision(),
	}
	if cs := p.GetSpec().GetContainers(); len(cs) > 0 {
		in.Image = cs[primaryIndex(cs, (*sandboxv1.Container).GetPrimary)].GetImage()
	}
	in.Containers = containerInfos(p)
	if st != nil && st.ExitCode != nil {
		c := int(st.GetExitCode())
		in.ExitCode = &c
	}
	if t := st.GetCreateTime(); t != nil {
		in.CreatedAt = t.AsTime()
		if in.Lifetime > 0 {
			in.ExpiresAt = in.CreatedAt.Add(in.Lifetime)
		}
	}
	rr := st.GetEffectiveResourceRequirements()
	in.Requests = Resources{CPU: rr.GetRequests().GetCpu(), Memory: rr.GetRequests().GetMemory()}
	in.Limits = Resources{CPU: rr.GetLimits().GetCpu(), Memory: rr.GetLimits().GetMemory()}
	for _, cs := range st.GetContainerStatuses() {
		in.Restarts = max(in.Restarts, int(cs.GetRestartCount()))
	}
	if t := st.GetStartTime(); t != nil {
		in.StartedAt = t.AsTime()
	}
	if t := st.GetEndTime(); t != nil {
		in.EndedAt = t.AsTime()
	}
	for _, svc := range st.GetServices() {
		ep := svc.GetEndpoint()
		if ep == nil {
			continue
		}
		pub := Published{Port: int(svc.GetPort()), Kind: HTTPS, Address: ep.GetUrl(), Auth: authName(ep.GetAuth(), p.GetSpec(), svc.GetPort())}
		if ep.GetKind() == sandboxv1.EndpointKind_ENDPOINT_KIND_TLS_PASSTHROUGH {
			pub.Kind, pub.Address, pub.Auth = TLSPassthrough, svc.GetUrl(), ""
		}
		in.Endpoints = append(in.Endpoints, pub)
	}
	return in
}

// authName names an endpoint's auth: the status's, else what the spec asked for on
// that port (a server that does not echo it).
func authName(a sandboxv1.EndpointAuth, spec *sandboxv1.SandboxSpec, port int32) string {
	if a == sandboxv1.EndpointAuth_ENDPOINT_AUTH_UNSPECIFIED {
		for _, svc := range spec.GetServices() {
			if svc.GetPort() == port {
				a = svc.GetEndpoint().GetAuth()
			}
		}
	}
	if a == sandboxv1.EndpointAuth_ENDPOINT_AUTH_SHARE_TOKEN {
		return AuthShareToken
	}
	return AuthOpen
}

func (s *Sandbox) set(p *sandboxv1.Sandbox) {
	if p == nil {
		return
	}
	s.mu.Lock()
	s.proto = p
	s.mu.Unlock()
}

func (c *Client) handle(p *sandboxv1.Sandbox) *Sandbox {
	return &Sandbox{c: c, id: p.GetSandboxId(), proto: p}
}

// Sandbox returns a handle on the sandbox id without calling the API; its state is
// unknown until Refresh (operations that need a running sandbox wait for it first).
func (c *Client) Sandbox(id string) *Sandbox {
	return &Sandbox{c: c, id: id, proto: &sandboxv1.Sandbox{SandboxId: id}}
}

// Create starts a sandbox and returns at once, usually in StateCreating; Wait for it
// to run. Transient failures are retried with the same request ID, so a retry never
// creates a second sandbox.
func (c *Client) Create(ctx context.Context, spec Spec) (*Sandbox, error) {
	if err := spec.validateContainers(); err != nil {
		return nil, err
	}
	if err := spec.validateVolumes(); err != nil {
		return nil, err
	}
	return c.CreateProto(ctx, spec.Proto())
}

// CreateProto is Create with a wire spec.
func (c *Client) CreateProto(ctx context.Context, spec *sandboxv1.SandboxSpec) (*Sandbox, error) {
	req := &sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec}, RequestId: newUUID()}
	return c.createRetried(ctx, func(ctx context.Context) (*connect.Response[sandboxv1.Sandbox], error) {
		return c.svc.CreateSandbox(ctx, connect.NewRequest(req))
	})
}

// createRetried makes a sandbox with call, retrying transient failures (call resends the
// same request, so the same request ID: a retry never makes a second sandbox), and
// returns its handle.
func (c *Client) createRetried(ctx context.Context, call func(context.Context) (*connect.Response[sandboxv1.Sandbox], error)) (*Sandbox, error) {
	var out *sandboxv1.Sandbox
	err := retry(ctx, retryBudget, func(ctx context.Context) error {
		cctx, cancel := withTimeout(ctx, createTimeout)
		defer cancel()
		res, err := call(cctx)
		if err != nil {
			return fromRPC(err)
		}
		out = res.Msg
		return nil
	})
	if err != nil {
		return nil, err
	}
	sb := c.handle(out)
	sb.shareToken = out.GetEndpointShareToken()
	return sb, nil
}

// Get returns the sandbox id with its current status (also after it ended, within the
// server's retention window).
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	sb := c.Sandbox(id)
	if err := sb.Refresh(ctx); err != nil {
		return nil, err
	}
	return sb, nil
}

// Refresh fetches the current status.
func (s *Sandbox) Refresh(ctx context.Context) error {
	cctx, cancel := withTimeout(ctx, getTimeout)
	defer cancel()
	res, err := s.c.svc.GetSandbox(cctx, connect.NewRequest(&sandboxv1.GetSandboxRequest{SandboxId: s.id}))
	if err != nil {
		return fromRPC(err)
	}
	s.set(res.Msg)
	return nil
}

// ListOptions filters List. By default only active sandboxes are listed.
type ListOptions struct {
	Tags           []string // all must match
	State          State    // 0 = any; a terminal state lists ended sandboxes too
	ShowTerminated bool
	RunnerIDs      []string
	PageSize       int32 // 0 = server default
}

// List returns the caller's sandboxes, following page tokens.
func (c *Client) List(ctx context.Context, opts ListOptions) ([]*Sandbox, error) {
	ctx, cancel := withTimeout(ctx, listTimeout)
	defer cancel()
	items, err := collectPages(ctx, maxListPages, func(ctx context.Context, token string) ([]*sandboxv1.Sandbox, string, error) {
		res, err := c.svc.ListSandboxes(ctx, connect.NewRequest(&sandboxv1.ListSandboxesRequest{
			PageSize: opts.PageSize, PageToken: token, Tags: opts.Tags, State: sandboxv1.State(opts.State),
			ShowTerminated: opts.ShowTerminated, RunnerIds: opts.RunnerIDs,
		}))
		if err != nil {
			return nil, "", fromRPC(err)
		}
		return res.Msg.GetSandboxes(), res.Msg.GetNextPageToken(), nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]*Sandbox, len(items))
	for i, p := range items {
		out[i] = c.handle(p)
	}
	return out, nil
}

// collectPages calls fetch with each next page token until there is none, at most
// maxPages times; a token repeated by the server is an error rather than a loop.
func collectPages[T any](ctx context.Context, maxPages int, fetch func(ctx context.Context, token string) ([]T, string, error)) ([]T, error) {
	var all []T
	seen := map[string]bool{}
	token := ""
	for page := 0; ; page++ {
		if page == maxPages {
			return all, fmt.Errorf("sandbox: listing stopped after %d pages", maxPages)
		}
		items, next, err := fetch(ctx, token)
		if err != nil {
			return all, err
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		if seen[next] {
			return all, fmt.Errorf("sandbox: the server repeated page token %q", next)
		}
		seen[next] = true
		token = next
	}
}

// Delete deletes the sandbox id at once (no grace period) without waiting for it to
// end.
func (c *Client) Delete(ctx context.Context, id string) error {
	cctx, cancel := withTimeout(ctx, deleteTimeout)
	defer cancel()
	_, err := c.svc.DeleteSandbox(cctx, connect.NewRequest(&sandboxv1.DeleteSandboxRequest{SandboxId: id}))
	return fromRPC(err)
}

// PurgeOptions choose what Purge stops: exactly one of Tags (sandboxes with all of
// them) or All.
type PurgeOptions struct {
	Tags   []string
	All    bool
	DryRun bool // only count what would be stopped
}

// PurgeResult is what Purge stopped (or, dry, would stop).
type PurgeResult struct {
	Count int
	// Failed could not be stopped; Retryable could not be reached for now (try again).
	Failed, Retryable []string
}

// Purge deletes the caller's active sandboxes with all of Tags (or All of them) at once,
// without a grace period or waiting for them to end.
func (c *Client) Purge(ctx context.Context, opts PurgeOptions) (PurgeResult, error) {
	if (len(opts.Tags) > 0) == opts.All {
		return PurgeResult{}, errors.New("sandbox: purge needs exactly one scope: tags or all")
	}
	cctx, cancel := withTimeout(ctx, deleteTimeout)
	defer cancel()
	res, err := c.svc.PurgeSandboxes(cctx, connect.NewRequest(&sandboxv1.PurgeSandboxesRequest{Tags: opts.Tags, PurgeAll: opts.All, DryRun: opts.DryRun}))
	if err != nil {
		return PurgeResult{}, fromRPC(err)
	}
	return PurgeResult{Count: int(res.Msg.GetPurgeCount()), Failed: res.Msg.GetFailedSandboxIds(), Retryable: res.Msg.GetRetryableFailedSandboxIds()}, nil
}

// Wait polls until the sandbox runs (or is paused, terminating or completed) and
// returns nil then; a FAILED or TERMINATED sandbox is a *StateError. Without a deadline
// on ctx it gives up after 5 minutes.
func (s *Sandbox) Wait(ctx context.Context) error {
	return s.WaitProgress(ctx, nil)
}

// WaitProgress is Wait calling progress after every poll, e.g. to show how long an
// image pull takes.
func (s *Sandbox) WaitProgress(ctx context.Context, progress func(Info)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, waitTimeout)
		defer cancel()
	}
	b := newPollBackoff()
	for {
		if err := retry(ctx, retryBudget, s.Refresh); err != nil {
			return err
		}
		in := s.Info()
		if progress != nil {
			progress(in)
		}
		switch in.State {
		case StateCreating, StatePending:
		case StateFailed, StateTerminated:
			return &StateError{ID: s.id, State: in.State, Reason: in.Reason, ExitCode: in.ExitCode}
		default: // running, paused, terminating, completed (unspecified counts as completed)
			return nil
		}
		if err := sleep(ctx, b.next()); err != nil {
			return fmt.Errorf("sandbox %s did not start (still %s): %w", s.id, in.State, waitErr(err))
		}
	}
}

func waitErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return errors.Join(ErrTimeout, err)
	}
	return err
}

// ensureRunning waits for a sandbox not yet known to run.
func (s *Sandbox) ensureRunning(ctx context.Context) error {
	if st := s.Proto().GetStatus(); st != nil && State(st.GetState()) == StateRunning {
		return nil
	}
	return s.Wait(ctx)
}

// waitEnded polls until the sandbox deleted with grace secs is COMPLETED, FAILED or
// TERMINATED.
func (s *Sandbox) waitEnded(ctx context.Context, secs int32) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(secs)*time.Second+waitTimeout)
		defer cancel()
	}
	b := newPollBackoff()
	var missingSince time.Time
	for !s.State().Terminal() {
		if err := sleep(ctx, b.next()); err != nil {
			return fmt.Errorf("sandbox %s did not stop (still %s): %w", s.id, s.State(), waitErr(err))
		}
		err := s.Refresh(ctx)
		switch {
		case err == nil:
			missingSince = time.Time{}
		case errors.Is(err, ErrNotFound):
			if missingSince.IsZero() {
				missingSince = time.Now()
			} else if time.Since(missingSince) > notFoundGrace {
				return fmt.Errorf("sandbox %s: its final state is unavailable: %w", s.id, err)
			}
		case isRetryable(err):
		default:
			return err
		}
	}
	return nil
}
