package kubernetes

import (
	"context"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
	"github.com/sandboxd/sandboxd/internal/span"
	"github.com/sandboxd/sandboxd/internal/tracing"
)

// What a create reports besides its result (docs/observability.md): its steps as child
// spans of the create's span (kubernetes.schedule, kubernetes.runtime, kubernetes.agent,
// and image.pull per sandbox container), and its image pulls in the cwsandbox_image_pull*
// series. The steps are timed by what the backend sees of the Pod (its watch); the pulls
// come from the kubelet: the waiting reason of a container whose image cannot be had, and
// the kubelet's Pulled events (hit: "already present on machine"; miss: its measured
// pull time). Bytes are not counted: the kubelet does not say what it fetched.

// Span names of a create's steps.
const (
	stepSchedule = "kubernetes.schedule" // the Pod's creation → seen scheduled on a node
	stepRuntime  = "kubernetes.runtime"  // scheduled → the main container seen running or its agent answering (sandbox, pulls, container starts)
	stepAgent    = "kubernetes.agent"    // the Pod has an IP → its agent answers through the gate
	stepPull     = "image.pull"          // one per sandbox container whose image the kubelet pulled or found
)

// createSteps are the times a create saw its Pod reach each step (zero: not seen).
type createSteps struct {
	created, scheduled, running, pinging, ready time.Time
}

// observe notes what pod shows at now.
func (st *createSteps) observe(pod *corev1.Pod, now time.Time) {
	if st == nil || pod == nil {
		return
	}
	if st.scheduled.IsZero() && scheduled(pod) {
		st.scheduled = now
	}
	if st.running.IsZero() && mainRunning(pod) {
		st.running = now
	}
}

func scheduled(pod *corev1.Pod) bool {
	if pod.Spec.NodeName != "" {
		return true
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// record ends the steps it saw as spans of ctx's span (and in its span record).
func (st *createSteps) record(ctx context.Context) {
	if st == nil || st.created.IsZero() {
		return
	}
	add := func(name string, from, to time.Time) {
		if from.IsZero() || to.IsZero() || to.Before(from) {
			return
		}
		span.From(ctx).Add(name, to.Sub(from))
		tracing.Step(ctx, name, from, to)
	}
	add(stepSchedule, st.created, st.scheduled)
	end := st.running
	if end.IsZero() || !st.ready.IsZero() && st.ready.Before(end) {
		end = st.ready
	}
	add(stepRuntime, st.scheduled, end)
	add(stepAgent, st.pinging, st.ready)
}

// pullFailures counts the image pulls pod's sandbox containers failed (the agent's own
// image is the platform's, not counted), by the kubelet's waiting reason.
func pullFailures(pod *corev1.Pod) {
	if pod == nil {
		return
	}
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for i := range list {
			cs := &list[i]
			if cs.Name == containerGate || cs.Name == containerInstall || cs.State.Waiting == nil || !pullReasons[cs.State.Waiting.Reason] {
				continue
			}
			counters.ImagePullFailed(cs.State.Waiting.Reason)
		}
	}
}

// pull is what the kubelet's Pulled event of one container says.
type pull struct {
	container string
	hit       bool          // already present on the node
	d         time.Duration // the kubelet's measured pull time (0 for a hit)
	at        time.Time     // the event's time (second resolution for the kubelet's events)
}

// maxEventMessage bounds the part of an event's message that is parsed.
const maxEventMessage = 1024

// maxPullDuration bounds a parsed pull time (the create's own bound is far below).
const maxPullDuration = 24 * time.Hour

// pullsOf are the pulls of the sandbox containers in events (the kubelet's events of
// pod): at most one per container of its spec, the first the list holds. Events of other
// objects or sources than the kubelet, of the agent's containers or of names not in the
// spec (anyone allowed to create events could write one), or whose message does not
// parse are left out.
func pullsOf(events []corev1.Event, pod *corev1.Pod) []pull {
	inSpec := map[string]bool{}
	for _, c := range pod.Spec.InitContainers {
		inSpec[c.Name] = true
	}
	for _, c := range pod.Spec.Containers {
		inSpec[c.Name] = true
	}
	seen := map[string]bool{}
	var out []pull
	for i := range events {
		ev := &events[i]
		if ev.Reason != "Pulled" || ev.InvolvedObject.Kind != "Pod" || ev.InvolvedObject.Name != pod.Name || ev.InvolvedObject.UID != pod.UID {
			continue
		}
		if ev.Source.Component != "kubelet" && ev.ReportingController != "kubelet" {
			continue // only the kubelet pulls
		}
		c, ok := containerOfField(ev.InvolvedObject.FieldPath)
		if !ok || !inSpec[c] || c == containerGate || c == containerInstall || seen[c] {
			continue
		}
		p, ok := parsePulled(ev.Message)
		if !ok {
			continue
		}
		p.container, p.at = c, eventTime(ev)
		seen[c] = true
		out = append(out, p)
	}
	return out
}

// containerOfField is the container a field path names: spec.containers{NAME} or
// spec.initContainers{NAME}.
func containerOfField(fp string) (string, bool) {
	for _, pre := range []string{"spec.containers{", "spec.initContainers{"} {
		if rest, ok := strings.CutPrefix(fp, pre); ok {
			if name, ok := strings.CutSuffix(rest, "}"); ok && name != "" && len(name) <= 63 {
				return name, true
			}
		}
	}
	return "", false
}

// parsePulled reads the kubelet's Pulled message (pkg/kubelet/images): `Container image
// "REF" already present on machine` (a hit), or `Successfully pulled image "REF" in D
// (D' including waiting)[. Image size: N bytes.]` (a miss that took D).
func parsePulled(msg string) (pull, bool) {
	if len(msg) > maxEventMessage {
		msg = msg[:maxEventMessage]
	}
	if strings.HasPrefix(msg, "Container image ") && strings.HasSuffix(msg, " already present on machine") {
		return pull{hit: true}, true
	}
	rest, ok := strings.CutPrefix(msg, "Successfully pulled image ")
	if !ok {
		return pull{}, false
	}
	// The reference is quoted (%q): its closing quote is followed by " in ".
	i := strings.Index(rest, `" in `)
	if i < 0 {
		return pull{}, false
	}
	rest = rest[i+len(`" in `):]
	if j := strings.IndexByte(rest, ' '); j >= 0 {
		rest = rest[:j]
	}
	rest = strings.TrimSuffix(rest, ".")
	d, err := time.ParseDuration(rest)
	if err != nil || d < 0 || d > maxPullDuration {
		return pull{}, false
	}
	return pull{d: d}, true
}

// eventTime is when ev last happened, as precisely as it says.
func eventTime(ev *corev1.Event) time.Time {
	switch {
	case !ev.EventTime.IsZero():
		return ev.EventTime.Time
	case !ev.LastTimestamp.IsZero():
		return ev.LastTimestamp.Time
	}
	return ev.FirstTimestamp.Time
}

// maxEventReaders bounds the Pods whose events are read at once (recordPulls), process-wide.
const maxEventReaders = 4

var eventReaders = make(chan struct{}, maxEventReaders)

// maxPodEvents bounds the events read of one Pod.
const maxPodEvents = 256

// defaultEventsWait is how long recordPulls waits for the kubelet's Pulled events to be
// stored (the kubelet sends them asynchronously), between tries.
var defaultEventsWait = []time.Duration{0, 500 * time.Millisecond, time.Second, 2 * time.Second}

// recordPulls reads the kubelet's Pulled events of s's running Pod (pod, whose sandbox
// containers are want) and records each container's pull: in the image pull series and
// as an image.pull span of ctx's span, placed by the event (second resolution) and as
// long as the kubelet measured, within the Pod's runtime step. Runs after Create
// returned; gives up when the events cannot be read.
func (b *Backend) recordPulls(ctx context.Context, pod *corev1.Pod, want int, st *createSteps) {
	// At most maxEventReaders Pods' events are read at once: a field-selected list is
	// served by scanning the namespace's events, so a burst of creates must not make a
	// burst of scans.
	select {
	case eventReaders <- struct{}{}:
		defer func() { <-eventReaders }()
	case <-b.ctx.Done():
		return
	}
	var got []pull
	waits := b.eventsWait
	if waits == nil {
		waits = defaultEventsWait
	}
	for _, w := range waits {
		select {
		case <-time.After(w):
		case <-b.ctx.Done():
			return
		}
		lctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		list, err := b.cfg.Client.CoreV1().Events(b.cfg.Namespace).List(lctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": pod.Name, "involvedObject.uid": string(pod.UID), "reason": "Pulled"}.String(),
			Limit:         maxPodEvents,
		})
		cancel()
		if err != nil {
			if b.eventsWarned.CompareAndSwap(false, true) {
				hint := ""
				if apierrors.IsForbidden(err) {
					hint = " (the runner needs list on events in its sandbox namespace)"
				}
				b.log.Warn("image pull metrics of the kubernetes backend unavailable: cannot read the kubelet's events"+hint, "err", err)
			}
			return
		}
		b.eventsWarned.Store(false)
		got = pullsOf(list.Items, pod)
		if len(got) >= want {
			break
		}
	}
	for _, p := range got {
		counters.ImagePull(p.hit, p.d, nil)
		end := p.at
		if st != nil {
			// The event's second-resolution time, moved into the step it belongs to.
			if !st.scheduled.IsZero() && end.Before(st.scheduled.Add(p.d)) {
				end = st.scheduled.Add(p.d)
			}
			if lim := st.readyOrRunning(); !lim.IsZero() && end.After(lim) {
				end = lim
			}
		}
		tracing.Step(ctx, stepPull, end.Add(-p.d), end, tracing.KeyCacheHit.Bool(p.hit), tracing.KeyContainer.String(p.container))
	}
}

// readyOrRunning is the end of the runtime step.
func (st *createSteps) readyOrRunning() time.Time {
	if !st.running.IsZero() && (st.ready.IsZero() || st.running.Before(st.ready)) {
		return st.running
	}
	return st.ready
}

// sandboxContainers counts pod's containers that run the sandbox's images.
func sandboxContainers(pod *corev1.Pod) int {
	n := 0
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			if c.Name != containerGate && c.Name != containerInstall {
				n++
			}
		}
	}
	return n
}

// reportCreate reports the create of s, whose Pod created is, once it ended with *errp:
// its steps as spans, its failed pulls now, its pulls from the events in the background.
func (b *Backend) reportCreate(ctx context.Context, s *sandbox, created *corev1.Pod, errp *error) {
	b.mu.Lock()
	var st createSteps
	if s.steps != nil {
		st = *s.steps
	}
	s.steps = nil
	pod := s.pod
	b.mu.Unlock()
	if st.ready.IsZero() && *errp == nil {
		// Ended (a command that ends at once) or probed without a ping answered first.
		st.ready = time.Now()
	}
	st.record(ctx)
	if *errp != nil {
		pullFailures(pod)
	}
	go b.recordPulls(context.WithoutCancel(ctx), created, sandboxContainers(created), &st)
}
