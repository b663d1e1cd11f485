// Package kubernetes is the Kubernetes backend: one Pod per sandbox, in one namespace,
// labelled with the sandbox, organization and runner IDs.
//
// The Pod has two containers. `gate` runs the agent image (a tiny OCI image holding the
// static sandbox-agent and sandbox-gate binaries); its postStart hook copies both into an
// emptyDir, and the kubelet runs the hook before it starts the next container, in the
// same sync (an init container would cost a kubelet relist, ~1 s). `sandbox` runs the
// sandbox's image with the command `sandbox-gate exec-agent`, which completes the agent
// configuration with the container's environment (the image's env, which the backend
// does not know) and execs sandbox-agent, so the unchanged agent is PID 1. The main
// command is in the agent configuration, not in the Pod's command.
//
// The agent channel: the agent listens on a unix socket in a second emptyDir, as under
// the local backend. The gate (`sandbox-gate serve`) accepts TLS 1.3 on the Pod IP, port
// 7443, and splices each connection to the socket. Both ends are authenticated with
// per-sandbox certificates the backend generates and pins: the gate accepts only the
// sandbox's client certificate, the backend only the sandbox's server certificate. Keys
// and the agent configuration (it holds the spec's env and files) live in a per-sandbox
// Secret, never in the Pod spec; the main container mounts only the configuration, the
// gate only its key pair and the client certificate. The Secret is owned by the Pod, so
// the cluster's garbage collector removes it with the Pod.
//
// How the main command ended: the agent keeps status.json in the shared emptyDir; once
// the agent has ended, the gate copies it into its termination message and ends too, so
// the Pod ends and the kubelet puts the message into the Pod status. Wait reads it from
// there (exit code, restarts, reason).
//
// Multi-container sandboxes (a spec with sidecars or init containers) are one Pod too,
// each container with its own agent behind the one gate, which picks the agent by the
// connection's TLS server name: see multi.go.
//
// Recovery: the runner's Pods are found by label; the Secret holds the spec and the
// keys, so a new backend reaches the agents of an earlier one. Logs: see logs.go.
package kubernetes

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// Labels and annotations on every Pod and Secret the backend makes.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "sandboxd"
	LabelSandbox   = "sandboxd.io/sandbox-id"
	LabelRunner    = "sandboxd.io/runner-id"
	LabelOrg       = "sandboxd.io/org-id"
	// LabelUser is a hash of the API key that created the sandbox (runtime.MetaCaller):
	// label-value safe whatever the key ID looks like; tenant same_user selects on it.
	LabelUser = "sandboxd.io/user-hash"

	secretSpec       = "spec.json"
	secretClientCert = "client.crt"
	secretClientKey  = "client.key"
	containerMain    = "sandbox"
	containerGate    = "gate"
)

// Config configures a Backend.
type Config struct {
	Client    k8s.Interface
	Namespace string
	// RunnerID labels every Pod; Recover adopts only this runner's Pods.
	RunnerID string
	// AgentImage holds /sandbox-agent and /sandbox-gate (scripts/build-runner-image.sh builds one).
	AgentImage string
	// ImagePullPolicy for the sandbox and agent images; default IfNotPresent.
	ImagePullPolicy corev1.PullPolicy
	// RuntimeClasses maps a sandbox runtime class to a RuntimeClass name ("" = the
	// cluster's default handler). nil: "" and "runc" use the default handler, any other
	// class is used as the RuntimeClass name as it is.
	RuntimeClasses map[string]string
	// DefaultRuntimeClass is the class of specs that set none; default "runc".
	DefaultRuntimeClass string
	// ImageConfig resolves an image's entrypoint and cmd for specs without a command
	// (the backend never sees the image). nil: PlatformImageConfig(PlatformRegistry,
	// PlatformRegistryHTTP).
	ImageConfig func(ctx context.Context, ref string, creds *runtime.Credentials) (image.Config, error)
	// PlatformRegistry is the host[:port] of the platform's registry (issue 22), whose
	// images come with pull tokens of the sandbox's organization (they go into the
	// sandbox's pull Secret like any credentials). Image configs are read from it even
	// when it is on the runner's own network, which the registry guard refuses for any
	// other registry; over plain HTTP when PlatformRegistryHTTP. "": none.
	PlatformRegistry     string
	PlatformRegistryHTTP bool
	// StartTimeout bounds how long Create waits for the Pod to run (scheduling, pulls).
	// Default 5 min.
	StartTimeout time.Duration
	// TerminationGrace is the Pod's terminationGracePeriodSeconds when nothing else
	// asks (a Destroy of a live Pod); default 10 s.
	TerminationGrace time.Duration
	// ForceDeleteAfter is how long Stop waits beyond the grace period for the kubelet
	// to end a Pod before it removes the Pod object with grace 0; default 30 s.
	ForceDeleteAfter time.Duration
	// LogDir, when set, keeps a copy of each sandbox's log on this host (see logs.go), so
	// it stays readable after the Pod is gone.
	LogDir string
	// RunnerPeers are where the runner (its agent channel, its edge) reaches sandboxes
	// from, for the sandboxes' NetworkPolicies: the runner's Pod (pod and namespace
	// selectors) or its addresses (ipBlock). Empty: only the gate's port is open, to
	// every source (the gate accepts only the runner's pinned certificate); the edge
	// cannot reach services then.
	RunnerPeers []networkingv1.NetworkPolicyPeer
	// DiskBytes is each sandbox's ephemeral-storage limit (its writable layer, logs and
	// disk emptyDirs; the kubelet evicts a Pod over it) when its spec sets none; 0: none.
	DiskBytes int64
	// DNSPeers are where sandboxes may always send DNS queries (UDP and TCP 53);
	// nil: DefaultDNSPeers (the kube-system namespace).
	DNSPeers []networkingv1.NetworkPolicyPeer
	// OpenReserved are reserved ranges (reserved.V4 and V6) the operator opens to explicit
	// cidr egress rules; every other reserved range is excepted from every rule.
	OpenReserved []netip.Prefix
	// SnapshotCacheDir holds the snapshot archives volumes are restored from (see
	// snapshot.go); "" = the backend takes no snapshots (Support.NoSnapshots).
	SnapshotCacheDir string
	// SnapshotCacheBytes bounds SnapshotCacheDir; default 10 GiB.
	SnapshotCacheBytes int64
	// MaxPrepull bounds the template images pre-pulled onto the nodes (prepull.go); 0
	// means DefaultMaxPrepull, negative disables pre-pull.
	MaxPrepull int
	// MaxWarm bounds the warm Pods kept for all warm targets together (pool.go); 0
	// means DefaultMaxWarm, negative keeps none (warm targets are then pre-pulled only).
	MaxWarm int
	// PrepullInFlight bounds the pre-pull Pods that exist at once; 0 means
	// DefaultPrepullInFlight.
	PrepullInFlight int
	// NodeStats reads a node's kubelet stats summary for the sandboxes' usage (usage.go);
	// default: through the API server's node proxy.
	NodeStats NodeStatsFunc
	// NodeMetrics reads a node's kubelet cAdvisor metrics (/metrics/cadvisor, Prometheus
	// text) for the sandboxes' memory peaks (usage.go); default: through the node proxy.
	NodeMetrics NodeStatsFunc
	// Dial connects to a Pod's gate; default a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// HelloListen (UDP host:port) and HelloAddr (the host:port sandboxes send to: the
	// runner's address as the Pods reach it), both set: the runner takes each sandbox's
	// gate hello (hello.go) and dials its agent as soon as it listens, instead of after
	// the kubelet reported the Pod's IP (its next relist, up to ~1 s). Every sandbox
	// NetworkPolicy then allows UDP to that port at HelloAddr's host and at RunnerPeers'
	// selector peers (not its ipBlocks: hello.go helloEgress). Empty: off. New refuses a
	// HelloAddr that ParseHelloAddr does not take.
	HelloListen, HelloAddr string
	// StepHook, when set, is told when a sandbox's Pod first reaches each step of its
	// create as the backend sees it (Step* names): for measuring (the time-to-first-command
	// benchmark prints them), never for control. Called with the backend's lock held: it
	// must return at once and not call the backend.
	StepHook func(id, step string, at time.Time)
	// Egress, when set, enforces host-name egress rules through the runner's proxy and
	// DNS (egress.go); nil: specs with them are refused (Support.NoDNSEgress).
	Egress *EgressConfig
	// NodeAgents reaches the node agent of a node (checkpoint.go): pause and resume of
	// `gvisor` sandboxes checkpoint their Pod sandbox through it. nil: pause is not
	// configured (PauseSupport says why).
	NodeAgents NodeAgentDialer
	Logger     *slog.Logger
}

// Backend is the Kubernetes runtime.Backend.
type Backend struct {
	cfg Config
	// noEgressSecrets: why this runner with Config.Egress gives no egress secrets ("": it
	// does): New could not write its roots ConfigMap (Forbidden: an old Role).
	noEgressSecrets string
	log             *slog.Logger
	pods            cache.Indexer
	stop            chan struct{}
	ctx             context.Context // ends with Close
	cancel          context.CancelFunc
	selector        labels.Selector
	// standbyProbe replaces heldInStandby in Recover when set (tests).
	standbyProbe func(ctx context.Context, s *sandbox, ip string) bool

	mu        sync.Mutex
	sandboxes map[string]*sandbox

	snaps snapCache

	// orgMu orders the writes and deletes of the organizations' pull Secrets
	// (orgsecret.go).
	orgMu sync.Mutex
	// prepull keeps template images on the nodes (prepull.go); nil: disabled.
	prepull *prepuller
	// warm keeps warm Pods for the warm targets (pool.go); nil: disabled.
	warm *warmPool

	// eventsWarned: reading Pods' events failed and was logged (observe.go).
	eventsWarned atomic.Bool
	eventsWait   []time.Duration // nil: defaultEventsWait (tests shorten it)
	// stats caches the kubelets' usage summaries (usage.go).
	stats statsCache
	// hello is the gate hello listener (hello.go); nil: off.
	hello *net.UDPConn
	// helloTo is Config.HelloAddr as New checked it (ParseHelloAddr), where the gates
	// send their hellos and the NetworkPolicies allow them (helloEgress); invalid: none.
	helloTo   netip.AddrPort
	helloRate helloLimiter
	// helloSeen: a hello was taken (the first is logged: the path through the
	// NetworkPolicies works; a policy blocking it is otherwise silent).
	helloSeen atomic.Bool

	// egressBySrc is the egress registry (egress.go): source address → sandbox.
	egressMu    sync.RWMutex
	egressBySrc map[netip.Addr]*egressSource
}

var _ runtime.Backend = (*Backend)(nil)
var _ runtime.RuntimeClassLister = (*Backend)(nil)

type sandbox struct {
	id     string
	spec   runtime.Spec
	class  string
	client tls.Certificate
	server []byte // pinned gate certificate (DER)
	// ident is what the agent proves behind the gate (agent.VerifyIdentity); nil for
	// sandboxes made before agents had one.
	ident *agentconfig.Identity
	// Multi-container sandboxes: every container's agent identity (by name) and, while
	// Create runs, the group it prepared; nil for single-container ones.
	idents map[string]*agentconfig.Identity
	group  *group
	// agentStatus is the last status of each sidecar's agent (watchAgents); guarded by
	// Backend.mu.
	agentStatus map[string]*agentv1.StatusResponse
	// statusClients are the clients ContainerStatuses asks sidecars' agents with, by
	// name; guarded by Backend.mu.
	statusClients map[string]agentv1connect.AgentServiceClient

	// steps: while Create runs, when it saw the Pod reach each step (observe.go).
	// Guarded by Backend.mu.
	steps *createSteps
	// helloKey is the sandbox's gate hello key (hello.go), nil without hellos; helloIP
	// the Pod IP its hello named ("": none taken). Guarded by Backend.mu.
	helloKey []byte
	helloIP  string
	// spare: a verified connection to the primary agent (the create's ping's, or one a
	// warm claim made), for the first agent client (spare.go); guarded by Backend.mu.
	spare *spareConn
	// hooked: the steps already told to Config.StepHook (observe.go); guarded by
	// Backend.mu.
	hooked stepSet

	// egressIPs: s's addresses in the egress registry; egressOff: the backend deletes
	// its Pod (none are registered again). Guarded by Backend.mu.
	egressIPs []netip.Addr
	egressOff bool
	// egress: s's egress secrets (CA, placeholders, values), in this process's memory
	// only; nil for a sandbox without them, or one recovered after a restart (its
	// injection hosts are refused then: EgressSecrets). Set before the Pod is made.
	egress *egress.SandboxSecrets

	// Guarded by Backend.mu.
	pod     *corev1.Pod // last seen
	uid     types.UID
	deleted bool
	// stopping: the primary of a group has ended and the backend is stopping the rest.
	stopping bool
	// neverStarted: Recover found the primary's agent still held in standby (a Create cut
	// short by a restart): a GLOBAL writer's copy is never committed (captureGlobal).
	neverStarted bool
	changed      chan struct{} // closed and replaced on every change
	done         chan struct{} // closed once exit is set
	exit         runtime.Exit

	// captures counts the open volume captures (snapshot.go), capturesIdle is closed
	// when it falls to 0; guarded by Backend.mu.
	captures     int
	capturesIdle chan struct{}

	// logsDone: each log copy's channel, closed when it ends, by container ("" = the
	// primary); nil without copies.
	logsDone map[string]chan struct{}

	// pausing: a Pause is checkpointing the sandbox (its Pod ends with the checkpoint:
	// that does not end the sandbox); paused: the sandbox is paused, its Pod gone, its
	// memory in a checkpoint on a node (checkpoint.go). Guarded by Backend.mu.
	pausing bool
	paused  *pauseState
	// agentConns are the open connections DialAgent gave out (trackConn), closed when a
	// pause has ended the sandbox's processes: the peer, in a sentry that is gone, never
	// resets them. Guarded by Backend.mu.
	agentConns map[*trackedConn]struct{}
	// adopted is closed when the Create's adoption of the sandbox's Secrets and
	// NetworkPolicy by its Pod has ended (nil: none started): a Pause waits for it, so a
	// late ownership patch cannot give them back to the Pod it deletes. Guarded by
	// Backend.mu.
	adopted chan struct{}
}

// maxIDLen is the longest sandbox ID this backend takes (IDs end up in Pod and Secret
// names and in label values).
const maxIDLen = 53

func validID(id string) bool { return runtime.ValidID(id, maxIDLen) }

// New checks cfg, starts watching the runner's Pods and returns once the watch is synced.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("kubernetes backend: Client is required")
	case cfg.Namespace == "":
		return nil, errors.New("kubernetes backend: Namespace is required")
	case cfg.AgentImage == "":
		return nil, errors.New("kubernetes backend: AgentImage is required")
	case cfg.RunnerID == "" || len(cfg.RunnerID) > 63:
		return nil, errors.New("kubernetes backend: RunnerID is required (at most 63 characters)")
	}
	noEgressSecrets := ""
	if cfg.Egress != nil {
		if err := cfg.Egress.check(); err != nil {
			return nil, fmt.Errorf("kubernetes backend: Egress: %w", err)
		}
		if err := writeEgressRoots(ctx, cfg.Client, cfg.Namespace, cfg.RunnerID, cfg.Egress.Roots); apierrors.IsForbidden(err) {
			// A runner upgraded before its Role (deploy/README.md): host-name rules
			// still work, egress secrets are off until the Role grants the ConfigMap.
			noEgressSecrets = fmt.Sprintf("this runner's Role in namespace %s lacks the rule for its egress roots ConfigMap %s (apiGroups [\"\"], resources [configmaps], verbs create, and get and update on that name: upgrade the runner's chart or manifest)",
				cfg.Namespace, gate.EgressRootsConfigMapName(cfg.RunnerID))
		} else if err != nil {
			return nil, fmt.Errorf("kubernetes backend: Egress: %w", err)
		}
	}
	if cfg.ImagePullPolicy == "" {
		cfg.ImagePullPolicy = corev1.PullIfNotPresent
	}
	if cfg.DefaultRuntimeClass == "" {
		cfg.DefaultRuntimeClass = "runc"
	}
	if err := checkRuntimeClasses(cfg.RuntimeClasses, cfg.DefaultRuntimeClass); err != nil {
		return nil, err
	}
	if cfg.ImageConfig == nil {
		cfg.ImageConfig = PlatformImageConfig(cfg.PlatformRegistry, cfg.PlatformRegistryHTTP)
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 5 * time.Minute
	}
	if cfg.TerminationGrace <= 0 {
		cfg.TerminationGrace = 10 * time.Second
	}
	if cfg.ForceDeleteAfter <= 0 {
		cfg.ForceDeleteAfter = 30 * time.Second
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	var helloTo netip.AddrPort
	if cfg.HelloAddr != "" {
		var err error
		if helloTo, err = ParseHelloAddr(cfg.HelloAddr); err != nil {
			return nil, fmt.Errorf("kubernetes backend: HelloAddr %q: %w", cfg.HelloAddr, err)
		}
		// The deployments pass [$(POD_IP)]:port (brackets: an IPv6 Pod IP): the gates
		// get the canonical form.
		cfg.HelloAddr = helloTo.String()
	}
	sel := labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedBy, LabelRunner: cfg.RunnerID})
	if noEgressSecrets != "" {
		cfg.Logger.Warn("kubernetes backend: egress secrets are off", "reason", noEgressSecrets)
	}
	b := &Backend{cfg: cfg, noEgressSecrets: noEgressSecrets, helloTo: helloTo, log: cfg.Logger, stop: make(chan struct{}), selector: sel, sandboxes: map[string]*sandbox{},
		egressBySrc: map[netip.Addr]*egressSource{},
		snaps:       snapCache{limits: map[string]runtime.ArchiveLimits{}, inUse: map[string]int{}}}
	b.cleanCache()
	b.ctx, b.cancel = context.WithCancel(context.Background())
	f := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel.String() }))
	inf := f.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { b.observe(o, false) },
		UpdateFunc: func(_, o any) { b.observe(o, false) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			b.observe(o, true)
		},
	}); err != nil {
		return nil, err
	}
	b.pods = inf.GetIndexer()
	go inf.Run(b.stop)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		close(b.stop)
		b.cancel()
		return nil, fmt.Errorf("kubernetes backend: watch pods in %s: %w", cfg.Namespace, context.Cause(ctx))
	}
	if cfg.HelloListen != "" && cfg.HelloAddr != "" {
		ua, err := net.ResolveUDPAddr("udp", cfg.HelloListen)
		if err == nil {
			b.hello, err = net.ListenUDP("udp", ua)
		}
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("kubernetes backend: hello listener: %w", err)
		}
		go b.serveHellos(b.hello)
	}
	if cfg.MaxPrepull >= 0 {
		b.prepull = newPrepuller(b)
	}
	if cfg.MaxWarm >= 0 {
		b.warm = newWarmPool(b)
	}
	return b, nil
}

// Close stops watching and copying logs. Sandboxes keep running.
func (b *Backend) Close() {
	b.cancel()
	if b.prepull != nil {
		b.prepull.close()
	}
	if b.warm != nil {
		b.warm.close() // its warm Pods stay: the next Recover removes them
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.stop:
	default:
		close(b.stop)
		if b.hello != nil {
			_ = b.hello.Close()
		}
	}
}

func podName(id string) string    { return "sbx-" + id }
func secretName(id string) string { return "sbx-" + id }

// observe records a Pod event for its sandbox.
func (b *Backend) observe(o any, deleted bool) {
	pod, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	id := pod.Labels[LabelSandbox]
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sandboxes[id]
	if s == nil || (s.uid != "" && pod.UID != s.uid) {
		return
	}
	if s.paused != nil && s.uid == "" {
		// A paused sandbox without a restored Pod: the events are those of the Pod the
		// pause deleted (or of a failed restore's): not its Pod.
		return
	}
	s.pod = pod
	if deleted {
		s.deleted = true
	}
	b.evaluateLocked(s)
}

// evaluateLocked ends s when its Pod has ended or is gone, and wakes waiters.
func (b *Backend) evaluateLocked(s *sandbox) {
	now := time.Now()
	s.steps.observe(s.pod, now)
	b.hookPodLocked(s, now)
	if s.pausing || s.paused != nil {
		// A paused sandbox's Pod ends with its checkpoint and is deleted: neither ends
		// the sandbox (checkpoint.go). A restored Pod's address is registered as soon as
		// it has one (Resume waits for it as Create does).
		b.egressObserveLocked(s)
		close(s.changed)
		s.changed = make(chan struct{})
		return
	}
	select {
	case <-s.done:
	default:
		// A GLOBAL volume writer's Pod outlives its workload (globalvol.go): the sandbox
		// ends with the last workload container, not with the Pod.
		writer := commits(&s.spec)
		if s.deleted || podEnded(s.pod) || writer && workloadEnded(s.pod, &s.spec) || !writer && primaryDone(&s.spec, s.pod) {
			s.exit = exitOf(s.pod, s.deleted, s.spec.RestartLimit, writer)
			close(s.done)
			dropSpareLocked(s)
		}
		if writer && !s.deleted && !s.stopping && gateEnded(s.pod) && !workloadEnded(s.pod, &s.spec) && !podEnded(s.pod) {
			// A writer's gate ended while its workload runs (it was killed, or crashed):
			// the workload is stopped as on Stop (through its agents, else the Pod is
			// deleted, and the copy with it), not taken for ended while it still writes.
			s.stopping = true
			rest := runningWorkload(s.pod, &s.spec)
			go func() {
				grace := max(int64(b.cfg.TerminationGrace/time.Second), 1)
				if stopped, _ := b.stopWorkload(b.ctx, s, rest, time.Duration(grace)*time.Second); stopped {
					return
				}
				if err := b.deletePod(b.ctx, s, grace); err != nil {
					b.log.Warn("stop a GLOBAL writer whose gate ended", "sandbox", s.id, "err", err)
				}
			}()
		}
		if !s.deleted && !s.stopping && primaryDone(&s.spec, s.pod) && !podEnded(s.pod) {
			// The primary's end ends the sandbox: the other containers get the grace
			// period (the Pod's deletion sends them SIGTERM; a writer's, their agents'
			// Stop, so the Pod stays for the commit), and so does a filler kept for
			// captures (keepsFillerForCaptures).
			s.stopping = true
			var rest []string
			if writer {
				rest = runningWorkload(s.pod, &s.spec)
			}
			go func() {
				grace := max(int64(b.cfg.TerminationGrace/time.Second), 1)
				if writer {
					if stopped, _ := b.stopWorkload(b.ctx, s, rest, time.Duration(grace)*time.Second); stopped {
						return
					}
				}
				if err := b.deletePod(b.ctx, s, grace); err != nil {
					b.log.Warn("stop the other containers after the primary ended", "sandbox", s.id, "err", err)
				}
			}()
		}
	}
	b.egressObserveLocked(s)
	close(s.changed)
	s.changed = make(chan struct{})
}

// primaryDone reports whether a Pod that runs on without its primary has seen its
// primary end: a group's once its primary (or gate) has terminated; a single
// container's whose filler stays for captures (keepsFillerForCaptures) once both its
// main container and its gate have (what the Pod's end means for any other single
// sandbox, the kept filler left out: the gate ends after the primary's agent, its final
// status copied into its termination message, and exitOf falls back on the main
// container's termination when that message says nothing it can read). A gate that
// crashed while the main container runs ends nothing. A GLOBAL writer's sandbox ends
// on workloadEnded, not on this (the caller checks): its primary's end only stops the
// other containers (a writer keeps no filler for captures, so this is primaryEnded).
func primaryDone(spec *runtime.Spec, p *corev1.Pod) bool {
	if spec.Multi() {
		return primaryEnded(p)
	}
	return keepsFillerForCaptures(spec) && gateEnded(p) && mainEnded(p)
}

// mainEnded reports whether p's main container (a single sandbox's, or a group's
// primary) has terminated.
func mainEnded(p *corev1.Pod) bool {
	cs := podContainerStatus(statusesOf(p), containerMain)
	return cs != nil && cs.State.Terminated != nil
}

func podEnded(p *corev1.Pod) bool {
	return p != nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed)
}

func (b *Backend) get(id string) (*sandbox, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sandboxes[id]
	if s == nil {
		return nil, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	return s, nil
}

// DialAgent implements runtime.Backend: mTLS to the Pod's gate, which splices to the agent.
func (b *Backend) DialAgent(ctx context.Context, id, container string) (net.Conn, error) {
	return b.dialAgent(ctx, id, container, false)
}

// dialAgent is DialAgent; filler: the backend's own restore may name the GLOBAL volume
// filler (globalvol.go), which the runner's callers may not reach.
func (b *Backend) dialAgent(ctx context.Context, id, container string, filler bool) (net.Conn, error) {
	s, err := b.get(id)
	if err != nil {
		return nil, err
	}
	serverName := ""
	fillerDial := filler && container == containerFiller && needsFiller(&s.spec)
	if fillerDial {
		serverName = containerFiller
	} else if !s.spec.Multi() {
		if container != "" && container != runtime.DefaultContainerName {
			return nil, fmt.Errorf("%w: %q in sandbox %s", runtime.ErrContainerNotFound, container, id)
		}
	} else if c, init := s.spec.Find(container); c == nil {
		return nil, fmt.Errorf("%w: %q in sandbox %s", runtime.ErrContainerNotFound, container, id)
	} else if init {
		return nil, fmt.Errorf("dial agent of %s: container %q is an init container: it has no agent once it has run", id, container)
	} else if c != &s.spec.Container {
		serverName = c.ContainerName()
	}
	b.mu.Lock()
	if s.paused != nil || s.pausing {
		b.mu.Unlock()
		return nil, fmt.Errorf("dial agent of %s: %w", id, runtime.ErrPaused)
	}
	ip := s.helloIP
	if s.pod != nil && s.pod.Status.PodIP != "" {
		ip = s.pod.Status.PodIP
	}
	// A GLOBAL writer's filler is reached after the workload ended, until the Pod goes
	// (the commit: CaptureVolume).
	podLive := !s.deleted && !podEnded(s.pod) && (s.pod == nil || s.pod.DeletionTimestamp == nil)
	b.mu.Unlock()
	if fillerDial && commits(&s.spec) && podLive && ip != "" {
		return b.dialGate(ctx, s, ip, serverName)
	}
	select {
	case <-s.done:
		if c := b.takeSpare(s, ""); c != nil {
			_ = c.Close()
		}
		// Its IP may be gone from the node: a dial would wait for ARP to give up.
		return nil, fmt.Errorf("dial agent of %s: the sandbox has ended", id)
	default:
	}
	if ip == "" {
		return nil, fmt.Errorf("dial agent of %s: the Pod has no IP yet", id)
	}
	if serverName == "" {
		// The create's ping (or the warm claim) verified this connection a moment ago
		// (spare.go).
		if c := b.takeSpare(s, ip); c != nil {
			return b.trackConn(s, c)
		}
	}
	c, err := b.dialGate(ctx, s, ip, serverName)
	if err != nil {
		return nil, err
	}
	return b.trackConn(s, c)
}

// dialGate connects to container's agent (a sidecar's name; "" = the primary) through
// the gate at ip.
func (b *Backend) dialGate(ctx context.Context, s *sandbox, ip, container string) (net.Conn, error) {
	raw, err := b.cfg.Dial(ctx, "tcp", net.JoinHostPort(ip, strconv.Itoa(gate.Port)))
	if err != nil {
		return nil, fmt.Errorf("dial agent of %s: %w", s.id, err)
	}
	tc := gate.ClientTLS(s.client, s.server)
	ident := s.ident
	if container != "" {
		// The gate picks the container's agent by the server name.
		tc.ServerName = container
		ident = s.idents[container]
		if ident == nil {
			raw.Close()
			return nil, fmt.Errorf("dial agent of %s: no identity recorded for container %q", s.id, container)
		}
	}
	c := tls.Client(raw, tc)
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("dial agent of %s: TLS: %w", s.id, err)
	}
	// The pinned certificate proves the Pod's gate; the handshake, the agent behind it.
	if ident != nil {
		if err := agent.VerifyIdentity(ctx, c, ident); err != nil {
			_ = c.Close()
			if errors.Is(err, agent.ErrIdentity) {
				b.log.Error("agent identity check failed: refusing the connection", "sandbox", s.id, "err", err)
			}
			return nil, fmt.Errorf("dial agent of %s: %w", s.id, err)
		}
	}
	return c, nil
}

// Wait implements runtime.Backend.
func (b *Backend) Wait(ctx context.Context, id string) (runtime.Exit, error) {
	s, err := b.get(id)
	if err != nil {
		return runtime.Exit{}, err
	}
	select {
	case <-s.done:
		return s.exit, nil
	case <-ctx.Done():
		return runtime.Exit{}, ctx.Err()
	}
}

// Stop implements runtime.Backend: the Pod is deleted with grace as its grace period, so
// the kubelet sends SIGTERM to the agent (which forwards it to the main command) and
// SIGKILL after grace. It returns when the Pod has ended.
func (b *Backend) Stop(ctx context.Context, id string, grace time.Duration) error {
	s, err := b.get(id)
	if err != nil {
		return err
	}
	select {
	case <-s.done:
		return nil
	default:
	}
	if b.stopPaused(ctx, s) {
		return nil
	}
	// A capture reads the volume through the agent: the Pod stays until it is done.
	b.waitCaptures(ctx, s)
	if commits(&s.spec) {
		// A GLOBAL volume writer: the workload stops, the Pod stays until the runner has
		// archived the copy and destroys it (globalvol.go).
		b.mu.Lock()
		names := runningWorkload(s.pod, &s.spec)
		b.mu.Unlock()
		stopped, err := b.stopWorkload(ctx, s, names, grace)
		if err != nil {
			return fmt.Errorf("stop %s: %w", id, err)
		}
		if stopped {
			return nil
		}
	}
	secs := int64((grace + time.Second - 1) / time.Second)
	// 0 would remove the Pod object at once, before the kubelet reports how it ended.
	secs = max(secs, 1)
	if err := b.deletePod(ctx, s, secs); err != nil {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	// A kubelet that does not answer (its node is gone) leaves the Pod terminating
	// forever: after the grace period and a margin the object is removed regardless.
	timer := time.NewTimer(time.Duration(secs)*time.Second + b.cfg.ForceDeleteAfter)
	defer timer.Stop()
	select {
	case <-s.done:
		return nil
	case <-timer.C:
		b.log.Warn("pod did not end after its grace period: removing it", "sandbox", id)
		if err := b.deletePod(ctx, s, 0); err != nil {
			return fmt.Errorf("stop %s: %w", id, err)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *Backend) deletePod(ctx context.Context, s *sandbox, graceSecs int64) error {
	opts := metav1.DeleteOptions{GracePeriodSeconds: &graceSecs}
	b.mu.Lock()
	// Its addresses leave the egress registry before the Pod goes (and its IP with it).
	s.egressOff = true
	b.egressForgetLocked(s)
	if s.uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &s.uid}
	}
	b.mu.Unlock()
	err := b.cfg.Client.CoreV1().Pods(b.cfg.Namespace).Delete(ctx, podName(s.id), opts)
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return err
	}
	return nil
}

// Destroy implements runtime.Backend: the Pod and the Secrets are deleted and the Pod
// waited for until it is gone. Idempotent.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	if !validID(id) {
		return nil
	}
	b.mu.Lock()
	s := b.sandboxes[id]
	b.mu.Unlock()
	if s == nil {
		s = &sandbox{id: id}
	}
	b.mu.Lock()
	dropSpareLocked(s) // the kept verified connection goes with the sandbox
	b.mu.Unlock()
	b.stopPaused(ctx, s) // a paused sandbox's checkpoint goes with it
	b.waitCaptures(ctx, s)
	// A Pod that has ended goes at once; a live one gets a second, so the kubelet stops
	// its containers before the object goes (grace 0 would leave that for later).
	grace := int64(1)
	b.mu.Lock()
	if podEnded(s.pod) {
		grace = 0
	}
	b.mu.Unlock()
	if err := b.deletePod(ctx, s, grace); err != nil {
		return fmt.Errorf("destroy %s: %w", id, err)
	}
	for _, name := range []string{secretName(id), pullSecretName(id)} {
		err := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("destroy %s: secret: %w", id, err)
		}
	}
	err := b.cfg.Client.NetworkingV1().NetworkPolicies(b.cfg.Namespace).Delete(ctx, networkPolicyName(id), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("destroy %s: network policy: %w", id, err)
	}
	if err := b.waitPodGone(ctx, id, "", 30*time.Second); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// The kubelet does not answer (node gone?): remove the object anyway.
		if err := b.deletePod(ctx, &sandbox{id: id}, 0); err != nil {
			return fmt.Errorf("destroy %s: %w", id, err)
		}
		if err := b.waitPodGone(ctx, id, "", 10*time.Second); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("destroy %s: the Pod is still there", id)
		}
	}
	b.removeLogs(id)
	b.mu.Lock()
	if b.sandboxes[id] == s {
		delete(b.sandboxes, id)
		select {
		case <-s.done:
		default:
			s.deleted = true
			b.evaluateLocked(s)
		}
	}
	b.mu.Unlock()
	// The organization's pull Secret goes with its last sandbox.
	if org := s.spec.Meta[runtime.MetaOrg]; org != "" {
		b.gcOrgSecret(ctx, org)
	}
	return nil
}

// waitPodIP waits, at most d, until the watch shows s's Pod with an IP, and returns it
// ("": none by then, or the sandbox ended).
func (b *Backend) waitPodIP(ctx context.Context, s *sandbox, d time.Duration) string {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		b.mu.Lock()
		ch := s.changed
		ip := ""
		if s.pod != nil {
			ip = s.pod.Status.PodIP
		}
		b.mu.Unlock()
		if ip != "" {
			return ip
		}
		select {
		case <-ch:
		case <-s.done:
			return ""
		case <-timer.C:
			return ""
		case <-ctx.Done():
			return ""
		}
	}
}

// recoverIPWait bounds Recover's waits for the kubelet to report Pod IPs, all Pods
// together.
const recoverIPWait = 3 * time.Second

// Recover implements runtime.Backend: the runner's Pods, with their spec and keys from
// their Secrets. Pods whose Secret is missing (a Create cut short) are deleted.
func (b *Backend) Recover(ctx context.Context) ([]runtime.Recovered, error) {
	list, err := b.cfg.Client.CoreV1().Pods(b.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: b.selector.String()})
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: list pods: %w", err)
	}
	var out []runtime.Recovered
	var warmGone sync.WaitGroup // unclaimed warm Pods, deleted in parallel
	defer warmGone.Wait()
	withPod := map[string]bool{}
	for i := range list.Items {
		withPod[list.Items[i].Labels[LabelSandbox]] = true
	}
	// Paused sandboxes (their Pod deleted, or a pause cut short before it was): taken
	// over paused (checkpoint.go).
	lists := b.newCheckpointLists() // the node agents' listings (checkpoint.go)
	pauseFinished, err := b.finishInterruptedPauses(ctx, lists, list.Items, withPod)
	if err != nil {
		return nil, err
	}
	paused, err := b.recoverPaused(ctx, lists, withPod)
	if err != nil {
		return nil, err
	}
	out = append(out, paused...)
	// One deadline for every wait for a Pod's IP below, however many Pods wait.
	ipDeadline := time.Now().Add(recoverIPWait)
	var found []*recovering
	for i := range list.Items {
		pod := &list.Items[i]
		id := pod.Labels[LabelSandbox]
		if !validID(id) || pauseFinished[id] {
			continue
		}
		sec, err := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace).Get(ctx, secretName(id), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			b.log.Warn("pod without its secret: deleting it", "sandbox", id)
			_ = b.Destroy(ctx, id)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("kubernetes backend: secret of %s: %w", id, err)
		}
		if unclaimedWarm(pod, sec) { // pool.go
			if !b.warm.owns(id) {
				b.log.Info("warm pod never claimed: deleting it", "sandbox", id)
				warmGone.Add(1)
				go func() {
					defer warmGone.Done()
					if err := b.Destroy(ctx, id); err != nil {
						b.log.Warn("delete a warm pod never claimed", "sandbox", id, "err", err)
					}
				}()
			}
			continue
		}
		s, err := sandboxFromSecret(id, sec)
		if err != nil {
			b.log.Warn("unreadable sandbox secret: deleting the sandbox", "sandbox", id, "err", err)
			_ = b.Destroy(ctx, id)
			continue
		}
		s.uid = pod.UID
		b.mu.Lock()
		if cur := b.sandboxes[id]; cur != nil {
			b.mu.Unlock()
			continue
		}
		b.sandboxes[id] = s
		// The informer may know a newer state than the list.
		if o, ok, _ := b.pods.GetByKey(b.cfg.Namespace + "/" + pod.Name); ok {
			if p, ok := o.(*corev1.Pod); ok && p.UID == pod.UID {
				pod = p
			}
		}
		s.pod = pod
		b.evaluateLocked(s)
		rec := runtime.Recovered{Spec: s.spec, Info: infoOf(s)}
		notRunning := false
		select {
		case <-s.done:
			ex := s.exit
			rec.Exit = &ex
		default:
			rec.Alive = mainRunning(pod)
			if !rec.Alive {
				notRunning = true
				// Not yet running (a Create cut short by the restart): report it as
				// vanished and let the runner destroy it.
				ex := runtime.Exit{Reason: "Vanished", Message: "the sandbox's Pod was not running when the runner started", At: time.Now().UTC()}
				if serr := startError(pod, &s.spec); serr != nil {
					// One of its containers cannot be created or started (or its image
					// pulled): it never will be, whatever its agent answers. Said as
					// Create would have said it.
					notRunning = false
					ex = recoveredStartExit(serr)
				}
				rec.Exit = &ex
			}
		}
		b.mu.Unlock()
		found = append(found, &recovering{s: s, pod: pod, sec: sec, rec: rec, notRunning: notRunning})
	}
	// What each sandbox's agent says (an IP the kubelet reports late, an agent alive
	// before the kubelet says so, one still held in standby): up to recoverProbes Pods at
	// once, each probe bounded by its own timeout, so that many sandboxes whose agents do
	// not answer cost about one probe's time, not one each.
	var probes errgroup.Group
	probes.SetLimit(recoverProbes)
	for _, r := range found {
		probes.Go(func() error {
			b.recoverProbe(ctx, r, ipDeadline)
			return nil
		})
	}
	_ = probes.Wait()
	for _, r := range found {
		s, pod, sec, rec, id := r.s, r.pod, r.sec, r.rec, r.s.id
		if rec.Alive {
			b.startLogs(s)
			b.watchAgents(s)
			if err := b.ensureNetworkPolicy(ctx, &rec.Spec, pod); err != nil {
				b.log.Warn("re-create the sandbox's network policy", "sandbox", id, "err", err)
			}
		}
		if sec.Labels[labelPaused] == "true" {
			// A resume (or a pause) cut short by the restart (checkpoint.go).
			b.recoverInterruptedPause(ctx, lists, id, sec, pod)
		}
		out = append(out, rec)
	}
	// What an earlier process left: Secrets of organizations without sandboxes, pre-pull
	// Pods (the next warm targets start them again).
	b.sweepOrgSecrets(ctx)
	if b.prepull != nil {
		b.prepull.cleanup(ctx)
	}
	return out, nil
}

// recovering is one sandbox Recover re-adopts, between its listing and its report.
type recovering struct {
	s          *sandbox
	pod        *corev1.Pod // as the probes last saw it
	sec        *corev1.Secret
	rec        runtime.Recovered
	notRunning bool // its Pod did not say its main container runs
}

// recoverProbes bounds the sandboxes whose agents Recover probes at once.
const recoverProbes = 16

// recoverProbe asks r's agent what the Pod's status does not say yet (Recover): it
// waits (within ipDeadline) for the IP of a young Pod without one, takes an agent that
// answers for alive, and a Create cut short (its agent still in standby) for vanished.
func (b *Backend) recoverProbe(ctx context.Context, r *recovering, ipDeadline time.Time) {
	s, pod, notRunning := r.s, r.pod, r.notRunning
	rec := &r.rec
	defer func() { r.pod = pod }()
	probe := b.heldInStandby
	if b.standbyProbe != nil {
		probe = b.standbyProbe
	}
	ip := pod.Status.PodIP
	if notRunning && ip == "" && pod.DeletionTimestamp == nil && scheduled(pod) &&
		time.Since(pod.CreationTimestamp.Time) < b.cfg.StartTimeout && time.Until(ipDeadline) > 0 {
		// A create that took its gate's hello returns before the kubelet reports the
		// Pod's IP (its next relist, ~1 s): a runner restarted within that window
		// waits for the report, for a Pod young enough to be such a create only, and
		// all of them within one shared recoverIPWait.
		ip = b.waitPodIP(ctx, s, time.Until(ipDeadline))
		// The wait saw the Pod change: the checks below judge what it shows now (a
		// claim's or restore's annotations, the containers' states), not the list.
		b.mu.Lock()
		if s.pod != nil && s.pod.UID == pod.UID {
			pod = s.pod
		}
		b.mu.Unlock()
	}
	if notRunning && ip != "" && pod.DeletionTimestamp == nil {
		// The kubelet reports a container running only at its next relist, seconds
		// after a Pod of many containers started: an agent that answers is alive.
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		if b.pingAgent(pctx, s, ip) == nil {
			rec.Alive, rec.Exit = true, nil
			b.mu.Lock()
			rec.Info = infoOf(s)
			b.mu.Unlock()
		}
		cancel()
	}
	if rec.Exit != nil && rec.Exit.Reason == "Vanished" && commits(&s.spec) && workloadRunning(pod, &s.spec) &&
		pod.Annotations[annotationWorkloadStarted] == "true" {
		// A GLOBAL writer whose primary has ended while a sidecar still runs (in its
		// stop grace): alive until its whole workload has ended, so that its copy is
		// not committed while the sidecar writes. Only a workload that was started: a
		// create cut short (a sidecar in standby, the primary still pulling) stays
		// vanished rather than holding the volume's lease with nothing started.
		rec.Alive, rec.Exit = true, nil
	}
	if ip == "" {
		ip = pod.Status.PodIP
	}
	if rec.Alive && ip != "" && (restoresVolumes(&s.spec) || commits(&s.spec) || warmClaimBegun(pod) || b.usesEgress(&s.spec) && !s.spec.Multi()) && probe(ctx, s, ip) {
		// A Create restoring volumes (or a GLOBAL writer's, waiting for its filler, or
		// one waiting for its address in the egress registry) cut short by the
		// restart: its main command was never started (the agent still holds it):
		// vanished, as above; a writer's copy is never committed.
		msg := "the sandbox's volumes were being restored when the runner stopped"
		if !restoresVolumes(&s.spec) && !commits(&s.spec) && !warmClaimBegun(pod) {
			msg = "the sandbox was being started when the runner stopped"
		}
		ex := runtime.Exit{Reason: "Vanished", Message: msg, At: time.Now().UTC()}
		rec.Alive, rec.Exit = false, &ex
		b.mu.Lock()
		s.neverStarted = true
		b.mu.Unlock()
	}
}

// recoveredStartExit is the exit Recover reports for a Pod that startError says cannot
// start: the reason the runner gives such a failed Create (runtime.CreateFailureReason,
// the one table both use: StartError for the spec's fault, ImagePullFailed for an
// image, BackendError for the runner's own) and the error's text.
func recoveredStartExit(err error) runtime.Exit {
	return runtime.Exit{Reason: runtime.CreateFailureReason(err), Message: err.Error(), At: time.Now().UTC()}
}

var _ runtime.LateInfoWaiter = (*Backend)(nil)

// WaitInfo implements runtime.LateInfoWaiter: a Create that took its agent's answer
// before the kubelet's status (the gate's hello) returns without the image digest; this
// waits for the status that carries it (the kubelet's next relist, ≤ ~1 s).
func (b *Backend) WaitInfo(ctx context.Context, id string) (runtime.Info, error) {
	s, err := b.get(id)
	if err != nil {
		return runtime.Info{}, err
	}
	for {
		b.mu.Lock()
		info, ch := infoOf(s), s.changed
		b.mu.Unlock()
		if info.ImageDigest != "" {
			return info, nil
		}
		select {
		case <-ch:
		case <-s.done:
			return b.info(s), nil
		case <-ctx.Done():
			return info, ctx.Err()
		}
	}
}

func infoOf(s *sandbox) runtime.Info {
	info := runtime.Info{ID: s.id, RuntimeClass: s.class}
	if s.pod == nil {
		return info
	}
	info.IP = s.pod.Status.PodIP
	if info.IP == "" {
		info.IP = s.helloIP // the kubelet reports it after its next relist
	}
	if cs := containerStatus(s.pod, containerMain); cs != nil {
		info.ImageDigest = digestOf(cs.ImageID)
		if cs.State.Running != nil {
			info.StartedAt = cs.State.Running.StartedAt.UTC()
		}
	}
	if info.StartedAt.IsZero() && s.pod.Status.StartTime != nil {
		info.StartedAt = s.pod.Status.StartTime.UTC()
	}
	if t, ok := warmClaimedAt(s.pod); ok {
		// A Pod claimed from the warm pool: its containers started when it was made,
		// its main command at the claim.
		info.StartedAt = t
	}
	return info
}

func sandboxFromSecret(id string, sec *corev1.Secret) (*sandbox, error) {
	var spec runtime.Spec
	if err := json.Unmarshal(sec.Data[secretSpec], &spec); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	cert, err := tls.X509KeyPair(sec.Data[secretClientCert], sec.Data[secretClientKey])
	if err != nil {
		return nil, fmt.Errorf("client key pair: %w", err)
	}
	server, err := certDER(sec.Data[gate.TLSCertFile])
	if err != nil {
		return nil, err
	}
	var acfg agentconfig.Config
	if err := json.Unmarshal(sec.Data[gate.ConfigFile], &acfg); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	s := &sandbox{
		id: id, spec: spec, class: spec.RuntimeClass, client: cert, server: server, ident: acfg.Identity,
		changed: make(chan struct{}), done: make(chan struct{}),
	}
	if needsFiller(&spec) {
		var c agentconfig.Config
		if err := json.Unmarshal(sec.Data[fillerConfigKey], &c); err != nil {
			return nil, fmt.Errorf("agent config of the volume filler: %w", err)
		}
		s.idents = map[string]*agentconfig.Identity{containerFiller: c.Identity}
	}
	if spec.Multi() {
		if s.idents == nil {
			s.idents = map[string]*agentconfig.Identity{}
		}
		for _, m := range members(&spec) {
			var c agentconfig.Config
			if err := json.Unmarshal(sec.Data[configKey(m)], &c); err != nil {
				return nil, fmt.Errorf("agent config of container %s: %w", m.name, err)
			}
			s.idents[m.name] = c.Identity
		}
	}
	return s, nil
}
