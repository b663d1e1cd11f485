package kubernetes

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/agent"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

func containerStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	if p == nil {
		return nil
	}
	for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

func mainRunning(p *corev1.Pod) bool {
	cs := containerStatus(p, containerMain)
	return cs != nil && cs.State.Running != nil
}

func mainStarted(p *corev1.Pod) bool {
	cs := containerStatus(p, containerMain)
	return cs != nil && (cs.State.Running != nil || cs.State.Terminated != nil && cs.State.Terminated.StartedAt.Unix() > 0)
}

// Waiting reasons of the kubelet that mean the image cannot be had.
var pullReasons = map[string]bool{
	"ErrImagePull": true, "ImagePullBackOff": true, "ErrImageNeverPull": true,
	"InvalidImageName": true, "ImageInspectError": true, "RegistryUnavailable": true,
}

// Waiting reasons that mean the container could not be created or started: the
// container runtime refused it (CreateContainerError: CRI-O runs `runc create` here),
// the kubelet could not build its config (CreateContainerConfigError: a Secret or key
// of an env var missing, runAsNonRoot with an image that runs as root, a subPath it
// cannot prepare), the runtime failed to start it (RunContainerError: containerd runs
// `runc create` here), or its PostStart hook failed. PreStartHookError is not among
// them: it is the kubelet's resource managers (CPU, memory, topology) failing to admit a
// created container, a node fault and not final (the container stays Created, and the
// kubelet starts a Created container again whatever the restartPolicy), so the start
// waits and a lasting one ends in the StartTimeout, which quotes it (podSummary).
var configReasons = map[string]bool{
	"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true,
	"PostStartHookError": true,
}

// retriedReasons are the waiting reasons of a container that was never created: the
// kubelet tries again at every sync of the Pod, so a cause that goes away by itself
// (transientCreate) is not a failure. Every other reason is final under the Pods'
// restartPolicy Never: a container that was created is never created again.
var retriedReasons = map[string]bool{"CreateContainerConfigError": true, "CreateContainerError": true}

// transientMarkers are parts of a CreateContainerConfigError / CreateContainerError
// message whose cause the kubelet resolves in the normal course on a later sync: its
// watch of a Secret or ConfigMap not synced yet, a CreateContainer that timed out and
// still holds the name in containerd ("failed to reserve container name"), the CRI
// socket restarting, CRI-O's "error reserving ctr name ...: name is reserved" (its
// form of containerd's), a kubelet just restarted that has not listed the Services yet
// ("services have not yet been read at least once, cannot construct envvars"). A missing Secret or key ("secret \"x\" not found") is not among
// them: the runner creates its own Secret before the Pod and checks a SecretRef's
// Secret and key before it (CheckSecretRefs), so one missing now was deleted since,
// and waiting for it would hold the create until StartTimeout.
var transientMarkers = []string{
	"failed to sync secret cache", "failed to sync configmap cache", "timed out waiting for the condition",
	"failed to reserve container name", "is reserved for", "name is reserved",
	"services have not yet been read at least once",
	"context deadline exceeded", "deadlineexceeded",
	"code = unavailable", "transport is closing", "error while dialing",
}

// startFailedReasons are the reasons of a container that terminated without having
// started: the container runtime could not start it (containerd's StartError, exit
// code 128, with `runc create`'s error as the message; docker's ContainerCannotRun).
// Under restartPolicy Never the kubelet does not try again.
var startFailedReasons = map[string]bool{"StartError": true, "ContainerCannotRun": true}

// maxStartMessage bounds the kubelet's or the container runtime's message quoted in a
// start failure: a Waiting message has no bound of its own, and a runtime's error quotes
// paths from the spec and the image.
const maxStartMessage = 1024

// MaxStartMessage is maxStartMessage, for the attack tests (test/security).
const MaxStartMessage = maxStartMessage

// runtimeText is a message of the kubelet or the container runtime fit to quote: at most
// maxStartMessage bytes of valid UTF-8 (cut with textclip's marker), every character
// that is not printable (a newline of a multi-line runtime error, an escape sequence
// from a path in the spec) a space.
func runtimeText(s string) string { return runtimeTextN(s, maxStartMessage) }

// runtimeTextN is runtimeText of at most n bytes.
func runtimeTextN(s string, n int) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, textclip.Clip(s, n))
}

// containsAny reports whether the lower-cased s holds one of markers.
func containsAny(s string, markers []string) bool {
	s = strings.ToLower(s)
	for _, m := range markers {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// transientCreate reports whether a never-created container's waiting reason and
// message are one the kubelet resolves by itself (transientMarkers).
func transientCreate(reason, msg string) bool {
	return retriedReasons[reason] && containsAny(textclip.Clip(msg, maxStartMessage), transientMarkers)
}

// startError is a reason the Pod will not start without a change to the spec or the
// cluster: image pull failures (of the sandbox's or the agent's image) and containers
// the kubelet or the container runtime could not create or start (a waiting
// configReasons reason, or a container terminated with a startFailedReasons reason:
// e.g. runc failing to make the working directory), of any container of the Pod (the
// sandbox's, a group's sidecars and init containers, the runner's gate, install and
// filler). nil while it may still start, also while the kubelet retries a transient
// cause (transientCreate). spec (nil: not known) names a group's containers as the
// spec does.
//
// A create failure of a workload container is the spec's (runtime.ErrInvalidSpec: the
// runner's StartError); one of the runner's own containers is the runner's (a plain
// error: BackendError, which counts against the runner's health). Which container
// decides, never the message: it quotes the spec's paths (a working_dir, a mount), so a
// caller could word its own failure as a node fault ("cgroup", "no space left on
// device") and make it count against the runner. This errs toward not charging the
// runner: a node fault that fails only a workload container is reported as the spec's
// (it often shows on the gate too, which the kubelet creates first, but the workload
// container's entrypoint is the gate binary from the bin emptyDir, and its own create
// can fail alone). The message names the container and quotes the
// kubelet's reason and the runtime's message (runtimeText).
//
// The transient markers are read in the message too, and a caller's path can hold one:
// that only keeps its own sandbox waiting until StartTimeout, as before this check.
//
// A Pod being deleted (DeletionTimestamp set: a Destroy or Stop during the Create, the
// runner's cleanup) has none: the kubelet cancels the starts of its containers, and a
// start cut short so is not the spec's StartError (the deletion reports the end).
func startError(p *corev1.Pod, spec *runtime.Spec) error {
	if p == nil || p.DeletionTimestamp != nil {
		return nil
	}
	// Every container of the Pod: the sandbox's and the agent's (gate, install), and a
	// group's sidecars and init containers.
	all := append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
	for i := range all {
		if err := containerStartError(&all[i], spec); err != nil {
			return err
		}
	}
	return nil
}

// containerFailure is startError's error: the start failure of one container, Pod its
// name in the Pod.
type containerFailure struct {
	Pod string
	err error
}

func (e *containerFailure) Error() string { return e.err.Error() }
func (e *containerFailure) Unwrap() error { return e.err }

// podContainerStartError is startError of Pod container name alone.
func podContainerStartError(p *corev1.Pod, name string, spec *runtime.Spec) error {
	if p == nil || p.DeletionTimestamp != nil {
		return nil
	}
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		if cs := podContainerStatus(list, name); cs != nil {
			return containerStartError(cs, spec)
		}
	}
	return nil
}

// containerStartError is startError of one container (a *containerFailure).
func containerStartError(cs *corev1.ContainerStatus, spec *runtime.Spec) error {
	if err := containerStartCause(cs, spec); err != nil {
		return &containerFailure{Pod: cs.Name, err: err}
	}
	return nil
}

func containerStartCause(cs *corev1.ContainerStatus, spec *runtime.Spec) error {
	var reason, msg string
	switch {
	case cs.State.Waiting != nil:
		w := cs.State.Waiting
		if pullReasons[w.Reason] {
			img := cs.Image
			if helperContainer(cs.Name) {
				img = "agent image " + img
			}
			// Classified by the whole message: clipped (for display only), a "not found"
			// or "401" past the bound would be lost.
			return fmt.Errorf("pull %s: %w: %s: %s", img, pullError(w.Reason, w.Message), w.Reason, runtimeText(w.Message))
		}
		if !configReasons[w.Reason] || transientCreate(w.Reason, w.Message) {
			return nil
		}
		reason, msg = w.Reason, runtimeText(w.Message)
	case cs.State.Terminated != nil && startFailedReasons[cs.State.Terminated.Reason]:
		t := cs.State.Terminated
		reason, msg = t.Reason, runtimeText(t.Message)
		if t.ExitCode != 0 {
			reason = fmt.Sprintf("%s (exit code %d)", t.Reason, t.ExitCode)
		}
	default:
		return nil
	}
	if helperContainer(cs.Name) {
		return fmt.Errorf("%s could not be created or started: %s: %s", containerLabel(cs.Name, spec), reason, msg)
	}
	return fmt.Errorf("%w: %s could not be created or started: %s: %s", runtime.ErrInvalidSpec, containerLabel(cs.Name, spec), reason, msg)
}

// containerLabel names Pod container podName for a message: the runner's own ones as
// such, a group's by their name in the spec, the primary by its spec name.
func containerLabel(podName string, spec *runtime.Spec) string {
	if helperContainer(podName) {
		return fmt.Sprintf("the runner's %s container", podName)
	}
	if spec != nil {
		if !spec.Multi() {
			if podName == containerMain {
				return fmt.Sprintf("container %q", spec.ContainerName())
			}
		} else {
			for _, m := range members(spec) {
				if m.pod == podName {
					return fmt.Sprintf("container %q", m.name)
				}
			}
		}
	}
	return fmt.Sprintf("container %q", podName)
}

// pullError maps the kubelet's image pull failure to the runtime's sentinels.
func pullError(reason, msg string) error {
	m := strings.ToLower(msg)
	switch {
	case reason == "InvalidImageName":
		return runtime.ErrInvalidImageRef
	case reason == "ErrImageNeverPull", strings.Contains(m, "not found"), strings.Contains(m, "manifest unknown"),
		strings.Contains(m, "name unknown"), strings.Contains(m, "does not exist"):
		return runtime.ErrImageNotFound
	case strings.Contains(m, "unauthorized"), strings.Contains(m, "authorization failed"), strings.Contains(m, "denied"),
		strings.Contains(m, "401"), strings.Contains(m, "403 forbidden"):
		return runtime.ErrImageUnauthorized
	}
	return runtime.ErrRegistry
}

// startErrorOfEnded is why a Pod ended before its main container started, nil when the
// main container did start.
func startErrorOfEnded(p *corev1.Pod) error {
	return fmt.Errorf("the Pod ended before the sandbox started: %s", podSummary(p))
}

// exitOf is how the sandbox ended: the agent's final status (the gate's termination
// message), else the main container's termination, else "Killed" (the Pod went away
// first). deleted: the Pod is gone. restartLimit is the primary container's: the
// status.json the gate copied lies in the sandbox's run dir, which its workload can
// write, so what it says is bounded as a sidecar's termination message is
// (boundedFinal). writer: the Pod is a GLOBAL writer's (commits), whose primary's
// own termination message is read too (agentStatus).
func exitOf(p *corev1.Pod, deleted bool, restartLimit int, writer bool) runtime.Exit {
	ex := runtime.Exit{At: time.Now().UTC()}
	// A Pod being deleted (Stop, Destroy) whose agent left no final status was killed at
	// the end of its grace period, before its main command ended: Killed, without an
	// exit code, as the local backend reports it (not the container's 137).
	deleted = deleted || p != nil && p.DeletionTimestamp != nil
	cs := containerStatus(p, containerMain)
	if st, t := agentStatus(p, writer); st != nil {
		if fin := boundedFinal(st, restartLimit, primaryView(cs, t)); fin != nil {
			ex.Restarts = int(fin.GetRestartCount())
			if fin.ExitCode != nil {
				c := fin.GetExitCode()
				ex.ExitCode = &c
			}
			ex.Reason, ex.Message = fin.GetReason(), fin.GetMessage()
			if fin.FinishedAt != nil {
				ex.At = fin.FinishedAt.AsTime()
			} else if t.FinishedAt.Unix() > 0 {
				ex.At = t.FinishedAt.UTC()
			}
			return ex.WithDefaultReason()
		}
	}
	switch {
	case cs != nil && cs.State.Terminated != nil:
		t := cs.State.Terminated
		c := t.ExitCode
		ex.ExitCode = &c
		// The reason is the kubelet's; the message is the container's termination log,
		// which the sandbox's workload writes.
		ex.Reason, ex.Message = t.Reason, sandboxText(t.Message)
		if t.Reason == "Completed" && c != 0 || t.Reason == "" {
			ex.Reason = ""
		}
		if !t.FinishedAt.IsZero() {
			ex.At = t.FinishedAt.UTC()
		}
		if t.Reason != "OOMKilled" && deleted {
			ex.Reason, ex.Message, ex.ExitCode = "Killed", "the sandbox's Pod was deleted before its main command ended", nil
		}
	case deleted:
		ex.Reason, ex.Message = "Killed", "the sandbox's Pod was deleted before its main command ended"
	default:
		ex.Reason, ex.Message = "Vanished", "the sandbox's Pod ended without a status: "+podSummary(p)
	}
	return ex.WithDefaultReason()
}

// agentStatus is the agent's status.json as the gate left it in its termination message,
// with the termination that holds it; nil when none holds one.
//
// A GLOBAL volume writer's Pod (globalvol.go) keeps its gate up after the primary's
// agent has ended: that agent leaves its status in the primary container's own
// termination message (gate.FlagTerminationLog), which is read (writer) when the
// gate's holds none; any other Pod's primary's is never read. Either is the sandbox's
// to write (status.json lies in its run dir), and either is bounded alike
// (boundedFinal).
func agentStatus(p *corev1.Pod, writer bool) (*agentv1.StatusResponse, *corev1.ContainerStateTerminated) {
	names := []string{containerGate}
	if writer {
		names = append(names, containerMain)
	}
	for _, name := range names {
		cs := containerStatus(p, name)
		if cs == nil {
			continue
		}
		for _, t := range []*corev1.ContainerStateTerminated{cs.State.Terminated, lastTerminated(cs)} {
			if st := statusInMessage(t); st != nil {
				return st, t
			}
		}
	}
	return nil, nil
}

// maxTerminationMessage bounds a termination message that is parsed as an agent's
// status: the agent writes a few hundred bytes, the gate copies at most 4 KiB and the
// kubelet keeps at most 4 KiB; a longer one is not parsed at all.
const maxTerminationMessage = 4096

// statusInMessage is the agent status a terminated container's message holds (the
// gate's copy of the primary's, or a sidecar's agent's own: --termination-log), or nil.
// The message is the sandbox's to write: see boundedFinal before using what it says.
func statusInMessage(t *corev1.ContainerStateTerminated) *agentv1.StatusResponse {
	if t == nil {
		return nil
	}
	return parseAgentStatus(t.Message)
}

// parseAgentStatus parses an agent's status (protojson) of at most maxTerminationMessage
// bytes; nil for anything else.
func parseAgentStatus(msg string) *agentv1.StatusResponse {
	if msg == "" || len(msg) > maxTerminationMessage {
		return nil
	}
	var st agentv1.StatusResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(msg), &st); err != nil {
		return nil
	}
	return &st
}

// sandboxText is text the sandbox could write, fit to report (agent.StatusText).
func sandboxText(s string) string { return agent.StatusText(s) }

// kubeletView is what the kubelet, not the sandbox, says of the container whose agent
// left a status: whether it was OOM-killed, and when it ran (zero: not known; the
// kubelet's times are whole seconds).
type kubeletView struct {
	oom               bool
	started, finished time.Time
}

// terminatedView is the kubelet's view of a terminated container.
func terminatedView(t *corev1.ContainerStateTerminated) kubeletView {
	if t == nil {
		return kubeletView{}
	}
	return kubeletView{oom: t.Reason == "OOMKilled", started: t.StartedAt.Time, finished: t.FinishedAt.Time}
}

// primaryView is the kubelet's view of the primary container (main) whose status the
// gate copied into its termination gateT: the main container's OOM kill and start, and
// the gate's end (the gate ends after the agent has).
func primaryView(main *corev1.ContainerStatus, gateT *corev1.ContainerStateTerminated) kubeletView {
	var k kubeletView
	if main != nil {
		switch {
		case main.State.Terminated != nil:
			k = terminatedView(main.State.Terminated)
		case main.State.Running != nil:
			k.started = main.State.Running.StartedAt.Time
		}
	}
	if gateT != nil && !gateT.FinishedAt.IsZero() {
		k.finished = gateT.FinishedAt.Time
	}
	return k
}

// boundedFinal is the final status an agent left in a terminated container's message
// (the gate's copy of the primary's status.json; a sidecar's agent's own,
// gate.FlagTerminationLog), made safe to report. The container's workload can write that
// file too, so it is the sandbox's own word about its own container, held to what an
// agent could say: a final state (else nil), a known reason (else Error), restarts within
// the container's limit, a bounded printable message, times within the container's run
// as the kubelet saw it (else none), and the kubelet's OOMKilled over it. It decides
// nothing the sandbox could not have caused itself. st is what the message says
// (statusInMessage), modified in place.
func boundedFinal(st *agentv1.StatusResponse, restartLimit int, k kubeletView) *agentv1.StatusResponse {
	// The kubelet's times are whole seconds (cut, not rounded).
	now := time.Now()
	to := k.finished.Add(time.Second)
	if k.finished.IsZero() || to.After(now) {
		to = now
	}
	if st = agent.BoundFinal(st, restartLimit, k.started, to); st != nil && k.oom {
		st.Reason, st.Message = "OOMKilled", "memory limit exceeded"
	}
	return st
}

// finalState reports whether an agent's main command has ended for good.
func finalState(st *agentv1.StatusResponse) bool { return agent.FinalState(st) }

func lastTerminated(cs *corev1.ContainerStatus) *corev1.ContainerStateTerminated {
	return cs.LastTerminationState.Terminated
}

// maxPodSummary bounds podSummary as a whole: each message in it is bounded
// (runtimeText), but a group's Pod has many containers and conditions.
const maxPodSummary = 4096

// podSummary is the Pod's phase, its false conditions and its containers' waiting and
// terminated states, for a message: at most maxPodSummary bytes of printable UTF-8.
func podSummary(p *corev1.Pod) string {
	if p == nil {
		return "no Pod status yet"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase %s", p.Status.Phase)
	for _, c := range p.Status.Conditions {
		if b.Len() > maxPodSummary {
			break
		}
		if c.Status != corev1.ConditionTrue && c.Reason != "" {
			fmt.Fprintf(&b, "; %s: %s %s", c.Type, runtimeText(c.Reason), runtimeText(c.Message))
		}
	}
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if b.Len() > maxPodSummary {
			break
		}
		switch {
		case cs.State.Waiting != nil && cs.State.Waiting.Reason != "":
			fmt.Fprintf(&b, "; %s waiting: %s %s", cs.Name, cs.State.Waiting.Reason, runtimeText(cs.State.Waiting.Message))
		case cs.State.Terminated != nil:
			fmt.Fprintf(&b, "; %s terminated: %s (exit %d)", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode)
		}
	}
	return runtimeTextN(b.String(), maxPodSummary)
}

// digestOf turns a container status' imageID (ref@sha256:…, or sha256:… of the config
// for some runtimes) into a digest.
func digestOf(imageID string) string {
	if i := strings.LastIndex(imageID, "@"); i >= 0 {
		return imageID[i+1:]
	}
	return imageID
}

func pullSecretName(id string) string { return "sbx-" + id + "-pull" }

// dockerConfigSecret is an image pull Secret for the registries of the spec's
// containers that have credentials (each container's for its own image; the first
// container's wins where two name the same registry); nil when none has any.
func dockerConfigSecret(spec *runtime.Spec) (*corev1.Secret, error) {
	auths := map[string]any{}
	for _, ct := range spec.AllContainers() {
		c := ct.PullCredentials
		if c == nil {
			continue
		}
		ref, err := name.ParseReference(ct.Image)
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %w", runtime.ErrInvalidImageRef, ct.Image, err)
		}
		reg := ref.Context().RegistryStr()
		if reg == name.DefaultRegistry {
			reg = "https://index.docker.io/v1/"
		}
		if _, ok := auths[reg]; ok {
			continue
		}
		auth := base64.StdEncoding.EncodeToString([]byte(c.Username + ":" + c.Password))
		auths[reg] = map[string]string{"username": c.Username, "password": c.Password, "auth": auth}
	}
	if len(auths) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(map[string]any{"auths": auths})
	if err != nil {
		return nil, err
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: pullSecretName(spec.ID)},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: b},
	}, nil
}

var registryGuard = image.NewGuard()

// RegistryImageConfig reads an image's config (entrypoint, cmd, env, working dir, user)
// from its registry: the manifest and the config blob, no layers.
func RegistryImageConfig(ctx context.Context, ref string, creds *runtime.Credentials) (image.Config, error) {
	return readImageConfig(ctx, ref, creds, "", false)
}

// PlatformImageConfig is RegistryImageConfig that also reads from the platform's registry
// at host (host[:port], "" none), unguarded (the operator named it; a reference to
// another organization's repository there is refused by the registry, as the token is
// the sandbox's organization's), over plain HTTP when plainHTTP.
func PlatformImageConfig(host string, plainHTTP bool) func(context.Context, string, *runtime.Credentials) (image.Config, error) {
	return func(ctx context.Context, ref string, creds *runtime.Credentials) (image.Config, error) {
		return readImageConfig(ctx, ref, creds, host, plainHTTP)
	}
}

func readImageConfig(ctx context.Context, ref string, creds *runtime.Credentials, platform string, plainHTTP bool) (image.Config, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return image.Config{}, fmt.Errorf("%w: %w", runtime.ErrInvalidImageRef, err)
	}
	tr := remote.DefaultTransport
	if platform != "" && r.Context().RegistryStr() == platform {
		if plainHTTP {
			if r, err = name.ParseReference(ref, name.Insecure); err != nil {
				return image.Config{}, fmt.Errorf("%w: %w", runtime.ErrInvalidImageRef, err)
			}
		}
	} else {
		// The runner's own network is no place for a sandbox's image reference to probe
		// (issue 15 §4): host-local registries are refused, by name and by address.
		if err := registryGuard.Check(r); err != nil {
			return image.Config{}, fmt.Errorf("%w: %w", runtime.ErrInvalidImageRef, err)
		}
		tr = registryGuard.Transport(remote.DefaultTransport)
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithTransport(tr)}
	if creds != nil {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: creds.Username, Password: creds.Password}))
	} else {
		opts = append(opts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	}
	img, err := remote.Image(r, opts...)
	if err != nil {
		return image.Config{}, registryError(ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return image.Config{}, registryError(ref, err)
	}
	c := cf.Config
	return image.Config{Entrypoint: c.Entrypoint, Cmd: c.Cmd, Env: c.Env, WorkingDir: c.WorkingDir, User: c.User}, nil
}

// registryError is what the caller learns of a failed read of ref's config: the image and
// a generic cause, never what answered on the network (that is logged here).
func registryError(ref string, err error) error {
	slog.Default().Warn("read image config", "image", ref, "err", err)
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%w: %s", runtime.ErrImageUnauthorized, ref)
		case http.StatusNotFound:
			return fmt.Errorf("%w: %s", runtime.ErrImageNotFound, ref)
		}
	}
	if errors.Is(err, image.ErrRegistryNotAllowed) {
		return fmt.Errorf("%w: %s: the registry is not allowed", runtime.ErrInvalidImageRef, ref)
	}
	return fmt.Errorf("%w: %s: could not read the image's config from its registry", runtime.ErrRegistry, ref)
}
