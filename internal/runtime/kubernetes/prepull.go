package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Image pre-pull on Kubernetes (issue 22 §5: "image layers of templates are pre-pulled
// on the runners that may place them"). The backend implements runtime.WarmPooler for
// this alone (it keeps no warm pool: Size is ignored): every warm target the runner is
// sent (a live template its policy accepts) has the images of all its containers —
// primary, init containers, sidecars — pulled onto every node a sandbox of it may be
// placed on, before any create of it.
//
// Which images: deduplicated by reference (and by organization for images pulled with
// the platform registry's token of one: another organization's token would not read
// it), the first Config.MaxPrepull (default 64) in the order the targets were sent
// (oldest templates first); the rest are logged, not pulled.
//
// Which nodes: the nodes of the cluster that are schedulable (not cordoned), Ready, and
// that the target's Pod settings (the runner policy's node selector and tolerations of
// NoSchedule/NoExecute taints) allow: where the scheduler could put a sandbox of it.
// The node list is read every prepullNodeEvery (the runner needs `list` on nodes: the
// chart's ClusterRole).
//
// How: one Pod per image and node, pinned with nodeName, restartPolicy Never, labelled
// LabelKind=KindPrepull and the runner: an init container of the agent image (the one
// sandbox Pods use) copies the static sandbox-gate into an emptyDir, and the image's
// container runs `sandbox-gate noop`, which exits 0: the kubelet has pulled the image by
// then. Both run as the non-root gate user with nothing (no capabilities, read-only
// root, RuntimeDefault seccomp, no service-account token), tiny requests and limits.
// The Pod pulls with what a sandbox of the template would: the organization's pull
// Secret (orgsecret.go) for platform registry images, a Secret of the pre-pull's own for
// other credentials the template brings (deleted with the want), and the policy's
// imagePullSecrets; Always when credentials are involved (as sandboxes: pullPolicy),
// the configured policy otherwise. At most Config.PrepullInFlight (default 4) such Pods
// exist at once.
//
// A Pod that Succeeded marks the image present on its node and is deleted; one that
// fails (pull refused, image not found, ActiveDeadlineSeconds, the Pod gone) is deleted,
// logged with the kubelet's reason, and retried after a backoff (prepullRetryMin
// doubling to prepullRetryMax) — never an error of SetWarmPools. A present image is
// checked again (a Pod that finds it, or pulls it again if the kubelet's image GC took
// it) every prepullRefresh. Images no longer wanted have their Pods and Secrets deleted
// and are forgotten; the kubelet's image GC treats them as any other image. After a
// runner restart, Recover deletes the pre-pull Pods and Secrets an earlier process left
// (the next warm-target send, within 30 s, starts again).

// Defaults of Config.MaxPrepull and Config.PrepullInFlight.
const (
	DefaultMaxPrepull      = 64
	DefaultPrepullInFlight = 4
)

const (
	prepullRefresh    = 30 * time.Minute
	prepullRetryMin   = 30 * time.Second
	prepullRetryMax   = 10 * time.Minute
	prepullPodTimeout = 15 * time.Minute // ActiveDeadlineSeconds of a pre-pull Pod
	prepullTick       = 2 * time.Second  // how often in-flight Pods are looked at
	prepullNodeEvery  = 30 * time.Second
	// prepullLost: a Pod the watch has not shown this long after its create is lost.
	prepullLost = time.Minute

	annotationImage = "sandboxd.io/image"
	annotationNode  = "sandboxd.io/node"
	containerPull   = "pull"
	containerTools  = "tools"
)

// prepullWant is an image to keep on the nodes.
type prepullWant struct {
	key    string // ref, or ref and the organization of the token it is pulled with
	ref    string
	target string   // the first target that wants it (logs)
	org    string   // of the first target wanting it
	orgTok *orgPull // the platform registry token of org, nil: none
	creds  *runtime.Credentials
	// pods are the Pod settings of the targets that want it (nil entries: none); a node
	// any of them allows gets the image.
	pods []*runtime.PodSettings
}

// prepullWants lists the images of targets, deduplicated, in target order, at most
// maxImages; dropped counts those left out by the bound.
func (b *Backend) prepullWants(targets []runtime.WarmTarget, maxImages int) (out []*prepullWant, dropped int) {
	byKey := map[string]*prepullWant{}
	add := func(t *runtime.WarmTarget, c *runtime.Container) {
		if c.Image == "" {
			return
		}
		org := t.Spec.Meta[runtime.MetaOrg]
		tok, isOrg := b.isOrgCreds(org, c.Image, c.PullCredentials)
		key := c.Image
		if isOrg {
			key += "\x00" + org
		} else if c.PullCredentials != nil {
			key += "\x00creds"
		}
		if w := byKey[key]; w != nil {
			if !slices.ContainsFunc(w.pods, func(p *runtime.PodSettings) bool { return samePodPlacement(p, t.Spec.Pod) }) {
				w.pods = append(w.pods, t.Spec.Pod.Clone())
			}
			if isOrg && tok.expiry.After(w.orgTok.expiry) {
				w.orgTok = &orgPull{org: org, host: b.cfg.PlatformRegistry, creds: *c.PullCredentials, expiry: tok.expiry}
			}
			return
		}
		if len(out) >= maxImages {
			if _, seen := byKey[key]; !seen {
				byKey[key] = nil
				dropped++
			}
			return
		}
		w := &prepullWant{key: key, ref: c.Image, target: t.Key, org: org, pods: []*runtime.PodSettings{t.Spec.Pod.Clone()}}
		switch {
		case isOrg:
			w.orgTok = &orgPull{org: org, host: b.cfg.PlatformRegistry, creds: *c.PullCredentials, expiry: tok.expiry}
		case c.PullCredentials != nil:
			cc := *c.PullCredentials
			w.creds = &cc
		}
		byKey[key] = w
		out = append(out, w)
	}
	for i := range targets {
		t := &targets[i]
		add(t, &t.Spec.Container)
		for j := range t.Spec.InitContainers {
			add(t, &t.Spec.InitContainers[j])
		}
		for j := range t.Spec.Sidecars {
			add(t, &t.Spec.Sidecars[j])
		}
	}
	return out, dropped
}

// samePodPlacement: a and b select the same nodes and pull secrets.
func samePodPlacement(a, b *runtime.PodSettings) bool {
	if a.IsZero() || b.IsZero() {
		return a.IsZero() && b.IsZero()
	}
	return maps.Equal(a.NodeSelector, b.NodeSelector) && slices.Equal(a.ImagePullSecrets, b.ImagePullSecrets) &&
		slices.EqualFunc(a.Tolerations, b.Tolerations, func(x, y runtime.Toleration) bool {
			return x.Key == y.Key && x.Operator == y.Operator && x.Value == y.Value && x.Effect == y.Effect
		})
}

// SetWarmPools implements runtime.WarmPooler: the targets' images are pre-pulled onto
// the nodes (see above), and the poolable targets get warm Pods (pool.go).
func (b *Backend) SetWarmPools(_ context.Context, targets []runtime.WarmTarget) error {
	b.setWarmTargets(targets)
	if b.prepull == nil {
		return nil
	}
	want, dropped := b.prepullWants(targets, b.prepull.max)
	if dropped > 0 {
		b.log.Warn("image pre-pull: more images than the bound; pre-pulling the first", "max", b.prepull.max, "left_out", dropped)
	}
	b.prepull.set(want, dropped)
	return nil
}

// prepullState is one image on one node.
type prepullState struct {
	due      time.Time // next Pod; zero: now
	present  bool      // the last Pod succeeded
	failures int
	pod      string    // in flight
	created  time.Time // of pod
	lastErr  string
}

type prepuller struct {
	b                *Backend
	log              *slog.Logger
	max, inFlightMax int

	refresh, retryMin, retryMax, tick, nodeEvery, podTimeout time.Duration

	mu      sync.Mutex
	want    []*prepullWant
	dropped int                                 // wanted images beyond max (not pre-pulled)
	state   map[string]map[string]*prepullState // by want key, by node
	started bool
	closed  bool
	// orgsDirty: a new set came with tokens: the organizations' Secrets are refreshed
	// with them at the next step.
	orgsDirty bool

	nodes     []corev1.Node // last listed
	nodesAt   time.Time
	nodesWarn time.Time

	wake   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

func newPrepuller(b *Backend) *prepuller {
	ctx, cancel := context.WithCancel(context.Background())
	maxImages := b.cfg.MaxPrepull
	if maxImages == 0 {
		maxImages = DefaultMaxPrepull
	}
	inFlight := b.cfg.PrepullInFlight
	if inFlight <= 0 {
		inFlight = DefaultPrepullInFlight
	}
	return &prepuller{
		b: b, log: b.log.With("component", "prepull"), max: maxImages, inFlightMax: inFlight,
		refresh: prepullRefresh, retryMin: prepullRetryMin, retryMax: prepullRetryMax,
		tick: prepullTick, nodeEvery: prepullNodeEvery, podTimeout: prepullPodTimeout,
		state: map[string]map[string]*prepullState{},
		wake:  make(chan struct{}, 1),
		ctx:   ctx, cancel: cancel,
		done: make(chan struct{}),
	}
}

// set replaces the images to keep; the organizations no longer wanted lose their pull
// Secret when they have no sandbox either.
func (p *prepuller) set(want []*prepullWant, dropped int) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.dropped = dropped
	before := map[string]bool{}
	ownBefore := map[string]bool{}
	for _, w := range p.want {
		if w.orgTok != nil {
			before[w.org] = true
		}
		if w.creds != nil {
			ownBefore[w.key] = true
		}
	}
	p.want = want
	for _, w := range want {
		if w.orgTok != nil {
			delete(before, w.org)
			p.orgsDirty = true
		}
		delete(ownBefore, w.key)
	}
	if len(want) > 0 && !p.started {
		p.started = true
		go p.run()
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	for key := range ownBefore {
		n := prepullSecretName(p.b.cfg.RunnerID, key)
		if err := p.b.cfg.Client.CoreV1().Secrets(p.b.cfg.Namespace).Delete(p.ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			p.log.Warn("delete a pre-pull secret", "secret", n, "err", err)
		}
	}
	for org := range before {
		p.b.gcOrgSecret(p.ctx, org)
	}
}

// wantsOrg reports whether a wanted image is pulled with org's Secret.
func (p *prepuller) wantsOrg(org string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.want {
		if w.orgTok != nil && w.org == org {
			return true
		}
	}
	return false
}

// PrepullStatus is how far the pre-pull is: images wanted, (image, node) pairs where
// the image is present, in flight, and failing (waiting for a retry).
type PrepullStatus struct {
	Images, Present, InFlight, Failing int
}

// PrepullStatus reports the pre-pull's progress (zero when disabled).
func (b *Backend) PrepullStatus() PrepullStatus {
	if b.prepull == nil {
		return PrepullStatus{}
	}
	p := b.prepull
	p.mu.Lock()
	defer p.mu.Unlock()
	st := PrepullStatus{Images: len(p.want)}
	for _, w := range p.want {
		for _, s := range p.state[w.key] {
			switch {
			case s.pod != "":
				st.InFlight++
			case s.present:
				st.Present++
			case s.failures > 0:
				st.Failing++
			}
		}
	}
	return st
}

// PrepullReport implements runtime.PrepullReporter: per wanted image (in want order,
// bounded), on how many of the nodes it is wanted on it is present, and how it stands:
// PRESENT on all of them; else PULLING while a pre-pull Pod of it runs; else FAILED when
// a node's last Pod failed (LastError: the latest such failure); else PENDING.
// LastAttempt is the latest Pod's creation; NextAttempt the earliest retry of a node
// without the image, else the earliest refresh (zero: none is waiting).
func (b *Backend) PrepullReport() runtime.PrepullReport {
	if b.prepull == nil {
		return runtime.PrepullReport{}
	}
	p := b.prepull
	p.mu.Lock()
	defer p.mu.Unlock()
	out := runtime.PrepullReport{LeftOut: p.dropped}
	for _, w := range p.want {
		if len(out.Images) >= runtime.MaxPrepullReportImages {
			out.LeftOut++
			continue
		}
		img := runtime.PrepullImage{Image: w.ref, Target: w.target, State: runtime.PrepullPending}
		var pulling, failed bool
		var errAt, retry, refresh time.Time
		for i := range p.nodes {
			n := &p.nodes[i]
			if !nodeReady(n) {
				continue
			}
			if _, ok := w.placementOn(n); !ok {
				continue
			}
			img.NodesTotal++
			st := p.state[w.key][n.Name]
			if st == nil {
				continue
			}
			if st.created.After(img.LastAttempt) {
				img.LastAttempt = st.created
			}
			switch {
			case st.pod != "":
				pulling = true
			case st.present:
				refresh = earliest(refresh, st.due)
			default:
				retry = earliest(retry, st.due)
			}
			if st.present {
				img.NodesPresent++
			} else if st.lastErr != "" && st.failures > 0 {
				failed = true
				if st.created.After(errAt) || img.LastError == "" {
					errAt, img.LastError = st.created, st.lastErr
				}
			}
		}
		img.LastError = textclip.Clip(img.LastError, runtime.MaxPrepullErrorLen)
		img.NextAttempt = retry
		if retry.IsZero() {
			img.NextAttempt = refresh
		}
		switch {
		case img.NodesTotal > 0 && img.NodesPresent == img.NodesTotal:
			img.State = runtime.PrepullPresent
		case pulling:
			img.State = runtime.PrepullPulling
		case failed:
			img.State = runtime.PrepullFailed
		}
		out.Images = append(out.Images, img)
	}
	return out
}

// earliest of a and b, the zero time being none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

func (p *prepuller) run() {
	defer close(p.done)
	t := time.NewTicker(p.tick)
	defer t.Stop()
	for {
		p.step()
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		case <-t.C:
		}
	}
}

// step is one round: the node list when stale, in-flight Pods looked at, unwanted ones
// deleted, new ones started up to the bound.
func (p *prepuller) step() {
	ctx, cancel := context.WithTimeout(p.ctx, time.Minute)
	defer cancel()
	p.mu.Lock()
	wants := len(p.want) > 0
	p.mu.Unlock()
	if wants && time.Since(p.nodesAt) >= p.nodeEvery {
		p.listNodes(ctx)
	}
	p.refreshOrgSecrets(ctx)
	p.reap(ctx)
	p.start(ctx)
}

// refreshOrgSecrets writes the newest tokens of the wanted images' organizations into
// their Secrets (after each set: every warm-target send, 30 s), so an organization with
// templates has a fresh token in its Secret between creates (ensureOrgSecret writes at
// most once per orgTokenRefresh).
func (p *prepuller) refreshOrgSecrets(ctx context.Context) {
	p.mu.Lock()
	if !p.orgsDirty {
		p.mu.Unlock()
		return
	}
	p.orgsDirty = false
	newest := map[string]orgPull{}
	var orgs []string
	for _, w := range p.want {
		if w.orgTok == nil {
			continue
		}
		cur, ok := newest[w.org]
		if !ok {
			orgs = append(orgs, w.org)
		}
		if !ok || w.orgTok.expiry.After(cur.expiry) {
			newest[w.org] = *w.orgTok
		}
	}
	p.mu.Unlock()
	for _, org := range orgs {
		tok := newest[org]
		if _, err := p.b.ensureOrgSecret(ctx, &tok); err != nil && ctx.Err() == nil {
			p.log.Warn("refresh the pull secret of an organization", "org", org, "err", err)
		}
	}
}

func (p *prepuller) listNodes(ctx context.Context) {
	list, err := p.b.cfg.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		if ctx.Err() == nil && time.Since(p.nodesWarn) > 10*time.Minute {
			p.nodesWarn = time.Now()
			p.log.Warn("image pre-pull: cannot list the cluster's nodes (the runner needs `list` on nodes); retrying", "err", err)
		}
		p.nodesAt = time.Now().Add(-p.nodeEvery + p.retryMin) // retry after retryMin
		return
	}
	p.mu.Lock()
	p.nodes, p.nodesAt = list.Items, time.Now()
	p.mu.Unlock()
}

// nodeReady: schedulable and Ready.
func nodeReady(n *corev1.Node) bool {
	if n.Spec.Unschedulable || n.DeletionTimestamp != nil {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// allows reports whether a sandbox with Pod settings ps may be scheduled onto n: its
// node selector matches and it tolerates every NoSchedule and NoExecute taint.
func allows(ps *runtime.PodSettings, n *corev1.Node) bool {
	var sel map[string]string
	var tols []corev1.Toleration
	if ps != nil {
		sel = ps.NodeSelector
		tols = tolerations(ps)
	}
	for k, v := range sel {
		if nv, ok := n.Labels[k]; !ok || nv != v {
			return false
		}
	}
	for i := range n.Spec.Taints {
		t := &n.Spec.Taints[i]
		if t.Effect != corev1.TaintEffectNoSchedule && t.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if !slices.ContainsFunc(tols, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(t) }) {
			return false
		}
	}
	return true
}

func tolerations(ps *runtime.PodSettings) []corev1.Toleration {
	var out []corev1.Toleration
	for _, t := range ps.Tolerations {
		out = append(out, corev1.Toleration{
			Key: t.Key, Operator: corev1.TolerationOperator(t.Operator), Value: t.Value,
			Effect: corev1.TaintEffect(t.Effect), TolerationSeconds: t.TolerationSeconds,
		})
	}
	return out
}

// placementOn returns the Pod settings of w that allow n (ok false: none does).
func (w *prepullWant) placementOn(n *corev1.Node) (*runtime.PodSettings, bool) {
	for _, ps := range w.pods {
		if allows(ps, n) {
			return ps, true
		}
	}
	return nil, false
}

// reap looks at the in-flight Pods (through the backend's Pod watch) and deletes those
// that ended, or whose image or node is no longer wanted.
func (p *prepuller) reap(ctx context.Context) {
	type del struct{ pod, why string }
	var dels []del
	var logs []func()
	now := time.Now()
	p.mu.Lock()
	wanted := map[string]*prepullWant{}
	for _, w := range p.want {
		wanted[w.key] = w
	}
	nodes := map[string]*corev1.Node{}
	for i := range p.nodes {
		nodes[p.nodes[i].Name] = &p.nodes[i]
	}
	for key, byNode := range p.state {
		w := wanted[key]
		for node, st := range byNode {
			if w == nil || nodes[node] == nil {
				if st.pod != "" {
					dels = append(dels, del{st.pod, "not wanted"})
				}
				delete(byNode, node)
				continue
			}
			if st.pod == "" {
				continue
			}
			pod := p.podOf(st.pod)
			done, ok, why := prepullOutcome(pod, now, st.created, p.podTimeout)
			if !done {
				continue
			}
			dels = append(dels, del{st.pod, why})
			st.pod = ""
			ref, nodeName := w.ref, node
			if ok {
				first := !st.present
				st.present, st.failures, st.lastErr = true, 0, ""
				st.due = now.Add(p.refresh)
				if first {
					took := now.Sub(st.created).Round(time.Millisecond)
					logs = append(logs, func() {
						p.log.Info("image pre-pulled onto node", "image", ref, "node", nodeName, "target", w.target, "took", took)
					})
				}
				continue
			}
			st.present = false
			st.failures++
			st.lastErr = why
			st.due = now.Add(min(p.retryMin<<min(st.failures-1, 16), p.retryMax))
			retry := st.due
			logs = append(logs, func() {
				p.log.Warn("image pre-pull failed; retrying later", "image", ref, "node", nodeName, "target", w.target,
					"reason", why, "retry_at", retry.UTC().Format(time.RFC3339))
			})
		}
		if len(byNode) == 0 && w == nil {
			delete(p.state, key)
		}
	}
	p.mu.Unlock()
	for _, l := range logs {
		l()
	}
	for _, d := range dels {
		p.deletePod(ctx, d.pod)
	}
}

// podOf is the watched state of a pre-pull Pod (nil: not seen).
func (p *prepuller) podOf(name string) *corev1.Pod {
	o, ok, _ := p.b.pods.GetByKey(p.b.cfg.Namespace + "/" + name)
	if !ok {
		return nil
	}
	pod, _ := o.(*corev1.Pod)
	return pod
}

// prepullOutcome: whether a pre-pull Pod has ended, whether it pulled the image, and why
// not.
func prepullOutcome(pod *corev1.Pod, now, created time.Time, timeout time.Duration) (done, ok bool, why string) {
	if pod == nil {
		if now.Sub(created) > prepullLost {
			return true, false, "the pre-pull Pod is gone"
		}
		return false, false, ""
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		return true, true, "succeeded"
	case corev1.PodFailed:
		return true, false, "failed: " + podSummary(pod)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError", "CreateContainerError":
				if transientCreate(w.Reason, w.Message) {
					continue // the kubelet tries again (status.go)
				}
				return true, false, w.Reason + ": " + runtimeText(w.Message)
			}
		}
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			return true, false, fmt.Sprintf("the no-op exited %d (%s)", t.ExitCode, t.Reason)
		}
	}
	for _, cs := range pod.Status.InitContainerStatuses {
		if w := cs.State.Waiting; w != nil && strings.Contains(w.Reason, "Err") {
			if transientCreate(w.Reason, w.Message) {
				continue // the kubelet tries again (status.go)
			}
			return true, false, "agent image: " + w.Reason + ": " + runtimeText(w.Message)
		}
	}
	if now.Sub(created) > timeout+time.Minute {
		return true, false, "did not finish within " + timeout.String() + ": " + podSummary(pod)
	}
	return false, false, ""
}

func (p *prepuller) deletePod(ctx context.Context, name string) {
	zero := int64(0)
	err := p.b.cfg.Client.CoreV1().Pods(p.b.cfg.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		p.log.Warn("delete a pre-pull Pod", "pod", name, "err", err)
	}
}

// start creates Pods for due (image, node) pairs, in want order, up to the bound.
func (p *prepuller) start(ctx context.Context) {
	type job struct {
		w    *prepullWant
		node string
		ps   *runtime.PodSettings
		name string
	}
	var jobs []job
	now := time.Now()
	p.mu.Lock()
	inFlight := 0
	for _, byNode := range p.state {
		for _, st := range byNode {
			if st.pod != "" {
				inFlight++
			}
		}
	}
	nodes := slices.Clone(p.nodes)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	for _, w := range p.want {
		if inFlight >= p.inFlightMax {
			break
		}
		for i := range nodes {
			if inFlight >= p.inFlightMax {
				break
			}
			n := &nodes[i]
			if !nodeReady(n) {
				continue
			}
			ps, ok := w.placementOn(n)
			if !ok {
				continue
			}
			byNode := p.state[w.key]
			if byNode == nil {
				byNode = map[string]*prepullState{}
				p.state[w.key] = byNode
			}
			st := byNode[n.Name]
			if st == nil {
				st = &prepullState{}
				byNode[n.Name] = st
			}
			if st.pod != "" || now.Before(st.due) {
				continue
			}
			st.pod, st.created = prepullPodName(p.b.cfg.RunnerID, w.key, n.Name), now
			inFlight++
			jobs = append(jobs, job{w: w, node: n.Name, ps: ps, name: st.pod})
		}
	}
	p.mu.Unlock()
	for _, j := range jobs {
		if err := p.create(ctx, j.w, j.node, j.ps, j.name); err != nil {
			p.log.Warn("image pre-pull: create the Pod", "image", j.w.ref, "node", j.node, "err", err)
			p.mu.Lock()
			if st := p.state[j.w.key][j.node]; st != nil && st.pod == j.name {
				st.pod = ""
				st.failures++
				st.lastErr = err.Error()
				st.due = time.Now().Add(min(p.retryMin<<min(st.failures-1, 16), p.retryMax))
			}
			p.mu.Unlock()
		}
	}
}

func prepullPodName(runnerID, key, node string) string {
	h := sha256.Sum256([]byte(runnerID + "\x00" + key + "\x00" + node))
	return "sbx-prepull-" + hex.EncodeToString(h[:20])
}

func prepullSecretName(runnerID, key string) string {
	h := sha256.Sum256([]byte(runnerID + "\x00secret\x00" + key))
	return "sbx-prepull-" + hex.EncodeToString(h[:20])
}

func (p *prepuller) labels(w *prepullWant) map[string]string {
	l := map[string]string{LabelManagedBy: ManagedBy, LabelRunner: p.b.cfg.RunnerID, LabelKind: KindPrepull}
	if w.org != "" && len(validation.IsValidLabelValue(w.org)) == 0 {
		l[LabelOrg] = w.org
	}
	return l
}

// create makes the pull Secrets the Pod needs and the Pod.
func (p *prepuller) create(ctx context.Context, w *prepullWant, node string, ps *runtime.PodSettings, name string) error {
	var secrets []string
	policy := p.b.cfg.ImagePullPolicy
	if w.orgTok != nil {
		tok := *w.orgTok
		n, err := p.b.ensureOrgSecret(ctx, &tok)
		if err != nil {
			return err
		}
		secrets = append(secrets, n)
		policy = corev1.PullAlways
	}
	if w.creds != nil {
		n, err := p.ensureOwnSecret(ctx, w)
		if err != nil {
			return err
		}
		secrets = append(secrets, n)
		policy = corev1.PullAlways
	}
	if ps != nil {
		secrets = append(secrets, ps.ImagePullSecrets...)
	}
	_, err := p.b.cfg.Client.CoreV1().Pods(p.b.cfg.Namespace).Create(ctx, p.podFor(w, node, ps, name, secrets, policy), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Left by a step cut short: start over.
		p.deletePod(ctx, name)
		return fmt.Errorf("a pre-pull Pod %s was left over: deleted it", name)
	}
	return err
}

// podFor is the pre-pull Pod of w on node.
func (p *prepuller) podFor(w *prepullWant, node string, ps *runtime.PodSettings, name string, secrets []string, policy corev1.PullPolicy) *corev1.Pod {
	no := false
	zero := int64(0)
	deadline := int64(p.podTimeout / time.Second)
	res := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
	}
	sc := gateSecurityContext()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.b.cfg.Namespace, Labels: p.labels(w),
			Annotations: map[string]string{annotationImage: w.ref, annotationNode: node}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: &zero,
			ActiveDeadlineSeconds:         &deadline,
			InitContainers: []corev1.Container{{
				Name: containerTools, Image: p.b.cfg.AgentImage, ImagePullPolicy: p.b.cfg.ImagePullPolicy,
				Command:         []string{"/sandbox-gate", "install"},
				VolumeMounts:    []corev1.VolumeMount{{Name: "bin", MountPath: gate.BinDir}},
				Resources:       res,
				SecurityContext: sc,
			}},
			Containers: []corev1.Container{{
				Name: containerPull, Image: w.ref, ImagePullPolicy: policy,
				Command:                  []string{gate.GatePath, "noop"},
				VolumeMounts:             []corev1.VolumeMount{{Name: "bin", MountPath: gate.BinDir, ReadOnly: true}},
				Resources:                res,
				SecurityContext:          gateSecurityContext(),
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
			Volumes: []corev1.Volume{{Name: "bin", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
				SizeLimit: resource.NewQuantity(128<<20, resource.BinarySI),
			}}}},
		},
	}
	if ps != nil {
		if len(ps.NodeSelector) > 0 {
			pod.Spec.NodeSelector = maps.Clone(ps.NodeSelector)
		}
		pod.Spec.Tolerations = tolerations(ps)
	}
	for _, n := range secrets {
		pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: n})
	}
	return pod
}

// ensureOwnSecret writes the pull Secret of a want with credentials of its own.
func (p *prepuller) ensureOwnSecret(ctx context.Context, w *prepullWant) (string, error) {
	sec, err := dockerConfigSecret(&runtime.Spec{Container: runtime.Container{Image: w.ref, PullCredentials: w.creds}})
	if err != nil {
		return "", err
	}
	sec.Name, sec.Namespace, sec.Labels = prepullSecretName(p.b.cfg.RunnerID, w.key), p.b.cfg.Namespace, p.labels(w)
	secrets := p.b.cfg.Client.CoreV1().Secrets(p.b.cfg.Namespace)
	cur, err := secrets.Get(ctx, sec.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = secrets.Create(ctx, sec, metav1.CreateOptions{})
	case err == nil:
		if cur.Labels[LabelKind] != KindPrepull || cur.Labels[LabelRunner] != p.b.cfg.RunnerID {
			return "", fmt.Errorf("secret %s is not a pre-pull Secret of runner %s: refusing it", sec.Name, p.b.cfg.RunnerID)
		}
		cur.Type, cur.Data, cur.Labels = sec.Type, sec.Data, sec.Labels
		_, err = secrets.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return "", fmt.Errorf("pre-pull secret: %w", err)
	}
	return sec.Name, nil
}

// deleteSecretsExcept deletes the runner's pre-pull Secrets not in keep.
func (p *prepuller) deleteSecretsExcept(ctx context.Context, keep map[string]bool) {
	list, err := p.b.cfg.Client.CoreV1().Secrets(p.b.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: p.selector()})
	if err != nil {
		p.log.Warn("list pre-pull secrets", "err", err)
		return
	}
	for i := range list.Items {
		if n := list.Items[i].Name; !keep[n] {
			if err := p.b.cfg.Client.CoreV1().Secrets(p.b.cfg.Namespace).Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				p.log.Warn("delete a pre-pull secret", "secret", n, "err", err)
			}
		}
	}
}

func (p *prepuller) selector() string {
	return LabelManagedBy + "=" + ManagedBy + "," + LabelRunner + "=" + p.b.cfg.RunnerID + "," + LabelKind + "=" + KindPrepull
}

// cleanup deletes the runner's pre-pull Pods and Secrets that this process does not
// track (an earlier process's).
func (p *prepuller) cleanup(ctx context.Context) {
	list, err := p.b.cfg.Client.CoreV1().Pods(p.b.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: p.selector()})
	if err != nil {
		p.log.Warn("list pre-pull Pods", "err", err)
		return
	}
	p.mu.Lock()
	tracked := map[string]bool{}
	keep := map[string]bool{}
	for _, byNode := range p.state {
		for _, st := range byNode {
			if st.pod != "" {
				tracked[st.pod] = true
			}
		}
	}
	for _, w := range p.want {
		if w.creds != nil {
			keep[prepullSecretName(p.b.cfg.RunnerID, w.key)] = true
		}
	}
	p.mu.Unlock()
	for i := range list.Items {
		if n := list.Items[i].Name; !tracked[n] {
			p.deletePod(ctx, n)
		}
	}
	p.deleteSecretsExcept(ctx, keep)
}

// close stops the pre-puller and waits for it; its Pods stay (the next process deletes
// them).
func (p *prepuller) close() {
	p.mu.Lock()
	p.closed = true
	started := p.started
	p.mu.Unlock()
	p.cancel()
	if started {
		<-p.done
	}
}
