package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/nodeagent/hibernate"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Pause and resume of `gvisor` sandboxes (docs/api.md "On Kubernetes").
//
// Pause checkpoints the sandbox's gVisor Pod sandbox through the node agent of its node
// (NodeAgent.Checkpoint, leave_running=false: its processes end with the checkpoint),
// marks the sandbox's Secret paused (checkpoint ID, node, time, size) and takes the
// Pod's ownership off its Secrets and NetworkPolicy — both before the Pod is deleted, so
// the garbage collector keeps them — then deletes the Pod. The sandbox's record (spec,
// keys) stays in its Secret, its checkpoint on the node.
//
// Resume makes the Pod again as Create made it (buildPod), pinned to the checkpoint's
// node and with runtime.RestoreCheckpointAnnotation naming the checkpoint (added after
// the policy's annotations, which can never set it): the patched gVisor shim restores the
// Pod's containers from the image instead of starting them. The restored gate sends no
// hello: Resume waits for the Pod's IP and for the agent to answer.
//
// A runner restart keeps a paused sandbox paused: the mark records what the resumed Pod
// takes from the paused one (pausestate.go, checked on read: the Secret is writable by
// anyone with rights in the namespace); Recover takes each paused sandbox over
// (recoverPaused: Recovered.Paused, Released) and finishes a pause cut short between its
// mark and the Pod's deletion (finishInterruptedPauses), and a resume cut short after its
// Pod was made (recoverInterruptedPause). A record that cannot be used ends the sandbox
// with Reason CheckpointLost. The checkpoint ID and node read back are tied to the
// sandbox by the node agent's listing (ownCheckpoint: an image the agent took of this
// sandbox ID, of a Pod in this namespace), asked once per node at Recover
// (checkpointLists); an agent not reached leaves the sandbox paused and Resume asks it
// before it makes a Pod. An image named by a Secret is deleted only when the agent lists
// it as the sandbox's (deleteOwnCheckpoint).
//
// Not covered yet (refused with a reason): multi-container sandboxes, disk scratch
// volumes (host-backed emptyDirs are not in the checkpoint), registered volumes
// (claims, GLOBAL copies), a freeze (release=false) and fork.

// Paused marks on a paused sandbox's Secret.
const (
	labelPaused            = "sandboxd.io/paused"
	annotationPausedCkpt   = "sandboxd.io/paused-checkpoint"
	annotationPausedNode   = "sandboxd.io/paused-node"
	annotationPausedAt     = "sandboxd.io/paused-at"
	annotationPausedBytes  = "sandboxd.io/paused-bytes"
	pauseNoAgentWhy        = "pause on Kubernetes needs the gvisor runtime class and a node agent on the sandbox's node: this runner has no node agent configured"
	pauseNotGVisorWhyFmt   = "sandboxes of runtime class %q cannot be checkpointed on Kubernetes (a Pod cannot be frozen, and only gVisor Pods can be checkpointed): use the gvisor runtime class"
	pauseNoFreezeWhy       = "a Pod cannot be frozen on Kubernetes: pause gvisor sandboxes releasing their resources (a checkpoint)"
	pauseGoneWait          = 30 * time.Second
	checkpointDeleteBudget = 30 * time.Second
	// pauseFinishBudget bounds what a pause does after its checkpoint (mark, delete the Pod,
	// wait for it), whatever its caller's context.
	pauseFinishBudget = 90 * time.Second
	markPausedTries   = 4
)

// pauseState is a paused sandbox's checkpoint and what its Pod is made again with.
type pauseState struct {
	CheckpointID, Node string
	Bytes              int64
	At                 time.Time
	// pod: what the resumed Pod takes from the paused one (pausestate.go), also
	// recorded in the sandbox's Secret.
	pod pausedPod
	// untrusted: read back from the sandbox's Secret (a restarted runner's) and not yet
	// matched to its node agent's listing (ownCheckpoint): Resume matches it before
	// anything, and its checkpoint is deleted only through deleteOwnCheckpoint.
	untrusted bool
}

// pinnedImages returns, for each container of pod that pulls Always, the digest of the
// image its status says it runs (the repo@digest of its ImageID); why: one has none (not
// reported, or only a config digest), so it cannot be pinned.
func pinnedImages(pod *corev1.Pod) (pinned map[string]string, why string) {
	pinned = map[string]string{}
	for _, c := range pod.Spec.Containers {
		if c.ImagePullPolicy != corev1.PullAlways {
			continue
		}
		cs := podContainerStatus(pod.Status.ContainerStatuses, c.Name)
		id := ""
		if cs != nil {
			id = strings.TrimPrefix(cs.ImageID, "docker-pullable://")
		}
		i := strings.LastIndex(id, "@sha256:")
		if i <= 0 || !validImageDigest(id[i+1:]) {
			return nil, fmt.Sprintf("container %q: the digest of its image is not known (pulled with the sandbox's credentials, it could not be pulled again at resume): this sandbox cannot be paused on Kubernetes", c.Name)
		}
		pinned[c.Name] = id[i+1:]
	}
	return pinned, ""
}

// PauseSupport implements runtime.Pauser: a checkpoint (never a freeze) for the gvisor
// class on a runner with node agents.
func (b *Backend) PauseSupport(class string) runtime.PauseSupport {
	c, _, err := b.runtimeClass(class)
	switch {
	case err != nil:
		return runtime.PauseSupport{Why: err.Error()}
	case c != GVisorClass:
		return runtime.PauseSupport{Why: fmt.Sprintf(pauseNotGVisorWhyFmt, c)}
	case b.cfg.NodeAgents == nil:
		return runtime.PauseSupport{Why: pauseNoAgentWhy}
	}
	return runtime.PauseSupport{Checkpoint: true}
}

// pauseRefusal says why spec (its Pod: pod) cannot be paused on this backend yet ("": it
// can). A checkpoint holds the sentry's memory, the gVisor Pod-shared tmpfs volumes in it
// (addGVisorHints) and the Secret volumes the new Pod mounts again; any other volume (a
// host-backed emptyDir: disk scratch volumes, memory ones the kubelet mounts from the
// host; a claim) would come back empty or not at all.
func pauseRefusal(spec *runtime.Spec, pod *corev1.Pod) string {
	if spec.Multi() {
		return "multi-container sandboxes cannot be paused on Kubernetes yet"
	}
	if len(spec.Network.EgressSecrets()) > 0 {
		return "sandboxes with egress secrets cannot be paused on Kubernetes yet (their CA files are in a host-backed emptyDir, not in the checkpoint)"
	}
	for _, v := range spec.Volumes {
		switch {
		case v.Global != nil:
			return fmt.Sprintf("volume %q: sandboxes with a GLOBAL volume cannot be paused on Kubernetes yet", v.Name)
		case v.Managed != "" || v.Keep != "":
			return fmt.Sprintf("volume %q: sandboxes with registered volumes (claims) cannot be paused on Kubernetes yet", v.Name)
		default:
			return fmt.Sprintf("volume %q: sandboxes with scratch volumes cannot be paused on Kubernetes yet (a Pod's emptyDirs are not in its checkpoint)", v.Name)
		}
	}
	if pod == nil {
		return ""
	}
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.Secret != nil:
		case v.EmptyDir != nil && pod.Annotations[gvisorMountAnnotation+v.Name+".type"] == "tmpfs":
		default:
			return fmt.Sprintf("Pod volume %q is not in a checkpoint: this sandbox cannot be paused on Kubernetes yet", v.Name)
		}
	}
	return ""
}

// Pause implements runtime.Pauser (see the top of this file). release=false (a freeze)
// is not implemented.
func (b *Backend) Pause(ctx context.Context, id string, release bool) (runtime.PauseInfo, error) {
	if !release {
		return runtime.PauseInfo{}, fmt.Errorf("%w: %s", errdefs.ErrNotImplemented, pauseNoFreezeWhy)
	}
	s, err := b.get(id)
	if err != nil {
		return runtime.PauseInfo{}, err
	}
	if sup := b.PauseSupport(s.class); !sup.Checkpoint {
		return runtime.PauseInfo{}, fmt.Errorf("%w: %s", errdefs.ErrNotImplemented, sup.Why)
	}
	b.mu.Lock()
	why := pauseRefusal(&s.spec, s.pod)
	if why == "" && s.pod != nil {
		_, why = pausedPodOf(s, s.pod)
	}
	b.mu.Unlock()
	if why != "" {
		return runtime.PauseInfo{}, fmt.Errorf("%w: %s", errdefs.ErrNotImplemented, why)
	}
	b.waitCaptures(ctx, s)
	// The Create's adoption of the Secrets by the Pod first: a late one would give them
	// back to the Pod the pause deletes (and the garbage collector would take them).
	b.mu.Lock()
	adopted := s.adopted
	b.mu.Unlock()
	if adopted != nil {
		select {
		case <-adopted:
		case <-ctx.Done():
			return runtime.PauseInfo{}, fmt.Errorf("pause %s: %w", id, ctx.Err())
		}
	}
	t0 := time.Now()
	b.mu.Lock()
	select {
	case <-s.done:
		b.mu.Unlock()
		return runtime.PauseInfo{}, fmt.Errorf("pause %s: the sandbox has ended", id)
	default:
	}
	switch {
	case s.paused != nil:
		b.mu.Unlock()
		return runtime.PauseInfo{}, fmt.Errorf("%w: %s", runtime.ErrAlreadyPaused, id)
	case s.pausing:
		b.mu.Unlock()
		return runtime.PauseInfo{}, fmt.Errorf("pause %s: a pause is under way", id)
	}
	pod := s.pod
	if pod == nil || s.uid == "" || pod.UID != s.uid || pod.Spec.NodeName == "" || pod.DeletionTimestamp != nil || s.deleted || s.stopping {
		b.mu.Unlock()
		return runtime.PauseInfo{}, fmt.Errorf("pause %s: its Pod is not running", id)
	}
	// What the resumed Pod takes from this one, as it runs.
	pp, why := pausedPodOf(s, pod)
	if _, err := marshalPausedPod(&pp); why == "" && err != nil {
		why = err.Error() // its mark could not be written after the checkpoint
	}
	if why != "" {
		b.mu.Unlock()
		return runtime.PauseInfo{}, fmt.Errorf("%w: %s", errdefs.ErrNotImplemented, why)
	}
	s.pausing = true
	dropSpareLocked(s)
	// Its address leaves the egress registry now: its processes end with the checkpoint,
	// and the IP may go to another Pod once this one is deleted.
	s.egressOff = true
	b.egressForgetLocked(s)
	b.mu.Unlock()
	// Pausing ends (on failure) by evaluating the Pod again: an ended Pod ends the sandbox,
	// one still running is registered again.
	fail := func(err error) (runtime.PauseInfo, error) {
		b.mu.Lock()
		s.pausing = false
		if s.uid == pod.UID && !s.deleted {
			s.egressOff = false
		}
		b.evaluateLocked(s)
		b.mu.Unlock()
		return runtime.PauseInfo{}, fmt.Errorf("pause %s: %w", id, err)
	}

	agent, err := b.cfg.NodeAgents.Agent(ctx, pod.Spec.NodeName)
	if err != nil {
		return fail(fmt.Errorf("node agent of %s: %w", pod.Spec.NodeName, err))
	}
	cp, err := agent.Checkpoint(ctx, NodeCheckpointRequest{
		Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), SandboxID: id, LeaveRunning: false,
	})
	if err != nil {
		switch cp.SandboxRunning {
		case RunningNo:
			b.log.Warn("pause: the checkpoint failed and ended the sandbox", "sandbox", id, "err", err)
		case RunningUnknown:
			b.log.Warn("pause: the checkpoint failed and may have ended the sandbox (the node agent could not tell)", "sandbox", id, "err", err)
		}
		return fail(fmt.Errorf("checkpoint: %w", err))
	}
	if cp.Node == "" {
		cp.Node = pod.Spec.NodeName
	}
	// The agent's answer names what the restore annotation and the paused marks carry:
	// an ID the shim takes, on the Pod's node (the image is there and nowhere else).
	if verr := hibernate.ValidCheckpointID(cp.ID); verr != nil || cp.Node != pod.Spec.NodeName {
		if verr == nil {
			verr = fmt.Errorf("the node agent of %s answered a checkpoint on node %q", pod.Spec.NodeName, cp.Node)
		}
		b.closeAgentConns(s)
		if hibernate.ValidCheckpointID(cp.ID) == nil {
			b.deleteCheckpoint(id, pod.Spec.NodeName, cp.ID)
		}
		return fail(fmt.Errorf("checkpoint: %w", verr))
	}
	// Its processes have ended: the agent connections given out end too (their peer
	// went with the sentry and never resets them; a Watch would wait forever).
	b.closeAgentConns(s)
	// A Stop or Destroy that came while the checkpoint ran: the sandbox ends, its
	// image is not kept.
	b.mu.Lock()
	stopping := s.stopping || s.deleted
	b.mu.Unlock()
	if stopping {
		b.deleteCheckpoint(id, cp.Node, cp.ID)
		return fail(errors.New("the sandbox was stopped while it was checkpointed"))
	}
	// The record first (a runner that stops now finds the mark), then the ownership off,
	// then the Pod goes. The sandbox's processes are gone: a caller going away now must not
	// lose the image, so the rest runs on its own budget.
	pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), pauseFinishBudget)
	defer pcancel()
	ps := &pauseState{CheckpointID: cp.ID, Node: cp.Node, Bytes: cp.Bytes, At: time.Now().UTC(), pod: pp}
	if err := b.markPausedRetry(pctx, id, ps); err != nil {
		// Its processes ended with the checkpoint: the sandbox ends with its Pod.
		b.deleteCheckpoint(id, cp.Node, cp.ID)
		return fail(fmt.Errorf("mark the sandbox paused: %w", err))
	}
	if err := b.deletePod(pctx, s, 0); err != nil {
		b.log.Warn("pause: delete the checkpointed Pod", "sandbox", id, "err", err)
	}
	if err := b.waitPodGone(pctx, id, pod.UID, pauseGoneWait); err != nil {
		b.log.Warn("pause: the checkpointed Pod is still there", "sandbox", id, "err", err)
	}
	b.mu.Lock()
	s.paused, s.pausing = ps, false
	s.pod, s.uid, s.deleted, s.helloIP = nil, "", false, ""
	b.evaluateLocked(s) // wakes waiters
	b.mu.Unlock()
	return runtime.PauseInfo{Released: true, Took: time.Since(t0), CheckpointBytes: cp.Bytes}, nil
}

// trackedConn is a connection DialAgent gave out, forgotten when closed.
type trackedConn struct {
	net.Conn
	once   sync.Once
	forget func(*trackedConn)
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.forget(c) })
	return c.Conn.Close()
}

// CloseWrite half-closes the connection where it can (splice.go uses it).
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// trackConn records c as s's until it is closed (closeAgentConns).
// A sandbox pausing or paused gets none: c is closed, ErrPaused.
func (b *Backend) trackConn(s *sandbox, c net.Conn) (net.Conn, error) {
	tc := &trackedConn{Conn: c, forget: func(tc *trackedConn) {
		b.mu.Lock()
		delete(s.agentConns, tc)
		b.mu.Unlock()
	}}
	b.mu.Lock()
	if s.pausing || s.paused != nil {
		// A pause began while this connection was dialed: closeAgentConns may have run.
		b.mu.Unlock()
		_ = c.Close()
		return nil, fmt.Errorf("dial agent of %s: %w", s.id, runtime.ErrPaused)
	}
	if s.agentConns == nil {
		s.agentConns = map[*trackedConn]struct{}{}
	}
	s.agentConns[tc] = struct{}{}
	b.mu.Unlock()
	return tc, nil
}

// closeAgentConns closes every connection DialAgent gave out for s.
func (b *Backend) closeAgentConns(s *sandbox) {
	b.mu.Lock()
	conns := make([]*trackedConn, 0, len(s.agentConns))
	for c := range s.agentConns {
		conns = append(conns, c)
	}
	b.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// markPaused writes the paused marks on the sandbox's Secret and takes the Pod's
// ownership off it, its pull Secret and its NetworkPolicy (the garbage collector would
// delete them with the Pod).
func (b *Backend) markPaused(ctx context.Context, id string, ps *pauseState) error {
	pp, err := marshalPausedPod(&ps.pod)
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"ownerReferences": nil,
		"labels":          map[string]string{labelPaused: "true"},
		"annotations": map[string]string{
			annotationPausedCkpt:  ps.CheckpointID,
			annotationPausedNode:  ps.Node,
			annotationPausedAt:    ps.At.Format(time.RFC3339Nano),
			annotationPausedBytes: strconv.FormatInt(ps.Bytes, 10),
			annotationPausedPod:   pp,
		},
	}})
	if err != nil {
		return err
	}
	if _, err := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace).Patch(ctx, secretName(id), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return err
	}
	return b.disownPaused(ctx, id)
}

// disownPatch takes every owner off an object (a merge patch).
var disownPatch = []byte(`{"metadata":{"ownerReferences":null}}`)

// disownPaused takes the Pod's ownership off the sandbox's pull Secret and NetworkPolicy.
func (b *Backend) disownPaused(ctx context.Context, id string) error {
	secrets := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace)
	if _, err := secrets.Patch(ctx, pullSecretName(id), types.MergePatchType, disownPatch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("pull secret: %w", err)
	}
	_, err := b.cfg.Client.NetworkingV1().NetworkPolicies(b.cfg.Namespace).Patch(ctx, networkPolicyName(id), types.MergePatchType, disownPatch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("network policy: %w", err)
	}
	return nil
}

// markPausedRetry is markPaused, tried markPausedTries times (a checkpoint whose mark
// is not written is deleted: worth a few tries).
func (b *Backend) markPausedRetry(ctx context.Context, id string, ps *pauseState) error {
	var err error
	for i := range markPausedTries {
		if i > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w (after %w)", ctx.Err(), err)
			case <-time.After(time.Duration(i) * 250 * time.Millisecond):
			}
		}
		if err = b.markPaused(ctx, id, ps); err == nil {
			return nil
		}
		b.log.Warn("pause: mark the sandbox paused", "sandbox", id, "try", i+1, "err", err)
	}
	return err
}

// unmarkPaused removes the paused marks from the sandbox's Secret.
func (b *Backend) unmarkPaused(ctx context.Context, id string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels": map[string]any{labelPaused: nil},
		"annotations": map[string]any{
			annotationPausedCkpt: nil, annotationPausedNode: nil, annotationPausedAt: nil, annotationPausedBytes: nil, annotationPausedPod: nil,
		},
	}})
	if err != nil {
		return err
	}
	_, err = b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace).Patch(ctx, secretName(id), types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// waitPodGone waits, at most d, until the Pod of sandbox id (of uid, when set) is gone.
func (b *Backend) waitPodGone(ctx context.Context, id string, uid types.UID, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		p, err := b.cfg.Client.CoreV1().Pods(b.cfg.Namespace).Get(ctx, podName(id), metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && uid != "" && p.UID != uid {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("still there")
			}
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Resume implements runtime.Pauser (see the top of this file).
func (b *Backend) Resume(ctx context.Context, id string) (runtime.Info, error) {
	s, err := b.get(id)
	if err != nil {
		return runtime.Info{}, err
	}
	b.mu.Lock()
	ps := s.paused
	b.mu.Unlock()
	if ps == nil {
		return runtime.Info{}, fmt.Errorf("%w: %s", runtime.ErrNotPaused, id)
	}
	pod, err := b.resumePod(s, ps)
	if errors.Is(err, errPauseRecord) {
		return runtime.Info{}, fmt.Errorf("resume %s: %w: %w", id, runtime.ErrCheckpointLost, err)
	}
	if err != nil {
		return runtime.Info{}, fmt.Errorf("resume %s: %w", id, err)
	}
	// The checkpoint's node must still be there (its agent): a node that is gone has taken
	// the image with it.
	if b.cfg.NodeAgents == nil {
		return runtime.Info{}, fmt.Errorf("resume %s: %w: %s", id, errdefs.ErrNotImplemented, pauseNoAgentWhy)
	}
	agent, err := b.cfg.NodeAgents.Agent(ctx, ps.Node)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) || apierrors.IsNotFound(err) {
			return runtime.Info{}, fmt.Errorf("resume %s: node %s: %w: %w", id, ps.Node, runtime.ErrCheckpointLost, err)
		}
		return runtime.Info{}, fmt.Errorf("resume %s: node agent of %s: %w", id, ps.Node, err)
	}
	// The checkpoint must be one the agent took of this sandbox (its ID may have been read
	// back from a Secret anyone with rights in the namespace can write: another
	// sandbox's).
	entries, err := agent.ListCheckpoints(ctx)
	if err != nil {
		return runtime.Info{}, fmt.Errorf("resume %s: node agent of %s: %w", id, ps.Node, err)
	}
	if err := b.ownCheckpoint(entries, id, ps.CheckpointID, ""); err != nil {
		b.mu.Lock()
		ps.untrusted = true // not deleted but through deleteOwnCheckpoint
		b.mu.Unlock()
		return runtime.Info{}, fmt.Errorf("resume %s: %w: %w", id, runtime.ErrCheckpointLost, err)
	}
	b.mu.Lock()
	ps.untrusted = false
	b.mu.Unlock()
	t0 := time.Now()
	created, err := b.cfg.Client.CoreV1().Pods(b.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return runtime.Info{}, fmt.Errorf("resume %s: pod: %w", id, err)
	}
	tCreated := time.Since(t0)
	b.mu.Lock()
	s.uid, s.deleted, s.egressOff, s.stopping, s.helloIP = created.UID, false, false, false, ""
	if s.pod == nil || s.pod.UID != created.UID {
		s.pod = created
	}
	// Its events before this one were not taken for its (observe): what is known now.
	b.evaluateLocked(s)
	b.mu.Unlock()
	ipAt, err := b.waitRestored(ctx, s)
	if err == nil {
		// As Create: its host-name egress rules hold once its new address is registered.
		err = b.waitEgress(ctx, s)
	}
	if err != nil {
		// The new Pod goes; the sandbox stays paused (its checkpoint is kept) unless the
		// checkpoint itself is what failed.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseGoneWait)
		if derr := b.deletePod(dctx, s, 1); derr != nil {
			b.log.Warn("resume: delete the failed Pod", "sandbox", id, "err", derr)
		}
		_ = b.waitPodGone(dctx, id, created.UID, pauseGoneWait)
		cancel()
		b.mu.Lock()
		s.pod, s.uid, s.deleted = nil, "", false
		b.mu.Unlock()
		if checkpointLost(err) {
			return runtime.Info{}, fmt.Errorf("resume %s: %w: %w", id, runtime.ErrCheckpointLost, err)
		}
		return runtime.Info{}, fmt.Errorf("resume %s: %w", id, err)
	}
	b.log.Info("sandbox restored from its checkpoint", "sandbox", id, "node", ps.Node, "checkpoint", ps.CheckpointID,
		"pod_created", tCreated.Round(time.Millisecond), "pod_ip", ipAt.Sub(t0).Round(time.Millisecond), "agent_answered", time.Since(t0).Round(time.Millisecond))
	// The new Pod owns the Secrets and NetworkPolicy again, and the marks go, before the
	// sandbox is resumed (a Pause can start only then: no late patch re-owns them after
	// it), on their own budget (the sandbox runs: a caller going away must not leave it
	// half-resumed).
	actx, acancel := context.WithTimeout(context.WithoutCancel(ctx), pauseFinishBudget)
	b.adoptSecrets(actx, created, pullSecretName(id), true)
	if err := b.unmarkPaused(actx, id); err != nil {
		b.log.Warn("resume: remove the paused marks", "sandbox", id, "err", err)
	}
	acancel()
	b.mu.Lock()
	s.paused, s.adopted = nil, nil
	b.evaluateLocked(s)
	b.mu.Unlock()
	// The image has been read by the restore: it goes.
	go b.deleteCheckpoint(id, ps.Node, ps.CheckpointID)
	return b.info(s), nil
}

// resumePod is the Pod that resumes paused sandbox s: the one Create made (buildPod),
// with what ps recorded of the paused one (checkPausedPod checks it first), pinned to the
// checkpoint's node and naming the checkpoint.
func (b *Backend) resumePod(s *sandbox, ps *pauseState) (*corev1.Pod, error) {
	class, rcName, err := b.runtimeClass(s.class)
	if err != nil {
		return nil, err
	}
	build := func(sc *corev1.SecurityContext) *corev1.Pod {
		return b.buildPod(s, &s.spec, podParts{class: class, rcName: rcName, labels: b.labels(&s.spec),
			pullSecrets: ps.pod.PullSecrets, sc: sc.DeepCopy(), node: ps.Node})
	}
	pod := build(ps.pod.SecurityContext)
	sc, err := b.checkPausedPod(s, &ps.pod, pod, build)
	if err != nil {
		return nil, err
	}
	if sc != ps.pod.SecurityContext {
		pod = build(sc)
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if p, ok := ps.pod.PullPolicy[c.Name]; ok {
			c.ImagePullPolicy = p
		}
		if d, ok := ps.pod.Pinned[c.Name]; ok {
			img, err := pinnedRef(c.Image, d)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", errPauseRecord, err) // checked by checkPausedPod
			}
			c.Image, c.ImagePullPolicy = img, corev1.PullIfNotPresent
		}
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	// After buildPod's applyPodSettings: a policy never names a checkpoint.
	pod.Annotations[runtime.RestoreCheckpointAnnotation] = ps.CheckpointID
	if ps.pod.WarmClaimed != "" {
		pod.Annotations[annotationWarmClaimed] = ps.pod.WarmClaimed // its start (infoOf)
	}
	return pod, nil
}

// waitRestored waits until the restored Pod has an IP and its agent answers, or the Pod
// fails to start (the shim's reason in its events), at most StartTimeout.
func (b *Backend) waitRestored(ctx context.Context, s *sandbox) (ipAt time.Time, _ error) {
	timer := time.NewTimer(b.cfg.StartTimeout)
	defer timer.Stop()
	var (
		pinged   chan error
		stopPing = func() {}
	)
	defer func() { stopPing() }()
	for {
		b.mu.Lock()
		pod, ch := s.pod, s.changed
		b.mu.Unlock()
		if err := startError(pod, &s.spec); err != nil {
			return ipAt, b.withEvents(ctx, pod, err)
		}
		if podEnded(pod) || pod != nil && pod.DeletionTimestamp != nil {
			return ipAt, b.withEvents(ctx, pod, fmt.Errorf("the restored Pod ended: %s", podSummary(pod)))
		}
		if ip := pod.Status.PodIP; ip != "" && pinged == nil {
			ipAt = time.Now()
			pinged, stopPing = b.startPing(ctx, s, ip)
		}
		select {
		case <-ch:
		case err := <-pinged:
			return ipAt, err
		case <-timer.C:
			return ipAt, b.withEvents(ctx, pod, fmt.Errorf("the restored Pod did not answer within %s: %s", b.cfg.StartTimeout, podSummary(pod)))
		case <-ctx.Done():
			return ipAt, ctx.Err()
		}
	}
}

// podEventsError is an error with the Pod's warning events (their messages: the
// kubelet's, carrying the shim's reasons).
type podEventsError struct {
	err    error
	events []string
}

func (e *podEventsError) Error() string {
	return fmt.Sprintf("%v (events: %s)", e.err, strings.Join(e.events, "; "))
}

func (e *podEventsError) Unwrap() error { return e.err }

// withEvents adds the Pod's warning events (the shim's reasons) to err.
func (b *Backend) withEvents(ctx context.Context, pod *corev1.Pod, err error) error {
	if pod == nil {
		return err
	}
	evs, lerr := b.cfg.Client.CoreV1().Events(b.cfg.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(pod.UID)})
	if lerr != nil {
		return err
	}
	var msgs []string
	for _, e := range evs.Items {
		if e.Type == corev1.EventTypeWarning && e.InvolvedObject.UID == pod.UID {
			msgs = append(msgs, e.Reason+": "+e.Message)
		}
	}
	if len(msgs) == 0 {
		return err
	}
	return &podEventsError{err: err, events: msgs}
}

// shimImageLost says whether the patched shim's reason in an event message
// (scripts/runsc-shim/zz_sandboxd_restore.go.in) is a refusal of the image itself, which
// no later restore gets past: incomplete (no marker), no such checkpoint, an invalid
// checkpoint ID, an image dir or marker of the wrong kind or owner. A runsc restore that
// failed otherwise (or a bad checkpoint root) is not: the sandbox stays paused.
func shimImageLost(msg string) bool {
	i := strings.Index(msg, "sandboxd restore: ")
	if i < 0 {
		return false
	}
	m := msg[i:]
	switch {
	case strings.Contains(m, "invalid checkpoint id"):
		return true
	case strings.HasPrefix(m, "sandboxd restore: checkpoint "):
		return strings.Contains(m, "incomplete image") || strings.Contains(m, "no such checkpoint")
	case strings.Contains(m, "owned by root and writable only by it") && !strings.Contains(m, "checkpoint root's parent") && !strings.Contains(m, "a parent of the checkpoint root"):
		return true
	}
	return false
}

// checkpointLost: a restore failed for the image's sake — one of the shim's refusals of
// the image in the restored Pod's events (never the Pod's own output: a sandbox writes
// its termination message). (Resume checks the node's agent before: not found, lost.)
func checkpointLost(err error) bool {
	var pe *podEventsError
	if !errors.As(err, &pe) {
		return false
	}
	for _, m := range pe.events {
		if shimImageLost(m) {
			return true
		}
	}
	return false
}

// stopPaused ends a paused sandbox (Stop, Destroy): its checkpoint is deleted and Wait
// returns Reason "Stopped". False: s is not paused.
func (b *Backend) stopPaused(ctx context.Context, s *sandbox) bool {
	b.mu.Lock()
	ps := s.paused
	if ps == nil {
		b.mu.Unlock()
		return false
	}
	s.paused = nil
	select {
	case <-s.done:
	default:
		s.exit = runtime.Exit{Reason: "Stopped", Message: "the sandbox was stopped while paused", At: time.Now().UTC()}
		close(s.done)
	}
	close(s.changed)
	s.changed = make(chan struct{})
	untrusted := ps.untrusted
	b.mu.Unlock()
	if untrusted {
		b.deleteOwnCheckpoint(ctx, b.newCheckpointLists(), s.id, ps.Node, ps.CheckpointID)
	} else {
		b.deleteCheckpoint(s.id, ps.Node, ps.CheckpointID)
	}
	return true
}

// recoverPaused takes over, at a runner's start, the paused sandboxes an earlier run
// left: a Secret of this runner marked paused whose sandbox has no Pod (withPod). Each is
// reported paused (checkpointed) and resumes as it would have before the restart, from
// what its Secret records (readPauseState). One whose record cannot be used ends: its
// checkpoint is deleted through the node agent (when this runner has one), its Secrets
// and NetworkPolicy with Destroy, and it is reported ended with Reason CheckpointLost.
func (b *Backend) recoverPaused(ctx context.Context, lists checkpointLists, withPod map[string]bool) ([]runtime.Recovered, error) {
	sel := b.selector.String() + "," + labelPaused + "=true"
	list, err := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: list paused sandboxes' secrets: %w", err)
	}
	var out []runtime.Recovered
	for i := range list.Items {
		sec := &list.Items[i]
		id := sec.Labels[LabelSandbox]
		if !validID(id) || sec.Name != secretName(id) || withPod[id] {
			continue
		}
		b.mu.Lock()
		known := b.sandboxes[id] != nil
		b.mu.Unlock()
		if known {
			continue
		}
		s, err := sandboxFromSecret(id, sec)
		var ps *pauseState
		if err == nil {
			b.recoverHelloKey(s, sec)
			ps, err = b.readPauseState(s, sec)
		}
		if err == nil {
			err = b.verifyRecovered(ctx, lists, id, ps)
		}
		if err == nil {
			s.paused = ps
			b.mu.Lock()
			taken := b.sandboxes[id] == nil
			if taken {
				b.sandboxes[id] = s
			}
			b.mu.Unlock()
			if taken {
				b.log.Info("recover: a paused sandbox taken over", "sandbox", id, "node", ps.Node, "checkpoint", ps.CheckpointID)
				out = append(out, runtime.Recovered{Spec: s.spec, Paused: true, Released: true, Info: runtime.Info{
					ID: id, RuntimeClass: s.class, ImageDigest: ps.pod.ImageDigest, StartedAt: ps.pod.StartedAt,
				}})
			}
			continue
		}
		b.deleteOwnCheckpoint(ctx, lists, id, sec.Annotations[annotationPausedNode], sec.Annotations[annotationPausedCkpt])
		if derr := b.Destroy(ctx, id); derr != nil {
			b.log.Warn("recover: destroy a paused sandbox", "sandbox", id, "err", derr)
		}
		if s == nil {
			b.log.Warn("recover: a paused sandbox's unreadable secret: deleted", "sandbox", id, "err", err)
			continue
		}
		b.log.Warn("recover: a paused sandbox ended: its record cannot be resumed from (its checkpoint deleted if its node agent says it is the sandbox's)", "sandbox", id, "err", err)
		ex := runtime.Exit{Reason: "CheckpointLost", At: time.Now().UTC(),
			Message: runtime.ErrCheckpointLost.Error() + ": the runner restarted while the sandbox was paused, and " + err.Error()}
		out = append(out, runtime.Recovered{Spec: s.spec, Info: runtime.Info{ID: id, RuntimeClass: s.class}, Exit: &ex})
	}
	return out, nil
}

// pauseInterrupted: pod is the Pod a pause checkpointed and marked its Secret sec for,
// not deleted yet (a runner stopped between the mark and the deletion): not a Pod a
// resume made from the marked checkpoint, on the marked node.
func pauseInterrupted(sec *corev1.Secret, pod *corev1.Pod) bool {
	cid := sec.Annotations[annotationPausedCkpt]
	return sec.Labels[labelPaused] == "true" && cid != "" && pod.Annotations[runtime.RestoreCheckpointAnnotation] != cid &&
		pod.Spec.NodeName != "" && pod.Spec.NodeName == sec.Annotations[annotationPausedNode]
}

// finishInterruptedPauses finishes the pauses cut short after their mark among pods
// (pauseInterrupted): each such sandbox no longer has a Pod (withPod), and is taken over
// paused by recoverPaused. It returns those sandboxes (their Pods are not recovered).
func (b *Backend) finishInterruptedPauses(ctx context.Context, lists checkpointLists, pods []corev1.Pod, withPod map[string]bool) (map[string]bool, error) {
	list, err := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: b.selector.String() + "," + labelPaused + "=true"})
	if err != nil {
		return nil, fmt.Errorf("kubernetes backend: list paused sandboxes' secrets: %w", err)
	}
	marked := map[string]*corev1.Secret{}
	for i := range list.Items {
		if id := list.Items[i].Labels[LabelSandbox]; validID(id) && list.Items[i].Name == secretName(id) {
			marked[id] = &list.Items[i]
		}
	}
	done := map[string]bool{}
	for i := range pods {
		pod := &pods[i]
		id := pod.Labels[LabelSandbox]
		sec := marked[id]
		if sec == nil || done[id] || !pauseInterrupted(sec, pod) {
			continue
		}
		b.mu.Lock()
		known := b.sandboxes[id] != nil
		b.mu.Unlock()
		if !known && b.finishInterruptedPause(ctx, lists, id, sec, pod) {
			done[id], withPod[id] = true, false
		}
	}
	return done, nil
}

// finishInterruptedPause finishes, at a runner's start, a pause cut short after its mark
// (pauseInterrupted): the Pod's ownership off the sandbox's pull Secret and NetworkPolicy
// again (the mark's patches may not all have been made), then the Pod goes. Only when
// the node agent lists the marked checkpoint as one taken of this sandbox's Pod (its
// UID): the mark is read back from a Secret, and a forged one must not end a running
// Pod. False: not so, or the agent could not be reached, or the ownership could not be
// taken off, or the Pod could not be deleted (the Pod is left: it is recovered as it is,
// and recoverInterruptedPause takes the marks off).
func (b *Backend) finishInterruptedPause(ctx context.Context, lists checkpointLists, id string, sec *corev1.Secret, pod *corev1.Pod) bool {
	entries, err := lists.get(ctx, pod.Spec.NodeName)
	if err == nil {
		err = b.ownCheckpoint(entries, id, sec.Annotations[annotationPausedCkpt], pod.UID)
	}
	if err != nil {
		b.log.Warn("recover: a pause cut short is not finished: its checkpoint is not known to be the Pod's", "sandbox", id, "err", err)
		return false
	}
	_, err = b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace).Patch(ctx, secretName(id), types.MergePatchType, disownPatch, metav1.PatchOptions{})
	if err == nil {
		err = b.disownPaused(ctx, id)
	}
	if err != nil {
		b.log.Warn("recover: a pause cut short: take the Pod's ownership off", "sandbox", id, "err", err)
		return false
	}
	uid := pod.UID
	err = b.cfg.Client.CoreV1().Pods(b.cfg.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr(int64(0)), Preconditions: &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		b.log.Warn("recover: a pause cut short: delete the checkpointed Pod", "sandbox", id, "err", err)
		return false
	}
	if err := b.waitPodGone(ctx, id, uid, pauseGoneWait); err != nil {
		// A resume would meet it (AlreadyExists): the Pod is recovered as it is.
		b.log.Warn("recover: a pause cut short: the checkpointed Pod is still there", "sandbox", id, "err", err)
		return false
	}
	b.log.Info("recover: a pause cut short after its checkpoint finished", "sandbox", id, "node", pod.Spec.NodeName)
	return true
}

// recoverInterruptedPause finishes, at a runner's start, what a resume cut short left
// (a Pod of the sandbox and its Secret still marked paused): the marks go, the Pod owns
// the Secrets and NetworkPolicy again, and the image is deleted (a restored Pod has read
// it; a paused Pod finishInterruptedPause could not delete has ended, and the sandbox
// with it).
func (b *Backend) recoverInterruptedPause(ctx context.Context, lists checkpointLists, id string, sec *corev1.Secret, pod *corev1.Pod) {
	b.adoptSecrets(ctx, pod, pullSecretName(id), true)
	if err := b.unmarkPaused(ctx, id); err != nil {
		b.log.Warn("recover: remove the paused marks", "sandbox", id, "err", err)
	}
	b.deleteOwnCheckpoint(ctx, lists, id, sec.Annotations[annotationPausedNode], sec.Annotations[annotationPausedCkpt])
}

// checkpointListBudget bounds the node agents' listings one Recover (or one stop of a
// paused sandbox taken over) waits for, however many nodes it asks.
const checkpointListBudget = 30 * time.Second

// checkpointLists are the node agents' listings of this runner's checkpoints, each node
// asked once (Recover asks every node its paused sandboxes name), within one
// checkpointListBudget: a node not answered by then counts as not reached.
type checkpointLists struct {
	b        *Backend
	deadline time.Time
	nodes    map[string]checkpointList
}

type checkpointList struct {
	entries []NodeCheckpointEntry
	err     error
}

func (b *Backend) newCheckpointLists() checkpointLists {
	return checkpointLists{b: b, deadline: time.Now().Add(checkpointListBudget), nodes: map[string]checkpointList{}}
}

// get is node's listing (asked once); an error: the agent was not reached (or there is
// none).
func (l checkpointLists) get(ctx context.Context, node string) ([]NodeCheckpointEntry, error) {
	if r, ok := l.nodes[node]; ok {
		return r.entries, r.err
	}
	var r checkpointList
	switch {
	case l.b.cfg.NodeAgents == nil:
		r.err = errors.New(pauseNoAgentWhy)
	case len(validation.IsDNS1123Subdomain(node)) > 0:
		r.err = fmt.Errorf("node %q is not a node name", node)
	case !time.Now().Before(l.deadline):
		r.err = fmt.Errorf("the node agents' listings took more than %s", checkpointListBudget)
	default:
		lctx, cancel := context.WithDeadline(ctx, l.deadline)
		agent, err := l.b.cfg.NodeAgents.Agent(lctx, node)
		if err == nil {
			r.entries, err = agent.ListCheckpoints(lctx)
		}
		cancel()
		r.err = err
	}
	l.nodes[node] = r
	return r.entries, r.err
}

// ownCheckpoint says why entries (a node agent's listing) do not show checkpoint cid as
// a pause's image of sandbox id, taken of a Pod in this runner's namespace (and of the
// Pod uid, unless empty); nil: they do. Its errors wrap errPauseRecord (the ID is read
// back from the sandbox's Secret).
func (b *Backend) ownCheckpoint(entries []NodeCheckpointEntry, id, cid string, uid types.UID) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: %s %q: %s", errPauseRecord, annotationPausedCkpt, cid, why)
	}
	for _, e := range entries {
		if e.ID != cid {
			continue
		}
		switch {
		case e.SandboxID != id:
			return bad("the node agent took it of another sandbox")
		case e.Namespace != b.cfg.Namespace:
			return bad("the node agent took it of a Pod in another namespace")
		case e.LeaveRunning:
			return bad("a fork's image, not a pause's")
		case uid != "" && e.UID != string(uid):
			return bad("the node agent took it of another Pod")
		}
		return nil
	}
	return bad("its node agent has no such complete image")
}

// verifyRecovered matches the checkpoint of paused sandbox id, read back from its Secret
// (ps), to its node agent's listing: an error (errPauseRecord) when the agent does not
// list it as this sandbox's. An agent not reached leaves ps untrusted: Resume matches it
// before it makes a Pod, and it is deleted only through deleteOwnCheckpoint.
func (b *Backend) verifyRecovered(ctx context.Context, lists checkpointLists, id string, ps *pauseState) error {
	entries, err := lists.get(ctx, ps.Node)
	if err != nil {
		b.log.Warn("recover: a paused sandbox's node agent not reached: kept paused, its checkpoint checked at its resume", "sandbox", id, "node", ps.Node, "err", err)
		return nil
	}
	if err := b.ownCheckpoint(entries, id, ps.CheckpointID, ""); err != nil {
		return err
	}
	ps.untrusted = false
	return nil
}

// deleteOwnCheckpoint deletes checkpoint cid on node, read back from sandbox id's
// Secret, only when the node's agent lists it as this sandbox's (ownCheckpoint): a
// forged record never deletes another sandbox's image.
func (b *Backend) deleteOwnCheckpoint(ctx context.Context, lists checkpointLists, id, node, cid string) {
	if b.cfg.NodeAgents == nil || cid == "" || node == "" {
		return
	}
	entries, err := lists.get(ctx, node)
	if err == nil {
		err = b.ownCheckpoint(entries, id, cid, "")
	}
	if err != nil {
		b.log.Warn("a checkpoint named by a paused sandbox's Secret is not deleted", "sandbox", id, "node", node, "err", err)
		return
	}
	b.deleteCheckpoint(id, node, cid)
}

// deleteCheckpoint deletes a checkpoint on node (logged when it fails: nothing deletes
// it later; the node agent service, not built yet, is to remove images no sandbox names).
func (b *Backend) deleteCheckpoint(id, node, cid string) {
	if b.cfg.NodeAgents == nil || cid == "" || node == "" {
		return
	}
	if err := hibernate.ValidCheckpointID(cid); err != nil {
		b.log.Warn("delete a checkpoint", "sandbox", id, "node", node, "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, checkpointDeleteBudget)
	defer cancel()
	agent, err := b.cfg.NodeAgents.Agent(ctx, node)
	if err == nil {
		err = agent.DeleteCheckpoint(ctx, cid)
	}
	if err != nil {
		b.log.Warn("delete a checkpoint", "sandbox", id, "node", node, "checkpoint", cid, "err", err)
	}
}

var _ runtime.Pauser = (*Backend)(nil)
