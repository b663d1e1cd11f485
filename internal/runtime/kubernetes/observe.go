package kubernetes

import (
	"context"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
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

// Steps of a create told to Config.StepHook: the Pod object created, seen scheduled, the
// first ping of its agent started, the agent answered (Create returns), the kubelet
// reported the main container running (often after ready: at its next relist).
const (
	StepCreated   = "created"
	StepScheduled = "scheduled"
	StepPinging   = "pinging"
	StepReady     = "ready"
	StepRunning   = "running"
)

// stepSet is the steps already told to Config.StepHook, one bit each.
type stepSet uint8

const (
	hookedScheduled stepSet = 1 << iota
	hookedRunning
)

// hookLocked tells Config.StepHook (if any) that s reached step at at. Called with
// Backend.mu held.
func (b *Backend) hookLocked(s *sandbox, step string, at time.Time) {
	if b.cfg.StepHook != nil {
		b.cfg.StepHook(s.id, step, at)
	}
}

// hookPodLocked tells Config.StepHook the steps s's Pod shows for the first time: also
// after Create returned (the kubelet reports a running container at its next relist).
func (b *Backend) hookPodLocked(s *sandbox, now time.Time) {
	if b.cfg.StepHook == nil || s.pod == nil {
		return
	}
	if s.hooked&hookedScheduled == 0 && scheduled(s.pod) {
		s.hooked |= hookedScheduled
		b.hookLocked(s, StepScheduled, now)
	}
	if s.hooked&hookedRunning == 0 && mainRunning(s.pod) {
		s.hooked |= hookedRunning
		b.hookLocked(s, StepRunning, now)
	}
}

// createSteps are the times a create saw its Pod reach each step (zero: not seen).
type createSteps struct {
	created, scheduled, running, hello, pinging, ready time.Time
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
// image is the platform's, not counted), by the kubelet's waiting reason, and returns
// those containers' names.
func pullFailures(pod *corev1.Pod) map[string]bool {
	if pod == nil {
		return nil
	}
	var failed map[string]bool
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for i := range list {
			cs := &list[i]
			if helperContainer(cs.Name) || cs.State.Waiting == nil || !pullReasons[cs.State.Waiting.Reason] {
				continue
			}
			counters.ImagePullFailed(cs.State.Waiting.Reason)
			if failed == nil {
				failed = map[string]bool{}
			}
			failed[cs.Name] = true
		}
	}
	return failed
}

// pull is what the kubelet's events of one container say of its image pull.
type pull struct {
	container string
	hit       bool          // already present on the node
	failed    bool          // the pull failed (Failed to pull image)
	d         time.Duration // the kubelet's measured pull time (0 for a hit); a failed pull: its Pulling to its Failed event
	size      int64         // the image's size as the kubelet reports it (0: not said); not bytes fetched
	at        time.Time     // the event's time (second resolution for the kubelet's events)
}

// maxEventMessage bounds the part of an event's message that is parsed.
const maxEventMessage = 1024

// maxPullDuration bounds a parsed pull time (the create's own bound is far below).
const maxPullDuration = 24 * time.Hour

// Event reasons the kubelet's image manager (pkg/kubelet/images, pkg/kubelet/events) uses.
const (
	reasonPulling = "Pulling" // `Pulling image "REF"`
	reasonPulled  = "Pulled"  // a hit or a miss with its time and size
	reasonFailed  = "Failed"  // `Failed to pull image "REF": ERR` (also `Error: ErrImagePull`, not parsed)
)

// containerEvents is what one container's events say, as pullsOf gathers it.
type containerEvents struct {
	pulled            *pull
	pullingAt, failAt time.Time // earliest Pulling, earliest Failed to pull (zero: none)
}

// pullsOf are the pulls of the sandbox containers in events (the kubelet's events of
// pod): at most one per container of its spec, in the order the list first names them. A
// container's Pulled event (the first the list holds) is its pull; a container of failed
// (its waiting reason said its image could not be had) without one is a failed pull,
// taking from its earliest Pulling event to its earliest "Failed to pull image" event
// (the kubelet's second-resolution times; none without both). Events of other objects or
// sources than the kubelet, of the agent's containers or of names not in the spec, or
// whose message does not parse are left out. Anyone allowed to create events in the
// namespace can still write one that passes (docs/observability.md): what comes out is
// bounded and feeds metrics and spans only.
func pullsOf(events []corev1.Event, pod *corev1.Pod, failed map[string]bool) []pull {
	inSpec := map[string]bool{}
	for _, c := range pod.Spec.InitContainers {
		inSpec[c.Name] = true
	}
	for _, c := range pod.Spec.Containers {
		inSpec[c.Name] = true
	}
	byName := map[string]*containerEvents{}
	var order []string
	for i := range events {
		ev := &events[i]
		if ev.Reason != reasonPulled && ev.Reason != reasonPulling && ev.Reason != reasonFailed {
			continue
		}
		if ev.InvolvedObject.Kind != "Pod" || ev.InvolvedObject.Name != pod.Name || ev.InvolvedObject.UID != pod.UID {
			continue
		}
		if ev.Source.Component != "kubelet" && ev.ReportingController != "kubelet" {
			continue // only the kubelet pulls
		}
		c, ok := containerOfField(ev.InvolvedObject.FieldPath)
		if !ok || !inSpec[c] || helperContainer(c) {
			continue
		}
		ce := byName[c]
		if ce == nil {
			ce = &containerEvents{}
		}
		at := eventFirst(ev)
		switch ev.Reason {
		case reasonPulled:
			if ce.pulled != nil {
				continue
			}
			p, ok := parsePulled(ev.Message)
			if !ok {
				continue
			}
			p.container, p.at = c, eventTime(ev)
			ce.pulled = &p
		case reasonPulling:
			if !isPulling(ev.Message) {
				continue
			}
			if ce.pullingAt.IsZero() || at.Before(ce.pullingAt) {
				ce.pullingAt = at
			}
		case reasonFailed:
			if !isPullFailure(ev.Message) {
				continue
			}
			if ce.failAt.IsZero() || at.Before(ce.failAt) {
				ce.failAt = at
			}
		}
		if byName[c] == nil {
			byName[c] = ce
			order = append(order, c)
		}
	}
	var out []pull
	for _, c := range order {
		ce := byName[c]
		switch {
		case ce.pulled != nil:
			out = append(out, *ce.pulled)
		case failed[c] && !ce.pullingAt.IsZero() && !ce.failAt.IsZero() && !ce.failAt.Before(ce.pullingAt):
			d := ce.failAt.Sub(ce.pullingAt)
			if d > maxPullDuration {
				continue
			}
			out = append(out, pull{container: c, failed: true, d: d, at: ce.failAt})
		}
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

// clip is msg cut to maxEventMessage bytes.
func clip(msg string) string {
	if len(msg) > maxEventMessage {
		return msg[:maxEventMessage]
	}
	return msg
}

// isPulling: the kubelet's `Pulling image "REF"`.
func isPulling(msg string) bool {
	msg = clip(msg)
	rest, ok := strings.CutPrefix(msg, `Pulling image "`)
	return ok && strings.HasSuffix(rest, `"`)
}

// isPullFailure: the kubelet's `Failed to pull image "REF": ERR` (not its `Error:
// ErrImagePull` nor other Failed events, such as a container that could not start).
func isPullFailure(msg string) bool {
	rest, ok := strings.CutPrefix(clip(msg), `Failed to pull image "`)
	return ok && strings.Contains(rest, `": `)
}

// parsePulled reads the kubelet's Pulled message (pkg/kubelet/images): `Container image
// "REF" already present on machine[ …]` (a hit), or `Successfully pulled image "REF" in D
// (D' including waiting)[. Image size: N bytes.]` (a miss that took D, of an image of N
// bytes as the container runtime counts it).
func parsePulled(msg string) (pull, bool) {
	msg = clip(msg)
	if rest, ok := strings.CutPrefix(msg, `Container image "`); ok {
		// The reference is quoted (%q); v1.33's KubeletEnsureSecretPulledImages adds words after.
		if strings.Contains(rest, `" already present on machine`) {
			return pull{hit: true}, true
		}
		return pull{}, false
	}
	rest, ok := strings.CutPrefix(msg, `Successfully pulled image "`)
	if !ok {
		return pull{}, false
	}
	// The reference is quoted (%q): its closing quote is followed by " in ".
	i := strings.LastIndex(rest, `" in `)
	if i < 0 {
		return pull{}, false
	}
	rest = rest[i+len(`" in `):]
	dur, tail, _ := strings.Cut(rest, " ")
	dur = strings.TrimSuffix(dur, ".")
	d, err := time.ParseDuration(dur)
	if err != nil || d < 0 || d > maxPullDuration {
		return pull{}, false
	}
	p := pull{d: d}
	if _, sz, ok := strings.Cut(tail, "Image size: "); ok {
		if n, ok := strings.CutSuffix(sz, " bytes."); ok && len(n) > 0 && len(n) <= 20 {
			v, err := strconv.ParseInt(n, 10, 64)
			if err == nil && v > 0 && v <= counters.MaxReportedImageSize {
				p.size = v
			}
		}
	}
	return p, true
}

// eventFirst is when ev first happened, as precisely as it says.
func eventFirst(ev *corev1.Event) time.Time {
	switch {
	case !ev.EventTime.IsZero():
		return ev.EventTime.Time
	case !ev.FirstTimestamp.IsZero():
		return ev.FirstTimestamp.Time
	}
	return ev.LastTimestamp.Time
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

// maxPodEvents bounds a page of one Pod's events of one reason, and maxPodEventPages the
// pages read of one reason: at most 1 024 events of each reason wanted per read.
const (
	maxPodEvents     = 256
	maxPodEventPages = 4
)

// defaultEventsWait is how long recordPulls waits for the kubelet's Pulled events to be
// stored (the kubelet sends them asynchronously), between tries.
var defaultEventsWait = []time.Duration{0, 500 * time.Millisecond, time.Second, 2 * time.Second}

// recordPulls reads the kubelet's pull events of s's Pod (pod, whose sandbox containers
// are want; failed: those whose image could not be had, already counted) and records
// each container's pull: in the image pull series (a failed one: its duration only) and
// as an image.pull span of ctx's span, placed by the event (second resolution) and as
// long as the kubelet measured, within the Pod's runtime step. Runs after Create
// returned; gives up when the events cannot be read.
func (b *Backend) recordPulls(ctx context.Context, pod *corev1.Pod, want int, failed map[string]bool, st *createSteps) {
	// At most maxEventReaders Pods' events are read at once: a field-selected list is
	// served by scanning the namespace's events, so a burst of creates must not make a
	// burst of scans.
	select {
	case eventReaders <- struct{}{}:
		defer func() { <-eventReaders }()
	case <-b.ctx.Done():
		return
	}
	// Pulling and Failed events matter only for the pulls that failed (pullsOf).
	reasons := []string{reasonPulled}
	if len(failed) > 0 {
		reasons = append(reasons, reasonPulling, reasonFailed)
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
		events, err := b.podEvents(pod, reasons)
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
		got = pullsOf(events, pod, failed)
		if len(got) >= want {
			break
		}
	}
	for _, p := range got {
		if p.failed {
			counters.ImagePullFailedDuration(p.d)
		} else {
			counters.ImagePull(p.hit, p.d, nil)
			counters.KubeletImageSize(p.size)
		}
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
		attrs := []attribute.KeyValue{tracing.KeyCacheHit.Bool(p.hit), tracing.KeyContainer.String(p.container)}
		if p.failed {
			attrs = append(attrs, attribute.Bool("error", true))
		}
		tracing.Step(ctx, stepPull, end.Add(-p.d), end, attrs...)
	}
}

// podEvents lists pod's events of each of reasons. Each reason is field-selected, so a Pod's
// other events (probe failures, back-offs, however many) never push the pull events off a
// page, and read page by page: at most maxPodEventPages pages, and maxPodEventPages *
// maxPodEvents events of each reason kept (also from a server that ignores the page limit).
func (b *Backend) podEvents(pod *corev1.Pod, reasons []string) ([]corev1.Event, error) {
	var out []corev1.Event
	for _, reason := range reasons {
		sel := fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": pod.Name, "involvedObject.uid": string(pod.UID), "reason": reason}.String()
		cont, kept := "", 0
		for range maxPodEventPages {
			lctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
			list, err := b.cfg.Client.CoreV1().Events(b.cfg.Namespace).List(lctx, metav1.ListOptions{FieldSelector: sel, Limit: maxPodEvents, Continue: cont})
			cancel()
			if err != nil {
				return nil, err
			}
			items := list.Items
			if left := maxPodEventPages*maxPodEvents - kept; len(items) > left {
				items = items[:left]
			}
			out, kept = append(out, items...), kept+len(items)
			if cont = list.Continue; cont == "" || kept == maxPodEventPages*maxPodEvents {
				break
			}
		}
	}
	return out, nil
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
			if !helperContainer(c.Name) {
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
	var failed map[string]bool
	if *errp != nil {
		failed = pullFailures(pod)
	}
	go b.recordPulls(context.WithoutCancel(ctx), created, sandboxContainers(created), failed, &st)
}
